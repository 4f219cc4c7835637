//! Campaigns on the bare-metal executor over real OpenSSH hosts on loopback
//! (`scripts/ssh-hosts.sh`: sshd instances h1-h7, 4 fake GPUs each):
//! - the digits campaign example runs to completion across h1-h4 with the same results as on
//!   the local runner, GPU slices disjoint (every attempt records host, CUDA_VISIBLE_DEVICES and
//!   its time span; overlapping attempts on one host never share a GPU);
//! - a real Puzzletron fixture (qwen3p5_0p8b `mip_smoke`) with a stub worker in the runner's
//!   venv runs to completion across the hosts;
//! - `kill -9` of the controller at random moments (`PUZZLETRON_BM_CRASH_TRIALS`, default 30):
//!   no attempt started twice, no lost result, results identical;
//! - one host's sshd stopped mid-run and started again: the campaign completes; a host stopped
//!   for good (sshd and its tasks killed): its tasks fail as NODE_FAIL after `--lost-after`
//!   and are resubmitted on the other host.
//!
//! The fault tests use h5/h6 only, so they never disturb the tests running on h1-h4.

#[path = "support/ssh_hosts.rs"]
mod ssh_hosts;
mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::campaign::{KillPlan, Rng, Trials, audit, campaign_exe, kill_9_trials, result, spawn};
use support::watchdog;

const CLUSTER: &str = "h1:4,h2:4,h3:4,h4:4";
const SPARE: &str = "h5:4,h6:4";

fn bm_args(h: &ssh_hosts::SshHosts, hosts: &str) -> Vec<String> {
    vec![
        "--runner".into(),
        "baremetal".into(),
        "--hosts".into(),
        hosts.into(),
        "--ssh-config".into(),
        h.config.display().to_string(),
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
    let _ = std::fs::write(dir.with_extension("log"), &text);
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

/// `seen.log` lines of every unit: (attempt, host, GPUs, start ms, end ms).
fn seen(dir: &Path) -> Vec<(String, String, Vec<String>, u128, u128)> {
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
                    w[1].to_string(),
                    gpus,
                    w[3].parse().unwrap(),
                    w[4].parse().unwrap(),
                ));
            }
        }
    }
    v
}

/// Overlapping attempts on one host never share a GPU.
fn assert_disjoint(runs: &[(String, String, Vec<String>, u128, u128)]) {
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.1 == b.1 && a.3 < b.4 && b.3 < a.4 {
                assert!(
                    a.2.iter().all(|g| !b.2.contains(g)),
                    "{} and {} overlapped on {} with GPUs {:?} / {:?}",
                    a.0,
                    b.0,
                    a.1,
                    a.2,
                    b.2
                );
            }
        }
    }
}

