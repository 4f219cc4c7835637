//! Durable records of runs (`docs/design.md`, "Store"): the [`Store`] trait, [`FsStore`] and
//! [`MemoryStore`].
//!
//! A store keeps, per job key, a self-describing [`JobRecord`] and the metric rows each attempt
//! logged. Its rules:
//! - a record becomes [`Status::Done`] last, by an atomic write; a crash at any instant leaves the
//!   old state or the new one, never half a record;
//! - a job is [`claim`](Store::claim)ed exclusively before it runs, so several processes draining
//!   one store run each job once; the claim of a dead owner is taken over;
//! - metric rows are appended durably as they are logged, so a crash keeps what was logged.
//!
//! What each write costs in `fsync`s is documented per store ([`FsStore`]: at most three per
//! done run, none for claims and running records).
//!
//! Every implementation must pass the conformance suite in `conformance` (feature
//! `test-util`), which both built-in stores run. [`Store`]'s docs say which of its methods an
//! implementation must provide (the record/claim lifecycle) and which are hooks with correct
//! defaults; a job's files on the local filesystem are [`JobFiles`]', a capability only a
//! filesystem store has; tables of metrics are read by `metrics`, which uses stores.

mod fs;
pub(crate) mod liveness;
mod memory;
mod record;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

use std::path::PathBuf;
use std::time::Duration;

pub use fs::{FLUSH_INTERVAL, FLUSH_ROWS, FsStore, INLINE_BYTES, TornTail};
#[cfg(any(test, feature = "test-util"))]
pub use fs::{FaultHook, FaultOp};
pub use liveness::{Liveness, ProcessSpace};
pub use memory::MemoryStore;
pub(crate) use record::{BASE_FORMAT, LIVENESS_FORMAT};
pub use record::{FORMAT_VERSION, Failure, JobRecord, MetricsInfo, Owner, Status};

use crate::identity::Hash;

/// What [`Store::set_aside`] did with a corrupt record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetAside {
    /// Moved there (a path or a name, for messages).
    Moved(String),
    /// Left where it is, with why in words: another process repaired or moved the run first;
    /// its claim then finds that run done or held.
    NotMoved(String),
    /// This store cannot move records aside.
    Unsupported,
}

/// An exclusive right to run one attempt of one job, returned by [`Store::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The job.
    pub key: Hash,
    /// Who holds it.
    pub owner: Owner,
    /// The attempt number this claim runs (previous attempts + 1).
    pub attempt: u32,
}

impl Claim {
    /// The claim of `owner` on job `key`, running attempt number `attempt`. Only a store makes
    /// a claim that holds; one built here names a claim to [`Store::release`] or compare.
    pub fn new(key: Hash, owner: Owner, attempt: u32) -> Self {
        Self {
            key,
            owner,
            attempt,
        }
    }
}

/// What [`Store::claim`] found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The job is ours to run.
    Claimed(Claim),
    /// A live owner holds it.
    Busy(Owner),
    /// It is already done.
    Done(Box<JobRecord>),
}

/// The claim on a job as seen by a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimInfo {
    /// The holder.
    pub owner: Owner,
    /// Whether the holder counts as alive: this process; or not proved dead from here (see
    /// [`Owner::liveness`]: only a reader in the holder's own host, boot and PID namespace can
    /// prove it) and its heartbeat seen changing within the store's stale interval, timed on
    /// the reader's own clock (so a reader that has just started sees every such claim live).
    pub live: bool,
    /// What a reader should know about how it was judged, for messages: a claim file that
    /// cannot be read (its path, and when it will be taken over), or a heartbeat being watched.
    pub note: Option<String>,
}

impl ClaimInfo {
    /// A claim of `owner`, live or not, without a note.
    pub fn new(owner: Owner, live: bool) -> Self {
        Self {
            owner,
            live,
            note: None,
        }
    }
}

impl std::fmt::Display for ClaimInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.owner)?;
        if let Some(n) = &self.note {
            write!(f, " ({n})")?;
        }
        Ok(())
    }
}

/// What a store can prove cheaply about a done record, enough to decide that a run is up to
/// date without parsing the record (see [`Store::done_head`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DoneHead {
    /// The done record's attempt number.
    pub attempt: u32,
    /// [`DoneHead::witnesses_digest`] of the record's witnesses.
    pub witnesses: Hash,
    /// The record's lineage (its job and parameters, [`crate::identity::lineage_key`]), when
    /// the store knows it: a sweep skips a run on a head only when this is the run's own
    /// lineage (a record planted under another run's key is read in full and refused). `None`:
    /// the sweep reads the record to check it.
    pub lineage: Option<Hash>,
}

