//! One controller iteration with 10k live jobs on the mock executor (`docs/design.md`, "Targets": a
//! poll cycle with 10k live jobs well under 100 ms of CPU): lease check, intent scan, stage
//! bookkeeping, one `poll` of all 10k handles, status processing. The jobs never end, so every
//! measured iteration does the same work.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use puzzletron::campaign::config::Value;
use puzzletron::campaign::controller::{CampaignController, RunOptions, VirtualClock};
use puzzletron::campaign::{ExecutionConfig, RunnerEnvironment, StageCatalog, compile_resolved};
use puzzletron::executor::{JobState, MockClock, MockExecutor, MockScript};
use serde_json::json;

fn poll_cycle(c: &mut Criterion) {
    let n = 10_000u32;
    let node = Value::from_json(&json!({"stages": [
        {"id": "big", "strategy": "sharded", "instances": n, "command": ["w"]},
    ]}));
    let catalog = StageCatalog::from_config("bench", &node).unwrap();
    let exec = ExecutionConfig::from_value(
        "bench",
        &Value::from_json(
            &json!({"execution": {"defaults": {}, "stages": {"big": {"resource": "cpu"}}}}),
        ),
    )
    .unwrap();
    let plan = compile_resolved(
        "bench",
        node,
        &[],
        &catalog,
        &RunnerEnvironment::local(),
        &exec,
        None,
    )
    .unwrap();
    let clock = MockClock::new();
    let mock = MockExecutor::with_clock(clock.clone())
        .with_default_script(|_| MockScript::new().at(Duration::ZERO, JobState::Running));
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = CampaignController::builder()
        // The mock runs nothing, so no worker writes a success marker.
        .require_success_marker(false)
        .plan(plan)
        .executor(Arc::new(mock.clone()))
        .campaign_dir(dir.path())
        .clock(Arc::new(VirtualClock::new(clock)))
        .submit_batch(n as usize)
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let once = RunOptions::default().with_once(true);
    let r = rt.block_on(ctl.run(once.clone())).unwrap();
    assert_eq!(r.live, n as usize);
    c.bench_function("controller_iteration_10k_live", |b| {
        b.iter(|| {
            mock.clear_calls();
            rt.block_on(ctl.run(once.clone())).unwrap()
        })
    });
}

criterion_group!(benches, poll_cycle);
criterion_main!(benches);
