//! puzzletron: content-addressed, cached, resumable ML experiments.

pub mod executor;
pub mod fsutil;
pub mod identity;
pub mod store;

pub use identity::Hash;
