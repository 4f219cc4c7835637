//! `puzzletron sweep ...`.

use std::path::{Path, PathBuf};

use super::{CliError, SweepCmd, exit};
use crate::metrics::MetricTable;
use crate::report::{SweepHistory, SweepStatus, render_sweep_report};
use crate::store::{FsStore, SetAside};

pub(super) fn run(cmd: SweepCmd) -> Result<i32, CliError> {
    match cmd {
        SweepCmd::Status { store, json } => status(&store, json),
        SweepCmd::Ls { store, state } => ls(&store, state.as_deref()),
        SweepCmd::Metrics { store, metric, out } => metrics(&store, metric.as_deref(), out),
        SweepCmd::Plot { store, metric, out } => plot(&store, &metric, out),
        SweepCmd::Report { store, out } => report(&store, out),
        SweepCmd::Gc {
            store,
            dry_run,
            keep,
        } => gc(&store, dry_run, keep.as_deref()),
        SweepCmd::Repair { store, dry_run } => repair(&store, dry_run),
    }
}

/// Opens an existing store (never creates one: a typo must not make an empty store).
fn open(root: &Path) -> Result<FsStore, CliError> {
    if !root.is_dir() {
        let why = if root.exists() {
            "it is a file, not a folder"
        } else {
            "no such folder"
        };
        return Err(CliError::new(format!(
            "{} is not a sweep store: {why} (expected the store_root of a sweep, e.g. .puzzletron)",
            root.display()
        )));
    }
    if std::fs::read_dir(root)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
    {
        return Err(CliError::new(format!(
            "{} is not a sweep store: the folder is empty",
            root.display()
        )));
    }
    Ok(FsStore::open(root)?)
}

fn status(root: &Path, json: bool) -> Result<i32, CliError> {
    let store = open(root)?;
    // Counts in chunks: a store of a million runs in bounded memory.
    let st = SweepStatus::scan(&store)?;
    if json {
        let counts: serde_json::Map<String, serde_json::Value> = st
            .counts
            .iter()
            .map(|(k, v)| (k.clone(), (*v).into()))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "store": st.location,
                "runs": st.runs,
                "states": counts,
                "superseded": st.superseded,
                "metrics": st.metrics,
            }))?
        );
    } else {
        println!("store {}: {} runs", st.location, st.runs);
        for (s, n) in &st.counts {
            println!("  {s:<12} {n}");
        }
        if st.superseded > 0 {
            println!(
                "  ({} superseded by a newer run of the same job and parameters; `sweep gc` removes them)",
                st.superseded
            );
        }
        if !st.metrics.is_empty() {
            println!("metrics: {}", st.metrics.join(", "));
        }
        for (key, error) in &st.corrupt {
            println!("corrupt {}: {error}", &key[..16.min(key.len())]);
        }
    }
    Ok(exit::DONE)
}

/// Moves the folders of the store's corrupt runs aside (`Store::set_aside`).
fn repair(root: &Path, dry_run: bool) -> Result<i32, CliError> {
    use crate::store::Store;
    let store = open(root)?;
    let h = SweepHistory::load(&store)?;
    let mut n = 0;
    let mut others = 0;
    for r in h.runs.iter().filter(|r| r.state == "corrupt") {
        let key: crate::identity::Hash = r
            .key
            .parse()
            .map_err(|e| CliError::new(format!("run key {:?}: {e}", r.key)))?;
        if dry_run {
            n += 1;
            println!(
                "would move {} aside: {}",
                store.job_dir(&key).display(),
                r.error.as_deref().unwrap_or("")
            );
            continue;
        }
        match store.set_aside(&key)? {
            // Another process repaired or moved it first: not counted as moved here.
            SetAside::NotMoved(why) => {
                others += 1;
                println!("not moved: {why}");
            }
            SetAside::Moved(to) => {
                n += 1;
                println!("moved {} to {to}", store.job_dir(&key).display());
            }
            _ => {
                return Err(CliError::new(format!(
                    "{}: this store cannot move records aside",
                    store.location()
                )));
            }
        }
    }
    println!(
        "{n} corrupt run(s) {}",
        if dry_run {
            "would be moved aside (nothing changed)"
        } else {
            "moved aside: the next drain of their sweep runs them again"
        }
    );
    if others > 0 {
        println!("{others} corrupt run(s) were repaired or moved aside by another process");
    }
    Ok(exit::DONE)
}

