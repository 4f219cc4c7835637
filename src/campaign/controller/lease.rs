//! One controller per campaign: a lease in `<campaign>/controller/`.
//!
//! `lease.json` names the holder ([`Owner`]: host, boot id, PID namespace, pid, process start
//! time, nonce). It is created exclusively (written to a temp file of its own name, then
//! `link(2)`ed into place, which fails when it exists), never replaced while held: the holder's
//! heartbeat is its mtime, renewed every `ttl / 4` by a background thread independent of the
//! control loop, so a slow step (a long `sbatch`, a slow poll) can never let the lease lapse.
//! A lease whose file names someone else is *lost*, and the controller stops
//! ([`Lease::check`]).
//!
//! Who may take a lease over, by the store's rules (`store/liveness.rs`; CONTRIBUTING.md
//! "Store" has the table): at once when its holder is proved dead (same host, boot and PID
//! namespace, and its pid gone or started at another time), or was this very process; in every
//! other case (another host, boot or PID namespace, or a `lease.json` that cannot be read) only
//! after [`Lease::acquire`] has watched its heartbeat stay unchanged for the lease's ttl on its
//! own monotonic clock. A heartbeat that moves means a live holder: [`ControllerError::LeaseHeld`].
//! A takeover renames the stale file aside and checks that it moved the file it judged.
//!
//! An advisory POSIX record lock (`fcntl(F_SETLK)`, see fcntl(2)) on `lease.lock` is taken too:
//! when another process holds it, the lease is held, and `acquire` says so at once without
//! waiting for a heartbeat. It only ever vetoes: a free lock proves nothing (on NFS mounted
//! `nolock` a lock is local to each client, and some filesystems grant every lock), and where
//! locks are not supported (Lustre without `-o flock`: `ENOSYS`) it is skipped.
//!
//! Why a record lock and not `flock(2)`: a flock belongs to the open file description, which a
//! forked child shares. The local executor forks its wrappers from the controller, and a
//! wrapper not yet past closing its inherited descriptors kept a dead controller's lease held
//! (its successor was refused). A record lock belongs to the process and is never inherited
//! (fcntl(2): "record locks are not inherited by a child created via fork"). Record locks do
//! not exclude within one process, so a process-wide registry does that.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ControllerError;
use crate::store::Owner;
use crate::store::liveness::{
    Beat, HeartbeatWatch, Liveness, is_gone, move_aside_if_unchanged, read_beat, unique_token,
};
use crate::sys::now_ms;

/// The content of `lease.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder.
    pub owner: Owner,
    /// When it was taken (ms since the Unix epoch).
    pub acquired_at_ms: u64,
    /// Last heartbeat (ms since the Unix epoch), by the clock of whoever wrote it: the file's
    /// mtime, which the holder renews, when newer than what the file says. For people only:
    /// no judgement compares it with the reader's clock.
    pub renewed_at_ms: u64,
    /// After how long without a heartbeat change, as watched by a controller that cannot prove
    /// the holder dead, the holder is presumed dead (ms).
    pub ttl_ms: u64,
}

impl std::fmt::Display for LeaseInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (owner id {}), heartbeat {} s ago",
            self.owner,
            self.owner.nonce,
            now_ms().saturating_sub(self.renewed_at_ms) / 1000
        )
    }
}

