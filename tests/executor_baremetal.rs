//! The bare-metal executor against real OpenSSH hosts on loopback (`scripts/ssh-hosts.sh`):
//! the conformance suite, preflight errors, disjoint GPU slices, walltime, cancel leaving no
//! process behind (checked with `ps` per host), an unreachable host.

#[path = "support/ssh_hosts.rs"]
mod ssh_hosts;
#[path = "support/watchdog.rs"]
mod watchdog;

use std::path::Path;
use std::time::Duration;

use puzzletron::executor::{
    AttemptId, AttemptSpec, BareMetalExecutor, CommandSpec, Executor, ExecutorError, ExecutorExt,
    GpuRequest, JobHandle, JobState, TaskTopology, conformance,
};

fn executor(h: &ssh_hosts::SshHosts, state: &Path) -> BareMetalExecutor {
    let mut b = BareMetalExecutor::builder(state)
        .ssh_config(&h.config)
        .kill_grace(Duration::from_secs(1))
        .cancel_timeout(Duration::from_secs(5));
    for host in &h.hosts[..4] {
        b = b.host(host, 4);
    }
    b.build().expect("bare-metal executor")
}

fn uniq(tag: &str) -> String {
    format!("bm{}-{tag}", std::process::id())
}

/// The state folder a child process of `find_from_separate_process` opens.
const CHILD_STATE_ENV: &str = "PUZZLETRON_BM_CONFORMANCE_STATE";

/// Child entry point: a fresh executor over the parent's state folder (its lease file)
/// answers `find` (does nothing in a normal run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baremetal_child_entry() {
    if let Ok(state) = std::env::var(CHILD_STATE_ENV) {
        let h = ssh_hosts::hosts().expect("hosts");
        assert!(conformance::child_main(&executor(&h, Path::new(&state))).await);
    }
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baremetal_executor_conforms() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("baremetal_executor_conforms", Duration::from_secs(300));
    let state = tempfile::tempdir().unwrap();
    let path = state.path().to_path_buf();
    let child_state = path.clone();
    conformance::Conformance::new(move || Box::new(executor(&h, &path)))
        .with_poll_interval(Duration::from_millis(50))
        .with_timeout(Duration::from_secs(60))
        .with_scratch_dir(state.path())
        .with_separate_process(move || {
            let mut c = std::process::Command::new(std::env::current_exe().expect("test binary"));
            c.args([
                "--exact",
                "baremetal_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_STATE_ENV, &child_state);
            c
        })
        .run_all()
        .await;
}

/// Processes of host `h` (as `ps` shows them, environment included) that belong to attempts
/// whose id starts with `prefix`.
fn ps_attempts(h: &str, prefix: &str) -> Vec<String> {
    let out = std::process::Command::new("ps")
        .args(["-eww", "e", "-o", "pid=,pgid=,args="])
        .output()
        .expect("ps");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(&format!("PUZZLETRON_FAKE_HOST={h} "))
                && l.contains(&format!("PUZZLETRON_ATTEMPT_ID={prefix}"))
        })
        .map(|l| l.chars().take(160).collect())
        .collect()
}

