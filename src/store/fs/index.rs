//! The done index of an [`FsStore`](super::FsStore): `ROOT/done.idx`, a cache that lets a cache
//! hit skip parsing the record.
//!
//! One line per done record seen (written by `finish`, or by a reader that parsed a done record
//! the index did not know):
//!
//! ```text
//! d2 KEY ATTEMPT WITNESSES LINEAGE RECORD LEN CHECK
//! ```
//!
//! `WITNESSES` is the digest of the record's witnesses ([`DoneHead::witnesses_digest`]),
//! `LINEAGE` the record's lineage (its job and parameters, so that a cache hit is checked to be
//! the requested run's without parsing the record; lines of format `d1`, without it, are
//! ignored and rebuilt),
//! `RECORD` the SHA-256 of `record.json`'s bytes and `LEN` their length, `CHECK` the first 16 hex
//! digits of the SHA-256 of everything before it on the line. Lines are appended with one
//! `write(2)` each (`O_APPEND`), never fsynced: the index is a cache, the record folders stay
//! the truth.
//!
//! Why it never lies: an entry is used only after `record.json` is read and its bytes hash to
//! the entry's `RECORD`, so the entry describes exactly the record on disk (the attempt and the
//! witnesses digest were computed from those very bytes). A record edited, replaced or deleted
//! behind the index fails that check and the record is parsed as without an index. A torn or
//! garbled line (a crash mid-append, interleaved appends on a network filesystem) fails `CHECK`
//! or has no newline and is ignored. A missing index is rebuilt as records are read; one with
//! many superseded lines is compacted when loaded.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Hashes a job key for the index's map: a key is a SHA-256 digest, so its first bytes are
/// uniformly spread already, and SipHash of all 32 cost more than the rest of a lookup.
#[derive(Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut first = [0u8; 8];
        let n = bytes.len().min(8);
        first[..n].copy_from_slice(&bytes[..n]);
        self.0 = self.0.rotate_left(17) ^ u64::from_ne_bytes(first);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The index in memory: the entry of each key.
pub(super) type Map = HashMap<Hash, Entry, BuildHasherDefault<KeyHasher>>;

use crate::identity::Hash;
use crate::store::{DoneHead, JobRecord, Status};

/// The index file's name in the store root.
pub(super) const INDEX_FILE: &str = "done.idx";
const TAG: &str = "d2";

/// What the index knows of one done record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) attempt: u32,
    pub(super) witnesses: Hash,
    pub(super) lineage: Hash,
    pub(super) record: Hash,
    pub(super) len: u64,
}

impl Entry {
    /// The entry of a done record with these bytes; `None` for a record that is not done.
    pub(super) fn of(rec: &JobRecord, bytes: &[u8]) -> Option<Self> {
        (rec.status == Status::Done).then(|| Entry {
            attempt: rec.attempt,
            witnesses: DoneHead::witnesses_digest(&rec.witnesses),
            lineage: rec.lineage,
            record: Hash::of(bytes),
            len: bytes.len() as u64,
        })
    }

    pub(super) fn line(&self, key: &Hash) -> String {
        let body = format!(
            "{TAG} {key} {} {} {} {} {}",
            self.attempt, self.witnesses, self.lineage, self.record, self.len
        );
        let mut check = [0u8; 16];
        format!("{body} {}\n", check_of(body.as_bytes(), &mut check))
    }
}

/// `CHECK` of a line's body: the first 16 hex digits of its SHA-256 (written into `buf`).
fn check_of<'b>(body: &[u8], buf: &'b mut [u8; 16]) -> &'b str {
    let mut hex = [0u8; Hash::HEX_LEN];
    let full = Hash::of(body).write_hex(&mut hex);
    buf.copy_from_slice(&full.as_bytes()[..16]);
    // Infallible: ASCII hex digits.
    std::str::from_utf8(buf).unwrap_or_default()
}

