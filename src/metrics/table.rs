//! [`MetricTable`]: the metrics of a sweep as one Arrow `RecordBatch` (`docs/design.md`,
//! "Metrics").

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{
    BooleanBuilder, Float64Builder, Int64Builder, StringBuilder, UInt64Builder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use serde_json::Value;

use super::MetricsError;
use crate::identity::{Hash, ParamType, canonical_json};
use crate::store::Series;

/// Column names the table owns; parameters may not use them.
pub const RESERVED_COLUMNS: [&str; 3] = ["step", "value", "job_key"];

/// Metric rows of many jobs as an Arrow [`RecordBatch`].
///
/// Columns, in order: `metric: Utf8` (only in tables of several metrics, e.g. from
/// [`collect`](super::collect)), `step: Int64`, `value: Float64`, one column per top-level
/// parameter (below), `job_key: Utf8` (64 hex characters). Rows are grouped by job in the order
/// the jobs were given, each job's rows in logging order.
///
/// # Parameter columns
///
/// A parameter's column type is decided by its Rust type, never by its values, so a column
/// keeps its type from sweep to sweep and from run to run (the type is read when the run is
/// enqueued, [`Orchestrator::run`](crate::Orchestrator::run), from the parameters'
/// `Serialize` and `Deserialize` impls, and kept in the run's record):
///
/// | Rust type of the parameter | Arrow type of its column |
/// | --- | --- |
/// | `i8`, `i16`, `i32`, `i64`, `isize` | `Int64` |
/// | `u8`, `u16`, `u32`, `u64`, `usize` | `UInt64` (even above `i64::MAX`) |
/// | `i128`, `u128` | `Utf8`: decimal digits (no Arrow integer is that wide) |
/// | `f32`, `f64` | `Float64` (even when every value is whole) |
/// | `bool` | `Boolean` |
/// | `String`, `&str`, `char`, an enum of unit variants only | `Utf8` |
/// | `Vec`, arrays, tuples, maps, sets, structs, an enum with a data variant, bytes | `Utf8`: canonical JSON text |
/// | `Option<T>` | `T`'s type, null where `None` (also when every run has `None`) |
/// | a newtype `struct N(T)` | `T`'s type |
///
/// Every parameter column is nullable: a run whose parameters lack the field (a
/// `skip_serializing_if`, another job's parameters in the same table) has a null there. Types
/// whose `Deserialize` cannot be traced (it calls `deserialize_any`: `serde_json::Value`,
/// untagged or internally tagged enums, `flatten`) are typed from the serializer's calls of the
/// values present, the same table for every value that is not `None`; so are records written
/// before the types were kept (an integer of such a record beyond `i64` is text). Columns
/// whose runs disagree (two jobs with one parameter name and different types) are text.
///
/// The Parquet written by [`MetricsExt::write_metric_parquet`](crate::metrics::MetricsExt::write_metric_parquet)
/// stores the `Utf8` columns dictionary-encoded (`Dictionary(Int32, Utf8)`); readers see
/// strings either way.
#[derive(Debug, Clone)]
pub struct MetricTable {
    batch: RecordBatch,
}

impl MetricTable {
    /// Wraps a batch (no checks; use the builders of this crate to make well-formed ones).
    pub fn from_batch(batch: RecordBatch) -> Self {
        Self { batch }
    }

    /// The Arrow batch.
    pub fn batch(&self) -> &RecordBatch {
        &self.batch
    }

    /// Consumes the table, returning the batch.
    pub fn into_batch(self) -> RecordBatch {
        self.batch
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.batch.num_rows() == 0
    }

    /// Column names, in order.
    pub fn column_names(&self) -> Vec<String> {
        self.batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// A column by name.
    pub fn column(&self, name: &str) -> Option<&ArrayRef> {
        self.batch.column_by_name(name)
    }

    /// The `step` column (never null).
    pub fn steps(&self) -> Vec<i64> {
        self.i64s("step")
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.unwrap_or_default())
            .collect()
    }

    /// The `value` column.
    pub fn values(&self) -> Vec<f64> {
        self.f64s("value")
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.unwrap_or(f64::NAN))
            .collect()
    }

    /// The `job_key` column, parsed.
    pub fn job_keys(&self) -> Vec<Hash> {
        self.strings("job_key")
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| s.and_then(|s| s.parse().ok()))
            .collect()
    }

    /// An `Int64` column, nulls as `None` (`None` when absent or of another type).
    pub fn i64s(&self, name: &str) -> Option<Vec<Option<i64>>> {
        let a = self.column(name)?.as_primitive_opt::<Int64Type>()?;
        Some(
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect(),
        )
    }

    /// A `UInt64` column (unsigned parameters), nulls as `None` (`None` when absent or of
    /// another type).
    pub fn u64s(&self, name: &str) -> Option<Vec<Option<u64>>> {
        let a = self.column(name)?.as_primitive_opt::<UInt64Type>()?;
        Some(
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect(),
        )
    }

    /// A `Boolean` column, nulls as `None` (`None` when absent or of another type).
    pub fn bools(&self, name: &str) -> Option<Vec<Option<bool>>> {
        let a = self.column(name)?.as_boolean_opt()?;
        Some(
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect(),
        )
    }

    /// A `Float64` column, nulls as `None` (`None` when absent or of another type).
    pub fn f64s(&self, name: &str) -> Option<Vec<Option<f64>>> {
        let a = self.column(name)?.as_primitive_opt::<Float64Type>()?;
        Some(
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i)))
                .collect(),
        )
    }

    /// A `Utf8` column, nulls as `None` (`None` when absent or of another type).
    pub fn strings(&self, name: &str) -> Option<Vec<Option<String>>> {
        let a = self.column(name)?.as_string_opt::<i32>()?;
        Some(
            (0..a.len())
                .map(|i| (!a.is_null(i)).then(|| a.value(i).to_string()))
                .collect(),
        )
    }

    /// The text of one cell, as CSV and `Display` show it (empty for null).
    pub fn cell(&self, column: usize, row: usize) -> String {
        cell_text(self.batch.column(column).as_ref(), row)
    }

    /// Writes the table as Parquet (Snappy-compressed), atomically: a reader sees the old file or
    /// the whole new one.
    ///
    /// # Errors
    /// [`MetricsError::Io`], [`MetricsError::Parquet`].
    #[cfg(feature = "parquet")]
    #[cfg_attr(docsrs, doc(cfg(feature = "parquet")))]
    pub fn write_parquet(&self, path: impl AsRef<Path>) -> Result<(), MetricsError> {
        use parquet::arrow::ArrowWriter;
        let path = path.as_ref();
        let props = writer_properties();
        let mut buf = Vec::new();
        let perr = |e: parquet::errors::ParquetError| MetricsError::Parquet {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let mut w =
            ArrowWriter::try_new(&mut buf, self.batch.schema(), Some(props)).map_err(perr)?;
        w.write(&self.batch).map_err(perr)?;
        w.close().map_err(perr)?;
        crate::fsutil::atomic_write(path, &buf).map_err(|e| MetricsError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    }

    /// The table as CSV text (RFC 4180 quoting; a header row; nulls empty).
    pub fn to_csv(&self) -> String {
        let mut w = csv::Writer::from_writer(Vec::new());
        // Writing to a Vec cannot fail.
        let _ = w.write_record(self.column_names());
        for r in 0..self.num_rows() {
            let _ = w.write_record((0..self.batch.num_columns()).map(|c| self.cell(c, r)));
        }
        let bytes = w.into_inner().unwrap_or_default();
        String::from_utf8(bytes).unwrap_or_default()
    }

    /// Writes [`to_csv`](Self::to_csv) to `path`, atomically.
    ///
    /// # Errors
    /// [`MetricsError::Io`].
    pub fn write_csv(&self, path: impl AsRef<Path>) -> Result<(), MetricsError> {
        let path = path.as_ref();
        crate::fsutil::atomic_write(path, self.to_csv().as_bytes()).map_err(|e| MetricsError::Io {
            path: path.to_path_buf(),
            source: e,
        })
    }
}

fn cell_text(a: &dyn Array, row: usize) -> String {
    if a.is_null(row) {
        return String::new();
    }
    match a.data_type() {
        DataType::Int64 => a.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(row).to_string(),
        DataType::Float64 => a.as_primitive::<Float64Type>().value(row).to_string(),
        DataType::Boolean => a.as_boolean().value(row).to_string(),
        DataType::Utf8 => a.as_string::<i32>().value(row).to_string(),
        other => format!("<{other}>"),
    }
}

/// Shows up to 20 rows (the first and last 10 of longer tables) and the row count.
impl fmt::Display for MetricTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.column_names();
        let n = self.num_rows();
        let rows: Vec<usize> = if n <= 20 {
            (0..n).collect()
        } else {
            (0..10).chain(n - 10..n).collect()
        };
        let short = |c: usize, r: usize| {
            let t = self.cell(c, r);
            if names[c] == "job_key" && t.len() > 12 {
                t[..12].to_string()
            } else {
                t
            }
        };
        let mut width: Vec<usize> = names.iter().map(|s| s.chars().count()).collect();
        for &r in &rows {
            for (c, w) in width.iter_mut().enumerate() {
                *w = (*w).max(short(c, r).chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: Vec<String>| -> fmt::Result {
            let parts: Vec<String> = cells
                .iter()
                .zip(&width)
                .map(|(s, w)| format!("{s:<w$}", w = *w))
                .collect();
            writeln!(f, "{}", parts.join("  ").trim_end())
        };
        line(f, names.clone())?;
        line(f, width.iter().map(|w| "-".repeat(*w)).collect())?;
        for (i, &r) in rows.iter().enumerate() {
            if n > 20 && i == 10 {
                writeln!(f, "...")?;
            }
            line(f, (0..names.len()).map(|c| short(c, r)).collect())?;
        }
        write!(f, "({n} rows)")
    }
}

/// No declared parameter types (tests, and records older than `param_types`).
#[cfg(test)]
pub(crate) static NO_TYPES: BTreeMap<String, ParamType> = BTreeMap::new();

/// What a table needs of one job besides its rows: its key and parameters.
pub(crate) struct JobMeta<'a> {
    pub key: Hash,
    pub params: &'a Value,
    pub param_order: &'a [String],
    /// Column types from the parameters' Rust types (empty for old records).
    pub param_types: &'a BTreeMap<String, ParamType>,
}

/// One job's contribution to a table.
pub(crate) struct JobRows<'a> {
    pub meta: JobMeta<'a>,
    pub series: Series,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Int,
    UInt,
    Float,
    Bool,
    Str,
    Json,
}

