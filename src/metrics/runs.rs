//! The done runs a streamed metric table reads, kept compact: a large store's parsed records
//! (a few KB each: witnesses, owned-code digest, parameters as a JSON tree) are held one chunk
//! at a time, and each run keeps only what the table needs (about 300 bytes), so that a store
//! of many small runs streams in bounded memory.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::Value;

use super::MetricsError;
use super::table::JobParams;
use crate::identity::{Hash, OwnedDigest, ParamType};
use crate::store::{JobRecord, MetricsInfo, Series, Status, Store, StoreError, records_per_key};

/// Records a reader thread parses at once before it makes them compact.
const CHUNK: usize = 256;

/// How many of the last shapes seen a new run is compared with before a new one is kept.
const SHAPES_LOOKED_AT: usize = 16;

/// Parameter names in declaration order and their column types, shared by a job's runs.
type Shape = Arc<(Vec<String>, BTreeMap<String, ParamType>)>;

/// One done run of a table: key, finish time, parameters as JSON text, shared shape, metrics.
pub(crate) struct TableRun {
    key: Hash,
    finished_at: f64,
    /// The parameters' JSON, parsed again when the run's rows are written.
    params: Box<str>,
    shape: Shape,
    metrics: MetricsInfo,
}

impl JobParams for TableRun {
    fn key(&self) -> Hash {
        self.key
    }

    fn params(&self) -> Cow<'_, Value> {
        // Text serde_json wrote from a `Value` parses back into it.
        Cow::Owned(serde_json::from_str(&self.params).unwrap_or(Value::Null))
    }

    fn param_order(&self) -> &[String] {
        &self.shape.0
    }

    fn param_types(&self) -> &BTreeMap<String, ParamType> {
        &self.shape.1
    }
}

/// The done runs of `store` that logged `metric`, compact and in finish order (then key),
/// and a record of theirs emptied of everything but the environment: the template
/// [`TableRuns::rows`] gives [`Store::record_metrics`]. Records that cannot be read are left
/// out with a warning, as [`StoreExt::done_records`](crate::store::StoreExt::done_records)
/// does.
pub(crate) struct TableRuns {
    pub(crate) runs: Vec<TableRun>,
    template: JobRecord,
}

impl TableRuns {
    /// Reads them: a few threads each read a share of the keys, [`CHUNK`] records at a time,
    /// and keep the compact runs; the shares are joined in key order, then sorted.
    ///
    /// # Errors
    /// [`MetricsError::UnknownMetric`] when no done run logged `metric`; store errors.
    pub(crate) fn read<S: Store + ?Sized>(store: &S, metric: &str) -> Result<Self, MetricsError> {
        Self::read_in_chunks(store, metric, CHUNK, 1024)
    }

