//! Controller logic on the mock executor with a virtual clock: exact submit/cancel/retry
//! sequences for every failure class x failure policy x halt policy, strategies (sharded with
//! aggregate, persistent pool with dead workers), recovery (re-attach, adoption by attempt id,
//! intents whose submit never happened), contract changes, lease and journal errors.

mod support;
use support::plan::PlanBuilder;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use puzzletron::campaign::config::Value as ConfigValue;
use puzzletron::campaign::controller::{
    CampaignController, CampaignReport, ControllerError, ControllerEvent, FailureClass, PoolItem,
    PoolWorker, RetryPolicy, RunOptions, VirtualClock,
};
use puzzletron::campaign::{CampaignPlan, RunnerEnvironment};
use puzzletron::executor::{
    AttemptSpec, Executor, JobState, MockCall, MockClock, MockExecutor, MockScript, MockSubmitError,
};
use serde_json::{Value, json};

fn env<'a>(spec: &'a AttemptSpec, k: &str) -> &'a str {
    spec.command.env.get(k).map(String::as_str).unwrap_or("")
}

/// `unit#attempt` from an attempt id `<nonce>.<stage>.<index>.a<n>`.
fn short(id: &str) -> String {
    let rest = id.split_once('.').unwrap().1;
    let (unit, a) = rest.rsplit_once(".a").unwrap();
    let (stage, idx) = unit.rsplit_once('.').unwrap();
    format!("{stage}/{idx}#{a}")
}

/// (unit, attempt, PUZZLETRON_RESUME, PUZZLETRON_MORE_RESOURCES, exclusive) of one submit.
type Seen = (String, String, String, String, bool);

struct Sim {
    mock: MockExecutor,
    clock: MockClock,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Every spec submitted, in order.
    specs: Arc<Mutex<Vec<AttemptSpec>>>,
}

type Script = dyn Fn(&str, u32) -> MockScript + Send + Sync;

fn sim(script: impl Fn(&str, u32) -> MockScript + Send + Sync + 'static) -> Sim {
    let clock = MockClock::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let specs = Arc::new(Mutex::new(Vec::new()));
    let sp = specs.clone();
    let script: Arc<Script> = Arc::new(script);
    let mock = MockExecutor::with_clock(clock.clone()).with_default_script(move |spec| {
        let unit = env(spec, "PUZZLETRON_UNIT").to_string();
        let n: u32 = env(spec, "PUZZLETRON_ATTEMPT").parse().unwrap();
        s2.lock().unwrap().push((
            unit.clone(),
            n.to_string(),
            env(spec, "PUZZLETRON_RESUME").to_string(),
            env(spec, "PUZZLETRON_MORE_RESOURCES").to_string(),
            spec.exclusive,
        ));
        sp.lock().unwrap().push(spec.clone());
        script(&unit, n)
    });
    Sim {
        mock,
        clock,
        seen,
        specs,
    }
}