fn kind_of(v: &Value) -> Kind {
    match v {
        Value::Null => Kind::Null,
        Value::Bool(_) => Kind::Bool,
        Value::Number(n) if n.is_i64() => Kind::Int,
        Value::Number(n) if n.is_f64() => Kind::Float,
        Value::Number(_) => Kind::Json, // beyond i64: keep exact digits as text
        Value::String(_) => Kind::Str,
        _ => Kind::Json,
    }
}

fn declared(t: ParamType) -> Kind {
    match t {
        ParamType::Int => Kind::Int,
        ParamType::UInt => Kind::UInt,
        ParamType::Float => Kind::Float,
        ParamType::Bool => Kind::Bool,
        ParamType::String => Kind::Str,
        _ => Kind::Json,
    }
}

fn unify(a: Kind, b: Kind) -> Kind {
    use Kind::*;
    match (a, b) {
        (Null, k) | (k, Null) => k,
        (x, y) if x == y => x,
        (Int, Float) | (Float, Int) => Float,
        _ => Json,
    }
}

/// The top-level parameters of a job as (name, value) pairs; non-object params are one
/// parameter named `params`.
fn top_level(params: &Value) -> Vec<(&str, &Value)> {
    match params {
        Value::Object(m) => m.iter().map(|(k, v)| (k.as_str(), v)).collect(),
        Value::Null => Vec::new(),
        other => vec![("params", other)],
    }
}