/// A held lease; released on drop.
#[derive(Debug)]
pub struct Lease {
    campaign: PathBuf,
    file: PathBuf,
    _lock: File,
    // Dropped after `_lock` (fields drop in order), so no other acquire in this process can
    // open the file while the lock is still ours.
    _registered: Registered,
    info: LeaseInfo,
    stop: Arc<AtomicBool>,
    lost: Arc<std::sync::Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

/// The controller folders whose lease this process holds.
static HELD: std::sync::Mutex<Option<HashSet<PathBuf>>> = std::sync::Mutex::new(None);

/// This process's hold on one controller folder; released on drop.
#[derive(Debug)]
struct Registered(PathBuf);

impl Registered {
    /// `None` when this process already holds it.
    fn take(dir: PathBuf) -> Option<Self> {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        // Not `then_some(Self(..))`: a `Self` made and dropped on refusal would deregister
        // the real holder (and deadlock on `HELD`).
        if held.get_or_insert_with(HashSet::new).insert(dir.clone()) {
            Some(Self(dir))
        } else {
            None
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = held.as_mut() {
            h.remove(&self.0);
        }
    }
}

/// What a non-blocking record lock found.
enum LockProbe {
    /// This process holds it now.
    Taken,
    /// Another process holds it: the lease is held.
    Held,
    /// The filesystem does not lock (`ENOSYS`, `ENOLCK`, `EINVAL`, ...): no evidence either way.
    Unsupported,
}

/// Takes a write lock on the whole file without waiting (see [`LockProbe`]).
fn try_lock(file: &File) -> LockProbe {
    // SAFETY: an all-zero `flock` struct is valid; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 0; // to the end of the file, however it grows
    // SAFETY: fcntl on a valid open fd with a pointer to a live, initialized struct.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        return LockProbe::Taken;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => LockProbe::Held,
        _ => LockProbe::Unsupported,
    }
}

/// What `lease.json` holds, with its heartbeat.
pub(crate) struct LeaseFile {
    /// The holder, or why the file cannot be read as one.
    pub(crate) info: Result<LeaseInfo, String>,
    /// Its inode, mtime and bytes.
    pub(crate) beat: Beat,
}

/// Reads `lease.json` at `path`: `None` when there is none (or it vanished while read).
pub(crate) fn read_lease(path: &Path) -> std::io::Result<Option<LeaseFile>> {
    match read_beat_and_mtime(path) {
        Ok(((beat, bytes), mtime_ms)) => {
            let info = serde_json::from_slice::<LeaseInfo>(&bytes)
                .map(|mut i| {
                    // The heartbeat is the mtime; the content keeps the time it was taken.
                    i.renewed_at_ms = i.renewed_at_ms.max(mtime_ms);
                    i
                })
                .map_err(|e| {
                    if bytes.is_empty() {
                        "empty".to_string()
                    } else {
                        e.to_string()
                    }
                });
            Ok(Some(LeaseFile { info, beat }))
        }
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`read_lease`], its error as the controller's.
fn read_lease_or(path: &Path) -> Result<Option<LeaseFile>, ControllerError> {
    read_lease(path).map_err(|e| ControllerError::io("reading lease", path, e))
}

fn read_beat_and_mtime(path: &Path) -> std::io::Result<((Beat, Vec<u8>), u64)> {
    let read = read_beat(path)?;
    let mtime_ms = crate::sys::epoch_ms(std::fs::metadata(path)?.modified()?);
    Ok((read, mtime_ms))
}

/// Creates `lease.json` at `path` with `info`, exclusively: written to a temp file of this
/// process's own name, synced, and linked into place (fails with `AlreadyExists` when a lease
/// file exists). The temp name is removed either way (it is ours alone).
fn create_info(path: &Path, info: &LeaseInfo) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(info).map_err(std::io::Error::other)?;
    let tmp = path.with_file_name(format!("lease.json.tmp.{}", unique_token()));
    let linked = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    linked?;
    if let Some(dir) = path.parent() {
        let _ = crate::fsutil::sync_dir(dir);
    }
    Ok(())
}

/// Temp files older than this are left by a process that died writing them (a write takes
/// milliseconds).
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// Removes the temp files a killed writer left in `dir` (not recursive): `.NAME.tmp.PID.SEQ`
/// of [`atomic_write`](crate::fsutil::atomic_write) (e.g. `.report.html.tmp.*`) whose writer
/// pid is gone or that are older than a minute, and `lease.json.tmp.*` (also
/// `.lease.json.tmp.*`) older than a minute. Returns the names removed; errors are ignored
/// (a file another process removed first, a folder that is not there).
pub(crate) fn remove_stale_temp_files(dir: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let lease_tmp = name.starts_with("lease.json.tmp.") || name.starts_with(".lease.json.tmp.");
        let atomic_tmp = crate::fsutil::is_temp_name(&name);
        if !lease_tmp && !atomic_tmp {
            continue;
        }
        let Ok(meta) = e.metadata() else { continue };
        if !meta.is_file() {
            continue;
        }
        let old = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_TEMP_AGE);
        // `.NAME.tmp.PID.SEQ`: a writer pid that no longer exists on this host.
        let dead_writer = !lease_tmp
            && name
                .rsplit('.')
                .nth(1)
                .and_then(|p| p.parse::<i32>().ok())
                .filter(|&p| p > 0)
                // SAFETY: signal 0 only checks that the pid exists.
                .is_some_and(|p| {
                    (unsafe { libc::kill(p, 0) }) != 0
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
                });
        if (old || dead_writer) && std::fs::remove_file(e.path()).is_ok() {
            tracing::info!(target: "puzzletron::campaign", file = %e.path().display(), "removed a temp file a killed writer left");
            removed.push(name);
        }
    }
    removed.sort();
    removed
}

