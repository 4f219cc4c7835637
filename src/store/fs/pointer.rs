//! Lineage pointers of an [`FsStore`](super::FsStore): `ROOT/lineage/LINEAGE` names the key a
//! lineage (job name + parameters) last started or reused.
//!
//! A pointer is a symbolic link whose target is [`TAG`] then the key in unpadded URL-safe
//! base64 (RFC 4648 §5): 46 bytes, short enough to live in the inode itself (ext4 keeps a
//! target under 60 bytes there, a "fast symlink"; other filesystems have the same limit or
//! larger). Writing one is one `symlink(2)` and reading it one `readlink(2)`, with no data
//! block: a file holding the key cost `openat`, `write`, `close` and a block to allocate, zero
//! and flush, for every run of a first pass.
//!
//! Pointers written by earlier versions, or on a filesystem without symlinks, are regular files
//! holding the key in hex and a line end; they are read as well, and replaced by a link when
//! the pointer moves where links can be made. A version that
//! only knows files reads a link as no pointer (its target names no file).

use std::fs;
use std::io::{self, Read};
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::identity::Hash;

/// What a link target starts with (the pointer format's version).
const TAG: &str = "k1.";
/// The target's length: the tag and 43 base64 digits.
const TARGET_LEN: usize = 46;
// Fits in the inode (ext4 keeps targets under 60 bytes there).
const _: () = assert!(TARGET_LEN < 60);

/// The link target naming `key`.
fn target(key: &Hash) -> String {
    let mut t = String::with_capacity(TARGET_LEN);
    t.push_str(TAG);
    URL_SAFE_NO_PAD.encode_string(key.as_bytes(), &mut t);
    t
}

/// The key a link target names; `None` when it is not one this module wrote.
fn parse_target(t: &[u8]) -> Option<Hash> {
    let digits = t.strip_prefix(TAG.as_bytes())?;
    let mut key = [0u8; 32];
    match URL_SAFE_NO_PAD.decode_slice(digits, &mut key) {
        Ok(32) => Some(Hash::from_bytes(key)),
        _ => None,
    }
}

/// Reads the pointer at `path`: `Ok(None)` when there is none, or one being written (a file
/// without its line end).
///
/// # Errors
/// The I/O error, except that the pointer does not exist; `Err(InvalidData)` with the reason
/// when a link or file there does not name a key.
pub(super) fn read(path: &Path) -> io::Result<Option<Hash>> {
    match fs::read_link(path) {
        Ok(t) => parse_target(t.as_os_str().as_encoded_bytes())
            .map(Some)
            .ok_or_else(|| bad(format!("link target {t:?} is not `{TAG}` and a base64 key"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        // EINVAL: not a link, a pointer file of an earlier version.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => read_file(path),
        Err(e) => Err(e),
    }
}

/// [`read`] of the pointer of `lineage` relative to the `lineage/` folder handle `dir`: one
/// `readlinkat(2)` that walks one name, where `read` walks the whole root path (a drain of
/// cache hits checks one pointer per hit; `perf`: a fifth less time in the kernel's readlink).
/// `path` gives the same pointer's full path, asked for only for a pointer file of an earlier
/// version.
///
/// # Errors
/// As [`read`].
pub(super) fn read_at(
    dir: &fs::File,
    lineage: &Hash,
    path: impl FnOnce() -> std::path::PathBuf,
) -> io::Result<Option<Hash>> {
    use std::os::fd::AsRawFd;
    let mut name = [0u8; Hash::HEX_LEN + 1];
    let mut hex = [0u8; Hash::HEX_LEN];
    name[..Hash::HEX_LEN].copy_from_slice(lineage.write_hex(&mut hex).as_bytes());
    // One byte more than a target of ours: a longer one reads as cut, and is refused as not
    // ours, as `read` refuses it whole.
    let mut buf = [0u8; TARGET_LEN + 1];
    // SAFETY: `name` is NUL-terminated (its last byte stays 0), `buf` is writable for its
    // length, and `dir` is an open descriptor for the call.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr().cast(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            // Not a link: a pointer file of an earlier version.
            Some(libc::EINVAL) => read_file(&path()),
            _ => Err(e),
        };
    }
    let t = &buf[..n.unsigned_abs()];
    parse_target(t).map(Some).ok_or_else(|| {
        bad(format!(
            "link target {:?} is not `{TAG}` and a base64 key",
            String::from_utf8_lossy(t)
        ))
    })
}

/// A pointer file of an earlier version: the key in hex and a line end.
fn read_file(path: &Path) -> io::Result<Option<Hash>> {
    let mut buf = Vec::with_capacity(2 * Hash::HEX_LEN);
    match fs::File::open(path) {
        Ok(mut f) => f.read_to_end(&mut buf)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // A file without its line end is one being written, or one a machine crash cut (pointers
    // are not synced): no pointer yet.
    if !buf.ends_with(b"\n") {
        return Ok(None);
    }
    std::str::from_utf8(&buf)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .map(Some)
        .ok_or_else(|| bad("expected a job key in hex and a line end".into()))
}

fn bad(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

/// Points `path` at `key`: a new link, or an atomic replace (a link at a temp name renamed
/// over the old pointer) when one exists. Not synced: a pointer lost to a machine crash reads
/// as none, or as the one before.
///
/// # Errors
/// The I/O error of the link or the rename.
pub(super) fn write(path: &Path, key: &Hash) -> io::Result<()> {
    let t = target(key);
    match std::os::unix::fs::symlink(&t, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let tmp = crate::fsutil::temp_path(path);
            let linked = std::os::unix::fs::symlink(&t, &tmp).or_else(|e| {
                if e.kind() != io::ErrorKind::AlreadyExists {
                    return Err(e);
                }
                // Left by a writer that died, or a writer of the same pid on another host.
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&t, &tmp)
            });
            match linked {
                Ok(()) => fs::rename(&tmp, path).inspect_err(|_| {
                    let _ = fs::remove_file(&tmp);
                }),
                Err(e) if no_links(&e) => write_file(path, key),
                Err(e) => Err(e),
            }
        }
        Err(e) if no_links(&e) => write_file(path, key),
        Err(e) => Err(e),
    }
}

/// The filesystem makes no symlinks (vfat, SMB without `mfsymlinks`, some FUSE mounts).
fn no_links(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS)
    )
}

