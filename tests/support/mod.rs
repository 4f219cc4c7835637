//! The helpers the integration tests share (the controller benches reuse `sim`). Every test
//! crate that declares `mod support;` compiles all of them and uses a part, hence the
//! `dead_code` allowance.
//!
//! `ssh_hosts.rs` is not declared here: only the bare-metal tests use it, through `#[path]`.

#![allow(dead_code)]

pub mod campaign;
#[cfg(feature = "cli")] // `puzzletron` is built only with the feature
pub mod cli;
pub mod examples;
pub mod plan;
pub mod sim;
pub mod slurm;
pub mod sweep;
pub mod watchdog;