/// What [`Lease::acquire`] concluded about an existing `lease.json`.
enum Verdict {
    /// Its holder lives (or may: its heartbeat moved): refuse.
    Held(String),
    /// Its holder is dead, or its heartbeat stood still for the ttl: take it over.
    Stale,
    /// It was released or replaced while watched: look again.
    Gone,
}

impl Lease {
    /// Takes the lease of the campaign whose controller folder is `dir`.
    ///
    /// Returns at once when the lease is free, held by a process holding its record lock, or
    /// left by a holder proved dead (see [`Owner::liveness`]). Every other holder (another
    /// host, boot or PID namespace, a live process of this one's space that does not hold the
    /// lock, or an unreadable `lease.json`) is judged by its heartbeat, watched for up to `ttl`
    /// (the ttl written in the lease when it is longer): a change means a live holder; none
    /// means a stale lease, taken over.
    ///
    /// # Errors
    /// [`ControllerError::LeaseHeld`] naming the holder when a live controller holds it;
    /// [`ControllerError::Io`] when the lease files cannot be read or written.
    pub fn acquire(campaign: &Path, dir: &Path, ttl: Duration) -> Result<Lease, ControllerError> {
        let lock_path = dir.join("lease.lock");
        let file = dir.join("lease.json");
        let held = |holder: String| ControllerError::LeaseHeld {
            campaign: campaign.to_path_buf(),
            holder,
            lease: file.clone(),
        };
        let describe = |f: Option<LeaseFile>| match f.map(|f| f.info) {
            Some(Ok(i)) => i.to_string(),
            Some(Err(why)) => format!("an unreadable lease.json ({why})"),
            None => "a process that has not written lease.json yet".into(),
        };
        // Checked before opening: closing any descriptor of the file would drop the record
        // lock this process already holds on it.
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let registered = Registered::take(key)
            .ok_or_else(|| held(describe(read_lease(&file).ok().flatten())))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ControllerError::io("opening", &lock_path, e))?;
        if let LockProbe::Held = try_lock(&lock) {
            return Err(held(describe(read_lease_or(&file)?)));
        }
        let owner = Owner::current();
        let now = now_ms();
        let info = LeaseInfo {
            owner: owner.clone(),
            acquired_at_ms: now,
            renewed_at_ms: now,
            ttl_ms: ttl.as_millis() as u64,
        };
        // Bounded: each turn creates the lease, refuses, or moved a stale one aside.
        let mut taken = false;
        for _ in 0..16 {
            match create_info(&file, &info) {
                Ok(()) => {
                    taken = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ControllerError::io("writing lease", &file, e)),
            }
            let Some(old) = read_lease_or(&file)? else {
                continue;
            };
            let judged = old.beat;
            match Self::judge(&file, old, ttl)? {
                Verdict::Held(who) => return Err(held(who)),
                Verdict::Gone => {}
                Verdict::Stale => {
                    let tomb = dir.join(format!("lease.stale.{}", unique_token()));
                    let moved = move_aside_if_unchanged(&file, &tomb, judged)
                        .map_err(|e| ControllerError::io("taking over", &file, e))?;
                    if moved {
                        // The tomb's name is ours alone.
                        let _ = std::fs::remove_file(&tomb);
                    }
                }
            }
        }
        // Proved, not assumed: the file names us.
        match read_lease_or(&file)?.map(|f| f.info) {
            Some(Ok(cur)) if taken && cur.owner.nonce == owner.nonce => {}
            other => {
                return Err(held(match other {
                    Some(Ok(i)) => i.to_string(),
                    _ => "another controller taking it at the same moment".into(),
                }));
            }
        }
        // Ours now: what a killed holder (or a killed `campaign report`) left half written goes.
        remove_stale_temp_files(dir);
        remove_stale_temp_files(campaign);
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(std::sync::Mutex::new(None));
        let file2 = file.clone();
        let thread = {
            let (stop, lost, file, nonce) = (
                stop.clone(),
                lost.clone(),
                file.clone(),
                owner.nonce.clone(),
            );
            let period = (ttl / 4).max(Duration::from_millis(50));
            std::thread::Builder::new()
                .name("puzzletron-lease".into())
                .spawn(move || {
                    let step = Duration::from_millis(50).min(period);
                    let mut waited = Duration::ZERO;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(step);
                        waited += step;
                        if waited < period {
                            continue;
                        }
                        waited = Duration::ZERO;
                        match read_lease(&file) {
                            Ok(Some(LeaseFile { info: Ok(cur), .. }))
                                if cur.owner.nonce != nonce =>
                            {
                                *lost.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(cur.to_string());
                                return;
                            }
                            Ok(None) => {
                                *lost.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some("nobody: lease.json was moved away".into());
                                return;
                            }
                            _ => {}
                        }
                        // The heartbeat is the mtime; a renewal that fails is retried at the
                        // next period (the ttl is 4 periods). Touching a file a taker made
                        // after our read only makes its holder look alive.
                        let _ = File::options()
                            .write(true)
                            .open(&file)
                            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    }
                })
                .map_err(|e| ControllerError::io("starting the lease thread for", &file2, e))?
        };
        Ok(Lease {
            campaign: campaign.to_path_buf(),
            file,
            _lock: lock,
            _registered: registered,
            info,
            stop,
            lost,
            thread: Some(thread),
        })
    }

    /// Judges the lease file `old` at `path` (see the module docs), watching its heartbeat for
    /// up to the ttl when nothing can be proved.
    fn judge(path: &Path, old: LeaseFile, ttl: Duration) -> Result<Verdict, ControllerError> {
        let (who, ttl) = match &old.info {
            Ok(i) => match i.owner.liveness() {
                // This process holds no other lease of this folder (`Registered`): a lease of
                // ours is one a dropped handle failed to remove.
                Liveness::Ours | Liveness::Dead => return Ok(Verdict::Stale),
                _ => (i.to_string(), ttl.max(Duration::from_millis(i.ttl_ms))),
            },
            Err(why) => {
                tracing::warn!(
                    path = %path.display(),
                    "lease file cannot be read ({why}): it is taken over once its heartbeat \
                     is seen unchanged for {:.0} s",
                    ttl.as_secs_f64()
                );
                (format!("an unreadable lease file ({why})"), ttl)
            }
        };
        let watch: HeartbeatWatch<()> = HeartbeatWatch::default();
        watch.unchanged_for(&(), old.beat);
        let poll = (ttl / 16).clamp(Duration::from_millis(10), Duration::from_millis(500));
        loop {
            std::thread::sleep(poll);
            let Some(now) = read_lease_or(path)? else {
                return Ok(Verdict::Gone);
            };
            let unchanged = watch.unchanged_for(&(), now.beat);
            if unchanged.is_zero() {
                return Ok(Verdict::Held(format!(
                    "{who}: its heartbeat moved while watched from here"
                )));
            }
            if unchanged >= ttl {
                return Ok(Verdict::Stale);
            }
        }
    }

    /// Who holds it (this process).
    pub fn info(&self) -> &LeaseInfo {
        &self.info
    }

    /// Whether the lease is still ours.
    ///
    /// # Errors
    /// [`ControllerError::LeaseLost`] naming the new holder when another controller took it.
    pub fn check(&self) -> Result<(), ControllerError> {
        match self.lost.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(holder) => Err(ControllerError::LeaseLost {
                campaign: self.campaign.clone(),
                holder,
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.lost.lock().map(|l| l.is_none()).unwrap_or(false) {
            // Moved aside and checked, never removed by name: a taker's lease made after our
            // last check is put back.
            let tomb = self
                .file
                .with_file_name(format!("lease.released.{}", unique_token()));
            if std::fs::rename(&self.file, &tomb).is_ok() {
                match read_lease(&tomb) {
                    Ok(Some(LeaseFile { info: Ok(i), .. }))
                        if i.owner.nonce != self.info.owner.nonce =>
                    {
                        let _ = std::fs::hard_link(&tomb, &self.file);
                    }
                    _ => {}
                }
                let _ = std::fs::remove_file(&tomb);
            }
        }
        // The record lock goes with the file descriptor, the registry entry after it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_files_of_a_killed_controller_are_removed_at_the_next_start() {
        let campaign = tempfile::tempdir().unwrap();
        let ctl = campaign.path().join("controller");
        std::fs::create_dir(&ctl).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let touch = |p: PathBuf, aged: bool| {
            let f = File::create(&p).unwrap();
            if aged {
                f.set_modified(old).unwrap();
            }
        };
        // A dead writer's report temp (pid 2^31 - 2 cannot exist), an old lease temp: gone.
        touch(campaign.path().join(".report.html.tmp.2147483646.0"), false);
        touch(ctl.join("lease.json.tmp.deadbeef"), true);
        touch(ctl.join(".lease.json.tmp.123.4"), true);
        // A live writer's fresh temp (this process) and a fresh lease temp: kept.
        let ours = format!(".report.html.tmp.{}.9", std::process::id());
        touch(campaign.path().join(&ours), false);
        touch(ctl.join("lease.json.tmp.fresh"), false);
        touch(campaign.path().join("report.html"), true);
        let lease = Lease::acquire(campaign.path(), &ctl, Duration::from_secs(5)).unwrap();
        let names = |d: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(
            names(campaign.path()),
            [ours.as_str(), "controller", "report.html"]
        );
        assert!(
            !names(&ctl)
                .iter()
                .any(|n| n == "lease.json.tmp.deadbeef" || n == ".lease.json.tmp.123.4"),
            "{:?}",
            names(&ctl)
        );
        assert!(names(&ctl).iter().any(|n| n == "lease.json.tmp.fresh"));
        drop(lease);
    }

    #[test]
    fn second_holder_gets_a_clear_error_and_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap();
        let err = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ControllerError::LeaseHeld { .. }));
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains("lease.json"), "{msg}");
        assert!(err.is_retryable());
        drop(a);
        let _b = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap();
    }

    fn read_info(path: &Path) -> LeaseInfo {
        read_lease(path).unwrap().unwrap().info.unwrap()
    }

    fn write_info(path: &Path, info: &LeaseInfo) {
        std::fs::write(path, serde_json::to_vec_pretty(info).unwrap()).unwrap();
    }

    /// A lease of a holder this process cannot judge by its pid (another host).
    fn foreign(ttl_ms: u64) -> LeaseInfo {
        LeaseInfo {
            owner: Owner {
                host: "node99".into(),
                nonce: "foreign".into(),
                ..Owner::current()
            },
            acquired_at_ms: now_ms(),
            renewed_at_ms: now_ms(),
            ttl_ms,
        }
    }

    #[test]
    fn heartbeat_is_renewed_and_theft_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_millis(400)).unwrap();
        let path = dir.path().join("lease.json");
        let first = read_lease(&path).unwrap().unwrap().beat;
        std::thread::sleep(Duration::from_millis(350));
        let now = read_lease(&path).unwrap().unwrap();
        assert_ne!(now.beat, first, "the mtime is the heartbeat");
        a.check().unwrap();
        let mut thief = now.info.unwrap();
        thief.owner.nonce = "someone-else".into();
        write_info(&path, &thief);
        std::thread::sleep(Duration::from_millis(300));
        let err = a.check().unwrap_err();
        assert!(err.to_string().contains("someone-else"), "{err}");
        drop(a);
        assert_eq!(
            read_info(&path).owner.nonce,
            "someone-else",
            "a lost lease's drop leaves the taker's file"
        );
    }

    #[test]
    fn a_lease_of_another_host_is_judged_by_its_heartbeat_on_our_clock_never_by_its_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease.json");
        // Its timestamps say it was renewed a day ago: no matter; its mtime moves.
        let info = LeaseInfo {
            renewed_at_ms: now_ms() - 86_400_000,
            ..foreign(400)
        };
        write_info(&path, &info);
        let stop = Arc::new(AtomicBool::new(false));
        let beating = {
            let (stop, path) = (stop.clone(), path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = File::options()
                        .write(true)
                        .open(&path)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let err = Lease::acquire(dir.path(), dir.path(), Duration::from_millis(400)).unwrap_err();
        assert!(matches!(err, ControllerError::LeaseHeld { .. }), "{err}");
        assert!(err.to_string().contains("node99"), "{err}");
        assert!(err.to_string().contains("heartbeat moved"), "{err}");
        stop.store(true, Ordering::Relaxed);
        beating.join().unwrap();
        // Its timestamps say "renewed just now", but nothing moves: taken over once the ttl
        // has passed on our clock.
        let still = LeaseInfo {
            renewed_at_ms: now_ms() + 86_400_000,
            ..foreign(300)
        };
        write_info(&path, &still);
        let t = std::time::Instant::now();
        let b = Lease::acquire(dir.path(), dir.path(), Duration::from_millis(300)).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "watched for the ttl"
        );
        assert_eq!(read_info(&path).owner.nonce, b.info().owner.nonce);
    }

    #[test]
    fn an_unreadable_lease_file_is_never_free_at_once_and_is_taken_over_after_the_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease.json");
        std::fs::write(&path, b"{\"owner\": tor").unwrap();
        let t = std::time::Instant::now();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_millis(300)).unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "watched for the ttl"
        );
        assert_eq!(read_info(&path).owner.nonce, a.info().owner.nonce);
        drop(a);
        assert!(!path.exists(), "released");
    }

    #[test]
    fn a_lease_of_a_dead_process_of_this_space_is_taken_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease.json");
        let dead = LeaseInfo {
            owner: crate::store::conformance::dead_owner(),
            ..foreign(3_600_000)
        };
        write_info(&path, &dead);
        let t = std::time::Instant::now();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(3600)).unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no heartbeat to wait for"
        );
        assert_eq!(read_info(&path).owner.nonce, a.info().owner.nonce);
    }

    /// Forks a child that sleeps for `secs` (only async-signal-safe calls after the fork),
    /// after locking `lock` itself when given; returns its pid once it is ready.
    fn fork_sleeper(lock: Option<&std::ffi::CStr>, secs: u32) -> libc::pid_t {
        let mut fds = [0; 2];
        // SAFETY: plain syscalls; the child only calls async-signal-safe functions on memory
        // prepared before the fork, then `_exit`s.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                if let Some(path) = lock {
                    let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                    let mut fl: libc::flock = std::mem::zeroed();
                    fl.l_type = libc::F_WRLCK as _;
                    fl.l_whence = libc::SEEK_SET as _;
                    if fd < 0 || libc::fcntl(fd, libc::F_SETLK, &fl) != 0 {
                        libc::_exit(3);
                    }
                }
                libc::write(fds[1], b"r".as_ptr().cast(), 1);
                libc::sleep(secs);
                libc::_exit(0);
            }
            let mut b = [0u8; 1];
            assert_eq!(libc::read(fds[0], b.as_mut_ptr().cast(), 1), 1);
            libc::close(fds[0]);
            libc::close(fds[1]);
            pid
        }
    }

    fn kill_and_reap(pid: libc::pid_t) {
        // SAFETY: our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }

    #[test]
    fn a_forked_child_never_keeps_its_parents_lease() {
        // The local executor may fork wrappers from the controller (without its fork
        // server); one that still holds the inherited descriptors when the controller dies
        // must not block the next controller.
        let dir = tempfile::tempdir().unwrap();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap();
        let child = fork_sleeper(None, 30);
        drop(a);
        let b = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5));
        kill_and_reap(child);
        b.expect("the lease is free once its holder lets go, whatever its children hold");
    }

    #[test]
    fn another_process_holding_the_lock_blocks_until_it_dies() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("lease.lock");
        std::fs::write(&lock, b"").unwrap();
        let path = std::ffi::CString::new(lock.to_str().unwrap()).unwrap();
        let child = fork_sleeper(Some(&path), 30);
        let err = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5));
        kill_and_reap(child);
        assert!(
            matches!(err, Err(ControllerError::LeaseHeld { .. })),
            "{err:?}"
        );
        Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5))
            .expect("free once the holder died");
    }
}
