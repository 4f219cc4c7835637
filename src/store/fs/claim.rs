//! [`FsStore`]'s claims: who holds a job folder, how others judge the holder, and how a stale
//! claim is taken over (`docs/design.md`, "Store"; P01, P03, P04 in `docs/evidence.md`).
//!
//! A job is claimed by creating `jobs/KEY/claim` exclusively (`O_EXCL`), or, for a folder the
//! claimer's own `mkdir` made, by that `mkdir` until the claim file is written (see
//! [`Holder`]). Who may judge whom (CONTRIBUTING.md "Store" has the table):
//!
//! - a claim of this process ([`Liveness::Ours`]) is live;
//! - a claim whose owner is proved dead ([`Liveness::Dead`]: same host, boot and PID namespace
//!   as the judge, and its pid gone or started at another time) is taken over at once;
//! - every other claim, and a claim file that cannot be read, is stale only once this handle
//!   has seen its heartbeat (the file's inode, mtime and bytes) unchanged for the store's stale
//!   interval, timed on this process's monotonic clock
//!   ([`HeartbeatWatch`](crate::store::liveness::HeartbeatWatch)).
//!
//! A takeover renames the stale claim aside to a name of its own (`claim.stale.TOKEN`, atomic),
//! checks that what it moved is the very file it judged (inode, mtime, bytes) and puts it back
//! otherwise, then creates its own claim exclusively and reads it back. Nothing is removed by
//! name after a check. `ENOENT` and `ESTALE` while reading a claim or a holder mean "gone":
//! the claimer looks again. A `mkdir` of a job folder that fails with `EACCES` while the folder
//! exists (Lustre under contention) means "claimed by another", as `EEXIST` does.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::{FsStore, io_err, list_names};
use crate::identity::Hash;
use crate::store::liveness::{
    Beat, Liveness, move_aside_if_unchanged, read_beat, unchanged_phrase, unique_token,
};
use crate::store::{Claim, ClaimInfo, ClaimOutcome, JobRecord, Owner, Status, Store, StoreError};

/// The claim file of a job folder.
pub(super) const CLAIM: &str = "claim";
/// Where a released claim goes. A run frees no inode: the claim is renamed here instead of
/// removed, and the running record keeps its own name (`running.N.json`) when the done record
/// replaces it as `record.json`. On ext4 without a journal, every inode freed in the last
/// minutes (one, up to five while its inode-table block is dirty) is skipped, one by one, by
/// every later file creation in its block group (`recently_deleted()` in `fs/ext4/ialloc.c`):
/// two frees per run made every file creation, of this run's and of everyone else's, slower
/// the more runs had finished. Measured here: creations cost 30 us before 20k frees and 530 us
/// right after.
pub(super) const RELEASED: &str = "claim.released";
/// The folder of the handles that may hold unwritten claims (see [`Holder`]).
pub(super) const HOLDERS: &str = "holders";
/// Where a takeover moves a stale claim: `claim.stale.TOKEN`, a name no one else uses.
pub(super) const TOMB: &str = "claim.stale.";
/// How long after its creation a claim is trusted without reading it back in `start`: far
/// below any heartbeat or stale interval, so no other process can have taken it over yet.
const TRUST_NEW_CLAIM: Duration = Duration::from_secs(1);
/// Reads that answer `ESTALE` (an NFS file replaced behind its handle) are tried this often.
const STALE_HANDLE_TRIES: usize = 3;

/// A handle's entry in `ROOT/holders/`, which makes its unwritten claims judgeable.
///
/// A job folder with no claim file, no released claim, no takeover tomb and no record is one a
/// claimer's `mkdir` made: that `mkdir` is the claim until the claim file is written, by
/// [`Store::start`] (a drain's committers write it while the run executes), the first
/// heartbeat, or the finish of a run older than a second; or never, for a run that ends first:
/// a first pass of short runs makes no claim file at all. Such a folder names no owner, so
/// every handle writes `holders/NONCE.json` (its owner: host, boot id, PID namespace, pid,
/// process start time) before its first such claim, and removes it when its last clone is
/// dropped. Another claimer judges such a folder free at once when every registered handle
/// other than its own is proved dead (see [`Owner::liveness`]: a drain killed on this host, in
/// this PID namespace), and otherwise held until it has seen the folder unchanged for the
/// store's stale interval: a live holder writes its claim file at its first heartbeat, well
/// before. Entries of dead handles are removed by whoever proves them dead; entries of handles
/// that cannot be judged from here (another host or PID namespace) stay, and only make such
/// folders wait for the stale interval.
///
/// A live holder that is judged dead (its claim unwritten for a whole stale interval: a stopped
/// process) loses the job: a takeover gets attempt 2 or later, so its files never mix with the
/// first holder's attempt 1, and the first holder's start, heartbeat or finish finds the
/// taker's traces (a claim, a released claim, a tomb, a record or a running record) when it
/// writes its claim, and fails with `ClaimLost`.
#[derive(Debug)]
pub(super) struct Holder {
    /// `ROOT/holders`.
    pub(super) dir: PathBuf,
    /// `ROOT/holders/NONCE.json` once written (with the first unwritten claim: a handle that
    /// never takes one, a reader or an isolated worker, pays nothing).
    pub(super) entry: Mutex<Option<PathBuf>>,
    /// Serializes the writes of unwritten claims (a start and a heartbeat of one run).
    pub(super) writing: Mutex<()>,
}

impl Holder {
    pub(super) fn new(root: &Path) -> Self {
        Self {
            dir: root.join(HOLDERS),
            entry: Mutex::new(None),
            writing: Mutex::new(()),
        }
    }

    pub(super) fn entry(&self) -> std::sync::MutexGuard<'_, Option<PathBuf>> {
        self.entry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(path) = self.entry.get_mut().unwrap_or_else(|e| e.into_inner()) {
            // Our own entry: its name (our nonce) is ours alone.
            let _ = fs::remove_file(path);
        }
    }
}