fn controller(
    p: CampaignPlan,
    s: &Sim,
    dir: &Path,
) -> puzzletron::campaign::controller::CampaignControllerBuilder {
    CampaignController::builder()
        // The mock runs nothing, so no worker writes a success marker.
        .require_success_marker(false)
        .plan(p)
        .executor(Arc::new(s.mock.clone()))
        .campaign_dir(dir)
        .clock(Arc::new(VirtualClock::new(s.clock.clone())))
        .poll_interval(Duration::from_secs(1), Duration::from_secs(1))
        .adopt_grace(Duration::from_secs(5))
        .retry_policy(RetryPolicy::default().with_jitter(0.0))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn submits(m: &MockExecutor) -> Vec<String> {
    m.calls()
        .iter()
        .filter_map(|c| match c {
            MockCall::Submit {
                attempt_id,
                job_id: Some(_),
                ..
            } => Some(short(attempt_id.as_str())),
            _ => None,
        })
        .collect()
}

fn submit_times(m: &MockExecutor) -> HashMap<String, Duration> {
    m.calls()
        .iter()
        .filter_map(|c| match c {
            MockCall::Submit {
                attempt_id,
                at,
                job_id: Some(_),
                ..
            } => Some((short(attempt_id.as_str()), *at)),
            _ => None,
        })
        .collect()
}

fn cancels(m: &MockExecutor) -> Vec<String> {
    m.cancelled().iter().map(|a| short(a.as_str())).collect()
}

fn failing(class: &str) -> MockScript {
    let t = Duration::from_secs(10);
    match class {
        "transient" => MockScript::ends_after(t, JobState::NodeFail).with_exit_code(1),
        "oom" => MockScript::ends_after(t, JobState::OutOfMemory)
            .with_exit_code(0)
            .with_signal(125),
        "timeout_resumable" | "timeout_fatal" => MockScript::ends_after(t, JobState::Timeout),
        "config" => MockScript::fails_after(t, 2)
            .with_log("usage: train [-h]\ntrain: error: unrecognized arguments: --lrr\n"),
        "cancelled" => MockScript::ends_after(
            t,
            JobState::Cancelled {
                by_uid: Some(12345),
            },
        ),
        "application" => MockScript::fails_after(t, 1).with_log("ValueError: loss is nan\n"),
        "unknown" => MockScript::ends_after(t, JobState::Lost),
        "expired" => MockScript::ends_after(t, JobState::Deadline),
        other => panic!("no script for {other}"),
    }
}

/// a (fails once with `class`) -> c; b independent and slow (100 s).
fn matrix_plan(policy: &str, halt: &str, resumable: bool) -> CampaignPlan {
    PlanBuilder::stages(json!([
        {"id": "a", "command": ["work"], "resumable": resumable},
        {"id": "b", "command": ["work"]},
        {"id": "c", "needs": ["a"], "command": ["work"]},
    ]))
    .execution(
        json!({"defaults": {"failure_policy": policy, "halt_policy": halt, "max_attempts": 3}}),
    )
    .build()
}

#[test]
fn every_failure_class_by_policy_and_halt() {
    // class, resumable, oom retry allowed, retried under strict, retried under resume
    let cases: &[(&str, bool, bool, bool, bool)] = &[
        ("transient", false, false, true, true),
        ("oom", false, true, true, true),
        ("oom", false, false, false, false),
        ("timeout_resumable", true, false, false, true),
        ("timeout_fatal", false, false, false, false),
        ("config", false, false, false, false),
        ("cancelled", false, false, false, false),
        ("application", false, false, false, true),
        ("unknown", false, false, false, true),
        ("expired", false, false, false, false),
    ];
    let rt = rt();
    for &(class, resumable, oom_ok, strict_retry, resume_retry) in cases {
        for policy in ["strict", "resume"] {
            for halt in ["fail_fast", "drain"] {
                let label = format!("{class} (oom retry {oom_ok}) x {policy} x {halt}");
                let s = sim(move |unit, n| match (unit, n) {
                    ("a/0", 1) => failing(class),
                    ("b/0", _) => MockScript::completes_after(Duration::from_secs(100)),
                    _ => MockScript::completes_after(Duration::from_secs(10)),
                });
                let dir = tempfile::tempdir().unwrap();
                if class == "timeout_resumable" {
                    // N03: a timeout resumes only from checkpoint evidence the worker left.
                    let out = dir.path().join("work/a/0");
                    std::fs::create_dir_all(&out).unwrap();
                    std::fs::write(out.join("_CHECKPOINT"), "step 10\n").unwrap();
                }
                let mut b = controller(matrix_plan(policy, halt, resumable), &s, dir.path());
                if oom_ok {
                    b = b.allow_oom_retry("a");
                }
                let mut ctl = b.build().unwrap();
                let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
                let retried = if policy == "strict" {
                    strict_retry
                } else {
                    resume_retry
                };
                let subs = submits(&s.mock);
                if retried {
                    assert_eq!(subs, ["a/0#1", "b/0#1", "a/0#2", "c/0#1"], "{label}");
                    assert!(cancels(&s.mock).is_empty(), "{label}");
                    assert!(report.is_complete(), "{label}: {report}");
                    // Backoff: first retry 5 s after the failure was seen (t = 10..11 s).
                    let t = submit_times(&s.mock)["a/0#2"];
                    assert!(
                        t >= Duration::from_secs(15) && t <= Duration::from_secs(17),
                        "{label}: {t:?}"
                    );
                    let seen = s.seen.lock().unwrap();
                    let second = seen.iter().find(|x| x.0 == "a/0" && x.1 == "2").unwrap();
                    let resume_expected = if class == "timeout_resumable" {
                        "1"
                    } else {
                        "0"
                    };
                    assert_eq!(second.2, resume_expected, "{label}: resume flag");
                    let more = if class == "oom" { "1" } else { "0" };
                    assert_eq!(second.3, more, "{label}: more resources");
                    assert_eq!(
                        second.4,
                        class == "oom",
                        "{label}: exclusive node on the oom retry"
                    );
                } else if halt == "fail_fast" {
                    assert_eq!(subs, ["a/0#1", "b/0#1"], "{label}");
                    assert_eq!(cancels(&s.mock), ["b/0#1"], "{label}");
                    assert!(report.halted, "{label}");
                    assert_eq!(report.failed.len(), 1, "{label}: {report}");
                    assert_eq!(report.failed[0].stage, "a");
                    let expect = match class {
                        "timeout_resumable" => FailureClass::TimeoutResumable,
                        "timeout_fatal" => FailureClass::TimeoutFatal,
                        "oom" => FailureClass::Oom,
                        "config" => FailureClass::Config,
                        "cancelled" => FailureClass::Cancelled,
                        "application" => FailureClass::Application,
                        "unknown" => FailureClass::Unknown,
                        "expired" => FailureClass::Expired,
                        _ => unreachable!(),
                    };
                    assert_eq!(report.failed[0].class, Some(expect), "{label}");
                    assert_eq!(report.failed[0].logs.len(), 1, "{label}");
                    assert!(!report.completed.contains(&"b".to_string()), "{label}");
                } else {
                    assert_eq!(subs, ["a/0#1", "b/0#1"], "{label}");
                    assert!(cancels(&s.mock).is_empty(), "{label}");
                    assert!(!report.halted);
                    assert_eq!(report.completed, ["b"], "{label}: drain lets b finish");
                    assert_eq!(report.blocked, ["c"], "{label}: nothing downstream of a");
                }
            }
        }
    }
}

#[test]
fn transient_budget_is_its_own_and_exhausts() {
    let s = sim(|unit, _| match unit {
        "a/0" => failing("transient"),
        _ => MockScript::completes(),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = controller(matrix_plan("strict", "drain", false), &s, dir.path())
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert_eq!(
        submits(&s.mock)
            .iter()
            .filter(|x| x.starts_with("a/0"))
            .cloned()
            .collect::<Vec<_>>(),
        ["a/0#1", "a/0#2", "a/0#3", "a/0#4"],
        "three retries, then failed"
    );
    let times = submit_times(&s.mock);
    // Exponential backoff: 5, 10, 20 s after each failure (10 s runs, 1 s polls).
    let gap = |a: &str, b: &str| (times[b] - times[a]).as_secs();
    assert!(
        (15..=17).contains(&gap("a/0#1", "a/0#2")),
        "{}",
        gap("a/0#1", "a/0#2")
    );
    assert!((20..=22).contains(&gap("a/0#2", "a/0#3")));
    assert!((30..=32).contains(&gap("a/0#3", "a/0#4")));
    assert!(
        report.failed[0]
            .reason
            .contains("4 transient failures, budget 3"),
        "{report}"
    );
}

#[test]
fn requeued_job_is_followed_not_resubmitted() {
    // C24: RUNNING, REQUEUED, PENDING, RUNNING, COMPLETED under one job.
    let s = sim(|_, _| {
        MockScript::new()
            .at(Duration::from_secs(1), JobState::Running)
            .at(Duration::from_secs(5), JobState::Requeued)
            .at(Duration::from_secs(8), JobState::Pending)
            .at(Duration::from_secs(9), JobState::Running)
            .at(Duration::from_secs(20), JobState::Completed)
            .with_restarts(1)
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete());
    assert_eq!(submits(&s.mock), ["a/0#1"]);
}

#[test]
fn stuck_pending_reason_is_cancelled_after_the_limit_but_waits_are_not() {
    let s = sim(|unit, _| match unit {
        "a/0" => MockScript::new().with_reason("QOSMaxGRESPerUser"),
        _ => MockScript::new().with_reason("InvalidQOS"),
    });
    let dir = tempfile::tempdir().unwrap();
    let p =
        PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}, {"id": "b", "command": ["w"]}]))
            .execution(json!({"defaults": {"halt_policy": "drain"}}))
            .build();
    let mut ctl = controller(p, &s, dir.path())
        .stuck_after(Duration::from_secs(60))
        .build()
        .unwrap();
    let report = rt()
        .block_on(ctl.run(RunOptions::default().with_max_iterations(Some(200))))
        .unwrap();
    assert_eq!(cancels(&s.mock), ["b/0#1"]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].class, Some(FailureClass::Config));
    assert!(report.failed[0].reason.contains("InvalidQOS"), "{report}");
    assert_eq!(
        submits(&s.mock),
        ["a/0#1", "b/0#1"],
        "a waits, never resubmitted"
    );
    assert!(report.detached);
}

