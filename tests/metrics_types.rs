//! A parameter's column type comes from its Rust type, never from its values: `u64` is
//! `UInt64` even above `i64::MAX`, `Option<T>` is `T` with nulls even when every run has `None`,
//! an enum with a data variant is JSON text even when the runs use only unit variants; the same
//! in the sweep's table, the store's table and the streamed Parquet file. Nulls read as `None`.

use puzzletron::arrow::DataType;
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job, metrics::MetricTable, metrics::MetricsExt, store::FsStore};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Copy)]
enum Schedule {
    Constant,
    Cosine,
    #[allow(dead_code)]
    Warmup(u32),
}

#[derive(Serialize, Deserialize, Clone)]
struct P {
    seed: u64,
    shift: i32,
    never: Option<u64>,
    sometimes: Option<f64>,
    schedule: Schedule,
    hidden: usize,
    big: u128,
}

fn train(p: &P, run: &mut Run) -> JobResult {
    run.log("loss", 0, f64::from(p.shift))?;
    Ok(())
}

fn runs() -> Vec<P> {
    vec![
        P {
            seed: 1,
            shift: -1,
            never: None,
            sometimes: Some(0.5),
            schedule: Schedule::Constant,
            hidden: 16,
            big: 7,
        },
        P {
            seed: u64::MAX,
            shift: 2,
            never: None,
            sometimes: None,
            schedule: Schedule::Cosine,
            hidden: 32,
            // Within u64: a record's `params` is a `serde_json::Value`, which rounds integers
            // beyond u64 to f64 (the key's canonical JSON keeps every digit).
            big: u128::from(u64::MAX),
        },
    ]
}

fn types(t: &MetricTable) -> Vec<(String, DataType)> {
    t.batch()
        .schema()
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect()
}

fn want(text: &DataType) -> Vec<(String, DataType)> {
    [
        ("step", DataType::Int64),
        ("value", DataType::Float64),
        ("seed", DataType::UInt64),
        ("shift", DataType::Int64),
        ("never", DataType::UInt64),
        ("sometimes", DataType::Float64),
        ("schedule", text.clone()),
        ("hidden", DataType::UInt64),
        ("big", text.clone()),
        ("job_key", text.clone()),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t))
    .collect()
}

/// The values of each row (a run's one row), in the order of `shift` (a store's table lists
/// its runs by key, a sweep's in enqueue order).
fn check_values(t: &MetricTable) {
    type Row = (
        Option<i64>,
        Option<u64>,
        Option<u64>,
        Option<f64>,
        Option<u64>,
    );
    let mut rows: Vec<Row> = (0..t.num_rows())
        .map(|i| {
            (
                t.i64s("shift").unwrap()[i],
                t.u64s("seed").unwrap()[i],
                t.u64s("never").unwrap()[i],
                t.f64s("sometimes").unwrap()[i],
                t.u64s("hidden").unwrap()[i],
            )
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    assert_eq!(
        rows,
        [
            (Some(-1), Some(1), None, Some(0.5), Some(16)),
            // Nulls are None, never 0.
            (Some(2), Some(u64::MAX), None, None, Some(32)),
        ]
    );
}

#[test]
fn column_types_come_from_the_rust_type() {
    let dir = tempfile::tempdir().unwrap();
    let mut sweep = Orchestrator::builder()
        .store_root(dir.path())
        .build()
        .unwrap();
    let j = job!(train);
    for p in runs() {
        sweep.run(&j, p).unwrap();
    }
    let t = sweep.get("loss").unwrap();
    assert_eq!(types(&t), want(&DataType::Utf8), "the sweep's table");
    check_values(&t);
    // An enum with a data variant is JSON text, whatever variants the runs used.
    assert_eq!(
        t.strings("schedule").unwrap(),
        [Some("\"Constant\"".into()), Some("\"Cosine\"".into())]
    );
    assert_eq!(
        t.strings("big").unwrap(),
        [Some("7".into()), Some(u64::MAX.to_string())]
    );

    // The store's table, from the records alone.
    let store = FsStore::open(dir.path()).unwrap();
    let t = store.metric_table("loss").unwrap();
    assert_eq!(types(&t), want(&DataType::Utf8), "the store's table");
    check_values(&t);

    // The streamed Parquet file, read back: the same types.
    let path = dir.path().join("loss.parquet");
    store.write_metric_parquet("loss", &path).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let schema = arrow_array::RecordBatchReader::schema(&reader);
    let got: Vec<(String, DataType)> = schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), f.data_type().clone()))
        .collect();
    assert_eq!(got, want(&DataType::Utf8), "the streamed Parquet file");
}

/// A sweep whose every run has `None` keeps the column's type: the next sweep, with values,
/// gives the same type.
#[test]
fn an_all_none_option_has_the_type_of_its_values() {
    #[derive(Serialize, Deserialize)]
    struct Q {
        x: u8,
        limit: Option<i64>,
    }
    fn f(q: &Q, run: &mut Run) -> JobResult {
        run.log("m", 0, f64::from(q.x))?;
        Ok(())
    }
    let dir = tempfile::tempdir().unwrap();
    let mut sweep = Orchestrator::builder()
        .store_root(dir.path())
        .build()
        .unwrap();
    let j = job!(f);
    sweep.run(&j, Q { x: 1, limit: None }).unwrap();
    let none = sweep.get("m").unwrap();
    sweep
        .run(
            &j,
            Q {
                x: 2,
                limit: Some(-3),
            },
        )
        .unwrap();
    let some = sweep.get("m").unwrap();
    let ty = |t: &MetricTable| {
        t.batch()
            .schema()
            .field_with_name("limit")
            .unwrap()
            .data_type()
            .clone()
    };
    assert_eq!(ty(&none), DataType::Int64);
    assert_eq!(ty(&some), DataType::Int64);
    assert_eq!(some.i64s("limit").unwrap(), [None, Some(-3)]);
}