/// What a handle remembers of a claim it took, to skip probes whose answer it knows.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// When the claim file (or the job folder of an unwritten claim) was made, at the latest.
    pub(super) at: Instant,
    /// The attempt it runs (a `Claim` of another attempt is not this one).
    pub(super) attempt: u32,
    /// The claim was taken in a job folder this claim's own `mkdir` made, with no record in it
    /// after the claim: nothing else can be in that folder (another process would need the
    /// claim first), so `metric_sink` and `finish` skip their probes for an old metrics file
    /// and for takeover tombs.
    pub(super) fresh: bool,
    /// The claim is the job folder's `mkdir` and its file is not written yet (see
    /// [`Holder`]): the owner it will name.
    pub(super) unwritten: Option<Arc<Owner>>,
}

/// A claim file as read: its owner (`None`: empty or not an owner) and what its heartbeat
/// looks like.
#[derive(Debug, Clone)]
pub(super) struct ClaimFile {
    pub(super) owner: Option<Owner>,
    /// Why `owner` is `None`: `empty`, or the parse error.
    pub(super) unreadable: Option<String>,
    pub(super) beat: Beat,
}

/// How a takeover ended.
enum Takeover {
    /// The judged claim is out of the way: create ours.
    Moved,
    /// What was there is not what was judged (a new claim, a heartbeat): leave it.
    Changed,
}

/// Operations a test can make fail (`FsStore::with_fault_hook`, feature `test-util`; exported
/// as `FaultOp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
// Public for the fault hook only (feature `test-util`, as `store::FaultOp`).
#[cfg_attr(not(any(test, feature = "test-util")), allow(unreachable_pub))]
pub enum FsOp {
    /// `mkdir` of a job folder (a claim).
    MakeJobFolder,
    /// Opening or reading a claim file (`claim`, or a takeover's tomb).
    ReadClaim,
    /// Listing `holders/`.
    ListHolders,
    /// Opening or reading an entry of `holders/`.
    ReadHolder,
    /// Listing a job folder to judge a claim its `mkdir` made.
    ListJobFolder,
    /// Each try to take `ROOT/corrupt/repair.lock` in `Store::set_aside` (called before the
    /// `O_EXCL` create, with the lock's path): a test repairs or breaks a record there.
    RepairLock,
}

/// A test's fault hook: called with the operation, its path and the error it got (`None`: it
/// succeeded); returns the error to answer instead, if any.
#[cfg(any(test, feature = "test-util"))]
pub type FaultHook =
    Arc<dyn Fn(FsOp, &Path, Option<&io::Error>) -> Option<io::Error> + Send + Sync>;

/// A [`FaultHook`] a handle holds.
#[cfg(any(test, feature = "test-util"))]
#[derive(Clone)]
pub(super) struct Faults(pub(super) FaultHook);

#[cfg(any(test, feature = "test-util"))]
impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Faults(..)")
    }
}

pub(super) use crate::store::liveness::is_gone as gone;

/// Keeps `[A-Za-z0-9_-]`, at most 64 characters: for a nonce in a file name.
pub(super) fn sanitize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect()
}

/// The sentinel owner of a claim that names nobody: `unwritten` (a folder its claimer's `mkdir`
/// made, or an empty claim file) or `unreadable` (bytes that are not an owner).
fn nobody(what: &str) -> Owner {
    Owner {
        host: "unknown".into(),
        pid: 0,
        start_ticks: None,
        nonce: what.into(),
        boot_id: None,
        pidns: None,
    }
}

impl FsStore {
    /// Answers `r` for operation `op` on `path`, or what the test's fault hook says instead.
    #[inline]
    pub(super) fn inject<T>(&self, op: FsOp, path: &Path, r: io::Result<T>) -> io::Result<T> {
        #[cfg(any(test, feature = "test-util"))]
        if let Some(Faults(hook)) = &self.faults {
            let injected = match &r {
                Ok(_) => hook(op, path, None),
                Err(e) => hook(op, path, Some(e)),
            };
            if let Some(e) = injected {
                return Err(e);
            }
        }
        #[cfg(not(any(test, feature = "test-util")))]
        let _ = (op, path);
        r
    }

