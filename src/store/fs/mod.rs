//! [`FsStore`]: a store in a folder, one sub-folder per job key.
//!
//! ```text
//! ROOT/puzzletron-store.json        {"format": 4} (`LIVENESS_FORMAT`)
//! ROOT/jobs/KEY/record.json         the JobRecord (atomic replace)
//! ROOT/jobs/KEY/claim               the holder (create-exclusive; an `Owner` with its host,
//!                                   boot id, PID namespace, pid and start time); its mtime is
//!                                   the heartbeat (see `claim` for who may judge it stale).
//!                                   In a folder the claimer's `mkdir` made, the `mkdir` is the
//!                                   claim until `start` or the first heartbeat writes this
//!                                   file (see `Holder`)
//! ROOT/holders/NONCE.json           a handle that may hold claims whose file is not written yet
//! ROOT/jobs/KEY/claim.released      the last released claim (renamed, not removed: see RELEASED)
//! ROOT/jobs/KEY/running.N.json      the running record of attempt N, as it started (emptied
//!                                   when the attempt ends if over 64 KiB: the inode stays,
//!                                   see RELEASED)
//! ROOT/jobs/KEY/claim.stale.TOKEN   a stale claim moved aside by a takeover (each taker's
//!                                   own name; removed by the next holder's finish)
//! ROOT/jobs/KEY/metrics.N.tsv       rows of attempt N: name TAB step TAB value LF (made with
//!                                   the first batch; none when a short done attempt keeps
//!                                   its rows in its record, see `MetricsInfo::inline`)
//! ROOT/jobs/KEY/error.txt           the last failure's text and backtrace
//! ROOT/jobs/KEY/artifacts/          files the job writes (Run::artifact_dir)
//! ROOT/jobs/KEY/artifacts.attempt-N/  what attempt N (failed, killed, or replaced by a re-run)
//!                                   left there, moved aside before the next attempt runs
//! ROOT/lineage/LINEAGE              the key last started, or reused by a drain, for a job
//!                                   name + parameters (`Store::reuse`): a symlink whose
//!                                   target holds the key (see `pointer`)
//! ROOT/done.idx                     a cache of done records for fast cache hits (see `index`)
//! ROOT/corrupt/KEY.UNIXSECS         a job folder whose record was corrupt, moved aside
//!                                   (`Store::set_aside`), kept
//! ROOT/corrupt/repair.lock          held while a folder is moved aside (create-exclusive; an
//!                                   `Owner`, judged as a claim is: see `repair`)
//! ```
//!
//! The parts: `claim` (claims, holders, takeover), `commit` (a finish, alone or a group
//! commit), `dir` (folder handles and `*at` opens), `index` (`done.idx`), `pointer` (lineage
//! pointers), `repair` (`set_aside`), `rows` (reading row files) and `sink` (writing them).
//!
//! Exclusion uses `mkdir(2)`, `open(O_CREAT|O_EXCL)`, `rename(2)` and `link(2)`, which are
//! atomic on local filesystems and on NFSv3+; no `flock`, which is unreliable across NFS
//! clients (a no-op with `nolock`, `ENOSYS` on Lustre without `-o flock`).

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File};
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fsutil::atomic_write;
use crate::identity::Hash;
use crate::store::liveness::HeartbeatWatch;
use crate::store::{
    Claim, ClaimInfo, ClaimOutcome, DEFAULT_STALE_AFTER, DoneHead, FORMAT_VERSION, JobFiles,
    JobRecord, LIVENESS_FORMAT, MetricSink, Owner, Series, SetAside, Status, Store, StoreError,
};

mod claim;
mod commit;
mod dir;
mod index;
mod pointer;
mod repair;
mod rows;
mod sink;

pub use rows::TornTail;
pub use sink::{FLUSH_INTERVAL, FLUSH_ROWS, INLINE_BYTES};

use dir::{list_names, open_dir, open_record_at, worth_listing};
use index::{DoneIndex, Entry, INDEX_FILE};
use rows::{Bound, read_rows};
use sink::FsSink;

#[cfg(any(test, feature = "test-util"))]
pub use claim::FaultHook;
#[cfg(any(test, feature = "test-util"))]
pub use claim::FsOp as FaultOp;
#[cfg(test)]
use claim::{CLAIM, HOLDERS, RELEASED, read_owner};
use claim::{Held, Holder, gone};

const FORMAT_FILE: &str = "puzzletron-store.json";
/// A [`Store`] in a folder on a local or shared filesystem. Several processes, on one or many
/// hosts, may use one folder at once.
///
/// # fsync budget per run
///
/// A run that ends done alone costs at most three `fsync`s, all in [`Store::finish`] and the
/// sink's [`MetricSink::seal`] before it: one `fdatasync` of its metrics file, one of the
/// record's temp file and one of the job folder after the rename, which also makes the metrics
/// file's entry durable. A done run none of whose rows was written to its file before the end,
/// with at most [`INLINE_BYTES`](crate::store::INLINE_BYTES) of them (no rows, or a few final scores),
/// has no metrics file: its rows are in its record, and it costs two. A failed run costs three
/// (it keeps its rows in a file; its `error.txt` is a copy of what the record holds and is not
/// synced). Claims, the running record, the lineage pointer and the done index (`done.idx`)
/// are never synced: they matter only while their writer lives, or are a cache.
///
/// Runs that finish together share their flushes ([`Store::finish_many`], a group commit): a
/// sweep's in-process drain commits the runs that finished while the last commit was in
/// flight as one batch (up to 64), and a batch costs two `syncfs(2)` calls whatever its size,
/// one after every record is written to its temp file and one after every rename, instead of
/// two `fsync`s per run (where there is no `syncfs`, each file and folder is `fsync`ed). A run
/// that finishes alone (the usual case for runs of more than a few milliseconds) is committed
/// alone, as above, so a sweep never waits on a flush of other writers' data behind a long run.
/// The drain returns once every commit is durable. A run frees no inode (the claim is renamed
/// `claim.released`); a record a machine crash left empty or zero-filled can only be an
/// unsynced running record and reads as an attempt that never started.
///
/// # Files per run
///
/// A first pass of short runs makes two files per run: the job folder (whose `mkdir` is the
/// claim, see the layout above) and `record.json`, plus a lineage pointer, a symlink with the
/// key in its inode. A run that lasts long enough for a drain's committers to write its start
/// also gets its claim file and its running record. Each file made costs an inode and, for
/// all but the pointer, a block to allocate and flush: file creation is most of what a first
/// pass costs.
///
/// # Cache hits
///
/// `done.idx` lists, per done record, its attempt, the digest of its witnesses and the SHA-256
/// of its bytes. A cache hit ([`Store::done_head`]) reads `record.json` and compares its digest
/// instead of parsing it; an entry that does not match (a record edited, replaced or deleted
/// behind the index) is ignored and the record is read as usual. The index is append-only, a
/// torn last line is ignored, and a lost one is rebuilt as records are read. A sweep asks in
/// batches ([`Store::done_heads`]: records opened relative to one handle on `jobs/`, on a few
/// threads) after [`Store::preload`] let the index load while its runs were enqueued: a hit
/// costs three syscalls (`openat`, `read`, `close`) and a SHA-256 of about 1 KB.
#[derive(Debug, Clone)]
pub struct FsStore {
    root: PathBuf,
    jobs: PathBuf,
    lineage: PathBuf,
    stale_after: Duration,
    /// A new job folder's `mkdir` is its claim until its start (see [`Holder`]); `false`: the
    /// claim file is written at once ([`FsStore::with_claim_files_at_once`]).
    defer_claims: bool,
    index: DoneIndex,
    /// The claims this process took through this handle (and its clones), until their finish
    /// or release: see [`Held`].
    held: Arc<Mutex<HashMap<Hash, Held>>>,
    /// This handle's entry in `holders/` (shared by its clones).
    holder: Arc<Holder>,
    /// How long this handle has seen each claim's heartbeat unchanged (shared by its clones).
    watch: Arc<HeartbeatWatch<PathBuf>>,
    /// A test's fault injection ([`FsStore::with_fault_hook`]).
    #[cfg(any(test, feature = "test-util"))]
    faults: Option<claim::Faults>,
}

