//! Cancelling a drain of in-process runs: a dropped `drain_async` future (`tokio::time::timeout`),
//! the sweep's `CancellationToken`, a real SIGINT to a process in a blocking `drain()`. A job
//! told of the cancel is recorded as interrupted (never failed) and runs again at the next
//! drain; a job that never hears of it keeps its result. Isolated workers: `sweep_isolated.rs`.
//!
//! The SIGINT test re-executes this test binary: `child_entry_point` does the child's work when
//! `PT_CANCEL_CHILD` is set (and nothing otherwise).

mod support;
use support::watchdog;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use puzzletron::{Action, CancellationToken, FailureCause, JobResult, Outcome, Run};
use puzzletron::{Orchestrator, job, store::FsStore, store::Store};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct P {
    x: u32,
    /// Whether the job logs (and so hears of a cancel) while it waits for its gate.
    logs: bool,
}

/// Marks its start (`started-X` in the store's folder), then waits for the gate file
/// (`gate` there); when `logs`, it logs a row every 10 ms meanwhile and its result after.
fn gated(p: &P, run: &mut Run) -> JobResult {
    let root = store_root(run);
    std::fs::write(root.join(format!("started-{}", p.x)), b"")?;
    let mut step = 0;
    while !root.join("gate").exists() {
        if p.logs {
            run.log("wait", step, 0.0)?;
            step += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if p.logs {
        run.log("y", 0, f64::from(p.x))?;
    }
    Ok(())
}

/// The store's folder, from the run's artifact folder `ROOT/jobs/KEY/artifacts`.
fn store_root(run: &Run) -> PathBuf {
    run.artifact_dir()
        .and_then(|d| d.ancestors().nth(3))
        .expect("an FsStore run has an artifact folder")
        .to_path_buf()
}

fn sweep(root: &Path, token: Option<CancellationToken>, xs: &[(u32, bool)]) -> Orchestrator {
    let mut b = Orchestrator::builder().store_root(root);
    if let Some(t) = token {
        b = b.cancellation_token(t);
    }
    let mut o = b.build().unwrap();
    for &(x, logs) in xs {
        o.run(&job!(gated), P { x, logs }).unwrap();
    }
    o
}

/// Waits (no deadline of its own: the watchdog ends a hang) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The run of `x` is recorded as interrupted: its record says running, nobody holds it, and a
/// new sweep decides to run it again because it was interrupted, not because it failed.
fn assert_interrupted(root: &Path, xs: &[(u32, bool)], x: u32) {
    let o = sweep(root, None, xs);
    let i = xs.iter().position(|&(y, _)| y == x).unwrap();
    let p = &o.queued()[i];
    let store = FsStore::open(root).unwrap();
    let rec = store.record(&p.key).unwrap().expect("a record");
    assert_eq!(
        rec.status,
        puzzletron::store::Status::Running,
        "an interrupted run keeps its running record, never a failed one"
    );
    assert!(rec.error.is_none(), "no failure recorded: {:?}", rec.error);
    let d = o.decide(p).unwrap();
    assert_eq!(d.action, Action::Run, "{d}");
    assert!(
        d.reasons[0].starts_with("interrupted: attempt 1 by "),
        "the reason says interrupted: {d}"
    );
}

fn open_gate(root: &Path) {
    std::fs::write(root.join("gate"), b"").unwrap();
}

#[test]
fn drain_async_is_send_and_spawnable() {
    fn send<T: Send>(t: T) -> T {
        t
    }
    let dir = tempfile::tempdir().unwrap();
    let mut o = sweep(dir.path(), None, &[(1, false), (2, true)]);
    open_gate(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (o, summary) = rt.block_on(async move {
        tokio::spawn(send(async move {
            let s = o.drain_async().await;
            (o, s)
        }))
        .await
        .unwrap()
    });
    assert_eq!(summary.unwrap().ran(), 2);
    assert_eq!(o.recorded("y").unwrap().values(), [2.0]);
}

/// `tokio::time::timeout` around `drain_async` ends it: the job running in process hears of
/// it at its next `log`, and is recorded as interrupted; the next run never starts. Before,
/// the timeout returned only when the job ended by itself (the drain blocked the runtime).
#[test]
fn a_timeout_cancels_an_in_process_job_which_is_recorded_interrupted() {
    let _w = watchdog::Watchdog::start("timeout cancels", Duration::from_secs(180));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let xs = [(1, true), (2, true)];
    let mut o = sweep(root, None, &xs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let drain = o.drain_async();
        tokio::pin!(drain);
        // Let the first job start; it then waits for a gate that never opens.
        tokio::select! {
            r = &mut drain => panic!("the drain ended by itself: {r:?}"),
            _ = async {
                while !root.join("started-1").exists() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            } => {}
        }
        let r = tokio::time::timeout(Duration::from_millis(100), drain).await;
        assert!(
            r.is_err(),
            "a job that waits forever cannot finish the drain"
        );
    });
    // The drain's thread ends once the job returns from its cancelled `log`.
    let store = FsStore::open(root).unwrap();
    let key = o.queued()[0].key;
    wait_for("the interrupted run's claim is released", || {
        store.claim_info(&key).unwrap().is_none_or(|c| !c.live)
            && store.record(&key).unwrap().is_some()
    });
    assert_interrupted(root, &xs, 1);
    assert!(
        !root.join("started-2").exists(),
        "no run starts after the cancel"
    );
    // The sweep itself is intact: its queue still holds both runs, and they run now.
    assert_eq!(o.queued().len(), 2);
    open_gate(root);
    let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(s.ran(), 2, "{}", s.report());
    assert_eq!(o.recorded("y").unwrap().values(), [1.0, 2.0]);
}

/// The sweep's token cancels a blocking drain from another thread: the drain returns
/// `FailureCause::Cancelled` with the running run interrupted and the rest pending (queued
/// for the next drain).
#[test]
fn a_cancellation_token_stops_a_blocking_drain() {
    let _w = watchdog::Watchdog::start("token cancels", Duration::from_secs(180));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let xs = [(1, true), (2, true), (3, true)];
    let token = CancellationToken::new();
    let mut o = sweep(&root, Some(token.child_token()), &xs);
    let canceller = {
        let root = root.clone();
        std::thread::spawn(move || {
            wait_for("job 1 starts", || root.join("started-1").exists());
            token.cancel();
        })
    };
    let failed = o.drain().expect_err("a cancelled drain is not a success");
    canceller.join().unwrap();
    assert!(matches!(failed.cause, FailureCause::Cancelled), "{failed}");
    assert!(failed.is_retryable());
    let outcomes: Vec<&Outcome> = failed.summary.jobs.iter().map(|j| &j.outcome).collect();
    assert_eq!(
        outcomes,
        [&Outcome::Interrupted, &Outcome::Pending, &Outcome::Pending],
        "{}",
        failed.summary.report()
    );
    assert!(
        failed.summary.totals().ends_with("1 interrupted"),
        "{}",
        failed.summary.totals()
    );
    assert_interrupted(&root, &xs, 1);
    assert_eq!(o.queued().len(), 3, "every unfinished run stays queued");
    // The token stays cancelled: a later drain of this sweep starts nothing.
    let again = o.drain().expect_err("still cancelled");
    assert!(matches!(again.cause, FailureCause::Cancelled));
    assert_eq!(again.summary.interrupted() + again.summary.ran(), 0);
    // A new sweep (without that token) runs all three, the interrupted one included.
    open_gate(&root);
    let mut fresh = sweep(&root, None, &xs);
    let s = fresh.drain().unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(s.ran(), 3, "{}", s.report());
}

/// A job that never logs nor asks is not told: it runs to its end and its result is kept;
/// the drain stops before the next run.
#[test]
fn a_job_that_never_hears_of_the_cancel_keeps_its_result() {
    let _w = watchdog::Watchdog::start("unheard cancel", Duration::from_secs(180));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let xs = [(1, false), (2, false)];
    let token = CancellationToken::new();
    let mut o = sweep(&root, Some(token.clone()), &xs);
    let canceller = {
        let root = root.clone();
        std::thread::spawn(move || {
            wait_for("job 1 starts", || root.join("started-1").exists());
            token.cancel();
            open_gate(&root);
        })
    };
    let failed = o.drain().expect_err("cancelled");
    canceller.join().unwrap();
    let outcomes: Vec<&Outcome> = failed.summary.jobs.iter().map(|j| &j.outcome).collect();
    assert!(
        matches!(outcomes[..], [Outcome::Ran { .. }, Outcome::Pending]),
        "{}",
        failed.summary.report()
    );
    assert_eq!(o.queued().len(), 1, "the run that ran is done");
    let rec = FsStore::open(&root)
        .unwrap()
        .record(&o.enqueued()[0].key)
        .unwrap()
        .expect("a record");
    assert_eq!(rec.status, puzzletron::store::Status::Done);
}

/// The child side of `sigint_cancels_a_blocking_drain_and_ctrl_c_is_restored_after`.
#[test]
fn child_entry_point() {
    let Some(root) = std::env::var_os("PT_CANCEL_CHILD") else {
        return;
    };
    let root = PathBuf::from(root);
    // As in a program started from a shell. A test run started in the background of a
    // non-interactive shell inherits SIGINT ignored, and a drain leaves an ignored SIGINT
    // alone (the program owns it).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
    let mut o = sweep(&root, None, &[(1, true), (2, true)]);
    let failed = o.drain().expect_err("Ctrl-C cancels the drain");
    println!(
        "CHILD cancelled={} interrupted={} pending={}",
        matches!(failed.cause, FailureCause::Cancelled),
        failed.summary.interrupted(),
        failed.summary.pending()
    );
    // Outside a drain, Ctrl-C has its default action again: this ends the process.
    unsafe {
        libc::raise(libc::SIGINT);
    }
    println!("CHILD survived SIGINT after the drain");
}

/// A real SIGINT to a process in a blocking `drain()`: the job is told, the run recorded as
/// interrupted, the drain returns `Cancelled`; once it has returned, SIGINT ends the process
/// as usual (the handler lived as long as the drain).
#[test]
fn sigint_cancels_a_blocking_drain_and_ctrl_c_is_restored_after() {
    use std::os::unix::process::ExitStatusExt;
    let _w = watchdog::Watchdog::start("sigint", Duration::from_secs(180));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_entry_point",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PT_CANCEL_CHILD", root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the child's job starts", || root.join("started-1").exists());
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stdout.contains("CHILD cancelled=true interrupted=1 pending=1"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stdout.contains("survived"), "stdout: {stdout}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGINT),
        "after the drain SIGINT ends the process: {:?}\nstderr: {stderr}",
        out.status
    );
    assert_interrupted(root, &[(1, true), (2, true)], 1);
    assert!(!root.join("started-2").exists());
}
