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

/// Splits `name TAB step TAB value` (the name may not hold tabs, but split from the right so
/// that an older file with odd names still reads).
fn split_row(row: &[u8]) -> Option<(&[u8], i64, f64)> {
    let t2 = row.iter().rposition(|&b| b == b'\t')?;
    let t1 = row[..t2].iter().rposition(|&b| b == b'\t')?;
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
