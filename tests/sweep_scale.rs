//! A sweep too large for its memory bound fails early with an error naming the bound, never by
//! the OOM killer, and keeps the runs it holds (issue "near the floor": bad input).

mod support;

use puzzletron::store::MemoryStore;
use puzzletron::{Error, JobResult, Orchestrator, Run};
use support::sweep::FakeCrate;

/// The benches' ten-field parameters (`Params10`, `p10`), shared with this test.
#[path = "../benches/support/params10.rs"]
mod params10;
use params10::{Params10, p10};

fn noop(p: &Params10, run: &mut Run) -> JobResult {
    run.log("seed", 0, p.seed as f64)?;
    Ok(())
}

#[test]
fn the_run_past_the_memory_limit_is_refused_naming_the_bound_and_the_rest_drain() {
    let c = FakeCrate::new();
    let limit = 100_000;
    let mut o = Orchestrator::builder()
        .store(MemoryStore::new())
        .lock(c.lock())
        .memory_limit(limit)
        .build()
        .unwrap();
    let job = c.job(noop);
    let mut refused = None;
    for i in 0..10_000 {
        if let Err(e) = o.run(&job, p10(i)) {
            refused = Some((i, e));
            break;
        }
    }
    let (i, e) = refused.expect("a 100 kB bound holds fewer than 10k runs");
    let msg = e.to_string();
    assert!(!e.is_retryable());
    match e {
        Error::TooLarge {
            runs,
            bytes,
            limit: l,
            bound,
        } => {
            assert_eq!(runs as u64, i + 1);
            assert_eq!(l, limit);
            assert!(bytes > limit && bytes < limit + 1000, "{bytes}");
            assert_eq!(bound, "set with OrchestratorBuilder::memory_limit");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(
        msg.contains("past its memory bound of 100000 bytes"),
        "{msg}"
    );
    assert!(msg.contains("OrchestratorBuilder::memory_limit"), "{msg}");
    // About 250 bytes a run plus ~40 of parameters: 300-400 runs fit.
    assert!((250..=400).contains(&i), "{i} runs fit in 100 kB");
    // Nothing enqueued before is lost: the plan and the drain have every one of them.
    assert_eq!(o.enqueued().len() as u64, i);
    assert_eq!(o.plan().unwrap().decisions.len() as u64, i);
    assert_eq!(o.drain().unwrap().ran() as u64, i);
    // A run already enqueued is no new memory: enqueueing it again is accepted.
    assert!(o.run(&job, p10(0)).is_ok());
}

/// Set in the child process of the next test.
const CHILD: &str = "PUZZLETRON_SCALE_TEST_CHILD";

/// The child: with the default bound (half of what the process may use, here its
/// `RLIMIT_DATA`), enqueues until refused and prints the error and its peak heap use.
#[test]
fn child_enqueues_until_the_default_bound() {
    if std::env::var_os(CHILD).is_none() {
        return; // run by the next test in a process of its own
    }
    let c = FakeCrate::new();
    let mut o = Orchestrator::builder()
        .store(MemoryStore::new())
        .lock(c.lock())
        .build()
        .unwrap();
    let job = c.job(noop);
    for i in 0..50_000_000 {
        if let Err(e) = o.run(&job, p10(i)) {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let data = status
                .lines()
                .find(|l| l.starts_with("VmData:"))
                .unwrap_or("VmData: ?");
            println!("REFUSED {i} {data}\nERROR {e}");
            return;
        }
    }
    println!("NOT REFUSED");
}

#[test]
fn a_sweep_past_the_data_limit_fails_with_the_bound_not_an_allocation_failure() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // 96 MiB of data segment: the default bound is half, about 190k runs.
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -d 98304 && exec \"$0\" --exact child_enqueues_until_the_default_bound \
             --nocapture --test-threads=1",
        ])
        .arg(std::env::current_exe().unwrap())
        .env(CHILD, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child died ({:?}): {stdout}\n{stderr}",
        out.status
    );
    let refused = stdout
        .lines()
        .find_map(|l| l.split_once("REFUSED ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no refusal: {stdout}\n{stderr}"));
    let runs: u64 = refused.split(' ').next().unwrap().parse().unwrap();
    assert!(
        runs > 100_000,
        "only {runs} runs in a 48 MiB bound: {stdout}"
    );
    // The estimate is honest: the heap the refused sweep holds is within its bound.
    let data_kb: u64 = refused
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no VmData in {refused:?}"));
    assert!(data_kb * 1024 < 96 << 20, "{refused}");
    let err = stdout.lines().find(|l| l.contains("ERROR ")).unwrap();
    assert!(
        err.contains("past its memory bound of 50331648 bytes") && err.contains("RLIMIT_DATA"),
        "{err}"
    );
}

