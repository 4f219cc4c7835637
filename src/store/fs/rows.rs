//! Reading metric row files (`name TAB step TAB value LF`) into a [`Series`] without an
//! allocation per row.

use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use crate::store::{Series, StoreError};

/// A last line cut short (a batch torn by a crash), dropped by the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TornTail {
    /// The metric file.
    pub path: PathBuf,
    /// Byte offset where the dropped line starts.
    pub offset: u64,
    /// Bytes dropped.
    pub bytes: u64,
}

impl fmt::Display for TornTail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "warning: {}: dropped a torn last metric row at byte offset {} ({} bytes; the rows before it are intact)",
            self.path.display(),
            self.offset,
            self.bytes
        )
    }
}

/// How many rows to read.
pub(super) enum Bound {
    /// Exactly this many complete rows (a finished record's count); fewer is corruption.
    Exactly(u64),
    /// Every complete row up to the end of the file; a torn last line is dropped.
    ToEnd,
}

/// Splits `name TAB step TAB value`. The writer refuses names with tabs, so a third tab means
/// a torn row glued to the next one (N12: `loss\t2\t0.loss\t3\t1`): `None`, corruption,
/// never a row with a made-up name.
#[inline]
fn split_row(row: &[u8]) -> Option<(&[u8], i64, f64)> {
    let t1 = memchr::memchr(b'\t', row)?;
    let t2 = t1 + 1 + memchr::memchr(b'\t', &row[t1 + 1..])?;
    let value = &row[t2 + 1..];
    if memchr::memchr(b'\t', value).is_some() {
        return None;
    }
    let step = parse_step(&row[t1 + 1..t2])?;
    let value = parse_value(value)?;
    Some((&row[..t1], step, value))
}

