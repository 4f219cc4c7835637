//! The buffered metric sink of [`FsStore`](super::FsStore): rows are formatted into a buffer and
//! written with one `write(2)` per batch, not per row.
//!
//! A batch reaches the OS when it holds [`FLUSH_ROWS`] rows, when its oldest row is
//! [`FLUSH_INTERVAL`] old (the process's one flusher thread, started with the first buffered
//! row of any sink, sees to that even when the job logs nothing more), when the job marks a step boundary
//! ([`Run::flush`](crate::Run::flush)), and when the attempt ends (then it is also
//! fsynced before the done record is written). A process killed in between loses at most the
//! unflushed batch; a batch torn by a power loss leaves a torn last line, which readers drop
//! with a warning ([`FsStore::attempt_metrics`](super::FsStore::attempt_metrics)).
//!
//! The file is created with the first batch written. A done attempt that ends before any batch
//! was written (no step mark, no row left 0.5 s in the buffer), with at most [`INLINE_BYTES`]
//! of rows, gets no file: [`MetricSink::seal`] hands its rows to its record
//! ([`MetricsInfo::inline`]), which is fsynced anyway, so such a run costs one file and one
//! `fdatasync` less. Its rows then reach the disk with the record, at the end.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use crate::store::{MetricSink, MetricsInfo, StoreError, check_metric_name};

/// Rows a batch holds before it is written, whatever its age.
pub const FLUSH_ROWS: usize = 4096;
/// The longest a logged row waits in the buffer before it is written to the OS.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// A batch this many bytes long is written even below [`FLUSH_ROWS`] (long metric names).
const FLUSH_BYTES: usize = 1 << 18;
/// The most bytes of rows an attempt keeps in its record instead of a file: about 40 rows, and
/// little next to the ~1 KiB a record holds anyway (a cache hit hashes the record's bytes).
pub const INLINE_BYTES: usize = 1024;

struct State {
    /// Created with the first batch written (see the module docs).
    file: Option<File>,
    buf: Vec<u8>,
    /// Rows in `buf`.
    pending: usize,
    /// When the oldest row of `buf` was logged.
    oldest: Option<Instant>,
    /// A write that failed in the flusher thread, reported by the next call.
    failed: Option<io::Error>,
    closed: bool,
}

struct Shared {
    path: PathBuf,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes the buffered rows to `path`, creating it with the first batch; on failure the rows
/// not written stay buffered (a later flush retries them).
fn write_out(path: &Path, st: &mut State) -> io::Result<()> {
    if st.buf.is_empty() {
        return Ok(());
    }
    let file = match &mut st.file {
        Some(f) => f,
        None => st.file.insert(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)?,
        ),
    };
    write_draining(file, &mut st.buf)?;
    st.pending = 0;
    st.oldest = None;
    Ok(())
}

