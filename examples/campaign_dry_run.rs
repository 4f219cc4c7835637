//! Compiles a campaign and prints its dry run: what would be submitted, per stage.
//!
//! ```text
//! cargo run --example campaign_dry_run -- EXPERIMENT.yaml RUNNER.yaml EXECUTION.yaml [OVERRIDE...]
//! ```
//! Without arguments it uses the shared Qwen MoE fixture triple (`../shared/fixtures`).
//! Exit status: 0 printed, 1 the configuration could not be loaded or compiled, 2 bad arguments.

use std::path::{Path, PathBuf};

use puzzletron::campaign::config::Override;
use puzzletron::campaign::{DryRunOptions, default_executor, render_dry_run};
use puzzletron::campaign::{ExecutionConfig, RunnerEnvironment, compile_campaign_plan};

const USAGE: &str = "\
usage: campaign_dry_run [EXPERIMENT.yaml RUNNER.yaml EXECUTION.yaml [OVERRIDE...]]

Compiles a campaign and prints what would be submitted, per stage (nothing is run).
  EXPERIMENT.yaml   the experiment (stages and their settings)
  RUNNER.yaml       the runner environment (local, slurm, baremetal or ray)
  EXECUTION.yaml    the execution policies (failure/halt policy, resources)
  OVERRIDE...       Hydra-style overrides of the experiment, e.g. pruning.eval_samples=4
                    or +notes=smoke (both work on the Qwen MoE production run)
Without arguments: the shared Qwen MoE fixture triple (../shared/fixtures).
  -h, --help        this help";

/// The three files and the overrides.
struct Inputs {
    experiment: PathBuf,
    runner: PathBuf,
    execution: PathBuf,
    overrides: Vec<Override>,
}

/// `Ok(None)`: help was asked for.
fn parse_args(args: &[String]) -> Result<Option<Inputs>, String> {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(None);
    }
    // Overrides never start with '-' (Hydra's grammar: key=value, +key=value, ~key).
    if let Some(flag) = args.iter().find(|a| a.starts_with('-')) {
        return Err(format!("unknown option {flag:?}"));
    }
    if args.is_empty() {
        let fixtures = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/puzzletron-configs"
        ));
        return Ok(Some(Inputs {
            experiment: fixtures.join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
            runner: fixtures.join("orchestration/qwen_moe/runner.slurm.yaml"),
            execution: fixtures.join("orchestration/qwen_moe/execution.production.yaml"),
            overrides: Vec::new(),
        }));
    }
    if args.len() < 3 {
        return Err(format!(
            "expected no arguments or at least 3 (EXPERIMENT.yaml RUNNER.yaml EXECUTION.yaml), \
             got {}: {args:?}",
            args.len()
        ));
    }
    Ok(Some(Inputs {
        experiment: PathBuf::from(&args[0]),
        runner: PathBuf::from(&args[1]),
        execution: PathBuf::from(&args[2]),
        overrides: args[3..]
            .iter()
            .map(|a| a.parse().map_err(|e| format!("override {a:?}: {e}")))
            .collect::<Result<_, _>>()?,
    }))
}

/// `what path: error`, unless the error's own text already names the path.
fn at(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    let text = e.to_string();
    if text.contains(&path.display().to_string()) {
        text
    } else {
        format!("{what} {}: {text}", path.display())
    }
}

fn run(inputs: &Inputs) -> Result<String, String> {
    let runner = RunnerEnvironment::load(&inputs.runner)
        .map_err(|e| at("runner environment", &inputs.runner, e))?;
    let execution = ExecutionConfig::load(&inputs.execution)
        .map_err(|e| at("execution config", &inputs.execution, e))?;
    let plan = compile_campaign_plan(
        &inputs.experiment,
        &runner,
        &execution,
        &inputs.overrides,
        None,
    )
    .map_err(|e| at("experiment", &inputs.experiment, e))?;
    // The executor `campaign run` would use, on a campaign folder named in the output (the
    // dry run creates nothing there).
    let opts = DryRunOptions::default();
    let executor =
        default_executor(&plan, &opts.campaign_dir, &[], None).map_err(|e| e.to_string())?;
    render_dry_run(&plan, &opts, executor.as_ref()).map_err(|e| e.to_string())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match parse_args(&args) {
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            2
        }
        Ok(None) => {
            println!("{USAGE}");
            0
        }
        Ok(Some(inputs)) => match run(&inputs) {
            Ok(text) => {
                print!("{text}");
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}
