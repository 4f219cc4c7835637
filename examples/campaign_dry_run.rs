//! Compiles a campaign and prints its dry run: what would be submitted, per stage.
//!
//! ```text
//! cargo run --example campaign_dry_run -- EXPERIMENT.yaml RUNNER.yaml EXECUTION.yaml [OVERRIDE...]
//! ```
//! Without arguments it uses the shared Qwen MoE fixture triple (`../shared/fixtures`).

use std::path::PathBuf;

use puzzletron::campaign::dryrun::{DryRunOptions, render_dry_run};
use puzzletron::campaign::{ExecutionConfig, RunnerEnvironment, compile_campaign_plan};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fixtures = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ));
    let (exp, runner, exec, overrides) = if args.len() >= 3 {
        (
            PathBuf::from(&args[0]),
            PathBuf::from(&args[1]),
            PathBuf::from(&args[2]),
            args[3..].to_vec(),
        )
    } else {
        (
            fixtures.join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
            fixtures.join("orchestration/qwen_moe/runner.slurm.yaml"),
            fixtures.join("orchestration/qwen_moe/execution.production.yaml"),
            Vec::new(),
        )
    };
    let runner = RunnerEnvironment::load(&runner)?;
    let execution = ExecutionConfig::load(&exec)?;
    let plan = compile_campaign_plan(&exp, &runner, &execution, &overrides, None)?;
    print!("{}", render_dry_run(&plan, &DryRunOptions::default())?);
    Ok(())
}