    /// [`read`](Self::read), `chunk` records parsed at once by each thread, a thread for each
    /// `min_share` keys (at most the cores, at most 4).
    fn read_in_chunks<S: Store + ?Sized>(
        store: &S,
        metric: &str,
        chunk: usize,
        min_share: usize,
    ) -> Result<Self, MetricsError> {
        let keys = store.keys()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores
            .min(4)
            .min(keys.len().div_ceil(min_share.max(1)))
            .max(1);
        let share = keys.len().div_ceil(threads).max(1);
        let parts: Vec<Result<Share, StoreError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = keys
                .chunks(share)
                .map(|keys| scope.spawn(move || Share::read(store, keys, metric, chunk)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut runs = Vec::new();
        let mut available = BTreeSet::new();
        let mut template = None;
        for part in parts {
            let part = part?;
            runs.extend(part.runs);
            available.extend(part.available);
            if template.is_none() {
                template = part.template;
            }
        }
        let Some(template) = template else {
            return Err(MetricsError::UnknownMetric {
                metric: metric.to_string(),
                available: available.into_iter().collect(),
            });
        };
        runs.sort_by(|a, b| {
            a.finished_at
                .total_cmp(&b.finished_at)
                .then(a.key.cmp(&b.key))
        });
        Ok(TableRuns { runs, template })
    }

    /// Metric `metric`'s rows of run `i` (all metrics for `None`). The record handed to
    /// [`Store::record_metrics`] is the template with this run's key, finish time and metrics
    /// summary: the fields a store reads rows by (`FsStore` reads `key`, `status` and
    /// `metrics`; the trait's default reads `key`); its job, lineage and environment are
    /// another run's.
    pub(crate) fn rows<S: Store + ?Sized>(
        &self,
        store: &S,
        i: usize,
        metric: Option<&str>,
    ) -> Result<Series, StoreError> {
        let run = &self.runs[i];
        let mut rec = self.template.clone();
        rec.key = run.key;
        rec.finished_at = Some(run.finished_at);
        rec.metrics = Some(run.metrics.clone());
        store.record_metrics(&rec, metric)
    }
}

/// What one reader thread keeps of its share of the keys.
#[derive(Default)]
struct Share {
    runs: Vec<TableRun>,
    /// The metrics of the done runs that did not log the one asked for.
    available: BTreeSet<String>,
    shapes: Vec<Shape>,
    template: Option<JobRecord>,
}

impl Share {
    /// The done runs among `keys` that logged `metric`, `chunk` records parsed at once.
    fn read<S: Store + ?Sized>(
        store: &S,
        keys: &[Hash],
        metric: &str,
        chunk: usize,
    ) -> Result<Self, StoreError> {
        let mut share = Share::default();
        for keys in keys.chunks(chunk.max(1)) {
            for r in records_per_key(store, keys)? {
                let rec = match r {
                    Ok(Some(rec)) => rec,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "a record cannot be read: its run is left out");
                        continue;
                    }
                };
                if rec.status != Status::Done {
                    continue;
                }
                let Some(m) = &rec.metrics else { continue };
                if !m.names.iter().any(|n| n == metric) {
                    for n in &m.names {
                        if !share.available.contains(n) {
                            share.available.insert(n.clone());
                        }
                    }
                    continue;
                }
                let run = compact(rec, &mut share.shapes, &mut share.template);
                share.runs.push(run);
            }
        }
        Ok(share)
    }
}

