//! puzzletron: content-addressed, cached, resumable ML experiments.

mod error;
pub mod executor;
pub mod fsutil;
pub mod identity;
pub mod metrics;
pub mod store;
pub mod sweep;

pub use error::{Error, Result};
pub use identity::Hash;
pub use metrics::MetricTable;
pub use store::{FsStore, MemoryStore, Store};
pub use sweep::{Job, JobResult, Orchestrator, Run};
pub use sweep::worker;