fn ls(root: &Path, state: Option<&str>) -> Result<i32, CliError> {
    let store = open(root)?;
    let h = SweepHistory::load(&store)?;
    for r in h.runs.iter().filter(|r| state.is_none_or(|s| r.state == s)) {
        println!(
            "{}  {:<11}  {}  {}{}",
            &r.key[..16.min(r.key.len())],
            r.state,
            r.job,
            r.params,
            if r.superseded { "  (superseded)" } else { "" }
        );
    }
    Ok(exit::DONE)
}

/// The metric table, restricted to `metric` when given.
fn table(store: &FsStore, metric: Option<&str>) -> Result<MetricTable, CliError> {
    let all = crate::metrics::collect(store)?;
    let Some(m) = metric else {
        return Ok(all);
    };
    let names = all.strings("metric").unwrap_or_default();
    if !names.iter().any(|n| n.as_deref() == Some(m)) {
        let mut known: Vec<String> = names.into_iter().flatten().collect();
        known.sort();
        known.dedup();
        return Err(CliError::new(format!(
            "metric {m:?} is not in the store; it has: {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    }
    let mask: arrow_array::BooleanArray = names
        .iter()
        .map(|n| Some(n.as_deref() == Some(m)))
        .collect();
    let batch = arrow_select_filter(all.batch(), &mask)?;
    Ok(MetricTable::from_batch(batch))
}

/// Keeps the rows where `mask` is true (a small `filter` for the columns a metric table has).
fn arrow_select_filter(
    batch: &arrow_array::RecordBatch,
    mask: &arrow_array::BooleanArray,
) -> Result<arrow_array::RecordBatch, CliError> {
    let idx: Vec<u32> = (0..mask.len())
        .filter(|&i| mask.value(i))
        .map(|i| i as u32)
        .collect();
    let cols = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx))
        .collect::<Result<Vec<_>, _>>()?;
    arrow_array::RecordBatch::try_new(batch.schema(), cols).map_err(CliError::from)
}

fn take(c: &dyn arrow_array::Array, idx: &[u32]) -> Result<arrow_array::ArrayRef, CliError> {
    use arrow_array::Array as _;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, UInt64Type};
    use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray, UInt64Array};
    use arrow_schema::DataType;
    use std::sync::Arc;
    let ix = |i: &u32| *i as usize;
    Ok(match c.data_type() {
        DataType::Int64 => {
            let a = c.as_primitive::<Int64Type>();
            Arc::new(
                idx.iter()
                    .map(|i| (!a.is_null(ix(i))).then(|| a.value(ix(i))))
                    .collect::<Int64Array>(),
            ) as ArrayRef
        }
        DataType::UInt64 => {
            let a = c.as_primitive::<UInt64Type>();
            Arc::new(
                idx.iter()
                    .map(|i| (!a.is_null(ix(i))).then(|| a.value(ix(i))))
                    .collect::<UInt64Array>(),
            ) as ArrayRef
        }
        DataType::Float64 => {
            let a = c.as_primitive::<Float64Type>();
            Arc::new(
                idx.iter()
                    .map(|i| (!a.is_null(ix(i))).then(|| a.value(ix(i))))
                    .collect::<Float64Array>(),
            ) as ArrayRef
        }
        DataType::Boolean => {
            let a = c.as_boolean();
            Arc::new(
                idx.iter()
                    .map(|i| (!a.is_null(ix(i))).then(|| a.value(ix(i))))
                    .collect::<BooleanArray>(),
            ) as ArrayRef
        }
        DataType::Utf8 => {
            let a = c.as_string::<i32>();
            Arc::new(
                idx.iter()
                    .map(|i| (!a.is_null(ix(i))).then(|| a.value(ix(i))))
                    .collect::<StringArray>(),
            ) as ArrayRef
        }
        other => {
            return Err(CliError::new(format!(
                "metric table column of type {other} cannot be filtered"
            )));
        }
    })
}

