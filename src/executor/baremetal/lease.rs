//! The GPU lease file: which attempt holds which GPUs of which host, and the attempts waiting
//! for GPUs. One JSON file under the campaign folder, changed only under an exclusive lock
//! (`<file>.lock`) and replaced atomically (temp file, fsync, rename), so a controller killed at
//! any instant leaves the old table or the new one and a fresh process picks up where it was.
//!
//! Placement is first-fit in inventory order: an attempt needing `g` GPUs on one host takes the
//! first host (not down, not held whole) with `g` free GPUs, the lowest free indices; an attempt
//! without GPUs goes to the host with the fewest live attempts; an attempt over `n > 1` hosts
//! takes `n` hosts that hold nothing else, whole (every GPU). Torchrun groups spanning hosts get
//! the lowest rendezvous port at or above the inventory's `rendezvous_port_base` that no live
//! lease uses (all rendezvous endpoints are on `rendezvous_host`, so ports never collide there).
//! A host named by the spec's `--exclude=` directive (the campaign controller's excluded nodes,
//! as Slurm gets them) is never chosen ([`excluded_hosts`]).

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::super::{AttemptId, AttemptSpec, ExecutorError};

/// File name of the lease table in the executor's state folder.
pub(crate) const LEASE_FILE: &str = "gpu-leases.json";

/// One host of the inventory, as the lease table sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HostSlots {
    /// SSH host name.
    pub host: String,
    /// GPUs on the host (indices `0..gpus`).
    pub gpus: u32,
}

/// Where one attempt runs on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Slice {
    /// The host.
    pub host: String,
    /// GPU indices leased on it (`CUDA_VISIBLE_DEVICES`).
    pub gpus: Vec<u32>,
}

/// An attempt in the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The spec (kept so a fresh process can launch an attempt that was waiting for GPUs).
    pub spec: AttemptSpec,
    /// Submission time, ms since the Unix epoch.
    pub submitted_at_ms: u64,
    /// Hosts and GPUs, in node-rank order; empty while waiting for GPUs.
    pub slices: Vec<Slice>,
    /// Whether the attempt holds its hosts whole (multi-host instances).
    pub whole: bool,
    /// Rendezvous port on the inventory's rendezvous host (multi-host torchrun groups).
    pub rdzv_port: Option<u16>,
    /// The attempt ended (or was cancelled): its GPUs are free again. Kept so `find` still
    /// answers for it.
    pub released: bool,
    /// Cancelled before it got GPUs (it never ran).
    #[serde(default)]
    pub cancelled: bool,
    /// Reported `NODE_FAIL` because a host stayed unreachable: its GPUs stay leased until the
    /// host answers again and the task is confirmed killed there (it may still be running).
    #[serde(default)]
    pub lost: bool,
}

impl Lease {
    /// Whether it holds GPUs or hosts now.
    pub fn is_live(&self) -> bool {
        !self.released && !self.slices.is_empty()
    }
}

/// The hosts `spec` must not run on: every `--exclude=LIST` (or `--exclude LIST`, `-x LIST`)
/// entry of its scheduler directives, LIST a Slurm hostlist (`h[1-2],h5`). The campaign
/// controller writes the nodes it excluded, and a unit's retry the nodes of its fast failure,
/// there for every executor.
pub(super) fn excluded_hosts(spec: &AttemptSpec) -> BTreeSet<String> {
    spec.scheduler
        .extra_directives
        .iter()
        .filter_map(|d| {
            let d = d.trim();
            d.strip_prefix("--exclude=")
                .or_else(|| d.strip_prefix("--exclude "))
                .or_else(|| d.strip_prefix("-x "))
        })
        .flat_map(|list| crate::executor::expand_hostlist(list.trim()))
        .collect()
}

/// The whole table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LeaseTable {
    /// Format version (1).
    pub version: u32,
    /// Attempts in submission order.
    pub leases: Vec<Lease>,
}

impl LeaseTable {
    /// The entry of `id`.
    pub fn get(&self, id: &AttemptId) -> Option<&Lease> {
        self.leases.iter().find(|l| &l.attempt_id == id)
    }

    /// The entry of `id`, mutable.
    pub fn get_mut(&mut self, id: &AttemptId) -> Option<&mut Lease> {
        self.leases.iter_mut().find(|l| &l.attempt_id == id)
    }

    /// GPUs in use on `host`.
    fn used(&self, host: &str) -> BTreeSet<u32> {
        self.leases
            .iter()
            .filter(|l| l.is_live())
            .flat_map(|l| l.slices.iter())
            .filter(|s| s.host == host)
            .flat_map(|s| s.gpus.iter().copied())
            .collect()
    }

