//! The main sweep: an MLP on real handwritten digits over a learning-rate x hidden-size grid.
//!
//! ```text
//! cargo run --release --example sweep            # runs what is not done, writes metrics.parquet
//! cargo run --release --example sweep            # again: nothing runs, every run "up to date"
//! cargo run --release --example sweep -- --help
//! cargo run --release --example sweep -- --executor local   # each run in its own process
//! cargo run --release --example sweep -- --executor slurm   # each run a Slurm array task
//! ```
//!
//! Results live in `.puzzletron/` (an `FsStore`); edit a comment here and nothing re-runs, edit
//! the training code (`examples/common/digits.rs` or `train` below) and every run re-runs with
//! the reason "code changed: ...".

#[path = "common/digits.rs"]
mod digits;

use std::path::PathBuf;

#[cfg(feature = "slurm")]
use puzzletron::executor::SlurmExecutor;
use puzzletron::executor::{Executor, InProcess, LocalExecutor};
use puzzletron::identity::Modules;
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job};
use serde::{Deserialize, Serialize};

/// One configuration of the grid.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Params {
    lr: f64,
    hidden: usize,
    epochs: u32,
    batch: usize,
    seed: u64,
}

/// Trains the MLP, logging `train_loss` and `val_accuracy` after every epoch.
fn train(p: &Params, run: &mut Run) -> JobResult {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv");
    let (train, val) = digits::load(&data)?;
    let mut rng = digits::Rng::new(p.seed);
    let mut model = digits::Mlp::new(p.hidden, &mut rng);
    for epoch in 1..=p.epochs {
        let loss = model.train_epoch(&train, p.lr, p.batch, &mut rng);
        run.log("train_loss", epoch.into(), loss)?;
        run.log("val_accuracy", epoch.into(), model.accuracy(&val))?;
    }
    Ok(())
}

struct Args {
    store: PathBuf,
    out: PathBuf,
    epochs: u32,
    force: bool,
    executor: String,
}

