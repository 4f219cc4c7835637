//! Streaming a metric table to Parquet in bounded memory: jobs' rows as they are read, cut into
//! record batches of at most [`BATCH_ROWS`] rows, with `job_key` and the text parameter columns
//! dictionary-encoded (a job's value is stored once per batch, not once per row).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int32Builder, Int64Builder, UInt64Builder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, DictionaryArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::ArrowWriterOptions;
use serde_json::Value;

use super::MetricsError;
use super::table::{JobParams, Kind, param_columns, param_text, param_value};
use crate::store::Series;

/// Rows per record batch handed to the Parquet writer. Bounds the Arrow buffers (about 20 bytes
/// a row: step, value, dictionary keys) independently of the table's size.
pub(crate) const BATCH_ROWS: usize = 64 * 1024;

/// One job's value of a parameter column.
enum Cell {
    Int(Option<i64>),
    UInt(Option<u64>),
    Float(Option<f64>),
    Bool(Option<bool>),
    Text(Option<String>),
}

/// A text column as dictionary keys into this batch's distinct values.
#[derive(Default)]
struct DictBuilder {
    keys: Int32Builder,
    values: Vec<String>,
    index: HashMap<String, i32>,
}

impl DictBuilder {
    fn append_n(&mut self, v: Option<&str>, n: usize) {
        let Some(v) = v else {
            self.keys.append_nulls(n);
            return;
        };
        let k = match self.index.get(v) {
            Some(&k) => k,
            None => {
                // At most one value per job in a batch of BATCH_ROWS rows: fits in i32.
                let k = self.values.len() as i32;
                self.values.push(v.to_string());
                self.index.insert(v.to_string(), k);
                k
            }
        };
        self.keys.append_value_n(k, n);
    }

    fn finish(&mut self) -> ArrayRef {
        let keys = self.keys.finish();
        let values = StringArray::from_iter_values(self.values.drain(..));
        self.index.clear();
        // Keys index the values just built: try_new cannot fail; keep the error path anyway.
        Arc::new(
            DictionaryArray::<Int32Type>::try_new(keys, Arc::new(values))
                .expect("dictionary keys are in range"),
        )
    }
}

enum ColBuilder {
    Int(Int64Builder),
    UInt(UInt64Builder),
    Float(Float64Builder),
    Bool(BooleanBuilder),
    Text(DictBuilder),
}

impl ColBuilder {
    fn append_n(&mut self, cell: &Cell, n: usize) {
        match (self, cell) {
            (ColBuilder::Int(b), Cell::Int(v)) => match v {
                Some(v) => b.append_value_n(*v, n),
                None => b.append_nulls(n),
            },
            (ColBuilder::UInt(b), Cell::UInt(v)) => match v {
                Some(v) => b.append_value_n(*v, n),
                None => b.append_nulls(n),
            },
            (ColBuilder::Float(b), Cell::Float(v)) => match v {
                Some(v) => b.append_value_n(*v, n),
                None => b.append_nulls(n),
            },
            (ColBuilder::Bool(b), Cell::Bool(v)) => append_bool_n(b, *v, n),
            (ColBuilder::Text(b), Cell::Text(v)) => b.append_n(v.as_deref(), n),
            // Cells are made for their column's kind (cell_of); unreachable.
            (b, _) => b.append_nulls(n),
        }
    }

    fn append_nulls(&mut self, n: usize) {
        match self {
            ColBuilder::Int(b) => b.append_nulls(n),
            ColBuilder::UInt(b) => b.append_nulls(n),
            ColBuilder::Float(b) => b.append_nulls(n),
            ColBuilder::Bool(b) => (0..n).for_each(|_| b.append_null()),
            ColBuilder::Text(b) => b.keys.append_nulls(n),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            ColBuilder::Int(b) => Arc::new(b.finish()),
            ColBuilder::UInt(b) => Arc::new(b.finish()),
            ColBuilder::Float(b) => Arc::new(b.finish()),
            ColBuilder::Bool(b) => Arc::new(b.finish()),
            ColBuilder::Text(b) => b.finish(),
        }
    }
}

fn append_bool_n(b: &mut BooleanBuilder, v: Option<bool>, n: usize) {
    match v {
        Some(v) => b.append_n(n, v),
        None => (0..n).for_each(|_| b.append_null()),
    }
}

fn dict_type() -> DataType {
    DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8))
}

