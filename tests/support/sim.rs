//! A simulated campaign of many work items on the mock executor, with injected faults.

use std::sync::Arc;
use std::time::Duration;

use puzzletron::campaign::CampaignPlan;
use puzzletron::campaign::controller::{
    CampaignController, CampaignReport, RetryPolicy, RunOptions, VirtualClock,
};
use puzzletron::executor::{JobState, MockClock, MockExecutor, MockScript};
use serde_json::json;

use super::plan::PlanBuilder;

pub fn plan(items: u32) -> CampaignPlan {
    PlanBuilder::stages(json!([
        {"id": "prep", "command": ["w"]},
        {"id": "big", "needs": ["prep"], "strategy": "sharded", "instances": items, "aggregate": true, "command": ["w", "{shard_index}"]},
        {"id": "post", "needs": ["big"], "command": ["w"]},
    ]))
    .label("sim")
    .execution(json!({
        "defaults": {"failure_policy": "resume", "halt_policy": "drain", "max_attempts": 3},
        "stages": {"big": {"resource": "cpu"}, "prep": {"resource": "cpu"}, "post": {"resource": "cpu"}}
    }))
    .build()
}

/// Faults by unit index `i` on attempt 1: 2% node failure, 1% application failure (retried
/// under `resume`), 0.5% out of memory (one retry with more resources), 0.5% lost jobs; and
/// 3 failed polls every 1000 polls (scheduler unavailable).
pub fn script(unit: &str, attempt: u32) -> MockScript {
    let h = unit_hash(unit);
    let run = Duration::from_secs(10 + h % 290);
    if attempt == 1 {
        match h % 1000 {
            0..=19 => return MockScript::ends_after(run / 2, JobState::NodeFail).with_exit_code(1),
            20..=29 => return MockScript::fails_after(run / 2, 1),
            30..=34 => return MockScript::ends_after(run / 2, JobState::OutOfMemory),
            35..=39 => return MockScript::ends_after(run / 2, JobState::Lost),
            _ => {}
        }
    }
    MockScript::completes_after(run)
}

/// The fault/duration hash of a unit key (`big/123`; `agg` counts as 7).
pub fn unit_hash(unit: &str) -> u64 {
    let i: u64 = unit
        .rsplit('/')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40
}

/// Whether the unit's first attempt is scripted to fail.
pub fn faulty(unit: &str) -> bool {
    unit_hash(unit) % 1000 < 40
}

pub struct SimResult {
    pub report: CampaignReport,
    pub submits: usize,
    pub jobs: usize,
    /// Controller iterations in all.
    pub iterations: u64,
    /// Poll failures injected.
    pub injected_poll_failures: usize,
}

pub fn run(items: u32, dir: &std::path::Path) -> SimResult {
    let clock = MockClock::new();
    let mock = MockExecutor::with_clock(clock.clone()).with_default_script(|spec| {
        let unit = spec
            .command
            .env
            .get("PUZZLETRON_UNIT")
            .cloned()
            .unwrap_or_default();
        let n: u32 = spec
            .command
            .env
            .get("PUZZLETRON_ATTEMPT")
            .and_then(|s| s.parse().ok())
            .unwrap_or(1);
        script(&unit, n)
    });
    let mut ctl = CampaignController::builder()
        // The mock runs nothing, so no worker writes a success marker.
        .require_success_marker(false)
        .plan(plan(items))
        .executor(Arc::new(mock.clone()))
        .campaign_dir(dir)
        .clock(Arc::new(VirtualClock::new(clock)))
        .poll_interval(Duration::from_secs(5), Duration::from_secs(30))
        .max_live(10_000)
        .allow_oom_retry("big")
        .retry_policy(RetryPolicy::default().with_base_delay(Duration::from_secs(10)))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut injected = 0;
    let mut submits = 0;
    let mut i = 0u64;
    let mut iterations = 0;
    let report = loop {
        // 3 failed polls (scheduler unavailable) every 200 iterations.
        if i.is_multiple_of(200) {
            mock.fail_polls(
                3,
                "slurm_load_jobs error: Socket timed out on send/recv operation",
            );
            injected += 3;
        }
        i += 50;
        let r = rt
            .block_on(ctl.run(RunOptions::default().with_max_iterations(Some(50))))
            .unwrap();
        // The mock records every call; count the submits and forget the calls, as a long
        // simulation would (the jobs themselves stay).
        submits += mock
            .calls()
            .iter()
            .filter(|c| matches!(c, puzzletron::executor::MockCall::Submit { .. }))
            .count();
        mock.clear_calls();
        iterations += r.iterations;
        if !r.detached {
            break r;
        }
    };
    SimResult {
        report,
        submits,
        jobs: mock.job_count(),
        injected_poll_failures: injected,
        iterations,
    }
}