/// A pointer as earlier versions wrote it, where there are no symlinks: the key in hex and a
/// line end, created in place or replaced atomically.
fn write_file(path: &Path, key: &Hash) -> io::Result<()> {
    use std::io::Write as _;
    let line = format!("{key}\n");
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
    {
        Ok(mut f) => f.write_all(line.as_bytes()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            crate::fsutil::replace_file(path, line.as_bytes())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_is_a_fast_symlink_that_round_trips_and_moves() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let (a, b) = (Hash::of("a"), Hash::of("b"));
        assert_eq!(read(&p).unwrap(), None);
        write(&p, &a).unwrap();
        let t = fs::read_link(&p).unwrap();
        assert_eq!(t.as_os_str().len(), TARGET_LEN);
        assert_eq!(read(&p).unwrap(), Some(a));
        write(&p, &b).unwrap();
        assert_eq!(read(&p).unwrap(), Some(b));
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temp link is left");
    }

    #[test]
    fn an_earlier_versions_pointer_file_is_read_and_replaced_by_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        let (a, b) = (Hash::of("a"), Hash::of("b"));
        fs::write(&p, format!("{a}\n")).unwrap();
        assert_eq!(read(&p).unwrap(), Some(a));
        // Cut before its line end: being written, or cut by a crash.
        fs::write(&p, format!("{a}")).unwrap();
        assert_eq!(read(&p).unwrap(), None);
        write(&p, &b).unwrap();
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        assert_eq!(read(&p).unwrap(), Some(b));
    }

    #[test]
    fn a_pointer_naming_no_key_is_an_error_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::os::unix::fs::symlink("k1.short", &p).unwrap();
        let e = read(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("k1.short"), "{e}");
        let q = dir.path().join("f");
        fs::write(&q, "not a key\n").unwrap();
        assert!(read(&q).unwrap_err().to_string().contains("hex"));
    }

    #[test]
    fn a_pointer_read_at_its_folder_reads_as_read_does() {
        let dir = tempfile::tempdir().unwrap();
        let handle = super::super::dir::open_dir(dir.path()).unwrap();
        let (l, a) = (Hash::of("lineage"), Hash::of("a"));
        let p = dir.path().join(l.to_hex());
        let at = || read_at(&handle, &l, || p.clone());
        assert_eq!(at().unwrap(), None);
        write(&p, &a).unwrap();
        assert_eq!(at().unwrap(), Some(a));
        // An earlier version's pointer file, whole and cut.
        fs::remove_file(&p).unwrap();
        fs::write(&p, format!("{a}\n")).unwrap();
        assert_eq!(at().unwrap(), Some(a));
        fs::write(&p, format!("{a}")).unwrap();
        assert_eq!(at().unwrap(), None);
        // A link naming no key, short or one byte longer than ours: refused with its target.
        for bad in ["k1.short".to_string(), format!("{}x", target(&a))] {
            fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink(&bad, &p).unwrap();
            let e = at().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert_eq!(read(&p).unwrap_err().kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("k1."), "{e}");
        }
    }
}