fn spec(id: &str, script: &str, gpus: u32) -> AttemptSpec {
    let mut t = TaskTopology::single();
    if gpus > 0 {
        t.gpus = GpuRequest::PerNode(gpus);
    }
    AttemptSpec::new(
        AttemptId::new(id).unwrap(),
        CommandSpec::new("sh").arg("-c").arg(script),
    )
    .with_topology(t)
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_names_the_host_and_what_is_missing() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("preflight", Duration::from_secs(120));
    let state = tempfile::tempdir().unwrap();
    let repo = state.path().join("no-such-checkout");
    let contract = puzzletron::executor::ExecutionContract::default()
        .with_repository(repo.display().to_string());
    let exec = BareMetalExecutor::builder(state.path())
        .ssh_config(&h.config)
        .host(&h.hosts[1], 4)
        .contract(&contract)
        .build()
        .unwrap();
    let e = exec.preflight().await.unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, ExecutorError::HostPreflight { ref host, .. } if host == &h.hosts[1]),
        "{m}"
    );
    assert!(
        m.contains("no-such-checkout") && m.contains("repository"),
        "{m}"
    );
    assert!(!e.is_retryable());
    // The venv must have bin/activate.
    let venv = state.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let contract = puzzletron::executor::ExecutionContract::default()
        .with_repository(state.path().display().to_string())
        .with_venv(venv.display().to_string());
    let exec = BareMetalExecutor::builder(state.path())
        .ssh_config(&h.config)
        .host(&h.hosts[0], 4)
        .contract(&contract)
        .build()
        .unwrap();
    let m = exec.preflight().await.unwrap_err().to_string();
    assert!(m.contains(&h.hosts[0]) && m.contains("bin/activate"), "{m}");
    std::fs::write(venv.join("bin/activate"), "export PTRON_VENV_ON=1\n").unwrap();
    exec.preflight().await.expect("repo and venv exist now");
    // The probe lists 4 GPUs; an inventory of 8 is refused naming the missing ones.
    let exec = BareMetalExecutor::builder(state.path())
        .ssh_config(&h.config)
        .host(&h.hosts[2], 8)
        .build()
        .unwrap();
    let m = exec.preflight().await.unwrap_err().to_string();
    assert!(m.contains(&h.hosts[2]) && m.contains("[4, 5, 6, 7]"), "{m}");
    // A custom probe that fails.
    let exec = BareMetalExecutor::builder(state.path())
        .ssh_config(&h.config)
        .host(&h.hosts[2], 1)
        .gpu_probe(["sh", "-c", "echo no driver >&2; exit 9"])
        .build()
        .unwrap();
    let m = exec.preflight().await.unwrap_err().to_string();
    assert!(m.contains("exit Some(9)") && m.contains("no driver"), "{m}");
    // Submitting runs the preflight first.
    let exec = BareMetalExecutor::builder(state.path().join("s2"))
        .ssh_config(&h.config)
        .host(&h.hosts[1], 4)
        .contract(
            &puzzletron::executor::ExecutionContract::default()
                .with_repository(repo.display().to_string()),
        )
        .build()
        .unwrap();
    let e = exec
        .submit(&spec(&uniq("pf"), "true", 0))
        .await
        .unwrap_err();
    assert!(matches!(e, ExecutorError::HostPreflight { .. }), "{e}");
}

