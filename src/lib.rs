//! puzzletron: content-addressed, cached, resumable ML experiments.

pub mod campaign;
pub mod identity;

pub use identity::Hash;