    fn live_on(&self, host: &str) -> usize {
        self.leases
            .iter()
            .filter(|l| l.is_live() && l.slices.iter().any(|s| s.host == host))
            .count()
    }

    fn held_whole(&self, host: &str) -> bool {
        self.leases
            .iter()
            .any(|l| l.is_live() && l.whole && l.slices.iter().any(|s| s.host == host))
    }

    /// Places every waiting attempt that fits now, in submission order (a large attempt that
    /// does not fit lets smaller later ones go first). Returns the ids placed.
    pub fn place_waiting(
        &mut self,
        hosts: &[HostSlots],
        down: &BTreeSet<String>,
        port_base: u16,
    ) -> Vec<AttemptId> {
        let mut placed = Vec::new();
        for i in 0..self.leases.len() {
            let l = &self.leases[i];
            if l.released || !l.slices.is_empty() {
                continue;
            }
            let nodes = l.spec.topology.nodes as usize;
            let need = l.spec.topology.gpus_per_node();
            let multi = nodes > 1;
            let avoid = excluded_hosts(&l.spec);
            let up = hosts
                .iter()
                .filter(|h| !down.contains(&h.host) && !avoid.contains(&h.host));
            let slices: Option<Vec<Slice>> = if multi {
                let free: Vec<Slice> = up
                    .filter(|h| self.live_on(&h.host) == 0 && h.gpus >= need)
                    .take(nodes)
                    .map(|h| Slice {
                        host: h.host.clone(),
                        gpus: (0..h.gpus).collect(),
                    })
                    .collect();
                (free.len() == nodes).then_some(free)
            } else if need == 0 {
                up.filter(|h| !self.held_whole(&h.host))
                    .min_by_key(|h| self.live_on(&h.host))
                    .map(|h| {
                        vec![Slice {
                            host: h.host.clone(),
                            gpus: Vec::new(),
                        }]
                    })
            } else {
                up.filter(|h| !self.held_whole(&h.host))
                    .find_map(|h| {
                        let used = self.used(&h.host);
                        let free: Vec<u32> = (0..h.gpus)
                            .filter(|g| !used.contains(g))
                            .take(need as usize)
                            .collect();
                        (free.len() == need as usize).then(|| Slice {
                            host: h.host.clone(),
                            gpus: free,
                        })
                    })
                    .map(|s| vec![s])
            };
            let Some(slices) = slices else { continue };
            let rdzv_port = multi.then(|| {
                let used: BTreeSet<u16> = self
                    .leases
                    .iter()
                    .filter(|l| l.is_live())
                    .filter_map(|l| l.rdzv_port)
                    .collect();
                (port_base..=u16::MAX)
                    .find(|p| !used.contains(p))
                    .unwrap_or(port_base)
            });
            let l = &mut self.leases[i];
            l.slices = slices;
            l.whole = multi;
            l.rdzv_port = rdzv_port;
            placed.push(l.attempt_id.clone());
        }
        placed
    }
}

/// The lease file of one state folder.
#[derive(Debug, Clone)]
pub(super) struct LeaseFile {
    path: PathBuf,
    lock_path: PathBuf,
}

impl LeaseFile {
    /// The lease file in `dir` (created on first write).
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(LEASE_FILE),
            lock_path: dir.join(format!("{LEASE_FILE}.lock")),
        }
    }

    /// Reads the table without the lock (a consistent old or new version: it is replaced by
    /// rename).
    pub(super) fn read(&self) -> Result<LeaseTable, ExecutorError> {
        match std::fs::read(&self.path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| ExecutorError::Parse {
                command: format!("reading {}", self.path.display()),
                detail: format!("not a lease table: {e}"),
                output: String::from_utf8_lossy(&b).chars().take(200).collect(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LeaseTable {
                version: 1,
                leases: Vec::new(),
            }),
            Err(e) => Err(ExecutorError::io(
                "reading the GPU lease file",
                &self.path,
                e,
            )),
        }
    }

    /// Runs `f` on the table under the exclusive lock and writes the result atomically when
    /// `f` says it changed something.
    pub(super) fn update<R>(
        &self,
        f: impl FnOnce(&mut LeaseTable) -> (bool, R),
    ) -> Result<R, ExecutorError> {
        // In-process exclusion that does not depend on the filesystem's locks.
        static UPDATING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = UPDATING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = self.lock_path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ExecutorError::io("creating the executor state folder", dir, e))?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock_path)
            .map_err(|e| ExecutorError::io("opening the GPU lease lock", &self.lock_path, e))?;
        lock_file(&lock, &self.lock_path)?;
        let mut table = self.read()?;
        table.version = 1;
        let (changed, r) = f(&mut table);
        if changed {
            let bytes = serde_json::to_vec_pretty(&table).map_err(|e| ExecutorError::Other {
                message: format!("cannot serialize the GPU lease table: {e}"),
                retryable: false,
            })?;
            crate::fsutil::atomic_write(&self.path, &bytes)
                .map_err(|e| ExecutorError::io("writing the GPU lease file", &self.path, e))?;
        }
        drop(lock);
        Ok(r)
    }
}

