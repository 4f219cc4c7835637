//! Reading metric row files (`name TAB step TAB value LF`) into a [`Series`] without an
//! allocation per row.

use std::fmt;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::{Series, StoreError};

/// A last line cut short (a batch torn by a crash), dropped by the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
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
fn split_row(row: &[u8]) -> Option<(&[u8], i64, f64)> {
    let t2 = row.iter().rposition(|&b| b == b'\t')?;
    let t1 = row[..t2].iter().rposition(|&b| b == b'\t')?;
    if row[..t1].contains(&b'\t') {
        return None;
    }
    let step = std::str::from_utf8(&row[t1 + 1..t2]).ok()?.parse().ok()?;
    let value = std::str::from_utf8(&row[t2 + 1..]).ok()?.parse().ok()?;
    Some((&row[..t1], step, value))
}

/// Reads rows of `reader` (the file `path`) into a [`Series`], keeping only metric `only` when
/// given. Returns the torn tail it dropped, if any ([`Bound::ToEnd`] only).
pub(super) fn read_rows(
    path: &Path,
    mut reader: impl BufRead,
    bound: Bound,
    only: Option<&str>,
) -> Result<(Series, Option<TornTail>), StoreError> {
    let mut series = Series::default();
    let mut line = Vec::with_capacity(256);
    let mut rows = 0u64;
    let mut offset = 0u64;
    // The name index of the last row, to skip the name lookup on runs of one metric.
    let mut last: Option<u32> = None;
    loop {
        if let Bound::Exactly(n) = bound
            && rows >= n
        {
            break;
        }
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| StoreError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
        let complete = n > 0 && line.last() == Some(&b'\n');
        if !complete {
            match bound {
                Bound::Exactly(want) => {
                    return Err(StoreError::Corrupt {
                        path: path.to_path_buf(),
                        reason: format!("{rows} complete rows, the record says {want}"),
                    });
                }
                Bound::ToEnd if n == 0 => break,
                Bound::ToEnd => {
                    return Ok((
                        series,
                        Some(TornTail {
                            path: path.to_path_buf(),
                            offset,
                            bytes: n as u64,
                        }),
                    ));
                }
            }
        }
        let row = &line[..n - 1];
        let Some((name, step, value)) = split_row(row) else {
            return Err(StoreError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "row {} (byte offset {offset}): {:?}: expected name TAB step TAB value",
                    rows + 1,
                    String::from_utf8_lossy(row)
                ),
            });
        };
        rows += 1;
        offset += n as u64;
        if let Some(want) = only
            && name != want.as_bytes()
        {
            continue;
        }
        let idx = match last {
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
                last = Some(i);
                i
            }
        };
        series.name_index.push(idx);
        series.step.push(step);
        series.value.push(value);
    }
    Ok((series, None))
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
