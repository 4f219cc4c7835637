//! The controller on the real Slurm cluster of `../shared/slurm/start-local-cluster.sh`, with
//! the `campaign` example (real jobs, real data):
//! - crash trials: the controller is killed with SIGKILL at random moments and restarted
//!   (`PUZZLETRON_SLURM_CRASH_TRIALS` kills, default 10); every campaign ends complete, with the
//!   local executor's results, and `sacct` shows exactly one job per attempt id;
//! - slurmctld is stopped and started again in the middle of a campaign: the campaign
//!   completes and no attempt is counted as failed;
//! - detach (`--once`) then run again re-attaches without resubmitting; a cancel (SIGTERM, off a
//!   terminal) leaves no job of the campaign in `squeue`.
//!
//! Run with `PUZZLETRON_SLURM_TESTS=1` (then a missing cluster is a failure); without it the
//! tests print why they skip.

mod support;
use support::watchdog;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use support::campaign::{Rng, audit, result, spawn, spawn_env};

/// The tests share one cluster and stop slurmctld: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn shared() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/slurm"))
}

fn cluster_or_skip(test: &str) -> bool {
    let wanted = std::env::var("PUZZLETRON_SLURM_TESTS").is_ok_and(|v| v == "1");
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).lines().any(|l| {
                    l.starts_with("idle") || l.starts_with("mix") || l.starts_with("alloc")
                })
        });
    match (wanted, up) {
        (true, true) => true,
        (true, false) => panic!(
            "{test}: PUZZLETRON_SLURM_TESTS=1 but no Slurm cluster answers `sinfo`; start it with `bash {}/start-local-cluster.sh </dev/null` (as root)",
            shared().display()
        ),
        (false, _) => {
            eprintln!(
                "{test}: skipped (set PUZZLETRON_SLURM_TESTS=1 to run it on the local Slurm cluster)"
            );
            false
        }
    }
}

fn nonce(dir: &Path) -> String {
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(j.lines().next().unwrap()).unwrap();
    first["entry"]["nonce"].as_str().unwrap().to_string()
}

/// Jobs per job name (attempt id) of this campaign, from `sacct`.
fn sacct_jobs(nonce: &str) -> HashMap<String, usize> {
    let out = Command::new("sacct")
        .args([
            "-n",
            "-X",
            "-P",
            "-S",
            "now-2hours",
            "--format=JobName%80,JobID",
        ])
        .output()
        .expect("sacct");
    assert!(
        out.status.success(),
        "sacct: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut m = HashMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let name = l.split('|').next().unwrap_or("");
        if name.starts_with(&format!("{nonce}.")) {
            *m.entry(name.to_string()).or_default() += 1;
        }
    }
    m
}

fn squeue_names(nonce: &str) -> Vec<String> {
    let out = Command::new("squeue")
        .args(["-h", "-o", "%j"])
        .output()
        .expect("squeue");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with(&format!("{nonce}.")))
        .map(String::from)
        .collect()
}

fn local_reference(root: &Path) -> serde_json::Value {
    let dir = root.join("local-reference");
    let st = spawn(&dir, &[]).wait().unwrap();
    assert!(st.success());
    result(&dir)
}

