//! One controller per campaign: a lease in `<campaign>/controller/`.
//!
//! Two layers: an advisory POSIX record lock (`fcntl(F_SETLK)`, see fcntl(2)) on `lease.lock`,
//! released by the kernel when the holder dies, even by `kill -9`, so a crashed controller
//! never blocks its successor on the same host; and `lease.json` naming the holder ([`Owner`]: host, pid, process start time) with a
//! heartbeat, for holders on other hosts of a shared file system. A background thread renews
//! the heartbeat every `ttl / 4`, independently of the control loop, so a slow step (a long
//! `sbatch`, a slow poll) can never let the lease lapse. If the file ever names someone else,
//! the lease is *lost* and the controller stops ([`Lease::check`]).
//!
//! Why a record lock and not `flock(2)`: a flock belongs to the open file description, which a
//! forked child shares. The local executor forks its wrappers from the controller, and a
//! wrapper not yet past closing its inherited descriptors kept a dead controller's lease held
//! (its successor was refused). A record lock belongs to the process and is never inherited
//! (fcntl(2): "record locks are not inherited by a child created via fork"). Record locks do
//! not exclude within one process, so a process-wide registry does that.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ControllerError;
use crate::executor::now_ms;
use crate::store::Owner;

/// The content of `lease.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseInfo {
    /// The holder.
    pub owner: Owner,
    /// When it was taken (ms since the Unix epoch).
    pub acquired_at_ms: u64,
    /// Last heartbeat (ms since the Unix epoch).
    pub renewed_at_ms: u64,
    /// After how long without a heartbeat a holder on another host is presumed dead (ms).
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

/// Takes a write lock on the whole file without waiting; `false` when another process holds
/// a lock on it.
fn try_lock(file: &File) -> bool {
    // SAFETY: an all-zero `flock` struct is valid; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 0; // to the end of the file, however it grows
    // SAFETY: fcntl on a valid open fd with a pointer to a live, initialized struct.
    unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) == 0 }
}

fn read_info(path: &Path) -> Result<Option<LeaseInfo>, ControllerError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| ControllerError::Corrupt {
                path: path.to_path_buf(),
                line: 0,
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ControllerError::io("reading lease", path, e)),
    }
}

fn write_info(path: &Path, info: &LeaseInfo) -> std::io::Result<()> {
    let bytes = serde_json::to_vec_pretty(info).map_err(std::io::Error::other)?;
    crate::fsutil::atomic_write(path, &bytes)
}

impl Lease {
    /// Takes the lease of the campaign whose controller folder is `dir`.
    ///
    /// # Errors
    /// [`ControllerError::LeaseHeld`] naming the holder when a live controller holds it (on
    /// this host: it holds the lock; elsewhere: its heartbeat is younger than its ttl).
    pub fn acquire(campaign: &Path, dir: &Path, ttl: Duration) -> Result<Lease, ControllerError> {
        let lock_path = dir.join("lease.lock");
        let file = dir.join("lease.json");
        let held = |info: Option<LeaseInfo>| ControllerError::LeaseHeld {
            campaign: campaign.to_path_buf(),
            holder: info.map_or_else(
                || "a process that has not written lease.json yet".into(),
                |i| i.to_string(),
            ),
            lease: file.clone(),
        };
        // Checked before opening: closing any descriptor of the file would drop the record
        // lock this process already holds on it.
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let registered =
            Registered::take(key).ok_or_else(|| held(read_info(&file).ok().flatten()))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ControllerError::io("opening", &lock_path, e))?;
        if !try_lock(&lock) {
            return Err(held(read_info(&file).ok().flatten()));
        }
        if let Some(old) = read_info(&file)? {
            let fresh = now_ms().saturating_sub(old.renewed_at_ms) < old.ttl_ms;
            if old.owner.alive_here().is_none() && fresh {
                return Err(held(Some(old)));
            }
        }
        let now = now_ms();
        let info = LeaseInfo {
            owner: Owner::current(),
            acquired_at_ms: now,
            renewed_at_ms: now,
            ttl_ms: ttl.as_millis() as u64,
        };
        write_info(&file, &info).map_err(|e| ControllerError::io("writing lease", &file, e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(std::sync::Mutex::new(None));
        let file2 = file.clone();
        let thread = {
            let (stop, lost, file, mut info) =
                (stop.clone(), lost.clone(), file.clone(), info.clone());
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
                        match read_info(&file) {
                            Ok(Some(cur)) if cur.owner != info.owner => {
                                *lost.lock().unwrap_or_else(|p| p.into_inner()) =
                                    Some(cur.to_string());
                                return;
                            }
                            _ => {}
                        }
                        info.renewed_at_ms = now_ms();
                        // A failed renewal is retried at the next period; the ttl is 4 periods.
                        let _ = write_info(&file, &info);
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
            let _ = std::fs::remove_file(&self.file);
        }
        // The record lock goes with the file descriptor, the registry entry after it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn heartbeat_is_renewed_and_theft_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let a = Lease::acquire(dir.path(), dir.path(), Duration::from_millis(400)).unwrap();
        let first = a.info().renewed_at_ms;
        std::thread::sleep(Duration::from_millis(350));
        let now = read_info(&dir.path().join("lease.json")).unwrap().unwrap();
        assert!(now.renewed_at_ms > first);
        a.check().unwrap();
        let mut thief = now.clone();
        thief.owner.nonce = "someone-else".into();
        write_info(&dir.path().join("lease.json"), &thief).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let err = a.check().unwrap_err();
        assert!(err.to_string().contains("someone-else"), "{err}");
    }

    #[test]
    fn a_fresh_lease_of_another_host_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let mut owner = Owner::current();
        owner.host = "node99".into();
        let info = LeaseInfo {
            owner,
            acquired_at_ms: now_ms(),
            renewed_at_ms: now_ms(),
            ttl_ms: 60_000,
        };
        write_info(&dir.path().join("lease.json"), &info).unwrap();
        let err = Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap_err();
        assert!(err.to_string().contains("node99"), "{err}");
        // A stale one does not.
        let stale = LeaseInfo {
            renewed_at_ms: 0,
            ..info
        };
        write_info(&dir.path().join("lease.json"), &stale).unwrap();
        Lease::acquire(dir.path(), dir.path(), Duration::from_secs(5)).unwrap();
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