fn reference(root: &Path) -> serde_json::Value {
    let dir = root.join("reference-local");
    run(&dir, &["--epochs".into(), "1".into()]);
    result(&dir)
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn digits_campaign_runs_across_hosts_with_disjoint_gpu_slices() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("digits_baremetal", Duration::from_secs(600));
    let root = tempfile::tempdir().unwrap();
    let want = reference(root.path());
    let dir = root.path().join("bm");
    run(&dir, &bm_args(&h, CLUSTER));
    assert_eq!(
        result(&dir),
        want,
        "bare-metal results differ from the local runner's"
    );
    let a = audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");
    let runs = seen(&dir);
    assert!(runs.len() >= 10, "{runs:?}");
    assert_disjoint(&runs);
    let hosts: BTreeSet<&str> = runs.iter().map(|r| r.1.as_str()).collect();
    assert!(
        hosts.len() >= 2 && hosts.iter().all(|x| ["h1", "h2", "h3", "h4"].contains(x)),
        "{hosts:?}"
    );
    // score shards ask for 1 GPU each and saw exactly one.
    for r in runs
        .iter()
        .filter(|r| r.0.contains(".score.") && !r.0.contains(".agg."))
    {
        assert_eq!(r.2.len(), 1, "{r:?}");
    }
    // Every lease released at the end; a second run is a no-op that submits nothing.
    let leases: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("baremetal/gpu-leases.json")).unwrap())
            .unwrap();
    assert!(
        leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["released"] == true),
        "{leases}"
    );
    let before = audit(&dir).attempts;
    run(&dir, &bm_args(&h, CLUSTER));
    assert_eq!(audit(&dir).attempts, before);
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn kill_9_of_the_controller_at_random_moments() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let trials: usize = std::env::var("PUZZLETRON_BM_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let _w = watchdog::Watchdog::start("bm_kill_9", Duration::from_secs(300 + 30 * trials as u64));
    let seed = std::env::var("PUZZLETRON_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0xba5e_u64);
    let mut rng = Rng(seed | 1);
    let root = tempfile::tempdir().unwrap();
    let want = reference(root.path());
    let args = bm_args(&h, CLUSTER);
    let started = Instant::now();
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = kill_9_trials(
        root.path(),
        KillPlan {
            trials,
            window_ms: 2950,
            limit: Duration::from_secs(300 + 30 * trials as u64),
        },
        &mut rng,
        &want,
        |dir| spawn(dir, &arg_refs),
        |_, dir| assert_disjoint(&seen(dir)),
    );
    let Trials {
        kills,
        campaigns,
        adopted,
        ..
    } = t;
    eprintln!(
        "bare-metal crash trials: {kills} kill -9 over {campaigns} campaigns (seed {seed}), {adopted} adopted, 0 duplicates, 0 lost results, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Waits until the campaign in `dir` has a live lease on `host` whose task runs there.
fn wait_for_task_on(dir: &Path, host: &str, child: &mut std::process::Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if let Ok(b) = std::fs::read(dir.join("baremetal/gpu-leases.json"))
            && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b)
        {
            let live = v["leases"].as_array().into_iter().flatten().any(|l| {
                l["released"] == false
                    && l["slices"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|s| s["host"] == host)
            });
            // The payload itself (not a poll's shell) runs there.
            if live && ssh_hosts::ctl(&["ps", host]).contains("worker --epochs") {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn host_down_and_back_then_host_down_for_good() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("bm_host_faults", Duration::from_secs(600));
    let root = tempfile::tempdir().unwrap();
    let want = reference(root.path());

    // 1. h5's sshd stops while it runs a task, and comes back 4 s later: the campaign
    //    completes without losing or repeating anything.
    let dir = root.path().join("blip");
    let mut child = Command::new(campaign_exe())
        .arg("--dir")
        .arg(&dir)
        .args(["--quiet", "--poll-ms", "100"])
        .args(bm_args(&h, SPARE))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for_task_on(&dir, "h5", &mut child),
        "no task ran on h5"
    );
    ssh_hosts::ctl(&["stop", "h5"]);
    std::thread::sleep(Duration::from_secs(4));
    ssh_hosts::ctl(&["start", "h5"]);
    let st = child.wait().unwrap();
    assert!(st.success(), "campaign with a host blip exited {st}");
    assert_eq!(result(&dir), want);
    let a = audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");

    // 2. h6 goes away for good (sshd and every process of it killed) while it runs a task:
    //    after --lost-after its tasks are NODE_FAIL (transient) and resubmitted on h5.
    let dir = root.path().join("gone");
    // h6 first: the GPU stages (score's shards, realize) are placed there first.
    let mut args = bm_args(&h, "h6:4,h5:4");
    args.extend(["--lost-after".into(), "3".into()]);
    // Payloads on h6 wait while `gone.hold.h6` exists beside the campaign folder
    // (examples/campaign.rs): the host is stopped while one surely runs there, however fast
    // the campaign (it takes ~3 s in all).
    let hold = root.path().join("gone.hold.h6");
    std::fs::write(&hold, b"").unwrap();
    let mut child = Command::new(campaign_exe())
        .arg("--dir")
        .arg(&dir)
        .args(["--quiet", "--poll-ms", "100"])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ran = wait_for_task_on(&dir, "h6", &mut child);
    ssh_hosts::ctl(&["stop", "h6"]);
    ssh_hosts::ctl(&["kill-tasks", "h6"]);
    std::fs::remove_file(&hold).unwrap();
    let out = child.wait_with_output().unwrap();
    ssh_hosts::ctl(&["start", "h6"]);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(ran, "no task ran on h6:\n{text}");
    assert!(
        out.status.success(),
        "campaign with a dead host exited {}:\n{text}",
        out.status
    );
    assert_eq!(result(&dir), want);
    let a = audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");
    let journal = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(
        journal.contains("NODE_FAIL")
            || journal.contains("node_fail")
            || journal.contains("transient"),
        "no transient failure recorded:\n{journal}"
    );
    // Everything that finished after the loss ran on h5.
    let runs = seen(&dir);
    let lost: Vec<_> = runs.iter().filter(|r| r.1 == "h6").collect();
    let after: Vec<_> = runs.iter().filter(|r| r.0.ends_with(".a2")).collect();
    assert!(
        !after.is_empty() && after.iter().all(|r| r.1 == "h5"),
        "retries {after:?}, on h6 {lost:?}"
    );
}

/// A real Puzzletron fixture (qwen3p5_0p8b `mip_smoke`, 11 single-instance stages, 1 GPU each)
/// with a stub worker: the runner's venv puts a stub `python` first in PATH that records what
/// it saw and writes `_SUCCESS`. Driven in-process by the library's controller.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puzzletron_fixture_with_a_stub_worker_runs_across_hosts() {
    use puzzletron::campaign::controller::RunOptions;
    use puzzletron::campaign::{ExecutionConfig, RunnerEnvironment, compile_campaign_plan};

    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("bm_fixture", Duration::from_secs(300));
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/puzzletron-configs");
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
         printf '%s %s %s %s %s\\n' \"$PUZZLETRON_ATTEMPT_ID\" \"$PUZZLETRON_HOST\" \"${CUDA_VISIBLE_DEVICES:--}\" \"$start\" \"$(date +%s%3N)\" >> \"$PUZZLETRON_OUTPUT_DIR/seen.log\"\n\
         : > \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // Distributed stages start with torchrun, which a venv with PyTorch has in its bin/: the
    // repository's stand-in (no torch here).
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/bin/torchrun"),
        venv.join("bin/torchrun"),
    )
    .unwrap();
    let runner_yaml = root.path().join("runner.yaml");
    std::fs::write(
        &runner_yaml,
        format!(
            "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h1\n    rendezvous_port_base: 29600\n    hosts:\n{}  execution_contract:\n    repository: {}\n    venv: {}\n",
            ["h1", "h2", "h3", "h4"].iter().map(|x| format!("      - {{hostname: {x}, gpus: 4}}\n")).collect::<String>(),
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
    let dir = campaign_dir(root.path());
    let exec = Arc::new(bm_executor(&plan, &h, &dir, None));
    let report = bm_controller(plan, exec, &dir)
        .run(RunOptions::default())
        .await
        .unwrap();
    assert!(report.is_complete(), "{report}");
    let runs = seen(&dir);
    assert_eq!(runs.len(), stages, "{runs:?}");
    for r in &runs {
        assert_eq!(r.2.len(), 1, "one GPU per stage: {r:?}");
        assert!(["h1", "h2", "h3", "h4"].contains(&r.1.as_str()), "{r:?}");
    }
    assert_disjoint(&runs);
    // The stub ran from the venv, in the execution contract's repository (the job's working
    // directory), with the stage's own arguments; the resolved config is the campaign's.
    let text = std::fs::read_to_string(dir.join("work/mip/0/args.log")).unwrap();
    assert!(
        text.starts_with(&format!("{} ", repo.display()))
            && text.contains("--stage mip")
            && text.contains(&format!(
                "--config {}/.puzzletron/resolved-config.json",
                dir.display()
            )),
        "{text}"
    );
}

/// Issue 27, item 1 on real sshd hosts: h6's setup fails every job at once (the runner's
/// prerun command, run by the job script before the payload, fails there as a missing mount
/// would; the sshd of hN sets `PUZZLETRON_FAKE_HOST=hN`), so its jobs end `FAILED` within a
/// second, before their start mark. Once two distinct units failed that way h6 is excluded
/// (journaled, named in the history), the bare-metal lease never places a later attempt there
/// and the stage completes on h5. Every attempt that ran its payload wrote its start mark.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_failing_jobs_fast_before_the_start_mark_is_excluded_and_the_stage_completes() {
    use puzzletron::campaign::controller::RunOptions;
    use serde_json::Value;

    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("bm_fast_failing_host", Duration::from_secs(300));
    let root = tempfile::tempdir().unwrap();
    let prerun = "if [ \"$PUZZLETRON_FAKE_HOST\" = h6 ]; then echo \"prerun: scratch mount missing on $PUZZLETRON_FAKE_HOST\" >&2; exit 1; fi";
    let runner_yaml = root.path().join("runner.yaml");
    // First fit: h5 takes four 1-GPU units, h6 the other two.
    std::fs::write(
        &runner_yaml,
        format!(
            "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h5\n    hosts:\n      - {{hostname: h5, gpus: 4}}\n      - {{hostname: h6, gpus: 4}}\n  execution_contract:\n    prerun_commands: [{prerun:?}]\n"
        ),
    )
    .unwrap();
    let plan = sharded_plan(&runner_yaml, 6, "sleep 0.5", 2);
    let dir = campaign_dir(root.path());
    let exec = Arc::new(bm_executor(&plan, &h, &dir, None));
    let report = bm_controller(plan, exec, &dir)
        .run(RunOptions::default())
        .await
        .unwrap();
    assert!(report.is_complete(), "{report}");
    let journal = journal_entries(&dir);
    let finished: Vec<&Value> = journal.iter().filter(|e| e["t"] == "finished").collect();
    let fast: Vec<&&Value> = finished.iter().filter(|e| e["fail_fast"] == true).collect();
    assert!(fast.len() >= 2, "{journal:?}");
    for f in &fast {
        assert_eq!(f["nodes"], "h6", "{f}");
        assert_eq!(f["class"], "transient", "{f}");
        let d = f["detail"].as_str().unwrap();
        assert!(
            d.contains("before its start mark (the payload never started)")
                && d.contains("infrastructure failure on h6"),
            "{f}"
        );
    }
    // Nothing else failed, and every attempt that ran its payload did so on h5.
    for f in &finished {
        if f["fail_fast"] != true {
            assert!(f["class"].is_null(), "{f}");
            assert_eq!(f["nodes"], "h5", "{f}");
        }
    }
    let excluded: Vec<&Value> = journal
        .iter()
        .filter(|e| e["t"] == "node_excluded")
        .collect();
    assert_eq!(excluded.len(), 1, "{excluded:?}");
    assert_eq!(excluded[0]["node"], "h6");
    let why = excluded[0]["reason"].as_str().unwrap();
    assert!(why.contains("distinct units failed fast on it"), "{why}");
    let hist = puzzletron::report::CampaignHistory::load(&dir, false).unwrap();
    assert_eq!(hist.excluded_nodes.len(), 1);
    assert_eq!(hist.excluded_nodes[0].1, "h6");
    // Every submission after the exclusion carried it, and the lease placed none on h6.
    let at = journal
        .iter()
        .position(|e| e["t"] == "node_excluded")
        .unwrap();
    let later: BTreeSet<String> = journal[at..]
        .iter()
        .filter(|e| e["t"] == "intent")
        .map(|e| e["attempt_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !later.is_empty(),
        "no retry after the exclusion: {journal:?}"
    );
    let leases: Value =
        serde_json::from_slice(&std::fs::read(dir.join("baremetal/gpu-leases.json")).unwrap())
            .unwrap();
    for l in leases["leases"].as_array().unwrap() {
        if later.contains(l["attempt_id"].as_str().unwrap()) {
            assert_eq!(l["slices"][0]["host"], "h5", "{l}");
            let d = l["spec"]["scheduler"]["extra_directives"].to_string();
            assert!(d.contains("--exclude=h6"), "{l}");
        }
    }
    // The start mark: each unit's output folder holds the id of its attempt that succeeded.
    let succeeded: BTreeSet<String> = finished
        .iter()
        .filter(|f| f["fail_fast"] != true)
        .map(|f| f["attempt_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(succeeded.len(), 6, "{finished:?}");
    let mut marks = BTreeSet::new();
    for unit in std::fs::read_dir(dir.join("work/s")).unwrap() {
        let m = std::fs::read_to_string(unit.unwrap().path().join("_STARTED")).unwrap();
        marks.insert(m.trim().to_string());
    }
    assert_eq!(marks, succeeded);
}

/// Issue 27 (P07 c) on real sshd hosts: h6's host key changes mid-campaign (the executor has
/// its own copy of known_hosts; the test rewrites h6's line there with another key and ends
/// h6's master connection, so the next exchange logs in again). h6 is excluded campaign-wide
/// (journaled, the message naming the host and the fix), its attempts are placed on h5 without
/// being charged (`max_attempts` 1), the campaign completes, and the wrong line is still in
/// the copy: the key was never accepted automatically.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_key_changes_mid_campaign_is_excluded_and_the_campaign_completes() {
    use puzzletron::campaign::controller::RunOptions;
    use serde_json::{Value, json};

    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("bm_changed_host_key", Duration::from_secs(300));
    let root = tempfile::tempdir().unwrap();
    // The executor's own known_hosts: a copy of the hosts' one.
    let kh = root.path().join("known_hosts");
    std::fs::copy(h.dir.join("known_hosts"), &kh).unwrap();
    let key = root.path().join("other");
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let other: String = std::fs::read_to_string(key.with_extension("pub"))
        .unwrap()
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let config_text = std::fs::read_to_string(&h.config).unwrap();
    let h6_addr = config_text
        .split("Host ")
        .find(|b| b.starts_with("h6\n"))
        .and_then(|b| b.lines().find_map(|l| l.trim().strip_prefix("HostName ")))
        .unwrap()
        .to_string();
    let runner_yaml = root.path().join("runner.yaml");
    std::fs::write(
        &runner_yaml,
        "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h5\n    hosts:\n      - {hostname: h5, gpus: 4}\n      - {hostname: h6, gpus: 4}\n",
    )
    .unwrap();
    // 1-GPU units on the 8 GPUs: h6's key changes while its four run.
    let plan = sharded_plan(&runner_yaml, 8, "sleep 2", 1);
    let dir = campaign_dir(root.path());
    let exec = Arc::new(bm_executor(
        &plan,
        &h,
        &dir,
        Some(format!("UserKnownHostsFile={}", kh.display())),
    ));
    let control = exec.ssh_control_dir().to_path_buf();
    let mut ctl = bm_controller(plan, exec.clone(), &dir);
    // Mid-campaign: once attempts were launched on h6, its key changes while they run.
    let journal_path = dir.join("controller/journal.jsonl");
    let (kh2, cfg2, other2) = (kh.clone(), h.config.clone(), other.clone());
    let changer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let j = std::fs::read_to_string(&journal_path).unwrap_or_default();
            if j.lines().any(|l| {
                serde_json::from_str::<Value>(l).is_ok_and(|v| {
                    v["entry"]["t"] == "submitted" && v["entry"]["handle"]["data"]["hosts"] == "h6"
                })
            }) {
                std::thread::sleep(Duration::from_millis(300));
                let text = std::fs::read_to_string(&kh2).unwrap();
                let mut out = String::new();
                for l in text.lines() {
                    if l.starts_with(&format!("[{h6_addr}]:"))
                        || l.starts_with(&format!("{h6_addr} "))
                    {
                        let host = l.split_whitespace().next().unwrap();
                        out.push_str(&format!("{host} {other2}\n"));
                    } else {
                        out.push_str(l);
                        out.push('\n');
                    }
                }
                std::fs::write(&kh2, &out).unwrap();
                // The master connection outlives the change: end it, so that the next exchange
                // logs in again and meets the new key.
                let _ = Command::new("ssh")
                    .arg("-F")
                    .arg(&cfg2)
                    .arg("-o")
                    .arg(format!("ControlPath={}/%C", control.display()))
                    .args(["-O", "exit", "h6"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                return Some(out);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    });
    let report = ctl.run(RunOptions::default()).await.unwrap();
    let wrong = changer.join().unwrap().expect("no attempt launched on h6");
    assert!(report.is_complete(), "{report}");
    let journal = journal_entries(&dir);
    let excluded: Vec<&Value> = journal
        .iter()
        .filter(|e| e["t"] == "node_excluded")
        .collect();
    assert_eq!(excluded.len(), 1, "{journal:?}");
    assert_eq!(excluded[0]["node"], "h6");
    let why = excluded[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("host key of h6 changed or is unknown")
            && why.contains("never accepted automatically")
            // ssh's own remove command, which names the entry as stored (an alias's
            // `[address]:port`), not `ssh-keygen -R h6`, which would not find it.
            && why.contains(&format!("ssh-keygen -f \"{}\" -R \"[127.0.10.6]:", kh.display())),
        "{why}"
    );
    let hist = puzzletron::report::CampaignHistory::load(&dir, false).unwrap();
    assert_eq!(hist.excluded_nodes.len(), 1);
    assert_eq!(hist.excluded_nodes[0].1, "h6");
    // Where h6's key was met: a submit refused for it, or attempts on h6 ended as node
    // failures (transient: not charged to the stage's `max_attempts` of 1).
    let met: Vec<String> = journal
        .iter()
        .filter(|e| {
            (e["t"] == "submit_failed" && e.to_string().contains("host key refused"))
                || (e["t"] == "finished" && !e["class"].is_null())
        })
        .map(|e| format!("{} {} {}", e["t"], e["attempt_id"], e["state"]["state"]))
        .collect();
    println!("h6 excluded after: {met:?}; reason: {why}");
    assert!(!met.is_empty(), "{journal:?}");
    for e in journal
        .iter()
        .filter(|e| e["t"] == "finished" && !e["class"].is_null())
    {
        assert_eq!(
            (&e["nodes"], &e["class"], &e["state"]["state"]),
            (&json!("h6"), &json!("transient"), &json!("node_fail")),
            "{e}"
        );
    }
    // Every unit succeeded once; nothing finished on h6 after the exclusion, and every
    // attempt started after it was placed on h5.
    let at = journal
        .iter()
        .position(|e| e["t"] == "node_excluded")
        .unwrap();
    let ok: Vec<&Value> = journal
        .iter()
        .filter(|e| e["t"] == "finished" && e["class"].is_null())
        .collect();
    assert_eq!(ok.len(), 8, "{journal:?}");
    for f in &journal[at..] {
        if f["t"] == "finished" && f["class"].is_null() {
            assert_eq!(f["nodes"], "h5", "{f}");
        }
    }
    let later: BTreeSet<String> = journal[at..]
        .iter()
        .filter(|e| e["t"] == "intent")
        .map(|e| e["attempt_id"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !later.is_empty(),
        "nothing ran after the exclusion: {journal:?}"
    );
    let leases: Value =
        serde_json::from_slice(&std::fs::read(dir.join("baremetal/gpu-leases.json")).unwrap())
            .unwrap();
    for l in leases["leases"].as_array().unwrap() {
        if later.contains(l["attempt_id"].as_str().unwrap()) {
            assert_eq!(l["slices"][0]["host"], "h5", "{l}");
        }
    }
    // Never auto-accepted: the copy still holds the test's wrong line for h6.
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), wrong);
    assert!(wrong.contains(&other));
}

/// A one-stage plan for the runner file `runner_yaml`: `instances` sharded 1-GPU units that run
/// `work` then write their success marker, with `max_attempts` and the resume policy.
fn sharded_plan(
    runner_yaml: &Path,
    instances: u32,
    work: &str,
    max_attempts: u32,
) -> puzzletron::campaign::CampaignPlan {
    use serde_json::json;
    support::plan::PlanBuilder::stages(json!([{
        "id": "s",
        "strategy": "sharded",
        "instances": instances,
        "command": ["sh", "-c", format!("{work}; touch \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\"")],
    }]))
    .runner(puzzletron::campaign::RunnerEnvironment::load(runner_yaml).unwrap())
    .execution(json!({"defaults": {
        "gpus_per_node": 4, "max_attempts": max_attempts, "failure_policy": "resume"
    }}))
    .build()
}

/// The campaign folder under `root`.
fn campaign_dir(root: &Path) -> PathBuf {
    puzzletron::campaign::controller::open_campaign_dir(&root.join("campaign")).unwrap()
}

/// The plan's bare-metal executor on the test hosts (state under `dir`), with one more ssh
/// option when given.
fn bm_executor(
    plan: &puzzletron::campaign::CampaignPlan,
    h: &ssh_hosts::SshHosts,
    dir: &Path,
    ssh_option: Option<String>,
) -> puzzletron::executor::BareMetalExecutor {
    let mut b = plan
        .runner
        .baremetal_executor(dir.join("baremetal"))
        .unwrap()
        .ssh_config(&h.config)
        .kill_grace(Duration::from_secs(1));
    if let Some(o) = ssh_option {
        b = b.ssh_option(o);
    }
    b.build().unwrap()
}

/// A quiet controller of `plan` on `exec` in `dir`, polling every 100-300 ms.
fn bm_controller(
    plan: puzzletron::campaign::CampaignPlan,
    exec: Arc<puzzletron::executor::BareMetalExecutor>,
    dir: &Path,
) -> puzzletron::campaign::controller::CampaignController {
    use puzzletron::campaign::controller::{CampaignController, ViewMode};
    CampaignController::builder()
        .plan(plan)
        .executor(exec)
        .campaign_dir(dir)
        .poll_interval(Duration::from_millis(100), Duration::from_millis(300))
        .view(ViewMode::Off)
        .build()
        .unwrap()
}

/// The journal's entries, in order.
fn journal_entries(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("controller/journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["entry"].clone())
        .collect()
}