fn check_campaign(dir: &Path, reference: &serde_json::Value) -> (usize, usize) {
    assert_eq!(
        &result(dir),
        reference,
        "{}: Slurm results differ from the local executor's",
        dir.display()
    );
    let a = audit(dir);
    assert!(
        a.duplicates.is_empty(),
        "{}: {:?}",
        dir.display(),
        a.duplicates
    );
    assert!(
        a.missing.is_empty(),
        "{}: lost results {:?}",
        dir.display(),
        a.missing
    );
    let n = nonce(dir);
    // slurmdbd records jobs a little after the fact (seconds under load): wait for all.
    let t0 = Instant::now();
    let jobs = loop {
        let jobs = sacct_jobs(&n);
        if jobs.len() >= a.attempts || t0.elapsed() > Duration::from_secs(30) {
            break jobs;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let dups: Vec<_> = jobs.iter().filter(|(_, c)| **c > 1).collect();
    assert!(
        dups.is_empty(),
        "{}: attempt ids with several Slurm jobs: {dups:?}",
        dir.display()
    );
    assert_eq!(
        jobs.len(),
        a.attempts,
        "{}: every submitted attempt is one Slurm job",
        dir.display()
    );
    (a.attempts, a.adopted)
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn slurm_crash_trials_match_local_results_with_one_job_per_attempt() {
    let _watchdog = watchdog::Watchdog::start(
        "slurm_crash_trials_match_local_results_with_one_job_per_attempt",
        Duration::from_secs(600),
    );
    if !cluster_or_skip("slurm crash trials") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let trials = trials_from_env("PUZZLETRON_SLURM_CRASH_TRIALS", 10);
    let root = tempfile::tempdir().unwrap();
    let reference = local_reference(root.path());
    // The worst moment first: abort right after the 3rd sbatch (a `score` shard), before its
    // handle is journaled; the restart must find the job by name (attempt id) and adopt it.
    let dir = root.path().join("slurm-abort");
    let st = spawn_env(
        &dir,
        &["--runner", "slurm"],
        &[("CAMPAIGN_ABORT_AFTER_SUBMITS", "3")],
    )
    .wait()
    .unwrap();
    assert!(!st.success(), "aborted after the 3rd submit");
    let st = spawn(&dir, &["--runner", "slurm"]).wait().unwrap();
    assert!(st.success());
    let (_, adopted_after_abort) = check_campaign(&dir, &reference);
    assert!(
        adopted_after_abort >= 1,
        "the job submitted before the abort was adopted"
    );
    let mut rng = Rng(0xC0FFEE);
    let (mut kills, mut campaigns, mut attempts, mut adopted) = (0, 0, 0, 0);
    let started = Instant::now();
    while kills < trials {
        campaigns += 1;
        let dir = root.path().join(format!("slurm{campaigns}"));
        loop {
            let mut child = spawn(&dir, &["--runner", "slurm"]);
            let finished = exit_within(&mut child, Duration::from_millis(300 + rng.below(6000)));
            match finished {
                Some(st) => {
                    assert!(st.success(), "campaign {campaigns} exited with {st}");
                    break;
                }
                None if kills < trials => {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    kills += 1;
                }
                None => {
                    let st = child.wait().unwrap();
                    assert!(st.success(), "campaign {campaigns} exited with {st}");
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "Slurm crash trials take too long"
            );
        }
        let (n, a) = check_campaign(&dir, &reference);
        attempts += n;
        adopted += a;
    }
    eprintln!(
        "slurm crash trials: {kills} kill -9 over {campaigns} campaigns, {attempts} attempts (= Slurm jobs), {adopted} adopted, 0 duplicates, 0 lost results, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// A count from the environment variable `var`, else `default`.
fn trials_from_env(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The child's exit status if it ends within `wait`, else `None` (it keeps running).
fn exit_within(
    child: &mut std::process::Child,
    wait: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn slurmctld_pid() -> Option<i32> {
    std::fs::read_to_string("/var/lib/slurm-local/run/slurmctld.pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn slurmctld_restart_mid_campaign() {
    let _watchdog =
        watchdog::Watchdog::start("slurmctld_restart_mid_campaign", Duration::from_secs(600));
    if !cluster_or_skip("slurmctld restart") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = tempfile::tempdir().unwrap();
    let reference = local_reference(root.path());
    let dir = root.path().join("ctld");
    let mut child = spawn(&dir, &["--runner", "slurm"]);
    // Wait until the score shards are submitted.
    let t0 = Instant::now();
    loop {
        let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap_or_default();
        if j.contains("\"unit\":\"score/3\"") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "score never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the campaign is running when slurmctld stops"
    );
    let pid = slurmctld_pid().expect("slurmctld pid file");
    // SAFETY: signalling the slurmctld process named by its pid file.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(6)); // the controller polls a dead slurmctld
    // Restart it the way the start script does (it starts only what is not running).
    let st = Command::new("bash")
        .arg(shared().join("start-local-cluster.sh"))
        .stdin(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "start-local-cluster.sh failed: the cluster is not healthy"
    );
    let st = child.wait().unwrap();
    assert!(st.success(), "campaign exited with {st}");
    check_campaign(&dir, &reference);
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    // The executor retries scheduler commands itself; what may reach the controller is a
    // `poll_error` event, never a failed attempt.
    for l in j.lines().filter(|l| l.contains("\"t\":\"finished\"")) {
        assert!(
            l.contains("\"class\":null"),
            "an attempt was counted as failed: {l}"
        );
    }
    let ping = Command::new("scontrol").arg("ping").output().unwrap();
    assert!(
        String::from_utf8_lossy(&ping.stdout).contains("is UP"),
        "slurmctld is up again"
    );
}

#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn detach_reattaches_and_cancel_leaves_no_job_in_squeue() {
    let _watchdog = watchdog::Watchdog::start(
        "detach_reattaches_and_cancel_leaves_no_job_in_squeue",
        Duration::from_secs(600),
    );
    if !cluster_or_skip("detach/cancel") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = tempfile::tempdir().unwrap();
    let reference = local_reference(root.path());
    // Detach: one iteration, then exit leaving the prepare job in Slurm.
    let dir = root.path().join("detach");
    let st = spawn(&dir, &["--runner", "slurm", "--once"])
        .wait()
        .unwrap();
    assert_eq!(st.code(), Some(3), "--once detaches (exit 3)");
    let n = nonce(&dir);
    let st = spawn(&dir, &["--runner", "slurm"]).wait().unwrap();
    assert!(st.success());
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(
        j.contains("re-attached to 1 live attempts"),
        "the second run re-attached"
    );
    check_campaign(&dir, &reference);
    assert_eq!(sacct_jobs(&n).get(&format!("{n}.prepare.0.a1")), Some(&1));

    // Cancel: SIGTERM off a terminal cancels every live job.
    let dir = root.path().join("cancel");
    let mut child = spawn(&dir, &["--runner", "slurm"]);
    let t0 = Instant::now();
    let n = loop {
        if dir.join("controller/journal.jsonl").exists()
            && let Ok(j) = std::fs::read_to_string(dir.join("controller/journal.jsonl"))
            && j.contains("\"unit\":\"score/3\"")
        {
            break nonce(&dir);
        }
        assert!(t0.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(2), "cancelled: incomplete report");
    assert!(
        squeue_names(&n).is_empty(),
        "jobs left in squeue: {:?}",
        squeue_names(&n)
    );
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(j.contains("\"kind\":\"shut_down\""));
}

fn slurmdbd_pid() -> Option<i32> {
    std::fs::read_to_string("/var/lib/slurm-local/run/slurmdbd.pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Stops slurmdbd (SIGTERM, waits until it is gone); `start_cluster` brings it back.
fn stop_slurmdbd() {
    let pid = slurmdbd_pid().expect("slurmdbd pid file (the cluster runs with accounting)");
    // SAFETY: signalling the slurmdbd process named by its pid file.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "slurmdbd stopped"
    );
}

/// Starts what is not running, the way the start script does.
fn start_cluster() {
    let st = Command::new("bash")
        .arg(shared().join("start-local-cluster.sh"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "start-local-cluster.sh failed: the cluster is not healthy"
    );
}

/// Brings slurmdbd back whatever happens to the test (the next tests need `sacct`).
struct DbdBack;
impl Drop for DbdBack {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(shared().join("start-local-cluster.sh"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// N02 and the crash rule together: slurmdbd is stopped at the start of each campaign, the
/// controller is killed with SIGKILL at random moments while `sacct` cannot answer (jobs finish
/// and leave squeue meanwhile: they must wait as "accounting pending", and an intent left by a
/// kill must not be given up or resubmitted because `sacct --name` cannot answer), then
/// slurmdbd comes back and the campaign completes. `PUZZLETRON_SLURMDBD_CRASH_TRIALS` kills
/// while slurmdbd is down (default 20); every campaign ends with the local executor's results
/// and exactly one Slurm job per attempt id in `sacct`.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn slurmdbd_down_crash_trials_no_duplicate_no_lost_result() {
    let _watchdog = watchdog::Watchdog::start(
        "slurmdbd_down_crash_trials_no_duplicate_no_lost_result",
        Duration::from_secs(900),
    );
    if !cluster_or_skip("slurmdbd down crash trials") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _back = DbdBack;
    let trials = trials_from_env("PUZZLETRON_SLURMDBD_CRASH_TRIALS", 20);
    let root = tempfile::tempdir().unwrap();
    let reference = local_reference(root.path());
    let mut rng = Rng(0xDBD0);
    let (mut kills, mut campaigns, mut attempts, mut pending_seen) = (0, 0, 0, 0);
    let started = Instant::now();
    while kills < trials {
        campaigns += 1;
        let dir = root.path().join(format!("dbd{campaigns}"));
        stop_slurmdbd();
        let mut dbd_up = false;
        // Kills while slurmdbd is down in this campaign: 4, or what is left of the trials.
        let quota = (trials - kills).min(4);
        let mut here = 0;
        loop {
            let mut child = spawn(&dir, &["--runner", "slurm"]);
            let finished = exit_within(&mut child, Duration::from_millis(500 + rng.below(5000)));
            if let Some(st) = finished {
                assert!(
                    dbd_up,
                    "campaign {campaigns} ended while slurmdbd was down: {st}"
                );
                assert!(st.success(), "campaign {campaigns} exited with {st}");
                break;
            }
            if !dbd_up && here < quota {
                child.kill().unwrap();
                child.wait().unwrap();
                here += 1;
                kills += 1;
                if here == quota {
                    start_cluster();
                    dbd_up = true;
                }
                continue;
            }
            let st = child.wait().unwrap();
            assert!(st.success(), "campaign {campaigns} exited with {st}");
            break;
        }
        let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
        assert!(
            !j.contains("\"t\":\"submit_failed\""),
            "{}: an intent was given up while slurmdbd was down",
            dir.display()
        );
        pending_seen += usize::from(j.contains("\"kind\":\"accounting_pending\""));
        let (n, _) = check_campaign(&dir, &reference);
        attempts += n;
        assert!(
            started.elapsed() < Duration::from_secs(840),
            "slurmdbd crash trials take too long"
        );
    }
    assert!(
        pending_seen > 0,
        "no campaign journaled an accounting_pending event: the outage was never seen"
    );
    eprintln!(
        "slurmdbd-down crash trials: {kills} kill -9 while slurmdbd was stopped, over {campaigns} campaigns ({pending_seen} journaled accounting_pending), {attempts} attempts (= Slurm jobs), 0 duplicates, 0 lost results, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