impl DoneHead {
    /// The head of a done record with this attempt and [`witnesses_digest`](Self::witnesses_digest),
    /// without its lineage (a sweep then reads the record before trusting it: see
    /// [`with_lineage`](Self::with_lineage)).
    pub fn new(attempt: u32, witnesses: Hash) -> Self {
        Self {
            attempt,
            witnesses,
            lineage: None,
        }
    }

    /// The same head with the record's lineage, so that a sweep can skip on it alone.
    pub fn with_lineage(mut self, lineage: Hash) -> Self {
        self.lineage = Some(lineage);
        self
    }

    /// A digest of `witnesses` (SHA-256 of their JSON): equal digests mean equal witnesses, so
    /// a run whose record has the current witnesses' digest has no environment difference.
    pub fn witnesses_digest(witnesses: &crate::identity::Witnesses) -> Hash {
        // Serializing plain structs cannot fail; an empty text would only miss the shortcut.
        Hash::of(serde_json::to_vec(witnesses).unwrap_or_default())
    }
}

/// Metric rows of one job, as columns (rows in logging order).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct Series {
    /// Distinct metric names; `name_index` points into it.
    pub names: Vec<String>,
    /// Per row: index into `names`.
    pub name_index: Vec<u32>,
    /// Per row: the step.
    pub step: Vec<i64>,
    /// Per row: the value.
    pub value: Vec<f64>,
}

impl Series {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.step.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.step.is_empty()
    }

    /// Appends a row.
    pub fn push(&mut self, name: &str, step: i64, value: f64) {
        let idx = match self.names.iter().position(|n| n == name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_string());
                self.names.len() - 1
            }
        };
        self.name_index.push(idx as u32);
        self.step.push(step);
        self.value.push(value);
    }

    /// The rows of metric `name`, as `(step, value)` pairs in logging order.
    pub fn of(&self, name: &str) -> Vec<(i64, f64)> {
        let Some(idx) = self.names.iter().position(|n| n == name) else {
            return Vec::new();
        };
        (0..self.len())
            .filter(|&r| self.name_index[r] as usize == idx)
            .map(|r| (self.step[r], self.value[r]))
            .collect()
    }
}

/// Where a running attempt appends its metric rows. A sink may buffer: rows appended reach the
/// OS (and survive a crash of the process) at the latest on [`MetricSink::flush`], within a
/// bounded time the sink documents, and on [`MetricSink::sync`], which also makes everything
/// durable against a crash of the machine. [`FsStore`]'s sink buffers up to [`FLUSH_ROWS`] rows
/// or [`FLUSH_INTERVAL`].
pub trait MetricSink: Send {
    /// Appends one row.
    ///
    /// # Errors
    /// [`StoreError::BadMetricName`] for a name that cannot be stored; [`StoreError::Io`] when
    /// the row (or an earlier buffered batch) cannot be written.
    fn append(&mut self, name: &str, step: i64, value: f64) -> Result<(), StoreError>;

    /// Hands the buffered rows to the OS: after it returns they survive a crash of the
    /// process. A sink without a buffer does nothing.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn flush(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Flushes to stable storage.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn sync(&mut self) -> Result<(), StoreError>;

    /// Ends the attempt's rows, called once before its finished record is written: makes them
    /// durable and returns what the record stores. The default [`sync`](Self::sync)s and
    /// returns [`summary`](Self::summary); a store may instead hand back the rows in
    /// [`MetricsInfo::inline`], made durable by the record itself (`FsStore` does for short
    /// runs, see [`INLINE_BYTES`]).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn seal(&mut self) -> Result<MetricsInfo, StoreError> {
        self.sync()?;
        Ok(self.summary())
    }

    /// Where the rows are, how many were appended and their distinct names (sorted): what the
    /// record of an attempt that ended with [`sync`](Self::sync) stores (one that ended with
    /// [`seal`](Self::seal) stores what `seal` returned).
    fn summary(&self) -> MetricsInfo;
}