/// Writes `buf` to `w` and removes what was written, also when a later write fails (N12:
/// ENOSPC or EFBIG after a partial write). A retry then continues at the first unwritten
/// byte: the file never holds a row twice, nor a torn row in its middle (which would make
/// every row after it unreadable), only, at worst, a torn last row the reader drops.
fn write_draining(w: &mut impl Write, buf: &mut Vec<u8>) -> io::Result<()> {
    let mut done = 0;
    let r = loop {
        if done == buf.len() {
            break Ok(());
        }
        match w.write(&buf[done..]) {
            Ok(0) => {
                break Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "the metric file accepted no more bytes",
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    buf.drain(..done);
    r
}

/// The process's one flusher thread and the sinks it watches. One thread for all sinks: a
/// thread per sink cost a thread start per run in a first pass of trivial runs.
struct Flusher {
    sinks: Mutex<Watch>,
    wake: Condvar,
}

/// What the flusher watches, under its lock.
struct Watch {
    sinks: Vec<Weak<Shared>>,
    /// The flusher waits with no deadline (no sink has rows pending). Otherwise it is awake or
    /// waits until a deadline at most [`FLUSH_INTERVAL`] after its last scan, and a row newer
    /// than that scan is due no earlier: nobody needs to wake it (a row that raced the scan is
    /// flushed at most that race late). A wake per run was a context switch per run on a sweep
    /// of short runs.
    idle: bool,
}

impl Flusher {
    /// The flusher, its thread started on first use; `None` when no thread can be started
    /// (rows then reach the file by count, step mark and attempt end).
    fn get() -> Option<&'static Flusher> {
        static FLUSHER: OnceLock<Option<&'static Flusher>> = OnceLock::new();
        *FLUSHER.get_or_init(|| {
            let f: &'static Flusher = Box::leak(Box::new(Flusher {
                sinks: Mutex::new(Watch {
                    sinks: Vec::new(),
                    idle: false,
                }),
                wake: Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("puzzletron-metrics".into())
                .spawn(move || f.run())
                .ok()
                .map(|_| f)
        })
    }

    fn lock(&self) -> MutexGuard<'_, Watch> {
        self.sinks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `shared` until it is closed or dropped.
    fn register(&self, shared: &Arc<Shared>) {
        let mut w = self.lock();
        w.sinks.push(Arc::downgrade(shared));
        if w.idle {
            self.wake.notify_all();
        }
    }

    /// A sink's batch has a new oldest row: the flusher needs a deadline if it has none. The
    /// caller holds no sink lock (the flusher takes its lock, then the sinks').
    fn poke(&self) {
        let w = self.lock();
        if w.idle {
            self.wake.notify_all();
        }
    }

    fn run(&self) {
        let mut watch = self.lock();
        loop {
            let now = Instant::now();
            let mut next: Option<Instant> = None;
            watch.sinks.retain(|w| {
                let Some(sh) = w.upgrade() else {
                    return false;
                };
                let mut st = sh.lock();
                if st.closed {
                    return false;
                }
                match st.oldest {
                    Some(t) if now.duration_since(t) >= FLUSH_INTERVAL => {
                        if let Err(e) = write_out(&sh.path, &mut st) {
                            st.failed.get_or_insert(e);
                            // Keep the rows; the job's next call reports the error.
                            st.oldest = None;
                        }
                    }
                    Some(t) => {
                        let due = t + FLUSH_INTERVAL;
                        next = Some(next.map_or(due, |n| n.min(due)));
                    }
                    None => {}
                }
                true
            });
            watch.idle = next.is_none();
            watch = match next {
                None => self.wake.wait(watch).unwrap_or_else(|p| p.into_inner()),
                Some(due) => {
                    self.wake
                        .wait_timeout(watch, due.saturating_duration_since(now))
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
            watch.idle = false;
        }
    }
}

pub(super) struct FsSink {
    shared: Arc<Shared>,
    /// The flusher watching this sink (registered with its first row).
    flusher: Option<&'static Flusher>,
    rows: u64,
    names: BTreeSet<String>,
    /// What [`MetricSink::seal`] returned: a second call returns it again.
    sealed: Option<MetricsInfo>,
}

impl FsSink {
    /// A sink writing to `path`, which it creates (truncating) with the first batch written.
    pub(super) fn new(path: PathBuf) -> Self {
        FsSink {
            shared: Arc::new(Shared {
                path,
                state: Mutex::new(State {
                    file: None,
                    // Grown as rows come: most runs of a sweep log a few rows.
                    buf: Vec::new(),
                    pending: 0,
                    oldest: None,
                    failed: None,
                    closed: false,
                }),
            }),
            flusher: None,
            rows: 0,
            names: BTreeSet::new(),
            sealed: None,
        }
    }

    fn io_err(&self, e: io::Error) -> StoreError {
        StoreError::Io {
            path: self.shared.path.clone(),
            source: e,
        }
    }

    /// Stops the flusher's watch of this sink (it writes nothing of it any more).
    fn stop_flusher(&mut self) {
        if self.flusher.take().is_some() {
            self.shared.lock().closed = true;
        }
    }

    fn flush_now(&mut self) -> Result<(), StoreError> {
        let mut st = self.shared.lock();
        if let Some(e) = st.failed.take() {
            return Err(self.io_err(e));
        }
        write_out(&self.shared.path, &mut st).map_err(|e| self.io_err(e))
    }
}

impl MetricSink for FsSink {
    fn append(&mut self, name: &str, step: i64, value: f64) -> Result<(), StoreError> {
        check_metric_name(name)?;
        let mut st = self.shared.lock();
        if let Some(e) = st.failed.take() {
            drop(st);
            return Err(self.io_err(e));
        }
        // f64's Display is the shortest text that parses back to the same value.
        let _ = writeln!(st.buf, "{name}\t{step}\t{value}");
        st.pending += 1;
        let first = st.oldest.is_none();
        if first {
            st.oldest = Some(Instant::now());
        }
        if st.pending >= FLUSH_ROWS || st.buf.len() >= FLUSH_BYTES {
            if let Err(e) = write_out(&self.shared.path, &mut st) {
                drop(st);
                return Err(self.io_err(e));
            }
        } else if first {
            drop(st);
            match self.flusher {
                Some(f) => f.poke(),
                None => {
                    self.flusher = Flusher::get();
                    if let Some(f) = self.flusher {
                        f.register(&self.shared);
                    }
                }
            }
        }
        self.rows += 1;
        if !self.names.contains(name) {
            self.names.insert(name.to_string());
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        self.flush_now()
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        self.stop_flusher();
        self.flush_now()?;
        // Only the rows need to reach the disk here: the file's folder entry is made durable by
        // the folder fsync that commits the record, and an empty file has no data to sync.
        let st = self.shared.lock();
        match &st.file {
            Some(f) if self.rows > 0 => f.sync_data().map_err(|e| self.io_err(e)),
            _ => Ok(()),
        }
    }

    fn seal(&mut self) -> Result<MetricsInfo, StoreError> {
        if let Some(info) = &self.sealed {
            return Ok(info.clone());
        }
        self.stop_flusher();
        let inline = {
            let mut st = self.shared.lock();
            if let Some(e) = st.failed.take() {
                drop(st);
                return Err(self.io_err(e));
            }
            if st.file.is_none() && st.buf.len() <= INLINE_BYTES {
                // Rows are formatted from checked names, numbers and ASCII separators, so this
                // is UTF-8; were it not, the bytes go back to the buffer and on to the file.
                match String::from_utf8(std::mem::take(&mut st.buf)) {
                    Ok(text) => {
                        st.pending = 0;
                        st.oldest = None;
                        Some(text)
                    }
                    Err(e) => {
                        st.buf = e.into_bytes();
                        None
                    }
                }
            } else {
                None
            }
        };
        let info = match inline {
            Some(text) => MetricsInfo {
                file: String::new(),
                inline: Some(text),
                ..self.summary()
            },
            None => {
                self.sync()?;
                self.summary()
            }
        };
        self.sealed = Some(info.clone());
        Ok(info)
    }

    fn summary(&self) -> MetricsInfo {
        MetricsInfo {
            file: self
                .shared
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            rows: self.rows,
            names: self.names.iter().cloned().collect(),
            inline: None,
        }
    }
}

impl Drop for FsSink {
    /// A sink dropped without [`MetricSink::sync`] (a job abandoned on an error path) still
    /// hands its rows to the OS.
    fn drop(&mut self) {
        self.stop_flusher();
        let _ = write_out(&self.shared.path, &mut self.shared.lock());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::rows::{Bound, read_rows};
    use std::path::Path;

    /// Rows reach the file within about [`FLUSH_INTERVAL`] with no further call, for several
    /// sinks at once (one flusher thread serves them all), and again after a first batch.
    #[test]
    fn the_flusher_writes_idle_batches_of_every_sink() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            let path = dir.path().join(name);
            (path.clone(), FsSink::new(path))
        };
        let (pa, mut a) = open("a.tsv");
        let (pb, mut b) = open("b.tsv");
        let wait_for = |path: &Path, want: &str| {
            let t = Instant::now();
            loop {
                // The file is created with the first batch written.
                let got = std::fs::read_to_string(path).unwrap_or_default();
                if got == want {
                    return t.elapsed();
                }
                assert!(
                    t.elapsed() < FLUSH_INTERVAL * 10,
                    "{path:?}: {got:?}, want {want:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        let t0 = Instant::now();
        a.append("loss", 1, 0.5).unwrap();
        b.append("acc", 1, 0.25).unwrap();
        // Nothing is written before the interval (the rows wait in the buffers).
        let early = std::fs::read_to_string(&pa).unwrap_or_default();
        if t0.elapsed() < FLUSH_INTERVAL {
            assert_eq!(early, "");
        }
        wait_for(&pa, "loss\t1\t0.5\n");
        wait_for(&pb, "acc\t1\t0.25\n");
        a.append("loss", 2, 0.75).unwrap();
        wait_for(&pa, "loss\t1\t0.5\nloss\t2\t0.75\n");
        // Closed sinks leave the flusher's watch; their last rows come with `sync`.
        a.sync().unwrap();
        b.append("acc", 2, 1.0).unwrap();
        b.sync().unwrap();
        assert_eq!(
            std::fs::read_to_string(&pb).unwrap(),
            "acc\t1\t0.25\nacc\t2\t1\n"
        );
        assert_eq!((a.summary().rows, b.summary().rows), (2, 2));
    }

    /// A disk that takes `room` more bytes, then fails with ENOSPC (after a partial write).
    struct Disk {
        data: Vec<u8>,
        room: usize,
    }

    impl Write for Disk {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = b.len().min(self.room);
            self.data.extend_from_slice(&b[..n]);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// N12: a disk that fills up in the middle of a row, then frees space: the retry
    /// continues at the first unwritten byte, every row is read back once and in order, and
    /// while the disk is full the file ends in a torn row the reader drops (with its offset).
    #[test]
    fn n12_partial_write_then_retry_keeps_every_row_once() {
        let rows: String = (0..50).map(|i| format!("loss\t{i}\t0.{i}5\n")).collect();
        // (bytes the disk takes before it is full)
        for room in [0, 1, 7, 11, 12, 100, rows.len() - 1] {
            let mut disk = Disk {
                data: Vec::new(),
                room,
            };
            let mut buf = rows.clone().into_bytes();
            let e = write_draining(&mut disk, &mut buf).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "room {room}");
            assert_eq!(disk.data.len() + buf.len(), rows.len(), "room {room}");
            // Meanwhile a reader sees the complete rows and drops the torn one.
            let (s, torn) =
                read_rows(Path::new("m.tsv"), &disk.data[..], Bound::ToEnd, None).unwrap();
            let complete = disk.data.iter().filter(|&&b| b == b'\n').count();
            assert_eq!(s.len(), complete, "room {room}");
            let last_nl = disk
                .data
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1);
            match torn {
                Some(t) => assert_eq!(
                    (t.offset, t.bytes),
                    (last_nl as u64, (disk.data.len() - last_nl) as u64),
                    "room {room}"
                ),
                None => assert_eq!(last_nl, disk.data.len(), "room {room}"),
            }
            // Space freed: the retry completes the file exactly.
            disk.room = usize::MAX;
            write_draining(&mut disk, &mut buf).unwrap();
            assert!(buf.is_empty());
            assert_eq!(
                String::from_utf8(disk.data.clone()).unwrap(),
                rows,
                "room {room}"
            );
            let (s, torn) =
                read_rows(Path::new("m.tsv"), &disk.data[..], Bound::Exactly(50), None).unwrap();
            assert!(torn.is_none());
            assert_eq!(s.step, (0..50).collect::<Vec<i64>>(), "room {room}");
        }
    }
}
