//! Identity: when is a result the same result? (DESIGN.md §3)
//!
//! [`Hash`] is the digest type; the canonical parameter encoding, the owned-code digest and the
//! environment witnesses live in the submodules.

mod hash;

pub use hash::{Hash, Hasher, ParseHashError};