/// Durable storage of job records and metrics. See the [module docs](self) for the rules every
/// implementation keeps; `conformance::run_all` (feature `test-util`) checks them.
///
/// # What a store must provide
///
/// Thirteen methods, the record/claim lifecycle a sweep drives; each is the only way to do its
/// part, so none has a default:
/// - reads: [`location`](Store::location) (for messages), [`record`](Store::record) (a run's
///   outcome: a cache hit or a run to do) and [`keys`](Store::keys) (what the store holds, for
///   whole-store tables, `status` and `gc`);
/// - lineage pointers: [`lineage`](Store::lineage) and [`set_lineage`](Store::set_lineage), the
///   key last run for a job and its parameters (what tells a current run from a superseded one);
/// - claims: [`claim`](Store::claim) (at most one live holder per key, across processes),
///   [`heartbeat`](Store::heartbeat) (a holder's proof of life), [`release`](Store::release)
///   and [`claim_info`](Store::claim_info) (who holds a run, for `status` and messages);
/// - an attempt: [`start`](Store::start) (its running record),
///   [`metric_sink`](Store::metric_sink) (its rows, durable as logged),
///   [`finish`](Store::finish) (its record, atomically, then the claim released) and
///   [`metrics`](Store::metrics) (its rows read back).
///
/// # What a store may provide
///
/// Every other method has a default that is correct, so a user's store implements none of
/// them; they are hooks where a store can do the same work cheaper, or capabilities it may lack:
/// - batches: [`records`](Store::records), [`done_heads`](Store::done_heads),
///   [`lineages`](Store::lineages), [`reuse`](Store::reuse) and
///   [`finish_many`](Store::finish_many) default to one call per item;
///   [`record_metrics`](Store::record_metrics) to [`metrics`](Store::metrics);
/// - cache-hit shortcuts: [`done_head`](Store::done_head) (default: unknown, the record is
///   read) and [`preload`](Store::preload) (default: nothing);
/// - tuning: [`deferrable_start`](Store::deferrable_start) (default `false`: `start` before the
///   sink) and [`heartbeat_interval`](Store::heartbeat_interval) (default 10 s);
/// - capabilities: [`set_aside`](Store::set_aside) (moving a corrupt record away; default: it
///   cannot, the run is reported corrupt), [`spec`](Store::spec) (reopening the store in
///   another process, for isolated runs; default: it cannot) and
///   [`job_files`](Store::job_files) (a job's files on the local filesystem, [`JobFiles`];
///   default: none).
///
/// Generic code ([`Orchestrator<S: Store>`](crate::Orchestrator)) calls the hooks and
/// capabilities through the trait, so a store's faster paths are used without downcasting.
pub trait Store: Send + Sync {
    // Required: the record/claim lifecycle (see the trait's docs for why each is needed).

    /// Where the store lives, for messages (a folder, `memory`, a URL).
    fn location(&self) -> String;

    /// The record of `key`, if any.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when the record cannot be parsed, [`StoreError::Io`].
    fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError>;

    /// Every job key the store holds a record for, sorted.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn keys(&self) -> Result<Vec<Hash>, StoreError>;

    /// The key most recently started, or reused by a drain ([`Store::reuse`]), for a lineage
    /// (job name + parameters), if any.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    fn lineage(&self, lineage: &Hash) -> Result<Option<Hash>, StoreError>;

    /// Points `lineage` at `key` (see [`Store::lineage`]), as [`Store::start`] does.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn set_lineage(&self, lineage: &Hash, key: &Hash) -> Result<(), StoreError>;

