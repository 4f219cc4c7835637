//! puzzletron: content-addressed, cached, resumable ML experiments.

pub mod executor;
pub mod identity;

pub use identity::Hash;