#[test]
fn sharded_stage_aggregates_after_all_shards() {
    let s = sim(|unit, _| match unit {
        "s/1" => MockScript::completes_after(Duration::from_secs(30)),
        _ => MockScript::completes_after(Duration::from_secs(5)),
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([
            {"id": "s", "strategy": "sharded", "instances": 3, "aggregate": true, "command": ["w", "{shard_index}/{shard_count}"]},
            {"id": "t", "needs": ["s"], "command": ["w"]},
        ])).execution(json!({"defaults": {}})).build();
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(
        submits(&s.mock),
        ["s/0#1", "s/1#1", "s/2#1", "s/agg#1", "t/0#1"]
    );
    let t = submit_times(&s.mock);
    assert!(
        t["s/agg#1"] >= Duration::from_secs(30),
        "aggregate waits for the slowest shard"
    );
    let seen = s.seen.lock().unwrap();
    assert_eq!(seen.iter().filter(|x| x.0 == "s/agg").count(), 1);
}

fn pool_plan() -> CampaignPlan {
    PlanBuilder::stages(json!([
            {"id": "prep", "command": ["w"]},
            {"id": "eval", "needs": ["prep"], "strategy": "persistent_pool", "instances": 2, "command": ["worker"]},
        ])).execution(json!({"defaults": {}})).build()
}

#[test]
fn persistent_pool_serves_every_item_once_and_requeues_a_dead_workers_items() {
    // Worker eval/0 attempt 1 dies with its node at 12 s holding items; the others live 40 s.
    let s = sim(|unit, n| match (unit, n) {
        ("eval/0", 1) => MockScript::ends_after(Duration::from_secs(12), JobState::NodeFail),
        ("prep/0", _) => MockScript::completes_after(Duration::from_secs(2)),
        _ => MockScript::completes_after(Duration::from_secs(40)),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = controller(pool_plan(), &s, dir.path())
        .pool_items("eval", |_| {
            Ok((0..10)
                .map(|i| PoolItem::new(format!("item{i}"), json!(i)))
                .collect())
        })
        .retry_policy(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_base_delay(Duration::from_secs(1)),
        )
        .build()
        .unwrap();
    let queue = ctl.queue("eval");
    let rt = rt();
    let mut processed: Vec<(String, String)> = Vec::new();
    let mut report: Option<CampaignReport> = None;
    for i in 0..500 {
        let r = rt
            .block_on(ctl.run(RunOptions::default().with_once(true)))
            .unwrap();
        let _ = i;
        s.clock.advance(Duration::from_secs(1)); // `once` does not wait
        if !r.detached {
            report = Some(r);
            break;
        }
        // Play the workers: each live worker claims one item per second; eval/0#1 only
        // claims (it will die holding them).
        for id in ctl.live_attempt_ids() {
            let sid = short(id.as_str());
            if !sid.starts_with("eval/") {
                continue;
            }
            let w = PoolWorker::new(queue.dir(), id.as_str()).unwrap();
            if let Some(c) = w.claim().unwrap() {
                if sid == "eval/0#1" {
                    continue; // holds it
                }
                processed.push((c.item.id.clone(), sid.clone()));
                let v = c.item.payload.as_i64().unwrap();
                w.complete(c, &json!(v * v)).unwrap();
            }
        }
    }
    let report = report.expect("campaign ended");
    assert!(report.is_complete(), "{report}");
    let mut items: Vec<_> = processed.iter().map(|(i, _)| i.clone()).collect();
    items.sort();
    items.dedup();
    assert_eq!(
        items.len(),
        10,
        "every item processed exactly once: {processed:?}"
    );
    assert_eq!(processed.len(), 10);
    let results = queue.results().unwrap();
    assert_eq!(results.len(), 10);
    assert!(
        results.iter().any(|r| r.item.requeues == 1),
        "the dead worker's items were requeued"
    );
    assert_eq!(
        results
            .iter()
            .find(|r| r.item.id == "item3")
            .unwrap()
            .result,
        json!(9)
    );
    // The dead worker (transient) was replaced by a second attempt.
    let subs = submits(&s.mock);
    assert_eq!(&subs[..3], ["prep/0#1", "eval/0#1", "eval/1#1"]);
    assert!(subs.contains(&"eval/0#2".to_string()), "{subs:?}");
}

#[test]
fn detach_then_run_again_reattaches_without_resubmitting() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(30)));
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(
        json!([{"id": "s", "strategy": "sharded", "instances": 4, "command": ["w"]}]),
    )
    .execution(json!({"defaults": {}}))
    .build();
    let rt = rt();
    {
        let mut ctl = controller(p.clone(), &s, dir.path()).build().unwrap();
        let r = rt
            .block_on(ctl.run(RunOptions::default().with_max_iterations(Some(3))))
            .unwrap();
        assert!(r.detached);
        assert_eq!(r.live, 4);
    }
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(r.is_complete(), "{r}");
    assert_eq!(r.reattached, 4);
    assert_eq!(r.submitted, 0);
    assert_eq!(submits(&s.mock).len(), 4);
}

/// An executor that panics (a controller crash) around the submit of one attempt.
struct Crashy {
    inner: MockExecutor,
    unit: &'static str,
    after_submit: bool,
    armed: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Executor for Crashy {
    fn kind(&self) -> &str {
        "mock"
    }
    async fn submit(
        &self,
        spec: &AttemptSpec,
    ) -> Result<puzzletron::executor::JobHandle, puzzletron::executor::ExecutorError> {
        let hit = env(spec, "PUZZLETRON_UNIT") == self.unit
            && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst);
        if hit && !self.after_submit {
            panic!("simulated crash before submit");
        }
        let h = self.inner.submit(spec).await;
        if hit {
            panic!("simulated crash after submit, before the handle is recorded");
        }
        h
    }
    async fn poll(
        &self,
        h: &[puzzletron::executor::JobHandle],
    ) -> Result<Vec<puzzletron::executor::JobStatus>, puzzletron::executor::ExecutorError> {
        self.inner.poll(h).await
    }
    async fn cancel(
        &self,
        h: &puzzletron::executor::JobHandle,
    ) -> Result<(), puzzletron::executor::ExecutorError> {
        self.inner.cancel(h).await
    }
    async fn find(
        &self,
        id: &puzzletron::executor::AttemptId,
    ) -> Result<Option<puzzletron::executor::JobHandle>, puzzletron::executor::ExecutorError> {
        self.inner.find(id).await
    }
}

fn crash_then_recover(after_submit: bool) -> (Sim, CampaignReport) {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(5)));
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(
        json!([{"id": "s", "strategy": "sharded", "instances": 3, "command": ["w"]}]),
    )
    .execution(json!({"defaults": {}}))
    .build();
    let crashy = Arc::new(Crashy {
        inner: s.mock.clone(),
        unit: "s/1",
        after_submit,
        armed: std::sync::atomic::AtomicBool::new(true),
    });
    let (p2, d2, c2, clock) = (
        p.clone(),
        dir.path().to_path_buf(),
        crashy.clone(),
        s.clock.clone(),
    );
    let crashed = std::thread::spawn(move || {
        let mut ctl = CampaignController::builder()
            // The mock runs nothing, so no worker writes a success marker.
            .require_success_marker(false)
            .plan(p2)
            .executor(c2)
            .campaign_dir(d2)
            .clock(Arc::new(VirtualClock::new(clock)))
            .poll_interval(Duration::from_secs(1), Duration::from_secs(1))
            .build()
            .unwrap();
        rt().block_on(ctl.run(RunOptions::default()))
    })
    .join();
    assert!(crashed.is_err(), "the controller crashed");
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    (s, report)
}

#[test]
fn crash_after_submit_adopts_the_job_by_attempt_id() {
    let (s, report) = crash_then_recover(true);
    assert!(report.is_complete(), "{report}");
    // Intents of a batch are durable before its first submit and handles are recorded after
    // the batch: s/0 and s/1 were submitted before the crash (adopted), s/2 never was.
    assert_eq!(report.adopted, 2);
    assert_eq!(
        submits(&s.mock),
        ["s/0#1", "s/1#1", "s/2#2"],
        "no duplicate"
    );
    for id in ["s/0#1", "s/1#1", "s/2#2"] {
        let n = s.mock.calls().iter().filter(|c| matches!(c, MockCall::Submit { attempt_id, .. } if short(attempt_id.as_str()) == id)).count();
        assert_eq!(n, 1, "{id} submitted once");
    }
}