    /// Claims `key` exclusively for `owner`: at most one live claim exists per key, across
    /// processes. A claim whose holder is dead is taken over.
    ///
    /// A done job is not claimed ([`ClaimOutcome::Done`]) unless `replace_done` is the attempt
    /// number of its done record: then it is claimed for a re-run in place (its witnesses
    /// changed, or the run is forced). If another process replaced that attempt meanwhile, the
    /// job is `Done` again and is not re-run twice.
    ///
    /// # Errors
    /// [`StoreError::Io`], [`StoreError::Corrupt`].
    fn claim(
        &self,
        key: &Hash,
        owner: &Owner,
        replace_done: Option<u32>,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Records that the claimed attempt started: writes `record` (status running) and points
    /// the record's lineage at this key.
    ///
    /// # Errors
    /// [`StoreError::ClaimLost`] when the claim is no longer held, [`StoreError::Io`].
    fn start(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError>;

    /// A sink for the claimed attempt's metric rows (empty at first).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn metric_sink(&self, claim: &Claim) -> Result<Box<dyn MetricSink>, StoreError>;

    /// Atomically replaces the record with `record` (done or failed) and releases the claim.
    ///
    /// # Errors
    /// [`StoreError::ClaimLost`] when the claim is no longer held, [`StoreError::Io`].
    fn finish(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError>;

    /// Releases a claim without recording an outcome (the job stays as it was).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn release(&self, claim: &Claim) -> Result<(), StoreError>;

    /// Renews the claim's heartbeat: a claim that other processes cannot prove alive (see
    /// [`Owner::liveness`]) counts as live only while its heartbeat is seen to change.
    ///
    /// # Errors
    /// [`StoreError::ClaimLost`], [`StoreError::Io`].
    fn heartbeat(&self, claim: &Claim) -> Result<(), StoreError>;

    /// The current claim on `key`, if any, and whether its holder is alive.
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError>;

    /// The metric rows of the job's last finished attempt (optionally only metric `name`).
    /// A job without a finished attempt has none.
    ///
    /// # Errors
    /// [`StoreError::Corrupt`] when the rows are fewer than the record says, [`StoreError::Io`].
    fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError>;

    // Provided: hooks for speed and tuning. The defaults are correct; a store overrides one
    // when it can do the same work cheaper.

    /// The records of many keys, in order. The default calls [`record`](Store::record) per key; stores override this when a batch is
    /// cheaper.
    ///
    /// # Errors
    /// As [`Store::record`].
    fn records(&self, keys: &[Hash]) -> Result<Vec<Option<JobRecord>>, StoreError> {
        keys.iter().map(|k| self.record(k)).collect()
    }

    /// A shortcut for cache hits: `Some` only when the store *proves*, without parsing it, that
    /// `key`'s current record is done with this head (an [`FsStore`] reads the record's bytes and
    /// checks their digest against its index). `None` means "unknown": read the
    /// [`record`](Store::record). Never `Some` for a record that is absent, not done, or differs
    /// from what the head says. The default knows nothing.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the record cannot be read.
    fn done_head(&self, _key: &Hash) -> Result<Option<DoneHead>, StoreError> {
        Ok(None)
    }

    /// [`Store::done_head`] of many keys, in order, each with its own result (one key's I/O
    /// error does not hide the others' heads). Stores override this when a batch is cheaper (an
    /// [`FsStore`] opens its jobs folder once and each record relative to it).
    fn done_heads(&self, keys: &[Hash]) -> Vec<Result<Option<DoneHead>, StoreError>> {
        keys.iter().map(|k| self.done_head(k)).collect()
    }

    /// A hint that many [`done_head`](Store::done_head)s will be asked soon (a plan or a drain
    /// is being enqueued): a store may start loading what answers them in the background, so
    /// that the load overlaps the enqueueing. Never needed for correctness; the default does
    /// nothing.
    fn preload(&self) {}

    /// [`Store::lineage`] of many lineages, in order. Stores override this when a batch is
    /// cheaper.
    ///
    /// # Errors
    /// As [`Store::lineage`].
    fn lineages(&self, lineages: &[Hash]) -> Result<Vec<Option<Hash>>, StoreError> {
        lineages.iter().map(|l| self.lineage(l)).collect()
    }

    /// A drain reused these done runs, `(lineage, key)` pairs: points each lineage that names
    /// another key (or none) at its reused key, so the lineage names the run of the code that
    /// is current. Without it, after a revert (a `git checkout` back to code whose runs are
    /// done) the lineage would still name the key of the reverted edit, and the runs the
    /// current code uses would read as superseded (and `puzzletron sweep gc` would remove
    /// them). The default reads the pointers with [`Store::lineages`] and writes those that
    /// differ with [`Store::set_lineage`].
    ///
    /// # Errors
    /// As [`Store::lineages`] and [`Store::set_lineage`].
    fn reuse(&self, pairs: &[(Hash, Hash)]) -> Result<(), StoreError> {
        let lineages: Vec<Hash> = pairs.iter().map(|p| p.0).collect();
        for ((lineage, key), cur) in pairs.iter().zip(self.lineages(&lineages)?) {
            if cur != Some(*key) {
                self.set_lineage(lineage, key)?;
            }
        }
        Ok(())
    }

    /// [`finish`](Self::finish) for several claims at once (a group commit): one result per
    /// entry, in order, each `Ok` only once that record is as durable as `finish` makes it. A
    /// store may share the cost of durability among the entries (one flush for the batch); an
    /// entry that fails (a lost claim) does not fail the others. The default calls `finish`
    /// for each.
    ///
    /// # Errors
    /// Per entry, those of [`finish`](Self::finish).
    fn finish_many(&self, done: &[(&Claim, &JobRecord)]) -> Vec<Result<(), StoreError>> {
        done.iter().map(|(c, r)| self.finish(c, r)).collect()
    }

    /// Whether a drain may write a run's start while the run executes: [`Store::start`] after
    /// [`Store::metric_sink`] and rows appended to it, or no `start` at all for a run that is
    /// over before the drain got to it ([`Store::set_lineage`] then, before
    /// [`Store::finish`]). `true` only for a store whose `start` leaves the attempt's rows
    /// alone and whose `finish` needs no `start` before it (the conformance suite checks both
    /// orders for such a store). The default, `false`: `start` before the sink, as the methods'
    /// order here says.
    fn deferrable_start(&self) -> bool {
        false
    }

    /// [`metrics`](Self::metrics)`(&rec.key, name)` for a record `rec` this store just returned
    /// (from [`record`](Self::record) or [`records`](Self::records)): a store may use `rec`
    /// instead of reading the record again (`FsStore` reads only the metric file `rec` names).
    /// The default calls [`metrics`](Self::metrics).
    ///
    /// # Errors
    /// As [`metrics`](Self::metrics).
    fn record_metrics(&self, rec: &JobRecord, name: Option<&str>) -> Result<Series, StoreError> {
        self.metrics(&rec.key, name)
    }

    /// How often a holder must [`heartbeat`](Store::heartbeat) its claims so that no other
    /// process judges them stale: well inside the store's stale interval. The default is
    /// 10 s (a store whose stale interval is the default 60 s).
    fn heartbeat_interval(&self) -> std::time::Duration {
        DEFAULT_HEARTBEAT
    }

    // Provided: capabilities a store may lack. The defaults say "not here".

    /// Moves the record of `key` aside so that the job can run again, for a record that
    /// cannot be read ([`StoreError::Corrupt`]; a sweep built with
    /// [`repair(true)`](crate::OrchestratorBuilder::repair) calls it): never deletes
    /// it. Returns where it went ([`SetAside::Moved`]); [`SetAside::Unsupported`] when this
    /// store cannot move records aside (the default), and the run is then reported as corrupt.
    ///
    /// Several drains may repair the same run at once: a store that moves records aside must
    /// move a record only while it is still corrupt (another drain may have repaired the run
    /// and written a good record meanwhile), and answer [`SetAside::NotMoved`] when it moved
    /// nothing for that reason ([`FsStore`] reads the record again under a lock of its own).
    ///
    /// # Errors
    /// [`StoreError::Io`].
    fn set_aside(&self, _key: &Hash) -> Result<SetAside, StoreError> {
        Ok(SetAside::Unsupported)
    }

    /// How another process reopens this very store (isolated sweep runs: a worker process
    /// opens the parent's store from this), or `None` when it cannot (an in-memory store).
    /// [`FsStore`] says `fs` + its root; a user store returns its own kind and registers an
    /// opener for it with [`worker::main_guard_with`](crate::worker::main_guard_with).
    fn spec(&self) -> Option<StoreSpec> {
        None
    }

    /// The job's files on this machine's filesystem (its failure text and artifact folder), for
    /// a store that keeps them there: `None` (the default) for one that does not, and then a
    /// run's [`Run::artifact_dir`](crate::Run::artifact_dir) is `None` and a failure is
    /// reported from its record alone. [`FsStore`] returns itself.
    fn job_files(&self) -> Option<&dyn JobFiles> {
        None
    }
}

/// How to reopen a store in another process: a kind (`fs` for [`FsStore`], or a user store's
/// own name) and a location the kind's opener understands (a folder, a URL, ...). Serialized
/// into the task files of isolated sweep runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct StoreSpec {
    /// The store's kind: `fs`, or a name registered with
    /// [`worker::main_guard_with`](crate::worker::main_guard_with).
    pub kind: String,
    /// Where it is, in the kind's own terms.
    pub location: String,
}

impl StoreSpec {
    /// A spec of kind `kind` at `location`.
    pub fn new(kind: impl Into<String>, location: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            location: location.into(),
        }
    }
}

/// Where a store keeps a job's files on this machine's filesystem, for a store that has such
/// files ([`Store::job_files`]): a run's artifact folder
/// ([`Run::artifact_dir`](crate::Run::artifact_dir)) and the readable text of its last
/// failure. Paths are a filesystem store's business, so they are not [`Store`] methods: a store
/// of records in a database or an object store has none, and implements nothing here.
pub trait JobFiles {
    /// The file holding the text and backtrace of the job's last failure, when the job has
    /// failed and the file exists ([`FsStore`]: `ROOT/jobs/KEY/error.txt`).
    fn failure_file(&self, key: &Hash) -> Option<PathBuf>;

