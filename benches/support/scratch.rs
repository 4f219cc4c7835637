//! Bench scratch folders on filesystems that avoid reusing freed inodes.
//!
//! ext4 without a journal (this project's CI machines) skips, one by one, every inode of a
//! block group freed in the last 60 s (up to 360 s while its inode table block is dirty) when
//! it allocates a new one (`recently_deleted()`, `fs/ext4/ialloc.c`). A bench that deletes its
//! tens of thousands of scratch files therefore slows every file created in the next minutes:
//! measured here, a creation costs 30 us, and 530 us right after 20k frees. So a bench never
//! deletes before or between its measurements ([`Scratch::fresh`] moves the last run's folder
//! aside and [`Scratch::discard`] deletes both at the end), records when it deleted, and the
//! next bench waits for that to age out ([`settle`]) before it measures, instead of reporting
//! the cleanup as its own cost.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::target_dir;

/// How long after a bench's deletions its next measurement waits on ext4 without a journal:
/// `RECENTCY_MIN + RECENTCY_DIRTY` in `fs/ext4/ialloc.c` is 360 s, but after `hot_paths`'
/// cleanup (a quarter of a million files, on a filesystem mounted with `discard`) an
/// `executor_local` run 6 minutes later still ran 74 isolated jobs/s against 177-216 ten
/// minutes later, so the wait is 10 minutes; `PUZZLETRON_BENCH_SETTLE_S` overrides it (0:
/// never wait).
const SETTLE: Duration = Duration::from_secs(600);

/// Where benches record when they last deleted scratch files (Unix seconds).
fn stamp() -> PathBuf {
    target_dir().join("bench-scratch/.last-deletion")
}

/// A bench's scratch folder for this run, and last run's, moved aside to delete at the end.
pub struct Scratch {
    pub dir: PathBuf,
    old: PathBuf,
}

impl Scratch {
    /// `target/bench-scratch/<name>`, empty; last run's folder of that name is moved aside.
    pub fn fresh(name: &str) -> Scratch {
        let dir = target_dir().join("bench-scratch").join(name);
        let old = target_dir().join(format!("bench-scratch/{name}.old.{}", std::process::id()));
        if dir.exists() {
            std::fs::rename(&dir, &old).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, old }
    }

    /// Deletes this run's folder and last run's, and records when (see [`settle`]); with
    /// `PUZZLETRON_BENCH_KEEP=1` keeps both (to inspect them, or to measure again at once).
    pub fn discard(self) {
        if std::env::var_os("PUZZLETRON_BENCH_KEEP").is_some() {
            eprintln!("kept {} and {}", self.dir.display(), self.old.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_dir_all(&self.old);
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let _ = std::fs::write(stamp(), now.as_secs().to_string());
    }
}

/// Waits, printing why, until a bench's last deletions are [`SETTLE`] old, where `dir` is on
/// ext4 without a journal. Returns what it waited.
pub fn settle(dir: &Path) -> Duration {
    let settle = std::env::var("PUZZLETRON_BENCH_SETTLE_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(SETTLE);
    let last = std::fs::read_to_string(stamp())
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
    let Some(last) = last else {
        return Duration::ZERO;
    };
    let age = SystemTime::now().duration_since(last).unwrap_or_default();
    if age >= settle || !ext4_without_journal(dir) {
        return Duration::ZERO;
    }
    let wait = settle - age;
    eprintln!(
        "waiting {} s before measuring: a bench deleted its scratch files {} s ago, and ext4 \
         without a journal slows file creation for minutes after many deletions \
         (PUZZLETRON_BENCH_SETTLE_S=0 to skip)",
        wait.as_secs(),
        age.as_secs()
    );
    std::thread::sleep(wait);
    wait
}

/// Whether `dir` is on an ext4 filesystem that has no journal: its mount (the longest mount
/// point above it in `/proc/self/mountinfo`) is ext4 and `/proc/fs/jbd2/` lists no journal of
/// its device.
fn ext4_without_journal(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    // Fields: id parent major:minor root mount-point options ... - fstype source super-options
    let best = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            dir.starts_with(mount)
                .then(|| (mount.len(), fstype.to_string(), source.to_string()))
        })
        .max_by_key(|(len, _, _)| *len);
    let Some((_, fstype, source)) = best else {
        return false;
    };
    if fstype != "ext4" {
        return false;
    }
    let dev = source.rsplit('/').next().unwrap_or_default().to_string();
    let journaled = std::fs::read_dir("/proc/fs/jbd2")
        .map(|d| {
            d.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{dev}-"))
            })
        })
        .unwrap_or(false);
    !journaled
}
