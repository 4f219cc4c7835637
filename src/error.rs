//! The crate's top-level [`Error`], wrapping each area's error.

use crate::campaign::PlanError;
use crate::campaign::config::ConfigError;
use crate::campaign::controller::ControllerError;
use crate::executor::ExecutorError;
use crate::identity::{IdentityError, ParamError};
use crate::metrics::MetricsError;
use crate::store::StoreError;
use crate::sweep::RunFailed;

/// Any puzzletron error. [`Error::is_retryable`] says whether trying again unchanged can help.
///
/// Its `Debug` form is the readable message plus its causes (as `anyhow` does), so
/// `fn main() -> puzzletron::Result<()>` prints something a user can act on.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Parameters that cannot be encoded (NaN, reserved names, bad map keys), reported at the
    /// `run()` call that enqueued them.
    #[error("bad parameters for job {job}: {source}")]
    Params {
        /// The job's name.
        job: String,
        /// What was wrong, with the parameter's path.
        source: ParamError,
    },
    /// Computing an identity (owned code, lock file) failed.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Building or writing a metric table failed.
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    /// An executor failed.
    #[error(transparent)]
    Executor(#[from] ExecutorError),
    /// Loading, composing, overriding or interpolating a campaign config failed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Compiling a campaign plan failed (schemas, stage graph, meshes, packing, limits).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The campaign controller failed (journal, lease, executor, a stage that failed).
    #[error(transparent)]
    Controller(#[from] ControllerError),
    /// A drain stopped at a failing job or a store error.
    #[error(transparent)]
    RunFailed(#[from] Box<RunFailed>),
    /// The library is used in a way that cannot work; the message says how to fix it.
    #[error("{message}")]
    Usage {
        /// What is wrong and what to do.
        message: String,
    },
    /// Enqueueing one more run would take a sweep past its memory bound
    /// ([`OrchestratorBuilder::memory_limit`](crate::OrchestratorBuilder::memory_limit)): the
    /// run is refused before it is allocated, so the sweep fails with this error instead of
    /// meeting the OOM killer. The runs enqueued before stay queued and can be drained. Also
    /// returned past 2^31 - 1 runs, the most one sweep indexes.
    #[error(
        "enqueueing run {runs} would take this sweep's queue and plan to about {bytes} bytes, past its memory bound of {limit} bytes ({bound}): split the sweep into batches, each enqueued and drained by its own Orchestrator over the same store (a dropped orchestrator frees its runs), or raise the bound with OrchestratorBuilder::memory_limit"
    )]
    TooLarge {
        /// Runs enqueued, counting the refused one.
        runs: usize,
        /// The sweep's estimated memory with the refused run, bytes.
        bytes: u64,
        /// The bound, bytes.
        limit: u64,
        /// Where the bound comes from.
        bound: String,
    },
    /// An option this build does not support yet.
    #[error("{what} is not yet supported: {why}")]
    Unsupported {
        /// The option.
        what: String,
        /// What to do instead.
        why: String,
    },
}

impl Error {
    /// Whether retrying the same call unchanged can help (transient I/O or scheduler errors).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Identity(e) => e.is_retryable(),
            Error::Store(e) => e.is_retryable(),
            Error::Metrics(e) => e.is_retryable(),
            Error::Executor(e) => e.is_retryable(),
            Error::RunFailed(e) => e.is_retryable(),
            Error::Config(e) => e.is_retryable(),
            Error::Plan(e) => e.is_retryable(),
            Error::Controller(e) => e.is_retryable(),
            Error::Params { .. }
            | Error::Unsupported { .. }
            | Error::Usage { .. }
            | Error::TooLarge { .. } => false,
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        // `transparent` variants share their inner error's message: skip repeats.
        let mut last = self.to_string();
        while let Some(s) = source {
            let text = s.to_string();
            if text != last && !last.ends_with(&text) {
                write!(f, "\n  caused by: {text}")?;
            }
            last = text;
            source = s.source();
        }
        Ok(())
    }
}

/// `Result<T, puzzletron::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