    /// Where the job's artifacts go, without creating the folder: a run makes it only when its
    /// job asks for it ([`Run::artifact_dir`](crate::Run::artifact_dir)), so a job
    /// without artifacts costs no folder ([`FsStore`]: `ROOT/jobs/KEY/artifacts`).
    fn artifact_path(&self, key: &Hash) -> PathBuf;

    /// [`artifact_path`](Self::artifact_path), created (with its parents) if missing; `None`
    /// when it cannot be.
    fn artifact_dir(&self, key: &Hash) -> Option<PathBuf> {
        let d = self.artifact_path(key);
        std::fs::create_dir_all(&d).ok()?;
        Some(d)
    }
}

macro_rules! forward_store {
    ($ty:ty) => {
        // Every method forwarded, provided ones included: a hook left to its default here would
        // hide the inner store's faster path (or its capability) behind a `Box` or an `Arc`.
        #[deny(clippy::missing_trait_methods)]
        impl<S: Store + ?Sized> Store for $ty {
            fn location(&self) -> String {
                (**self).location()
            }
            fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError> {
                (**self).record(key)
            }
            fn records(&self, keys: &[Hash]) -> Result<Vec<Option<JobRecord>>, StoreError> {
                (**self).records(keys)
            }
            fn keys(&self) -> Result<Vec<Hash>, StoreError> {
                (**self).keys()
            }
            fn done_head(&self, key: &Hash) -> Result<Option<DoneHead>, StoreError> {
                (**self).done_head(key)
            }
            fn done_heads(&self, keys: &[Hash]) -> Vec<Result<Option<DoneHead>, StoreError>> {
                (**self).done_heads(keys)
            }
            fn preload(&self) {
                (**self).preload()
            }
            fn lineage(&self, lineage: &Hash) -> Result<Option<Hash>, StoreError> {
                (**self).lineage(lineage)
            }
            fn lineages(&self, lineages: &[Hash]) -> Result<Vec<Option<Hash>>, StoreError> {
                (**self).lineages(lineages)
            }
            fn set_lineage(&self, lineage: &Hash, key: &Hash) -> Result<(), StoreError> {
                (**self).set_lineage(lineage, key)
            }
            fn reuse(&self, pairs: &[(Hash, Hash)]) -> Result<(), StoreError> {
                (**self).reuse(pairs)
            }
            fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
                (**self).claim_info(key)
            }
            fn claim(
                &self,
                key: &Hash,
                owner: &Owner,
                replace_done: Option<u32>,
            ) -> Result<ClaimOutcome, StoreError> {
                (**self).claim(key, owner, replace_done)
            }
            fn start(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
                (**self).start(claim, record)
            }
            fn deferrable_start(&self) -> bool {
                (**self).deferrable_start()
            }
            fn metric_sink(&self, claim: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
                (**self).metric_sink(claim)
            }
            fn finish(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
                (**self).finish(claim, record)
            }
            fn finish_many(&self, done: &[(&Claim, &JobRecord)]) -> Vec<Result<(), StoreError>> {
                (**self).finish_many(done)
            }
            fn release(&self, claim: &Claim) -> Result<(), StoreError> {
                (**self).release(claim)
            }
            fn heartbeat(&self, claim: &Claim) -> Result<(), StoreError> {
                (**self).heartbeat(claim)
            }
            fn heartbeat_interval(&self) -> std::time::Duration {
                (**self).heartbeat_interval()
            }
            fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError> {
                (**self).metrics(key, name)
            }
            fn record_metrics(
                &self,
                rec: &JobRecord,
                name: Option<&str>,
            ) -> Result<Series, StoreError> {
                (**self).record_metrics(rec, name)
            }
            fn spec(&self) -> Option<StoreSpec> {
                (**self).spec()
            }
            fn set_aside(&self, key: &Hash) -> Result<SetAside, StoreError> {
                (**self).set_aside(key)
            }
            fn job_files(&self) -> Option<&dyn JobFiles> {
                (**self).job_files()
            }
        }
    };
}

