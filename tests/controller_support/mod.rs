//! `support::campaign` under the name `campaign_baremetal.rs` still declares (that file is
//! being changed elsewhere; switch it to `mod support;` and delete this folder then).

#[path = "../support/mod.rs"]
mod support;
#[allow(unused_imports)]
pub use support::campaign::*;
#[allow(unused_imports)] // the file uses a part
pub use support::examples::{example_exe, run_to_text};