/// One line without its newline: `None` when it is not a well-formed, intact entry.
fn parse_line(line: &str) -> Option<(Hash, Entry)> {
    let (body, check) = line.rsplit_once(' ')?;
    let mut buf = [0u8; 16];
    if check.len() != 16 || check_of(body.as_bytes(), &mut buf) != check {
        return None;
    }
    let mut it = body.split(' ');
    if it.next()? != TAG {
        return None;
    }
    let key = it.next()?.parse().ok()?;
    let entry = Entry {
        attempt: it.next()?.parse().ok()?,
        witnesses: it.next()?.parse().ok()?,
        lineage: it.next()?.parse().ok()?,
        record: it.next()?.parse().ok()?,
        len: it.next()?.parse().ok()?,
    };
    it.next().is_none().then_some((key, entry))
}

/// The entries of an index file's bytes, later lines winning, and how many intact lines it has.
/// A last line without a newline (torn by a crash) and any damaged line are skipped.
pub(super) fn parse(bytes: &[u8]) -> (Map, usize) {
    let mut map = Map::default();
    let mut lines = 0;
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(end) => &bytes[..=end],
        None => &[][..],
    };
    for raw in complete.split(|&b| b == b'\n') {
        let Ok(text) = std::str::from_utf8(raw) else {
            continue;
        };
        if let Some((k, e)) = parse_line(text) {
            map.insert(k, e);
            lines += 1;
        }
    }
    (map, lines)
}

/// The loaded index of one store (shared by the clones of an `FsStore`).
#[derive(Debug, Clone)]
pub(super) struct DoneIndex {
    path: PathBuf,
    state: Arc<Mutex<Option<Map>>>,
}