    /// Runs `read` (operation `op` on `path`) again while it answers `ESTALE`, at most
    /// [`STALE_HANDLE_TRIES`] times: on NFS a handle whose file was unlinked or replaced answers
    /// `ESTALE`, and a new lookup of the name finds the file that is there now, or none.
    pub(super) fn read_fresh<T>(
        &self,
        op: FsOp,
        path: &Path,
        read: impl Fn() -> io::Result<T>,
    ) -> io::Result<T> {
        let mut tries = 1;
        loop {
            match self.inject(op, path, read()) {
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) && tries < STALE_HANDLE_TRIES => {
                    tries += 1
                }
                r => return r,
            }
        }
    }

    pub(super) fn claim_path(&self, key: &Hash) -> PathBuf {
        self.job_dir(key).join(CLAIM)
    }

    /// Reads the claim file at `path` with what its heartbeat looks like (see [`read_beat`]):
    /// `None` when it is gone (`ENOENT`, or `ESTALE` that a new lookup does not cure).
    pub(super) fn read_claim_file(&self, path: &Path) -> Result<Option<ClaimFile>, StoreError> {
        let (beat, bytes) = match self.read_fresh(FsOp::ReadClaim, path, || read_beat(path)) {
            Ok(v) => v,
            // Gone, or a handle that stays stale: no claim to judge now; the caller looks again.
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(io_err(path)(e)),
        };
        if bytes.is_empty() {
            return Ok(Some(ClaimFile {
                owner: None,
                unreadable: Some("empty".into()),
                beat,
            }));
        }
        Ok(Some(match serde_json::from_slice::<Owner>(&bytes) {
            Ok(o) => ClaimFile {
                owner: Some(o),
                unreadable: None,
                beat,
            },
            Err(e) => ClaimFile {
                owner: None,
                unreadable: Some(e.to_string()),
                beat,
            },
        }))
    }

    /// Judges the claim file at `path` (see the module docs): live for this process's own
    /// owners, stale at once for owners proved dead, and by the heartbeat for everyone else.
    pub(super) fn judge(&self, path: &Path, file: &ClaimFile) -> ClaimInfo {
        let stale = self.stale_after;
        match &file.owner {
            Some(owner) => match owner.liveness() {
                Liveness::Ours => ClaimInfo::new(owner.clone(), true),
                Liveness::Dead => {
                    self.watch.forget(&path.to_path_buf());
                    ClaimInfo {
                        note: Some("proved dead from here: no such process".into()),
                        ..ClaimInfo::new(owner.clone(), false)
                    }
                }
                _ => {
                    let unchanged = self.watch.unchanged_for(&path.to_path_buf(), file.beat);
                    let live = unchanged < stale;
                    ClaimInfo {
                        note: (!live).then(|| unchanged_phrase(unchanged, stale)),
                        ..ClaimInfo::new(owner.clone(), live)
                    }
                }
            },
            None => {
                // Never free at once: a claim being written looks empty for a moment, and a
                // damaged one may still have a live holder who heartbeats it.
                let unchanged = self.watch.unchanged_for(&path.to_path_buf(), file.beat);
                let why = file.unreadable.as_deref().unwrap_or("empty");
                let (owner, what) = if why == "empty" {
                    (nobody("unwritten"), "is empty".to_string())
                } else {
                    (
                        nobody("unreadable"),
                        format!("cannot be read as an owner ({why})"),
                    )
                };
                let live = unchanged < stale;
                // No running count: a waiting drain announces each distinct holder text once.
                let note = format!(
                    "claim file {} {what}: it is taken over once seen unchanged for the {:.0} s \
                     stale interval",
                    path.display(),
                    stale.as_secs_f64(),
                );
                ClaimInfo {
                    note: Some(note),
                    ..ClaimInfo::new(owner, live)
                }
            }
        }
    }

    /// Checks that `claim` is still the job's claim (not taken over as stale). Reads the claim
    /// file without its metadata: one `openat`, usually one `read`, one `close`.
    pub(super) fn holds(&self, claim: &Claim) -> Result<(), StoreError> {
        let path = self.claim_path(&claim.key);
        let owner = match self.read_fresh(FsOp::ReadClaim, &path, || read_owner(&path)) {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::Io { path, source: e }),
        };
        match owner {
            Some(o) if o.nonce == claim.owner.nonce => Ok(()),
            _ => Err(self.lost(claim)),
        }
    }

    /// [`holds`](Self::holds), skipped for a claim this handle made a moment ago: it is still
    /// ours, as nobody takes over a claim younger than the stale interval (it takes that long
    /// to see a heartbeat unchanged), nor one of a live process of its own space.
    pub(super) fn holds_unless_new(&self, claim: &Claim) -> Result<(), StoreError> {
        let trusted = self
            .held(&claim.key, false)
            .is_some_and(|h| h.attempt == claim.attempt && self.is_new(&h));
        if trusted { Ok(()) } else { self.holds(claim) }
    }

    /// Whether a claim this handle holds is young enough to trust without a read.
    pub(super) fn is_new(&self, h: &Held) -> bool {
        h.at.elapsed() < TRUST_NEW_CLAIM.min(self.stale_after / 2)
    }

    /// What this handle remembers of its claim on `key`; forgets it when `forget`.
    pub(super) fn held(&self, key: &Hash, forget: bool) -> Option<Held> {
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if forget {
            map.remove(key)
        } else {
            map.get(key).cloned()
        }
    }

    /// The owner of `claim` when this handle holds it and its file is not written yet.
    pub(super) fn unwritten(&self, claim: &Claim) -> Option<Arc<Owner>> {
        self.held(&claim.key, false)
            .filter(|h| h.attempt == claim.attempt)
            .and_then(|h| h.unwritten)
    }

    /// The error of a claim found lost; the handle forgets it.
    pub(super) fn lost(&self, claim: &Claim) -> StoreError {
        self.held(&claim.key, true);
        StoreError::ClaimLost {
            key: claim.key,
            owner: claim.owner.to_string(),
        }
    }

    /// Writes this handle's entry in `holders/` unless it is written (see [`Holder`]).
    fn register(&self) -> Result<(), StoreError> {
        let mut entry = self.holder.entry();
        if entry.is_none() {
            let owner = Owner::current();
            let dir = &self.holder.dir;
            let path = dir.join(format!("{}.json", sanitize(&owner.nonce)));
            let body = super::json_bytes(&path, &owner)?;
            fs::create_dir_all(dir).map_err(io_err(dir))?;
            crate::fsutil::write_file(&path, &body, crate::fsutil::Durability::Process)
                .map_err(io_err(&path))?;
            *entry = Some(path);
        }
        Ok(())
    }

    /// Whether a handle other than this one may hold an unwritten claim: `None` when every
    /// other handle registered in `holders/` is proved dead (their entries are removed), else
    /// a note for messages (empty when there is nothing special to say).
    fn others_may_hold(&self) -> Result<Option<String>, StoreError> {
        let dir = self.root.join(HOLDERS);
        let listed = self.read_fresh(FsOp::ListHolders, &dir, || {
            fs::read_dir(&dir)?
                .map(|e| e.map(|e| e.path()))
                .collect::<io::Result<Vec<PathBuf>>>()
        });
        let paths = match listed {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            // A listing that cannot be had now proves nothing: someone may hold it.
            Err(e) if gone(&e) => return Ok(Some(String::new())),
            Err(e) => return Err(io_err(&dir)(e)),
        };
        let own = self.holder.entry().clone();
        let mut note = None;
        for path in paths {
            if own.as_ref() == Some(&path) {
                continue;
            }
            match self.read_fresh(FsOp::ReadHolder, &path, || read_owner(&path)) {
                Ok(Some(o)) => match o.liveness() {
                    Liveness::Dead => {
                        // Its name is its dead owner's nonce: nobody makes it again.
                        let _ = fs::remove_file(&path);
                    }
                    _ => note = note.or(Some(String::new())),
                },
                Ok(None) => {
                    // Being written, or damaged: never taken for "nobody".
                    note = Some(format!(
                        "holder entry {} cannot be read as an owner",
                        path.display()
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                // A handle that stays stale proves nothing: never taken for "nobody".
                Err(e) if gone(&e) => note = note.or(Some(String::new())),
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Ok(note)
    }

    /// Writes the claim file of an unwritten claim of this handle (see [`Holder`]); nothing for
    /// a written one.
    ///
    /// # Errors
    /// [`StoreError::ClaimLost`] when another process took the job over meanwhile (it judged
    /// this holder dead), [`StoreError::Io`].
    pub(super) fn write_unwritten(&self, claim: &Claim) -> Result<(), StoreError> {
        let _one = self
            .holder
            .writing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(owner) = self.unwritten(claim) else {
            return Ok(());
        };
        let dir = self.job_dir(&claim.key);
        let path = dir.join(CLAIM);
        match create_claim(&path, &owner) {
            Ok(()) => {
                // In a folder our `mkdir` made, only a taker leaves these.
                let names = list_names(&dir)?;
                let taken = names.iter().any(|n| {
                    n == RELEASED
                        || n == "record.json"
                        || n.starts_with(TOMB)
                        || n.starts_with("running.")
                });
                if taken {
                    let _ = self.release_held(&dir, &owner);
                    return Err(self.lost(claim));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(self.lost(claim)),
            Err(e) => return Err(io_err(&path)(e)),
        }
        let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = map
            .get_mut(&claim.key)
            .filter(|h| h.attempt == claim.attempt)
        {
            h.unwritten = None;
            h.at = Instant::now();
        }
        Ok(())
    }

    /// The claim of a job folder with no claim file, no released claim, no takeover tomb and
    /// no record (one a claimer's `mkdir` made, see [`Holder`]), judged by the registered
    /// holders and by how long this handle has seen the folder unchanged; `None` for any other
    /// folder, or none.
    pub(super) fn unborn(&self, dir: &Path) -> Result<Option<ClaimInfo>, StoreError> {
        let names = match self.read_fresh(FsOp::ListJobFolder, dir, || list_dir(dir)) {
            Ok(n) => n,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(io_err(dir)(e)),
        };
        if names
            .iter()
            .any(|n| n == CLAIM || n == RELEASED || n == "record.json" || n.starts_with(TOMB))
        {
            return Ok(None);
        }
        let meta = match fs::metadata(dir) {
            Ok(m) => m,
            Err(e) if gone(&e) => return Ok(None),
            Err(e) => return Err(io_err(dir)(e)),
        };
        let owner = nobody("unwritten");
        let Some(note) = self.others_may_hold()? else {
            self.watch.forget(&dir.to_path_buf());
            return Ok(Some(ClaimInfo::new(owner, false)));
        };
        let unchanged = self
            .watch
            .unchanged_for(&dir.to_path_buf(), Beat::of(&meta, b""));
        let live = unchanged < self.stale_after;
        let note = match (note.is_empty(), live) {
            (true, true) => None,
            (true, false) => Some(unchanged_phrase(unchanged, self.stale_after)),
            (false, _) => Some(note),
        };
        Ok(Some(ClaimInfo {
            note,
            ..ClaimInfo::new(owner, live)
        }))
    }

    /// Moves the claim judged stale (`judged`) aside to a tomb of its own name, and checks that
    /// what it moved is that very claim; puts it back when it is not (see the module docs).
    fn take_over(&self, dir: &Path, judged: &ClaimFile) -> Result<Takeover, StoreError> {
        let claim = dir.join(CLAIM);
        let tomb = dir.join(format!("{TOMB}{}", unique_token()));
        if move_aside_if_unchanged(&claim, &tomb, judged.beat).map_err(io_err(&claim))? {
            self.watch.forget(&claim);
            Ok(Takeover::Moved)
        } else {
            Ok(Takeover::Changed)
        }
    }

    /// The lowest attempt number a claim in `dir` may take after a takeover: above every
    /// attempt whose files are there (`running.N.json`, `metrics.N.tsv`), so that a holder
    /// judged dead by mistake, if only stopped, never shares its attempt's files with the
    /// taker's; and at least 2.
    fn attempt_floor(&self, dir: &Path) -> u32 {
        let highest = list_dir(dir)
            .unwrap_or_default()
            .iter()
            .filter_map(|n| {
                let n = n.strip_prefix("running.").or(n.strip_prefix("metrics."))?;
                n.split('.').next()?.parse::<u32>().ok()
            })
            .max()
            .unwrap_or(0);
        (highest + 1).max(2)
    }

    /// Moves the artifacts folder a previous attempt left (`attempt`, failed, killed or
    /// replaced) aside to `artifacts.attempt-N`, so that the next attempt starts without them
    /// and a file it does not rewrite is never taken for its own. Kept for inspection.
    fn park_artifacts(&self, dir: &Path, attempt: u32) {
        let from = dir.join("artifacts");
        for n in 0..100u32 {
            let name = match n {
                0 => format!("artifacts.attempt-{attempt}"),
                _ => format!("artifacts.attempt-{attempt}.{n}"),
            };
            match fs::rename(&from, dir.join(name)) {
                Ok(()) => return,
                Err(e) if gone(&e) => return,
                // A folder of that name from an earlier crash: try the next name.
                Err(_) => continue,
            }
        }
    }

    /// Releases the claim in `dir`, which the caller checked `owner` holds, by renaming it to
    /// [`RELEASED`] rather than removing it (see [`RELEASED`] for why); if what was renamed is
    /// not `owner`'s (a takeover came between the check and the rename), it is put back.
    pub(super) fn release_held(&self, dir: &Path, owner: &Owner) -> Result<(), StoreError> {
        let path = dir.join(CLAIM);
        let released = dir.join(RELEASED);
        match fs::rename(&path, &released) {
            Ok(()) => {}
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => return Err(StoreError::Io { path, source: e }),
        }
        match read_owner(&released) {
            Ok(Some(o)) if o.nonce != owner.nonce => {
                let _ = fs::hard_link(&released, &path);
            }
            _ => {}
        }
        Ok(())
    }

    /// Removes the tombs of takeovers of `key`'s folder; called by the holder of its claim
    /// once its record is committed.
    pub(super) fn clean_tombs(&self, key: &Hash) {
        if let Ok(rd) = fs::read_dir(self.job_dir(key)) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(TOMB) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// [`Store::claim_info`].
    pub(super) fn claim_info_of(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
        let path = self.claim_path(key);
        if let Some(file) = self.read_claim_file(&path)? {
            return Ok(Some(self.judge(&path, &file)));
        }
        if let Some(o) = self.held(key, false).and_then(|h| h.unwritten) {
            return Ok(Some(ClaimInfo::new((*o).clone(), true)));
        }
        self.unborn(&self.job_dir(key))
    }

    /// Makes the job folder: `true` when this call made it (then its `mkdir` is a claim).
    fn make_job_folder(&self, dir: &Path) -> Result<bool, StoreError> {
        let mkdir = || match self.inject(FsOp::MakeJobFolder, dir, fs::create_dir(dir)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(false),
            // Lustre answers EACCES instead of EEXIST to a `mkdir` racing another (LU-6528):
            // a folder that exists was made by another claimer. One that does not is a real
            // permission error.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && dir.is_dir() => Ok(false),
            Err(e) => Err(e),
        };
        match mkdir() {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // `jobs/` was removed behind this handle.
                fs::create_dir_all(&self.jobs).map_err(io_err(&self.jobs))?;
                mkdir()
            }
            r => r,
        }
        .map_err(io_err(dir))
    }

    /// Notes a claim this handle now holds.
    fn note_held(&self, key: &Hash, held: Held) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(*key, held);
    }

    /// [`Store::claim`].
    pub(super) fn claim_of(
        &self,
        key: &Hash,
        owner: &Owner,
        replace_done: Option<u32>,
    ) -> Result<ClaimOutcome, StoreError> {
        let is_done = |r: &JobRecord| r.status == Status::Done && replace_done != Some(r.attempt);
        let dir = self.job_dir(key);
        // Registered before the `mkdir` that may be a claim, so that others can judge it.
        if self.defer_claims {
            self.register()?;
        }
        let claimed = || Claim {
            key: *key,
            owner: owner.clone(),
            attempt: 1,
        };
        if self.defer_claims {
            // The `mkdir` is the claim; its file is written by `start` or the first heartbeat,
            // if the run lasts that long (see `Holder`). The folder is made and the claim noted
            // under the lock of the claims this handle holds: another thread of this handle
            // that finds the folder made finds the claim noted too (between the two, it saw
            // no claim file, judged the folder by `holders/`, where only this very handle is
            // registered, and claimed the job as well: two winners).
            let mut map = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if self.make_job_folder(&dir)? {
                let held = Held {
                    at: Instant::now(),
                    attempt: 1,
                    fresh: true,
                    unwritten: Some(Arc::new(owner.clone())),
                };
                map.insert(*key, held);
                return Ok(ClaimOutcome::Claimed(claimed()));
            }
        } else if self.make_job_folder(&dir)? {
            let at = Instant::now();
            // A claimer that judged the folder left by a dead holder (this one registers
            // nowhere) may have written its claim first: then it holds the job.
            if create_claim(&dir.join(CLAIM), owner).is_ok() {
                let held = Held {
                    at,
                    attempt: 1,
                    fresh: true,
                    unwritten: None,
                };
                self.note_held(key, held);
                return Ok(ClaimOutcome::Claimed(claimed()));
            }
        }
        if let Some(o) = self.held(key, false).and_then(|h| h.unwritten) {
            return Ok(ClaimOutcome::Busy((*o).clone()));
        }
        let path = dir.join(CLAIM);
        // The lowest attempt this claim may take: above a stale holder's (see
        // `attempt_floor`), once anything was judged stale here.
        let mut floor = 1;
        // Bounded: each turn returns, or moved a stale claim aside, or saw a file vanish.
        for _ in 0..16 {
            match self.record(key)? {
                Some(r) if is_done(&r) => return Ok(ClaimOutcome::Done(Box::new(r))),
                Some(_) => {}
                None => {
                    if let Some(info) = self.unborn(&dir)? {
                        if info.live {
                            return Ok(ClaimOutcome::Busy(info.owner));
                        }
                        floor = floor.max(self.attempt_floor(&dir));
                    }
                }
            }
            let at = Instant::now();
            match create_claim(&path, owner) {
                Ok(()) => {
                    // Proved, not assumed: our nonce is in the claim file (a taker that judged
                    // an empty file in the instant of our create would have moved it aside,
                    // and another claimer may have made the next one). A read that fails for
                    // another reason proves nothing against the file we just made.
                    match read_owner(&path) {
                        Ok(Some(o)) if o.nonce != owner.nonce => continue,
                        Ok(None) => continue,
                        Err(e) if gone(&e) => continue,
                        _ => {}
                    }
                    if floor == 1
                        && list_dir(&dir).is_ok_and(|n| n.iter().any(|n| n.starts_with(TOMB)))
                    {
                        // A takeover happened here: its stale holder may still write.
                        floor = self.attempt_floor(&dir);
                    }
                    // The previous holder may have finished between our check and our create.
                    let prev = self.record(key)?;
                    let attempt = (prev.as_ref().map(|r| r.attempt).unwrap_or(0) + 1).max(floor);
                    let claim = Claim {
                        key: *key,
                        owner: owner.clone(),
                        attempt,
                    };
                    // Replaces what a claim of this process dropped without finish or
                    // release left.
                    self.note_held(
                        key,
                        Held {
                            at,
                            attempt,
                            fresh: false,
                            unwritten: None,
                        },
                    );
                    if let Some(r) = prev
                        && is_done(&r)
                    {
                        self.release(&claim)?;
                        return Ok(ClaimOutcome::Done(Box::new(r)));
                    }
                    self.park_artifacts(&dir, attempt - 1);
                    return Ok(ClaimOutcome::Claimed(claim));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let Some(file) = self.read_claim_file(&path)? else {
                        continue;
                    };
                    let info = self.judge(&path, &file);
                    if info.live {
                        return Ok(ClaimOutcome::Busy(info.owner));
                    }
                    match self.take_over(&dir, &file)? {
                        Takeover::Moved => floor = floor.max(self.attempt_floor(&dir)),
                        Takeover::Changed => return Ok(ClaimOutcome::Busy(info.owner)),
                    }
                }
                Err(e) => return Err(StoreError::Io { path, source: e }),
            }
        }
        Ok(match self.claim_info(key)? {
            Some(info) => ClaimOutcome::Busy(info.owner),
            None => ClaimOutcome::Busy(owner.clone()),
        })
    }

    /// [`Store::release`].
    pub(super) fn release_of(&self, claim: &Claim) -> Result<(), StoreError> {
        let dir = self.job_dir(&claim.key);
        if let Some(owner) = self.unwritten(claim) {
            self.held(&claim.key, true);
            // An unwritten claim is released by writing its released claim: the folder is no
            // longer one a claimer just made. Unless someone took it over meanwhile.
            let path = dir.join(RELEASED);
            return match fs::symlink_metadata(dir.join(CLAIM)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    let body = serde_json::to_vec(&*owner).map_err(|e| StoreError::Io {
                        path: path.clone(),
                        source: io::Error::other(e),
                    })?;
                    crate::fsutil::replace_file(&path, &body).map_err(io_err(&path))
                }
                _ => Ok(()),
            };
        }
        self.held(&claim.key, true);
        if self.holds(claim).is_err() {
            return Ok(());
        }
        self.release_held(&dir, &claim.owner)
    }

    /// [`Store::heartbeat`]: writes an unwritten claim's file, checks the claim and sets its
    /// mtime (the heartbeat others watch).
    pub(super) fn heartbeat_of(&self, claim: &Claim) -> Result<(), StoreError> {
        self.write_unwritten(claim)?;
        self.holds(claim)?;
        let path = self.claim_path(&claim.key);
        let f = File::options()
            .write(true)
            .open(&path)
            .map_err(io_err(&path))?;
        f.set_modified(SystemTime::now()).map_err(io_err(&path))
    }
}

/// The entry names of a folder, as plain I/O (see `list_names` for the store's error).
fn list_dir(dir: &Path) -> io::Result<HashSet<String>> {
    let mut names = HashSet::new();
    for e in fs::read_dir(dir)? {
        names.insert(e?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Creates the claim file (`O_EXCL`: fails if `claim` exists) and writes its owner.
///
/// No temp file and no fsync: a claim only matters while its owner lives. A claim seen empty or
/// torn (its writer between `open` and `write`, or killed there, or a machine crash) has no
/// owner to ask and is judged by its heartbeat like any unprovable claim (see `judge`).
pub(super) fn create_claim(path: &Path, owner: &Owner) -> io::Result<()> {
    let body = serde_json::to_vec(owner).map_err(io::Error::other)?;
    let mut f = OpenOptions::new().write(true).create_new(true).open(path)?;
    if let Err(e) = f.write_all(&body) {
        // Ours and empty or torn: nobody takes over such a claim before the stale interval.
        let _ = fs::remove_file(path);
        return Err(e);
    }
    Ok(())
}

/// The owner in the claim file at `path` (`None`: empty or not an owner, e.g. a claim whose
/// creator died before writing it). No `stat`: a claim is a few hundred bytes, usually read
/// whole by the first `read`, and complete as soon as it parses.
pub(super) fn read_owner(path: &Path) -> io::Result<Option<Owner>> {
    let mut f = File::open(path)?;
    let mut buf = [0u8; 1024];
    let mut parsed = None;
    let len = read_small(&mut f, &mut buf, |b| {
        parsed = serde_json::from_slice::<Owner>(b).ok();
        parsed.is_some()
    })?;
    if parsed.is_some() {
        return Ok(parsed);
    }
    if len == buf.len() {
        let mut v = buf.to_vec();
        f.read_to_end(&mut v)?;
        return Ok(serde_json::from_slice(&v).ok());
    }
    // The end came with bytes `complete` already found not to parse (or none).
    Ok(None)
}

/// Reads `f` into `buf` until `complete` says the bytes so far are whole, the end of the file,
/// or a full `buf`; returns how many bytes were read. A small file is usually whole after its
/// first `read`, which saves the `read` of its end.
fn read_small(
    f: &mut File,
    buf: &mut [u8],
    mut complete: impl FnMut(&[u8]) -> bool,
) -> io::Result<usize> {
    let mut len = 0;
    loop {
        let n = f.read(&mut buf[len..])?;
        len += n;
        if n == 0 || len == buf.len() || complete(&buf[..len]) {
            return Ok(len);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The judgement of claims by who may judge whom (P01 (a)-(e) in
    //! `docs/evidence.md`, the bad-input rules of issue 26), one process playing every side: owners
    //! of other PID namespaces, boots and hosts are written into claim files as such a process
    //! would write them.

    use super::*;
    use crate::store::conformance::sample_record;
    use crate::store::{ProcessSpace, StoreError};

    const STALE: Duration = Duration::from_millis(80);

    fn store(stale: Duration) -> (tempfile::TempDir, FsStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = FsStore::create(dir.path().join("s"))
            .unwrap()
            .with_stale_after(stale);
        (dir, s)
    }

    /// An owner this process did not make: this host, boot and PID namespace unless changed.
    fn stranger(pid: u32, start_ticks: Option<u64>) -> Owner {
        Owner {
            pid,
            start_ticks,
            nonce: format!("stranger-{}", unique_token()),
            ..Owner::current()
        }
    }

    /// Writes `owner`'s claim of `key`, as its process would (a folder, a claim file).
    fn plant(store: &FsStore, key: &Hash, owner: &Owner) -> PathBuf {
        let dir = store.job_dir(key);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(CLAIM);
        create_claim(&path, owner).unwrap();
        path
    }

    /// A live process of this space: its pid and start time.
    fn live_child() -> (std::process::Child, u32, u64) {
        let c = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = c.id();
        let ticks = crate::sys::process_start_ticks(pid).unwrap();
        (c, pid, ticks)
    }

    fn busy(store: &FsStore, key: &Hash) -> bool {
        matches!(
            store.claim(key, &Owner::current(), None).unwrap(),
            ClaimOutcome::Busy(_)
        )
    }

    /// Claims `key` (it must be free now) and returns the attempt.
    fn taken(store: &FsStore, key: &Hash) -> u32 {
        match store.claim(key, &Owner::current(), None).unwrap() {
            ClaimOutcome::Claimed(c) => c.attempt,
            other => panic!("expected the claim to be taken over, got {other:?}"),
        }
    }

    #[test]
    fn p01_a_a_pid_of_another_namespace_proves_nothing_and_a_silent_holder_goes_stale() {
        // The checker's own live worker has the holder's pid, in the checker's namespace.
        let (mut child, pid, ticks) = live_child();
        let holder = Owner {
            pidns: Some("pid:[4026532811]".into()),
            ..stranger(pid, Some(ticks))
        };
        assert_eq!(holder.liveness(), Liveness::Unproven);
        let (_d, s) = store(STALE);
        let key = Hash::of("a");
        plant(&s, &key, &holder);
        let info = s.claim_info(&key).unwrap().unwrap();
        assert!(info.live, "never dead at first sight");
        assert!(busy(&s, &key));
        std::thread::sleep(STALE + Duration::from_millis(20));
        // Not waited on forever: its heartbeat stood still for the stale interval.
        let info = s.claim_info(&key).unwrap().unwrap();
        assert!(!info.live, "{info:?}");
        assert!(info.note.unwrap().contains("unchanged"));
        assert_eq!(taken(&s, &key), 2);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn p01_b_a_holder_whose_heartbeat_moves_is_never_taken_over() {
        // A longer interval: the renewing thread must never look stalled on a loaded machine.
        const STALE: Duration = Duration::from_millis(400);
        // Another namespace, its pid absent here; alive, and renewing its heartbeat.
        let holder = Owner {
            pidns: Some("pid:[4026532811]".into()),
            ..stranger(u32::MAX - 7, Some(5512))
        };
        let (_d, s) = store(STALE);
        let key = Hash::of("b");
        let path = plant(&s, &key, &holder);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let beat = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let f = File::options().write(true).open(&path).unwrap();
                    f.set_modified(SystemTime::now()).unwrap();
                    std::thread::sleep(STALE / 8);
                }
            })
        };
        let t = Instant::now();
        while t.elapsed() < STALE * 4 {
            assert!(busy(&s, &key), "taken while its heartbeat moved");
            std::thread::sleep(STALE / 10);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        beat.join().unwrap();
        // Stopped: stale once seen unchanged for the interval.
        assert!(busy(&s, &key));
        std::thread::sleep(STALE + Duration::from_millis(20));
        assert_eq!(taken(&s, &key), 2);
    }

    #[test]
    fn p01_c_this_processs_own_pid_with_a_nonce_it_never_made_is_a_dead_predecessor() {
        // As pid 1 of a restarted container finds pid 1's claim of the container before it.
        let me = ProcessSpace::here();
        let previous = stranger(
            std::process::id(),
            crate::store::liveness::own_start_ticks(),
        );
        assert_eq!(previous.pidns, me.pidns);
        assert_eq!(previous.liveness(), Liveness::Dead);
        let (_d, s) = store(Duration::from_secs(3600));
        let key = Hash::of("c");
        plant(&s, &key, &previous);
        assert!(!s.claim_info(&key).unwrap().unwrap().live);
        assert_eq!(taken(&s, &key), 2, "taken over at once");
        // This process's own owners are never stale, however long their heartbeat stands.
        let (_d, s) = store(Duration::from_millis(1));
        let ours = Owner::current();
        plant(&s, &key, &ours);
        std::thread::sleep(Duration::from_millis(20));
        assert!(s.claim_info(&key).unwrap().unwrap().live);
        assert_eq!(ours.liveness(), Liveness::Ours);
    }

    #[test]
    fn p01_d_another_boot_is_judged_by_its_heartbeat_not_by_the_live_process_with_its_pid() {
        // The same host name, rebooted: a live process has the recorded pid and even the
        // recorded start time now. It proves nothing either way.
        let (mut child, pid, ticks) = live_child();
        let before = Owner {
            boot_id: Some("b-222".into()),
            ..stranger(pid, Some(ticks))
        };
        assert_eq!(before.liveness(), Liveness::Unproven);
        let same_boot = stranger(pid, Some(ticks));
        assert_eq!(same_boot.liveness(), Liveness::Alive, "the control");
        let other_start = stranger(pid, Some(ticks + 1));
        assert_eq!(other_start.liveness(), Liveness::Dead, "the control");
        let (_d, s) = store(STALE);
        let key = Hash::of("d");
        plant(&s, &key, &before);
        assert!(busy(&s, &key), "not taken at once");
        std::thread::sleep(STALE + Duration::from_millis(20));
        assert_eq!(taken(&s, &key), 2, "nor held forever by the live pid");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn p01_e_a_pid_of_another_host_is_never_ours() {
        let other = Owner {
            host: "node02".into(),
            ..stranger(
                std::process::id(),
                crate::store::liveness::own_start_ticks(),
            )
        };
        assert_eq!(other.liveness(), Liveness::Unproven);
        let (_d, s) = store(STALE);
        let key = Hash::of("e");
        plant(&s, &key, &other);
        assert!(busy(&s, &key), "not ours, not dead");
    }

    #[test]
    fn an_unreadable_claim_file_is_reported_with_its_path_and_never_free_at_once() {
        for (bytes, what) in [
            (
                &b"{\"host\": \"node01\", \"pid\": 10"[..],
                "cannot be read as an owner",
            ),
            (&b""[..], "is empty"),
        ] {
            let (_d, s) = store(STALE);
            let key = Hash::of("bad");
            let dir = s.job_dir(&key);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(CLAIM), bytes).unwrap();
            let info = s.claim_info(&key).unwrap().unwrap();
            assert!(info.live, "never free at first sight");
            let note = info.note.clone().unwrap();
            let path = dir.join(CLAIM).display().to_string();
            assert!(note.contains(&path), "{note}");
            assert!(note.contains(what), "{note}");
            assert!(note.contains("0 s stale interval"), "the interval: {note}");
            assert!(info.to_string().contains(&path), "shown: {info}");
            assert!(busy(&s, &key));
            std::thread::sleep(STALE + Duration::from_millis(20));
            assert_eq!(taken(&s, &key), 2, "taken over after the interval");
        }
    }

    #[test]
    fn an_unreadable_holder_entry_is_never_taken_for_nobody() {
        let (_d, s) = store(STALE);
        let key = Hash::of("unborn");
        // A folder its claimer's `mkdir` made, and no registered holder: free at once.
        fs::create_dir_all(s.job_dir(&key)).unwrap();
        assert!(!s.claim_info(&key).unwrap().unwrap().live);
        // With an entry that cannot be read: someone may hold it; said, and judged by time.
        let holders = s.root().join(HOLDERS);
        fs::create_dir_all(&holders).unwrap();
        let entry = holders.join("garbage.json");
        fs::write(&entry, b"not an owner").unwrap();
        let info = s.claim_info(&key).unwrap().unwrap();
        assert!(info.live);
        assert!(
            info.note.unwrap().contains(&entry.display().to_string()),
            "the entry is named"
        );
        std::thread::sleep(STALE + Duration::from_millis(20));
        assert!(!s.claim_info(&key).unwrap().unwrap().live);
        assert!(entry.exists(), "an entry nobody can judge is never removed");
        assert_eq!(taken(&s, &key), 2);
    }

    /// A hook answering `ESTALE` instead of `ENOENT`, and once for each path that exists, for
    /// the reads named, and `EACCES` instead of `EEXIST` for every job folder `mkdir`.
    /// Two threads of one handle claim one new job; the one whose `mkdir` made the folder is
    /// held up right after it (the hook sleeps), so the other finds the folder made before the
    /// claim is noted: it must answer `Busy`, never claim the job too (it saw no claim file,
    /// and `holders/` lists only this very handle). Without the lock around the `mkdir` and
    /// its note, both won, about one run in ten of the conformance suite under load.
    #[test]
    fn a_thread_that_finds_a_folder_just_made_by_another_thread_of_its_handle_is_busy() {
        for trial in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let made = Arc::new(std::sync::Barrier::new(2));
            let gate = made.clone();
            let hook: FaultHook = Arc::new(move |op, _, err| {
                if op == FsOp::MakeJobFolder && err.is_none() {
                    // The maker: let the other thread run its whole claim meanwhile.
                    gate.wait();
                    std::thread::sleep(Duration::from_millis(150));
                }
                None
            });
            let s = Arc::new(
                FsStore::create(dir.path().join("s"))
                    .unwrap()
                    .with_fault_hook(hook),
            );
            let key = Hash::of(format!("race-{trial}"));
            let first = {
                let s = s.clone();
                std::thread::spawn(move || s.claim(&key, &Owner::current(), None).unwrap())
            };
            // Starts once the first thread's `mkdir` made the folder.
            made.wait();
            let second = s.claim(&key, &Owner::current(), None).unwrap();
            let first = first.join().unwrap();
            let wins = [&first, &second]
                .iter()
                .filter(|o| matches!(o, ClaimOutcome::Claimed(_)))
                .count();
            assert_eq!(wins, 1, "trial {trial}: {first:?} / {second:?}");
            assert!(matches!(first, ClaimOutcome::Claimed(_)), "{first:?}");
            assert!(matches!(second, ClaimOutcome::Busy(_)), "{second:?}");
        }
    }

    fn nfs_and_lustre_faults() -> (FaultHook, Arc<Mutex<usize>>) {
        let injected = Arc::new(Mutex::new(0usize));
        let seen = Arc::new(Mutex::new(HashSet::<PathBuf>::new()));
        let count = injected.clone();
        let hook: FaultHook = Arc::new(move |op, path, err| {
            let stale = || io::Error::from_raw_os_error(libc::ESTALE);
            let out = match (op, err) {
                (FsOp::MakeJobFolder, Some(e)) if e.kind() == io::ErrorKind::AlreadyExists => {
                    Some(io::Error::from_raw_os_error(libc::EACCES))
                }
                (FsOp::MakeJobFolder, _) => None,
                (_, Some(e)) if e.kind() == io::ErrorKind::NotFound => Some(stale()),
                (_, None) => seen.lock().unwrap().insert(path.to_path_buf()).then(stale),
                _ => None,
            };
            if out.is_some() {
                *count.lock().unwrap() += 1;
            }
            out
        });
        (hook, injected)
    }

    #[test]
    fn estale_and_eacces_races_are_looked_up_again_never_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (hook, injected) = nfs_and_lustre_faults();
        let open = || {
            FsStore::create(dir.path().join("s"))
                .unwrap()
                .with_stale_after(STALE)
                .with_fault_hook(hook.clone())
        };
        let (a, b) = (open(), open());
        let key = Hash::of("job");
        let c = crate::store::conformance::claimed(&a, &key, &Owner::current());
        // EACCES on the contended mkdir: the folder exists, so it is claimed by another.
        assert!(busy(&b, &key));
        // A holder's entry gone (its handle dropped) reads as ESTALE: gone, not an error.
        let gone_holder = open();
        let k2 = Hash::of("other");
        let c2 = crate::store::conformance::claimed(&gone_holder, &k2, &Owner::current());
        gone_holder.release(&c2).unwrap();
        drop(gone_holder);
        assert!(b.claim_info(&key).unwrap().unwrap().live);
        let mut rec = sample_record(key, Status::Running, c.attempt);
        a.start(&c, &rec).unwrap();
        assert!(busy(&b, &key));
        rec.status = Status::Done;
        a.finish(&c, &rec).unwrap();
        assert!(matches!(
            b.claim(&key, &Owner::current(), None).unwrap(),
            ClaimOutcome::Done(_)
        ));
        assert!(*injected.lock().unwrap() >= 3, "faults were injected");
        // EACCES where the folder does not exist is a real permission error, naming it.
        // (Tests run as root, which passes permission checks: the hook undoes the `mkdir`.)
        let ro = tempfile::tempdir().unwrap();
        let s = FsStore::create(ro.path().join("s"))
            .unwrap()
            .with_fault_hook(Arc::new(|op, path, err| {
                (op == FsOp::MakeJobFolder && err.is_none()).then(|| {
                    fs::remove_dir(path).unwrap();
                    io::Error::from_raw_os_error(libc::EACCES)
                })
            }));
        match s.claim(&key, &Owner::current(), None) {
            Err(StoreError::Io { path, source }) => {
                assert_eq!(path, s.job_dir(&key));
                assert_eq!(source.kind(), io::ErrorKind::PermissionDenied);
            }
            other => panic!("expected a permission error, got {other:?}"),
        }
    }
}
