//! LocalExecutor and the state of its process: the working folder it has at each launch, and
//! its fork server (found in `/proc` by name, as an operator would with `ps`).
//!
//! A `harness = false` test: it changes the process's working folder, which would race with
//! other tests running on threads of the same process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use puzzletron::executor::FORK_SERVER_ENV;
use puzzletron::executor::*;

fn id(s: &str) -> AttemptId {
    AttemptId::new(s).expect("valid id")
}

async fn run(e: &LocalExecutor, spec: AttemptSpec) -> (JobStatus, String) {
    let h = e.submit(&spec).await.expect("submit");
    let st = e
        .wait_terminal(&[h], Duration::from_millis(10), Duration::from_secs(60))
        .await
        .expect("poll")
        .remove(0);
    let log = std::fs::read_to_string(st.log_path.as_ref().expect("log path")).unwrap_or_default();
    (st, log)
}

/// Children of this process named `pzt-forkserver` (field 2 of `/proc/<pid>/stat`).
fn fork_servers() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let mut rest = stat[close + 2..].split(' ');
        let state = rest.next();
        let ppid = rest.next();
        if comm == "pzt-forkserver" && ppid == Some(me.as_str()) && state != Some("Z") {
            out.push(pid);
        }
    }
    out
}

async fn jobs_follow_the_working_folder_of_the_controller(root: &Path) {
    let e = LocalExecutor::builder(root.join("att"))
        .build()
        .expect("executor");
    let first = root.join("first");
    let later = root.join("later");
    for d in [&first, &later] {
        std::fs::create_dir_all(d.join("sub")).unwrap();
        let prog = d.join("prog.sh");
        std::fs::write(&prog, format!("#!/bin/sh\necho prog in {}\n", d.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::env::set_current_dir(&first).unwrap();
    let (st, log) = run(&e, AttemptSpec::new(id("pwd1"), CommandSpec::new("pwd"))).await;
    assert_eq!(st.state, JobState::Completed, "{st:?}");
    assert_eq!(log.trim(), first.display().to_string());

    // The executor (and its fork server) were made in `first`; the controller moves on.
    std::env::set_current_dir(&later).unwrap();
    let (st, log) = run(&e, AttemptSpec::new(id("pwd2"), CommandSpec::new("pwd"))).await;
    assert_eq!(st.state, JobState::Completed, "{st:?}");
    assert_eq!(
        log.trim(),
        later.display().to_string(),
        "no cwd: the controller's now"
    );
    let (_, log) = run(
        &e,
        AttemptSpec::new(id("pwd3"), CommandSpec::new("pwd").cwd("sub")),
    )
    .await;
    assert_eq!(
        log.trim(),
        later.join("sub").display().to_string(),
        "relative cwd"
    );
    let (st, log) = run(
        &e,
        AttemptSpec::new(id("prog"), CommandSpec::new("./prog.sh")),
    )
    .await;
    assert_eq!(st.state, JobState::Completed, "{st:?}");
    assert_eq!(
        log.trim(),
        format!("prog in {}", later.display()),
        "relative program"
    );
    std::env::set_current_dir(root).unwrap();
}

async fn a_job_outlives_a_killed_fork_server_and_the_next_one_still_runs(root: &Path) {
    if std::env::var_os(FORK_SERVER_ENV).is_some_and(|v| v == "0") {
        println!("  (fork server turned off: {FORK_SERVER_ENV}=0)");
        return;
    }
    let e = LocalExecutor::builder(root.join("att2"))
        .build()
        .expect("executor");
    let servers = fork_servers();
    assert_eq!(servers.len(), 1, "one fork server per process: {servers:?}");
    // The job runs until the test opens its gate: it is running when the server is killed and
    // ends after, however slow the machine (it used to `sleep 1` and the test waited at most
    // 5 s for it to start, then killed the server anyway: at load 9 the launch was not done).
    let marker = root.join("slow.done");
    let gate = root.join("slow.gate");
    let spec = AttemptSpec::new(
        id("slow"),
        CommandSpec::shell_script(format!(
            "while [ ! -e '{}' ]; do sleep 0.05; done; echo done > '{}'",
            gate.display(),
            marker.display()
        )),
    );
    let h = e.submit(&spec).await.expect("submit");
    // Started (its wrapper forked by the server), then the server is killed. No deadline of
    // its own: the watchdog ends a hang.
    while e.poll(std::slice::from_ref(&h)).await.unwrap()[0].state != JobState::Running {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // SAFETY: a plain signal to our own child.
    assert_eq!(unsafe { libc::kill(servers[0], libc::SIGKILL) }, 0);
    std::fs::write(&gate, b"").unwrap();
    let st = e
        .wait_terminal(&[h], Duration::from_millis(10), Duration::from_secs(60))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(st.state, JobState::Completed, "{st:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "done\n");
    let (st, log) = run(
        &e,
        AttemptSpec::new(id("after"), CommandSpec::new("echo").arg("after")),
    )
    .await;
    assert_eq!(st.state, JobState::Completed, "{st:?}");
    assert_eq!(log, "after\n");
    let now = fork_servers();
    assert_eq!(now.len(), 1, "the dead server is replaced: {now:?}");
    assert_ne!(now[0], servers[0]);
}

mod support;
use support::watchdog;

fn main() {
    let _watchdog = watchdog::Watchdog::start("executor_local_process", Duration::from_secs(600));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(tmp.path()).unwrap();
    let start = std::time::Instant::now();
    rt.block_on(jobs_follow_the_working_folder_of_the_controller(&root));
    println!("ok - jobs_follow_the_working_folder_of_the_controller");
    rt.block_on(a_job_outlives_a_killed_fork_server_and_the_next_one_still_runs(&root));
    println!("ok - a_job_outlives_a_killed_fork_server_and_the_next_one_still_runs");
    println!("all passed in {:.1} s", start.elapsed().as_secs_f64());
}