/// What the table builders need of a job besides its rows. `params` may be parsed on each
/// call (a compact run of a large store keeps its parameters as text).
pub(crate) trait JobParams {
    fn key(&self) -> Hash;
    fn params(&self) -> std::borrow::Cow<'_, Value>;
    fn param_order(&self) -> &[String];
    fn param_types(&self) -> &BTreeMap<String, ParamType>;
}

impl JobParams for JobMeta<'_> {
    fn key(&self) -> Hash {
        self.key
    }
    fn params(&self) -> std::borrow::Cow<'_, Value> {
        std::borrow::Cow::Borrowed(self.params)
    }
    fn param_order(&self) -> &[String] {
        self.param_order
    }
    fn param_types(&self) -> &BTreeMap<String, ParamType> {
        self.param_types
    }
}

impl JobParams for JobRows<'_> {
    fn key(&self) -> Hash {
        self.meta.key
    }
    fn params(&self) -> std::borrow::Cow<'_, Value> {
        std::borrow::Cow::Borrowed(self.meta.params)
    }
    fn param_order(&self) -> &[String] {
        self.meta.param_order
    }
    fn param_types(&self) -> &BTreeMap<String, ParamType> {
        self.meta.param_types
    }
}

/// The parameter columns of a table of `jobs`, with their kinds.
///
/// Columns: first-seen order over jobs, each job in its declaration order. A column's type
/// comes from the parameters' Rust types where the records say them (so an f64 that is whole in
/// every run is still Float64); from the values only for old records.
pub(super) fn param_columns<J: JobParams>(
    jobs: &[J],
    metric_column: bool,
) -> Result<Vec<(String, Kind)>, MetricsError> {
    let mut cols: Vec<(String, Kind)> = Vec::new();
    let mut types: Vec<Option<Kind>> = Vec::new();
    for j in jobs {
        let params = j.params();
        let tl = top_level(&params);
        let mut ordered: Vec<(&str, &Value)> = Vec::with_capacity(tl.len());
        for name in j.param_order() {
            if let Some(p) = tl.iter().find(|(k, _)| k == name) {
                ordered.push(*p);
            }
        }
        for p in &tl {
            if !j.param_order().iter().any(|n| n == p.0) {
                ordered.push(*p);
            }
        }
        for (name, v) in ordered {
            if RESERVED_COLUMNS.contains(&name) || (metric_column && name == "metric") {
                return Err(MetricsError::ReservedParameter {
                    name: name.to_string(),
                    job_key: j.key(),
                });
            }
            let t = j.param_types().get(name).map(|t| declared(*t));
            match cols.iter().position(|(n, _)| n == name) {
                Some(c) => {
                    cols[c].1 = unify(cols[c].1, kind_of(v));
                    if let Some(t) = t {
                        types[c] = Some(types[c].map_or(t, |k| unify(k, t)));
                    }
                }
                None => {
                    cols.push((name.to_string(), kind_of(v)));
                    types.push(t);
                }
            }
        }
    }
    for ((_, k), t) in cols.iter_mut().zip(&types) {
        match t {
            // An integer beyond i64 in some run: exact digits as text, as before.
            Some(Kind::Int) if *k == Kind::Json => {}
            Some(t) => *k = *t,
            None => {}
        }
    }
    Ok(cols)
}