#[test]
fn crash_before_submit_gives_up_the_intent_after_the_grace_and_submits_a_new_attempt() {
    let (s, report) = crash_then_recover(false);
    assert!(report.is_complete(), "{report}");
    assert_eq!(report.adopted, 1, "s/0 was submitted before the crash");
    assert_eq!(submits(&s.mock), ["s/0#1", "s/1#2", "s/2#2"]);
    let finds: Vec<_> = s
        .mock
        .calls()
        .into_iter()
        .filter(|c| matches!(c, MockCall::Find { .. }))
        .collect();
    assert!(
        !finds.is_empty(),
        "the intent was looked up before giving up"
    );
}

#[test]
fn changed_contract_is_refused_unless_a_new_revision_is_asked_for() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(100)));
    let dir = tempfile::tempdir().unwrap();
    let old = PlanBuilder::stages(json!([{"id": "a", "command": ["w", "--lr", "0.1"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let new = PlanBuilder::stages(json!([{"id": "a", "command": ["w", "--lr", "0.2"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    assert_ne!(old.contract_hash, new.contract_hash);
    let rt = rt();
    {
        let mut ctl = controller(old, &s, dir.path()).build().unwrap();
        rt.block_on(ctl.run(RunOptions::default().with_once(true)))
            .unwrap();
    }
    let err = controller(new.clone(), &s, dir.path()).build().unwrap_err();
    assert!(
        matches!(err, ControllerError::ContractChanged { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("new revision"), "{err}");
    assert!(cancels(&s.mock).is_empty());
    let mut ctl = controller(new, &s, dir.path())
        .new_revision(true)
        .build()
        .unwrap();
    let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    if std::env::var("DEBUG_REV").is_ok() {
        eprintln!(
            "{}",
            std::fs::read_to_string(dir.path().join("controller/journal.jsonl")).unwrap()
        );
    }
    assert_eq!(
        cancels(&s.mock),
        ["a/0#1"],
        "the old revision's live attempt is cancelled"
    );
    assert!(r.is_complete());
    let ids: Vec<_> = s
        .mock
        .calls()
        .iter()
        .filter_map(|c| match c {
            MockCall::Submit { attempt_id, .. } => Some(attempt_id.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids[1].contains("r1.a.0.a1"), "{ids:?}");
}

#[test]
fn second_controller_is_refused_naming_the_holder() {
    let s = sim(|_, _| MockScript::completes());
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let _first = controller(p.clone(), &s, dir.path()).build().unwrap();
    let err = controller(p, &s, dir.path()).build().unwrap_err();
    assert!(matches!(err, ControllerError::LeaseHeld { .. }));
    assert!(
        err.to_string()
            .contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
}

#[test]
fn corrupt_journal_is_an_error_not_skipped() {
    let s = sim(|_, _| MockScript::completes());
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    {
        let mut ctl = controller(p.clone(), &s, dir.path()).build().unwrap();
        rt().block_on(ctl.run(RunOptions::default())).unwrap();
    }
    let j = dir.path().join("controller/journal.jsonl");
    let text = std::fs::read_to_string(&j).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = "{\"seq\":2,\"at_ms\":0,\"entry\":{\"t\":\"bogus\"}}";
    std::fs::write(&j, lines.join("\n") + "\n").unwrap();
    let err = controller(p, &s, dir.path()).build().unwrap_err();
    assert!(err.to_string().contains("journal.jsonl line 2"), "{err}");
}

#[test]
fn poll_errors_are_retried_not_job_failures() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(5)));
    s.mock.fail_polls(
        6,
        "slurm_load_jobs error: Unable to contact slurm controller",
    );
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let r = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(r.is_complete());
    assert_eq!(submits(&s.mock), ["a/0#1"]);
    let journal = std::fs::read_to_string(dir.path().join("controller/journal.jsonl")).unwrap();
    assert!(journal.contains("scheduler_unreachable"), "{journal}");
    assert!(journal.contains("scheduler_reachable"), "{journal}");
}

#[test]
fn shutdown_cancels_every_live_attempt_and_a_later_run_resumes() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(50)));
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(
        json!([{"id": "s", "strategy": "sharded", "instances": 3, "command": ["w"]}]),
    )
    .execution(json!({"defaults": {}}))
    .build();
    let rt = rt();
    {
        let mut ctl = controller(p.clone(), &s, dir.path()).build().unwrap();
        rt.block_on(ctl.run(RunOptions::default().with_once(true)))
            .unwrap();
        let n = rt.block_on(ctl.shutdown("test")).unwrap();
        assert_eq!(n, 3);
    }
    assert_eq!(cancels(&s.mock).len(), 3);
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(r.is_complete(), "{r}");
    assert_eq!(
        submits(&s.mock),
        ["s/0#1", "s/1#1", "s/2#1", "s/0#2", "s/1#2", "s/2#2"]
    );
}

#[test]
fn control_cancel_from_the_channel_cancels_and_reports() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(50)));
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut ctl = controller(p, &s, dir.path()).controls(rx).build().unwrap();
    let rt = rt();
    rt.block_on(ctl.run(RunOptions::default().with_once(true)))
        .unwrap();
    tx.send(puzzletron::campaign::controller::Control::Cancel)
        .unwrap();
    let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    assert_eq!(r.cancelled, 1);
    assert_eq!(cancels(&s.mock), ["a/0#1"]);
    assert!(!r.detached);
}

#[test]
fn a_cancel_by_shutdown_is_not_a_retry_and_the_unit_runs_again_on_the_next_run() {
    let s = sim(|_, _| MockScript::completes_after(Duration::from_secs(50)));
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(
        json!([{"id": "s", "strategy": "sharded", "instances": 2, "command": ["w"]}]),
    )
    .execution(json!({"defaults": {"failure_policy": "resume", "max_attempts": 3}}))
    .build();
    let events: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let ev = events.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let rt = rt();
    {
        let mut ctl = controller(p.clone(), &s, dir.path())
            .controls(rx)
            .on_event(move |e| {
                ev.lock()
                    .unwrap()
                    .push((e.kind().to_string(), e.to_string()))
            })
            .build()
            .unwrap();
        rt.block_on(ctl.run(RunOptions::default().with_once(true)))
            .unwrap();
        tx.send(puzzletron::campaign::controller::Control::Cancel)
            .unwrap();
        let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
        assert_eq!(r.cancelled, 2);
        assert_eq!(r.live, 0);
        // Both units are ready again (queued), none failed.
        assert_eq!(
            (r.stages[0].queued, r.stages[0].failed, r.stages[0].running),
            (2, 0, 0),
            "{r}"
        );
    }
    let events = events.lock().unwrap().clone();
    let attempts: Vec<&String> = events
        .iter()
        .filter(|(k, _)| k == "attempt_cancelled")
        .map(|(_, m)| m)
        .collect();
    assert_eq!(attempts.len(), 2, "{events:?}");
    for m in &attempts {
        assert!(!m.contains("retry"), "a cancel is logged as a retry: {m}");
        assert!(m.contains("by the controller"), "{m}");
        assert!(m.contains("runs again on the next run"), "{m}");
    }
    // The journal holds no decision for the cancelled attempts (a decision would be a retry
    // scheduled by the retry policy).
    let journal = std::fs::read_to_string(dir.path().join("controller/journal.jsonl")).unwrap();
    let decided: Vec<&str> = journal
        .lines()
        .filter(|l| l.contains("\"decided\""))
        .collect();
    assert!(decided.is_empty(), "{decided:?}");
    assert!(journal.contains("\"finished\""), "{journal}");
    // A later run submits attempt 2 of each unit (not counted as a failure) and completes.
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let r = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(r.is_complete(), "{r}");
    assert_eq!(submits(&s.mock), ["s/0#1", "s/1#1", "s/0#2", "s/1#2"]);
}

#[test]
fn campaign_dir_that_is_a_file_is_refused_naming_the_path() {
    let s = sim(|_, _| MockScript::completes());
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let err = controller(p, &s, &file).build().unwrap_err();
    assert!(
        matches!(err, ControllerError::NotACampaign { ref path, .. } if path == &file),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&file.display().to_string()), "{text}");
    assert!(text.contains("is a file, expected a folder"), "{text}");
    // A folder below a file: the OS error comes with the path and the action.
    let below = file.join("sub");
    let err = puzzletron::campaign::controller::open_campaign_dir(&below).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "creating campaign folder {}",
            below.join("controller").display()
        )),
        "{text}"
    );
}

#[test]
fn campaign_dir_unwritable_is_an_error_naming_the_path() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // root ignores permission bits: nothing to test (the CI container runs as root).
        eprintln!("skipped: running as root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let s = sim(|_, _| MockScript::completes());
    let root = tempfile::tempdir().unwrap();
    let ro = root.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    let err = controller(p, &s, &ro).build().unwrap_err();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    let text = err.to_string();
    assert!(
        text.contains(&ro.join("controller").display().to_string()),
        "{text}"
    );
}

#[test]
fn non_empty_unrelated_campaign_dir_is_refused_but_own_layout_is_accepted() {
    let s = sim(|_, _| MockScript::completes());
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {}}))
        .build();
    // Unrelated files: refused, nothing is created there.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"mine").unwrap();
    let err = controller(p.clone(), &s, dir.path()).build().unwrap_err();
    assert!(
        matches!(err, ControllerError::NotACampaign { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()), "{text}");
    assert!(text.contains("\"notes.txt\""), "{text}");
    assert!(text.contains("expected a new or empty folder"), "{text}");
    assert!(!dir.path().join("controller").exists());
    assert!(!err.is_retryable());

    // Folders the controller's own layout has (a local executor's `attempts/` root created
    // just before `build`): accepted.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("attempts")).unwrap();
    let mut ctl = controller(p.clone(), &s, dir.path()).build().unwrap();
    assert!(
        rt().block_on(ctl.run(RunOptions::default()))
            .unwrap()
            .is_complete()
    );
    drop(ctl);
    // An existing campaign holding files of the driver's (results): accepted again.
    std::fs::write(dir.path().join("result.json"), b"{}").unwrap();
    controller(p.clone(), &s, dir.path()).build().unwrap();

    // `open_campaign_dir` first marks the folder as a campaign, so a driver may then add its
    // own files (e.g. an executor's log folder) before `build`.
    let dir = tempfile::tempdir().unwrap();
    let canon = puzzletron::campaign::controller::open_campaign_dir(dir.path()).unwrap();
    assert_eq!(canon, dir.path().canonicalize().unwrap());
    std::fs::create_dir(canon.join("slurm-logs")).unwrap();
    controller(p, &s, dir.path()).build().unwrap();
}

