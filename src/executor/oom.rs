//! Out-of-memory evidence from cgroup counters (N09): a task killed by signal 9 was killed by
//! the kernel's OOM killer only if the `oom_kill` counter of its memory cgroup rose while it
//! ran. A signal alone proves nothing (`kill -9` by a user, a walltime, a cancel).
//!
//! Counters read:
//! - cgroup v2: `memory.events` of the task's cgroup (`oom`, `oom_kill`, `oom_group_kill`;
//!   Linux `Documentation/admin-guide/cgroup-v2.rst`, "memory.events");
//! - cgroup v1: `memory.oom_control` of its memory cgroup, whose `oom_kill` line exists since
//!   Linux 4.13 (`Documentation/admin-guide/cgroup-v1/memory.rst`).
//!
//! Where neither counter can be read, the verdict is [`OomEvidence::Unknown`] and the status
//! says "OOM unknown": never a guess either way.

use std::path::{Path, PathBuf};

/// The counters of one `memory.events` (v2) or `memory.oom_control` (v1) file. A counter the
/// file does not have is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct MemoryEvents {
    /// Times the cgroup hit its limit and the OOM path ran (v2 `oom`).
    pub oom: Option<u64>,
    /// Processes the OOM killer killed in the cgroup (`oom_kill`, v2 and v1 ≥ 4.13).
    pub oom_kill: Option<u64>,
    /// Times the whole cgroup was killed at once (v2 `oom_group_kill`, Linux ≥ 5.17).
    pub oom_group_kill: Option<u64>,
}

/// Parses `key value` lines; unknown keys (`low`, `high`, `max`, `oom_kill_disable`,
/// `under_oom`) and malformed lines are skipped, so a newer kernel's file still parses.
pub(crate) fn parse_memory_events(text: &str) -> MemoryEvents {
    let mut ev = MemoryEvents::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v), None) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let Ok(v) = v.parse::<u64>() else { continue };
        match k {
            "oom" => ev.oom = Some(v),
            "oom_kill" => ev.oom_kill = Some(v),
            "oom_group_kill" => ev.oom_group_kill = Some(v),
            _ => {}
        }
    }
    ev
}

/// What the counters say about a task that died.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum OomEvidence {
    /// The OOM killer killed in the task's cgroup while it ran: `(before, after)` of the
    /// counter that rose (`oom_kill`, else `oom_group_kill`).
    OomKilled {
        /// Counter value when the task started.
        before: u64,
        /// Counter value after it ended.
        after: u64,
    },
    /// The counters are readable and did not move: not an OOM kill.
    NotOom,
    /// No `oom_kill` counter before or after (no cgroup, an old kernel, no access).
    Unknown,
}

/// Compares the counters taken when the task started and after it ended.
pub(crate) fn oom_verdict(before: &MemoryEvents, after: &MemoryEvents) -> OomEvidence {
    let rose = |b: Option<u64>, a: Option<u64>| match (b, a) {
        (Some(b), Some(a)) if a > b => Some((b, a)),
        _ => None,
    };
    if let Some((before, after)) = rose(before.oom_kill, after.oom_kill)
        .or_else(|| rose(before.oom_group_kill, after.oom_group_kill))
    {
        return OomEvidence::OomKilled { before, after };
    }
    if before.oom_kill.is_some() && after.oom_kill.is_some() {
        OomEvidence::NotOom
    } else {
        OomEvidence::Unknown
    }
}

/// The counter file of the memory cgroup that `/proc/<pid>/cgroup` names (`self` for this
/// process), under the cgroup mount `root` (normally `/sys/fs/cgroup`): the v2 `memory.events`
/// when the unified hierarchy has one for that cgroup, else the v1 `memory/…/memory.oom_control`.
/// `None` when neither exists.
pub(crate) fn counter_file(proc_cgroup: &str, root: &Path) -> Option<PathBuf> {
    let rel = |p: &str| p.trim_start_matches('/').to_string();
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_cgroup.lines() {
        // hierarchy-ID:controller-list:cgroup-path (cgroups(7))
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() {
            v2 = Some(root.join(rel(path)).join("memory.events"));
        } else if ctrl.split(',').any(|c| c == "memory") {
            v1 = Some(
                root.join("memory")
                    .join(rel(path))
                    .join("memory.oom_control"),
            );
        }
    }
    v2.filter(|p| p.is_file()).or(v1.filter(|p| p.is_file()))
}

/// The counter file of this process's memory cgroup (which a child it forks inherits).
pub(crate) fn own_counter_file() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    counter_file(&text, Path::new("/sys/fs/cgroup"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four forms of N09 (`docs/evidence.md`).
    #[test]
    fn n09_cases() {
        let table: &[(&str, &str, &str, OomEvidence)] = &[
            (
                "1: oom_kill rose",
                "oom 0\noom_kill 0\n",
                "oom 1\noom_kill 1\n",
                OomEvidence::OomKilled {
                    before: 0,
                    after: 1,
                },
            ),
            (
                "2: signal 9, counters unchanged",
                "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n",
                "low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n",
                OomEvidence::NotOom,
            ),
            (
                "3: oom 0, oom_kill 1, oom_group_kill 1",
                "oom 0\noom_kill 0\noom_group_kill 0\n",
                "oom 0\noom_kill 1\noom_group_kill 1\n",
                OomEvidence::OomKilled {
                    before: 0,
                    after: 1,
                },
            ),
            (
                "4: no oom_kill line",
                "oom 0\n",
                "oom 1\n",
                OomEvidence::Unknown,
            ),
            ("no file at all", "", "", OomEvidence::Unknown),
            (
                "v1 memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n",
                OomEvidence::OomKilled {
                    before: 4,
                    after: 5,
                },
            ),
            (
                "group kill alone",
                "oom_group_kill 2\n",
                "oom_group_kill 3\n",
                OomEvidence::OomKilled {
                    before: 2,
                    after: 3,
                },
            ),
            (
                "garbage lines are skipped",
                "oom_kill x\noom_kill 1 2\n\u{0}\noom_kill 7",
                "oom_kill 7\n",
                OomEvidence::NotOom,
            ),
        ];
        for (case, before, after, want) in table {
            let got = oom_verdict(&parse_memory_events(before), &parse_memory_events(after));
            assert_eq!(&got, want, "{case}");
        }
    }

    #[test]
    fn counter_file_prefers_v2_and_falls_back_to_v1() {
        let root = tempfile::tempdir().unwrap();
        let v1 = root.path().join("memory/job/7");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.oom_control"), "oom_kill 0\n").unwrap();
        let hybrid = "12:memory:/job/7\n0::/user.slice/t1\n";
        assert_eq!(
            counter_file(hybrid, root.path()),
            Some(v1.join("memory.oom_control")),
            "no v2 memory.events there: v1"
        );
        let v2 = root.path().join("user.slice/t1");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.events"), "oom_kill 0\n").unwrap();
        assert_eq!(
            counter_file(hybrid, root.path()),
            Some(v2.join("memory.events"))
        );
        assert_eq!(counter_file("4:cpu:/x\n", root.path()), None);
        assert_eq!(counter_file("garbage", root.path()), None);
    }
}
