//! Campaigns on a real Ray cluster (`ray start --head --num-cpus=4 --num-gpus=4`, started by
//! `.ci/run`; dashboard at `$PUZZLETRON_RAY_ADDRESS`, default `http://127.0.0.1:8265`):
//! - the digits campaign example with its stub worker runs to completion on Ray with the same
//!   results as on the local runner; every job saw the GPUs Ray assigned it
//!   (`CUDA_VISIBLE_DEVICES`, recorded by the worker), one per score shard, disjoint for jobs
//!   that ran at the same time; Ray's own job list holds each attempt once and at most one
//!   successful job per unit;
//! - `kill -9` of the controller at random moments (`PUZZLETRON_RAY_CRASH_TRIALS`, default
//!   20): no unit run twice (journal and Ray's job list), no lost result, results identical;
//! - the Ray head restarted mid-campaign (`ray stop --force` then `ray start --head`, with
//!   the `ray` of `$PUZZLETRON_RAY_BIN`, set by `.ci/run`): the controller reports the
//!   scheduler unreachable, then the jobs the new head does not know as `LOST`, retries
//!   them, and the campaign completes with the same results.
//!
//! - the shared Puzzletron fixture (qwen3p5_0p8b `mip_smoke`) with a stub worker: every stage
//!   completes, each on the one GPU Ray assigned it, disjoint for concurrent jobs.
//!
//! The tests take turns (one cluster, two cores; one of them restarts the head).
#![cfg(feature = "ray")]

mod support;
use support::watchdog;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::campaign::{KillPlan, Rng, Trials, audit, campaign_exe, kill_9_trials, result, spawn};

/// One test at a time on the cluster.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn address() -> String {
    std::env::var("PUZZLETRON_RAY_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:8265".into())
}

fn ray_args() -> Vec<String> {
    vec![
        "--runner".into(),
        "ray".into(),
        "--ray-address".into(),
        address(),
        "--epochs".into(),
        "1".into(),
    ]
}

fn run(dir: &Path, args: &[String]) -> String {
    let (status, text) = support::examples::run_to_text(
        Command::new(campaign_exe())
            .arg("--dir")
            .arg(dir)
            .args(["--quiet", "--poll-ms", "100"])
            .args(args),
    );
    assert!(
        status.success(),
        "campaign in {} exited {status}; output:\n{}",
        dir.display(),
        text.lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    text
}

/// `seen.log` lines of every unit: (attempt, GPUs, start ms, end ms).
fn seen(dir: &Path) -> Vec<(String, Vec<String>, u128, u128)> {
    let mut v = Vec::new();
    for stage in std::fs::read_dir(dir.join("work")).unwrap() {
        for unit in std::fs::read_dir(stage.unwrap().path()).unwrap() {
            let text =
                std::fs::read_to_string(unit.unwrap().path().join("seen.log")).unwrap_or_default();
            for l in text.lines() {
                let w: Vec<&str> = l.split(' ').collect();
                let gpus = if w[2] == "-" {
                    Vec::new()
                } else {
                    w[2].split(',').map(str::to_string).collect()
                };
                v.push((
                    w[0].to_string(),
                    gpus,
                    w[3].parse().unwrap(),
                    w[4].parse().unwrap(),
                ));
            }
        }
    }
    v
}

/// Overlapping attempts (one node: the head) never share a GPU.
fn assert_disjoint(runs: &[(String, Vec<String>, u128, u128)]) {
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.2 < b.3 && b.2 < a.3 {
                assert!(
                    a.1.iter().all(|g| !b.1.contains(g)),
                    "{} and {} overlapped with GPUs {:?} / {:?}",
                    a.0,
                    b.0,
                    a.1,
                    b.1
                );
            }
        }
    }
}