/// Runs of the kill test (`PUZZLETRON_SCALE_RUNS` to change it).
fn kill_runs() -> u64 {
    std::env::var("PUZZLETRON_SCALE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// Set in the child process of the kill test: the store to drain.
const KILL_CHILD: &str = "PUZZLETRON_SCALE_KILL_STORE";

/// The kill test's child: enqueues the million runs on an `FsStore`, says so, and drains
/// until it is killed.
#[test]
fn child_drains_a_million_runs() {
    let Some(store) = std::env::var_os(KILL_CHILD) else {
        return; // run by the next test in a process of its own
    };
    let lock = std::env::var_os("PUZZLETRON_SCALE_LOCK").expect("lock");
    let job = puzzletron::Job::new(
        "fake::train",
        "fake",
        std::path::Path::new(&lock).parent().unwrap(),
        "examples/job.rs",
        noop,
    );
    let mut o = Orchestrator::builder()
        .store_root(&store)
        .lock(&lock)
        .build()
        .unwrap();
    for i in 0..kill_runs() {
        o.run(&job, p10(i)).unwrap();
    }
    println!("ENQUEUED");
    let s = o.drain().unwrap();
    println!("DRAINED {}", s.ran());
}

/// `kill -9` in the middle of a drain of a million runs: the store stays readable, every run
/// it says is done has its exact metrics, and the next plan of the million skips exactly those
/// and runs the rest.
#[test]
fn a_million_run_drain_killed_loses_nothing_finished() {
    use puzzletron::store::{FsStore, Store};
    use std::io::BufRead;
    if std::env::var_os(KILL_CHILD).is_some() || std::env::var_os(CHILD).is_some() {
        return;
    }
    let n = kill_runs();
    let c = FakeCrate::new();
    let store = c.path().join("store");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_drains_a_million_runs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILL_CHILD, &store)
        .env("PUZZLETRON_SCALE_LOCK", c.lock())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(child.stdout.take().unwrap());
    let said = out
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("ENQUEUED"));
    assert!(said.is_some(), "the child did not enqueue its runs");
    // Let the drain finish a few hundred runs (the done index grows a line per run), then kill.
    let idx = store.join("done.idx");
    let t0 = std::time::Instant::now();
    while std::fs::metadata(&idx).map_or(0, |m| m.len()) < 300 * 280
        && t0.elapsed() < std::time::Duration::from_secs(120)
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();

    let fs = FsStore::create(&store).expect("the store opens after the kill");
    let st = puzzletron::report::SweepStatus::scan(&fs).unwrap();
    let count = |s: &str| {
        st.counts
            .iter()
            .find(|(k, _)| k == s)
            .map_or(0, |(_, n)| *n)
    };
    let done = count("done");
    assert!(done >= 100, "{st:?}");
    assert_eq!((count("failed"), count("corrupt")), (0, 0), "{st:?}");
    // Every done run's metric is exact (its seed, which the key covers).
    let keys = fs.keys().unwrap();
    let mut checked = 0;
    for k in &keys {
        let Some(r) = fs.record(k).unwrap() else {
            continue;
        };
        if r.status != puzzletron::store::Status::Done {
            continue;
        }
        let m = fs.metrics(k, Some("seed")).unwrap();
        assert_eq!(m.value, [r.params["seed"].as_f64().unwrap()], "{k}");
        checked += 1;
    }
    assert_eq!(checked, done);
    drop(fs);

    // The next plan of the same million: exactly the done runs are skipped.
    let mut o = Orchestrator::builder()
        .store_root(&store)
        .lock(c.lock())
        .build()
        .unwrap();
    let job = c.job(noop);
    for i in 0..n {
        o.run(&job, p10(i)).unwrap();
    }
    let plan = o.plan().unwrap();
    assert_eq!(plan.decisions.len() as u64, n);
    assert_eq!(plan.count(puzzletron::Action::Skip), done, "{st:?}");
    assert_eq!(
        plan.count(puzzletron::Action::Run) as u64,
        n - done as u64,
        "{st:?}"
    );
}
