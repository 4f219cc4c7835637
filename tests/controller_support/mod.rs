//! `support::campaign` under the name `campaign_baremetal.rs` still declares (that file is
//! being changed elsewhere; switch it to `mod support;` and delete this folder then). Only the
//! two files it needs: it loads `support/watchdog.rs` itself, and a file may be loaded once.

#![allow(dead_code)] // the file uses a part

#[path = "../support/campaign.rs"]
mod campaign;
#[path = "../support/examples.rs"]
mod examples;

#[allow(unused_imports)]
pub use campaign::*;
#[allow(unused_imports)]
pub use examples::{example_exe, run_to_text};