forward_store!(Box<S>);
forward_store!(std::sync::Arc<S>);
forward_store!(&S);

/// Conveniences on top of [`Store`], implemented for every store (the trait keeps only what an
/// implementation must decide). Tables of metrics are [`MetricsExt`](crate::metrics::MetricsExt)'s,
/// in `metrics`, which reads stores (a store never reads tables).
pub trait StoreExt: Store {
    /// The records of every done job, in finish order (then key). A record that cannot be
    /// parsed ([`StoreError::Corrupt`]) is not a done job's: it is left out with a warning
    /// (`tracing`), and `puzzletron sweep status` names it.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot be read (I/O).
    fn done_records(&self) -> Result<Vec<JobRecord>, StoreError> {
        let keys = self.keys()?;
        let mut recs: Vec<JobRecord> = records_in_parallel(self, &keys)?
            .into_iter()
            .filter_map(|r| {
                r.unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "a record cannot be read: its run is left out");
                    None
                })
            })
            .filter(|r| r.status == Status::Done)
            .collect();
        recs.sort_by(|a, b| {
            a.finished_at
                .unwrap_or(0.0)
                .total_cmp(&b.finished_at.unwrap_or(0.0))
                .then(a.key.cmp(&b.key))
        });
        Ok(recs)
    }
}