/// Issue 27, item 4: a command whose first word does not resolve on a host after the job's
/// setup (repository, venv) is refused at submit as a host configuration error naming the
/// host, the program, the `PATH` and the working directory, and nothing is leased; a program
/// the venv provides resolves and runs.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_missing_on_a_host_is_refused_at_submit_naming_it() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("program_missing", Duration::from_secs(120));
    let state = tempfile::tempdir().unwrap();
    let venv = state.path().join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::fs::write(
        venv.join("bin/activate"),
        format!("PATH={}/bin:$PATH; export PATH\n", venv.display()),
    )
    .unwrap();
    let tool = venv.join("bin/ptron-venv-tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool ran\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let contract = puzzletron::executor::ExecutionContract::default()
        .with_repository(state.path().display().to_string())
        .with_venv(venv.display().to_string());
    let exec = BareMetalExecutor::builder(state.path().join("s"))
        .ssh_config(&h.config)
        .host(&h.hosts[2], 4)
        .contract(&contract)
        .build()
        .unwrap();
    let missing = AttemptSpec::new(
        AttemptId::new(uniq("nop")).unwrap(),
        CommandSpec::new("ptron-no-such-program").arg("--x"),
    );
    let e = exec.submit(&missing).await.unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, ExecutorError::HostPreflight { ref host, .. } if host == &h.hosts[2]),
        "{m}"
    );
    assert!(!e.is_retryable(), "{m}");
    assert!(
        m.contains("`ptron-no-such-program`")
            && m.contains(&format!("PATH={}/bin:", venv.display()))
            && m.contains(&format!("(working directory {})", state.path().display())),
        "{m}"
    );
    assert!(exec.leases().unwrap().leases.is_empty());
    // The venv's program resolves: submitted and run.
    let found = AttemptSpec::new(
        AttemptId::new(uniq("tool")).unwrap(),
        CommandSpec::new("ptron-venv-tool"),
    );
    let hd = exec.submit(&found).await.unwrap();
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&hd),
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(
        (st[0].state.clone(), st[0].exit_code),
        (JobState::Completed, Some(0)),
        "{st:?}"
    );
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_slices_are_disjoint_and_waiting_tasks_start_later() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("gpu_slices", Duration::from_secs(180));
    let state = tempfile::tempdir().unwrap();
    let seen = state.path().join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    let exec = executor(&h, &state.path().join("campaign"));
    // 4 hosts x 4 GPUs: eight 2-GPU tasks fill them; two more wait.
    let mut handles = Vec::new();
    for i in 0..10 {
        let id = uniq(&format!("slice{i}"));
        let script = format!(
            "echo \"$PUZZLETRON_HOST $CUDA_VISIBLE_DEVICES $(date +%s%N)\" > {}/{id}; sleep 2; echo \"end $(date +%s%N)\" >> {}/{id}",
            seen.display(),
            seen.display()
        );
        handles.push(exec.submit(&spec(&id, &script, 2)).await.unwrap());
    }
    let first = exec.poll(&handles).await.unwrap();
    let pending: Vec<_> = first
        .iter()
        .filter(|s| s.state == JobState::Pending)
        .collect();
    assert!(
        pending.len() >= 2
            && pending.iter().any(|s| s
                .reason
                .as_deref()
                .unwrap_or("")
                .contains("waiting for 2 GPU")),
        "{first:?}"
    );
    let st = exec
        .wait_terminal(
            &handles,
            Duration::from_millis(100),
            Duration::from_secs(90),
        )
        .await
        .unwrap();
    for s in &st {
        assert_eq!(s.state, JobState::Completed, "{s:?}");
    }
    // Every task saw 2 GPUs; tasks that overlapped in time never shared a (host, GPU).
    let mut runs = Vec::new();
    for h in &handles {
        let text = std::fs::read_to_string(seen.join(h.attempt_id.as_str())).unwrap();
        let mut lines = text.lines();
        let first: Vec<&str> = lines.next().unwrap().split(' ').collect();
        let end: u128 = lines.next().unwrap()[4..].parse().unwrap();
        let gpus: Vec<String> = first[1].split(',').map(str::to_string).collect();
        assert_eq!(gpus.len(), 2, "{text}");
        runs.push((
            first[0].to_string(),
            gpus,
            first[2].parse::<u128>().unwrap(),
            end,
        ));
    }
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let overlap = a.2 < b.3 && b.2 < a.3;
            if overlap && a.0 == b.0 {
                assert!(
                    a.1.iter().all(|g| !b.1.contains(g)),
                    "GPU shared on {}: {:?} and {:?}",
                    a.0,
                    a.1,
                    b.1
                );
            }
        }
    }
    let hosts_used: std::collections::BTreeSet<&str> = runs.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(hosts_used.len(), 4, "{runs:?}");
    assert!(runs.iter().all(|r| h.hosts[..4].contains(&r.0)), "{runs:?}");
    assert!(exec.leases().unwrap().leases.iter().all(|l| l.released));
    // A fresh executor (a restarted controller) finds them all from the lease file.
    let again = executor(&h, &state.path().join("campaign"));
    let found = again.find(&handles[9].attempt_id).await.unwrap().unwrap();
    assert_eq!(found.attempt_id, handles[9].attempt_id);
    assert_eq!(
        again.poll(&[found]).await.unwrap()[0].state,
        JobState::Completed
    );
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walltime_and_cancel_leave_no_process_on_any_host() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("cancel_ps", Duration::from_secs(180));
    let state = tempfile::tempdir().unwrap();
    let exec = executor(&h, state.path());
    let prefix = uniq("ps");
    // A job with children that ignore nothing, on every host, plus one hitting its walltime.
    let mut handles = Vec::new();
    for i in 0..4 {
        let s = spec(
            &format!("{prefix}{i}"),
            "sleep 300 & sh -c 'sleep 301' & sleep 302; wait",
            4,
        );
        handles.push(exec.submit(&s).await.unwrap());
    }
    let wall = spec(&format!("{prefix}w"), "sleep 303 & sleep 304", 0)
        .with_walltime(Duration::from_secs(2));
    let wh = exec.submit(&wall).await.unwrap();
    // All running, on all four hosts.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let st = exec.poll(&handles).await.unwrap();
        if st.iter().all(|s| s.state == JobState::Running) {
            let nodes: std::collections::BTreeSet<_> =
                st.iter().map(|s| s.nodes.clone().unwrap()).collect();
            assert_eq!(nodes.len(), 4, "{st:?}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before: usize = h.hosts[..4]
        .iter()
        .map(|x| ps_attempts(x, &prefix).len())
        .sum();
    assert!(
        before >= 4 * 4,
        "expected the jobs' processes in ps, saw {before}"
    );
    for hd in &handles {
        exec.cancel(hd).await.unwrap();
    }
    let st = exec.poll(&handles).await.unwrap();
    for s in &st {
        assert!(matches!(s.state, JobState::Cancelled { .. }), "{s:?}");
    }
    let ws = exec
        .wait_terminal(
            std::slice::from_ref(&wh),
            Duration::from_millis(100),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    assert_eq!(ws[0].state, JobState::Timeout, "{ws:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    for x in &h.hosts[..4] {
        let left = ps_attempts(x, &prefix);
        assert!(left.is_empty(), "processes left on {x}: {left:#?}");
    }
}

#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the SSH hosts of scripts/ssh-hosts.sh (openssh-server): set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_host_is_retried_then_node_fail() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("unreachable", Duration::from_secs(180));
    // A host of its own (stopping h1-h4 would disturb the other tests): h6.
    let state = tempfile::tempdir().unwrap();
    let host = h.hosts[5].clone();
    // Up, whatever an earlier run left (a host stopped alone stays down until started alone).
    ssh_hosts::ctl(&["start", &host]);
    let build = |lost: u64| {
        BareMetalExecutor::builder(state.path())
            .ssh_config(&h.config)
            .host(&host, 4)
            .lost_after(Duration::from_secs(lost))
            .backoff_max(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let exec = build(600);
    let a = exec
        .submit(&spec(&uniq("down-a"), "sleep 6", 1))
        .await
        .unwrap();
    until_running(&exec, &a).await;
    ssh_hosts::ctl(&["stop", &host]);
    // Failed probes: still running, the reason says the host is silent.
    for _ in 0..3 {
        let s = &exec.poll(std::slice::from_ref(&a)).await.unwrap()[0];
        assert_eq!(s.state, JobState::Running, "{s:?}");
        assert!(
            s.reason.as_deref().unwrap_or("").contains("unreachable"),
            "{s:?}"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    ssh_hosts::ctl(&["start", &host]);
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&a),
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::Completed, "{st:?}");
    // Gone for good: NODE_FAIL after lost_after, the lease freed.
    let exec = build(2);
    let b = exec
        .submit(&spec(&uniq("down-b"), "sleep 60", 1))
        .await
        .unwrap();
    ssh_hosts::ctl(&["stop", &host]);
    ssh_hosts::ctl(&["kill-tasks", &host]);
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&b),
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::NodeFail, "{st:?}");
    assert!(
        st[0]
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("unreachable"),
        "{st:?}"
    );
    // Its GPU stays leased while the host is silent (the task might still run there)...
    let live = |e: &BareMetalExecutor| {
        e.leases()
            .unwrap()
            .leases
            .iter()
            .filter(|l| l.is_live())
            .count()
    };
    assert_eq!(live(&exec), 1);
    // ...and is freed once the host answers and the task is confirmed gone.
    ssh_hosts::ctl(&["start", &host]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while live(&exec) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "lease of the lost task never freed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = exec.poll(std::slice::from_ref(&b)).await.unwrap();
        assert_eq!(s[0].state, JobState::NodeFail, "{s:?}");
    }
    // An outage without the kill: the task runs on; when the host is back it is killed there.
    let c = exec
        .submit(&spec(&uniq("down-c"), "sleep 60", 1))
        .await
        .unwrap();
    until_running(&exec, &c).await;
    ssh_hosts::ctl(&["stop", &host]);
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&c),
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::NodeFail, "{st:?}");
    assert!(
        !ps_attempts(&host, c.attempt_id.as_str()).is_empty(),
        "the task runs on through the outage"
    );
    ssh_hosts::ctl(&["start", &host]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while live(&exec) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "lease of the lost task never freed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        exec.poll(std::slice::from_ref(&c)).await.unwrap();
    }
    let left = ps_attempts(&host, c.attempt_id.as_str());
    assert!(
        left.is_empty(),
        "the lost task was not killed when its host came back: {left:?}"
    );
}

