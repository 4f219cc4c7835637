//! Crash-safe file writes shared by the stores and the campaign journal.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to `path` atomically: a unique temp file in the same folder, `fsync`, `rename`
/// over `path`, `fsync` of the folder. A crash at any instant leaves the old file or the new one.
///
/// # Errors
/// The first I/O error; the temp file is removed on failure.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `fsync`s a folder so a rename or create inside it is durable.
///
/// # Errors
/// The I/O error of opening or syncing the folder.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Whether a name is one of [`atomic_write`]'s temp files (readers skip them).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp.")
}
