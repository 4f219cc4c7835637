//! [`FsStore::set_aside`](crate::Store::set_aside) under one lock per store:
//! `ROOT/corrupt/repair.lock`, created exclusively (`O_EXCL`) with its holder's [`Owner`].
//!
//! Two drains that both planned a corrupt run as "repair" must not both move its folder: the
//! second would move the first one's fresh folder (a running or done record) aside and run the
//! job again. So the record is read again under the lock and moved only if it is still
//! corrupt.
//!
//! A lock left by a killed process is judged as claim files are (see `claim`): one of this
//! process is live; one whose holder is proved dead from here ([`Liveness::Dead`]) is taken
//! over at once; every other one (another host, boot or PID namespace, or a file that names no
//! owner) once this handle has seen it unchanged for the store's stale interval. A holder keeps
//! the lock for a read and a rename, far below that interval, so it never heartbeats it. A
//! takeover renames the lock to a name of its own and checks it moved the very file it judged
//! (`move_aside_if_unchanged`); release does the same with its own lock, so no lock is ever
//! removed by name after a check.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::claim::{FsOp, create_claim, gone, read_owner};
use super::{FsStore, io_err};
use crate::store::liveness::{Beat, Liveness, move_aside_if_unchanged, read_beat, unique_token};
use crate::store::{Owner, StoreError};

/// The lock's name in `ROOT/corrupt/`.
pub(super) const REPAIR_LOCK: &str = "repair.lock";
/// How often a waiter looks at the lock again: a holder keeps it for milliseconds.
const POLL: Duration = Duration::from_millis(5);

/// The held repair lock; released (moved to a tomb of ours, then removed) on drop.
pub(super) struct RepairLock {
    path: PathBuf,
    /// What our lock file looked like once written: release removes only that file.
    beat: Beat,
}

impl Drop for RepairLock {
    fn drop(&mut self) {
        let tomb = self
            .path
            .with_file_name(format!("{REPAIR_LOCK}.released.{}", unique_token()));
        // `Ok(false)`: it is not ours any more (taken over as stale: we were stopped longer
        // than the stale interval), and was put back for its new holder.
        if let Ok(true) = move_aside_if_unchanged(&self.path, &tomb, self.beat) {
            let _ = std::fs::remove_file(&tomb);
        }
    }
}

impl FsStore {
    /// Takes the repair lock in `aside` (`ROOT/corrupt/`, which exists), waiting for a live
    /// holder and taking over a stale one (see the module docs).
    pub(super) fn repair_lock(&self, aside: &Path) -> Result<RepairLock, StoreError> {
        let path = aside.join(REPAIR_LOCK);
        let owner = Owner::current();
        // Said once per wait, so a repair that waits on a lock is never silent.
        let mut said = false;
        loop {
            self.inject(FsOp::RepairLock, &path, Ok(()))
                .map_err(io_err(&path))?;
            match create_claim(&path, &owner) {
                Ok(()) => {
                    let (beat, _) = read_beat(&path).map_err(io_err(&path))?;
                    self.watch.forget(&path);
                    return Ok(RepairLock { path, beat });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
            // Judge what holds it; look again at once when it is gone.
            let (beat, holder) = match read_beat(&path) {
                Ok((beat, _)) => (beat, read_owner(&path)),
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(io_err(&path)(e)),
            };
            let stale = match &holder {
                Ok(Some(o)) => match o.liveness() {
                    Liveness::Ours => false,
                    Liveness::Dead => true,
                    _ => self.watch.unchanged_for(&path, beat) >= self.stale_after,
                },
                Err(e) if gone(e) => continue,
                // Empty (its writer between `open` and `write`, or killed there) or not an
                // owner: nobody to ask, only the heartbeat decides.
                Ok(None) | Err(_) => self.watch.unchanged_for(&path, beat) >= self.stale_after,
            };
            if stale {
                let tomb = aside.join(format!("{REPAIR_LOCK}.stale.{}", unique_token()));
                if move_aside_if_unchanged(&path, &tomb, beat).map_err(io_err(&path))? {
                    tracing::warn!(lock = %path.display(), "took over a stale repair lock");
                    self.watch.forget(&path);
                    let _ = std::fs::remove_file(&tomb);
                }
                continue;
            }
            if !said {
                said = true;
                tracing::warn!(
                    lock = %path.display(),
                    holder = %match &holder {
                        Ok(Some(o)) => o.to_string(),
                        _ => "unknown (empty or unreadable lock file)".to_string(),
                    },
                    stale_after_s = self.stale_after.as_secs(),
                    "waiting for the repair lock: taken over if its holder is proved dead, or once it stays unchanged for the stale interval"
                );
            }
            std::thread::sleep(POLL);
        }
    }
}