/// Polls until the task runs: a poll right after `submit` may still say `Pending` (the task's
/// start record is written by the host once `setsid` has started it, later on a loaded machine).
async fn until_running(exec: &BareMetalExecutor, h: &JobHandle) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = exec.poll(std::slice::from_ref(h)).await.unwrap();
        match s[0].state {
            JobState::Running => return,
            JobState::Pending => {}
            _ => panic!("expected the task to start: {s:?}"),
        }
        assert!(std::time::Instant::now() < deadline, "never started: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 27 (P07 c): a host whose key changed (a known_hosts line with another key, ssh's
/// `REMOTE HOST IDENTIFICATION HAS CHANGED` / `Host key verification failed.`, exit 255) is a
/// host configuration error naming the host and the fix, never retried as a connection
/// failure and never auto-accepted (the known_hosts file is left as it was).
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the sshd hosts of scripts/ssh-hosts.sh: set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_host_key_is_a_host_configuration_error_never_accepted() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("changed_host_key", Duration::from_secs(120));
    let state = tempfile::tempdir().unwrap();
    let key = state.path().join("other");
    let st = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(st.success());
    let other = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let kh = state.path().join("known_hosts");
    let line = format!(
        "[127.0.10.2]:2222 {}\n",
        other
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    );
    std::fs::write(&kh, &line).unwrap();
    let exec = BareMetalExecutor::builder(state.path().join("s"))
        .ssh_config(&h.config)
        .ssh_option(format!("UserKnownHostsFile={}", kh.display()))
        .host(&h.hosts[1], 4)
        .build()
        .unwrap();
    let e = exec.preflight().await.unwrap_err();
    let m = e.to_string();
    assert!(
        matches!(e, ExecutorError::HostKeyRefused { ref host, .. } if host == &h.hosts[1]),
        "{m}"
    );
    assert!(
        m.contains("changed or is unknown") && m.contains("never accepted automatically"),
        "{m}"
    );
    assert!(!e.is_retryable(), "{m}");
    // A submit meets it before anything is leased, as the host's own problem: a campaign
    // excludes the host (`refused_host_key`) and places the attempt on the others.
    let s = spec(&uniq("hk"), "true", 0);
    let e = exec.submit(&s).await.unwrap_err();
    assert_eq!(e.refused_host_key(), Some(h.hosts[1].as_str()), "{e}");
    assert!(exec.leases().unwrap().leases.is_empty());
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap(),
        line,
        "never auto-accepted"
    );
}

