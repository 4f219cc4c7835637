//! [`LeaseStatus`]: whether a controller holds a campaign's lease, found without taking it.
//!
//! Two probes, matching the two layers of
//! [`controller::lease`](crate::campaign::controller::lease): `fcntl(F_GETLK)` on
//! `lease.lock` opened read-only (it asks the kernel which process holds the record lock on
//! this host without acquiring it; fcntl(2)), and `lease.json`'s holder, judged by the store's
//! rules (`store/liveness.rs`): a holder proved dead from here does not hold it; any other
//! holder does, since a one-shot probe cannot watch a heartbeat, and nothing is declared free
//! without proof (a controller taking the lease watches it, see
//! [`Lease::acquire`](crate::campaign::controller::Lease::acquire)). A `lease.json` that cannot
//! be read is reported as such, never an error. Nothing is created or written.

use crate::sys::now_ms;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ReportError;
use crate::campaign::controller::LeaseInfo;
use crate::store::Liveness;

/// What the probe found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// A controller holds the lease, or may: the record lock is held, or `lease.json` names a
    /// holder (or cannot be read) that cannot be proved dead from here.
    pub held: bool,
    /// The pid holding the record lock, when a process this one can see holds it.
    pub lock_pid: Option<i32>,
    /// The record lock is held by a process this one cannot see (another PID namespace:
    /// `F_GETLK` answers pid 0): it cannot be signalled from here.
    #[serde(default)]
    pub lock_elsewhere: bool,
    /// The holder `lease.json` names (the current holder when `held`, else the last one).
    pub info: Option<LeaseInfo>,
    /// Why `lease.json` could not be read as a lease, when it exists but does not parse.
    #[serde(default)]
    pub unreadable: Option<String>,
}

impl LeaseStatus {
    /// Probes the lease of the controller folder `ctl` (`<campaign>/controller`).
    ///
    /// # Errors
    /// [`ReportError::Io`] for read errors other than a missing file (an unreadable
    /// `lease.json` is reported in [`unreadable`](Self::unreadable), not an error).
    pub fn probe(ctl: &Path) -> Result<Self, ReportError> {
        let json = ctl.join("lease.json");
        let (info, unreadable) = match crate::campaign::controller::lease::read_lease(&json) {
            Ok(Some(f)) => match f.info {
                Ok(i) => (Some(i), None),
                Err(why) => (None, Some(why)),
            },
            Ok(None) => (None, None),
            Err(e) => return Err(ReportError::io("reading lease", &json, e)),
        };
        let lock = ctl.join("lease.lock");
        let holder = match File::open(&lock) {
            Ok(f) => lock_holder(&f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ReportError::io("opening", &lock, e)),
        };
        let lock_pid = holder.filter(|&p| p > 0);
        let lock_elsewhere = holder == Some(0);
        let named = info
            .as_ref()
            .is_some_and(|i| i.owner.liveness() != Liveness::Dead);
        Ok(LeaseStatus {
            held: holder.is_some() || named || unreadable.is_some(),
            lock_pid,
            lock_elsewhere,
            info,
            unreadable,
        })
    }

    /// One line for people: who holds it and since when, or that nobody does.
    pub fn describe(&self) -> String {
        let now = now_ms();
        if let Some(why) = &self.unreadable {
            return format!(
                "held or stale: lease.json cannot be read ({why}); a controller taking the lease \
                 waits for it to stand unchanged for the lease's ttl"
            );
        }
        match (&self.info, self.held) {
            (Some(i), true) => {
                let mut line = format!(
                    "held by {} since {} ({} ago), heartbeat {} s ago",
                    i.owner,
                    super::svg::utc(i.acquired_at_ms),
                    super::svg::duration(now.saturating_sub(i.acquired_at_ms)),
                    now.saturating_sub(i.renewed_at_ms) / 1000
                );
                if self.lock_pid.is_none() && !self.lock_elsewhere {
                    line.push_str(
                        " (its lock is not held here: it cannot be proved alive or dead from \
                         here; a controller taking the lease waits for its heartbeat to stand \
                         still for the ttl)",
                    );
                }
                line
            }
            (None, true) => match self.lock_pid {
                Some(pid) => format!("held by pid {pid} (it has not written lease.json yet)"),
                None => "held by a process in another PID namespace".to_string(),
            },
            (Some(i), false) => format!(
                "not held (last holder {}, last heartbeat {})",
                i.owner,
                super::svg::utc(i.renewed_at_ms)
            ),
            (None, false) => "not held (no controller is running)".to_string(),
        }
    }
}

/// The pid of another process holding a lock on `file`, if any (`F_GETLK`; never acquires):
/// 0 for a holder outside this process's PID namespace.
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

    fn write(dir: &Path, body: &[u8]) {
        std::fs::write(dir.join("lease.json"), body).unwrap();
    }

    fn lease_of(owner: crate::store::Owner) -> Vec<u8> {
        serde_json::to_vec(&LeaseInfo {
            owner,
            acquired_at_ms: 1,
            renewed_at_ms: 1,
            ttl_ms: 30_000,
        })
        .unwrap()
    }

    #[test]
    fn a_lease_is_free_only_when_its_holder_is_proved_dead_never_by_its_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        // Renewed (by its clock) long ago, of a dead process of this space: not held.
        write(
            dir.path(),
            &lease_of(crate::store::conformance::dead_owner()),
        );
        let st = LeaseStatus::probe(dir.path()).unwrap();
        assert!(!st.held, "{st:?}");
        assert!(
            st.describe().starts_with("not held (last holder"),
            "{}",
            st.describe()
        );
        // The same timestamps from another PID namespace: it may live; held, and said why.
        let mut other = crate::store::conformance::dead_owner();
        other.pidns = Some("pid:[4026532811]".into());
        write(dir.path(), &lease_of(other));
        let st = LeaseStatus::probe(dir.path()).unwrap();
        assert!(st.held, "{st:?}");
        let said = st.describe();
        assert!(said.contains("PID namespace pid:[4026532811]"), "{said}");
        assert!(
            said.contains("cannot be proved alive or dead from here"),
            "{said}"
        );
    }

    #[test]
    fn an_unreadable_lease_file_is_reported_never_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), b"{\"owner\": nonsense");
        let st = LeaseStatus::probe(dir.path()).unwrap();
        assert!(st.held, "never free at once");
        let said = st.describe();
        assert!(said.contains("lease.json cannot be read"), "{said}");
        assert!(said.contains("ttl"), "{said}");
    }
}