/// The `--exclude=` directive of the spec submitted for `unit#n`, if any.
fn exclude_of(s: &Sim, unit: &str, n: u32) -> Option<String> {
    let specs = s.specs.lock().unwrap();
    let spec = specs
        .iter()
        .find(|sp| {
            env(sp, "PUZZLETRON_UNIT") == unit && env(sp, "PUZZLETRON_ATTEMPT") == n.to_string()
        })
        .unwrap_or_else(|| panic!("{unit}#{n} was not submitted"));
    spec.scheduler
        .extra_directives
        .iter()
        .find_map(|d| d.strip_prefix("--exclude=").map(String::from))
}

fn journal(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("controller/journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["entry"].clone())
        .collect()
}

/// Issue 27 (P07 c): a submit refused because one host's SSH key changed excludes that host
/// from the whole campaign at once (journaled, the message naming the host and the fix); the
/// attempt is placed again avoiding it, at once and not charged (`max_attempts` 1), and every
/// later submission avoids the host too.
#[test]
fn a_submit_refused_for_a_host_key_excludes_the_host_and_is_not_charged() {
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1) => MockScript::completes_after(Duration::from_secs(10))
            .with_submit_error(MockSubmitError::HostKeyRefused("n6".into())),
        _ => MockScript::completes_after(Duration::from_secs(10)).with_nodes("n5"),
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([
        {"id": "a", "command": ["w"]},
        {"id": "b", "needs": ["a"], "command": ["w"]},
    ]))
    .execution(json!({"defaults": {"failure_policy": "strict", "max_attempts": 1}}))
    .build();
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(exclude_of(&s, "a/0", 1), None);
    assert_eq!(exclude_of(&s, "a/0", 2).as_deref(), Some("n6"));
    assert_eq!(exclude_of(&s, "b/0", 1).as_deref(), Some("n6"));
    let j = journal(dir.path());
    let excluded: Vec<&Value> = j.iter().filter(|e| e["t"] == "node_excluded").collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0]["node"], "n6");
    let why = excluded[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("never accepted automatically") && why.contains("ssh-keygen -R n6"),
        "{why}"
    );
    // The refused submit was retried at once, not after a backoff, and nothing failed.
    let retry = j
        .iter()
        .find(|e| e["t"] == "decided" && e["decision"]["decision"] == "retry")
        .unwrap();
    assert_eq!(retry["unit"], "a/0");
    let failed = j.iter().find(|e| e["t"] == "submit_failed").unwrap();
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("host n6 excluded"),
        "{failed}"
    );
    assert!(
        !j.iter()
            .any(|e| e["t"] == "decided" && e["decision"]["decision"] == "fail"),
        "{j:?}"
    );
}

/// An executor that names a host the campaign already excluded for its key does not honour
/// the exclusion: a configuration failure of the unit, never an endless loop of retries.
#[test]
fn a_host_key_refused_again_after_the_exclusion_is_a_configuration_failure() {
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1 | 2) => MockScript::completes_after(Duration::from_secs(10))
            .with_submit_error(MockSubmitError::HostKeyRefused("n6".into())),
        _ => MockScript::completes_after(Duration::from_secs(10)),
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}]))
        .execution(json!({"defaults": {"failure_policy": "strict", "max_attempts": 3}}))
        .build();
    let mut ctl = controller(p, &s, dir.path()).build().unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(!report.is_complete(), "{report}");
    assert_eq!(exclude_of(&s, "a/0", 2).as_deref(), Some("n6"));
    let j = journal(dir.path());
    let fail = j
        .iter()
        .find(|e| e["t"] == "decided" && e["decision"]["decision"] == "fail")
        .unwrap_or_else(|| panic!("{j:?}"));
    let reason = fail["decision"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("config: ") && reason.contains("host key of n6"),
        "{reason}"
    );
    assert_eq!(
        j.iter().filter(|e| e["t"] == "node_excluded").count(),
        1,
        "{j:?}"
    );
}