/// Issue 27 (P06): h7 of `scripts/ssh-hosts.sh` has `MaxSessions 2` and `MaxStartups 3:30:10`.
/// Sixteen tasks submitted at once there (no GPUs: the inventory's 4 do not limit them) all
/// complete with exit 0; sshd's refusals (`Session open refused`, `Exceeded MaxStartups`, kex
/// resets) are tried again, never a task failure, a node failure or a lost task.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the sshd hosts of scripts/ssh-hosts.sh: set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_at_once_on_the_sshd_limits_host_all_complete() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("sshd_limits_fanout", Duration::from_secs(240));
    assert!(
        h.hosts.iter().any(|x| x == "h7"),
        "scripts/ssh-hosts.sh starts h7 (the sshd-limits host): {:?}",
        h.hosts
    );
    let state = tempfile::tempdir().unwrap();
    let exec = BareMetalExecutor::builder(state.path())
        .ssh_config(&h.config)
        .host("h7", 4)
        .build()
        .unwrap();
    let prefix = uniq("fan");
    let t0 = std::time::Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let e = exec.clone();
        let s = spec(
            &format!("{prefix}{i:02}"),
            "echo \"task $PUZZLETRON_ATTEMPT_ID on $PUZZLETRON_FAKE_HOST\"; sleep 1",
            0,
        );
        set.spawn(async move { e.submit(&s).await });
    }
    let mut handles = Vec::new();
    while let Some(r) = set.join_next().await {
        handles.push(r.unwrap().expect("a submit under sshd limits succeeds"));
    }
    let submitted = t0.elapsed();
    handles.sort_by(|a, b| a.attempt_id.as_str().cmp(b.attempt_id.as_str()));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let st = loop {
        let st = exec.poll(&handles).await.unwrap();
        for s in &st {
            assert!(
                !matches!(s.state, JobState::NodeFail | JobState::Lost),
                "an sshd refusal taken for a node failure: {s:?}"
            );
            assert!(
                !s.state.is_terminal() || s.state == JobState::Completed,
                "{s:?}"
            );
        }
        if st.iter().all(|s| s.state.is_terminal()) {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "{st:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for s in &st {
        assert_eq!(
            (s.state.clone(), s.exit_code),
            (JobState::Completed, Some(0)),
            "{s:?}"
        );
        assert_eq!(s.nodes.as_deref(), Some("h7"), "{s:?}");
    }
    // Each ran exactly once, on h7 (its log, in the attempt folder on the host).
    for hd in &handles {
        let log = h
            .dir
            .join("h7/state")
            .join(hd.attempt_id.as_str())
            .join("output.log");
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, format!("task {} on h7\n", hd.attempt_id), "{log:?}");
    }
    println!(
        "h7 (MaxSessions 2, MaxStartups 3:30:10): 16 submits in {:.2} s, all done in {:.2} s; \
         {} ssh exchanges ({} of them launches), {} refused by sshd and tried again; channel \
         cap now {}",
        submitted.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        exec.ssh_exchanges(),
        exec.ssh_launch_exchanges(),
        exec.ssh_refusals(),
        exec.ssh_channel_cap("h7")
    );
    // P06: the 16 launches reached h7 together and went there in a few remote scripts (each
    // starting every attempt that arrived within the window or while the previous one ran),
    // not one exchange each.
    assert!(
        (1..=4).contains(&exec.ssh_launch_exchanges()),
        "16 concurrent submits took {} launch exchanges",
        exec.ssh_launch_exchanges()
    );
    assert!(exec.leases().unwrap().leases.iter().all(|l| l.released));
}

