//! The floor of `FsStore`'s per-run protocol (issue 32): the bare syscalls a run needs, with no
//! store code around them. Shared by `store_floor` (alone) and `hot_paths` (beside the store's
//! own figures, in the same run).

use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Runs per group commit: the sweep's `COMMIT_BATCH`.
pub const BATCH: usize = 64;

/// A record of the size of `hot_paths`' trivial run's done record (1286 bytes).
const RECORD: &[u8] = &[b'x'; 1286];

/// `syncfs(2)` of the file system holding `dir`.
pub fn syncfs(dir: &Path) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(fd >= 0, "open {}", dir.display());
    // SAFETY: `fd` is open.
    let rc = unsafe { libc::syncfs(fd) };
    assert_eq!(rc, 0, "syncfs");
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
}

/// Seconds per run of each step of a miss, then of the whole: (mkdir, temp file write,
/// symlink, first syncfs share, rename, second syncfs share, total). In batches of [`BATCH`]
/// as the group commit does them: every temp file written, one `syncfs` (the records
/// durable), every rename, a second `syncfs` (the renames durable). The first `syncfs` is what
/// keeps a crash from leaving an empty `record.json` in place of the running one; the bare
/// floor of the issue counts one.
pub fn misses(root: &Path, n: usize) -> [f64; 7] {
    let jobs = root.join("jobs");
    let lineage = root.join("lineage");
    fs::create_dir_all(&jobs).unwrap();
    fs::create_dir_all(&lineage).unwrap();
    let mut t = [0.0f64; 6];
    let mut lap = |k: usize, since: &mut Instant| {
        let now = Instant::now();
        t[k] += (now - *since).as_secs_f64();
        *since = now;
    };
    let all = Instant::now();
    let ids: Vec<usize> = (0..n).collect();
    for batch in ids.chunks(BATCH) {
        let mut at = Instant::now();
        let mut dirs = Vec::with_capacity(batch.len());
        for &i in batch {
            let dir = jobs.join(format!("{i:064x}"));
            fs::create_dir(&dir).unwrap();
            lap(0, &mut at);
            let tmp = dir.join(".record.json.tmp");
            fs::File::create(&tmp).unwrap().write_all(RECORD).unwrap();
            lap(1, &mut at);
            symlink(
                // 46 bytes, as the store's pointer target: kept in the inode.
                format!("k1.{i:043x}"),
                lineage.join(format!("{i:064x}")),
            )
            .unwrap();
            lap(2, &mut at);
            dirs.push(dir);
        }
        syncfs(root);
        lap(3, &mut at);
        for dir in &dirs {
            fs::rename(dir.join(".record.json.tmp"), dir.join("record.json")).unwrap();
        }
        lap(4, &mut at);
        syncfs(root);
        lap(5, &mut at);
    }
    let total = all.elapsed().as_secs_f64();
    let per = n as f64;
    [
        t[0] / per,
        t[1] / per,
        t[2] / per,
        t[3] / per,
        t[4] / per,
        t[5] / per,
        total / per,
    ]
}

/// Seconds per run of a hit: (open + read + close of the record, stat of the record). Each
/// opened relative to a handle on `jobs/`, as the store opens them (one walk of two names).
pub fn hits(root: &Path, n: usize) -> [f64; 2] {
    use std::os::fd::{AsRawFd, FromRawFd};
    let jobs = root.join("jobs");
    let dir = fs::File::open(&jobs).unwrap();
    let names: Vec<CString> = (0..n)
        .map(|i| CString::new(format!("{i:064x}/record.json")).unwrap())
        .collect();
    // One byte more than the record: a single `read` that returns less proves its end, as the
    // store reads a record.
    let mut buf = vec![0u8; RECORD.len() + 1];
    let t = Instant::now();
    for name in &names {
        // SAFETY: `name` is NUL-terminated and `dir` is open for the call.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "openat {name:?}");
        // SAFETY: `fd` was just opened and is owned by nothing else.
        let mut f = unsafe { fs::File::from_raw_fd(fd) };
        assert_eq!(f.read(&mut buf).unwrap(), RECORD.len());
    }
    let read = t.elapsed().as_secs_f64();
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| jobs.join(format!("{i:064x}/record.json")))
        .collect();
    let t = Instant::now();
    for p in &paths {
        std::hint::black_box(fs::metadata(p).unwrap());
    }
    let stat = t.elapsed().as_secs_f64();
    [read / n as f64, stat / n as f64]
}
