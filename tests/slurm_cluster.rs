//! SlurmExecutor against the real local cluster of `shared/slurm/start-local-cluster.sh`.
//!
//! With `PUZZLETRON_SLURM_TESTS=1` a missing cluster FAILS every test here (CI starts it);
//! without it, the tests run when a cluster answers and are skipped with a message otherwise.
#![cfg(feature = "slurm")]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use puzzletron::executor::*;

mod support;
use support::plan::PlanBuilder;

use support::slurm::{cluster_available, count_calls, write_shims};

/// A unique prefix per test process, so reruns never find older jobs by name.
fn prefix() -> String {
    static P: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    P.get_or_init(|| {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 100_000_000;
        format!("pt{n}")
    })
    .clone()
}

fn id(name: &str) -> AttemptId {
    AttemptId::new(format!("{}.{name}", prefix())).unwrap()
}

fn tmp() -> tempfile::TempDir {
    // Under /tmp: the "compute nodes" are this machine.
    tempfile::Builder::new()
        .prefix("pt-slurm-")
        .tempdir()
        .unwrap()
}

fn fast_poll() -> PollPolicy {
    PollPolicy::default()
        .with_intervals(Duration::from_millis(250), Duration::from_secs(2))
        .with_missing_grace(Duration::from_secs(120))
}

fn fast_retry() -> SchedulerRetry {
    SchedulerRetry::default()
        .with_max_tries(8)
        .with_base_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
}