/// Issue 27 (P07 b): a task whose own exit code is 255 (what ssh uses for its own failures)
/// is `Failed` with exit 255, read from its exit file on the host, not an ssh failure: the
/// host is not taken for unreachable.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the sshd hosts of scripts/ssh-hosts.sh: set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_exiting_255_is_failed_255_not_an_ssh_failure() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("exit_255", Duration::from_secs(120));
    let state = tempfile::tempdir().unwrap();
    let exec = executor(&h, state.path());
    let a = exec
        .submit(&spec(
            &uniq("x255"),
            "echo about to exit 255 >&2; exit 255",
            0,
        ))
        .await
        .unwrap();
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&a),
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let s = &st[0];
    assert_eq!(
        (s.state.clone(), s.exit_code),
        (JobState::Failed, Some(255)),
        "{s:?}"
    );
    let reason = s.reason.as_deref().unwrap_or("");
    assert!(!reason.contains("unreachable"), "{s:?}");
    // The code came from the host's exit file.
    let host = s.nodes.clone().unwrap();
    let exit = std::fs::read_to_string(
        h.dir
            .join(&host)
            .join("state")
            .join(a.attempt_id.as_str())
            .join("exit"),
    )
    .unwrap();
    assert!(exit.lines().any(|l| l == "code=255"), "{exit}");
    // The host stays usable: a next task there completes.
    let b = exec
        .submit(&spec(&uniq("x255-next"), "true", 0))
        .await
        .unwrap();
    let st = exec
        .wait_terminal(
            std::slice::from_ref(&b),
            Duration::from_millis(100),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::Completed, "{st:?}");
}

/// The pid of the master behind control socket `sock` (`ssh -O check`), or ssh's stderr.
fn master_pid(h: &ssh_hosts::SshHosts, sock: &Path, host: &str) -> Result<u32, String> {
    let out = std::process::Command::new("ssh")
        .arg("-F")
        .arg(&h.config)
        .arg("-o")
        .arg(format!("ControlPath={}", sock.display()))
        .args(["-O", "check", host])
        .output()
        .expect("ssh -O check");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    err.split("pid=")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|p| p.parse().ok())
        .filter(|_| out.status.success())
        .ok_or(err)
}