/// The value of top-level parameter `name` of `params`.
pub(super) fn param_value(params: &Value, name: &str) -> Option<Value> {
    top_level(params)
        .into_iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.clone())
}

/// The text of a parameter in a text column of kind `kind` (strings as they are in a `Str`
/// column, anything else as canonical JSON; null stays null).
pub(super) fn param_text(v: Value, kind: Kind) -> Option<String> {
    match v {
        Value::Null => None,
        Value::String(s) if kind == Kind::Str => Some(s),
        other => canonical_json(&other).ok(),
    }
}

/// Parquet writer settings of metric tables: Snappy; no dictionary for `value` (a metric's
/// values rarely repeat: the writer would hash every value only to fall back to plain encoding).
#[cfg(feature = "parquet")]
pub(super) fn writer_properties() -> parquet::file::properties::WriterProperties {
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    use parquet::schema::types::ColumnPath;
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_column_dictionary_enabled(ColumnPath::from("value"), false)
        .build()
}

/// Builds a table from jobs' rows. `metric_column` adds the `metric` column (rows of several
/// metrics); otherwise every row is assumed to be of one metric.
pub(crate) fn build_table(
    jobs: &[JobRows<'_>],
    metric_column: bool,
) -> Result<MetricTable, MetricsError> {
    let cols = param_columns(jobs, metric_column)?;
    let total: usize = jobs.iter().map(|j| j.series.len()).sum();
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    if metric_column {
        let mut b = StringBuilder::with_capacity(total, total * 8);
        for j in jobs {
            for &i in &j.series.name_index {
                b.append_value(&j.series.names[i as usize]);
            }
        }
        fields.push(Field::new("metric", DataType::Utf8, false));
        arrays.push(Arc::new(b.finish()));
    }
    let mut steps = Int64Builder::with_capacity(total);
    let mut values = Float64Builder::with_capacity(total);
    for j in jobs {
        steps.append_slice(&j.series.step);
        values.append_slice(&j.series.value);
    }
    fields.push(Field::new("step", DataType::Int64, false));
    arrays.push(Arc::new(steps.finish()));
    fields.push(Field::new("value", DataType::Float64, false));
    arrays.push(Arc::new(values.finish()));
    for (name, kind) in &cols {
        let get = |j: &JobRows<'_>| param_value(j.meta.params, name);
        let (dt, array): (DataType, ArrayRef) = match kind {
            Kind::Int => {
                let mut b = Int64Builder::with_capacity(total);
                for j in jobs {
                    let v = get(j).and_then(|v| v.as_i64());
                    b.append_value_n_opt(v, j.series.len());
                }
                (DataType::Int64, Arc::new(b.finish()))
            }
            Kind::UInt => {
                let mut b = UInt64Builder::with_capacity(total);
                for j in jobs {
                    let v = get(j).and_then(|v| v.as_u64());
                    b.append_value_n_opt(v, j.series.len());
                }
                (DataType::UInt64, Arc::new(b.finish()))
            }
            Kind::Float => {
                let mut b = Float64Builder::with_capacity(total);
                for j in jobs {
                    let v = get(j).and_then(|v| v.as_f64());
                    b.append_value_n_opt(v, j.series.len());
                }
                (DataType::Float64, Arc::new(b.finish()))
            }
            Kind::Bool => {
                let mut b = BooleanBuilder::with_capacity(total);
                for j in jobs {
                    let v = get(j).and_then(|v| v.as_bool());
                    for _ in 0..j.series.len() {
                        b.append_option(v);
                    }
                }
                (DataType::Boolean, Arc::new(b.finish()))
            }
            Kind::Str | Kind::Json | Kind::Null => {
                let mut b = StringBuilder::with_capacity(total, total * 8);
                for j in jobs {
                    let v = get(j).and_then(|v| param_text(v, *kind));
                    for _ in 0..j.series.len() {
                        b.append_option(v.as_deref());
                    }
                }
                (DataType::Utf8, Arc::new(b.finish()))
            }
        };
        fields.push(Field::new(name, dt, true));
        arrays.push(array);
    }
    let mut keys = StringBuilder::with_capacity(total, total * 64);
    for j in jobs {
        let hex = j.meta.key.to_hex();
        for _ in 0..j.series.len() {
            keys.append_value(&hex);
        }
    }
    fields.push(Field::new("job_key", DataType::Utf8, false));
    arrays.push(Arc::new(keys.finish()));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).map_err(|e| {
        MetricsError::Arrow {
            message: e.to_string(),
        }
    })?;
    Ok(MetricTable { batch })
}

trait AppendN<T> {
    fn append_value_n_opt(&mut self, v: Option<T>, n: usize);
}

impl AppendN<i64> for Int64Builder {
    fn append_value_n_opt(&mut self, v: Option<i64>, n: usize) {
        match v {
            Some(v) => self.append_value_n(v, n),
            None => self.append_nulls(n),
        }
    }
}

impl AppendN<u64> for UInt64Builder {
    fn append_value_n_opt(&mut self, v: Option<u64>, n: usize) {
        match v {
            Some(v) => self.append_value_n(v, n),
            None => self.append_nulls(n),
        }
    }
}

impl AppendN<f64> for Float64Builder {
    fn append_value_n_opt(&mut self, v: Option<f64>, n: usize) {
        match v {
            Some(v) => self.append_value_n(v, n),
            None => self.append_nulls(n),
        }
    }
}