impl DoneIndex {
    pub(super) fn new(root: &Path) -> Self {
        Self {
            path: root.join(INDEX_FILE),
            state: Arc::new(Mutex::new(None)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Map) -> T) -> T {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let map = guard.get_or_insert_with(|| self.load());
        f(map)
    }

    /// Reads the file (an unreadable one is an empty index: it is only a cache), compacting it
    /// when most of its lines are superseded.
    fn load(&self) -> Map {
        let bytes = fs::read(&self.path).unwrap_or_default();
        let (map, lines) = parse(&bytes);
        let torn = !bytes.is_empty() && bytes.last() != Some(&b'\n');
        if torn || lines > 2 * map.len() + 1024 {
            // Rewritten whole (temp + rename): a torn tail would glue itself to the next append.
            // An append racing this rewrite may be lost, which costs a re-parse, never a lie.
            let mut text = String::with_capacity(map.len() * 200);
            for (k, e) in &map {
                text.push_str(&e.line(k));
            }
            let _ = crate::fsutil::replace_file(&self.path, text.as_bytes());
        }
        map
    }

    /// Loads the file on a background thread unless it is loaded; a lookup meanwhile waits
    /// for that load (or, if it comes first, loads it itself and the thread finds it done).
    pub(super) fn preload(&self) {
        let me = self.clone();
        // Without a thread the first lookup loads it, as always.
        let _ = std::thread::Builder::new()
            .name("puzzletron-index".into())
            .spawn(move || me.with(|_| ()));
    }

    /// The entry for `key`, if the index has one (not yet checked against the record).
    pub(super) fn get(&self, key: &Hash) -> Option<Entry> {
        self.with(|m| m.get(key).copied())
    }

    /// The entry for `key` if the index is loaded and has one; never loads it (a worker that
    /// asks about one key reads that record rather than the whole index).
    pub(super) fn get_loaded(&self, key: &Hash) -> Option<Entry> {
        let guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref()?.get(key).copied()
    }

    /// Records entries of records just read: appends those a loaded index does not hold yet,
    /// in one write. Does nothing when the index is not loaded (a reader that never asked for
    /// a done head does not load it only to note what it read).
    pub(super) fn note(&self, entries: &[(Hash, Entry)]) {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(map) = guard.as_mut() else {
            return;
        };
        let text = Self::insert_new(map, entries);
        drop(guard);
        self.append(&text);
    }

    /// Records the entry of a record this process just wrote (a new attempt, so not in the
    /// index): appended whether or not the index is loaded, without loading it.
    pub(super) fn note_written(&self, key: &Hash, entry: Entry) {
        self.note_written_many(&[(*key, entry)]);
    }

    /// [`note_written`](Self::note_written) of several records, with one append.
    pub(super) fn note_written_many(&self, entries: &[(Hash, Entry)]) {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let text = match guard.as_mut() {
            Some(map) => Self::insert_new(map, entries),
            None => entries.iter().map(|(k, e)| e.line(k)).collect(),
        };
        drop(guard);
        self.append(&text);
    }

    fn insert_new(map: &mut Map, entries: &[(Hash, Entry)]) -> String {
        let mut text = String::new();
        for (k, e) in entries {
            if map.get(k) != Some(e) {
                map.insert(*k, *e);
                text.push_str(&e.line(k));
            }
        }
        text
    }

    /// Appends lines with one `write(2)` (`O_APPEND`). A failed append only costs later
    /// readers a parse.
    fn append(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Ok(mut f) = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
        {
            let _ = f.write_all(text.as_bytes());
        }
    }

    /// The head of the record at `path` when it is exactly the record `entry` describes;
    /// `None` otherwise (read the record then).
    ///
    /// # Errors
    /// The I/O error of reading the record, except that it does not exist.
    pub(super) fn verify(entry: Entry, path: &Path) -> io::Result<Option<DoneHead>> {
        Self::verify_opened(entry, File::open(path))
    }

    /// [`verify`](Self::verify) of a record the caller opened (or failed to open).
    ///
    /// # Errors
    /// As [`verify`](Self::verify).
    pub(super) fn verify_opened(
        entry: Entry,
        file: io::Result<File>,
    ) -> io::Result<Option<DoneHead>> {
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(bytes) = read_expecting(file, entry.len)? else {
            return Ok(None);
        };
        Ok((Hash::of(&bytes) == entry.record).then_some(DoneHead {
            attempt: entry.attempt,
            witnesses: entry.witnesses,
            lineage: Some(entry.lineage),
        }))
    }
}

/// The bytes of `file` if it holds exactly `len` bytes; `None` when it is of another length.
/// One buffer, no `stat`, usually one `read`: a read of a regular file that returns less than
/// asked has reached its end (read(2); only pipes, sockets and devices return short reads
/// otherwise), so asking for one byte more than `len` and getting `len` proves the length.
/// Were a filesystem ever to return a short read exactly at `len` of a longer file, the bytes
/// read would still have to hash to the indexed record: the file would be that very record
/// followed by bytes that make it unreadable JSON, never another record.
fn read_expecting(mut f: File, len: u64) -> io::Result<Option<Vec<u8>>> {
    let Ok(want) = usize::try_from(len) else {
        return Ok(None);
    };
    let mut buf = vec![0u8; want + 1];
    let mut got = 0;
    loop {
        match f.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => {
                let short = n < buf.len() - got;
                got += n;
                if got > want {
                    return Ok(None);
                }
                if short && got == want {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if got != want {
        return Ok(None);
    }
    buf.truncate(want);
    Ok(Some(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> Entry {
        Entry {
            attempt: u32::from(n),
            witnesses: Hash::of([n]),
            lineage: Hash::of([n, n, n]),
            record: Hash::of([n, n]),
            len: 100 + u64::from(n),
        }
    }

    #[test]
    fn lines_round_trip_and_later_lines_win() {
        let k = Hash::of("k");
        let text = format!("{}{}", entry(1).line(&k), entry(2).line(&k));
        let (map, lines) = parse(text.as_bytes());
        assert_eq!(lines, 2);
        assert_eq!(map.get(&k), Some(&entry(2)));
    }

    #[test]
    fn a_torn_tail_and_damaged_lines_are_ignored() {
        let (a, b, c) = (Hash::of("a"), Hash::of("b"), Hash::of("c"));
        let good = entry(1).line(&a);
        // One digit of the attempt changed: the check fails.
        let damaged = entry(2).line(&b).replacen(" 2 ", " 3 ", 1);
        let full_c = entry(3).line(&c);
        let torn = &full_c[..full_c.len() - 5];
        let text = format!("{good}{damaged}garbage\n{torn}");
        let (map, lines) = parse(text.as_bytes());
        assert_eq!(lines, 1);
        assert_eq!(map.len(), 1);
        assert_eq!(map.get(&a), Some(&entry(1)));
        // The tail without its newline is dropped even though its text would otherwise parse.
        let whole_but_unterminated = &full_c[..full_c.len() - 1];
        let (map, _) = parse(format!("{good}{whole_but_unterminated}").as_bytes());
        assert!(!map.contains_key(&c));
    }
}