/// Ray's job list (`GET /api/jobs/`): submission id -> status, for ids starting with `prefix`.
fn ray_jobs(prefix: &str) -> BTreeMap<String, String> {
    let out = Command::new("curl")
        .args(["-sf", &format!("{}/api/jobs/", address())])
        .output()
        .expect("curl");
    assert!(out.status.success(), "GET /api/jobs/ failed");
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut m = BTreeMap::new();
    for j in jobs.as_array().unwrap() {
        if let Some(id) = j["submission_id"]
            .as_str()
            .filter(|i| i.starts_with(prefix))
        {
            let old = m.insert(
                id.to_string(),
                j["status"].as_str().unwrap_or("").to_string(),
            );
            assert!(old.is_none(), "Ray lists {id} twice");
        }
    }
    m
}

/// The campaign's tag (the start of every attempt id), from its journal.
fn nonce(dir: &Path) -> String {
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    for l in j.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if let Some(id) = v["entry"]["attempt_id"].as_str() {
            return id.split('.').next().unwrap().to_string();
        }
    }
    panic!("no attempt in the journal of {}", dir.display())
}

/// Every attempt of the journal is one job of Ray's list, and no unit has two successful
/// jobs there (a unit is the attempt id without its `.aN`).
fn assert_ray_jobs_once(dir: &Path) {
    let tag = nonce(dir);
    let jobs = ray_jobs(&format!("{tag}."));
    let a = audit(dir);
    assert_eq!(
        jobs.len(),
        a.attempts,
        "Ray's job list and the journal disagree on the campaign's attempts: {jobs:?}"
    );
    let mut ok_per_unit: BTreeMap<String, usize> = BTreeMap::new();
    for (id, status) in &jobs {
        if status == "SUCCEEDED" {
            let unit = id.rsplit_once(".a").map_or(id.as_str(), |(u, _)| u);
            *ok_per_unit.entry(unit.to_string()).or_default() += 1;
        }
    }
    let twice: Vec<_> = ok_per_unit.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "units that succeeded twice on Ray: {twice:?}"
    );
}

#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[test]
fn digits_campaign_runs_on_ray_with_the_gpus_ray_assigns() {
    let _s = serial();
    let _w = watchdog::Watchdog::start("digits_ray", Duration::from_secs(600));
    let root = tempfile::tempdir().unwrap();
    let reference = root.path().join("reference-local");
    run(&reference, &["--epochs".into(), "1".into()]);
    let want = result(&reference);
    let dir = root.path().join("ray");
    run(&dir, &ray_args());
    assert_eq!(
        result(&dir),
        want,
        "Ray results differ from the local runner's"
    );
    let a = audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");
    let runs = seen(&dir);
    assert!(runs.len() >= 10, "{runs:?}");
    assert_disjoint(&runs);
    // Score shards ask for 1 GPU each and saw exactly the one Ray gave them.
    let mut gpus_seen = BTreeSet::new();
    for r in runs
        .iter()
        .filter(|r| r.0.contains(".score.") && !r.0.contains(".agg."))
    {
        assert_eq!(r.1.len(), 1, "{r:?}");
        gpus_seen.insert(r.1[0].clone());
    }
    assert!(
        gpus_seen
            .iter()
            .all(|g| ["0", "1", "2", "3"].contains(&g.as_str())),
        "{gpus_seen:?}"
    );
    // The job logs were fetched into the campaign's log folder.
    let logs: Vec<_> = std::fs::read_dir(dir.join("logs")).unwrap().collect();
    assert_eq!(logs.len(), a.attempts, "one log per attempt");
    assert_ray_jobs_once(&dir);
    // A second run is a no-op that submits nothing.
    run(&dir, &ray_args());
    assert_eq!(audit(&dir).attempts, a.attempts);
}