#[test]
fn fail_fast_attempts_are_charged_to_infra_and_the_node_is_excluded_later() {
    // a/0#1 dies at rendezvous on n2 before any step; b/0#1 loses its node n2; a later
    // stage c (after a) must avoid n2, and so must both retries. The transient budget is 0:
    // only the infrastructure budget can retry these.
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1) => MockScript::fails_after(Duration::from_secs(10), 1)
            .with_log("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
            .with_nodes("n2"),
        ("b/0", 1) => MockScript::ends_after(Duration::from_secs(10), JobState::NodeFail)
            .with_exit_code(1)
            .with_nodes("n[2-3]"),
        _ => MockScript::completes_after(Duration::from_secs(10)).with_nodes("n1"),
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([
        {"id": "a", "command": ["w"]},
        {"id": "b", "command": ["w"]},
        {"id": "c", "needs": ["a"], "command": ["w"]},
    ]))
    .execution(json!({"defaults": {"failure_policy": "strict"}}))
    .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let mut ctl = controller(p, &s, dir.path())
        .retry_policy(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_transient_retries(0),
        )
        .on_event(move |e| ev.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(
        submits(&s.mock),
        ["a/0#1", "b/0#1", "a/0#2", "b/0#2", "c/0#1"]
    );
    // First attempts: nothing to avoid yet. Retries avoid their failed attempt's nodes; after
    // the second fail-fast attempt on n2, every later submission avoids n2.
    assert_eq!(exclude_of(&s, "a/0", 1), None);
    assert_eq!(exclude_of(&s, "b/0", 1), None);
    assert_eq!(exclude_of(&s, "a/0", 2).as_deref(), Some("n2"));
    assert_eq!(exclude_of(&s, "b/0", 2).as_deref(), Some("n2,n3"));
    assert_eq!(exclude_of(&s, "c/0", 1).as_deref(), Some("n2"));
    // Charged to the infrastructure budget: journaled fail-fast with their nodes.
    let j = journal(dir.path());
    let fast: Vec<(String, String)> = j
        .iter()
        .filter(|e| e["t"] == "finished" && e["fail_fast"] == true)
        .map(|e| {
            (
                short(e["attempt_id"].as_str().unwrap()),
                e["nodes"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        fast,
        [
            ("a/0#1".to_string(), "n2".to_string()),
            ("b/0#1".to_string(), "n[2-3]".to_string())
        ]
    );
    let excluded: Vec<&Value> = j.iter().filter(|e| e["t"] == "node_excluded").collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0]["node"], "n2");
    let evs = events.lock().unwrap();
    let node_events: Vec<String> = evs
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::NodeExcluded { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(node_events, ["n2"], "n3 failed only once: not excluded");
    // The report names the excluded node.
    let h = puzzletron::report::CampaignHistory::load(dir.path(), false).unwrap();
    assert_eq!(h.excluded_nodes.len(), 1);
    assert_eq!(h.excluded_nodes[0].1, "n2");
    assert!(
        h.excluded_nodes[0]
            .2
            .contains("2 distinct units failed fast"),
        "{:?}",
        h.excluded_nodes
    );
    let html = puzzletron::report::render_campaign_report(&h);
    assert!(html.contains("<h2>Excluded nodes</h2>") && html.contains("data-node=\"n2\""));
    // The batch script the Slurm executor would submit for c carries it, quoted as needed.
    #[cfg(feature = "slurm")]
    {
        let specs = s.specs.lock().unwrap();
        let c = specs
            .iter()
            .find(|sp| env(sp, "PUZZLETRON_UNIT") == "c/0")
            .unwrap();
        let slurm = puzzletron::executor::SlurmExecutor::builder("/l")
            .build()
            .unwrap();
        let script = slurm.render(c).unwrap().files.remove(0).content;
        assert!(
            script.lines().any(|l| l == "#SBATCH --exclude=n2"),
            "{script}"
        );
    }
}

/// Issue 27, item 1: attempts on n2 end `FAILED 1:0` after 2 s with no log and no start mark
/// (the job's setup fails there). They are infrastructure failures (the transient budget is
/// 0: only the infrastructure budget can retry them), n2 is excluded once two distinct units
/// failed that way (journaled, named in the report, `--exclude` in every later submission),
/// the units are retried elsewhere and every stage completes. A unit whose payload started
/// (start mark written) and failed as fast on n3 is its own failure: never charged to n3.
#[test]
fn fast_failures_before_the_start_mark_exclude_the_node_after_two_units() {
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1) | ("b/0", 1) => MockScript::fails_after(Duration::from_secs(2), 1)
            .before_start()
            .with_nodes("n2"),
        ("e/0", 1) => MockScript::fails_after(Duration::from_secs(2), 1).with_nodes("n3"),
        _ => MockScript::completes_after(Duration::from_secs(10)).with_nodes("n1"),
    });
    let marked = s.mock.clone().with_start_marks();
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([
        {"id": "a", "command": ["w"]},
        {"id": "b", "command": ["w"]},
        {"id": "e", "command": ["w"]},
        {"id": "c", "needs": ["a", "b"], "command": ["w"]},
    ]))
    .execution(json!({"defaults": {"failure_policy": "resume", "max_attempts": 2}}))
    .build();
    let mut ctl = controller(p, &s, dir.path())
        .executor(Arc::new(marked))
        .retry_policy(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_transient_retries(0),
        )
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(
        submits(&s.mock),
        [
            "a/0#1", "b/0#1", "e/0#1", "a/0#2", "b/0#2", "e/0#2", "c/0#1"
        ]
    );
    assert_eq!(exclude_of(&s, "a/0", 2).as_deref(), Some("n2"));
    assert_eq!(exclude_of(&s, "b/0", 2).as_deref(), Some("n2"));
    assert_eq!(
        exclude_of(&s, "e/0", 2).as_deref(),
        Some("n2"),
        "n3 never charged"
    );
    assert_eq!(exclude_of(&s, "c/0", 1).as_deref(), Some("n2"));
    let j = journal(dir.path());
    let fin = |id: &str| {
        j.iter()
            .find(|e| e["t"] == "finished" && short(e["attempt_id"].as_str().unwrap()) == id)
            .unwrap_or_else(|| panic!("no finished {id}"))
            .clone()
    };
    for id in ["a/0#1", "b/0#1"] {
        let f = fin(id);
        assert_eq!(f["class"], "transient", "{f}");
        assert_eq!(f["fail_fast"], true, "{f}");
        let d = f["detail"].as_str().unwrap();
        assert!(
            d.contains("before its start mark (the payload never started)")
                && d.contains("infrastructure failure on n2"),
            "{d}"
        );
    }
    let e1 = fin("e/0#1");
    assert_eq!(e1["class"], "application", "{e1}");
    assert!(e1.get("fail_fast").is_none(), "{e1}");
    let excluded: Vec<&Value> = j.iter().filter(|e| e["t"] == "node_excluded").collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0]["node"], "n2");
    let why = excluded[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("2 distinct units failed fast on it (a/0, b/0"),
        "{why}"
    );
    let h = puzzletron::report::CampaignHistory::load(dir.path(), false).unwrap();
    assert_eq!(h.excluded_nodes.len(), 1);
    assert_eq!(h.excluded_nodes[0].1, "n2");
}