fn cell_of(params: &Value, name: &str, kind: Kind) -> Cell {
    let v = param_value(params, name);
    match kind {
        Kind::Int => Cell::Int(v.and_then(|v| v.as_i64())),
        Kind::UInt => Cell::UInt(v.and_then(|v| v.as_u64())),
        Kind::Float => Cell::Float(v.and_then(|v| v.as_f64())),
        Kind::Bool => Cell::Bool(v.and_then(|v| v.as_bool())),
        Kind::Str | Kind::Json | Kind::Null => Cell::Text(v.and_then(|v| param_text(v, kind))),
    }
}

/// The Arrow schema of a streamed table: `[step, value, *params, job_key]`, text columns as
/// `Dictionary(Int32, Utf8)`.
fn schema(cols: &[(String, Kind)]) -> SchemaRef {
    let mut fields = vec![
        Field::new("step", DataType::Int64, false),
        Field::new("value", DataType::Float64, false),
    ];
    for (name, kind) in cols {
        let dt = match kind {
            Kind::Int => DataType::Int64,
            Kind::UInt => DataType::UInt64,
            Kind::Float => DataType::Float64,
            Kind::Bool => DataType::Boolean,
            Kind::Str | Kind::Json | Kind::Null => dict_type(),
        };
        fields.push(Field::new(name, dt, true));
    }
    fields.push(Field::new("job_key", dict_type(), false));
    Arc::new(Schema::new(fields))
}

/// The batch being filled.
struct Batch {
    schema: SchemaRef,
    step: Int64Builder,
    value: Float64Builder,
    params: Vec<ColBuilder>,
    job_key: DictBuilder,
    rows: usize,
}

impl Batch {
    fn new(schema: SchemaRef, cols: &[(String, Kind)]) -> Self {
        let params = cols
            .iter()
            .map(|(_, k)| match k {
                Kind::Int => ColBuilder::Int(Int64Builder::with_capacity(BATCH_ROWS)),
                Kind::UInt => ColBuilder::UInt(UInt64Builder::with_capacity(BATCH_ROWS)),
                Kind::Float => ColBuilder::Float(Float64Builder::with_capacity(BATCH_ROWS)),
                Kind::Bool => ColBuilder::Bool(BooleanBuilder::with_capacity(BATCH_ROWS)),
                Kind::Str | Kind::Json | Kind::Null => ColBuilder::Text(DictBuilder::default()),
            })
            .collect();
        Self {
            schema,
            step: Int64Builder::with_capacity(BATCH_ROWS),
            value: Float64Builder::with_capacity(BATCH_ROWS),
            params,
            job_key: DictBuilder::default(),
            rows: 0,
        }
    }

    fn finish(&mut self) -> Result<RecordBatch, MetricsError> {
        let mut arrays: Vec<ArrayRef> =
            vec![Arc::new(self.step.finish()), Arc::new(self.value.finish())];
        arrays.extend(self.params.iter_mut().map(ColBuilder::finish));
        arrays.push(self.job_key.finish());
        self.rows = 0;
        RecordBatch::try_new(self.schema.clone(), arrays).map_err(|e| MetricsError::Arrow {
            message: e.to_string(),
        })
    }
}

/// A temp file next to `path` that is removed unless [`persist`](Self::persist)ed.
struct TempOut {
    tmp: PathBuf,
    done: bool,
}

