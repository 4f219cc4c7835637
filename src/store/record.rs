//! The self-describing records a store keeps per job (`docs/design.md`, "Store").

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::liveness::{Liveness, ProcessSpace};
use crate::identity::{Hash, OwnedDigest, Witnesses};
use crate::sys::process_start_ticks;

/// The newest store and record format this build reads: a store or a record written in a newer
/// one is refused rather than misread. Version 2 added rows kept in the record
/// ([`MetricsInfo::inline`]); a record without them is written as `BASE_FORMAT`, which builds
/// before version 2 read. Versions 3 (`CLAIM_FORMAT`) and 4 (`LIVENESS_FORMAT`) are the
/// store's folder layout and claim protocol.
pub const FORMAT_VERSION: u32 = 4;
/// Version 3: a new job folder's `mkdir` is its claim until the claim file is written, and
/// lineage pointers are symlinks. A build before it would take such a folder for a free job
/// and run it a second time.
#[allow(dead_code)] // names a version in the format's history; nothing tests for it alone
pub(super) const CLAIM_FORMAT: u32 = 3;
/// Version 4, the format an [`FsStore`](super::FsStore) writes in its `puzzletron-store.json`
/// (and upgrades an older store to when it opens one): owners carry their process space (boot
/// id, PID namespace), a claim is judged dead at once only from the owner's own process space
/// and by its heartbeat, timed on the judge's clock, everywhere else; a takeover moves the stale
/// claim aside and checks what it moved; the done index keys entries by lineage too. A build
/// before it judges a claim from another PID namespace or boot by its pid and would run the
/// job a second time, so it refuses the store instead.
pub(crate) const LIVENESS_FORMAT: u32 = 4;
/// Version 1: the format of a store's folder layout and of a record whose rows (if any) are in
/// a file.
pub(crate) const BASE_FORMAT: u32 = 1;
/// The format of a record that keeps its rows ([`MetricsInfo::inline`]).
pub(crate) const INLINE_FORMAT: u32 = 2;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// Claimed and started; the owner may since have died (then it is "interrupted").
    Running,
    /// Finished successfully; its metrics are complete.
    Done,
    /// Its last attempt failed; [`JobRecord::error`] says why.
    Failed,
}

/// Who holds a claim: enough to tell whether the holder is still alive, and who may tell (see
/// [`Owner::liveness`] and `store/liveness.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Owner {
    /// Host name of the claiming process.
    pub host: String,
    /// Its process id, in its own PID namespace.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22), so a reused pid is
    /// not mistaken for the owner; `None` where unknown.
    pub start_ticks: Option<u64>,
    /// A random id unique to this owner (several owners may live in one process).
    pub nonce: String,
    /// The kernel boot id of its host (`/proc/sys/kernel/random/boot_id`): a pid of another
    /// boot (the same host name after a reboot, or another machine of that name) proves
    /// nothing. `None` in claims of older builds, or where unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Its PID namespace (`readlink /proc/self/ns/pid`, e.g. `pid:[4026531836]`): a pid of
    /// another namespace (a container sharing the host's name, `unshare --pid`) proves nothing.
    /// `None` in claims of older builds, or where unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pidns: Option<String>,
}

impl Owner {
    /// A fresh owner for the current process, with a nonce this process will recognise as its
    /// own ([`Liveness::Ours`]).
    pub fn current() -> Self {
        let pid = std::process::id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nonce = Hash::of(format!("{nanos}/{pid}/{n}/{:p}", &COUNTER)).short();
        super::liveness::mint(&nonce);
        let here = ProcessSpace::here();
        Self {
            host: here.host.clone(),
            pid,
            start_ticks: super::liveness::own_start_ticks(),
            nonce,
            boot_id: here.boot_id.clone(),
            pidns: here.pidns.clone(),
        }
    }

    /// What this process may conclude about the owner (see [`Liveness`]):
    ///
    /// - [`Liveness::Ours`]: this process made it;
    /// - only when its host, boot id and PID namespace are all this process's own: [`Dead`]
    ///   when no process has its pid with its start time (or it claims this process's pid with
    ///   a nonce this process never made: a previous process of that pid, e.g. pid 1 of a
    ///   restarted container), [`Alive`] when one does;
    /// - [`Liveness::Unproven`] otherwise (and for a pid alive here without a recorded start
    ///   time: it may be a reused pid).
    ///
    /// Only `Dead` allows a takeover at once; for the others the heartbeat decides.
    ///
    /// [`Dead`]: Liveness::Dead
    /// [`Alive`]: Liveness::Alive
    pub fn liveness(&self) -> Liveness {
        if super::liveness::minted_here(&self.nonce) {
            return Liveness::Ours;
        }
        let here = ProcessSpace::here();
        if !here.can_look_up(&self.host, self.boot_id.as_deref(), self.pidns.as_deref()) {
            return Liveness::Unproven;
        }
        if self.pid == std::process::id() {
            return Liveness::Dead;
        }
        match (process_start_ticks(self.pid), self.start_ticks) {
            (None, _) => Liveness::Dead,
            (Some(now), Some(then)) if now == then => Liveness::Alive,
            (Some(_), Some(_)) => Liveness::Dead,
            (Some(_), None) => Liveness::Unproven,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The owner a store reports for a claim whose file is empty or not written yet.
        if self.pid == 0 && self.nonce == "unwritten" {
            return f.write_str("a holder that has not written its claim yet");
        }
        if self.pid == 0 && self.nonce == "unreadable" {
            return f.write_str("an unreadable claim");
        }
        write!(f, "pid {} on {}", self.pid, self.host)?;
        // A pid of another PID namespace or boot is not the pid a reader sees here.
        let here = ProcessSpace::here();
        if self.host == here.host {
            if self.boot_id.is_some() && self.boot_id != here.boot_id {
                write!(f, " (another boot)")?;
            } else if let Some(ns) = &self.pidns
                && here.pidns.as_ref() != Some(ns)
            {
                write!(f, " (PID namespace {ns})")?;
            }
        }
        Ok(())
    }
}

/// Why the last attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Failure {
    /// `error` (the job returned an error) or `panic`.
    pub kind: String,
    /// The error's message.
    pub message: String,
    /// The error's `source()` chain, outermost first.
    pub chain: Vec<String>,
    /// A backtrace, when one could be captured (panics: where it panicked).
    pub backtrace: Option<String>,
}