/// The store error of a lineage pointer at `path` that cannot be read: `Corrupt` when it
/// names no key.
fn pointer_err(path: PathBuf, e: io::Error) -> StoreError {
    match e.kind() {
        io::ErrorKind::InvalidData => StoreError::Corrupt {
            path,
            reason: e.to_string(),
        },
        _ => StoreError::Io { path, source: e },
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl FsStore {
    /// The rows attempt `attempt` of job `key` has written so far, whatever its state: for a
    /// running or interrupted attempt (a killed process, a lost machine) these are the rows
    /// flushed before the end (see [`Run::log`](crate::Run::log) for when rows are
    /// flushed). A last line cut short by a crash is dropped and returned as a [`TornTail`]
    /// (its file and byte offset), never an error; show it as a warning.
    ///
    /// An attempt without a file has the rows its finished record holds (a short done attempt
    /// keeps them there, [`MetricsInfo::inline`](crate::store::MetricsInfo::inline)), else none.
    ///
    /// # Errors
    /// [`StoreError::Io`] when the file or the record cannot be read, [`StoreError::Corrupt`]
    /// when a complete row before the end is not `name TAB step TAB value` (naming the file,
    /// or `record.json` for rows kept there).
    pub fn attempt_metrics(
        &self,
        key: &Hash,
        attempt: u32,
    ) -> Result<(Series, Option<TornTail>), StoreError> {
        let path = self.job_dir(key).join(format!("metrics.{attempt}.tsv"));
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A short done attempt keeps its rows in its record (`MetricsInfo::inline`);
                // and the file may have been made, and the attempt finished, since the `open`.
                return match self.record(key)? {
                    Some(rec) if rec.attempt == attempt && rec.status != Status::Running => {
                        Ok((self.record_metrics(&rec, None)?, None))
                    }
                    _ => Ok((Series::default(), None)),
                };
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        read_rows(
            &path,
            BufReader::with_capacity(1 << 16, file),
            Bound::ToEnd,
            None,
        )
    }

    /// Opens the existing store at `root`; never creates one, so that a misspelt path is an
    /// error instead of a new empty store. Use [`FsStore::create`] to make a new store.
    ///
    /// ```
    /// use puzzletron::store::FsStore;
    /// use puzzletron::store::StoreError;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let e = FsStore::open(dir.path().join("typo")).unwrap_err();
    /// assert!(matches!(e, StoreError::NotFound { .. }), "{e}");
    /// FsStore::create(dir.path().join("store"))?;
    /// FsStore::open(dir.path().join("store"))?; // now it exists
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when `root` does not exist (naming it, and suggesting
    /// [`FsStore::create`]), [`StoreError::NotAStore`] when it is a folder that holds no store
    /// (no `puzzletron-store.json`), [`StoreError::NotADirectory`] when it is a file,
    /// [`StoreError::NewerFormat`] when a newer puzzletron wrote it, [`StoreError::Corrupt`]
    /// when its format file is not JSON, [`StoreError::Io`].
    pub fn open(root: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(root.as_ref(), false)
    }

    /// Opens the store at `root`, creating it when missing: a new folder, or an existing empty
    /// one (an existing store is opened as [`FsStore::open`] does). Several processes may
    /// create one store at once.
    ///
    /// # Errors
    /// [`StoreError::NotAStore`] when `root` is empty, a folder that holds other files and no
    /// store, or a folder that cannot be created; otherwise as [`FsStore::open`].
    pub fn create(root: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with(root.as_ref(), true)
    }

    fn open_with(root: &Path, create: bool) -> Result<Self, StoreError> {
        let root = root.to_path_buf();
        if root.as_os_str().is_empty() {
            return Err(StoreError::NotAStore {
                path: root,
                reason: "the path is empty: expected a folder path such as `.puzzletron`".into(),
            });
        }
        if root.exists() && !root.is_dir() {
            return Err(StoreError::NotADirectory { path: root });
        }
        let fmt = root.join(FORMAT_FILE);
        if !create {
            match fs::symlink_metadata(&fmt) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(if root.exists() {
                        StoreError::NotAStore {
                            path: root,
                            reason: format!(
                                "the folder has no {FORMAT_FILE}: expected an existing store \
                                 (FsStore::create makes a new one in a new or empty folder)"
                            ),
                        }
                    } else {
                        StoreError::NotFound { path: root }
                    });
                }
                Err(e) => return Err(io_err(&fmt)(e)),
            }
        }
        // Never scatter store folders into an unrelated folder (or into another store's jobs).
        // Our own entries are allowed: another process may be creating this store right now.
        if root.is_dir() && !fmt.exists() {
            let ours = |n: &str| {
                matches!(n, "jobs" | "lineage" | FORMAT_FILE | INDEX_FILE)
                    || n.starts_with(&format!(".{FORMAT_FILE}.tmp"))
                    || n.starts_with(&format!(".{INDEX_FILE}.tmp"))
            };
            for e in fs::read_dir(&root).map_err(io_err(&root))? {
                let name = e.map_err(io_err(&root))?.file_name();
                if !ours(&name.to_string_lossy()) {
                    return Err(StoreError::NotAStore {
                        path: root.clone(),
                        reason: format!(
                            "the folder is not empty (it holds {name:?}) and has no {FORMAT_FILE}: \
                             expected a puzzletron store or a new/empty folder"
                        ),
                    });
                }
            }
        }
        fs::create_dir_all(&root).map_err(|e| StoreError::NotAStore {
            path: root.clone(),
            reason: format!("cannot create the folder: {e}"),
        })?;
        let jobs = root.join("jobs");
        let lineage = root.join("lineage");
        fs::create_dir_all(&jobs).map_err(io_err(&jobs))?;
        fs::create_dir_all(&lineage).map_err(io_err(&lineage))?;
        match fs::read(&fmt) {
            Ok(bytes) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
                        path: fmt.clone(),
                        reason: format!("not JSON: {e}"),
                    })?;
                let found = v.get("format").and_then(|f| f.as_u64()).ok_or_else(|| {
                    StoreError::Corrupt {
                        path: fmt.clone(),
                        reason: "expected an object with an integer `format`".into(),
                    }
                })?;
                if found > u64::from(FORMAT_VERSION) {
                    return Err(StoreError::NewerFormat {
                        path: fmt,
                        found: u32::try_from(found).unwrap_or(u32::MAX),
                        supported: FORMAT_VERSION,
                    });
                }
                // Older builds would judge our claims by the old rules (a folder whose claim is
                // its `mkdir` free, a pid of another PID namespace dead): from now on they
                // refuse this store (see `LIVENESS_FORMAT`).
                if found < u64::from(LIVENESS_FORMAT) {
                    write_format(&fmt)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => write_format(&fmt)?,
            Err(e) => {
                return Err(StoreError::Io {
                    path: fmt,
                    source: e,
                });
            }
        }
        let holder = Arc::new(Holder::new(&root));
        Ok(Self {
            holder,
            watch: Arc::default(),
            #[cfg(any(test, feature = "test-util"))]
            faults: None,
            index: DoneIndex::new(&root),
            root,
            jobs,
            lineage,
            stale_after: DEFAULT_STALE_AFTER,
            defer_claims: true,
            held: Arc::default(),
        })
    }

    /// Sets how long this handle must see a claim's heartbeat unchanged before it takes the
    /// claim over (default 60 s), for every holder it cannot prove dead: owners on another
    /// host, boot or PID namespace, a live process of its own that stopped renewing, an
    /// unreadable claim file (see [`Owner::liveness`]). Holders renew every
    /// [`heartbeat_interval`](Store::heartbeat_interval) (a quarter of this, at most 10 s);
    /// every process using the store should use the same value.
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// Makes the filesystem calls named by [`FaultOp`] answer what `hook` says instead of what
    /// they got (feature `test-util`): `ESTALE` instead of `ENOENT`, `EACCES` instead of
    /// `EEXIST`, as NFS and Lustre do (P03, P04 in `docs/evidence.md`).
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.faults = Some(claim::Faults(hook));
        self
    }

    /// Writes each claim's file when the claim is taken, as stores of format 2 did, instead of
    /// letting a new job folder's `mkdir` be the claim until the run starts. For a process that
    /// claims one job and starts it at once (an isolated sweep worker): a deferred claim buys
    /// it nothing, and costs it an entry in `holders/`, made and removed once per process.
    pub fn with_claim_files_at_once(mut self) -> Self {
        self.defer_claims = false;
        self
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of one job.
    pub fn job_dir(&self, key: &Hash) -> PathBuf {
        let mut hex = [0u8; Hash::HEX_LEN];
        self.jobs.join(key.write_hex(&mut hex))
    }

    /// [`Store::lineage`] read relative to the `lineage/` folder handle `dir`.
    fn lineage_at(&self, dir: &File, lineage: &Hash) -> Result<Option<Hash>, StoreError> {
        let path = || self.lineage.join(lineage.to_hex());
        pointer::read_at(dir, lineage, path).map_err(|e| pointer_err(path(), e))
    }

    /// The record of `key` and, when it is done, its index entry (for the caller to note).
    fn read_record(&self, key: &Hash) -> Result<Option<(JobRecord, Option<Entry>)>, StoreError> {
        let path = self.job_dir(key).join("record.json");
        let path = path.as_path();
        let mut tries = 0;
        let bytes = loop {
            match fs::read(path) {
                Ok(b) => break b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                // NFS: the record was replaced (renamed over) behind a cached handle; the name
                // now leads to the new one.
                Err(e) if gone(&e) && tries < 2 => tries += 1,
                Err(e) => {
                    return Err(StoreError::Io {
                        path: path.to_path_buf(),
                        source: e,
                    });
                }
            }
        };
        // Only running records are written without fsync (done and failed ones are synced
        // before their rename), so a record that a machine crash left empty or zero-filled was
        // a running one: its attempt is interrupted, as if it had never started.
        if bytes.iter().all(|&b| b == 0) {
            // A running record is a second name of `running.N.json` (`write_running`): a
            // record emptied by anything else (a done record's own inode: a user's `truncate`,
            // a tool) is not what a crash leaves, and is corrupt.
            use std::os::unix::fs::MetadataExt;
            let linked = fs::metadata(path).is_ok_and(|m| m.nlink() > 1);
            if linked {
                return Ok(None);
            }
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "the record is {} and is not a running record a crash left unwritten: \
                     expected a puzzletron job record",
                    match bytes.len() {
                        0 => "empty (0 bytes)".to_string(),
                        n => format!("{n} zero bytes"),
                    }
                ),
            });
        }
        let rec = parse_record(path, &bytes)?;
        // Only a record that is its folder's own becomes a cache entry: one copied or planted
        // under another key is read in full (and refused, `StoreError::KeyCollision`) every
        // time. The entry keeps the record's lineage, which a cache hit compares with the
        // request's.
        let entry = Entry::of(&rec, &bytes).filter(|_| rec.key == *key);
        Ok(Some((rec, entry)))
    }
}

