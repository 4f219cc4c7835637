//! puzzletron: content-addressed, cached, resumable ML experiments.

pub mod identity;

pub use identity::Hash;