/// What a finished attempt logged: where the rows are and how many, so a reader can check the
/// file is complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct MetricsInfo {
    /// File name inside the job folder (`FsStore`), e.g. `metrics.1.tsv`; empty when the rows
    /// are [`inline`](Self::inline) (there is no file then).
    pub file: String,
    /// Number of rows (`name`, `step`, `value`).
    pub rows: u64,
    /// Distinct metric names, sorted.
    pub names: Vec<String>,
    /// The rows themselves, as the file would hold them (`name TAB step TAB value` lines), when
    /// the store kept them in the record instead: `FsStore` does for an attempt that ended
    /// before any batch of rows was written, with at most
    /// [`INLINE_BYTES`](crate::store::INLINE_BYTES) of rows (no file then, and no `fdatasync`
    /// of one). Absent from records written before it existed, and when the rows are in `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline: Option<String>,
}

impl MetricsInfo {
    /// What a [`MetricSink`](crate::store::MetricSink) of a user store returns from
    /// `summary`/`seal`: `rows` rows in `file` (a name the store understands; empty when
    /// there is no file), with these distinct metric `names` (sorted here).
    ///
    /// ```
    /// use puzzletron::store::MetricsInfo;
    ///
    /// let info = MetricsInfo::new("rows.db", 3, ["loss", "acc", "loss"]);
    /// assert_eq!(info.names, ["acc", "loss"]);
    /// assert_eq!((info.rows, info.inline), (3, None));
    /// ```
    pub fn new(
        file: impl Into<String>,
        rows: u64,
        names: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
        names.sort();
        names.dedup();
        Self {
            file: file.into(),
            rows,
            names,
            inline: None,
        }
    }

    /// The same summary with the rows kept inline (see [`inline`](Self::inline)): `text` is
    /// the rows as `name TAB step TAB value` lines.
    pub fn with_inline(mut self, text: impl Into<String>) -> Self {
        self.inline = Some(text.into());
        self
    }
}

/// Everything a store knows about one job. Stored as JSON (`record.json` in `FsStore`), readable
/// without puzzletron.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobRecord {
    /// Record format version ([`FORMAT_VERSION`]).
    pub format: u32,
    /// The job key.
    pub key: Hash,
    /// The job's name (its Rust path).
    pub job: String,
    /// The bound parameters (canonical JSON, parsed).
    pub params: serde_json::Value,
    /// Top-level parameter names in declaration order.
    pub param_order: Vec<String>,
    /// The metric-table column type of each top-level parameter, from its Rust type (absent in
    /// records written before it existed: their columns are typed from the values).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub param_types: std::collections::BTreeMap<String, crate::identity::ParamType>,
    /// Name + parameters without the code (see [`crate::identity::lineage_key`]).
    pub lineage: Hash,
    /// The owned-code digest and its files.
    pub owned: OwnedDigest,
    /// The environment of the last attempt.
    pub witnesses: Witnesses,
    /// Where the job stands.
    pub status: Status,
    /// Attempt number of the last attempt (1-based).
    pub attempt: u32,
    /// Who ran the last attempt.
    pub owner: Option<Owner>,
    /// Start of the last attempt, Unix seconds.
    pub started_at: f64,
    /// End of the last attempt, Unix seconds (`None` while running).
    pub finished_at: Option<f64>,
    /// Why the last attempt failed.
    pub error: Option<Failure>,
    /// The metrics of the last attempt (set when it finished).
    pub metrics: Option<MetricsInfo>,
}

impl JobRecord {
    /// Sets what the finished attempt logged, and the record's format to the oldest that holds
    /// it: `INLINE_FORMAT` for rows kept in the record, else `BASE_FORMAT`.
    pub fn set_metrics(&mut self, info: MetricsInfo) {
        self.format = if info.inline.is_some() {
            INLINE_FORMAT
        } else {
            BASE_FORMAT
        };
        self.metrics = Some(info);
    }
}