impl<S: Store + ?Sized> StoreExt for S {}

/// [`Store::records`] of `keys` with a result per key: a record that cannot be parsed
/// ([`StoreError::Corrupt`]) is that key's error, not the batch's (the batch is read again key
/// by key when one of its records is corrupt). Other errors (I/O) are the batch's.
pub(crate) fn records_per_key<S: Store + ?Sized>(
    store: &S,
    keys: &[Hash],
) -> Result<Vec<Result<Option<JobRecord>, StoreError>>, StoreError> {
    match store.records(keys) {
        Ok(v) => Ok(v.into_iter().map(Ok).collect()),
        Err(StoreError::Corrupt { .. }) => keys
            .iter()
            .map(|k| match store.record(k) {
                Err(e @ StoreError::Corrupt { .. }) => Ok(Err(e)),
                r => r.map(Ok),
            })
            .collect(),
        Err(e) => Err(e),
    }
}

/// [`Store::records`] of many keys, in chunks on a few threads (parsing 10k records is most of
/// the time a table of a large sweep takes before its rows); in order.
#[allow(clippy::type_complexity)]
pub(crate) fn records_in_parallel<S: Store + ?Sized>(
    store: &S,
    keys: &[Hash],
) -> Result<Vec<Result<Option<JobRecord>, StoreError>>, StoreError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4);
    if threads < 2 || keys.len() < 2048 {
        return records_per_key(store, keys);
    }
    let chunk = keys.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let parts: Vec<_> = keys
            .chunks(chunk)
            .map(|c| scope.spawn(move || records_per_key(store, c)))
            .collect();
        let mut out = Vec::with_capacity(keys.len());
        for p in parts {
            match p.join() {
                Ok(recs) => out.extend(recs?),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        Ok(out)
    })
}