/// An executor of one host (4 GPUs) with short kill and cancel deadlines.
fn one_host(h: &ssh_hosts::SshHosts, host: &str, state: &Path) -> BareMetalExecutor {
    BareMetalExecutor::builder(state)
        .ssh_config(&h.config)
        .host(host, 4)
        .kill_grace(Duration::from_secs(1))
        .cancel_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Issue 27 (P05): the executor's ControlMaster is killed with SIGKILL and its socket left
/// behind. The next submit and poll neither hang nor fail: they finish within seconds (the
/// figure is printed; < 10 s asserted), and multiplexing comes back (a new master behind the
/// same path), rather than every later call logging in afresh.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the sshd hosts of scripts/ssh-hosts.sh: set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_control_master_does_not_hang_or_fail_the_next_call() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("killed_master", Duration::from_secs(120));
    let host = h.hosts[2].clone();
    let state = tempfile::tempdir().unwrap();
    let exec = one_host(&h, &host, state.path());
    let a = exec
        .submit(&spec(&uniq("cm-a"), "sleep 60", 0))
        .await
        .unwrap();
    until_running(&exec, &a).await;
    // This executor's one socket, and the master behind it.
    let socks: Vec<_> = std::fs::read_dir(exec.ssh_control_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(socks.len(), 1, "{socks:?}");
    let sock = socks[0].clone();
    let pid = master_pid(&h, &sock, &host).expect("a master runs");
    let st = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let gone = std::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(std::time::Instant::now() < gone, "master {pid} still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    {
        use std::os::unix::fs::FileTypeExt;
        let ft = std::fs::symlink_metadata(&sock)
            .expect("the socket is left behind")
            .file_type();
        assert!(ft.is_socket(), "{sock:?}");
    }
    let stale = master_pid(&h, &sock, &host).unwrap_err();
    assert!(stale.contains("Connection refused"), "{stale}");
    // The next calls: a submit, then polls until it completed (and the first still runs).
    let t0 = std::time::Instant::now();
    let b = exec.submit(&spec(&uniq("cm-b"), "true", 0)).await.unwrap();
    let submit_s = t0.elapsed().as_secs_f64();
    loop {
        let st = exec.poll(&[a.clone(), b.clone()]).await.unwrap();
        assert_eq!(st[0].state, JobState::Running, "{st:?}");
        if st[1].state.is_terminal() {
            assert_eq!(st[1].state, JobState::Completed, "{st:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = t0.elapsed();
    println!(
        "after the killed master: submit {submit_s:.2} s, submit + polls to completion {:.2} s",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Multiplexing is back: a new master (another pid) behind the same path.
    let again = master_pid(&h, &sock, &host).expect("a new master");
    assert_ne!(again, pid);
    exec.cancel(&a).await.unwrap();
}

/// Issue 27 (P07 a): a launch detaches. Submitting a task that sleeps 60 s (and writes to
/// stdout and stderr) returns in < 2 s (the figure is printed), its pid record already on the
/// host; the task then runs, its output in its log.
#[cfg_attr(
    not(puzzletron_ssh_tests),
    ignore = "needs the sshd hosts of scripts/ssh-hosts.sh: set PUZZLETRON_SSH_TESTS=1 (CONTRIBUTING.md)"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_detaches_within_two_seconds() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("launch_detaches", Duration::from_secs(120));
    let host = h.hosts[3].clone();
    let state = tempfile::tempdir().unwrap();
    let exec = one_host(&h, &host, state.path());
    // The host's checks first, so the figure is the launch's.
    exec.preflight().await.unwrap();
    let t0 = std::time::Instant::now();
    let a = exec
        .submit(&spec(
            &uniq("detach"),
            "echo to stdout; echo to stderr >&2; sleep 60",
            0,
        ))
        .await
        .unwrap();
    let took = t0.elapsed();
    println!(
        "submit of a 60 s task returned in {:.3} s",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The pid record is there when submit returns.
    let dir = h.dir.join(&host).join("state").join(a.attempt_id.as_str());
    let job = std::fs::read_to_string(dir.join("job")).expect("the pid record before return");
    until_running(&exec, &a).await;
    let pid: u32 = job.split(' ').next().unwrap().parse().unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "{job}");
    exec.cancel(&a).await.unwrap();
    let log = std::fs::read_to_string(dir.join("output.log")).unwrap();
    assert!(
        log.contains("to stdout") && log.contains("to stderr"),
        "{log}"
    );
}
