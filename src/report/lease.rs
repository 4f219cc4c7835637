//! [`LeaseStatus`]: whether a controller holds a campaign's lease, found without taking it.
//!
//! Two probes, matching the two layers of
//! [`controller::lease`](crate::campaign::controller::lease): `fcntl(F_GETLK)` on
//! `lease.lock` opened read-only (it asks the kernel which process holds the record lock on
//! this host without acquiring it; fcntl(2)), and `lease.json`'s holder and heartbeat for a
//! holder on another host of a shared file system (held while the heartbeat is younger than
//! its ttl). Nothing is created or written.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ReportError;
use crate::campaign::controller::LeaseInfo;

/// What the probe found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// A live controller holds the lease.
    pub held: bool,
    /// The pid holding the record lock on this host, when one does.
    pub lock_pid: Option<i32>,
    /// The holder `lease.json` names (the current holder when `held`, else the last one).
    pub info: Option<LeaseInfo>,
}

impl LeaseStatus {
    /// Probes the lease of the controller folder `ctl` (`<campaign>/controller`).
    ///
    /// # Errors
    /// [`ReportError::Corrupt`] for a `lease.json` that does not parse; [`ReportError::Io`]
    /// for read errors other than a missing file.
    pub fn probe(ctl: &Path) -> Result<Self, ReportError> {
        let json = ctl.join("lease.json");
        let info: Option<LeaseInfo> = match std::fs::read(&json) {
            Ok(b) => Some(
                serde_json::from_slice(&b).map_err(|e| ReportError::Corrupt {
                    path: json.clone(),
                    line: None,
                    reason: format!("not a lease record: {e}"),
                })?,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ReportError::io("reading lease", &json, e)),
        };
        let lock = ctl.join("lease.lock");
        let lock_pid = match File::open(&lock) {
            Ok(f) => lock_holder(&f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ReportError::io("opening", &lock, e)),
        };
        let here = crate::store::hostname();
        let remote_fresh = info.as_ref().is_some_and(|i| {
            i.owner.host != here && now_ms().saturating_sub(i.renewed_at_ms) < i.ttl_ms
        });
        Ok(LeaseStatus {
            held: lock_pid.is_some() || remote_fresh,
            lock_pid,
            info,
        })
    }

    /// One line for people: who holds it and since when, or that nobody does.
    pub fn describe(&self) -> String {
        let now = now_ms();
        match (&self.info, self.held) {
            (Some(i), true) => format!(
                "held by {} since {} ({} ago), heartbeat {} s ago",
                i.owner,
                super::svg::utc(i.acquired_at_ms),
                super::svg::duration(now.saturating_sub(i.acquired_at_ms)),
                now.saturating_sub(i.renewed_at_ms) / 1000
            ),
            (None, true) => format!(
                "held by pid {} (it has not written lease.json yet)",
                self.lock_pid.unwrap_or(0)
            ),
            (Some(i), false) => format!(
                "not held (last holder {}, last heartbeat {})",
                i.owner,
                super::svg::utc(i.renewed_at_ms)
            ),
            (None, false) => "not held (no controller is running)".to_string(),
        }
    }
}

/// The pid of another process holding a lock on `file`, if any (`F_GETLK`; never acquires).
fn lock_holder(file: &File) -> Option<i32> {
    // SAFETY: an all-zero `flock` struct is valid; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 0;
    // SAFETY: fcntl on a valid open fd with a pointer to a live, initialized struct.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    (rc == 0 && i32::from(fl.l_type) != libc::F_UNLCK).then_some(fl.l_pid)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_lease_file_is_not_held_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("lease.lock"), b"").unwrap();
        let st = LeaseStatus::probe(dir.path()).unwrap();
        assert!(!st.held);
        assert_eq!(st.lock_pid, None);
        assert_eq!(st.describe(), "not held (no controller is running)");
        // The probe created nothing.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