/// Errors of a [`Store`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// An I/O error on a store file. Often transient (network filesystems, full disks freed).
    #[error("store I/O error on {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// [`FsStore::open`] found no store at the path: the folder does not exist (a misspelt
    /// path?). [`FsStore::create`] makes a new store there. Not retryable.
    #[error(
        "no puzzletron store at {path}: the folder does not exist (a misspelt path?); use FsStore::create to make a new store there"
    )]
    NotFound {
        /// The root given.
        path: PathBuf,
    },
    /// The store root exists and is not a folder.
    #[error(
        "store root {path} is not a directory: expected a folder (or a path that does not exist yet)"
    )]
    NotADirectory {
        /// The root given.
        path: PathBuf,
    },
    /// The store root cannot be a store: an empty path, a folder with other files, or a folder
    /// that cannot be created.
    #[error("{path:?} cannot be a puzzletron store: {reason}")]
    NotAStore {
        /// The root given.
        path: PathBuf,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// The store was written by a newer puzzletron.
    #[error(
        "store {path} has format version {found}, newer than this build's {supported}: upgrade puzzletron to read it (nothing was changed)"
    )]
    NewerFormat {
        /// The store's format file.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// This build's version.
        supported: u32,
    },
    /// A record or metric file that cannot be read as what it should be.
    #[error("corrupt store file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong and what was expected.
        reason: String,
    },
    /// The claim was taken over (its holder was presumed dead) or released meanwhile.
    #[error("claim on job {key} is no longer held by {owner}: another process took it over")]
    ClaimLost {
        /// The job.
        key: Hash,
        /// Who we were.
        owner: String,
    },
    /// A record found under a run's key belongs to another run: its job or its parameters are
    /// not the request's (a record copied or planted into another key's folder, or a key
    /// collision). Never reused as a cache hit; move the record away (or delete its folder) to
    /// run the job. Not retryable.
    #[error("{0}")]
    KeyCollision(Box<KeyCollision>),
    /// An error of a user store's own backend (a database, an object store, a service): the
    /// backend's error as `source`, and whether the same call may succeed later (`retryable`:
    /// a lost connection, a busy database; not a schema or permission error). Retry decisions
    /// follow `retryable` ([`StoreError::is_retryable`]).
    ///
    /// ```
    /// use puzzletron::store::StoreError;
    ///
    /// let e = StoreError::backend(std::io::Error::other("database is locked"), true);
    /// assert!(e.is_retryable());
    /// assert!(e.to_string().contains("database is locked"), "{e}");
    /// ```
    #[error("store backend error ({}): {source}", if *retryable { "may succeed if retried" } else { "retrying will not help" })]
    Backend {
        /// The backend's own error.
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
        /// Whether retrying the same call may succeed.
        retryable: bool,
    },
    /// A metric name that cannot be stored.
    #[error("invalid metric name {name:?}: expected a non-empty name without tabs or newlines")]
    BadMetricName {
        /// The name given.
        name: String,
    },
    /// The drain running the job was cancelled: [`Run::log`](crate::Run::log) and
    /// [`Run::flush`](crate::Run::flush) return it so that a job stops at its next row.
    /// Not a failure: the run is recorded as interrupted and runs again at the next drain
    /// (retryable).
    #[error(
        "the drain was cancelled (dropped drain_async future, cancellation token, Ctrl-C or SIGTERM): the run is recorded as interrupted and runs again at the next drain"
    )]
    Cancelled,
}

/// What [`StoreError::KeyCollision`] found: the stored record and the request, both named.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyCollision {
    /// The store (its folder, or `memory`).
    pub location: String,
    /// The key both were found under.
    pub key: Hash,
    /// The job the stored record names (with the key it was recorded under, when that is
    /// another).
    pub stored_job: String,
    /// The parameters the stored record names (canonical JSON).
    pub stored_params: String,
    /// The job asked for.
    pub requested_job: String,
    /// The parameters asked for (canonical JSON).
    pub requested_params: String,
}

impl std::fmt::Display for KeyCollision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "key collision in {} for key {}: the stored record is {} {}, the request is {} {}; \
             the record is not this run's result (move its folder away to run the job)",
            self.location,
            self.key,
            self.stored_job,
            self.stored_params,
            self.requested_job,
            self.requested_params
        )
    }
}

impl StoreError {
    /// A [`StoreError::Backend`] of a user store: `source` is the backend's own error,
    /// `retryable` whether the same call may succeed later.
    pub fn backend(
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
        retryable: bool,
    ) -> Self {
        StoreError::Backend {
            source: source.into(),
            retryable,
        }
    }

    /// Whether retrying can help: I/O errors may be transient, a cancelled run runs again at
    /// the next drain, and a [`Backend`](StoreError::Backend) error is as its `retryable`
    /// says; the others need a change.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Io { .. } | StoreError::Cancelled => true,
            StoreError::Backend { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

/// Checks a metric name: non-empty, no tab, CR or LF (they frame the row files).
pub(crate) fn check_metric_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || name.contains(['\t', '\n', '\r']) {
        return Err(StoreError::BadMetricName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Default time after which a claim whose holder cannot be proved alive or dead from here (see
/// [`Owner::liveness`]) is stale when its heartbeat has not changed.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(60);

/// How often a holder renews a claim of a store with the default stale interval.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// The heartbeat interval of a store whose stale interval is `stale_after`: a quarter of it (so
/// three renewals may be late before a claim goes stale), at most [`DEFAULT_HEARTBEAT`], at
/// least 10 ms.
pub fn heartbeat_for(stale_after: Duration) -> Duration {
    (stale_after / 4).clamp(Duration::from_millis(10), DEFAULT_HEARTBEAT)
}
