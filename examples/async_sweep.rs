//! An isolated sweep driven from async code, on an executor of the user's own
//! (`common/shell_executor.rs`: each run a background `sh` wrapper, state in files, so it
//! passes puzzletron's executor conformance suite).
//!
//! ```sh
//! cargo run --example async_sweep -- --store /tmp/async-sweep
//! ```
//!
//! The drain runs in a task of its own (`drain_async` is `Send`); Ctrl-C aborts that task,
//! which drops the drain: its workers are cancelled through the executor and their runs
//! recorded as interrupted (run the command again and they run again; finished runs are kept).

#[path = "common/shell_executor.rs"]
mod shell_executor;

use std::path::PathBuf;

use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, job};
use serde::{Deserialize, Serialize};
use shell_executor::ShellExecutor;

#[derive(Serialize, Deserialize)]
struct Params {
    /// Where the Collatz sequence starts.
    n: u64,
}

/// Follows the Collatz sequence from `n` to 1, logging each value by step.
fn collatz(p: &Params, run: &mut Run) -> JobResult {
    let mut x = p.n;
    let mut step = 0;
    while x != 1 {
        run.log("x", step, x as f64)?;
        x = if x.is_multiple_of(2) {
            x / 2
        } else {
            3 * x + 1
        };
        step += 1;
    }
    run.log("x", step, 1.0)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A worker process (the executor started this binary for one run) runs it and exits here.
    puzzletron::worker::main_guard();
    let mut args = std::env::args().skip(1);
    let mut store = PathBuf::from(".puzzletron-async");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--store" => store = args.next().ok_or("--store needs a folder")?.into(),
            "--help" | "-h" => {
                println!("usage: async_sweep [--store DIR]   (default .puzzletron-async)");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(store))
}

async fn run(store: PathBuf) -> Result<(), Box<dyn std::error::Error>> {
    // The store first (a new store must start as an empty folder), then the executor's
    // attempt folders inside it.
    let mut sweep = Orchestrator::builder()
        .store_root(&store)
        .executor(ShellExecutor::new(store.join("shell")))
        .isolate(true)
        .build()?;
    let collatz = job!(collatz);
    for n in [6, 7, 27, 97] {
        sweep.run(&collatz, Params { n })?;
    }
    println!("{}", sweep.plan()?);
    let mut task = tokio::spawn(async move {
        let summary = sweep.drain_async().await;
        (sweep, summary)
    });
    let (sweep, summary) = tokio::select! {
        done = &mut task => done?,
        _ = tokio::signal::ctrl_c() => {
            task.abort();
            return Err("interrupted: the runs that started are recorded as interrupted".into());
        }
    };
    println!("{}", summary?.report());
    let x = sweep.recorded("x")?;
    let steps: Vec<(u64, usize)> = sweep
        .enqueued()
        .iter()
        .zip([6u64, 7, 27, 97])
        .map(|(p, n)| {
            let rows = x.job_keys().iter().filter(|k| **k == p.key).count();
            (n, rows - 1)
        })
        .collect();
    for (n, s) in steps {
        println!("collatz {n}: {s} steps");
    }
    Ok(())
}
