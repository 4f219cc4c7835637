//! The self-describing records a store keeps per job (DESIGN.md §4).

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::identity::{Hash, OwnedDigest, Witnesses};

/// The newest store and record format this build reads: a store or a record written in a newer
/// one is refused rather than misread. Version 2 added rows kept in the record
/// ([`MetricsInfo::inline`]); a record without them is written as [`BASE_FORMAT`], which builds
/// before version 2 read. Version 3 ([`CLAIM_FORMAT`]) is the store's folder layout.
pub const FORMAT_VERSION: u32 = 3;
/// Version 3, the format an [`FsStore`](super::FsStore) writes in its `puzzletron-store.json`
/// (and upgrades an older store to when it opens one): a new job folder's `mkdir` is its claim
/// until the claim file is written, and lineage pointers are symlinks. A build before it would
/// take such a folder for a free job and run it a second time, so it refuses the store
/// instead.
pub const CLAIM_FORMAT: u32 = 3;
/// Version 1: the format of a store's folder layout and of a record whose rows (if any) are in
/// a file.
pub const BASE_FORMAT: u32 = 1;
/// The format of a record that keeps its rows ([`MetricsInfo::inline`]).
pub const INLINE_FORMAT: u32 = 2;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Claimed and started; the owner may since have died (then it is "interrupted").
    Running,
    /// Finished successfully; its metrics are complete.
    Done,
    /// Its last attempt failed; [`JobRecord::error`] says why.
    Failed,
}

/// Who holds a claim: enough to tell whether the holder is still alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Host name of the claiming process.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its start time in clock ticks since boot (`/proc/PID/stat` field 22), so a reused pid is
    /// not mistaken for the owner; `None` where unknown.
    pub start_ticks: Option<u64>,
    /// A random id unique to this owner (several owners may live in one process).
    pub nonce: String,
}

impl Owner {
    /// A fresh owner for the current process.
    pub fn current() -> Self {
        let pid = std::process::id();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nonce = Hash::of(format!("{nanos}/{pid}/{n}/{:p}", &COUNTER)).short();
        Self {
            host: hostname(),
            pid,
            start_ticks: process_start_ticks(pid),
            nonce,
        }
    }

    /// Whether the owner process still runs, judged on this host: `Some(true/false)` when the
    /// owner is on this host, `None` when it is on another host (then only a heartbeat tells).
    pub fn alive_here(&self) -> Option<bool> {
        if self.host != hostname() {
            return None;
        }
        Some(match (process_start_ticks(self.pid), self.start_ticks) {
            (None, _) => false,
            (Some(now), Some(then)) => now == then,
            (Some(_), None) => true,
        })
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The owner a store reports for a claim whose file is empty or not written yet.
        if self.pid == 0 && self.nonce == "unwritten" {
            return f.write_str("a holder that has not written its claim yet");
        }
        write!(f, "pid {} on {}", self.pid, self.host)
    }
}

/// The host name (`gethostname(2)`), or `"unknown"`.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A process's start time in clock ticks since boot, from `/proc/PID/stat` (field 22, see
/// proc(5)); `None` when the process does not exist (or on systems without procfs).
pub fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    // `rest` starts at field 3 (state); field 22 is index 19 here. A zombie (or a dying
    // process, `X`) is not alive.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if matches!(fields.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Why the last attempt failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Everything a store knows about one job. Stored as JSON (`record.json` in `FsStore`), readable
/// without puzzletron.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// it: [`INLINE_FORMAT`] for rows kept in the record, else [`BASE_FORMAT`].
    pub fn set_metrics(&mut self, info: MetricsInfo) {
        self.format = if info.inline.is_some() {
            INLINE_FORMAT
        } else {
            BASE_FORMAT
        };
        self.metrics = Some(info);
    }
}

/// Now, as Unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