impl Drop for TempOut {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// What feeds [`write_parquet`]: called once with a sink, it passes each job's rows to the sink
/// as `(index in jobs, rows)`, in order (see [`for_each_series`](super::for_each_series)), and
/// returns the sink's first error.
pub(crate) type Sink<'s> = dyn FnMut(usize, Series) -> Result<(), MetricsError> + 's;

/// Writes metric rows of `jobs` to `path` as Parquet (Snappy), streaming: `feed` hands each
/// job's rows over, in order, and they go out in batches of [`BATCH_ROWS`]; at most the jobs'
/// rows `feed` holds and one batch are in memory. The file is replaced atomically (temp file, `fsync`,
/// rename, `fsync` of the folder). Returns the number of rows written.
///
/// The Parquet schema is the one [`MetricTable::write_parquet`](super::MetricTable::write_parquet)
/// writes (`BYTE_ARRAY` UTF-8 for text; no embedded Arrow schema, so readers see plain strings,
/// not dictionaries); the text columns are dictionary-encoded in the file.
pub(crate) fn write_parquet<J: JobParams>(
    jobs: &[J],
    feed: impl FnOnce(&mut Sink<'_>) -> Result<(), MetricsError>,
    path: &Path,
) -> Result<u64, MetricsError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let cols = param_columns(jobs, false)?;
    let schema = schema(&cols);
    let io = |e: std::io::Error| MetricsError::Io {
        path: path.to_path_buf(),
        source: e,
    };
    let perr = |e: parquet::errors::ParquetError| MetricsError::Parquet {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The temp name readers of crate::fsutil skip.
    let mut out = TempOut {
        tmp: dir.join(format!(
            ".{name}.tmp.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        )),
        done: false,
    };
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&out.tmp)
        .map_err(io)?;
    let mut sink = BufWriter::with_capacity(1 << 20, file);
    let props = super::table::writer_properties();
    let options = ArrowWriterOptions::new()
        .with_properties(props)
        .with_skip_arrow_metadata(true);
    let mut w =
        ArrowWriter::try_new_with_options(&mut sink, schema.clone(), options).map_err(perr)?;
    let mut batch = Batch::new(schema, &cols);
    let mut total = 0u64;
    let mut cells: Vec<Cell> = Vec::with_capacity(cols.len());
    let mut next = 0;
    let mut push = |i: usize, series: Series| -> Result<(), MetricsError> {
        // The feed's order is the jobs' order; a job index out of turn is a bug.
        let j = jobs
            .get(i)
            .filter(|_| i == next)
            .ok_or_else(|| MetricsError::Arrow {
                message: format!("metric rows of job {i} fed out of order (expected {next})"),
            })?;
        next += 1;
        if series.is_empty() {
            return Ok(());
        }
        cells.clear();
        let params = j.params();
        cells.extend(
            cols.iter()
                .map(|(name, kind)| cell_of(&params, name, *kind)),
        );
        let hex = j.key().to_hex();
        let mut at = 0;
        while at < series.len() {
            let n = (series.len() - at).min(BATCH_ROWS - batch.rows);
            batch.step.append_slice(&series.step[at..at + n]);
            batch.value.append_slice(&series.value[at..at + n]);
            for (b, c) in batch.params.iter_mut().zip(&cells) {
                b.append_n(c, n);
            }
            batch.job_key.append_n(Some(&hex), n);
            batch.rows += n;
            at += n;
            if batch.rows == BATCH_ROWS {
                w.write(&batch.finish()?).map_err(perr)?;
            }
        }
        total += series.len() as u64;
        Ok(())
    };
    feed(&mut push)?;
    if batch.rows > 0 || total == 0 {
        w.write(&batch.finish()?).map_err(perr)?;
    }
    w.close().map_err(perr)?;
    let file = sink.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&out.tmp, path).map_err(io)?;
    out.done = true;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Hash;
    use crate::metrics::table::NO_TYPES;
    use crate::metrics::{JobMeta, JobRows, MetricTable, build_table};
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use serde_json::json;

    fn series(n: usize, seed: f64) -> Series {
        let mut s = Series::default();
        for i in 0..n {
            s.push("loss", i as i64, seed + i as f64 / 7.0);
        }
        s
    }

    fn read_back(path: &Path) -> MetricTable {
        let f = File::open(path).unwrap();
        let r = ParquetRecordBatchReaderBuilder::try_new(f)
            .unwrap()
            .build()
            .unwrap();
        let batches: Vec<RecordBatch> = r.map(|b| b.unwrap()).collect();
        let schema = batches[0].schema();
        MetricTable::from_batch(arrow_select_concat(&schema, &batches))
    }

    /// Concatenates batches column by column (arrow-select is not a dependency).
    fn arrow_select_concat(schema: &SchemaRef, batches: &[RecordBatch]) -> RecordBatch {
        let mut cols: Vec<ArrayRef> = Vec::new();
        for c in 0..schema.fields().len() {
            let parts: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
            cols.push(parquet_concat(&parts));
        }
        RecordBatch::try_new(schema.clone(), cols).unwrap()
    }

    fn parquet_concat(parts: &[&dyn Array]) -> ArrayRef {
        use arrow_array::types::{Float64Type, Int64Type};
        match parts[0].data_type() {
            DataType::Int64 => Arc::new(arrow_array::Int64Array::from_iter(
                parts
                    .iter()
                    .flat_map(|a| a.as_primitive::<Int64Type>().iter()),
            )),
            DataType::Float64 => Arc::new(arrow_array::Float64Array::from_iter(
                parts
                    .iter()
                    .flat_map(|a| a.as_primitive::<Float64Type>().iter()),
            )),
            DataType::Boolean => Arc::new(arrow_array::BooleanArray::from_iter(
                parts.iter().flat_map(|a| a.as_boolean().iter()),
            )),
            DataType::Utf8 => Arc::new(StringArray::from_iter(
                parts.iter().flat_map(|a| a.as_string::<i32>().iter()),
            )),
            other => panic!("unexpected column type {other} read back"),
        }
    }

    #[test]
    fn streamed_parquet_holds_the_rows_and_schema_of_the_in_memory_table() {
        let order: Vec<String> = ["lr", "hidden", "name", "bn", "opt", "only1"]
            .map(String::from)
            .to_vec();
        let ps = [
            json!({"lr": 0.1, "hidden": 16, "name": "a", "bn": true, "opt": {"b": [1, 2]}, "only1": 3}),
            json!({"lr": 1, "hidden": 32, "name": "b", "bn": false, "opt": {"b": []}}),
            json!({"lr": 0.5, "hidden": 8, "name": "a", "bn": true, "opt": null}),
        ];
        // Job 1 straddles a batch boundary; job 2 has no rows.
        let sizes = [BATCH_ROWS + 10, 0, BATCH_ROWS - 3];
        let rows: Vec<JobRows<'_>> = ps
            .iter()
            .zip(sizes)
            .enumerate()
            .map(|(i, (p, n))| JobRows {
                meta: JobMeta {
                    key: Hash::of(i.to_string()),
                    params: p,
                    param_order: &order,
                    param_types: &NO_TYPES,
                },
                series: series(n, i as f64),
            })
            .collect();
        let mem = build_table(&rows, false).unwrap();
        let metas: Vec<JobMeta<'_>> = rows
            .iter()
            .map(|j| JobMeta {
                key: j.meta.key,
                params: j.meta.params,
                param_order: j.meta.param_order,
                param_types: j.meta.param_types,
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loss.parquet");
        let mut asked = Vec::new();
        let n = write_parquet(
            &metas,
            |sink| {
                for (i, j) in metas.iter().enumerate() {
                    asked.push(j.key);
                    sink(
                        i,
                        rows.iter()
                            .find(|r| r.meta.key == j.key)
                            .unwrap()
                            .series
                            .clone(),
                    )?;
                }
                Ok(())
            },
            &path,
        )
        .unwrap();
        assert_eq!(n, (2 * BATCH_ROWS + 7) as u64);
        assert_eq!(asked, metas.iter().map(|m| m.key).collect::<Vec<_>>());
        let back = read_back(&path);
        assert_eq!(back.column_names(), mem.column_names());
        assert_eq!(back.batch().schema(), mem.batch().schema());
        assert_eq!(back.num_rows(), mem.num_rows());
        assert_eq!(back.to_csv(), mem.to_csv());
        assert_eq!(back.job_keys()[BATCH_ROWS + 9], Hash::of("0"));
        assert_eq!(back.job_keys()[BATCH_ROWS + 10], Hash::of("2"));
        // No temp file is left next to the output.
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn text_columns_are_dictionaries_that_decode_to_the_same_strings() {
        let cols = vec![
            ("name".to_string(), Kind::Str),
            ("n".to_string(), Kind::Int),
        ];
        let mut b = Batch::new(schema(&cols), &cols);
        b.step.append_slice(&[0, 1, 2, 3, 4]);
        b.value.append_slice(&[0.0; 5]);
        for (v, n) in [(Some("x"), 2), (None, 1), (Some("x"), 1), (Some("y"), 1)] {
            b.params[0].append_n(&Cell::Text(v.map(String::from)), n);
            b.params[1].append_n(&Cell::Int(Some(7)), n);
        }
        b.job_key.append_n(Some("k1"), 3);
        b.job_key.append_n(Some("k2"), 2);
        let rb = b.finish().unwrap();
        let d = rb.column(2).as_dictionary::<Int32Type>();
        assert_eq!(
            d.values().len(),
            2,
            "one dictionary entry per distinct value"
        );
        let s = d.downcast_dict::<StringArray>().unwrap();
        let got: Vec<Option<&str>> = s.into_iter().collect();
        assert_eq!(got, [Some("x"), Some("x"), None, Some("x"), Some("y")]);
        let k = rb.column(4).as_dictionary::<Int32Type>();
        let ks: Vec<Option<&str>> = k
            .downcast_dict::<StringArray>()
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(
            ks,
            [Some("k1"), Some("k1"), Some("k1"), Some("k2"), Some("k2")]
        );
        assert_eq!(b.rows, 0);
    }

    #[test]
    fn a_failing_reader_leaves_no_file_behind() {
        let p = json!({"a": 1});
        let metas = [JobMeta {
            key: Hash::of("1"),
            params: &p,
            param_order: &[],
            param_types: &NO_TYPES,
        }];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.parquet");
        let e = write_parquet(
            &metas,
            |sink| {
                sink(0, series(3, 0.0))?;
                Err(MetricsError::Arrow {
                    message: "boom".into(),
                })
            },
            &path,
        )
        .unwrap_err();
        assert!(e.to_string().contains("boom"), "{e}");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
