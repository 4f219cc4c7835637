//! One controller per campaign: a lease in `<campaign>/controller/`.
//!
//! Two layers: an advisory `flock(2)` on `lease.lock` (released by the kernel when the holder
//! dies, even by `kill -9`, so a crashed controller never blocks its successor on the same
//! host), and `lease.json` naming the holder ([`Owner`]: host, pid, process start time) with a
//! heartbeat, for holders on other hosts of a shared file system. A background thread renews
//! the heartbeat every `ttl / 4`, independently of the control loop, so a slow step (a long
//! `sbatch`, a slow poll) can never let the lease lapse. If the file ever names someone else,
//! the lease is *lost* and the controller stops ([`Lease::check`]).

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
    info: LeaseInfo,
    stop: Arc<AtomicBool>,
    lost: Arc<std::sync::Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
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
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| ControllerError::io("opening", &lock_path, e))?;
        // SAFETY: flock on a valid open fd; no memory is shared with the kernel.
        let rc = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        let held = |info: Option<LeaseInfo>| ControllerError::LeaseHeld {
            campaign: campaign.to_path_buf(),
            holder: info.map_or_else(
                || "a process that has not written lease.json yet".into(),
                |i| i.to_string(),
            ),
            lease: file.clone(),
        };
        if rc != 0 {
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
        // The flock goes with the file descriptor.
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
}
