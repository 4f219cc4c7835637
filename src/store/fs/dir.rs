//! Folder handles and names opened relative to them (the `*at` calls), so that a batch of
//! reads walks two path components per record instead of the whole root path.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;

use super::io_err;
use crate::identity::Hash;
use crate::store::StoreError;

/// A handle on a folder, only to open names relative to it (`O_PATH`).
pub(super) fn open_dir(dir: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_PATH)
        .open(dir)
}

/// Empties the file at `path` in one `truncate(2)`; a missing file, or any error, is ignored.
pub(super) fn truncate(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) {
        // SAFETY: `c` is a NUL-terminated path that lives for the call.
        unsafe { libc::truncate(c.as_ptr(), 0) };
    }
}

/// Opens `name` relative to the folder handle `dir`, read-only.
pub(super) fn open_at(dir: &File, name: &std::ffi::CStr) -> io::Result<File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // SAFETY: `name` is NUL-terminated, and `dir` is an open descriptor for the call.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by openat and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens `KEY` + `tail` relative to the folder handle `dir`, read-only; `tail` ends with the
/// NUL and holds no other (`b"\0"`, `b"/record.json\0"`; at most 16 bytes), so nothing is
/// allocated.
pub(super) fn open_key_at<const N: usize>(
    dir: &File,
    key: &Hash,
    tail: &[u8; N],
) -> io::Result<File> {
    let mut name = [0u8; 80];
    let mut hex = [0u8; Hash::HEX_LEN];
    name[..Hash::HEX_LEN].copy_from_slice(key.write_hex(&mut hex).as_bytes());
    name[Hash::HEX_LEN..Hash::HEX_LEN + N].copy_from_slice(tail);
    let c = std::ffi::CStr::from_bytes_with_nul(&name[..Hash::HEX_LEN + N])
        .map_err(io::Error::other)?;
    open_at(dir, c)
}

/// Opens `KEY/record.json` relative to the `jobs/` folder handle `dir`, read-only.
pub(super) fn open_record_at(dir: &File, key: &Hash) -> io::Result<File> {
    open_key_at(dir, key, b"/record.json\0")
}

/// The entry names of a folder.
/// Whether listing `dir` once costs less than asking for `asked` names in it one by one: a
/// listing reads every entry (on ext4 an htree walk, ~10 µs an entry on this project's VM), a
/// missing name costs one failed `open` (~2 µs). The entries are estimated from the folder's
/// size (ext4 and xfs give whole directory blocks; about 80 bytes an entry of a 64-character
/// name); a folder that cannot be read is listed (the listing then names the error).
pub(super) fn worth_listing(dir: &Path, asked: usize) -> bool {
    match fs::metadata(dir) {
        Ok(m) => m.len() / 80 < asked as u64 / 4,
        Err(_) => true,
    }
}

pub(super) fn list_names(dir: &Path) -> Result<HashSet<String>, StoreError> {
    let mut names = HashSet::new();
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        names.insert(
            e.map_err(io_err(dir))?
                .file_name()
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_listed_only_when_the_names_asked_outnumber_its_entries() {
        let d = tempfile::tempdir().unwrap();
        // An empty folder (one block, or less on tmpfs): listing beats 10k failed opens.
        assert!(worth_listing(d.path(), 10_000));
        // A folder that cannot be read is listed, so that the listing names the error.
        assert!(worth_listing(&d.path().join("missing"), 1));
        // A large folder: a small batch of names is asked one by one.
        for i in 0..2000 {
            fs::create_dir(d.path().join(format!("{i:064x}"))).unwrap();
        }
        assert!(!worth_listing(d.path(), 64));
        assert!(worth_listing(d.path(), 1_000_000));
    }
}
