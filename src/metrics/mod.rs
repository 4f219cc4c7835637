//! Metrics (`docs/design.md`, "Metrics"): what jobs log with [`Run::log`](crate::Run::log),
//! gathered into an Arrow-backed [`MetricTable`] that writes Parquet, CSV and SVG line plots.

mod plot;
#[cfg(feature = "parquet")]
mod runs;
#[cfg(feature = "parquet")]
pub(crate) mod stream;
mod table;

pub(crate) use table::{JobMeta, JobRows, build_table};
pub use table::{MetricTable, RESERVED_COLUMNS};

use std::path::PathBuf;

use crate::identity::Hash;
use crate::store::{JobRecord, Series, Store, StoreError, StoreExt};

/// Errors building or writing metric tables.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// No job of the sweep recorded the metric.
    #[error("no job recorded metric `{metric}`; metrics that exist: {}", if available.is_empty() { "none".to_string() } else { available.join(", ") })]
    UnknownMetric {
        /// The metric asked for.
        metric: String,
        /// The metrics the jobs did record, sorted.
        available: Vec<String>,
    },
    /// A parameter whose name is a column of the table.
    #[error("job {job_key} has a parameter named `{name}`, which is a metric-table column (step, value, job_key{}): rename it", if name == "metric" { ", metric" } else { "" })]
    ReservedParameter {
        /// The parameter name.
        name: String,
        /// The job.
        job_key: Hash,
    },
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The Parquet writer failed.
    #[error("cannot write Parquet {path}: {message}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The writer's message.
        message: String,
    },
    /// Arrow refused the columns (a bug: please report it).
    #[error("arrow error: {message}")]
    Arrow {
        /// Arrow's message.
        message: String,
    },
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl MetricsError {
    /// Whether retrying can help (I/O errors).
    pub fn is_retryable(&self) -> bool {
        match self {
            MetricsError::Io { .. } => true,
            MetricsError::Store(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// Metric tables of any [`Store`], implemented for every store: what
/// [`Orchestrator::get`](crate::Orchestrator::get) returns for one sweep, here for every done run
/// a store holds. Reads only: nothing runs.
///
/// ```
/// use puzzletron::{store::MemoryStore, metrics::MetricsExt};
///
/// let store = MemoryStore::new();
/// // An empty store has no metric: the error names the metrics that exist (none).
/// let e = store.metric_table("loss").unwrap_err();
/// assert!(e.to_string().contains("none"), "{e}");
/// ```
pub trait MetricsExt: Store {
    /// Metric `metric` of every done job in the store, as `[step, value, *params, job_key]`
    /// (the table [`Orchestrator::get`](crate::Orchestrator::get) returns), jobs in finish
    /// order (then key). Jobs that did not log `metric` add no rows.
    ///
    /// # Errors
    /// [`MetricsError::UnknownMetric`] (naming the metrics that exist) when no done job logged
    /// it; store errors as [`MetricsError::Store`].
    fn metric_table(&self, metric: &str) -> Result<MetricTable, MetricsError> {
        table_of(self, metric)
    }

    /// Writes [`metric_table`](Self::metric_table)`(metric)` to `path` as Parquet, streaming:
    /// the rows of a few jobs (read ahead on reader threads while the writer encodes) and one
    /// record batch of at most 65,536 rows are in memory at a time, so memory stays bounded
    /// (tens of MB) whatever the table's size. Same columns and Parquet types as
    /// [`MetricTable::write_parquet`] (`job_key` and text parameters dictionary-encoded in the
    /// file; pyarrow and pandas read them as plain strings). Replaces `path` atomically.
    /// Returns the number of rows written.
    ///
    /// # Errors
    /// As [`metric_table`](Self::metric_table), and [`MetricsError::Io`] /
    /// [`MetricsError::Parquet`] naming `path`.
    #[cfg(feature = "parquet")]
    #[cfg_attr(docsrs, doc(cfg(feature = "parquet")))]
    fn write_metric_parquet(
        &self,
        metric: &str,
        path: &std::path::Path,
    ) -> Result<u64, MetricsError> {
        write_parquet_of(self, metric, path)
    }

    /// Every metric of every done job, with a `metric` column (see [`collect`]).
    ///
    /// # Errors
    /// As [`collect`].
    fn collect(&self) -> Result<MetricTable, MetricsError> {
        collect(self)
    }
}

impl<S: Store + ?Sized> MetricsExt for S {}

/// Every metric of every done job a store holds, as one table with a `metric` column:
/// `[metric, step, value, *params, job_key]`, jobs ordered by finish time (then key).
///
/// # Errors
/// [`MetricsError::Store`] when a record or metric file cannot be read,
/// [`MetricsError::ReservedParameter`] when a job has a parameter named like a column.
pub fn collect<S: Store + ?Sized>(store: &S) -> Result<MetricTable, MetricsError> {
    let mut recs = StoreExt::done_records(store)?;
    recs.sort_by(|a, b| {
        a.finished_at
            .unwrap_or(0.0)
            .total_cmp(&b.finished_at.unwrap_or(0.0))
            .then(a.key.cmp(&b.key))
    });
    let refs: Vec<&JobRecord> = recs.iter().collect();
    let mut jobs = Vec::with_capacity(recs.len());
    for_each_series(store, &refs, None, reader_threads(false), |i, series| {
        let r = refs[i];
        jobs.push(JobRows {
            meta: JobMeta {
                key: r.key,
                params: &r.params,
                param_order: &r.param_order,
                param_types: &r.param_types,
            },
            series,
        });
        Ok(())
    })?;
    build_table(&jobs, true)
}

/// How many jobs' rows a reader thread of [`for_each_series`] may hold ahead of the caller.
const READ_AHEAD: usize = 4;

/// Calls `each` with the rows of metric `metric` (all metrics when `None`) of each record of
/// `recs`, in order, read by `threads` reader threads (job `i` by thread `i % threads`), each at
/// most [`READ_AHEAD`] jobs ahead of `each`: reading overlaps with what `each` does, and memory
/// stays bounded by a few jobs' rows. Stops at the first error (of a read or of `each`).
pub(crate) fn for_each_series<S: Store + ?Sized>(
    store: &S,
    recs: &[&JobRecord],
    metric: Option<&str>,
    threads: usize,
    each: impl FnMut(usize, Series) -> Result<(), MetricsError>,
) -> Result<(), MetricsError> {
    for_each_read(
        recs.len(),
        threads,
        |i| store.record_metrics(recs[i], metric),
        each,
    )
}

/// [`for_each_series`] of `n` jobs whose rows `read(i)` reads.
pub(crate) fn for_each_read(
    n: usize,
    threads: usize,
    read: impl Fn(usize) -> Result<Series, StoreError> + Sync,
    mut each: impl FnMut(usize, Series) -> Result<(), MetricsError>,
) -> Result<(), MetricsError> {
    let threads = threads.clamp(1, n.max(1));
    if threads == 1 && n < 2 {
        for i in 0..n {
            each(i, read(i)?)?;
        }
        return Ok(());
    }
    let read = &read;
    std::thread::scope(|scope| {
        let mut rxs = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD);
            rxs.push(rx);
            scope.spawn(move || {
                for i in (t..n).step_by(threads) {
                    let rows = read(i);
                    let failed = rows.is_err();
                    // A closed channel: the caller stopped (an error); so do we.
                    if tx.send(rows).is_err() || failed {
                        return;
                    }
                }
            });
        }
        // The receivers are dropped when this closure returns, before the scope joins the
        // readers, so a reader blocked on a full channel wakes up and ends.
        for i in 0..n {
            let rows = rxs[i % threads].recv().map_err(|_| MetricsError::Arrow {
                message: "a metric reader thread ended early".into(),
            })??;
            each(i, rows)?;
        }
        Ok(())
    })
}

/// Reader threads for [`for_each_series`]: the machine's cores (at most 4), one left for the
/// caller when `busy` (it encodes what it receives).
pub(crate) fn reader_threads(busy: bool) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (if busy { cores.saturating_sub(1) } else { cores }).clamp(1, 4)
}

/// The done records of `store` that logged metric `metric`, in finish order (then key).
///
/// # Errors
/// [`MetricsError::UnknownMetric`] when none did; store errors.
fn done_with_metric<S: Store + ?Sized>(
    store: &S,
    metric: &str,
) -> Result<Vec<JobRecord>, MetricsError> {
    let mut recs = store.done_records()?;
    let mut available = std::collections::BTreeSet::new();
    recs.retain(|r| {
        let Some(m) = &r.metrics else { return false };
        available.extend(m.names.iter().cloned());
        m.names.iter().any(|n| n == metric)
    });
    if recs.is_empty() {
        return Err(MetricsError::UnknownMetric {
            metric: metric.to_string(),
            available: available.into_iter().collect(),
        });
    }
    Ok(recs)
}

/// Metric `metric` of every done job in `store` as `[step, value, *params, job_key]`, jobs in
/// finish order (then key); see [`MetricsExt::metric_table`].
pub(crate) fn table_of<S: Store + ?Sized>(
    store: &S,
    metric: &str,
) -> Result<MetricTable, MetricsError> {
    let recs = done_with_metric(store, metric)?;
    let refs: Vec<&JobRecord> = recs.iter().collect();
    let mut jobs = Vec::with_capacity(recs.len());
    for_each_series(
        store,
        &refs,
        Some(metric),
        reader_threads(false),
        |i, series| {
            let r = refs[i];
            jobs.push(JobRows {
                meta: JobMeta {
                    key: r.key,
                    params: &r.params,
                    param_order: &r.param_order,
                    param_types: &r.param_types,
                },
                series,
            });
            Ok(())
        },
    )?;
    build_table(&jobs, false)
}

/// [`table_of`] streamed to Parquet at `path` in bounded memory; see
/// [`MetricsExt::write_metric_parquet`].
#[cfg(feature = "parquet")]
pub(crate) fn write_parquet_of<S: Store + ?Sized>(
    store: &S,
    metric: &str,
    path: &std::path::Path,
) -> Result<u64, MetricsError> {
    // Compact runs, not parsed records: a store of 100k small runs is read in bounded memory.
    let runs = runs::TableRuns::read(store, metric)?;
    stream::write_parquet(
        &runs.runs,
        |sink| {
            for_each_read(
                runs.runs.len(),
                reader_threads(true),
                |i| runs.rows(store, i, Some(metric)),
                sink,
            )
        },
        path,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn series(rows: &[(i64, f64)]) -> Series {
        let mut s = Series::default();
        for &(st, v) in rows {
            s.push("loss", st, v);
        }
        s
    }

    /// A store of more jobs than one thread reads (records in chunks on several threads, rows
    /// read ahead on several threads): the table keeps finish order and every row; a failing
    /// consumer stops the readers without a hang.
    #[test]
    fn many_jobs_read_on_threads_keep_finish_order() {
        use crate::store::conformance::sample_record;
        use crate::store::{ClaimOutcome, MemoryStore, Owner, Status};
        let store = MemoryStore::new();
        let n = 2500;
        for i in 0..n {
            let k = Hash::of(format!("job{i}"));
            let ClaimOutcome::Claimed(c) = store.claim(&k, &Owner::current(), None).unwrap() else {
                panic!("claim");
            };
            let mut rec = sample_record(k, Status::Running, c.attempt);
            store.start(&c, &rec).unwrap();
            let mut sink = store.metric_sink(&c).unwrap();
            for step in 0..3 {
                sink.append("loss", step, i as f64 + step as f64 / 4.0)
                    .unwrap();
            }
            sink.sync().unwrap();
            rec.status = Status::Done;
            // Finished in reverse: finish order is not key or insertion order.
            rec.finished_at = Some((n - i) as f64);
            rec.metrics = Some(sink.summary());
            store.finish(&c, &rec).unwrap();
        }
        let t = store.metric_table("loss").unwrap();
        assert_eq!(t.num_rows(), 3 * n);
        let keys = t.job_keys();
        let values = t.values();
        for (row, job) in (0..n).rev().enumerate() {
            assert_eq!(keys[3 * row], Hash::of(format!("job{job}")), "row {row}");
            assert_eq!(values[3 * row + 2], job as f64 + 0.5, "row {row}");
        }
        #[cfg(feature = "parquet")]
        {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("loss.parquet");
            assert_eq!(
                store.write_metric_parquet("loss", &path).unwrap(),
                3 * n as u64
            );
        }
        let recs = store.done_records().unwrap();
        let refs: Vec<&JobRecord> = recs.iter().collect();
        let mut seen = 0;
        let e = for_each_series(&store, &refs, Some("loss"), 3, |i, rows| {
            assert_eq!(i, seen);
            assert_eq!(rows.len(), 3);
            seen += 1;
            if i == 40 {
                return Err(MetricsError::Arrow {
                    message: "stop".into(),
                });
            }
            Ok(())
        })
        .unwrap_err();
        assert!(e.to_string().contains("stop"), "{e}");
        assert_eq!(seen, 41);
    }

    #[test]
    fn column_types_follow_parameter_types() {
        let p1 = json!({"lr": 0.1, "hidden": 16, "name": "a", "bn": true, "opt": {"b": [1, 2]}, "mixed": 1});
        let p2 = json!({"lr": 1, "hidden": 32, "name": "b", "bn": false, "opt": {"b": []}, "mixed": "x"});
        let order: Vec<String> = ["lr", "hidden", "name", "bn", "opt", "mixed"]
            .map(String::from)
            .to_vec();
        let jobs = [
            JobRows {
                meta: JobMeta {
                    key: Hash::of("1"),
                    params: &p1,
                    param_order: &order,
                    param_types: &table::NO_TYPES,
                },
                series: series(&[(0, 1.0), (1, 0.5)]),
            },
            JobRows {
                meta: JobMeta {
                    key: Hash::of("2"),
                    params: &p2,
                    param_order: &order,
                    param_types: &table::NO_TYPES,
                },
                series: series(&[(0, 2.0)]),
            },
        ];
        let t = build_table(&jobs, false).unwrap();
        assert_eq!(
            t.column_names(),
            [
                "step", "value", "lr", "hidden", "name", "bn", "opt", "mixed", "job_key"
            ]
        );
        let types: Vec<String> = t
            .batch()
            .schema()
            .fields()
            .iter()
            .map(|f| f.data_type().to_string())
            .collect();
        assert_eq!(
            types,
            [
                "Int64", "Float64", "Float64", "Int64", "Utf8", "Boolean", "Utf8", "Utf8", "Utf8"
            ]
        );
        assert_eq!(t.num_rows(), 3);
        assert_eq!(t.steps(), [0, 1, 0]);
        assert_eq!(t.values(), [1.0, 0.5, 2.0]);
        assert_eq!(t.f64s("lr").unwrap(), [Some(0.1), Some(0.1), Some(1.0)]);
        assert_eq!(t.i64s("hidden").unwrap(), [Some(16), Some(16), Some(32)]);
        assert_eq!(
            t.strings("opt").unwrap()[0].as_deref(),
            Some(r#"{"b":[1,2]}"#)
        );
        assert_eq!(
            t.strings("mixed").unwrap(),
            [Some("1".into()), Some("1".into()), Some("\"x\"".into())]
        );
        assert_eq!(t.job_keys(), [Hash::of("1"), Hash::of("1"), Hash::of("2")]);
        let csv = t.to_csv();
        assert!(csv.starts_with("step,value,lr,hidden,name,bn,opt,mixed,job_key\n0,1,0.1,16,a,true,\"{\"\"b\"\":[1,2]}\",1,"), "{csv}");
        let shown = t.to_string();
        assert!(
            shown.contains("(3 rows)") && shown.lines().next().unwrap().starts_with("step"),
            "{shown}"
        );
    }

    #[test]
    fn missing_parameters_are_null_and_reserved_names_refused() {
        let p1 = json!({"a": 1});
        let p2 = json!({"b": "x"});
        let jobs = [
            JobRows {
                meta: JobMeta {
                    key: Hash::of("1"),
                    params: &p1,
                    param_order: &[],
                    param_types: &table::NO_TYPES,
                },
                series: series(&[(0, 1.0)]),
            },
            JobRows {
                meta: JobMeta {
                    key: Hash::of("2"),
                    params: &p2,
                    param_order: &[],
                    param_types: &table::NO_TYPES,
                },
                series: series(&[(0, 1.0)]),
            },
        ];
        let t = build_table(&jobs, false).unwrap();
        let a = t.column("a").unwrap();
        assert!(a.is_null(1) && !a.is_null(0));
        let bad = json!({"step": 1});
        let jobs = [JobRows {
            meta: JobMeta {
                key: Hash::of("1"),
                params: &bad,
                param_order: &[],
                param_types: &table::NO_TYPES,
            },
            series: series(&[]),
        }];
        let e = build_table(&jobs, false).unwrap_err();
        assert!(e.to_string().contains("parameter named `step`"), "{e}");
    }
}