fn metrics(root: &Path, metric: Option<&str>, out: Option<PathBuf>) -> Result<i32, CliError> {
    let store = open(root)?;
    let t = table(&store, metric)?;
    match out {
        None => print!("{}", t.to_csv()),
        Some(p) => {
            match p.extension().and_then(|e| e.to_str()) {
                Some("csv") => t.write_csv(&p)?,
                #[cfg(feature = "parquet")]
                Some("parquet") => t.write_parquet(&p)?,
                _ => {
                    return Err(CliError {
                        code: exit::USAGE,
                        message: format!(
                            "--out {}: expected a file ending in .csv or .parquet",
                            p.display()
                        ),
                    });
                }
            }
            println!("{} rows -> {}", t.num_rows(), p.display());
        }
    }
    Ok(exit::DONE)
}

fn plot(root: &Path, metric: &str, out: Option<PathBuf>) -> Result<i32, CliError> {
    let store = open(root)?;
    let t = table(&store, Some(metric))?;
    let out = out.unwrap_or_else(|| PathBuf::from(format!("{metric}.svg")));
    crate::fsutil::atomic_write(&out, t.to_svg(metric).as_bytes())
        .map_err(|e| CliError::new(format!("writing {}: {e}", out.display())))?;
    println!("{}", out.display());
    Ok(exit::DONE)
}

fn report(root: &Path, out: Option<PathBuf>) -> Result<i32, CliError> {
    let store = open(root)?;
    let h = SweepHistory::load(&store)?;
    let mut plots = Vec::new();
    if !h.metrics.is_empty() {
        for m in &h.metrics {
            let t = table(&store, Some(m))?;
            plots.push((m.clone(), t.to_svg(m)));
        }
    }
    let out = super::report_path(out, root)?;
    crate::fsutil::atomic_write(&out, render_sweep_report(&h, &plots).as_bytes())
        .map_err(|e| CliError::new(format!("writing {}: {e}", out.display())))?;
    println!("{}", out.display());
    Ok(exit::DONE)
}

fn gc(root: &Path, dry_run: bool, keep: Option<&Path>) -> Result<i32, CliError> {
    let store = open(root)?;
    let h = SweepHistory::load(&store)?;
    let keep_keys: Option<Vec<String>> = match keep {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| CliError::new(format!("reading --keep file {}: {e}", p.display())))?;
            let mut v = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let k = line.trim();
                if k.is_empty() || k.starts_with('#') {
                    continue;
                }
                if k.len() != 64 || !k.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(CliError::new(format!(
                        "{} line {}: {k:?} is not a run key (expected 64 hex digits)",
                        p.display(),
                        n + 1
                    )));
                }
                v.push(k.to_ascii_lowercase());
            }
            Some(v)
        }
        None => None,
    };
    let mut removed = 0;
    for r in &h.runs {
        // Never a running run: its owner may be alive and writing; never a corrupt one: it
        // is only ever moved aside (`sweep repair`).
        if r.state == "running" || r.state == "corrupt" {
            continue;
        }
        let remove = match &keep_keys {
            Some(k) => !k.contains(&r.key),
            None => r.superseded,
        };
        if !remove {
            continue;
        }
        let key: crate::identity::Hash = r
            .key
            .parse()
            .map_err(|_| CliError::new(format!("store record with a bad key {:?}", r.key)))?;
        let dir = store.job_dir(&key);
        if dry_run {
            println!(
                "would remove {} ({} {}, {})",
                dir.display(),
                r.job,
                r.params,
                r.state
            );
        } else {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| CliError::new(format!("removing {}: {e}", dir.display())))?;
            println!(
                "removed {} ({} {}, {})",
                dir.display(),
                r.job,
                r.params,
                r.state
            );
        }
        removed += 1;
    }
    println!(
        "{} {removed} of {} runs",
        if dry_run { "would remove" } else { "removed" },
        h.runs.len()
    );
    Ok(exit::DONE)
}