/// Writes the store's format file: [`LIVENESS_FORMAT`] and who wrote it.
fn write_format(fmt: &Path) -> Result<(), StoreError> {
    let body = format!(
        "{{\"format\":{LIVENESS_FORMAT},\"written_by\":\"puzzletron {}\"}}\n",
        env!("CARGO_PKG_VERSION")
    );
    atomic_write(fmt, body.as_bytes()).map_err(io_err(fmt))
}

/// `value` as the pretty JSON a store file holds (with a final newline), for `path`.
fn json_bytes(path: &Path, value: &impl serde::Serialize) -> Result<Vec<u8>, StoreError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

fn parse_record(path: &Path, bytes: &[u8]) -> Result<JobRecord, StoreError> {
    // The common case in one pass; a newer format that still parses is refused all the same.
    if let Ok(rec) = serde_json::from_slice::<JobRecord>(bytes) {
        if rec.format > FORMAT_VERSION {
            return Err(StoreError::NewerFormat {
                path: path.to_path_buf(),
                found: rec.format,
                supported: FORMAT_VERSION,
            });
        }
        return Ok(rec);
    }
    // Check the version before the shape, so a newer format is reported as such.
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("not JSON ({e}): expected a puzzletron job record"),
    })?;
    if let Some(found) = v.get("format").and_then(|f| f.as_u64())
        && found > u64::from(FORMAT_VERSION)
    {
        return Err(StoreError::NewerFormat {
            path: path.to_path_buf(),
            found: u32::try_from(found).unwrap_or(u32::MAX),
            supported: FORMAT_VERSION,
        });
    }
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("not a job record: {e}"),
    })
}

impl Store for FsStore {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn spec(&self) -> Option<crate::store::StoreSpec> {
        Some(crate::store::StoreSpec::new(
            "fs",
            self.root.display().to_string(),
        ))
    }

    /// Moves the job's whole folder (its record, rows, artifacts, failure text) to
    /// `ROOT/corrupt/KEY.UNIXSECS` (`.N` added when taken), never deleting anything; the job's
    /// next claim starts a fresh folder at attempt 1.
    ///
    /// Under the store's repair lock (`ROOT/corrupt/repair.lock`, see `fs/repair.rs`) the record
    /// is read again and moved only while it is still corrupt: a drain that planned the repair
    /// before another drain repaired the run (and maybe ran it again) moves nothing, and says so
    /// ([`SetAside::NotMoved`]); its claim then finds that run done or held.
    fn set_aside(&self, key: &Hash) -> Result<SetAside, StoreError> {
        let dir = self.job_dir(key);
        let aside = self.root.join("corrupt");
        fs::create_dir_all(&aside).map_err(io_err(&aside))?;
        let _lock = self.repair_lock(&aside)?;
        match self.read_record(key) {
            Err(StoreError::Corrupt { .. }) => {}
            // Readable again, or gone: another process repaired it first.
            Ok(_) => {
                tracing::info!(key = %key.short(), dir = %dir.display(), "not moved aside: repaired by another process meanwhile");
                return Ok(SetAside::NotMoved(format!(
                    "{} was repaired by another process meanwhile",
                    dir.display()
                )));
            }
            Err(e) => return Err(e),
        }
        let stamp = crate::sys::unix_now() as u64;
        for n in 0..1000u32 {
            let name = match n {
                0 => format!("{}.{stamp}", key.to_hex()),
                _ => format!("{}.{stamp}.{n}", key.to_hex()),
            };
            let to = aside.join(name);
            if to.exists() {
                continue;
            }
            return match fs::rename(&dir, &to) {
                Ok(()) => {
                    // Info, not warn: the caller reports the move (the drain's outcome, the
                    // command line's own line), and the corrupt record was warned about when
                    // it was found.
                    tracing::info!(key = %key.short(), from = %dir.display(), to = %to.display(), "moved a job folder with a corrupt record aside");
                    Ok(SetAside::Moved(to.display().to_string()))
                }
                // Moved by a process that does not take the lock (an older build) meanwhile.
                Err(e) if gone(&e) => Ok(SetAside::NotMoved(format!(
                    "{} was moved aside by another process",
                    dir.display()
                ))),
                Err(e) => Err(io_err(&dir)(e)),
            };
        }
        Err(StoreError::NotAStore {
            path: aside,
            reason: "a thousand folders set aside for this key in one second: expected fewer"
                .into(),
        })
    }

    fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError> {
        let Some((rec, entry)) = self.read_record(key)? else {
            return Ok(None);
        };
        if let Some(e) = entry {
            self.index.note(&[(*key, e)]);
        }
        Ok(Some(rec))
    }

    fn records(&self, keys: &[Hash]) -> Result<Vec<Option<JobRecord>>, StoreError> {
        // One directory listing instead of a failed open per missing key, when the keys are
        // many beside the folder (a first pass over a small store); index entries of the done
        // records read are noted in one append.
        let listed = if keys.len() >= 64 && worth_listing(&self.jobs, keys.len()) {
            Some(list_names(&self.jobs)?)
        } else {
            None
        };
        let mut seen = Vec::new();
        let out = keys
            .iter()
            .map(|k| {
                if listed.as_ref().is_some_and(|p| !p.contains(&k.to_hex())) {
                    return Ok(None);
                }
                Ok(self.read_record(k)?.map(|(rec, entry)| {
                    if let Some(e) = entry {
                        seen.push((*k, e));
                    }
                    rec
                }))
            })
            .collect::<Result<Vec<_>, StoreError>>();
        self.index.note(&seen);
        out
    }

    fn done_head(&self, key: &Hash) -> Result<Option<DoneHead>, StoreError> {
        // No path is built for a key the index does not know (a first pass asks for every run).
        // One key alone does not load the index (an isolated worker asks about its own run);
        // `done_heads` and `preload` do.
        let Some(entry) = self.index.get_loaded(key) else {
            return Ok(None);
        };
        let path = self.job_dir(key).join("record.json");
        DoneIndex::verify(entry, &path).map_err(io_err(&path))
    }

