//! Entry point of the `compile` cargo-fuzz target (`fuzz/fuzz_targets/compile.rs`), kept in the
//! library so `tests/campaign_fuzz_replay.rs` replays the saved corpus with the same checks.
//!
//! Input: bytes up to the first NUL are an experiment YAML document; the rest are overrides,
//! one per line. Top-level `runner:` and `execution:` sections, if present, are also read as a
//! runner and an execution config. The function never returns an error; it panics only when an
//! invariant breaks: a panic inside compilation, a non-deterministic plan, a contract hash
//! that depends on key order, a parent listed after its child, a plan document that does not
//! load back, or an error without a message.

use super::catalog::StageCatalog;
use super::compile::compile_resolved;
use super::config::{ConfigLoader, Env, Mapping, Override, Value, parse_override};
use super::document::{load_plan_document, plan_to_dict};
use super::dryrun::{DryRunOptions, attempt_specs};
use super::execution::ExecutionConfig;
use super::plan::CampaignPlan;
use super::plan_error::PlanError;
use super::runner::RunnerEnvironment;
use super::schema::get;

fn check_error(e: &PlanError) {
    assert!(!e.to_string().is_empty(), "error without a message: {e:?}");
    let _ = e.is_retryable();
}

fn refused(e: &PlanError) -> CompileOutcome {
    check_error(e);
    CompileOutcome::Refused
}

fn shuffle(node: &Value, seed: &mut u64) -> Value {
    match node {
        Value::Mapping(entries) => {
            let mut e: Vec<(String, Value)> = entries
                .iter()
                .map(|(k, v)| (k.clone(), shuffle(v, seed)))
                .collect();
            for i in (1..e.len()).rev() {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let j = (*seed >> 33) as usize % (i + 1);
                e.swap(i, j);
            }
            Value::Mapping(e.into_iter().collect())
        }
        Value::List(items) => Value::List(items.iter().map(|v| shuffle(v, seed)).collect()),
        other => other.clone(),
    }
}

fn fingerprint(plan: &CampaignPlan) -> String {
    serde_json::to_string(&plan_to_dict(plan)).expect("plan documents serialize")
}

fn check_plan(plan: &CampaignPlan) {
    let mut seen = std::collections::HashSet::new();
    for s in &plan.stages {
        for p in &s.parents {
            assert!(
                seen.contains(p.as_str()),
                "parent {p} of {} comes later",
                s.stage_id
            );
        }
        assert!(
            seen.insert(s.stage_id.as_str()),
            "stage {} twice",
            s.stage_id
        );
        assert_eq!(
            s.work.items.len(),
            s.spec.instances as usize,
            "{}",
            s.stage_id
        );
        assert_eq!(
            s.spec.allocation.placements().len(),
            s.spec.instances as usize
        );
        assert_eq!(s.work.topology.groups.len(), s.spec.instances as usize);
    }
    let doc = load_plan_document(&plan_to_dict(plan)).expect("our plan documents load");
    assert_eq!(doc.stages.len(), plan.stages.len());
}

/// What [`compile`] did with an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompileOutcome {
    /// Not UTF-8 or not loadable YAML: nothing to compile.
    Skipped,
    /// Refused with an error (checked to have a message).
    Refused,
    /// Compiled; the number of stages.
    Compiled(usize),
}

/// Target `compile`. See the module docs.
pub fn compile(data: &[u8]) -> CompileOutcome {
    let (yaml, rest) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(yaml) = std::str::from_utf8(yaml) else {
        return CompileOutcome::Skipped;
    };
    let overrides: Vec<Override> = std::str::from_utf8(rest)
        .unwrap_or("")
        .lines()
        .filter_map(|l| parse_override(l).ok())
        .collect();
    let loader = ConfigLoader::new().env(Env::new().with("RUN", "runs/fuzz"));
    let Ok(cfg) = loader.load_str(yaml, "fuzz.yaml", &overrides) else {
        return CompileOutcome::Skipped;
    };
    let config = cfg.into_value();
    let one = |k: &str, v: Value| Value::Mapping(Mapping::from_iter([(k.to_string(), v)]));
    let runner = match get(&config, "runner") {
        Some(r) => match RunnerEnvironment::from_value("fuzz.yaml", &one("runner", r.clone())) {
            Ok(r) => r,
            Err(e) => return refused(&e),
        },
        None => RunnerEnvironment::from_value(
            "fuzz.yaml",
            &one("runner", one("kind", Value::from("slurm"))),
        )
        .expect("a minimal slurm runner parses"),
    };
    let execution = match get(&config, "execution") {
        Some(x) => match ExecutionConfig::from_value("fuzz.yaml", &one("execution", x.clone())) {
            Ok(x) => x,
            Err(e) => return refused(&e),
        },
        None => ExecutionConfig::default(),
    };
    let catalog = match StageCatalog::from_config("fuzz.yaml", &config) {
        Ok(c) => c,
        Err(e) => return refused(&e),
    };
    let first = compile_resolved(
        "fuzz.yaml",
        config.clone(),
        &overrides,
        &catalog,
        &runner,
        &execution,
        None,
    );
    let second = compile_resolved(
        "fuzz.yaml",
        config.clone(),
        &overrides,
        &catalog,
        &runner,
        &execution,
        None,
    );
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                a.contract_hash, b.contract_hash,
                "contract hash not deterministic"
            );
            assert_eq!(fingerprint(a), fingerprint(b), "plan not deterministic");
            check_plan(a);
            let mut seed = a.contract_hash.to_hex().len() as u64 ^ 0x9e37_79b9;
            let shuffled = shuffle(&config, &mut seed);
            let catalog2 = StageCatalog::from_config("fuzz.yaml", &shuffled)
                .expect("reordering keys keeps the catalog valid");
            let c = compile_resolved(
                "fuzz.yaml",
                shuffled,
                &overrides,
                &catalog2,
                &runner,
                &execution,
                None,
            )
            .expect("reordering keys keeps the plan valid");
            assert_eq!(
                a.contract_hash, c.contract_hash,
                "contract hash depends on key order"
            );
            match attempt_specs(a, &DryRunOptions::default()) {
                Ok(specs) => {
                    let jobs = a.stages.iter().filter(|s| s.decision.is_none()).count();
                    assert_eq!(specs.len(), jobs, "one spec list per stage that runs a job");
                    for (_, _, spec) in specs.iter().flat_map(|s| &s.units) {
                        if let Err(e) = spec.validate() {
                            assert!(!e.to_string().is_empty(), "error without a message");
                        }
                    }
                }
                Err(e) => check_error(&e),
            }
            CompileOutcome::Compiled(a.stages.len())
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string(), "errors not deterministic");
            refused(a)
        }
        _ => panic!("compile is not deterministic"),
    }
}
