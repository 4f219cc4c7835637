//! Crash-safe file writes shared by the stores and the campaign journal.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How much a write must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Durability {
    /// A crash of the process *or of the machine* leaves the old file or the new one: the temp
    /// file and the folder are `fsync`ed (about 2 fsyncs, milliseconds on a disk).
    Power,
    /// A crash of the process leaves the old file or the new one (the page cache survives it);
    /// after a machine crash the file may be the old one, the new one, or empty. For state that
    /// only matters while its writer lives (claims, running records, task files).
    Process,
}

/// Writes `bytes` to `path` atomically: a unique temp file in the same folder, `fsync`, `rename`
/// over `path`, `fsync` of the folder. A crash at any instant leaves the old file or the new one.
///
/// # Errors
/// The first I/O error; the temp file is removed on failure.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_file(path, bytes, Durability::Power)
}

/// Writes `bytes` to `path` by temp file and rename, without fsync ([`Durability::Process`]).
///
/// # Errors
/// The first I/O error; the temp file is removed on failure.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_file(path, bytes, Durability::Process)
}

/// Writes `bytes` to `path` atomically with the given durability (a unique temp file in the same
/// folder, renamed over `path`).
///
/// # Errors
/// The first I/O error; the temp file is removed on failure.
pub(crate) fn write_file(path: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let dir = parent_of(path);
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        if durability == Durability::Power {
            f.sync_all()?;
        }
        drop(f);
        fs::rename(&tmp, path)?;
        match durability {
            Durability::Power => sync_dir(dir),
            Durability::Process => Ok(()),
        }
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The folder `path` is in (`.` for a bare name).
pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// A temp name for `path` in its folder, unique in this process and among processes
/// (`.NAME.tmp.PID.SEQ`): see [`is_temp_name`].
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    parent_of(path).join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Makes everything written to the filesystem that holds `dir` durable, in one call
/// (`syncfs(2)`, Linux): the files written and renamed since, with their folders. A group
/// commit's flush: one call instead of an `fsync` per file and per folder. It also flushes
/// other writers' dirty data on that filesystem, so its time grows with theirs.
///
/// # Errors
/// The error of opening `dir` or of `syncfs`; [`io::ErrorKind::Unsupported`] where there is no
/// `syncfs` (the caller then syncs file by file).
pub(crate) fn sync_filesystem(dir: &Path) -> io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::fd::AsRawFd;
        let f = File::open(dir)?;
        // SAFETY: `f` is an open descriptor for the duration of the call.
        if unsafe { libc::syncfs(f.as_raw_fd()) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        let _ = dir;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// `fsync`s a folder so a rename or create inside it is durable.
///
/// # Errors
/// The I/O error of opening or syncing the folder.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether a name is one of [`atomic_write`]'s temp files (readers skip them).
pub(crate) fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp.")
}