/// An `i64` step: plain decimal digits (what the writer writes) without going through `str`;
/// anything else (a sign, overflow) as `str::parse` reads it.
#[inline]
fn parse_step(b: &[u8]) -> Option<i64> {
    if !b.is_empty() && b.len() <= 18 && b.iter().all(u8::is_ascii_digit) {
        return Some(b.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0')));
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// An `f64` value as `str::parse` reads it (`NaN`, `inf`, exponents).
#[inline]
fn parse_value(b: &[u8]) -> Option<f64> {
    // Row bytes are ASCII when well formed; from_utf8 on a short ASCII run is a few cycles.
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Rows parsed so far and where: the state [`read_rows`] threads through its buffers.
struct Reader<'a> {
    path: &'a Path,
    only: Option<&'a str>,
    series: Series,
    rows: u64,
    offset: u64,
    /// The name index of the last row, to skip the name lookup on runs of one metric.
    last: Option<u32>,
}

impl Reader<'_> {
    /// One complete row, without its newline.
    #[inline]
    fn row(&mut self, row: &[u8]) -> Result<(), StoreError> {
        let Some((name, step, value)) = split_row(row) else {
            return Err(StoreError::Corrupt {
                path: self.path.to_path_buf(),
                reason: format!(
                    "row {} (byte offset {}): {:?}: expected name TAB step TAB value",
                    self.rows + 1,
                    self.offset,
                    String::from_utf8_lossy(row)
                ),
            });
        };
        self.rows += 1;
        self.offset += row.len() as u64 + 1;
        if let Some(want) = self.only
            && name != want.as_bytes()
        {
            return Ok(());
        }
        let series = &mut self.series;
        let idx = match self.last {
            Some(i) if series.names[i as usize].as_bytes() == name => i,
            _ => {
                let i = match series.names.iter().position(|x| x.as_bytes() == name) {
                    Some(i) => i as u32,
                    None => {
                        series
                            .names
                            .push(String::from_utf8_lossy(name).into_owned());
                        (series.names.len() - 1) as u32
                    }
                };
                self.last = Some(i);
                i
            }
        };
        series.name_index.push(idx);
        series.step.push(step);
        series.value.push(value);
        Ok(())
    }
}

/// Reads rows of `reader` (the file `path`) into a [`Series`], keeping only metric `only` when
/// given. Returns the torn tail it dropped, if any ([`Bound::ToEnd`] only).
///
/// Rows are parsed in place in the reader's buffer (no copy or allocation per row); only a row
/// that straddles two buffer fills is copied, once.
pub(super) fn read_rows(
    path: &Path,
    mut reader: impl BufRead,
    bound: Bound,
    only: Option<&str>,
) -> Result<(Series, Option<TornTail>), StoreError> {
    let want = match bound {
        Bound::Exactly(n) => Some(n),
        Bound::ToEnd => None,
    };
    let mut r = Reader {
        path,
        only,
        series: Series::default(),
        rows: 0,
        offset: 0,
        last: None,
    };
    if let Some(n) = want
        && only.is_none()
    {
        let n = usize::try_from(n).unwrap_or(0).min(1 << 20);
        r.series.step.reserve(n);
        r.series.value.reserve(n);
        r.series.name_index.reserve(n);
    }
    // A row cut by the end of a buffer fill: its start, completed by the next fill.
    let mut carry: Vec<u8> = Vec::new();
    let io = |e: std::io::Error| StoreError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    loop {
        if want.is_some_and(|n| r.rows >= n) {
            break;
        }
        let buf = reader.fill_buf().map_err(io)?;
        if buf.is_empty() {
            if let Some(n) = want {
                return Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    reason: format!("{} complete rows, the record says {n}", r.rows),
                });
            }
            if carry.is_empty() {
                break;
            }
            let torn = TornTail {
                path: path.to_path_buf(),
                offset: r.offset,
                bytes: carry.len() as u64,
            };
            return Ok((r.series, Some(torn)));
        }
        if !carry.is_empty() {
            match memchr::memchr(b'\n', buf) {
                Some(i) => {
                    carry.extend_from_slice(&buf[..i]);
                    reader.consume(i + 1);
                    r.row(&carry)?;
                    carry.clear();
                }
                None => {
                    carry.extend_from_slice(buf);
                    let n = buf.len();
                    reader.consume(n);
                }
            }
            continue;
        }
        let mut start = 0;
        for nl in memchr::memchr_iter(b'\n', buf) {
            r.row(&buf[start..nl])?;
            start = nl + 1;
            if want.is_some_and(|n| r.rows >= n) {
                break;
            }
        }
        let len = buf.len();
        if start == 0 || (start < len && want.is_none_or(|n| r.rows < n)) {
            // No complete row in this fill, or a row cut at its end: keep its start.
            carry.extend_from_slice(&buf[start..]);
            reader.consume(len);
        } else {
            reader.consume(start);
        }
    }
    Ok((r.series, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str, bound: Bound) -> Result<(Series, Option<TornTail>), StoreError> {
        read_rows(Path::new("m.tsv"), text.as_bytes(), bound, None)
    }

    #[test]
    fn a_torn_last_line_is_dropped_with_its_offset() {
        let (s, torn) = read("loss\t1\t0.5\nacc\t1\t0.25\nloss\t2\t0.", Bound::ToEnd).unwrap();
        assert_eq!(s.step, [1, 1]);
        assert_eq!(s.value, [0.5, 0.25]);
        assert_eq!(s.names, ["loss", "acc"]);
        assert_eq!(s.name_index, [0, 1]);
        let torn = torn.expect("torn tail reported");
        assert_eq!(torn.offset, 22);
        assert_eq!(torn.bytes, 9);
        let msg = torn.to_string();
        assert!(msg.contains("m.tsv") && msg.contains("offset 22"), "{msg}");
    }

    /// N12: every form a metric file can end in after a crash or a full disk. Every complete
    /// row is read; a torn last row is dropped and reported with its file and offset; a bad
    /// row before the end is corruption, never a guess.
    #[test]
    fn n12_torn_tail_forms() {
        // (label, file bytes, steps read, torn (offset, bytes) or error part)
        type Want = Result<(Vec<i64>, Option<(u64, u64)>), &'static str>;
        let e_acute = "é".as_bytes();
        let mut torn_utf8 = b"loss\t1\t0.5\nl".to_vec();
        torn_utf8.push(e_acute[0]);
        let cases: Vec<(&str, Vec<u8>, Want)> = vec![
            (
                "torn value `4181\t0.`",
                b"loss\t4180\t0.5\nloss\t4181\t0.".to_vec(),
                Ok((vec![4180], Some((14, 12)))),
            ),
            (
                "only a torn row",
                b"loss\t41".to_vec(),
                Ok((vec![], Some((0, 7)))),
            ),
            (
                "torn in the name",
                b"loss\t1\t0.5\nlo".to_vec(),
                Ok((vec![1], Some((11, 2)))),
            ),
            (
                "torn inside a UTF-8 character",
                torn_utf8,
                Ok((vec![1], Some((11, 2)))),
            ),
            (
                "a last row that parses but has no newline (digits may be missing)",
                b"loss\t1\t0.5\nloss\t2\t0.5".to_vec(),
                Ok((vec![1], Some((11, 10)))),
            ),
            (
                "torn after the step's tab",
                b"loss\t1\t0.5\nloss\t2\t".to_vec(),
                Ok((vec![1], Some((11, 7)))),
            ),
            (
                "complete",
                b"loss\t1\t0.5\nloss\t2\t1e-3\n".to_vec(),
                Ok((vec![1, 2], None)),
            ),
            ("empty", Vec::new(), Ok((vec![], None))),
            (
                "a bad row before the end",
                b"loss\t1\t0.5\nloss\tx\t0.5\nloss\t3\t1\n".to_vec(),
                Err("row 2 (byte offset 11)"),
            ),
            (
                "a torn row followed by more rows (two writers, a bad retry)",
                b"loss\t1\t0.5\nloss\t2\t0.loss\t3\t1\n".to_vec(),
                Err("row 2 (byte offset 11)"),
            ),
        ];
        for (label, bytes, want) in cases {
            let got = read_rows(Path::new("m.tsv"), &bytes[..], Bound::ToEnd, None);
            match (got, want) {
                (Ok((s, torn)), Ok((steps, t))) => {
                    assert_eq!(s.step, steps, "{label}");
                    assert_eq!(torn.as_ref().map(|t| (t.offset, t.bytes)), t, "{label}");
                    if let Some(t) = torn {
                        let m = t.to_string();
                        assert!(
                            m.contains("m.tsv") && m.contains(&format!("offset {}", t.offset)),
                            "{label}: {m}"
                        );
                    }
                }
                (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{label}: {e}"),
                (got, want) => panic!("{label}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_torn_tail_inside_a_finished_count_is_corruption() {
        let err = read("loss\t1\t0.5\nloss\t2\t0.", Bound::Exactly(2)).unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { reason, .. } if reason.contains("1 complete rows")),
            "{err}"
        );
        // Rows past the finished count are not the record's and are not read.
        let (s, _) = read("loss\t1\t0.5\nloss\t2\t0.", Bound::Exactly(1)).unwrap();
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_bad_row_before_the_end_is_corruption_naming_the_offset() {
        let err = read("loss\t1\t0.5\nloss\tx\t0.5\nloss\t3\t1\n", Bound::ToEnd).unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { reason, .. } if reason.contains("row 2 (byte offset 11)")),
            "{err}"
        );
    }

    /// Rows cut by the end of the reader's buffer (any buffer size) read as whole rows: the
    /// same rows, torn tail and errors as from one buffer.
    #[test]
    fn rows_straddling_buffer_fills_read_the_same() {
        let texts: [&[u8]; 5] = [
            b"loss\t1\t0.5\nacc\t1\t0.25\nloss\t2\t-1e-3\nloss\t+3\tNaN\nloss\t4\t0.",
            b"a\t0\t1\nb\t0\t2\na\t1\t3\nb\t1\tinf\n",
            b"loss\t1\t0.5\nloss\t2\t0.loss\t3\t1\n",
            b"loss\t12345678901234567890\t1\n",
            b"loss\t-12\t1\nloss\t123456789012345678\t2.5\n",
        ];
        for text in texts {
            let whole = read_rows(Path::new("m"), text, Bound::ToEnd, None);
            let whole_b = read_rows(Path::new("m"), text, Bound::Exactly(3), Some("b"));
            for cap in 1..=text.len() + 1 {
                let small = std::io::BufReader::with_capacity(cap, text);
                let got = read_rows(Path::new("m"), small, Bound::ToEnd, None);
                assert_eq!(format!("{got:?}"), format!("{whole:?}"), "cap {cap}");
                let small = std::io::BufReader::with_capacity(cap, text);
                let got = read_rows(Path::new("m"), small, Bound::Exactly(3), Some("b"));
                assert_eq!(format!("{got:?}"), format!("{whole_b:?}"), "cap {cap}");
            }
        }
        let (s, torn) = read_rows(Path::new("m"), texts[0], Bound::ToEnd, None).unwrap();
        assert_eq!(s.step, [1, 1, 2, 3]);
        assert_eq!(s.value[..3], [0.5, 0.25, -1e-3]);
        assert!(s.value[3].is_nan());
        assert_eq!(torn.map(|t| (t.offset, t.bytes)), Some((47, 9)));
        let e = read_rows(Path::new("m"), texts[3], Bound::ToEnd, None).unwrap_err();
        assert!(e.to_string().contains("row 1 (byte offset 0)"), "{e}");
        let (s, _) = read_rows(Path::new("m"), texts[4], Bound::ToEnd, None).unwrap();
        assert_eq!(s.step, [-12, 123_456_789_012_345_678]);
    }

    #[test]
    fn interleaved_names_and_a_filter() {
        let text = "a\t0\t1\nb\t0\t2\na\t1\t3\nb\t1\tNaN\n";
        let (s, torn) = read(text, Bound::ToEnd).unwrap();
        assert!(torn.is_none());
        assert_eq!(s.name_index, [0, 1, 0, 1]);
        assert!(s.value[3].is_nan());
        let (s, _) = read_rows(
            Path::new("m"),
            text.as_bytes(),
            Bound::Exactly(4),
            Some("b"),
        )
        .unwrap();
        assert_eq!(s.names, ["b"]);
        assert_eq!(s.step, [0, 1]);
    }
}