/// Issue 27, item 1: one unit failing fast twice on a node is not two units: the node stays
/// in use (the unit's own retry avoids it).
#[test]
fn one_unit_failing_fast_twice_does_not_exclude_a_node() {
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1 | 2) => MockScript::fails_after(Duration::from_secs(2), 1)
            .before_start()
            .with_nodes("n2"),
        _ => MockScript::completes_after(Duration::from_secs(10)).with_nodes("n1"),
    });
    let marked = s.mock.clone().with_start_marks();
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(
        json!([{"id": "a", "command": ["w"]}, {"id": "b", "needs": ["a"], "command": ["w"]}]),
    )
    .execution(json!({"defaults": {"failure_policy": "resume", "max_attempts": 3}}))
    .build();
    let mut ctl = controller(p, &s, dir.path())
        .executor(Arc::new(marked))
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(submits(&s.mock), ["a/0#1", "a/0#2", "a/0#3", "b/0#1"]);
    assert_eq!(exclude_of(&s, "a/0", 3).as_deref(), Some("n2"));
    assert_eq!(exclude_of(&s, "b/0", 1), None, "one unit: n2 not excluded");
    assert!(
        !journal(dir.path())
            .iter()
            .any(|e| e["t"] == "node_excluded")
    );
}

#[test]
fn fail_fast_beyond_the_infra_budget_counts_as_transient_and_a_failure_after_progress_is_not_charged()
 {
    // a/0 dies at rendezvous four times, each on a new node: 2 retries on the infrastructure
    // budget, then the transient budget (1), then failed. b/0 dies the same way after step 7:
    // transient, not charged to its node.
    let s = sim(|unit, n| match unit {
        "a/0" => MockScript::fails_after(Duration::from_secs(10), 1)
            .with_log("RendezvousTimeoutError\n")
            .with_nodes(format!("n{n}")),
        "b/0" if n == 1 => MockScript::fails_after(Duration::from_secs(10), 1)
            .with_log("step 7\nWatchdog caught collective operation timeout\n")
            .with_nodes("n9"),
        _ => MockScript::completes_after(Duration::from_secs(10)),
    });
    let dir = tempfile::tempdir().unwrap();
    let p =
        PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}, {"id": "b", "command": ["w"]}]))
            .execution(json!({"defaults": {"failure_policy": "strict", "halt_policy": "drain"}}))
            .build();
    let mut ctl = controller(p, &s, dir.path())
        .retry_policy(
            RetryPolicy::default()
                .with_jitter(0.0)
                .with_transient_retries(1)
                .with_infra_retries(2),
        )
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    let a: Vec<String> = submits(&s.mock)
        .into_iter()
        .filter(|x| x.starts_with("a/0"))
        .collect();
    assert_eq!(a, ["a/0#1", "a/0#2", "a/0#3", "a/0#4"]);
    assert_eq!(report.failed.len(), 1, "{report}");
    assert!(
        report.failed[0]
            .reason
            .contains("2 transient failures, budget 1"),
        "{report}"
    );
    // Each retry avoids the node of the attempt before it.
    assert_eq!(exclude_of(&s, "a/0", 2).as_deref(), Some("n1"));
    assert_eq!(exclude_of(&s, "a/0", 4).as_deref(), Some("n3"));
    // b's failure after progress: transient, retried, not charged to n9.
    assert_eq!(exclude_of(&s, "b/0", 2), None);
    let j = journal(dir.path());
    let b1 = j
        .iter()
        .find(|e| e["t"] == "finished" && short(e["attempt_id"].as_str().unwrap()) == "b/0#1")
        .unwrap();
    assert_eq!(b1["class"], "transient");
    assert!(b1.get("fail_fast").is_none(), "{b1}");
    assert!(
        b1["detail"]
            .as_str()
            .unwrap()
            .contains("after progress (step 7)")
    );
    assert!(
        !j.iter().any(|e| e["t"] == "node_excluded"),
        "one fail-fast attempt per node: no node reaches the threshold"
    );
}

#[test]
fn heartbeat_timeout_cancels_a_silent_attempt_as_hung_and_journals_its_last_heartbeat() {
    // a/0#1 logs one progress mark, then nothing moves: cancelled 30 s after it was first seen
    // running, classified hung from its logs, retried (with resume: the stage can resume).
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1) => MockScript::runs_forever().with_log("loading\nstep 3 loss 2.1\n"),
        _ => MockScript::completes_after(Duration::from_secs(5)),
    });
    let dir = tempfile::tempdir().unwrap();
    let p = PlanBuilder::stages(json!([{"id": "a", "command": ["w"], "resumable": true}]))
        .execution(json!({"defaults": {"failure_policy": "strict"},
               "stages": {"a": {"heartbeat_timeout_s": 30}}}))
        .build();
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev = events.clone();
    let mut ctl = controller(p, &s, dir.path())
        .on_event(move |e| ev.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(submits(&s.mock), ["a/0#1", "a/0#2"]);
    assert_eq!(cancels(&s.mock), ["a/0#1"]);
    let cancel_at = s
        .mock
        .calls()
        .iter()
        .find_map(|c| match c {
            MockCall::Cancel { at, .. } => Some(*at),
            _ => None,
        })
        .unwrap();
    assert!(
        (Duration::from_secs(30)..=Duration::from_secs(32)).contains(&cancel_at),
        "{cancel_at:?}"
    );
    let j = journal(dir.path());
    let req = j.iter().find(|e| e["t"] == "cancel_requested").unwrap();
    let hb = req["last_heartbeat_ms"]
        .as_u64()
        .expect("last heartbeat journaled");
    assert!(
        req["reason"].as_str().unwrap().contains("last mark step 3"),
        "{req}"
    );
    let fin = j
        .iter()
        .find(|e| e["t"] == "finished" && short(e["attempt_id"].as_str().unwrap()) == "a/0#1")
        .unwrap();
    assert_eq!(fin["class"], "hung");
    assert!(
        fin["detail"]
            .as_str()
            .unwrap()
            .contains("last progress mark step 3"),
        "{fin}"
    );
    let seen = s.seen.lock().unwrap();
    assert_eq!(seen[1].2, "1", "the retry resumes");
    let evs = events.lock().unwrap();
    assert!(evs.iter().any(|e| matches!(e,
        ControllerEvent::AttemptStuck { reason, .. } if reason.contains("no progress mark for 30 s"))));
    assert!(evs.iter().any(|e| matches!(
        e,
        ControllerEvent::AttemptFinished {
            class: Some(FailureClass::Hung),
            ..
        }
    )));
    // The report counts the time after the last heartbeat as wasted (`hung`).
    let h = puzzletron::report::CampaignHistory::load(dir.path(), false).unwrap();
    let first = &h.attempts[0];
    assert_eq!(first.last_heartbeat_ms, Some(hb));
    assert_eq!(first.class, Some(FailureClass::Hung));
    assert!(first.ended_ms.unwrap() >= hb + 30_000, "{first:?}");
    assert_eq!(first.gpus, 1, "{first:?}");
    // The mock's handles carry wall-clock submit times, the journal the virtual clock's: put
    // the start on the virtual clock (it ran from 0) to compute the waste.
    let mut first = first.clone();
    first.started_ms = Some(0);
    let hung_ms = first.ended_ms.unwrap() - hb;
    let waste = first.waste(h.as_of_ms);
    let hung = waste.iter().find(|(k, _)| k == "hung").map(|(_, v)| *v);
    assert_eq!(hung, Some(hung_ms as f64 / 3_600_000.0), "{waste:?}");
}