/// Locks the table's lock file. Where the filesystem has no `flock` (Lustre mounted without
/// `-o flock` answers `ENOSYS`; `ENOLCK`, `EOPNOTSUPP` elsewhere) the lock is skipped: only the
/// controller holding the campaign's lease (whose exclusion never depends on locks) changes the
/// table, and this process's own updates are serialized by `update`
/// (P04 in `docs/evidence.md`).
fn lock_file(f: &File, path: &Path) -> Result<(), ExecutorError> {
    match f.lock() {
        Ok(()) => Ok(()),
        Err(e)
            if e.kind() == std::io::ErrorKind::Unsupported
                || matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSYS) | Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP)
                ) =>
        {
            Ok(())
        }
        Err(e) => Err(ExecutorError::io("locking the GPU lease file", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{CommandSpec, GpuRequest, TaskTopology};

    fn spec(id: &str, nodes: u32, gpus: u32) -> AttemptSpec {
        let mut t = TaskTopology::single();
        t.nodes = nodes;
        t.gpus = if gpus == 0 {
            GpuRequest::None
        } else {
            GpuRequest::PerNode(gpus)
        };
        AttemptSpec::new(AttemptId::new(id).unwrap(), CommandSpec::new("true")).with_topology(t)
    }

    fn add(t: &mut LeaseTable, id: &str, nodes: u32, gpus: u32) {
        t.leases.push(Lease {
            attempt_id: AttemptId::new(id).unwrap(),
            spec: spec(id, nodes, gpus),
            submitted_at_ms: 0,
            slices: Vec::new(),
            whole: false,
            rdzv_port: None,
            released: false,
            cancelled: false,
            lost: false,
        });
    }

    fn hosts(n: usize) -> Vec<HostSlots> {
        (1..=n)
            .map(|i| HostSlots {
                host: format!("h{i}"),
                gpus: 4,
            })
            .collect()
    }

    #[test]
    fn first_fit_disjoint_slices_whole_hosts_and_ports() {
        let mut t = LeaseTable::default();
        add(&mut t, "a", 1, 3);
        add(&mut t, "b", 1, 2);
        add(&mut t, "c", 1, 1);
        add(&mut t, "m1", 2, 4);
        add(&mut t, "m2", 2, 4);
        add(&mut t, "late", 1, 4);
        let placed = t.place_waiting(&hosts(4), &BTreeSet::new(), 29500);
        fn get(t: &LeaseTable, id: &str) -> Lease {
            t.get(&AttemptId::new(id).unwrap()).unwrap().clone()
        }
        assert_eq!(
            get(&t, "a").slices,
            vec![Slice {
                host: "h1".into(),
                gpus: vec![0, 1, 2]
            }]
        );
        assert_eq!(
            get(&t, "b").slices,
            vec![Slice {
                host: "h2".into(),
                gpus: vec![0, 1]
            }]
        );
        assert_eq!(
            get(&t, "c").slices,
            vec![Slice {
                host: "h1".into(),
                gpus: vec![3]
            }]
        );
        // Only h3 and h4 are empty: m1 takes them whole, m2 waits.
        assert_eq!(
            get(&t, "m1")
                .slices
                .iter()
                .map(|x| x.host.as_str())
                .collect::<Vec<_>>(),
            ["h3", "h4"]
        );
        assert!(get(&t, "m1").whole);
        assert_eq!(get(&t, "m1").rdzv_port, Some(29500));
        assert!(get(&t, "m2").slices.is_empty());
        // `late` (4 GPUs) fits nowhere: h1 full, h2 has 2 free, h3/h4 held whole.
        assert!(get(&t, "late").slices.is_empty());
        assert_eq!(placed.len(), 4);
        // Free a and b: m2 still needs two empty hosts (h1 holds c), late takes h2.
        for id in ["a", "b"] {
            t.get_mut(&AttemptId::new(id).unwrap()).unwrap().released = true;
        }
        t.place_waiting(&hosts(4), &BTreeSet::new(), 29500);
        assert!(get(&t, "m2").slices.is_empty());
        assert_eq!(get(&t, "late").slices[0].host, "h2");
        // Free c and late: m2 gets h1+h2 and the next port.
        for id in ["c", "late"] {
            t.get_mut(&AttemptId::new(id).unwrap()).unwrap().released = true;
        }
        t.place_waiting(&hosts(4), &BTreeSet::new(), 29500);
        assert_eq!(get(&t, "m2").rdzv_port, Some(29501));
        // Disjointness over every live lease.
        let mut seen = BTreeSet::new();
        for l in t.leases.iter().filter(|l| l.is_live()) {
            for sl in &l.slices {
                for g in &sl.gpus {
                    assert!(seen.insert((sl.host.clone(), *g)), "{} {g} twice", sl.host);
                }
            }
        }
    }

    #[test]
    fn down_hosts_and_cpu_tasks() {
        let mut t = LeaseTable::default();
        for i in 0..8 {
            add(&mut t, &format!("cpu{i}"), 1, 0);
        }
        add(&mut t, "g", 1, 4);
        let down: BTreeSet<String> = ["h1".to_string()].into();
        t.place_waiting(&hosts(3), &down, 29500);
        let on = |h: &str| {
            t.leases
                .iter()
                .filter(|l| l.slices.iter().any(|s| s.host == h))
                .count()
        };
        assert_eq!(on("h1"), 0);
        assert_eq!(
            on("h2"),
            5,
            "cpu tasks spread, the GPU task first-fit on h2"
        );
        assert_eq!(on("h3"), 4);
    }

    /// Issue 27: a host the campaign excluded (`--exclude=` in the spec's directives) is never
    /// leased, for one-host GPU and CPU attempts and multi-host groups; an attempt that fits
    /// only on excluded hosts waits (the executor refuses it at submit, see `validate`).
    #[test]
    fn excluded_hosts_are_never_placed() {
        let mut t = LeaseTable::default();
        let excl = |t: &mut LeaseTable, id: &str, nodes: u32, gpus: u32, d: &str| {
            add(t, id, nodes, gpus);
            let l = t.leases.last_mut().unwrap();
            l.spec.scheduler.extra_directives = vec!["--constraint=x".into(), d.into()];
        };
        excl(&mut t, "g", 1, 4, "--exclude=h1");
        for i in 0..4 {
            excl(&mut t, &format!("cpu{i}"), 1, 0, "--exclude=h[1-2]");
        }
        excl(&mut t, "m", 2, 4, "--exclude h3");
        excl(&mut t, "nowhere", 1, 1, "-x h1,h2,h3,h4");
        t.place_waiting(&hosts(4), &BTreeSet::new(), 29500);
        let hosts_of = |t: &LeaseTable, id: &str| -> Vec<String> {
            t.get(&AttemptId::new(id).unwrap())
                .unwrap()
                .slices
                .iter()
                .map(|s| s.host.clone())
                .collect()
        };
        assert_eq!(hosts_of(&t, "g"), ["h2"]);
        for i in 0..4 {
            let h = hosts_of(&t, &format!("cpu{i}"));
            assert!(h == ["h3"] || h == ["h4"], "cpu{i} on {h:?}");
        }
        // h1 and h4 are the only hosts not excluded for m, but h4 holds CPU tasks: it waits,
        // never taking h3.
        assert!(hosts_of(&t, "m").is_empty());
        assert!(hosts_of(&t, "nowhere").is_empty());
        for i in 0..4 {
            t.get_mut(&AttemptId::new(format!("cpu{i}")).unwrap())
                .unwrap()
                .released = true;
        }
        t.place_waiting(&hosts(4), &BTreeSet::new(), 29500);
        assert_eq!(hosts_of(&t, "m"), ["h1", "h4"]);
        assert!(hosts_of(&t, "nowhere").is_empty());
        assert_eq!(
            excluded_hosts(&t.get(&AttemptId::new("nowhere").unwrap()).unwrap().spec),
            ["h1", "h2", "h3", "h4"].map(String::from).into()
        );
    }

    #[test]
    fn file_update_is_atomic_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = LeaseFile::new(dir.path());
        assert!(f.read().unwrap().leases.is_empty());
        f.update(|t| {
            add(t, "x", 1, 1);
            (true, ())
        })
        .unwrap();
        assert_eq!(f.read().unwrap().leases.len(), 1);
        std::fs::write(dir.path().join(LEASE_FILE), b"{not json").unwrap();
        let e = f.read().unwrap_err().to_string();
        assert!(e.contains(LEASE_FILE), "{e}");
    }
}