/// `rec` as a [`TableRun`], its shape one of `shapes` when an equal one was seen lately; the
/// first record, emptied, becomes the `template`.
fn compact(
    mut rec: JobRecord,
    shapes: &mut Vec<Shape>,
    template: &mut Option<JobRecord>,
) -> TableRun {
    let order = std::mem::take(&mut rec.param_order);
    let types = std::mem::take(&mut rec.param_types);
    let shape = match shapes
        .iter()
        .rev()
        .take(SHAPES_LOOKED_AT)
        .find(|s| s.0 == order && s.1 == types)
    {
        Some(s) => s.clone(),
        None => {
            let s: Shape = Arc::new((order, types));
            shapes.push(s.clone());
            s
        }
    };
    let params = serde_json::to_string(&rec.params)
        .unwrap_or_default()
        .into_boxed_str();
    let run = TableRun {
        key: rec.key,
        finished_at: rec.finished_at.unwrap_or(0.0),
        params,
        shape,
        metrics: rec
            .metrics
            .take()
            .unwrap_or_else(|| MetricsInfo::new("", 0, Vec::<String>::new())),
    };
    if template.is_none() {
        rec.params = Value::Null;
        rec.owned = OwnedDigest::default();
        rec.error = None;
        *template = Some(rec);
    }
    run
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsExt;
    use crate::store::conformance::sample_record;
    use crate::store::{ClaimOutcome, FsStore, Owner};
    use serde_json::json;

    /// Finishes a run of `key` with `params` (declared in `order`) that logged `rows` of
    /// `name`, finished at `at` (Unix seconds), with `status`.
    fn finish(
        store: &FsStore,
        key: Hash,
        (params, order): (Value, &[&str]),
        (name, rows, at, status): (&str, usize, f64, Status),
    ) {
        let ClaimOutcome::Claimed(c) = store.claim(&key, &Owner::current(), None).unwrap() else {
            panic!("claim");
        };
        let mut rec = sample_record(key, Status::Running, c.attempt);
        rec.params = params;
        rec.param_order = order.iter().map(|s| s.to_string()).collect();
        store.start(&c, &rec).unwrap();
        let mut sink = store.metric_sink(&c).unwrap();
        for step in 0..rows {
            sink.append(name, step as i64, at + step as f64 / 8.0)
                .unwrap();
        }
        sink.sync().unwrap();
        rec.status = status;
        rec.finished_at = Some(at);
        rec.metrics = Some(sink.summary());
        store.finish(&c, &rec).unwrap();
    }

    #[test]
    fn compact_runs_keep_finish_order_shapes_and_rows_of_done_runs_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path().join("s")).unwrap();
        let k = |i: u32| Hash::of(format!("run{i}"));
        // Two shapes (lr, hidden) and (name); rows inline (few) and in a file (many); a failed
        // run, a run of another metric only, and one still running are left out.
        for i in 0..5u32 {
            let p = json!({"lr": 0.1 * f64::from(i), "hidden": 16 << i});
            let rows = if i % 2 == 0 { 3 } else { 400 };
            finish(
                &store,
                k(i),
                (p, &["lr", "hidden"]),
                ("loss", rows, 100.0 - f64::from(i), Status::Done),
            );
        }
        finish(
            &store,
            k(5),
            (json!({"name": "x"}), &["name"]),
            ("loss", 2, 50.0, Status::Done),
        );
        finish(
            &store,
            k(6),
            (json!({"name": "y"}), &["name"]),
            ("loss", 2, 40.0, Status::Failed),
        );
        finish(
            &store,
            k(7),
            (json!({"name": "z"}), &["name"]),
            ("acc", 2, 30.0, Status::Done),
        );
        let ClaimOutcome::Claimed(c) = store.claim(&k(8), &Owner::current(), None).unwrap() else {
            panic!("claim");
        };
        store
            .start(&c, &sample_record(k(8), Status::Running, c.attempt))
            .unwrap();

        for chunk in [1, 2, 3, CHUNK] {
            let t = TableRuns::read_in_chunks(&store, "loss", chunk, 2).unwrap();
            let keys: Vec<Hash> = t.runs.iter().map(|r| r.key).collect();
            assert_eq!(
                keys,
                vec![k(5), k(4), k(3), k(2), k(1), k(0)],
                "chunk {chunk}"
            );
            // One shape per job, shared by its runs.
            assert!(Arc::ptr_eq(&t.runs[1].shape, &t.runs[5].shape));
            assert_eq!(t.runs[0].shape.0, ["name"]);
            assert_eq!(*t.runs[1].params(), json!({"lr": 0.4, "hidden": 256}));
            let rows: Vec<usize> = (0..6)
                .map(|i| t.rows(&store, i, Some("loss")).unwrap().len())
                .collect();
            assert_eq!(rows, [2, 3, 400, 3, 400, 3]);
        }
        // The streamed file holds what the in-memory table holds.
        let out = dir.path().join("loss.parquet");
        assert_eq!(store.write_metric_parquet("loss", &out).unwrap(), 811);
        let f = std::fs::File::open(&out).unwrap();
        let batches: Vec<_> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
                .unwrap()
                .build()
                .unwrap()
                .map(|b| b.unwrap())
                .collect();
        assert_eq!(batches.len(), 1, "811 rows: one batch");
        let back = crate::metrics::MetricTable::from_batch(batches[0].clone());
        assert_eq!(back.to_csv(), store.metric_table("loss").unwrap().to_csv());
        // A metric no done run logged: the error names those that were.
        let e = TableRuns::read(&store, "nope").err().unwrap();
        assert!(e.to_string().contains("acc, loss"), "{e}");
    }
}