/// N10: what goes in the key. Resources (time limit, warning signal, partition, packing,
/// attempt limits, the retry's exclusive node after an OOM) are attempt metadata: the contract
/// hash and the unit keep their identity, and a campaign reopened with them changed carries
/// on. The worker's arguments and environment (modules, venv) and the mesh are the contract:
/// the campaign refuses to mix results and the error names what changed.
#[test]
fn n10_resources_are_metadata_args_and_env_are_the_key() {
    let stages =
        |prefix: &str| json!([{"id": "a", "command": ["w", "--lr", "0.1", "--prefix", prefix]}]);
    let exec = |a: Value| json!({"defaults": {"failure_policy": "resume", "max_attempts": 3}, "stages": {"a": a}});
    let build = |st: Value, ex: Value, module: &str, venv: &str| {
        // A Slurm runner: a partition is one of the resources it can express (a local runner
        // refuses one at compile time).
        let mut runner = RunnerEnvironment::from_value(
            "runner.yaml",
            &ConfigValue::from_json(&json!({"runner": {"kind": "slurm"}})),
        )
        .unwrap();
        runner.execution_contract.prerun_commands = vec![format!("module load {module}")];
        runner.execution_contract.venv = Some(venv.into());
        PlanBuilder::stages(st).execution(ex).runner(runner).build()
    };
    let base = || {
        build(
            stages("hello"),
            exec(json!({"time_limit": "1:00:00"})),
            "cuda/12.4",
            "/venv",
        )
    };
    // (label, plan, reasons expected: empty = same contract)
    let cases: Vec<(&str, CampaignPlan, Vec<&str>)> = vec![
        (
            "resources: time limit 1h -> 2h, warning signal, partition, more attempts, packing",
            build(
                stages("hello"),
                json!({"defaults": {"failure_policy": "strict", "max_attempts": 5, "gpus_per_node": 4},
                       "stages": {"a": {"time_limit": "2:00:00", "warning_signal": "USR2@300",
                                        "partition": "batch", "max_attempts": 4}}}),
                "cuda/12.4",
                "/venv",
            ),
            vec![],
        ),
        (
            "arg --prefix hello -> hola",
            build(
                stages("hola"),
                exec(json!({"time_limit": "1:00:00"})),
                "cuda/12.4",
                "/venv",
            ),
            vec!["config changed: stages[0].command[4] (\"hello\" -> \"hola\")"],
        ),
        (
            "module cuda/12.4 -> cuda/12.6",
            build(
                stages("hello"),
                exec(json!({"time_limit": "1:00:00"})),
                "cuda/12.6",
                "/venv",
            ),
            vec![
                "environment changed: runner.execution_contract.prerun_commands[0] (\"module load cuda/12.4\" -> \"module load cuda/12.6\")",
            ],
        ),
        (
            "venv",
            build(
                stages("hello"),
                exec(json!({"time_limit": "1:00:00"})),
                "cuda/12.4",
                "/venv2",
            ),
            vec!["environment changed: runner.execution_contract.venv (\"/venv\" -> \"/venv2\")"],
        ),
        (
            "mesh tp 1 -> 2",
            build(
                stages("hello"),
                exec(json!({"time_limit": "1:00:00", "parallel": {"tp": 2}})),
                "cuda/12.4",
                "/venv",
            ),
            vec!["stage a: mesh changed"],
        ),
    ];
    let b = base();
    for (label, p, reasons) in &cases {
        let got = puzzletron::campaign::contract_changes(&b, p);
        assert_eq!(
            b.contract_hash == p.contract_hash,
            reasons.is_empty(),
            "{label}: {got:?}"
        );
        assert_eq!(got.len(), reasons.len(), "{label}: {got:?}");
        for r in reasons {
            assert!(
                got.iter().any(|g| g.contains(r)),
                "{label}: {r:?} in {got:?}"
            );
        }
    }

    // The campaign: attempt 1 OOMs, attempt 2 gets more resources (an exclusive node) under
    // the same unit and contract.
    let dir = tempfile::tempdir().unwrap();
    let s = sim(|_, n| match n {
        1 => failing("oom"),
        _ => MockScript::completes_after(Duration::from_secs(10)),
    });
    let rt = rt();
    let mut ctl = controller(base(), &s, dir.path())
        .allow_oom_retry("a")
        .build()
        .unwrap();
    let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(submits(&s.mock), ["a/0#1", "a/0#2"]);
    let seen = s.seen.lock().unwrap().clone();
    assert_eq!(
        (seen[1].0.as_str(), seen[1].3.as_str(), seen[1].4),
        ("a/0", "1", true)
    );
    drop(ctl);
    // Reopened with every case: resources carry on, the rest is refused naming the change.
    for (label, p, reasons) in cases {
        let r = controller(p, &s, dir.path()).build();
        if reasons.is_empty() {
            let mut ctl = r.unwrap_or_else(|e| panic!("{label}: {e}"));
            let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
            assert!(report.is_complete(), "{label}: {report}");
            assert_eq!(submits(&s.mock).len(), 2, "{label}: nothing re-runs");
        } else {
            let e = match r {
                Err(e) => e,
                Ok(_) => panic!("{label}: contract change not seen"),
            };
            assert!(
                matches!(e, ControllerError::ContractChanged { .. }),
                "{label}: {e}"
            );
            for r in reasons {
                assert!(e.to_string().contains(r), "{label}: {r:?} in {e}");
            }
        }
    }
}

/// Issue 27, item 2: the OOM kind reaches the journal (and the detail, with the cited line).
#[test]
fn the_oom_kind_is_journaled() {
    let s = sim(|unit, n| match (unit, n) {
        ("a/0", 1) => MockScript::ends_after(Duration::from_secs(5), JobState::OutOfMemory)
            .with_exit_code(0)
            .with_signal(125),
        ("b/0", 1) => MockScript::fails_after(Duration::from_secs(5), 1)
            .with_log("step 1\ntorch.OutOfMemoryError: CUDA out of memory.\n"),
        _ => MockScript::completes_after(Duration::from_secs(5)),
    });
    let dir = tempfile::tempdir().unwrap();
    let p =
        PlanBuilder::stages(json!([{"id": "a", "command": ["w"]}, {"id": "b", "command": ["w"]}]))
            .execution(json!({"defaults": {"failure_policy": "resume", "max_attempts": 3}}))
            .build();
    let mut ctl = controller(p, &s, dir.path())
        .allow_oom_retry("a")
        .allow_oom_retry("b")
        .build()
        .unwrap();
    let report = rt().block_on(ctl.run(RunOptions::default())).unwrap();
    assert!(report.is_complete(), "{report}");
    let j = journal(dir.path());
    let fin = |id: &str| {
        j.iter()
            .find(|e| e["t"] == "finished" && short(e["attempt_id"].as_str().unwrap()) == id)
            .unwrap()
            .clone()
    };
    let a = fin("a/0#1");
    assert_eq!(
        (a["class"].as_str(), a["oom"].as_str()),
        (Some("oom"), Some("host")),
        "{a}"
    );
    assert!(
        a["detail"]
            .as_str()
            .unwrap()
            .contains("exit 0:125: the main process exited 0"),
        "{a}"
    );
    let b = fin("b/0#1");
    assert_eq!(
        (b["class"].as_str(), b["oom"].as_str()),
        (Some("oom"), Some("gpu")),
        "{b}"
    );
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains(":2: torch.OutOfMemoryError"),
        "{b}"
    );
    assert!(fin("a/0#2").get("oom").is_none());
}