    fn preload(&self) {
        self.index.preload();
    }

    fn done_heads(&self, keys: &[Hash]) -> Vec<Result<Option<DoneHead>, StoreError>> {
        // One handle on `jobs/` per batch and each record opened relative to it: the kernel
        // walks two names per record instead of the whole root path (a third of a cache hit's
        // time). The handle is opened now, so a store folder moved away before this batch is
        // not read through it.
        let dir = open_dir(&self.jobs);
        keys.iter()
            .map(|key| {
                let Some(entry) = self.index.get(key) else {
                    return Ok(None);
                };
                let opened = match &dir {
                    Ok(d) => open_record_at(d, key),
                    Err(_) => File::open(self.job_dir(key).join("record.json")),
                };
                DoneIndex::verify_opened(entry, opened)
                    .map_err(|e| io_err(&self.job_dir(key).join("record.json"))(e))
            })
            .collect()
    }

    fn keys(&self) -> Result<Vec<Hash>, StoreError> {
        let mut out = BTreeSet::new();
        for e in fs::read_dir(&self.jobs).map_err(io_err(&self.jobs))? {
            let e = e.map_err(io_err(&self.jobs))?;
            if let Ok(k) = e.file_name().to_string_lossy().parse::<Hash>()
                && e.path().join("record.json").is_file()
            {
                out.insert(k);
            }
        }
        Ok(out.into_iter().collect())
    }

    fn lineage(&self, lineage: &Hash) -> Result<Option<Hash>, StoreError> {
        let path = self.lineage.join(lineage.to_hex());
        pointer::read(&path).map_err(|e| pointer_err(path, e))
    }

    fn set_lineage(&self, lineage: &Hash, key: &Hash) -> Result<(), StoreError> {
        let path = self.lineage.join(lineage.to_hex());
        pointer::write(&path, key).map_err(io_err(&path))
    }

    fn reuse(&self, pairs: &[(Hash, Hash)]) -> Result<(), StoreError> {
        // As `done_heads`: in a few chunks on threads of their own (a drain of cache hits reads
        // one pointer per hit).
        let check = |chunk: &[(Hash, Hash)]| -> Result<(), StoreError> {
            // One handle on `lineage/` per chunk, each pointer read relative to it (as
            // `done_heads` opens records): one name walked per hit instead of the root path.
            let dir = open_dir(&self.lineage);
            for (lineage, key) in chunk {
                let read = match &dir {
                    Ok(d) => self.lineage_at(d, lineage),
                    Err(_) => self.lineage(lineage),
                };
                let cur = match read {
                    Ok(cur) => cur,
                    // A pointer that names no key is replaced.
                    Err(StoreError::Corrupt { .. }) => None,
                    Err(e) => return Err(e),
                };
                if cur != Some(*key) {
                    self.set_lineage(lineage, key)?;
                }
            }
            Ok(())
        };
        const CHUNK: usize = 2048;
        if pairs.len() <= CHUNK {
            return check(pairs);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = pairs
                .chunks(pairs.len().div_ceil(4).max(CHUNK))
                .map(|c| s.spawn(move || check(c)))
                .collect();
            handles
                .into_iter()
                .try_for_each(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    fn lineages(&self, lineages: &[Hash]) -> Result<Vec<Option<Hash>>, StoreError> {
        if lineages.len() < 64 || !worth_listing(&self.lineage, lineages.len()) {
            return lineages.iter().map(|l| self.lineage(l)).collect();
        }
        let present = list_names(&self.lineage)?;
        lineages
            .iter()
            .map(|l| {
                if present.contains(&l.to_hex()) {
                    self.lineage(l)
                } else {
                    Ok(None)
                }
            })
            .collect()
    }

    fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
        self.claim_info_of(key)
    }

    fn claim(
        &self,
        key: &Hash,
        owner: &Owner,
        replace_done: Option<u32>,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_of(key, owner, replace_done)
    }

    fn start(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        self.write_unwritten(claim)?;
        self.holds_unless_new(claim)?;
        // A running record and the lineage pointer only matter while the attempt lives (after a
        // machine crash the attempt is interrupted either way), so they skip fsync; the done or
        // failed record of `finish` is fully durable.
        let dir = self.job_dir(&claim.key);
        self.write_running(&dir, claim.attempt, record)?;
        self.set_lineage(&record.lineage, &claim.key)
    }

    /// `true`: `start` writes the running record and the lineage pointer and touches no
    /// metrics file; `finish` checks the claim, not the running record.
    fn deferrable_start(&self) -> bool {
        true
    }

    fn metric_sink(&self, claim: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
        let path = self
            .job_dir(&claim.key)
            .join(format!("metrics.{}.tsv", claim.attempt));
        // The file is made with the first batch; one left by an earlier holder of this attempt
        // number (its running record lost to a machine crash, or deleted) is removed now, so
        // it never passes for this attempt's rows. Usually there is none: one failed `unlink`,
        // none at all in a folder this claim's `mkdir` made.
        if self
            .held(&claim.key, false)
            .is_some_and(|h| h.fresh && h.attempt == claim.attempt)
        {
            return Ok(Box::new(FsSink::new(path)));
        }
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(&path)(e)),
        }
        Ok(Box::new(FsSink::new(path)))
    }

    fn finish(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        self.commit_one(claim, record)
    }

    /// A group commit (see `commit.rs`): two flushes for the batch where `finish` costs two
    /// per run.
    fn finish_many(&self, done: &[(&Claim, &JobRecord)]) -> Vec<Result<(), StoreError>> {
        self.commit_many(done)
    }

    fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.release_of(claim)
    }

    fn heartbeat(&self, claim: &Claim) -> Result<(), StoreError> {
        self.heartbeat_of(claim)
    }

    /// A quarter of the stale interval, at most 10 s (see [`crate::store::heartbeat_for`]).
    fn heartbeat_interval(&self) -> Duration {
        crate::store::heartbeat_for(self.stale_after)
    }

    fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError> {
        match self.record(key)? {
            Some(rec) => self.record_metrics(&rec, name),
            None => Ok(Series::default()),
        }
    }

    fn record_metrics(&self, rec: &JobRecord, name: Option<&str>) -> Result<Series, StoreError> {
        let Some(info) = rec
            .metrics
            .as_ref()
            .filter(|_| rec.status != Status::Running)
        else {
            return Ok(Series::default());
        };
        // Every row is `name`'s when it is the only metric logged: read without the filter,
        // which reserves room for all the rows at once.
        let name = name.filter(|n| !(info.names.len() == 1 && info.names[0] == *n));
        if let Some(text) = &info.inline {
            let path = self.job_dir(&rec.key).join("record.json");
            let (series, _) = read_rows(&path, text.as_bytes(), Bound::Exactly(info.rows), name)?;
            return Ok(series);
        }
        if info.rows == 0 {
            // No row was ever written, so there may be no file (it is made with the first).
            return Ok(Series::default());
        }
        let path = self.job_dir(&rec.key).join(&info.file);
        if info.file.contains(['/', '\\']) || info.file.starts_with('.') {
            return Err(StoreError::Corrupt {
                path,
                reason: "metrics file name leaves the job folder".into(),
            });
        }
        let file = File::open(&path).map_err(io_err(&path))?;
        let reader = BufReader::with_capacity(1 << 16, file);
        let (series, _) = read_rows(&path, reader, Bound::Exactly(info.rows), name)?;
        Ok(series)
    }

    /// Itself: a job's files are in its folder.
    fn job_files(&self) -> Option<&dyn JobFiles> {
        Some(self)
    }
}

impl JobFiles for FsStore {
    /// `ROOT/jobs/KEY/error.txt`, written by a failed attempt's finish (a readable copy of what
    /// the record holds).
    fn failure_file(&self, key: &Hash) -> Option<PathBuf> {
        Some(self.job_dir(key).join("error.txt")).filter(|p| p.is_file())
    }

