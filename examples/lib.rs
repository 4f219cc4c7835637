//! The examples of [puzzletron](../puzzletron/index.html), as a workspace member of their own so
//! that `cargo run --release --example sweep` builds only the library and serde, not the
//! library's test and bench dependencies. This library is empty; the examples are `sweep.rs`,
//! `campaign.rs` and `campaign_dry_run.rs` beside it.