fn exec(dir: &Path) -> SlurmExecutor {
    SlurmExecutor::builder(dir.join("logs"))
        .poll_policy(fast_poll())
        .retry_policy(fast_retry())
        .cancel_timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

async fn wait(e: &dyn Executor, hs: &[JobHandle], secs: u64) -> Vec<JobStatus> {
    let st = e
        .wait_terminal(hs, Duration::from_millis(100), Duration::from_secs(secs))
        .await
        .expect("poll");
    for s in &st {
        assert!(s.state.is_terminal(), "not finished after {secs} s: {s:?}");
    }
    st
}

async fn wait_state(e: &dyn Executor, h: &JobHandle, want: JobState, secs: u64) {
    let t = Instant::now();
    loop {
        let s = e.poll(std::slice::from_ref(h)).await.unwrap().remove(0);
        if s.state == want {
            return;
        }
        assert!(
            !s.state.is_terminal(),
            "ended {s:?} while waiting for {want}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "never {want}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn log_of(s: &JobStatus) -> String {
    std::fs::read_to_string(s.log_path.as_ref().expect("log path")).unwrap_or_default()
}

fn sh(script: &str) -> CommandSpec {
    CommandSpec::shell_script(script)
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_suite_on_slurm() {
    if !cluster_available("conformance_suite_on_slurm") {
        return;
    }
    let dir = tmp();
    let logs = dir.path().to_path_buf();
    let child_dir = logs.clone();
    // The suite makes fresh executors to re-attach; they share the log folder.
    conformance::Conformance::new(move || Box::new(exec(&logs)))
        .with_poll_interval(Duration::from_millis(100))
        .with_timeout(Duration::from_secs(90))
        // --time has minute resolution and slurmctld checks limits periodically.
        .with_walltime_timeout(Duration::from_secs(240))
        .with_scratch_dir(dir.path())
        .with_separate_process(move || {
            let mut c = std::process::Command::new(std::env::current_exe().unwrap());
            c.args([
                "--exact",
                "slurm_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, &child_dir);
            c
        })
        .run_all()
        .await;
}

const CHILD_DIR_ENV: &str = "PUZZLETRON_SLURM_CONFORMANCE_DIR";

/// Child entry point of the conformance suite's `find_from_separate_process`: a fresh
/// `SlurmExecutor` in another process looks the job up (does nothing in a normal run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_child_entry() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        assert!(conformance::child_main(&exec(Path::new(&dir))).await);
    }
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_poll_cancel_exit3_and_gpus() {
    if !cluster_available("submit_poll_cancel_exit3_and_gpus") {
        return;
    }
    let dir = tmp();
    let e = exec(dir.path());
    let sleeper = e
        .submit(&AttemptSpec::new(
            id("sleep"),
            CommandSpec::new("sleep").arg("300"),
        ))
        .await
        .unwrap();
    let exit3 = e
        .submit(&AttemptSpec::new(id("exit3"), sh("exit 3")))
        .await
        .unwrap();
    let gpu = e
        .submit(
            &AttemptSpec::new(id("gpu2"), sh("echo \"CVD=$CUDA_VISIBLE_DEVICES\""))
                .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(2)))
                .with_scheduler(SchedulerOptions::default().with_partition("gpu")),
        )
        .await
        .unwrap();
    wait_state(&e, &sleeper, JobState::Running, 60).await;
    e.cancel(&sleeper).await.unwrap();
    let st = wait(&e, &[sleeper, exit3, gpu], 90).await;
    assert_eq!(
        st[0].state,
        JobState::Cancelled { by_uid: Some(0) },
        "{:?}",
        st[0]
    );
    assert_eq!(
        (st[1].state.clone(), st[1].exit_code),
        (JobState::Failed, Some(3))
    );
    assert_eq!(st[2].state, JobState::Completed, "{:?}", st[2]);
    let log = log_of(&st[2]);
    let cvd = log
        .lines()
        .find_map(|l| l.strip_prefix("CVD="))
        .unwrap_or_else(|| panic!("no CVD line in {log:?}"));
    assert_eq!(cvd.split(',').count(), 2, "CUDA_VISIBLE_DEVICES={cvd}");
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_is_out_of_memory() {
    if !cluster_available("memory_hog_is_out_of_memory") {
        return;
    }
    let dir = tmp();
    let e = exec(dir.path());
    let h = e
        .submit(
            &AttemptSpec::new(
                id("oom"),
                sh("python3 -c 'a = bytearray(400 * 1024 * 1024); import time; time.sleep(2)' 2>/dev/null || head -c 400M /dev/zero | tail > /dev/null"),
            )
            .with_mem_mb(64),
        )
        .await
        .unwrap();
    let st = wait(&e, &[h], 90).await;
    assert_eq!(st[0].state, JobState::OutOfMemory, "{:?}", st[0]);
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_node_job_and_array_of_8() {
    if !cluster_available("four_node_job_and_array_of_8") {
        return;
    }
    let dir = tmp();
    let e = exec(dir.path());
    let multi = e
        .submit(
            &AttemptSpec::new(id("nodes4"), sh("echo \"$SLURMD_NODENAME\"")).with_topology(
                TaskTopology::new(4, 1).with_launcher(TaskLauncher::Srun { extra_args: vec![] }),
            ),
        )
        .await
        .unwrap();
    let arr = e
        .submit_array(
            &ArraySpec::new(
                AttemptSpec::new(id("arr"), sh("echo \"index=$PUZZLETRON_ARRAY_INDEX\"")),
                8,
            )
            .with_max_concurrent(Some(4)),
        )
        .await
        .unwrap();
    assert_eq!(arr.len(), 8);
    assert!(
        arr.iter().all(|h| h.job_id == arr[0].job_id),
        "one sbatch for the array"
    );
    let mut all = vec![multi];
    all.extend(arr);
    let st = wait(&e, &all, 120).await;
    assert_eq!(st[0].state, JobState::Completed, "{:?}", st[0]);
    let nodes: BTreeSet<String> = log_of(&st[0]).lines().map(String::from).collect();
    assert_eq!(
        nodes,
        ["n1", "n2", "n3", "n4"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "4-node job ran on {nodes:?}"
    );
    for (i, s) in st[1..].iter().enumerate() {
        assert_eq!(s.state, JobState::Completed, "task {i}: {s:?}");
        assert_eq!(log_of(s).trim(), format!("index={i}"), "task {i}");
        assert_eq!(s.attempt_id, id("arr").array_task(i as u32).unwrap());
    }
}

/// N01 on the real cluster: with `MaxArraySize` taken as 5, an array of 12 tasks with `%4` is
/// three Slurm arrays (5, 5, 2 tasks; throttle 1 each), every task runs once with its global
/// index, and `find` from a fresh executor re-attaches a task of the last chunk. (The cluster's
/// own cap is 10001; lowering it would restart its daemons under the other tests.)
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_above_max_array_size_runs_as_chunks() {
    if !cluster_available("array_above_max_array_size_runs_as_chunks") {
        return;
    }
    let dir = tmp();
    let capped = |d: &Path| {
        SlurmExecutor::builder(d.join("logs"))
            .poll_policy(fast_poll())
            .retry_policy(fast_retry())
            .max_array_size(5)
            .build()
            .unwrap()
    };
    let e = capped(dir.path());
    let arr = e
        .submit_array(
            &ArraySpec::new(
                AttemptSpec::new(
                    id("chunked"),
                    sh("echo \"index=$PUZZLETRON_ARRAY_INDEX task=$SLURM_ARRAY_TASK_ID\""),
                ),
                12,
            )
            .with_max_concurrent(Some(4)),
        )
        .await
        .unwrap();
    let jobs: BTreeSet<&str> = arr.iter().map(|h| h.job_id.as_str()).collect();
    assert_eq!(jobs.len(), 3, "three chunks: {jobs:?}");
    let st = wait(&e, &arr, 180).await;
    for (i, s) in st.iter().enumerate() {
        assert_eq!(s.state, JobState::Completed, "task {i}: {s:?}");
        assert_eq!(
            log_of(s).trim(),
            format!("index={i} task={}", i % 5),
            "task {i}"
        );
    }
    let fresh = capped(dir.path());
    let h = fresh
        .find(&id("chunked").array_task(11).unwrap())
        .await
        .unwrap()
        .expect("task 11 found by its chunk's name");
    assert_eq!(
        (h.job_id.as_str(), h.array_task),
        (arr[11].job_id.as_str(), Some(1))
    );
    let s = fresh.poll(&[h]).await.unwrap().remove(0);
    assert_eq!(s.state, JobState::Completed, "{s:?}");
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeued_job_is_followed_to_completion() {
    if !cluster_available("requeued_job_is_followed_to_completion") {
        return;
    }
    let dir = tmp();
    let e = exec(dir.path());
    let h = e
        .submit(
            &AttemptSpec::new(
                id("requeue"),
                sh("echo \"run restart=${SLURM_RESTART_COUNT:-0}\"; sleep 4"),
            )
            .with_scheduler(SchedulerOptions::default().with_extra_directives(["--requeue"])),
        )
        .await
        .unwrap();
    wait_state(&e, &h, JobState::Running, 60).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = std::process::Command::new("scontrol")
        .args(["requeue", &h.job_id])
        .output()
        .unwrap();
    assert!(out.status.success(), "scontrol requeue: {out:?}");
    let mut seen_states = BTreeSet::new();
    let t = Instant::now();
    let last = loop {
        let s = e.poll(std::slice::from_ref(&h)).await.unwrap().remove(0);
        seen_states.insert(s.state.name());
        if s.state.is_terminal() {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "{s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        last.state,
        JobState::Completed,
        "{last:?} (seen {seen_states:?})"
    );
    assert!(last.restarts >= 1, "{last:?}");
    let log = log_of(&last);
    assert!(log.contains("restart=1"), "{log:?}");
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_budget_with_50_live_jobs() {
    if !cluster_available("polling_budget_with_50_live_jobs") {
        return;
    }
    let dir = tmp();
    let bin = write_shims(dir.path(), 0);
    let e = SlurmExecutor::builder(dir.path().join("logs"))
        .bin_dir(&bin)
        .poll_policy(fast_poll())
        .retry_policy(fast_retry())
        .build()
        .unwrap();
    let mut hs = Vec::new();
    for i in 0..50 {
        hs.push(
            e.submit(&AttemptSpec::new(
                id(&format!("budget{i}")),
                CommandSpec::new("sleep").arg("3"),
            ))
            .await
            .unwrap(),
        );
    }
    let before = e.stats();
    let st = wait(&e, &hs, 240).await;
    assert!(st.iter().all(|s| s.state == JobState::Completed), "{st:?}");
    let after = e.stats();
    let cycles = after.poll_cycles - before.poll_cycles;
    let squeue = count_calls(dir.path(), "squeue");
    let sacct = count_calls(dir.path(), "sacct");
    let sbatch = count_calls(dir.path(), "sbatch");
    eprintln!(
        "POLLING BUDGET: 50 jobs, {cycles} poll cycles, {squeue} squeue, {sacct} sacct, {sbatch} sbatch calls (shim log)"
    );
    assert_eq!(sbatch, 50);
    assert_eq!(squeue as u64, cycles, "exactly one squeue per poll cycle");
    assert!(
        sacct as u64 <= cycles,
        "at most one sacct per cycle: {sacct} > {cycles}"
    );
    assert_eq!(after.squeue_calls - before.squeue_calls, squeue as u64);
    assert!(cycles >= 2, "the jobs took several cycles");
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_30_percent_exactly_50_jobs() {
    if !cluster_available("fault_injection_30_percent_exactly_50_jobs") {
        return;
    }
    let dir = tmp();
    let bin = write_shims(dir.path(), 30);
    let e = SlurmExecutor::builder(dir.path().join("logs"))
        .bin_dir(&bin)
        .poll_policy(fast_poll())
        .retry_policy(
            SchedulerRetry::default()
                .with_max_tries(12)
                .with_base_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_millis(500)),
        )
        .build()
        .unwrap();
    static N: AtomicU32 = AtomicU32::new(0);
    let tag = format!("fi{}", N.fetch_add(1, Ordering::Relaxed));
    let mut hs = Vec::new();
    for i in 0..50 {
        let spec = AttemptSpec::new(id(&format!("{tag}.j{i}")), CommandSpec::new("true"));
        hs.push(
            e.submit(&spec)
                .await
                .unwrap_or_else(|err| panic!("job {i}: {err}")),
        );
    }
    let st = wait(&e, &hs, 240).await;
    assert!(st.iter().all(|s| s.state == JobState::Completed), "{st:?}");
    let log = std::fs::read_to_string(dir.path().join("calls.log")).unwrap();
    let fails = log.lines().filter(|l| l.contains("FAIL")).count();
    let after = log.lines().filter(|l| l.contains("FAIL-AFTER")).count();
    assert!(fails > 10, "the shims injected only {fails} failures");
    // Exactly one job per attempt in accounting (the real sacct, not the shim). All recent
    // jobs are listed and filtered here: sacct's --name with a long list drops names.
    let names: BTreeSet<String> = hs.iter().map(|h| h.attempt_id.to_string()).collect();
    let count = || {
        let out = std::process::Command::new("sacct")
            .args([
                "-n",
                "-X",
                "-P",
                "-S",
                "now-1hour",
                "-o",
                "JobID,JobName%80",
            ])
            .output()
            .unwrap();
        let mut per_name = std::collections::BTreeMap::<String, usize>::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some((_, name)) = line.split_once('|')
                && names.contains(name.trim())
            {
                *per_name.entry(name.trim().to_string()).or_default() += 1;
            }
        }
        per_name
    };
    // A time-window listing lags behind `sacct -j` by a few seconds on this cluster.
    let t = Instant::now();
    while count().len() < 50 && t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_name = count();
    eprintln!(
        "FAULT INJECTION: {fails} injected failures ({after} ambiguous sbatch), {} jobs in sacct, stats {:?}",
        per_name.values().sum::<usize>(),
        e.stats()
    );
    assert_eq!(per_name.len(), 50, "{per_name:?}");
    assert!(
        per_name.values().all(|&n| n == 1),
        "duplicates: {per_name:?}"
    );
}

/// A one-stage CPU campaign whose stage runs `script` through `sh -c` on the cluster, driven
/// by the controller on a [`SlurmExecutor`]; returns its report and events.
fn run_campaign_on_slurm(
    dir: &Path,
    script: &str,
    builder: impl FnOnce(
        puzzletron::campaign::controller::CampaignControllerBuilder,
    ) -> puzzletron::campaign::controller::CampaignControllerBuilder,
) -> (
    puzzletron::campaign::controller::CampaignReport,
    Vec<puzzletron::campaign::controller::ControllerEvent>,
) {
    use puzzletron::campaign::controller::{
        CampaignController, RetryPolicy as CtlRetry, RunOptions,
    };
    use serde_json::json;
    let plan = PlanBuilder::stages(json!([{"id": "s", "command": ["sh", "-c", script]}]))
        .execution(json!({
            "defaults": {"failure_policy": "strict", "max_attempts": 1},
            "stages": {"s": {"resource": "cpu"}}
        }))
        .build();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ev = events.clone();
    let b = CampaignController::builder()
        .plan(plan)
        .executor(std::sync::Arc::new(exec(dir)))
        .campaign_dir(dir.join("campaign"))
        .poll_interval(Duration::from_millis(500), Duration::from_secs(1))
        .retry_policy(
            CtlRetry::default()
                .with_base_delay(Duration::from_secs(1))
                .with_jitter(0.0),
        )
        .on_event(move |e| ev.lock().unwrap().push(e.clone()));
    let mut ctl = builder(b).build().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    let evs = events.lock().unwrap().clone();
    (report, evs)
}

/// Issue 9 item 3 on the real cluster: the batch script's `srun` step fails, the script
/// ignores it and exits 0 after writing its success marker. Slurm accounts the allocation
/// COMPLETED and step 0 FAILED: the controller must call the attempt failed, with that
/// disagreement as its evidence.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn failed_srun_step_under_a_batch_script_that_exits_0_is_a_failure() {
    use puzzletron::campaign::controller::{ControllerEvent, FailureClass};
    if !cluster_available("failed_srun_step_under_a_batch_script_that_exits_0_is_a_failure") {
        return;
    }
    let dir = tmp();
    let t0 = Instant::now();
    let (report, evs) = run_campaign_on_slurm(
        dir.path(),
        "srun false || true; touch \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"; exit 0",
        |b| b,
    );
    let finished: Vec<_> = evs
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::AttemptFinished {
                state,
                class,
                detail,
                ..
            } => Some((state.clone(), *class, detail.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "{finished:?}");
    let (state, class, detail) = &finished[0];
    assert_eq!(state, "COMPLETED", "the allocation row says COMPLETED");
    assert_eq!(*class, Some(FailureClass::Application), "{detail}");
    assert!(
        detail.starts_with(
            "accounting inconsistent: allocation COMPLETED, step 0 FAILED with exit code 1;"
        ),
        "{detail}"
    );
    assert!(!report.is_complete(), "{report}");
    assert_eq!(report.failed.len(), 1, "{report}");
    eprintln!(
        "FAILED STEP: classified in {:.1} s: {detail}",
        t0.elapsed().as_secs_f64()
    );
}

/// Issue 9 item 5 on the real cluster: the first attempt writes one progress mark and then
/// sleeps. With a 10 s heartbeat timeout the controller cancels it (the job ends CANCELLED in
/// Slurm), classifies it hung from its log, journals its last heartbeat with the cancel
/// request and an `attempt_stuck` event, and the retry (which finishes) completes the stage.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn heartbeat_timeout_cancels_a_silent_job_as_hung() {
    use puzzletron::campaign::controller::{ControllerEvent, FailureClass};
    if !cluster_available("heartbeat_timeout_cancels_a_silent_job_as_hung") {
        return;
    }
    let dir = tmp();
    let t0 = Instant::now();
    let script = "if [ \"$PUZZLETRON_ATTEMPT\" = 1 ]; then echo 'step 1 loss 0.5'; sleep 300; fi; \
                  touch \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"";
    let (report, evs) = run_campaign_on_slurm(dir.path(), script, |b| {
        b.heartbeat_timeout("s", Duration::from_secs(10))
    });
    let took = t0.elapsed();
    assert!(report.is_complete(), "{report}");
    let stuck = evs
        .iter()
        .find_map(|e| match e {
            ControllerEvent::AttemptStuck { attempt_id, reason } => {
                Some((attempt_id.clone(), reason.clone()))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no attempt_stuck event: {evs:?}"));
    assert!(stuck.1.contains("last mark step 1"), "{}", stuck.1);
    let hung = evs
        .iter()
        .find_map(|e| match e {
            ControllerEvent::AttemptFinished {
                attempt_id,
                class: Some(FailureClass::Hung),
                detail,
                ..
            } => Some((attempt_id.clone(), detail.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no hung attempt: {evs:?}"));
    assert_eq!(hung.0, stuck.0);
    assert!(hung.1.contains("last progress mark step 1"), "{}", hung.1);
    // The journal holds the last heartbeat and the event.
    let journal =
        std::fs::read_to_string(dir.path().join("campaign/controller/journal.jsonl")).unwrap();
    let entries: Vec<serde_json::Value> = journal
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["entry"].clone())
        .collect();
    let req = entries
        .iter()
        .find(|e| e["t"] == "cancel_requested")
        .expect("cancel request journaled");
    assert!(req["last_heartbeat_ms"].as_u64().is_some(), "{req}");
    assert!(
        entries
            .iter()
            .any(|e| e["t"] == "event" && e["kind"] == "attempt_stuck"),
        "{journal}"
    );
    // Slurm saw the cancel: the hung job is CANCELLED in accounting, not running on.
    let job = stuck.0.to_string();
    let t = Instant::now();
    let state = loop {
        let out = std::process::Command::new("sacct")
            .args([
                "-n",
                "-X",
                "-P",
                "-S",
                "now-1hour",
                "-o",
                "State",
                "--name",
                &job,
            ])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if s.starts_with("CANCELLED") || t.elapsed() > Duration::from_secs(30) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(state.starts_with("CANCELLED"), "sacct says {state:?}");
    assert!(
        took < Duration::from_secs(120),
        "took {took:?} (timeout 10 s)"
    );
    eprintln!(
        "HEARTBEAT: hung attempt cancelled and retried, campaign complete in {:.1} s",
        took.as_secs_f64()
    );
}

/// N04 on the real cluster: what Slurm exports to the two tasks of a `--gpus-per-node=2` job
/// (and to a job without GPUs) parses, and the preflight gives each rank a device inside its
/// own visible list (2 needed: passes; 3 needed: a `gpu preflight:` error naming 2 and 3).
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n04_slurm_gpu_variables_parse_and_preflight() {
    use puzzletron::executor::gpu::{GPUS_PER_NODE_ENV, GpuVisibility, preflight};
    if !cluster_available("n04_slurm_gpu_variables_parse_and_preflight") {
        return;
    }
    let dir = tmp();
    let e = exec(dir.path());
    let line = "echo \"T|${SLURM_LOCALID-}|${CUDA_VISIBLE_DEVICES-unset}|${SLURM_STEP_GPUS-unset}|${SLURM_JOB_GPUS-unset}\"";
    let gpu = e
        .submit(
            &AttemptSpec::new(id("n04gpu"), sh(line))
                .with_topology(
                    TaskTopology::new(1, 2)
                        .with_gpus(GpuRequest::PerNode(2))
                        .with_launcher(TaskLauncher::Srun { extra_args: vec![] }),
                )
                .with_scheduler(SchedulerOptions::default().with_partition("gpu")),
        )
        .await
        .unwrap();
    let cpu = e
        .submit(&AttemptSpec::new(id("n04cpu"), sh(line)))
        .await
        .unwrap();
    let st = wait(&e, &[gpu, cpu], 90).await;
    let tasks = |s: &JobStatus| -> Vec<std::collections::HashMap<String, String>> {
        log_of(s)
            .lines()
            .filter_map(|l| l.strip_prefix("T|"))
            .map(|l| {
                let f: Vec<&str> = l.split('|').collect();
                let mut m = std::collections::HashMap::new();
                for (k, v) in [
                    ("SLURM_LOCALID", f[0]),
                    ("CUDA_VISIBLE_DEVICES", f[1]),
                    ("SLURM_STEP_GPUS", f[2]),
                    ("SLURM_JOB_GPUS", f[3]),
                ] {
                    if v != "unset" {
                        m.insert(k.to_string(), v.to_string());
                    }
                }
                m
            })
            .collect()
    };
    assert_eq!(st[0].state, JobState::Completed, "{:?}", st[0]);
    let gpu_tasks = tasks(&st[0]);
    assert_eq!(gpu_tasks.len(), 2, "{}", log_of(&st[0]));
    for t in &gpu_tasks {
        eprintln!("n04 gpu task env: {t:?}");
        let vis = GpuVisibility::from_env(|k| t.get(k).cloned()).unwrap();
        assert_eq!(vis.count(), Some(2), "{t:?}");
        let mut env = t.clone();
        env.insert(GPUS_PER_NODE_ENV.into(), "2".into());
        let dev = preflight(|k| env.get(k).cloned()).unwrap();
        assert_eq!(dev.to_string(), t["SLURM_LOCALID"], "{t:?}");
        env.insert(GPUS_PER_NODE_ENV.into(), "3".into());
        let err = preflight(|k| env.get(k).cloned()).unwrap_err().to_string();
        assert!(
            err.contains("2 GPU(s) visible") && err.contains("needs 3 per node"),
            "{err}"
        );
    }
    assert_eq!(st[1].state, JobState::Completed, "{:?}", st[1]);
    let cpu_tasks = tasks(&st[1]);
    assert_eq!(cpu_tasks.len(), 1, "{}", log_of(&st[1]));
    eprintln!("n04 cpu job env: {:?}", cpu_tasks[0]);
    let mut env = cpu_tasks[0].clone();
    env.insert(GPUS_PER_NODE_ENV.into(), "1".into());
    let err = preflight(|k| env.get(k).cloned()).unwrap_err().to_string();
    assert!(err.starts_with("gpu preflight: "), "{err}");
}

/// The worker of the N03 cluster tests: on the warning signal it writes a complete checkpoint
/// `ckpt/step_1200/` (and notes the second it came, from the job's start); on SIGTERM it
/// starts `ckpt/step_1300.tmp/` and is killed there (KillWait later); resumed
/// (`PUZZLETRON_RESUME=1`), it records where from and finishes. Short sleeps: `sh` runs a trap
/// only between commands.
const N03_WORKER: &str = r#"o="${PUZZLETRON_OUTPUT_DIR:-$1}"; mkdir -p "$o"
if [ "$PUZZLETRON_RESUME" = 1 ]; then printf '%s' "$PUZZLETRON_RESUME_FROM" > "$o/resumed_from"; touch "$o/_SUCCESS"; exit 0; fi
start=$(date +%s)
trap 'mkdir -p "$o/ckpt/step_1200"; echo $(( $(date +%s) - start )) > "$o/usr2_after_s"' USR2
trap 'mkdir -p "$o/ckpt/step_1300.tmp"; touch "$o/got_term"; while :; do sleep 1; done' TERM
while :; do sleep 1; done"#;

/// N03 on the real cluster, executor level, with the `srun` launcher: `--time=1` (the Slurm
/// minimum; this cluster has OverTimeLimit 0, KillWait 2 s) and `--signal=B:USR2@30`. The
/// batch shell forwards USR2 to the backgrounded `srun`, which forwards it to the task: the
/// task's checkpoint exists, written before the limit's SIGTERM, and the job ends TIMEOUT.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n03_warning_signal_reaches_the_srun_task_before_the_time_limit() {
    if !cluster_available("n03_warning_signal_reaches_the_srun_task_before_the_time_limit") {
        return;
    }
    let dir = tmp();
    let out = dir.path().join("out");
    let e = exec(dir.path());
    let t = Instant::now();
    let h = e
        .submit(
            &AttemptSpec::new(
                id("n03srun"),
                CommandSpec::new("sh")
                    .args(["-c", N03_WORKER, "sh"])
                    .arg(out.to_string_lossy()),
            )
            .with_topology(
                TaskTopology::single().with_launcher(TaskLauncher::Srun { extra_args: vec![] }),
            )
            .with_walltime(Duration::from_secs(60))
            .with_warning_signal(WarningSignal::usr2(Duration::from_secs(30))),
        )
        .await
        .unwrap();
    let st = wait(&e, &[h], 170).await;
    eprintln!("n03 srun: ended {:?} after {:?}", st[0].state, t.elapsed());
    assert_eq!(
        st[0].state,
        JobState::Timeout,
        "{:?}\n{}",
        st[0],
        log_of(&st[0])
    );
    assert!(
        out.join("ckpt/step_1200").is_dir(),
        "the warning signal never reached the srun task: {}",
        log_of(&st[0])
    );
    let after: u64 = std::fs::read_to_string(out.join("usr2_after_s"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eprintln!("n03 srun: USR2 {after} s after the task started");
    assert!(
        after < 60,
        "USR2 after {after} s: not before the 60 s limit"
    );
}

/// N03 end to end on the real cluster: a resumable stage with `time_limit: "1"` and
/// `warning_signal: "USR2@30"` runs as a campaign on the SlurmExecutor. The worker
/// checkpoints on USR2 and is killed at the limit (TIMEOUT, a partial `step_1300.tmp`); the
/// controller classifies TimeoutResumable from the checkpoint, moves the partial one aside and
/// resubmits with `PUZZLETRON_RESUME=1 PUZZLETRON_RESUME_FROM=ckpt/step_1200`; the campaign
/// completes.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n03_campaign_checkpoints_on_the_warning_signal_and_resumes_to_success() {
    use puzzletron::campaign::controller::{
        CampaignController, ControllerEvent, FailureClass, RunOptions,
    };
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    if !cluster_available("n03_campaign_checkpoints_on_the_warning_signal_and_resumes_to_success") {
        return;
    }
    let dir = tmp();
    let plan = PlanBuilder::stages(json!([
        {"id": "train", "resumable": true, "command": ["sh", "-c", N03_WORKER, "sh"]}
    ]))
    .execution(json!({
        "defaults": {"failure_policy": "resume", "max_attempts": 2},
        "stages": {"train": {"time_limit": "1", "warning_signal": "USR2@30", "resource": "cpu"}}
    }))
    .build();
    let events: Arc<Mutex<Vec<ControllerEvent>>> = Arc::default();
    let ev = events.clone();
    let mut ctl = CampaignController::builder()
        .plan(plan)
        .executor(Arc::new(exec(dir.path())))
        .campaign_dir(dir.path().join("campaign"))
        .poll_interval(Duration::from_millis(500), Duration::from_secs(2))
        .on_event(move |e| ev.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let t = Instant::now();
    let report = ctl.run(RunOptions::default()).await.unwrap();
    eprintln!("n03 campaign: {report} after {:?}", t.elapsed());
    let evs = events.lock().unwrap().clone();
    let finished: Vec<(Option<FailureClass>, String, String)> = evs
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::AttemptFinished {
                class,
                detail,
                state,
                ..
            } => Some((*class, state.clone(), detail.clone())),
            _ => None,
        })
        .collect();
    assert!(report.is_complete(), "{report}\n{finished:?}");
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert_eq!(
        finished[0].0,
        Some(FailureClass::TimeoutResumable),
        "{finished:?}"
    );
    assert!(
        finished[0]
            .2
            .contains("resumes from checkpoint ckpt/step_1200"),
        "{finished:?}"
    );
    assert_eq!(finished[1].0, None, "{finished:?}");
    let out = dir.path().join("campaign/work/train/0");
    assert_eq!(
        std::fs::read_to_string(out.join("resumed_from")).unwrap(),
        "ckpt/step_1200"
    );
    assert!(!out.join("ckpt/step_1300.tmp").exists());
    let after = std::fs::read_to_string(out.join("usr2_after_s")).unwrap_or_default();
    eprintln!(
        "n03 campaign: USR2 {} s after start; TERM seen: {}",
        after.trim(),
        out.join("got_term").exists()
    );
}