#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[test]
fn kill_9_of_the_controller_at_random_moments_on_ray() {
    let trials: usize = std::env::var("PUZZLETRON_RAY_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let _s = serial();
    let _w = watchdog::Watchdog::start("ray_kill_9", Duration::from_secs(300 + 30 * trials as u64));
    let seed = std::env::var("PUZZLETRON_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x4a7_u64);
    let mut rng = Rng(seed | 1);
    let root = tempfile::tempdir().unwrap();
    let reference = root.path().join("reference-local");
    run(&reference, &["--epochs".into(), "1".into()]);
    let want = result(&reference);
    let args = ray_args();
    let started = Instant::now();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = kill_9_trials(
        root.path(),
        KillPlan {
            trials,
            window_ms: 4950,
            limit: Duration::from_secs(300 + 30 * trials as u64),
        },
        &mut rng,
        &want,
        |dir| spawn(dir, &arg_refs),
        |_, dir| {
            assert_disjoint(&seen(dir));
            assert_ray_jobs_once(dir);
        },
    );
    let Trials {
        kills,
        campaigns,
        adopted,
        ..
    } = t;
    eprintln!(
        "Ray crash trials: {kills} kill -9 over {campaigns} campaigns (seed {seed}), {adopted} adopted, 0 duplicates, 0 lost results, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Restarts the Ray head of `$PUZZLETRON_RAY_BIN` on the test address (as `.ci/run` starts
/// it) and waits until its dashboard answers.
fn restart_head() {
    let ray = std::env::var("PUZZLETRON_RAY_BIN").expect(
        "PUZZLETRON_RAY_BIN: the `ray` program of the test cluster (.ci/run sets it) for the \
         head-restart test",
    );
    let port = address()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .unwrap_or(8265);
    let st = Command::new(&ray)
        .args(["stop", "--force"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "ray stop: {st}");
    let st = Command::new(&ray)
        .args([
            "start",
            "--head",
            "--num-cpus=4",
            "--num-gpus=4",
            "--disable-usage-stats",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            &format!("--dashboard-port={port}"),
            "--include-dashboard=true",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "ray start: {st}");
    let t = Instant::now();
    while !Command::new("curl")
        .args(["-sf", &format!("{}/api/version", address())])
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t.elapsed() < Duration::from_secs(90),
            "the restarted head does not answer"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[test]
fn ray_head_restarted_mid_campaign_the_campaign_completes() {
    let _s = serial();
    let _w = watchdog::Watchdog::start("ray_head_restart", Duration::from_secs(600));
    let root = tempfile::tempdir().unwrap();
    let reference = root.path().join("reference-local");
    run(&reference, &["--epochs".into(), "1".into()]);
    let want = result(&reference);
    let dir = root.path().join("ray");
    let child = Command::new(campaign_exe())
        .arg("--dir")
        .arg(&dir)
        .args(["--quiet", "--poll-ms", "100"])
        .args(ray_args())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Mid-campaign: once the first stage is done and the score shards are on Ray.
    let t = Instant::now();
    while !dir.join("work/prepare/0/_SUCCESS").exists() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "prepare never finished"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    restart_head();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the campaign did not complete: {text}"
    );
    assert!(text.contains("scheduler unreachable"), "{text}");
    assert_eq!(
        result(&dir),
        want,
        "results differ after the head restart: {text}"
    );
    let a = audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");
}

/// The shared Puzzletron fixture (qwen3p5_0p8b `mip_smoke`) on Ray with a stub worker: the
/// runner's venv puts a stub `python` first in PATH that records what it saw (the GPUs Ray
/// assigned) and writes `_SUCCESS`. Driven in-process by the library's controller.
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[test]
fn puzzletron_fixture_with_a_stub_worker_runs_on_ray() {
    let _s = serial();
    let _w = watchdog::Watchdog::start("ray_fixture", Duration::from_secs(300));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(fixture_on_ray());
}

async fn fixture_on_ray() {
    use puzzletron::campaign::controller::{CampaignController, RunOptions, ViewMode};
    use puzzletron::campaign::{ExecutionConfig, RunnerEnvironment, compile_campaign_plan};

    let fixtures = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/fixtures/puzzletron-configs");
    let root = tempfile::tempdir().unwrap();
    let repo = root.path().join("checkout");
    let venv = root.path().join("venv");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(
        venv.join("bin/activate"),
        format!(
            "VIRTUAL_ENV={}\nPATH=\"$VIRTUAL_ENV/bin:$PATH\"\nexport VIRTUAL_ENV PATH\n",
            venv.display()
        ),
    )
    .unwrap();
    let stub = venv.join("bin/python");
    std::fs::write(
        &stub,
        "#!/bin/sh\n# stub Puzzletron worker: records what it saw, then succeeds\n\
         mkdir -p \"$PUZZLETRON_OUTPUT_DIR\"\n\
         start=$(date +%s%3N)\n\
         printf '%s %s\\n' \"$(pwd)\" \"$*\" >> \"$PUZZLETRON_OUTPUT_DIR/args.log\"\n\
         sleep 0.2\n\
         printf '%s %s %s %s\\n' \"$PUZZLETRON_ATTEMPT_ID\" \"${CUDA_VISIBLE_DEVICES:--}\" \"$start\" \"$(date +%s%3N)\" >> \"$PUZZLETRON_OUTPUT_DIR/seen.log\"\n\
         : > \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Distributed stages start with torchrun (single node on Ray): the repository's stand-in.
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/bin/torchrun"),
        venv.join("bin/torchrun"),
    )
    .unwrap();
    let runner_yaml = root.path().join("runner.yaml");
    std::fs::write(
        &runner_yaml,
        format!(
            "runner:\n  kind: ray\n  ray: {{address: \"{}\", namespace: fixture, gpus_per_node: 4}}\n  execution_contract:\n    repository: {}\n    venv: {}\n",
            address(),
            repo.display(),
            venv.display()
        ),
    )
    .unwrap();
    let runner = RunnerEnvironment::load(&runner_yaml).unwrap();
    let execution =
        ExecutionConfig::load(fixtures.join("orchestration/qwen3p5_0p8b/execution.smoke.yaml"))
            .unwrap();
    let plan = compile_campaign_plan(
        fixtures.join("families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml"),
        &runner,
        &execution,
        &[],
        None,
    )
    .unwrap();
    let stages = plan.stages.len();
    let dir =
        puzzletron::campaign::controller::open_campaign_dir(&root.path().join("campaign")).unwrap();
    let exec = puzzletron::campaign::default_executor(&plan, &dir, &[], None).unwrap();
    let mut ctl = CampaignController::builder()
        .plan(plan)
        .executor(std::sync::Arc::from(exec))
        .campaign_dir(&dir)
        .poll_interval(Duration::from_millis(100), Duration::from_millis(300))
        .view(ViewMode::Off)
        .build()
        .unwrap();
    let report = ctl.run(RunOptions::default()).await.unwrap();
    assert!(report.is_complete(), "{report}");
    let mut runs = Vec::new();
    for stage in std::fs::read_dir(dir.join("work")).unwrap() {
        for unit in std::fs::read_dir(stage.unwrap().path()).unwrap() {
            let text =
                std::fs::read_to_string(unit.unwrap().path().join("seen.log")).unwrap_or_default();
            for l in text.lines() {
                let w: Vec<&str> = l.split(' ').collect();
                runs.push((
                    w[0].to_string(),
                    w[1].split(',').map(str::to_string).collect::<Vec<_>>(),
                    w[2].parse::<u128>().unwrap(),
                    w[3].parse::<u128>().unwrap(),
                ));
            }
        }
    }
    assert_eq!(runs.len(), stages, "{runs:?}");
    for r in &runs {
        assert_eq!(r.1.len(), 1, "one GPU per stage, set by Ray: {r:?}");
        assert!(["0", "1", "2", "3"].contains(&r.1[0].as_str()), "{r:?}");
    }
    assert_disjoint(&runs);
    // The stub ran from the venv, in the execution contract's repository (the job's working
    // directory), with the stage's own arguments.
    let text = std::fs::read_to_string(dir.join("work/mip/0/args.log")).unwrap();
    assert!(
        text.starts_with(&format!("{} ", repo.display())) && text.contains("--stage mip"),
        "{text}"
    );
}
