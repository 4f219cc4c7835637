//! Identity: when is a result the same result? (`docs/design.md`, "Identity")
//!
//! - [`Hash`](struct@Hash): the SHA-256 digest type;
//! - [`canonical_json`]: parameters as RFC 8785 canonical JSON;
//! - [`CompiledCode`]: the job's code identity computed at compile time by `job!`, item by item
//!   (its closure: what the job reaches), with `cfg` values and build witnesses;
//! - [`owned_digest`]: the run-time, file-level digest of [`Job::new`](crate::Job::new)
//!   jobs (comments and formatting excluded);
//! - [`Witnesses`]: Cargo.lock, toolchain and source commit, recorded beside each result;
//! - [`job_key`]: the key of one run, from the job's name, its parameters and its owned code.

use std::path::PathBuf;

mod canonical;
mod compiled;
mod hash;
mod owned;
mod tokens;
mod witness;

pub use canonical::{CanonicalParams, ParamError, ParamType, canonical_json, canonical_params};
pub(crate) use compiled::code_differences;
pub use compiled::{CompiledCode, CompiledItem, ITEMS_SCHEME, ItemDigest};
pub use hash::{Hash, Hasher, ParseHashError};
pub use owned::{Modules, OwnedCode, OwnedDigest, owned_digest, owned_digest_uncached};
pub use witness::{LockWitness, SourceWitness, Toolchain, Witnesses, source_witness};
pub(crate) use witness::{find_lock_file, lock_witness};

/// Version of the key derivation; bumping it changes every key.
pub const KEY_VERSION: &str = "puzzletron/job-key/v1";

/// The key of a run: SHA-256 over the key version, the job's name, its canonical parameters
/// (RFC 8785 JSON) and its owned-code digest, each length-prefixed.
///
/// Anyone can recompute it: `sha256(frame("puzzletron/job-key/v1") ++ frame(name) ++
/// frame(params_json) ++ frame(owned_digest_bytes))` where `frame(x) = u64_le(len(x)) ++ x`.
pub fn job_key(job_name: &str, canonical_params_json: &str, owned: &Hash) -> Hash {
    let mut h = Hasher::new(KEY_VERSION);
    h.field(job_name.as_bytes())
        .field(canonical_params_json.as_bytes())
        .field(owned.as_bytes());
    h.finish()
}

/// The lineage of a run: the job's name and parameters without the code. Runs of one lineage
/// differ only by code, which lets a decision say "code changed" instead of "no record".
pub fn lineage_key(job_name: &str, canonical_params_json: &str) -> Hash {
    let mut h = Hasher::new("puzzletron/lineage/v1");
    h.field(job_name.as_bytes())
        .field(canonical_params_json.as_bytes());
    h.finish()
}

/// Errors computing identities. Retrying helps only for [`IdentityError::Io`] on flaky storage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A source or lock file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file a job is defined in was not found from its crate folder.
    #[error(
        "job file {file} not found under {crate_dir} or its ancestors: expected the path that file!() gave at the job's definition"
    )]
    JobFileNotFound {
        /// The path `file!()` gave.
        file: PathBuf,
        /// The job's crate folder (`CARGO_MANIFEST_DIR`).
        crate_dir: PathBuf,
    },
    /// A lock file given explicitly does not exist.
    #[error("lock file {path} does not exist: expected a Cargo.lock path")]
    LockNotFound {
        /// The path given.
        path: PathBuf,
    },
}

impl IdentityError {
    /// Whether retrying can help (only I/O errors).
    pub fn is_retryable(&self) -> bool {
        matches!(self, IdentityError::Io { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_depends_on_each_input() {
        let owned = Hash::of("code");
        let k = job_key("c::f", r#"{"a":1}"#, &owned);
        assert_eq!(k, job_key("c::f", r#"{"a":1}"#, &owned));
        assert_ne!(k, job_key("c::g", r#"{"a":1}"#, &owned));
        assert_ne!(k, job_key("c::f", r#"{"a":2}"#, &owned));
        assert_ne!(k, job_key("c::f", r#"{"a":1}"#, &Hash::of("other")));
        assert_ne!(lineage_key("c::f", "{}"), lineage_key("c::g", "{}"));
    }
}
