//! The Parquet that puzzletron writes is read back by Python's pyarrow with the same schema and
//! values, and `collect` gathers everything a store holds.

mod support;

use std::process::Command;

use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, metrics, store::FsStore};
use support::sweep::{FakeCrate, P, train};

/// [`train`], then a step mark: its rows are in a metrics file (a short run that never flushed
/// keeps them in its record instead).
fn train_marked(p: &P, run: &mut Run) -> JobResult {
    train(p, run)?;
    run.flush()?;
    Ok(())
}

/// A store holding `f` run at (lr 0.5, hidden 8) and (lr 0.25, hidden 16).
fn two_runs(f: fn(&P, &mut Run) -> JobResult) -> (FakeCrate, Orchestrator<FsStore>) {
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let job = c.job(f);
    for (lr, hidden) in [(0.5, 8), (0.25, 16)] {
        o.run(&job, P { lr, hidden }).unwrap();
    }
    (c, o)
}

fn pyarrow_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import pyarrow"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        // PUZZLETRON_PYARROW_TESTS=1 (and CI) promise pyarrow: missing is a failure.
        assert!(
            !cfg!(puzzletron_pyarrow_tests) && std::env::var_os("CI").is_none(),
            "python3 with pyarrow is missing but PUZZLETRON_PYARROW_TESTS=1 or CI is set (.ci/run \
             must pip install it)"
        );
        eprintln!("SKIP: python3 with pyarrow not found (pip install pyarrow)");
    }
    ok
}

#[cfg_attr(
    not(puzzletron_pyarrow_tests),
    ignore = "needs python3 with pyarrow: pip install pyarrow and set PUZZLETRON_PYARROW_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn parquet_reads_back_in_pyarrow_with_the_same_schema_and_values() {
    let (c, mut o) = two_runs(train);
    let t = o.get("loss").unwrap();
    let path = c.path().join("loss.parquet");
    t.write_parquet(&path).unwrap();
    t.write_csv(c.path().join("loss.csv")).unwrap();
    if !pyarrow_available() {
        return;
    }
    let script = r#"
import json, sys
import pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
print(json.dumps({"schema": [[f.name, str(f.type)] for f in t.schema], "rows": t.to_pylist()}))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["schema"],
        serde_json::json!([
            ["step", "int64"],
            ["value", "double"],
            ["lr", "double"],
            ["hidden", "int64"],
            ["job_key", "string"]
        ])
    );
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), t.num_rows());
    let keys = t.job_keys();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row["step"].as_i64(), Some(t.steps()[i]));
        assert_eq!(row["value"].as_f64(), Some(t.values()[i]));
        assert_eq!(row["job_key"].as_str(), Some(keys[i].to_hex().as_str()));
    }
    assert_eq!(rows[0]["lr"].as_f64(), Some(0.5));
    assert_eq!(rows[3]["hidden"].as_i64(), Some(16));

    // The CSV reads back too (pyarrow's CSV reader).
    let csv = r#"
import sys, pyarrow.csv as pc
t = pc.read_csv(sys.argv[1])
print(t.num_rows, t.column_names)
"#;
    let out = Command::new("python3")
        .args(["-c", csv])
        .arg(c.path().join("loss.csv"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "6 ['step', 'value', 'lr', 'hidden', 'job_key']"
    );
}

#[test]
fn collect_gathers_every_metric_of_every_done_job() {
    let (_c, mut o) = two_runs(train);
    o.drain().unwrap();
    let t = metrics::collect(o.store()).unwrap();
    assert_eq!(
        t.column_names(),
        ["metric", "step", "value", "lr", "hidden", "job_key"]
    );
    assert_eq!(t.num_rows(), 8, "2 jobs x (3 loss + 1 acc)");
    let m: Vec<String> = t.strings("metric").unwrap().into_iter().flatten().collect();
    assert_eq!(m.iter().filter(|s| *s == "acc").count(), 2);
    assert_eq!(m.iter().filter(|s| *s == "loss").count(), 6);
}

/// Reads a Parquet file back with the parquet crate into one table (small files: one batch).
fn read_parquet(path: &std::path::Path) -> puzzletron::metrics::MetricTable {
    let f = std::fs::File::open(path).unwrap();
    let mut r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let batch = r.next().expect("a batch").unwrap();
    assert!(r.next().is_none(), "one batch for a small table");
    puzzletron::metrics::MetricTable::from_batch(batch)
}

#[test]
fn streamed_parquet_equals_the_in_memory_table_and_ignores_a_torn_tail() {
    use puzzletron::metrics::MetricsExt;
    let (c, mut o) = two_runs(train_marked);
    let t = o.get("loss").unwrap();
    // A torn line after a finished attempt's rows (a crash of a later writer, a copy cut short):
    // not the record's, so neither path reads it.
    let key = t.job_keys()[0];
    let tsv = o.store().job_dir(&key).join("metrics.1.tsv");
    assert!(tsv.is_file(), "{}", tsv.display());
    let intact = std::fs::metadata(&tsv).unwrap().len();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&tsv)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"loss\t9\t0."))
        .unwrap();
    // Read as an attempt's rows it is dropped and reported (file and offset) as a warning.
    let (rows, torn) = o.store().attempt_metrics(&key, 1).unwrap();
    assert_eq!(rows.len(), 4, "3 loss + 1 acc rows");
    let torn = torn.expect("torn tail reported");
    assert_eq!(torn.path, tsv);
    assert_eq!(torn.offset, intact);
    assert_eq!(torn.bytes, 9, "`loss\\t9\\t0.`");
    assert!(torn.to_string().starts_with("warning: "), "{torn}");

    let sweep = c.path().join("sweep.parquet");
    assert_eq!(o.write_metric_parquet("loss", &sweep).unwrap(), 6);
    let back = read_parquet(&sweep);
    assert_eq!(back.batch().schema(), t.batch().schema());
    assert_eq!(back.to_csv(), t.to_csv());
    assert_eq!(back.strings("job_key").unwrap().len(), 6);

    let all = c.path().join("store.parquet");
    assert_eq!(o.store().write_metric_parquet("loss", &all).unwrap(), 6);
    let st = o.store().metric_table("loss").unwrap();
    assert_eq!(read_parquet(&all).to_csv(), st.to_csv());

    let e = o.store().write_metric_parquet("nope", &all).unwrap_err();
    assert!(e.to_string().contains("loss"), "{e}");
    let e = o.write_metric_parquet("nope", &all).unwrap_err();
    assert!(e.to_string().contains("acc, loss"), "{e}");

    if !pyarrow_available() {
        return;
    }
    // pyarrow/pandas read the streamed file as the in-memory one: plain strings (object dtype
    // in pandas, not categorical), the same values.
    let script = r#"
import sys
import pyarrow.parquet as pq
a, b = pq.read_table(sys.argv[1]), pq.read_table(sys.argv[2])
assert a.schema.equals(b.schema), (a.schema, b.schema)
assert a.equals(b)
try:
    import pandas
    da, db = a.to_pandas(), b.to_pandas()
    assert str(da["job_key"].dtype) == "object", da.dtypes
    assert da.equals(db)
except ImportError:
    pass
print(a.num_rows, [str(f.type) for f in a.schema])
"#;
    let mem = c.path().join("mem.parquet");
    t.write_parquet(&mem).unwrap();
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(&sweep)
        .arg(&mem)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "6 ['int64', 'double', 'double', 'int64', 'string']"
    );
}
