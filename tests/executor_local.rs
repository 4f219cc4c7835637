//! LocalExecutor against real processes: GPU slots, signals, walltime, detach and restart.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use puzzletron::executor::*;

fn id(s: &str) -> AttemptId {
    AttemptId::new(s).expect("valid id")
}

fn exec(root: &Path) -> LocalExecutorBuilder {
    LocalExecutor::builder(root).kill_grace(Duration::from_secs(1))
}

async fn wait(e: &dyn Executor, hs: &[JobHandle]) -> Vec<JobStatus> {
    let st = e
        .wait_terminal(hs, Duration::from_millis(20), Duration::from_secs(60))
        .await
        .expect("poll");
    for s in &st {
        assert!(s.state.is_terminal(), "not finished: {s:?}");
    }
    st
}

/// Waits for `p` (a deadline far beyond any load, not a measure of speed).
async fn wait_for_file(p: &Path) {
    let t = std::time::Instant::now();
    while !p.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{} never appeared",
            p.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn sh(script: &str) -> CommandSpec {
    // The scripts are test code, not data: shell is the right tool here.
    CommandSpec::shell_script(script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_jobs_on_four_gpus_never_share_a_gpu() {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path())
        .max_concurrent(8)
        .gpu_ids(["0", "1", "2", "3"])
        .build()
        .unwrap();
    // 1,1,2,1,2,1,1,1 GPUs: 10 GPU-jobs on 4 ids, so some must wait for others.
    let needs = [1u32, 1, 2, 1, 2, 1, 1, 1];
    let mut hs = Vec::new();
    for (i, n) in needs.iter().enumerate() {
        let spec = AttemptSpec::new(
            id(&format!("gpu{i}")),
            sh(r#"s=$(date +%s%N); sleep 0.4; echo "$CUDA_VISIBLE_DEVICES $s $(date +%s%N)" > "$PUZZLETRON_ATTEMPT_DIR/seen""#),
        )
        .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(*n)));
        hs.push(e.submit(&spec).await.unwrap());
    }
    let st = wait(&e, &hs).await;
    let mut seen = Vec::new();
    for (i, s) in st.iter().enumerate() {
        assert_eq!(s.state, JobState::Completed, "{s:?}");
        let text = std::fs::read_to_string(e.attempt_dir(&hs[i].attempt_id).join("seen")).unwrap();
        let parts: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(parts.len(), 3, "job {i} saw {text:?}");
        let gpus: BTreeSet<String> = parts[0].split(',').map(String::from).collect();
        assert_eq!(gpus.len(), needs[i] as usize, "job {i} saw {text:?}");
        for g in &gpus {
            assert!(
                ["0", "1", "2", "3"].contains(&g.as_str()),
                "job {i}: id {g}"
            );
        }
        let (a, b): (u128, u128) = (parts[1].parse().unwrap(), parts[2].parse().unwrap());
        seen.push((gpus, a, b));
    }
    let mut overlapping_pairs = 0;
    for i in 0..seen.len() {
        for j in i + 1..seen.len() {
            let (gi, ai, bi) = &seen[i];
            let (gj, aj, bj) = &seen[j];
            if ai < bj && aj < bi {
                overlapping_pairs += 1;
                assert!(
                    gi.is_disjoint(gj),
                    "jobs {i} and {j} ran at the same time on GPUs {gi:?} and {gj:?}"
                );
            }
        }
    }
    // The jobs really ran in parallel (else the check above would prove nothing).
    assert!(
        overlapping_pairs >= 3,
        "only {overlapping_pairs} overlapping pairs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_job_is_killed_9_and_exit_137_is_not() {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).build().unwrap();
    let h = e
        .submit(&AttemptSpec::new(
            id("victim"),
            CommandSpec::new("sleep").arg("30"),
        ))
        .await
        .unwrap();
    let job_file = e.attempt_dir(&h.attempt_id).join("job");
    wait_for_file(&job_file).await;
    let pid: i32 = std::fs::read_to_string(&job_file)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let self_137 = e
        .submit(&AttemptSpec::new(id("exit137"), sh("exit 137")))
        .await
        .unwrap();
    let st = wait(&e, &[h, self_137]).await;
    assert_eq!(st[0].state, JobState::Killed { signal: 9 }, "{:?}", st[0]);
    assert_eq!((st[0].exit_code, st[0].signal), (Some(137), Some(9)));
    assert_eq!(st[1].state, JobState::Failed, "{:?}", st[1]);
    assert_eq!((st[1].exit_code, st[1].signal), (Some(137), None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walltime_is_enforced_even_when_sigterm_is_ignored() {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).build().unwrap();
    let polite = AttemptSpec::new(id("polite"), CommandSpec::new("sleep").arg("30"))
        .with_walltime(Duration::from_millis(300));
    let stubborn = AttemptSpec::new(id("stubborn"), sh("trap '' TERM; sleep 30"))
        .with_walltime(Duration::from_millis(300));
    let t0 = std::time::Instant::now();
    let hs = vec![
        e.submit(&polite).await.unwrap(),
        e.submit(&stubborn).await.unwrap(),
    ];
    let st = wait(&e, &hs).await;
    assert_eq!(st[0].state, JobState::Timeout, "{:?}", st[0]);
    assert_eq!(st[0].signal, Some(libc::SIGTERM));
    assert_eq!(st[1].state, JobState::Timeout, "{:?}", st[1]);
    assert_eq!(st[1].signal, Some(libc::SIGKILL));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argv_env_cwd_log_and_launch_failures() {
    let root = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let e = exec(root.path()).gpu_ids(["7"]).build().unwrap();
    // An argument that a shell would expand or split is passed verbatim.
    let tricky = "$HOME; echo pwned `id` *";
    let echo = AttemptSpec::new(
        id("echo"),
        CommandSpec::new("sh")
            .args(["-c", r#"printf '%s|%s|%s|%s|%s\n' "$1" "$FOO" "$CUDA_VISIBLE_DEVICES" "$PUZZLETRON_ATTEMPT_ID" "$(pwd)""#, "argv0", tricky])
            .env("FOO", "bar baz")
            .cwd(work.path()),
    );
    let missing = AttemptSpec::new(id("missing"), CommandSpec::new("no-such-program-xyz"));
    let bad_cwd = AttemptSpec::new(
        id("badcwd"),
        CommandSpec::new("true").cwd("/nonexistent/dir"),
    );
    let hs = vec![
        e.submit(&echo).await.unwrap(),
        e.submit(&missing).await.unwrap(),
        e.submit(&bad_cwd).await.unwrap(),
    ];
    let st = wait(&e, &hs).await;
    assert_eq!(st[0].state, JobState::Completed, "{:?}", st[0]);
    let log = std::fs::read_to_string(st[0].log_path.as_ref().unwrap()).unwrap();
    let cwd = std::fs::canonicalize(work.path()).unwrap();
    assert_eq!(log, format!("{tricky}|bar baz||echo|{}\n", cwd.display()));
    for s in &st[1..] {
        assert_eq!(s.state, JobState::LaunchFailed, "{s:?}");
        assert_eq!(s.exit_code, Some(127));
        assert!(
            s.reason.as_deref().unwrap_or("").contains("No such file"),
            "{s:?}"
        );
    }
    // Asking for more GPUs or nodes than exist is an immediate, permanent error.
    let big = AttemptSpec::new(id("big"), CommandSpec::new("true"))
        .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(2)));
    let err = e.submit(&big).await.unwrap_err();
    assert!(matches!(err, ExecutorError::Unsatisfiable { .. }) && !err.is_retryable());
    assert!(
        err.to_string().contains("2 GPUs") && err.to_string().contains("ids 7"),
        "{err}"
    );
    let multi = AttemptSpec::new(id("multi"), CommandSpec::new("true"))
        .with_topology(TaskTopology::new(2, 1));
    assert!(matches!(
        e.submit(&multi).await.unwrap_err(),
        ExecutorError::Unsatisfiable { .. }
    ));
    // Same attempt id twice: refused, the job does not run twice.
    let dup = e.submit(&echo).await.unwrap_err();
    assert!(
        matches!(dup, ExecutorError::DuplicateAttempt { .. }),
        "{dup:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_starts_in_its_own_group_with_no_signal_ignored_or_blocked() {
    // The wrapper ignores SIGPIPE for itself; an ignored signal stays ignored across execve, so
    // the job must get the default back (a `yes | head` pipeline relies on it).
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).build().unwrap();
    let h = e
        .submit(&AttemptSpec::new(
            id("signals"),
            sh(r#"set -- $(cat /proc/$$/stat); echo "pid=$1 pgrp=$5"; grep -E '^Sig(Ign|Blk):' /proc/self/status"#),
        ))
        .await
        .unwrap();
    let st = wait(&e, &[h]).await;
    assert_eq!(st[0].state, JobState::Completed, "{:?}", st[0]);
    let log = std::fs::read_to_string(st[0].log_path.as_ref().unwrap()).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    let ids: Vec<&str> = lines[0].split(' ').collect();
    assert_eq!(
        ids[0].strip_prefix("pid="),
        ids[1].strip_prefix("pgrp="),
        "{log}"
    );
    assert_eq!(
        lines[1..],
        ["SigBlk:\t0000000000000000", "SigIgn:\t0000000000000000"],
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_job_never_runs_it() {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).max_concurrent(1).build().unwrap();
    let blocker = e
        .submit(&AttemptSpec::new(
            id("blocker"),
            CommandSpec::new("sleep").arg("30"),
        ))
        .await
        .unwrap();
    let queued = e
        .submit(&AttemptSpec::new(
            id("queued"),
            sh("echo ran > \"$PUZZLETRON_ATTEMPT_DIR/ran\""),
        ))
        .await
        .unwrap();
    let st = e.poll(std::slice::from_ref(&queued)).await.unwrap();
    assert_eq!(st[0].state, JobState::Pending);
    assert!(
        st[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("concurrency limit"),
        "{:?}",
        st[0]
    );
    e.cancel(&queued).await.unwrap();
    e.cancel(&blocker).await.unwrap();
    let st = wait(&e, &[blocker, queued.clone()]).await;
    assert_eq!(st[0].state, JobState::Cancelled { by_uid: None });
    assert_eq!(st[1].state, JobState::Cancelled { by_uid: None });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!e.attempt_dir(&queued.attempt_id).join("ran").exists());
}

const CHILD_ENV: &str = "PUZZLETRON_TEST_DETACH_ROOT";

/// Not a test on its own: the controller process of `restarted_controller_picks_up_results`,
/// which runs this test binary again with `CHILD_ENV` set and kills it with SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detach_child_controller() {
    let Ok(root) = std::env::var(CHILD_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let e = exec(&root.join("attempts"))
        .max_concurrent(2)
        .build()
        .unwrap();
    let mut hs = Vec::new();
    for i in 0..4 {
        let spec = AttemptSpec::new(
            id(&format!("job{i}")),
            sh(
                "echo run >> \"$PUZZLETRON_ATTEMPT_DIR/runs\"; sleep 1.5; echo result > \"$PUZZLETRON_ATTEMPT_DIR/result\"",
            ),
        );
        hs.push(e.submit(&spec).await.unwrap());
    }
    std::fs::write(root.join("handles.json"), serde_json::to_vec(&hs).unwrap()).unwrap();
    // Wait to be killed.
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("the parent test should have killed this controller");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_controller_picks_up_results_without_rerunning() {
    let root = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "detach_child_controller", "--nocapture"])
        .env(CHILD_ENV, root.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let handles_file = root.path().join("handles.json");
    wait_for_file(&handles_file).await;
    // Two jobs run, two are queued in the controller's memory: kill -9 the controller.
    tokio::time::sleep(Duration::from_millis(200)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let hs: Vec<JobHandle> =
        serde_json::from_slice(&std::fs::read(&handles_file).unwrap()).unwrap();
    let e = exec(&root.path().join("attempts"))
        .max_concurrent(2)
        .build()
        .unwrap();
    let st = e.poll(&hs).await.unwrap();
    let running = st.iter().filter(|s| s.state == JobState::Running).count();
    let pending = st.iter().filter(|s| s.state == JobState::Pending).count();
    assert_eq!((running, pending), (2, 2), "{st:?}");
    // The running ones end on their own (nobody waits for their wrapper); the queued ones
    // are adopted and started by this controller.
    let st = wait(&e, &hs).await;
    for (h, s) in hs.iter().zip(&st) {
        assert_eq!(s.state, JobState::Completed, "{s:?}");
        let dir = e.attempt_dir(&h.attempt_id);
        assert_eq!(
            std::fs::read_to_string(dir.join("runs")).unwrap(),
            "run\n",
            "{} ran more than once",
            h.attempt_id
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("result")).unwrap(),
            "result\n"
        );
        assert_eq!(e.find(&h.attempt_id).await.unwrap().as_ref(), Some(h));
    }
    // A third controller sees the same final states straight from the folders.
    let e3 = exec(&root.path().join("attempts")).build().unwrap();
    let st3 = e3.poll(&hs).await.unwrap();
    assert!(
        st3.iter().all(|s| s.state == JobState::Completed),
        "{st3:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_wrapper_is_reported_not_hidden() {
    // The wrapper is killed while its job runs: a fresh controller sees the job Running (pid
    // and start time still match), then Lost once it ends, since nobody recorded the exit.
    // The job runs until the test opens its gate, not for a fixed time that a loaded machine
    // can use up before the test looks.
    let root = tempfile::tempdir().unwrap();
    let gate = root.path().join("orphan.gate");
    let e = exec(root.path()).build().unwrap();
    let h = e
        .submit(&AttemptSpec::new(
            id("orphan"),
            sh(&format!(
                "while [ ! -e '{}' ]; do sleep 0.05; done",
                gate.display()
            )),
        ))
        .await
        .unwrap();
    let dir = e.attempt_dir(&h.attempt_id);
    wait_for_file(&dir.join("job")).await;
    let wrapper: i32 = std::fs::read_to_string(dir.join("wrapper"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(unsafe { libc::kill(wrapper, libc::SIGKILL) }, 0);
    let fresh = exec(root.path()).build().unwrap();
    let mut s = fresh
        .poll(std::slice::from_ref(&h))
        .await
        .unwrap()
        .remove(0);
    let t = std::time::Instant::now();
    // The killed wrapper may still look alive for a while (a zombie until reaped, longer on a
    // loaded machine): wait for the evidence, with a deadline far beyond any load.
    while s.reason.is_none() && t.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        s = fresh
            .poll(std::slice::from_ref(&h))
            .await
            .unwrap()
            .remove(0);
    }
    assert_eq!(s.state, JobState::Running, "{s:?}");
    assert!(
        s.reason.as_deref().unwrap().contains("wrapper gone"),
        "{s:?}"
    );
    std::fs::write(&gate, b"").unwrap();
    let st = wait(&fresh, &[h]).await;
    assert_eq!(st[0].state, JobState::Lost, "{:?}", st[0]);
    assert!(
        st[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("without recording"),
        "{:?}",
        st[0]
    );
}

/// A controller that runs one job at a time, busy for 30 s, with `queued` (which appends to
/// `runs` in its folder) waiting behind; `queued`'s launch claim is then set to `launching`,
/// as a controller that died while launching it would have left it.
async fn queued_behind_busy(
    launching: &str,
) -> (
    tempfile::TempDir,
    LocalExecutor,
    JobHandle,
    JobHandle,
    PathBuf,
) {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).max_concurrent(1).build().unwrap();
    let busy = e
        .submit(&AttemptSpec::new(id("busy"), sh("sleep 30")))
        .await
        .unwrap();
    let queued = e
        .submit(&AttemptSpec::new(
            id("queued"),
            sh("echo run >> \"$PUZZLETRON_ATTEMPT_DIR/runs\""),
        ))
        .await
        .unwrap();
    let dir = e.attempt_dir(&queued.attempt_id);
    std::fs::write(dir.join("launching"), launching).unwrap();
    (root, e, busy, queued, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_claim_caught_before_its_time_is_written_is_launching_not_lost() {
    // A controller that dies (or is read) between creating `launching` and writing the time
    // leaves it empty: its age comes from the file, so it is "launching" for the grace, then
    // Lost, never Lost at once.
    let (root, e, busy, queued, _dir) = queued_behind_busy("").await;
    let fresh = exec(root.path()).build().unwrap();
    let s = fresh
        .poll(std::slice::from_ref(&queued))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(s.state, JobState::Pending, "{s:?}");
    assert_eq!(s.reason.as_deref(), Some("launching"), "{s:?}");
    e.cancel(&busy).await.unwrap();
}

/// The pid and start ticks of a process that has exited (the claimer of an abandoned launch).
fn dead_process() -> (u32, u64) {
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    (pid, 12345)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_abandoned_by_a_dead_controller_runs_once_not_lost() {
    // The controller died between claiming the launch and starting the wrapper: the job never
    // ran, so a fresh controller launches it (it used to be Lost after 30 s, and a strict
    // campaign failed on it).
    let (pid, ticks) = dead_process();
    let (root, e, busy, queued, dir) = queued_behind_busy(&format!("1 {pid} {ticks}\n")).await;
    let fresh = exec(root.path()).build().unwrap();
    let s = fresh
        .poll(std::slice::from_ref(&queued))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(s.state, JobState::Pending, "{s:?}");
    let st = wait(&fresh, std::slice::from_ref(&queued)).await;
    assert_eq!(st[0].state, JobState::Completed, "{:?}", st[0]);
    assert_eq!(st[0].exit_code, Some(0), "{:?}", st[0]);
    // The first controller, still alive, reaches the job once `busy` ends: it must not run
    // it again.
    e.cancel(&busy).await.unwrap();
    let st = wait(&e, &[busy, queued]).await;
    assert_eq!(st[1].state, JobState::Completed, "{:?}", st[1]);
    assert_eq!(std::fs::read_to_string(dir.join("runs")).unwrap(), "run\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_an_abandoned_launch_never_runs_it() {
    let (pid, ticks) = dead_process();
    let (root, e, busy, queued, dir) = queued_behind_busy(&format!("1 {pid} {ticks}\n")).await;
    let fresh = exec(root.path()).build().unwrap();
    fresh.cancel(&queued).await.unwrap();
    let st = wait(&fresh, std::slice::from_ref(&queued)).await;
    assert!(
        matches!(st[0].state, JobState::Cancelled { .. }),
        "{:?}",
        st[0]
    );
    e.cancel(&busy).await.unwrap();
    let st = wait(&e, &[busy, queued]).await;
    assert!(
        matches!(st[1].state, JobState::Cancelled { .. }),
        "{:?}",
        st[1]
    );
    assert!(!dir.join("runs").exists(), "a cancelled job ran");
}

#[test]
fn builder_refuses_empty_and_duplicate_gpu_ids_naming_the_field() {
    let root = tempfile::tempdir().unwrap();
    // A duplicate id would hand the same GPU to two jobs at once.
    let err = exec(root.path())
        .gpu_ids(["0", "1", "0"])
        .build()
        .unwrap_err();
    match &err {
        ExecutorError::InvalidSpec {
            field,
            value,
            expected,
            ..
        } => {
            assert_eq!(field, "local.gpu_ids[2]");
            assert_eq!(value, "0");
            assert!(expected.contains("distinct"), "{expected}");
            assert!(expected.contains("local.gpu_ids[0]"), "{expected}");
        }
        e => panic!("expected InvalidSpec, got {e:?}"),
    }
    assert!(!err.is_retryable());
    let err = exec(root.path()).gpu_ids(["0", ""]).build().unwrap_err();
    assert!(err.to_string().contains("local.gpu_ids[1] = \"\""), "{err}");
    // Distinct ids (indices or UUIDs) are fine.
    let e = exec(root.path())
        .gpu_ids(["0", "1", "GPU-8f6f"])
        .build()
        .unwrap();
    drop(e);
}

/// The memory cgroup this process is in, as a folder we may create children in: v1
/// `memory/<path>` or v2 `<path>` under /sys/fs/cgroup.
fn own_memory_cgroup() -> Option<(PathBuf, bool)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    for line in text.lines() {
        let mut p = line.splitn(3, ':');
        let (id, ctrl, path) = (p.next()?, p.next()?, p.next()?);
        if ctrl.split(',').any(|c| c == "memory") {
            return Some((root.join("memory").join(path.trim_start_matches('/')), true));
        }
        if id == "0" && ctrl.is_empty() {
            let d = root.join(path.trim_start_matches('/'));
            if d.join("memory.events").exists() {
                return Some((d, false));
            }
        }
    }
    None
}

const OOM_CHILD_ENV: &str = "PUZZLETRON_TEST_OOM_CGROUP";

/// N09 on real processes. The parent half: a job killed by `kill -9` while the counters stay
/// still is `Killed { 9 }`, not an OOM. Then it creates a memory cgroup with a 128 MiB limit and
/// runs this same test in a child process inside it (the child half): there a job that writes
/// 400 MiB is killed by the kernel, and the local executor must report `OUT_OF_MEMORY` from
/// the cgroup's `oom_kill` counter, naming the counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n09_oom_kill_is_told_from_kill_9_by_the_cgroup_counter() {
    let root = tempfile::tempdir().unwrap();
    let hog = AttemptSpec::new(
        id("hog"),
        CommandSpec::new("python3")
            .arg("-c")
            .arg("b = b'x' * (400 << 20); print(len(b))"),
    );
    if let Ok(cg) = std::env::var(OOM_CHILD_ENV) {
        // Child half: move this whole process into the limited cgroup, then launch the hog.
        std::fs::write(
            Path::new(&cg).join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .expect("join the test cgroup");
        let e = exec(root.path()).build().unwrap();
        let h = e.submit(&hog).await.unwrap();
        let s = wait(&e, &[h]).await.remove(0);
        println!(
            "N09-CHILD {}|{}",
            s.state,
            s.reason.clone().unwrap_or_default()
        );
        assert_eq!(s.state, JobState::OutOfMemory, "{s:?}");
        return;
    }
    // Parent half, 1: SIGKILL without an OOM.
    let e = exec(root.path()).build().unwrap();
    let h = e
        .submit(&AttemptSpec::new(id("k9"), sh("kill -9 $$")))
        .await
        .unwrap();
    let s = wait(&e, &[h]).await.remove(0);
    assert_eq!(s.state, JobState::Killed { signal: 9 }, "{s:?}");
    // This process's memory-cgroup counter file, as the executor finds it (cgroups(7)): v2
    // `memory.events`, else v1 `memory.oom_control`.
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let counters = cgroup.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (id, ctrl, rel) = (f.next()?, f.next()?, f.next()?.trim_start_matches('/'));
        let root = Path::new("/sys/fs/cgroup");
        let file = if id == "0" && ctrl.is_empty() {
            root.join(rel).join("memory.events")
        } else if ctrl.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.oom_control")
        } else {
            return None;
        };
        file.is_file().then_some(file)
    });
    if counters.is_some() {
        assert!(
            !s.reason.clone().unwrap_or_default().contains("OOM unknown"),
            "the counter is readable here: {s:?}"
        );
    } else {
        assert!(
            s.reason.clone().unwrap_or_default().contains("OOM unknown"),
            "{s:?}"
        );
    }
    // Parent half, 2: the hog in a 128 MiB cgroup, in a child process.
    let (base, v1) = own_memory_cgroup().expect(
        "no memory cgroup (v1 `memory` controller or v2 memory.events) for this process: the OOM test needs one",
    );
    let cg = base.join(format!("puzzletron-oom-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap_or_else(|e| {
        panic!(
            "cannot create the test memory cgroup {} (run as root): {e}",
            cg.display()
        )
    });
    let limit = (128u64 << 20).to_string();
    if v1 {
        std::fs::write(cg.join("memory.limit_in_bytes"), &limit).unwrap();
        // Without swap accounting the limit alone holds; with it, cap swap too.
        let _ = std::fs::write(cg.join("memory.memsw.limit_in_bytes"), &limit);
    } else {
        std::fs::write(cg.join("memory.max"), &limit).unwrap();
        let _ = std::fs::write(cg.join("memory.swap.max"), "0");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "n09_oom_kill_is_told_from_kill_9_by_the_cgroup_counter",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(OOM_CHILD_ENV, &cg)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&cg);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child half failed: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find_map(|l| l.split_once("N09-CHILD ").map(|(_, r)| r))
        .expect("the child half ran and reported");
    assert!(
        line.starts_with("OUT_OF_MEMORY|killed by the OOM killer: oom_kill of /sys/fs/cgroup/"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_change_wakes_when_a_job_ends_not_at_the_deadline() {
    let root = tempfile::tempdir().unwrap();
    let e = exec(root.path()).max_concurrent(1).build().unwrap();
    let seen = e.changes();
    let h = e
        .submit(&AttemptSpec::new(id("short"), sh("sleep 0.3")))
        .await
        .unwrap();
    let t = std::time::Instant::now();
    // Nothing ended yet: waits, and returns once the job ends, long before the 30 s cap.
    e.wait_change(seen, Duration::from_secs(30)).await;
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(10), "woke after {waited:?}");
    assert!(
        waited >= Duration::from_millis(200),
        "woke early: {waited:?}"
    );
    assert_eq!(e.changes(), seen + 1);
    // The end is in the state a poll right after the wake-up reads.
    let st = e.poll(std::slice::from_ref(&h)).await.unwrap();
    assert_eq!(st[0].state, JobState::Completed);
    // A count already passed returns at once; with no job running it waits out the cap.
    let t = std::time::Instant::now();
    e.wait_change(seen, Duration::from_secs(30)).await;
    assert!(t.elapsed() < Duration::from_secs(1));
    let t = std::time::Instant::now();
    e.wait_change(e.changes(), Duration::from_millis(100)).await;
    assert!(t.elapsed() >= Duration::from_millis(100));
}