/// `--epochs`: a positive integer that fits in u32.
fn parse_epochs(v: &str) -> Result<u32, String> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("--epochs: {v:?} is not a positive integer"));
    }
    match v.parse::<u32>() {
        Ok(0) => Err("--epochs: 0 trains nothing; expected at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("--epochs: {v} is too large (at most {})", u32::MAX)),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        store: ".puzzletron".into(),
        out: "metrics.parquet".into(),
        epochs: 15,
        force: false,
        executor: "inprocess".into(),
    };
    let mut it = std::env::args().skip(1);
    let mut seen = std::collections::HashSet::new();
    while let Some(arg) = it.next() {
        // `--epochs 3` and `--epochs=3` alike.
        let (arg, mut inline) = match arg.split_once('=') {
            Some((name, v)) if name.starts_with("--") => (name.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let has_value = inline.is_some();
        let mut value = |name: &str| {
            inline
                .take()
                .or_else(|| it.next())
                .ok_or(format!("{name} needs a value"))
        };
        if arg.starts_with("--") && !seen.insert(arg.clone()) {
            return Err(format!("{arg} is given twice; give it once"));
        }
        match arg.as_str() {
            "--store" => a.store = value("--store")?.into(),
            "--out" => {
                a.out = value("--out")?.into();
                // Checked before any training: the table is written at the very end.
                if a.out
                    .extension()
                    .is_none_or(|e| e != "parquet" && e != "csv")
                {
                    return Err(format!(
                        "--out: {:?} must end in .parquet or .csv",
                        a.out.display().to_string()
                    ));
                }
                let parent = match a.out.parent() {
                    Some(p) if !p.as_os_str().is_empty() => p,
                    _ => std::path::Path::new("."),
                };
                if !parent.is_dir() {
                    return Err(format!(
                        "--out: {:?} is in {:?}, which is not an existing folder",
                        a.out.display().to_string(),
                        parent.display().to_string()
                    ));
                }
            }
            "--epochs" => {
                let v = value("--epochs")?;
                a.epochs = parse_epochs(&v)?;
            }
            "--force" if !has_value => a.force = true,
            "--force" => return Err("--force takes no value".to_string()),
            "--executor" => {
                a.executor = value("--executor")?;
                if !["inprocess", "local", "slurm"].contains(&a.executor.as_str()) {
                    return Err(format!(
                        "--executor: {:?} is not one of inprocess, local, slurm",
                        a.executor
                    ));
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: sweep [--store DIR (.puzzletron)] [--out FILE.parquet|FILE.csv (metrics.parquet)] [--epochs N (15)] [--force] [--executor inprocess|local|slurm (inprocess)]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help")),
        }
    }
    Ok(a)
}

fn main() {
    // In a worker process (isolated runs) this runs the one job and exits.
    puzzletron::worker::main_guard();
    // Exit codes as the `puzzletron` command line's: 2 for a usage error, 1 for a failure.
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = sweep_main(args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn sweep_main(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let builder = Orchestrator::builder()
        .store_root(&args.store)
        .owned(Modules::all().with_file("common/digits.rs"))
        .force(args.force)
        .on_event(|e| eprintln!("{e}"));
    // The same sweep in this process, as local processes, or as a Slurm job array. The
    // executors keep their attempt folders inside the store, so the store is made first (a
    // new store must start as an empty folder).
    if args.executor != "inprocess" {
        puzzletron::store::FsStore::create(&args.store)?;
    }
    let executor: Box<dyn Executor> = match args.executor.as_str() {
        "local" => Box::new(LocalExecutor::builder(args.store.join("local")).build()?),
        #[cfg(feature = "slurm")]
        "slurm" => Box::new(SlurmExecutor::builder(args.store.join("slurm")).build()?),
        #[cfg(not(feature = "slurm"))]
        "slurm" => return Err("this build has no Slurm support (feature `slurm`)".into()),
        _ => Box::new(InProcess),
    };
    let mut sweep = builder
        .executor(executor)
        .isolate(args.executor != "inprocess")
        .build()?;
    let train = job!(train);
    for lr in [0.02, 0.1, 0.5] {
        for hidden in [8, 32, 64] {
            sweep.run(
                &train,
                Params {
                    lr,
                    hidden,
                    epochs: args.epochs,
                    batch: 32,
                    seed: 7,
                },
            )?;
        }
    }

    println!("plan:\n{}\n", sweep.plan()?);
    let summary = match sweep.drain() {
        Ok(s) => s,
        Err(failed) => {
            eprintln!("{}", failed.summary.report());
            return Err(failed.into());
        }
    };
    println!("summary:\n{}\n", summary.report());

    let acc = sweep.get("val_accuracy")?;
    if args.out.extension().is_some_and(|e| e == "csv") {
        acc.write_csv(&args.out)?;
    } else {
        acc.write_parquet(&args.out)?;
    }
    let plot = args.out.with_extension("svg");
    acc.write_svg(&plot, "validation accuracy per epoch")?;
    // The best configuration by final validation accuracy.
    let (steps, values, keys) = (acc.steps(), acc.values(), acc.job_keys());
    let last = steps.iter().copied().max().unwrap_or(0);
    let best = (0..acc.num_rows())
        .filter(|&r| steps[r] == last)
        .max_by(|&a, &b| values[a].total_cmp(&values[b]))
        .ok_or("no rows")?;
    let run = sweep
        .enqueued()
        .iter()
        .find(|p| p.key == keys[best])
        .ok_or("best run not found")?;
    println!(
        "best: val_accuracy {:.4} at epoch {last} with {}",
        values[best],
        run.params()
    );
    println!(
        "wrote {} ({} rows; columns {}) and {}",
        args.out.display(),
        acc.num_rows(),
        acc.column_names().join(", "),
        plot.display()
    );
    Ok(())
}
