//! Multi-process properties of sweeps on an `FsStore`: SIGKILL at random moments never tears a
//! record or loses a finished result; three concurrent drains run each job exactly once; keys do
//! not depend on the working directory.
//!
//! The test binary re-executes itself as the child process: `child_entry_point` does the child's
//! work when `PUZZLETRON_CHILD` is set (and nothing otherwise).

mod support;
use support::watchdog;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use puzzletron::store::{JobRecord, Status};
use puzzletron::{Orchestrator, identity::Hash, store::FsStore, store::Store};
use support::sweep::{WorkParams, expected_value, work_job};

const JOBS: u32 = 6;
const ROWS: i64 = 200;

fn params(id: u32, sleep_us: u64) -> WorkParams {
    WorkParams {
        id,
        rows: ROWS,
        sleep_us,
    }
}

fn enqueue(o: &mut Orchestrator<FsStore>, sleep_us: u64) -> Vec<Hash> {
    let job = work_job();
    (0..JOBS)
        .map(|id| o.run(&job, params(id, sleep_us)).unwrap())
        .collect()
}

fn orchestrator(store: &Path) -> Orchestrator<FsStore> {
    Orchestrator::builder().store_root(store).build().unwrap()
}

/// The child side. Modes: `drain` (drain the sweep in `PUZZLETRON_STORE`), `key` (print the key
/// of job 0).
#[test]
fn child_entry_point() {
    let Ok(mode) = std::env::var("PUZZLETRON_CHILD") else {
        return;
    };
    let store = std::env::var("PUZZLETRON_STORE").expect("PUZZLETRON_STORE");
    if mode == "worker-without-guard" {
        // Started with the worker environment, but `main_guard()` never ran.
        match Orchestrator::builder().store_root(&store).build() {
            Err(e) => println!("REFUSED {e}"),
            Ok(_) => println!("BUILT"),
        }
        return;
    }
    let sleep_us: u64 = std::env::var("PUZZLETRON_SLEEP_US")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut o = orchestrator(Path::new(&store));
    let keys = enqueue(&mut o, sleep_us);
    match mode.as_str() {
        "drain" => {
            let s = o
                .drain()
                .unwrap_or_else(|e| panic!("child drain failed: {e}"));
            println!("CHILD ran={} skipped={}", s.ran(), s.skipped());
        }
        "key" => println!("KEY {}", keys[0]),
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(
    mode: &str,
    store: &Path,
    sleep_us: u64,
    cwd: Option<&Path>,
    side: Option<&Path>,
) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "child_entry_point",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("PUZZLETRON_CHILD", mode)
    .env("PUZZLETRON_STORE", store)
    .env("PUZZLETRON_SLEEP_US", sleep_us.to_string())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    if let Some(s) = side {
        cmd.env("PUZZLETRON_SIDE_FILE", s);
    }
    cmd.spawn().unwrap()
}

/// Checks every invariant of a store after a crash; returns how many jobs are done.
fn check_store(store_dir: &Path, keys: &[Hash]) -> usize {
    // After a fresh start (the folder removed below) the child creates the store: killed before
    // its format file was written, it leaves a folder of the store's own entries, which `open`
    // refuses and `create` completes (anything else in the folder, `create` refuses too).
    let store = FsStore::create(store_dir).expect("the store must open after a crash");
    let mut done = 0;
    for (id, key) in keys.iter().enumerate() {
        let rec: Option<JobRecord> = store.record(key).expect("no record may be torn");
        let Some(rec) = rec else { continue };
        match rec.status {
            Status::Done => {
                done += 1;
                let m = store
                    .metrics(key, None)
                    .expect("a done job's metrics must be readable");
                assert_eq!(
                    m.len() as i64,
                    ROWS,
                    "a done job's metrics must be complete"
                );
                assert_eq!(m.step, (0..ROWS).collect::<Vec<_>>());
                let want: Vec<f64> = (0..ROWS).map(|s| expected_value(id as u32, s)).collect();
                assert_eq!(m.value, want, "a done job's metric values must be exact");
            }
            Status::Running => {
                let info = store.claim_info(key).unwrap();
                if let Some(c) = info.as_ref().filter(|c| c.live) {
                    // A child killed between creating its claim file and writing it leaves an
                    // empty claim: no owner to prove dead, so only the heartbeat judges it
                    // (CONTRIBUTING, "who may judge whom"). It must be taken over once a judge
                    // has seen it unchanged for the stale interval.
                    let note = c.note.as_deref().unwrap_or_default();
                    assert!(
                        note.contains("is empty") || note.contains("cannot be read as an owner"),
                        "a running record of a killed child must be reclaimable, got {info:?}"
                    );
                    let judge = FsStore::open(store_dir)
                        .unwrap()
                        .with_stale_after(Duration::from_millis(200));
                    let first = judge.claim_info(key).unwrap();
                    std::thread::sleep(Duration::from_millis(500));
                    let later = judge.claim_info(key).unwrap();
                    assert!(
                        later.as_ref().is_none_or(|c| !c.live),
                        "an unwritten claim of a killed child must be stale once seen unchanged \
                         for the stale interval, got {first:?} then {later:?}"
                    );
                }
            }
            Status::Failed => panic!("no job fails in this test: {:?}", rec.error),
            other => panic!("a state this test does not know: {other:?}"),
        }
    }
    done
}

#[test]
fn sigkill_at_random_moments_never_tears_a_record() {
    let _watchdog = watchdog::Watchdog::start(
        "sigkill_at_random_moments_never_tears_a_record",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let keys = enqueue(&mut orchestrator(&store), 20);
    // Kill delays span one uninterrupted drain of this machine, measured now (start-up, claims,
    // logging, promotion to done): a fixed window misses every commit on a loaded machine.
    let scratch = dir.path().join("calibrate");
    enqueue(&mut orchestrator(&scratch), 20);
    let t0 = Instant::now();
    let status = spawn_child("drain", &scratch, 20, None, None)
        .wait()
        .unwrap();
    assert!(status.success(), "the calibration drain failed: {status}");
    let window_us = (t0.elapsed().as_micros() as u64).max(20_000);
    // A cheap deterministic PRNG for kill delays in [0, window].
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let trials = 100;
    let mut done_seen = Vec::new();
    for _ in 0..trials {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = Duration::from_micros(x % window_us);
        let mut child = spawn_child("drain", &store, 20, None, None);
        std::thread::sleep(delay);
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        done_seen.push(check_store(&store, &keys));
        if done_seen.last() == Some(&(JOBS as usize)) {
            // Start over on a fresh store so later trials still crash mid-drain.
            std::fs::remove_dir_all(&store).unwrap();
        }
    }
    eprintln!("jobs done after each of {trials} kills: {done_seen:?}");
    // The kills must have landed in different phases: some trials finished jobs, some not.
    assert!(
        done_seen.iter().any(|&d| d > 0),
        "no trial finished a job: {done_seen:?}"
    );
    assert!(
        done_seen.iter().any(|&d| d < JOBS as usize),
        "every trial finished: {done_seen:?}"
    );
    // Whatever state the last kill left, a drain completes it with exact results.
    let mut o = orchestrator(&store);
    assert_eq!(enqueue(&mut o, 20), keys);
    o.drain().unwrap();
    assert_eq!(check_store(&store, &keys), JOBS as usize);
}

#[test]
fn three_concurrent_drains_run_each_job_once() {
    let _watchdog = watchdog::Watchdog::start(
        "three_concurrent_drains_run_each_job_once",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let side = dir.path().join("executions.txt");
    let children: Vec<Child> = (0..3)
        .map(|_| spawn_child("drain", &store, 300, None, Some(&side)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(Instant::now() < deadline);
    }
    let text = std::fs::read_to_string(&side).unwrap();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for line in text.lines() {
        *counts.entry(line).or_default() += 1;
    }
    assert_eq!(counts.len(), JOBS as usize, "every job ran: {counts:?}");
    assert!(
        counts.values().all(|&n| n == 1),
        "each job ran exactly once: {counts:?}"
    );
    let keys = enqueue(&mut orchestrator(&store), 300);
    assert_eq!(check_store(&store, &keys), JOBS as usize);
}

#[test]
fn keys_do_not_depend_on_the_working_directory() {
    let _watchdog = watchdog::Watchdog::start(
        "keys_do_not_depend_on_the_working_directory",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let (a, b) = (dir.path().join("a"), dir.path().join("b/c"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let key_in = |cwd: &Path| {
        let out = spawn_child("key", &store, 0, Some(cwd), None)
            .wait_with_output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        stdout
            .split("KEY ")
            .nth(1)
            .map(|rest| rest.chars().take(64).collect::<String>())
            .expect("KEY line")
    };
    let (ka, kb) = (key_in(&a), key_in(&b));
    assert_eq!(ka, kb);
    let here = enqueue(&mut orchestrator(&store), 0)[0];
    assert_eq!(ka, here.to_hex());
}

#[test]
fn a_worker_without_main_guard_refuses_to_build_a_sweep() {
    let _watchdog = watchdog::Watchdog::start(
        "a_worker_without_main_guard_refuses_to_build_a_sweep",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_entry_point",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("PUZZLETRON_CHILD", "worker-without-guard")
        .env("PUZZLETRON_STORE", dir.path().join("store"))
        .env(
            puzzletron::worker::MANIFEST_ENV,
            dir.path().join("manifest.json"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(
            "REFUSED this process was started as an isolated worker (PUZZLETRON_WORKER_MANIFEST \
             is set) but `puzzletron::worker::main_guard();` did not run first in `main`"
        ),
        "{stdout}"
    );
    assert!(!dir.path().join("store").exists(), "nothing was created");
}
