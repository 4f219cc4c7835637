//! The buffered metric sink of [`FsStore`](super::FsStore): rows are formatted into a buffer and
//! written with one `write(2)` per batch, not per row.
//!
//! A batch reaches the OS when it holds [`FLUSH_ROWS`] rows, when its oldest row is
//! [`FLUSH_INTERVAL`] old (a background thread, started with the first buffered row, sees to
//! that even when the job logs nothing more), when the job marks a step boundary
//! ([`Run::flush`](crate::sweep::Run::flush)), and when the attempt ends (then it is also
//! fsynced before the done record is written). A process killed in between loses at most the
//! unflushed batch; a batch torn by a power loss leaves a torn last line, which readers drop
//! with a warning ([`FsStore::attempt_metrics`](super::FsStore::attempt_metrics)).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{MetricSink, MetricsInfo, StoreError, check_metric_name};

/// Rows a batch holds before it is written, whatever its age.
pub const FLUSH_ROWS: usize = 4096;
/// The longest a logged row waits in the buffer before it is written to the OS.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(500);
/// A batch this many bytes long is written even below [`FLUSH_ROWS`] (long metric names).
const FLUSH_BYTES: usize = 1 << 18;

struct State {
    file: File,
    buf: Vec<u8>,
    /// Rows in `buf`.
    pending: usize,
    /// When the oldest row of `buf` was logged.
    oldest: Option<Instant>,
    /// A write that failed in the background thread, reported by the next call.
    failed: Option<io::Error>,
    closed: bool,
}

struct Shared {
    path: PathBuf,
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes the buffered rows; on failure the rows not written stay buffered (a later flush
/// retries them).
fn write_out(st: &mut State) -> io::Result<()> {
    if st.buf.is_empty() {
        return Ok(());
    }
    write_draining(&mut st.file, &mut st.buf)?;
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

pub(super) struct FsSink {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
    rows: u64,
    names: BTreeSet<String>,
}

impl FsSink {
    pub(super) fn new(path: PathBuf, file: File) -> Self {
        FsSink {
            shared: Arc::new(Shared {
                path,
                state: Mutex::new(State {
                    file,
                    buf: Vec::with_capacity(1 << 16),
                    pending: 0,
                    oldest: None,
                    failed: None,
                    closed: false,
                }),
                wake: Condvar::new(),
            }),
            flusher: None,
            rows: 0,
            names: BTreeSet::new(),
        }
    }

    fn io_err(&self, e: io::Error) -> StoreError {
        StoreError::Io {
            path: self.shared.path.clone(),
            source: e,
        }
    }

    /// Starts the thread that writes a batch once its oldest row is [`FLUSH_INTERVAL`] old.
    fn start_flusher(&mut self) {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name("puzzletron-metrics".into())
            .spawn(move || {
                let mut st = shared.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    match st.oldest {
                        None => st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner()),
                        Some(t) => {
                            let age = t.elapsed();
                            if age >= FLUSH_INTERVAL {
                                if let Err(e) = write_out(&mut st) {
                                    st.failed.get_or_insert(e);
                                    // Keep the rows; the job's next call reports the error.
                                    st.oldest = None;
                                }
                            } else {
                                st = shared
                                    .wake
                                    .wait_timeout(st, FLUSH_INTERVAL - age)
                                    .unwrap_or_else(|p| p.into_inner())
                                    .0;
                            }
                        }
                    }
                }
            });
        // Without the thread, rows still reach the file by count, step mark and attempt end.
        self.flusher = spawned.ok();
    }

    fn stop_flusher(&mut self) {
        if let Some(h) = self.flusher.take() {
            self.shared.lock().closed = true;
            self.shared.wake.notify_all();
            let _ = h.join();
        }
    }

    fn flush_now(&mut self) -> Result<(), StoreError> {
        let mut st = self.shared.lock();
        if let Some(e) = st.failed.take() {
            return Err(self.io_err(e));
        }
        write_out(&mut st).map_err(|e| self.io_err(e))
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
            if let Err(e) = write_out(&mut st) {
                drop(st);
                return Err(self.io_err(e));
            }
        } else if first && self.flusher.is_some() {
            self.shared.wake.notify_one();
        }
        drop(st);
        if self.flusher.is_none() && self.rows == 0 {
            self.start_flusher();
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
        if self.rows == 0 {
            return Ok(());
        }
        let st = self.shared.lock();
        st.file.sync_data().map_err(|e| self.io_err(e))
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
        }
    }
}

impl Drop for FsSink {
    /// A sink dropped without [`MetricSink::sync`] (a job abandoned on an error path) still
    /// hands its rows to the OS.
    fn drop(&mut self) {
        self.stop_flusher();
        let _ = write_out(&mut self.shared.lock());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::{Bound, read_rows};
    use std::path::Path;

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