    /// `ROOT/jobs/KEY/artifacts`.
    fn artifact_path(&self, key: &Hash) -> PathBuf {
        self.job_dir(key).join("artifacts")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{INLINE_BYTES, MetricsInfo};
    use commit::KEEP_RUNNING_RECORD;
    use std::collections::HashSet;

    /// A claim whose owner is dead: of this process space, with pid 0, which never has a
    /// `/proc` entry.
    fn dead_owner() -> Owner {
        Owner {
            pid: 0,
            start_ticks: Some(1),
            nonce: "deadowner".into(),
            ..Owner::current()
        }
    }

    /// What a taker killed right after moving the dead owner's claim aside leaves: the tomb
    /// (`claim.stale.TOKEN`) and no claim. Returns the temp folder, store, key, job folder.
    fn tomb_of_a_dead_taker() -> (tempfile::TempDir, FsStore, Hash, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("job");
        let jd = store.job_dir(&key);
        fs::create_dir_all(&jd).unwrap();
        fs::write(jd.join("claim"), serde_json::to_vec(&dead_owner()).unwrap()).unwrap();
        fs::rename(jd.join("claim"), jd.join("claim.stale.deadtaker")).unwrap();
        (dir, store, key, jd)
    }

    #[test]
    fn a_taker_killed_mid_takeover_blocks_nobody_and_its_stale_holder_never_shares_an_attempt() {
        let (_dir, store, key, jd) = tomb_of_a_dead_taker();
        // The stale holder may have written attempt 1's rows before it stopped.
        fs::write(jd.join("metrics.1.tsv"), "loss\t0\t9\n").unwrap();
        let me = Owner::current();
        let ClaimOutcome::Claimed(c) = store.claim(&key, &me, None).unwrap() else {
            panic!("a tomb is no claim: the job is free at once");
        };
        assert_eq!(c.owner.nonce, me.nonce);
        assert_eq!(c.attempt, 2, "above every attempt whose files are there");
        assert_eq!(
            store.claim_info(&key).unwrap().unwrap().owner.nonce,
            me.nonce
        );
        let mut rec = crate::store::conformance::sample_record(key, Status::Done, c.attempt);
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        assert!(
            !jd.join("claim.stale.deadtaker").exists(),
            "the finish clears tombs"
        );
    }

    #[test]
    fn a_takeover_puts_back_a_claim_made_after_its_judgement_and_removes_nothing_by_name() {
        // P03: a stale claim judged, then (same second, same size) replaced by a live
        // claimer's before the taker moves it: the taker moves it, sees another file and puts
        // it back.
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("job");
        let jd = store.job_dir(&key);
        fs::create_dir_all(&jd).unwrap();
        let path = jd.join(CLAIM);
        fs::write(&path, serde_json::to_vec(&dead_owner()).unwrap()).unwrap();
        let judged = store.read_claim_file(&path).unwrap().unwrap();
        assert!(!store.judge(&path, &judged).live, "its owner is dead");
        let live = Owner {
            nonce: "livenonce".into(),
            ..dead_owner()
        };
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        fs::remove_file(&path).unwrap();
        fs::write(&path, serde_json::to_vec(&live).unwrap()).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let tomb = jd.join("claim.stale.mine");
        assert!(
            !crate::store::liveness::move_aside_if_unchanged(&path, &tomb, judged.beat).unwrap()
        );
        assert_eq!(read_owner(&path).unwrap().unwrap().nonce, "livenonce");
        assert!(!tomb.exists());
        // The file judged, unchanged: moved aside, and kept as it was.
        let judged = store.read_claim_file(&path).unwrap().unwrap();
        assert!(
            crate::store::liveness::move_aside_if_unchanged(&path, &tomb, judged.beat).unwrap()
        );
        assert!(!path.exists());
        assert_eq!(read_owner(&tomb).unwrap().unwrap().nonce, "livenonce");
        // Gone meanwhile: nothing to take over, nothing removed.
        assert!(
            !crate::store::liveness::move_aside_if_unchanged(&path, &tomb, judged.beat).unwrap()
        );
        assert!(tomb.exists());
    }

    /// A done record of `key` in a fresh store, through the whole claim protocol.
    fn done_store() -> (tempfile::TempDir, FsStore, Hash, JobRecord) {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("job");
        let ClaimOutcome::Claimed(c) = store.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("a new job is free");
        };
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, c.attempt);
        store.start(&c, &rec).unwrap();
        rec.status = Status::Done;
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        (dir, store, key, rec)
    }

    /// Inode numbers of the files of `dir`, by name.
    fn inodes(dir: &Path) -> std::collections::BTreeMap<String, u64> {
        use std::os::unix::fs::MetadataExt;
        fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().unwrap().ino())
            })
            .collect()
    }

    #[test]
    fn a_running_record_left_empty_by_a_machine_crash_reads_as_never_started() {
        // The running record is not synced: after a power loss its name may be there with no
        // bytes, or with zeroed blocks. That is an interrupted attempt, not a corrupt store.
        for torn in [&b""[..], &[0u8; 700][..]] {
            let dir = tempfile::tempdir().unwrap();
            let store = FsStore::create(dir.path().join("s")).unwrap();
            let key = Hash::of("job");
            let jd = store.job_dir(&key);
            fs::create_dir_all(&jd).unwrap();
            fs::write(jd.join("running.1.json"), torn).unwrap();
            fs::hard_link(jd.join("running.1.json"), jd.join("record.json")).unwrap();
            assert!(store.record(&key).unwrap().is_none());
            let ClaimOutcome::Claimed(c) = store.claim(&key, &Owner::current(), None).unwrap()
            else {
                panic!("an interrupted attempt can be claimed");
            };
            assert_eq!(c.attempt, 1);
            let mut rec = crate::store::conformance::sample_record(key, Status::Running, 1);
            store.start(&c, &rec).unwrap();
            assert_eq!(store.record(&key).unwrap().unwrap().status, Status::Running);
            rec.status = Status::Done;
            store.finish(&c, &rec).unwrap();
            assert_eq!(store.record(&key).unwrap().unwrap().status, Status::Done);
        }
        // Bytes that are not all zero are still an error that names the file.
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("job");
        fs::create_dir_all(store.job_dir(&key)).unwrap();
        fs::write(store.job_dir(&key).join("record.json"), b"{\"format\": 1, ").unwrap();
        let err = store.record(&key).unwrap_err().to_string();
        assert!(err.contains("record.json"), "{err}");
    }

    /// Ends attempt 1 of a fresh job `name` after `log` wrote its rows: its folder's file
    /// names, and what its record says of its metrics.
    fn sealed(
        store: &FsStore,
        name: &str,
        log: impl FnOnce(&mut dyn MetricSink),
    ) -> (Vec<String>, MetricsInfo) {
        let key = Hash::of(name);
        let ClaimOutcome::Claimed(c) = store.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("a new job is free");
        };
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, c.attempt);
        store.start(&c, &rec).unwrap();
        let mut sink = store.metric_sink(&c).unwrap();
        log(&mut *sink);
        let info = sink.seal().unwrap();
        assert_eq!(sink.seal().unwrap(), info, "a second seal returns the same");
        rec.set_metrics(info);
        rec.status = Status::Done;
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        let back = store.record(&key).unwrap().unwrap();
        assert_eq!(back, rec);
        // Rows in the record need format 2; a record without them stays readable by format 1.
        let format = if rec.metrics.as_ref().unwrap().inline.is_some() {
            crate::store::record::INLINE_FORMAT
        } else {
            crate::store::BASE_FORMAT
        };
        assert_eq!(back.format, format);
        let names = inodes(&store.job_dir(&key)).into_keys().collect();
        (names, back.metrics.unwrap())
    }

    #[test]
    fn a_short_run_keeps_its_rows_in_its_record_and_a_long_one_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let rows = |series: Series| series.of("loss");
        // A few rows, never flushed: no file, the rows in the record, read back by every path.
        let (names, info) = sealed(&store, "short", |s| {
            for step in 0..3 {
                s.append("loss", step, step as f64 / 3.0).unwrap();
            }
        });
        assert!(!names.iter().any(|n| n.starts_with("metrics")), "{names:?}");
        assert_eq!(info.file, "", "no file is named");
        assert_eq!(
            info.inline.as_deref(),
            Some("loss\t0\t0\nloss\t1\t0.3333333333333333\nloss\t2\t0.6666666666666666\n")
        );
        let want = vec![(0, 0.0), (1, 1.0 / 3.0), (2, 2.0 / 3.0)];
        let key = Hash::of("short");
        assert_eq!(rows(store.metrics(&key, None).unwrap()), want);
        let (attempt, torn) = store.attempt_metrics(&key, 1).unwrap();
        assert_eq!((rows(attempt), torn), (want, None));
        // A torn inline copy (a record edited by hand) is an error naming the record.
        let jd = store.job_dir(&key);
        let text = fs::read_to_string(jd.join("record.json")).unwrap();
        fs::write(jd.join("record.json"), text.replace("loss\\t2", "loss\\tx")).unwrap();
        let err = store.metrics(&key, None).unwrap_err().to_string();
        assert!(err.contains("record.json"), "{err}");

        // No rows: no file either, and none read.
        let (names, info) = sealed(&store, "empty", |_| {});
        assert!(!names.iter().any(|n| n.starts_with("metrics")), "{names:?}");
        assert_eq!((info.rows, info.inline.as_deref()), (0, Some("")));
        assert!(store.metrics(&Hash::of("empty"), None).unwrap().is_empty());

        // Rows past INLINE_BYTES, or flushed once (a step mark): in the fsynced file.
        let many = (INLINE_BYTES / 10) as i64;
        let (names, info) = sealed(&store, "long", |s| {
            for step in 0..many {
                s.append("loss", step, 0.5).unwrap();
            }
        });
        assert!(names.contains(&"metrics.1.tsv".to_string()), "{names:?}");
        assert_eq!((info.rows, info.inline), (many as u64, None));
        assert_eq!(
            store.metrics(&Hash::of("long"), None).unwrap().len(),
            many as usize
        );
        let (names, info) = sealed(&store, "marked", |s| {
            s.append("loss", 0, 1.0).unwrap();
            s.flush().unwrap();
            s.append("loss", 1, 2.0).unwrap();
        });
        assert!(names.contains(&"metrics.1.tsv".to_string()), "{names:?}");
        assert_eq!((info.rows, info.inline), (2, None));
        assert_eq!(
            rows(store.metrics(&Hash::of("marked"), None).unwrap()),
            vec![(0, 1.0), (1, 2.0)]
        );
    }

    #[test]
    fn a_metrics_file_left_by_an_earlier_holder_of_the_attempt_number_never_passes_for_its_rows() {
        // Attempt 1 ran, flushed rows, and its running record was lost (a machine crash, or
        // deleted by hand): the next claim is attempt 1 again, and its rows are its own.
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("again");
        fs::create_dir_all(store.job_dir(&key)).unwrap();
        let stale = store.job_dir(&key).join("metrics.1.tsv");
        fs::write(&stale, "loss\t0\t99\nloss\t1\t98\n").unwrap();
        // Its claim was released (a folder without any claim is a new claimer's, see `Holder`:
        // its takeover starts at attempt 2 and never meets attempt 1's files).
        fs::write(store.job_dir(&key).join(RELEASED), b"{}").unwrap();
        let (names, info) = sealed(&store, "again", |s| s.append("loss", 0, 0.5).unwrap());
        assert!(!names.contains(&"metrics.1.tsv".to_string()), "{names:?}");
        assert_eq!(info.inline.as_deref(), Some("loss\t0\t0.5\n"));
        let want = vec![(0, 0.5)];
        assert_eq!(store.metrics(&key, None).unwrap().of("loss"), want);
        let (attempt, _) = store.attempt_metrics(&key, 1).unwrap();
        assert_eq!(attempt.of("loss"), want);
    }

    /// Replaces `key`'s claim file with one of another (live-looking) owner, as a taker on
    /// another host would after judging it stale.
    fn steal(store: &FsStore, key: &Hash) {
        let thief = Owner {
            host: "elsewhere".into(),
            pid: 1,
            start_ticks: None,
            nonce: "thief".into(),
            boot_id: None,
            pidns: None,
        };
        let path = store.claim_path(key);
        // An unwritten claim has no file to remove.
        let _ = fs::remove_file(&path);
        fs::write(&path, serde_json::to_vec(&thief).unwrap()).unwrap();
    }

    #[test]
    fn a_lost_claim_fails_start_past_the_trust_window_and_finish_always() {
        let dir = tempfile::tempdir().unwrap();
        // Trusted for min(1 s, stale_after / 2) = 10 ms after it was made.
        let store = FsStore::create(dir.path().join("s"))
            .unwrap()
            .with_stale_after(Duration::from_millis(20));
        let me = Owner::current();
        let key = Hash::of("old");
        let ClaimOutcome::Claimed(c) = store.claim(&key, &me, None).unwrap() else {
            panic!("a new job is free");
        };
        std::thread::sleep(Duration::from_millis(40));
        steal(&store, &key);
        let rec = crate::store::conformance::sample_record(key, Status::Running, c.attempt);
        assert!(
            matches!(store.start(&c, &rec), Err(StoreError::ClaimLost { .. })),
            "a claim older than the trust window is read back at start"
        );
        assert!(store.record(&key).unwrap().is_none(), "nothing was started");
        // A claim made a moment ago starts without a read, but its finish always checks: a
        // fresh folder skips probes, never the holder check.
        let key2 = Hash::of("new");
        let ClaimOutcome::Claimed(c2) = store.claim(&key2, &me, None).unwrap() else {
            panic!("a new job is free");
        };
        let mut rec2 = crate::store::conformance::sample_record(key2, Status::Running, 1);
        store.start(&c2, &rec2).unwrap();
        steal(&store, &key2);
        rec2.status = Status::Done;
        assert!(matches!(
            store.finish(&c2, &rec2),
            Err(StoreError::ClaimLost { .. })
        ));
        assert_eq!(
            store.record(&key2).unwrap().unwrap().status,
            Status::Running,
            "a lost claim never commits a done record"
        );
    }

    #[test]
    fn a_claim_in_a_folder_that_existed_clears_tombs_and_the_handle_forgets_its_claims() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let me = Owner::current();
        // A tomb left by a taker that finished its takeover and died before its finish.
        let key = Hash::of("tomb");
        let jd = store.job_dir(&key);
        fs::create_dir_all(&jd).unwrap();
        fs::write(jd.join("claim.stale.gone"), b"{}").unwrap();
        let ClaimOutcome::Claimed(c) = store.claim(&key, &me, None).unwrap() else {
            panic!("no claim holds the job");
        };
        assert!(
            !store.held(&key, false).unwrap().fresh,
            "the folder existed"
        );
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, c.attempt);
        store.start(&c, &rec).unwrap();
        rec.status = Status::Done;
        store.finish(&c, &rec).unwrap();
        assert!(!jd.join("claim.stale.gone").exists(), "the tomb is cleared");
        // Fresh folders, finished and released: nothing stays in the handle's memory.
        for (i, release) in [(0, false), (1, true)] {
            let k = Hash::of(format!("k{i}"));
            let ClaimOutcome::Claimed(c) = store.claim(&k, &me, None).unwrap() else {
                panic!("a new job is free");
            };
            assert!(store.held(&k, false).unwrap().fresh);
            if release {
                store.release(&c).unwrap();
            } else {
                let mut r = crate::store::conformance::sample_record(k, Status::Running, 1);
                store.start(&c, &r).unwrap();
                r.status = Status::Done;
                store.finish(&c, &r).unwrap();
            }
        }
        assert_eq!(store.held.lock().unwrap().len(), 0);
    }

    #[test]
    fn a_first_attempt_frees_no_inode() {
        // Every inode created for a run is still linked once it is done: the claim as
        // `claim.released`, the running record as `running.1.json` (see `RELEASED`).
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("job");
        let ClaimOutcome::Claimed(c) = store.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("a new job is free");
        };
        let jd = store.job_dir(&key);
        assert!(
            !inodes(&jd).contains_key("claim"),
            "a new folder's claim is its mkdir"
        );
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, c.attempt);
        store.start(&c, &rec).unwrap();
        let as_started = rec.clone();
        let started = inodes(&jd);
        let claim_ino = started["claim"];
        assert_eq!(started["record.json"], started["running.1.json"]);
        assert_eq!(store.record(&key).unwrap().unwrap().status, Status::Running);
        let running_ino = started["running.1.json"];
        let mut sink = store.metric_sink(&c).unwrap();
        sink.append("loss", 0, 1.0).unwrap();
        sink.sync().unwrap();
        rec.status = Status::Done;
        rec.metrics = Some(sink.summary());
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        let done = inodes(&jd);
        let names: Vec<&str> = done.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "claim.released",
                "metrics.1.tsv",
                "record.json",
                "running.1.json"
            ]
        );
        assert_eq!(done["claim.released"], claim_ino);
        assert_eq!(done["running.1.json"], running_ino);
        assert_ne!(done["record.json"], running_ino);
        assert_eq!(
            serde_json::from_slice::<JobRecord>(&fs::read(jd.join("running.1.json")).unwrap())
                .unwrap(),
            as_started,
            "a small running record is kept as it started"
        );
        assert_eq!(store.record(&key).unwrap().unwrap().status, Status::Done);
        assert!(
            store.claim_info(&key).unwrap().is_none(),
            "the claim is released"
        );
        // The next attempt (a forced rerun) claims again and keeps its own running record.
        let ClaimOutcome::Claimed(c2) = store.claim(&key, &Owner::current(), Some(1)).unwrap()
        else {
            panic!("a done attempt can be replaced");
        };
        assert_eq!(c2.attempt, 2);
        let rec2 = crate::store::conformance::sample_record(key, Status::Running, 2);
        store.start(&c2, &rec2).unwrap();
        let again = inodes(&jd);
        assert_eq!(again["record.json"], again["running.2.json"]);
        assert_eq!(store.record(&key).unwrap().unwrap().attempt, 2);
    }

    #[test]
    fn a_group_commit_leaves_each_folder_as_finish_does() {
        // `finish_many` (two flushes for the batch) leaves what `finish` leaves per run: the
        // record in place, the claim released, no temp file, the done index noted.
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let mut done = Vec::new();
        for i in 0..5 {
            let key = Hash::of(format!("group-{i}"));
            let c = crate::store::conformance::claimed(&store, &key, &Owner::current());
            let mut rec = crate::store::conformance::sample_record(key, Status::Running, 1);
            store.start(&c, &rec).unwrap();
            rec.status = Status::Done;
            rec.finished_at = Some(2.0);
            done.push((c, rec));
        }
        let pairs: Vec<_> = done.iter().map(|(c, r)| (c, r)).collect();
        for r in store.finish_many(&pairs) {
            r.unwrap();
        }
        for (c, rec) in &done {
            let jd = store.job_dir(&c.key);
            let names: Vec<String> = inodes(&jd).into_keys().collect();
            assert_eq!(names, ["claim.released", "record.json", "running.1.json"]);
            assert_eq!(&store.record(&c.key).unwrap().unwrap(), rec);
        }
        let keys: Vec<Hash> = done.iter().map(|(c, _)| c.key).collect();
        let again = FsStore::create(store.root()).unwrap();
        for h in again.done_heads(&keys) {
            assert_eq!(h.unwrap().map(|h| h.attempt), Some(1), "indexed and proved");
        }
    }

    #[test]
    fn a_large_running_record_is_emptied_when_its_attempt_ends() {
        // Over `KEEP_RUNNING_RECORD` (a large owned digest): the copy goes, the inode stays.
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let key = Hash::of("big");
        let c = crate::store::conformance::claimed(&store, &key, &Owner::current());
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, 1);
        for i in 0..2000 {
            rec.owned
                .files
                .insert(format!("src/module_{i:05}.rs"), Hash::of(format!("{i}")));
        }
        store.start(&c, &rec).unwrap();
        let jd = store.job_dir(&key);
        let ino = inodes(&jd)["running.1.json"];
        let started = fs::metadata(jd.join("running.1.json")).unwrap().len();
        assert!(started > KEEP_RUNNING_RECORD as u64, "{started} bytes");
        rec.status = Status::Done;
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        assert_eq!(fs::metadata(jd.join("running.1.json")).unwrap().len(), 0);
        assert_eq!(inodes(&jd)["running.1.json"], ino, "its inode stays linked");
        assert_eq!(store.record(&key).unwrap().unwrap(), rec);
    }

    #[test]
    fn a_done_head_is_proved_by_the_records_bytes() {
        let (_dir, store, key, rec) = done_store();
        let head = store
            .done_heads(&[key])
            .remove(0)
            .unwrap()
            .expect("finish indexes a done record");
        assert_eq!(head.attempt, 1);
        assert_eq!(head.witnesses, DoneHead::witnesses_digest(&rec.witnesses));
        // A fresh handle loads the index from its file when asked in a batch (or preloaded);
        // one key alone reads the record instead. Loaded, both ways agree.
        let again = FsStore::create(store.root()).unwrap();
        assert_eq!(
            again.done_head(&key).unwrap(),
            None,
            "one key does not load it"
        );
        assert_eq!(again.done_heads(&[key]).remove(0).unwrap(), Some(head));
        assert_eq!(again.done_head(&key).unwrap(), Some(head));
        let preloaded = FsStore::create(store.root()).unwrap();
        preloaded.preload();
        let t = std::time::Instant::now();
        while preloaded.done_head(&key).unwrap().is_none() {
            assert!(t.elapsed().as_secs() < 10, "preload never loaded the index");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(preloaded.done_head(&key).unwrap(), Some(head));

        // An edit of the same length behind the index (attempt 1 -> 7): not proved any more,
        // and the record read from the folder tells the truth.
        let path = store.job_dir(&key).join("record.json");
        let text = fs::read_to_string(&path).unwrap();
        let edited = text.replace("\"attempt\": 1,", "\"attempt\": 7,");
        assert_eq!(edited.len(), text.len());
        assert_ne!(edited, text);
        fs::write(&path, &edited).unwrap();
        assert_eq!(again.done_heads(&[key]).remove(0).unwrap(), None);
        assert_eq!(again.record(&key).unwrap().unwrap().attempt, 7);
        // Reading it re-indexed it: the new head is proved.
        assert_eq!(
            again.done_heads(&[key]).remove(0).unwrap().unwrap().attempt,
            7
        );

        // A record that is no longer done, or gone, has no head.
        fs::write(
            &path,
            text.replace("\"status\": \"done\"", "\"status\": \"failed\""),
        )
        .unwrap();
        assert_eq!(again.done_heads(&[key]).remove(0).unwrap(), None);
        assert_eq!(again.record(&key).unwrap().unwrap().status, Status::Failed);
        fs::remove_file(&path).unwrap();
        assert_eq!(again.done_heads(&[key]).remove(0).unwrap(), None);
        assert_eq!(
            FsStore::create(store.root())
                .unwrap()
                .done_heads(&[key])
                .remove(0)
                .unwrap(),
            None
        );
    }

    #[test]
    fn a_lost_or_torn_index_is_rebuilt_from_the_records() {
        let (_dir, store, key, _rec) = done_store();
        let idx = store.root().join(INDEX_FILE);
        let line = fs::read_to_string(&idx).unwrap();
        assert_eq!(line.lines().count(), 1);

        // Torn mid-line by a crash: ignored, and the file is rewritten without the fragment.
        fs::write(&idx, &line[..line.len() / 2]).unwrap();
        let s = FsStore::create(store.root()).unwrap();
        assert_eq!(s.done_heads(&[key]).remove(0).unwrap(), None);
        assert_eq!(fs::read_to_string(&idx).unwrap(), "");
        // Reading the record rebuilds the entry.
        assert_eq!(s.record(&key).unwrap().unwrap().status, Status::Done);
        assert_eq!(fs::read_to_string(&idx).unwrap(), line);

        // Lost: the same.
        fs::remove_file(&idx).unwrap();
        let s = FsStore::create(store.root()).unwrap();
        assert_eq!(s.done_heads(&[key]).remove(0).unwrap(), None);
        assert_eq!(s.records(&[key]).unwrap()[0].as_ref().unwrap().attempt, 1);
        assert_eq!(s.done_heads(&[key]).remove(0).unwrap().unwrap().attempt, 1);
        assert_eq!(fs::read_to_string(&idx).unwrap(), line);

        // Damaged (one digit changed): ignored.
        let damaged = line.replacen(&format!("{key} 1 "), &format!("{key} 2 "), 1);
        assert_ne!(damaged, line);
        fs::write(&idx, &damaged).unwrap();
        let s = FsStore::create(store.root()).unwrap();
        assert_eq!(
            s.done_heads(&[key]).remove(0).unwrap(),
            None,
            "a damaged line is not trusted"
        );

        // Stale: an intact entry for another version of the record (same length, other bytes).
        let len = fs::metadata(store.job_dir(&key).join("record.json"))
            .unwrap()
            .len();
        let e = s.done_heads(&[key]).remove(0).unwrap();
        assert_eq!(e, None);
        let stale = Entry {
            attempt: 2,
            witnesses: Hash::of("w"),
            lineage: Hash::of("l"),
            record: Hash::of("another version"),
            len,
        };
        fs::write(&idx, stale.line(&key)).unwrap();
        let s = FsStore::create(store.root()).unwrap();
        assert_eq!(
            s.done_heads(&[key]).remove(0).unwrap(),
            None,
            "a stale entry is not trusted"
        );
        assert_eq!(s.record(&key).unwrap().unwrap().attempt, 1);
        assert_eq!(s.done_heads(&[key]).remove(0).unwrap().unwrap().attempt, 1);
    }

    /// Two handles on one store, as two processes have.
    fn two_handles(stale_after: Duration) -> (tempfile::TempDir, FsStore, FsStore) {
        let dir = tempfile::tempdir().unwrap();
        let a = FsStore::create(dir.path().join("s"))
            .unwrap()
            .with_stale_after(stale_after);
        let b = FsStore::create(dir.path().join("s"))
            .unwrap()
            .with_stale_after(stale_after);
        (dir, a, b)
    }

    #[test]
    fn a_new_folder_is_claimed_by_its_mkdir_until_the_claim_file_names_the_holder() {
        let (_dir, a, b) = two_handles(DEFAULT_STALE_AFTER);
        let (me, other) = (Owner::current(), Owner::current());
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&a, &key, &me);
        let file = a.claim_path(&key);
        assert!(!file.exists(), "no claim file yet");
        // The holder's handle knows its holder; another process sees a folder just made.
        assert_eq!(a.claim_info(&key).unwrap().unwrap().owner.nonce, me.nonce);
        match a.claim(&key, &other, None).unwrap() {
            ClaimOutcome::Busy(o) => assert_eq!(o.nonce, me.nonce),
            x => panic!("held: {x:?}"),
        }
        let info = b.claim_info(&key).unwrap().unwrap();
        assert!(info.live, "a folder made a moment ago is held");
        assert_eq!(info.owner.nonce, "unwritten");
        assert_eq!(
            info.owner.to_string(),
            "a holder that has not written its claim yet"
        );
        assert!(matches!(
            b.claim(&key, &other, None).unwrap(),
            ClaimOutcome::Busy(_)
        ));
        // The start writes the claim file: everyone sees the holder.
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, 1);
        a.start(&c, &rec).unwrap();
        assert_eq!(read_owner(&file).unwrap().unwrap().nonce, me.nonce);
        assert_eq!(b.claim_info(&key).unwrap().unwrap().owner.nonce, me.nonce);
        rec.status = Status::Done;
        a.finish(&c, &rec).unwrap();
        assert!(b.claim_info(&key).unwrap().is_none());
        assert!(matches!(
            b.claim(&key, &other, None).unwrap(),
            ClaimOutcome::Done(_)
        ));
        // A run that ends before its start is written never writes a claim file.
        let k2 = Hash::of("short");
        let c2 = crate::store::conformance::claimed(&a, &k2, &me);
        let mut r2 = crate::store::conformance::sample_record(k2, Status::Done, 1);
        r2.finished_at = Some(1.0);
        a.finish(&c2, &r2).unwrap();
        let names = list_names(&a.job_dir(&k2)).unwrap();
        assert_eq!(names, HashSet::from(["record.json".to_string()]));
        assert!(b.claim_info(&k2).unwrap().is_none());
    }

    #[test]
    fn a_folder_whose_claimer_died_before_writing_its_claim_is_taken_over_after_the_grace() {
        // `a` lives, so its folder is held for the stale interval: 30 ms here.
        let (_dir, a, b) = two_handles(Duration::from_millis(30));
        let (me, other) = (Owner::current(), Owner::current());
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&a, &key, &me);
        assert!(matches!(
            b.claim(&key, &other, None).unwrap(),
            ClaimOutcome::Busy(_)
        ));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!b.claim_info(&key).unwrap().unwrap().live);
        let ClaimOutcome::Claimed(t) = b.claim(&key, &other, None).unwrap() else {
            panic!("a folder past its grace is taken over");
        };
        assert_eq!(
            t.attempt, 2,
            "the first holder may still write attempt 1's files"
        );
        // The first holder was only slow: its start and its finish find the claim lost.
        let mut rec = crate::store::conformance::sample_record(key, Status::Running, 1);
        assert!(matches!(
            a.start(&c, &rec),
            Err(StoreError::ClaimLost { .. })
        ));
        rec.status = Status::Done;
        assert!(matches!(
            a.finish(&c, &rec),
            Err(StoreError::ClaimLost { .. })
        ));
        assert!(
            a.record(&key).unwrap().is_none(),
            "a lost claim commits nothing"
        );
        let mut rec = crate::store::conformance::sample_record(key, Status::Done, 2);
        rec.finished_at = Some(1.0);
        b.finish(&t, &rec).unwrap();
        assert_eq!(a.record(&key).unwrap().unwrap(), rec);
    }

    #[test]
    fn a_slow_holder_finds_a_takeover_that_already_finished_and_leaves_its_record_alone() {
        let (_dir, a, b) = two_handles(Duration::from_millis(30));
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&a, &key, &Owner::current());
        // `b` times the folder from the moment it first sees it, on its own clock.
        assert!(b.claim_info(&key).unwrap().unwrap().live, "first sight");
        std::thread::sleep(Duration::from_millis(60));
        let ClaimOutcome::Claimed(t) = b.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("taken over");
        };
        let mut done = crate::store::conformance::sample_record(key, Status::Done, t.attempt);
        done.finished_at = Some(1.0);
        b.finish(&t, &done).unwrap();
        // The taker released its claim: no claim file is left, and the slow holder's start,
        // or its finish, would find none. Both find the taker's traces instead.
        let rec = crate::store::conformance::sample_record(key, Status::Running, 1);
        assert!(matches!(
            a.start(&c, &rec),
            Err(StoreError::ClaimLost { .. })
        ));
        assert_eq!(
            a.record(&key).unwrap().unwrap(),
            done,
            "the taker's record stays"
        );
        assert!(
            a.claim_info(&key).unwrap().is_none(),
            "no claim is left behind"
        );
        assert!(a.held(&key, false).is_none(), "the lost claim is forgotten");
        let mut late = rec.clone();
        late.status = Status::Done;
        assert!(matches!(
            a.finish(&c, &late),
            Err(StoreError::ClaimLost { .. })
        ));
        assert_eq!(a.record(&key).unwrap().unwrap(), done);
    }

    #[test]
    fn a_folder_left_by_a_killed_drain_on_this_host_is_taken_over_at_once() {
        let (_dir, a, b) = two_handles(DEFAULT_STALE_AFTER);
        let key = Hash::of("job");
        let _ = crate::store::conformance::claimed(&a, &key, &Owner::current());
        // `a` lives: its folder is held.
        assert!(matches!(
            b.claim(&key, &Owner::current(), None).unwrap(),
            ClaimOutcome::Busy(_)
        ));
        // As if `a`'s process had been killed: its entry names a dead process.
        let entry = a.holder.entry().clone().expect("registered");
        fs::write(&entry, serde_json::to_vec(&dead_owner()).unwrap()).unwrap();
        let ClaimOutcome::Claimed(t) = b.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("the folder of a dead holder is free at once");
        };
        assert_eq!(t.attempt, 2);
        assert!(!entry.exists(), "a dead holder's entry is removed");
    }

    #[test]
    fn an_unwritten_claim_released_frees_its_folder_at_once() {
        let (_dir, a, b) = two_handles(DEFAULT_STALE_AFTER);
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&a, &key, &Owner::current());
        a.release(&c).unwrap();
        assert!(a.held(&key, false).is_none());
        assert!(b.claim_info(&key).unwrap().is_none());
        let ClaimOutcome::Claimed(again) = b.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("a released folder is free");
        };
        assert_eq!(again.attempt, 1);
    }

    #[test]
    fn a_store_told_to_write_claim_files_at_once_does_and_registers_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s"))
            .unwrap()
            .with_claim_files_at_once();
        let me = Owner::current();
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&store, &key, &me);
        assert_eq!(
            read_owner(&store.claim_path(&key)).unwrap().unwrap().nonce,
            me.nonce
        );
        assert!(!dir.path().join("s").join(HOLDERS).exists());
        let mut rec = crate::store::conformance::sample_record(key, Status::Done, c.attempt);
        rec.finished_at = Some(1.0);
        store.finish(&c, &rec).unwrap();
        let names = list_names(&store.job_dir(&key)).unwrap();
        assert_eq!(
            names,
            HashSet::from(["record.json".to_string(), RELEASED.to_string()])
        );
    }
}
