//! Exactly once, whoever is watching (issue 26; P01 in `docs/evidence.md`): drains
//! and lease holders in a PID namespace of their own (`unshare --pid --fork --mount-proc`, which
//! needs root) and on the host share one store or one campaign folder. They share the host
//! name and the kernel, but neither can see the other's processes, so neither may take the
//! other's pid (absent, or another process's) for proof of anything: each judges the other by
//! its heartbeat, timed on its own clock.
//!
//! What the drains' jobs do is checked outside the store: each execution takes an exclusive
//! `flock` on a file of its key (a second live execution of a key cannot get it: `DOUBLE`),
//! checks that its key has no done record yet (`RERUN`), and appends `start`/`end` lines to a
//! log. The test binary re-executes itself as the child (`child_entry_point`, when
//! `PUZZLETRON_LIVENESS_CHILD` is set). Runs when `PUZZLETRON_NS_TESTS=1` (cfg
//! `puzzletron_ns_tests`; `.ci/run` sets it, as root); `PUZZLETRON_NS_KILL_TRIALS` sets the
//! number of `kill -9` trials (default 50).

mod support;
use support::watchdog;

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use puzzletron::campaign::controller::{ControllerError, Lease};
use puzzletron::store::{Status, StoreExt};
use puzzletron::{Job, JobResult, Run};
use puzzletron::{Orchestrator, store::FsStore, store::Store};
use serde::{Deserialize, Serialize};

/// The stale interval of every store here: the heartbeat is renewed every quarter of it.
const STALE_MS: u64 = 1000;
const CHILD: &str = "PUZZLETRON_LIVENESS_CHILD";

#[derive(Debug, Clone, Serialize, Deserialize)]
struct NsParams {
    id: u32,
    /// Distinct per trial, so each trial's runs have keys of their own.
    trial: u32,
    steps: u32,
    step_ms: u64,
}

fn value(id: u32, step: i64) -> f64 {
    f64::from(id) * 1000.0 + step as f64
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

fn num<T: std::str::FromStr>(name: &str) -> T {
    env(name)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// Appends one line to the log (`O_APPEND`, one `write`).
fn log_line(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// The job: see the module docs.
fn ns_work(p: &NsParams, run: &mut Run) -> JobResult {
    let key = run.key().to_hex();
    let log = PathBuf::from(env("LIVE_LOG"));
    let lock = std::fs::File::create(Path::new(&env("LIVE_MARKS")).join(&key))?;
    // SAFETY: flock(2) on a descriptor we own; released when this execution ends or dies.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        log_line(&log, &format!("DOUBLE {key}"));
    }
    let done = FsStore::open(env("LIVE_STORE"))?
        .record(&run.key())?
        .is_some_and(|r| r.status == Status::Done);
    if done {
        log_line(&log, &format!("RERUN {key}"));
    }
    log_line(&log, &format!("start {key} {}", std::process::id()));
    for step in 0..i64::from(p.steps) {
        run.log("m", step, value(p.id, step))?;
        std::thread::sleep(Duration::from_millis(p.step_ms));
    }
    log_line(&log, &format!("end {key}"));
    drop(lock);
    Ok(())
}

fn ns_job() -> Job<NsParams> {
    Job::new(
        "tests::ns_work",
        "puzzletron",
        env!("CARGO_MANIFEST_DIR"),
        "tests/store_liveness.rs",
        ns_work,
    )
}

/// CLOCK_MONOTONIC in ns: one clock for every PID namespace of the host.
fn mono_ns() -> u128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

/// The child side. Modes: `drain` (drains `LIVE_JOBS` runs of trial `LIVE_TRIAL` on
/// `LIVE_STORE`), `lease-turns` (takes the lease of `LIVE_CAMPAIGN` `LIVE_TURNS` times, holding
/// it `LIVE_HOLD_MS` each, and logs each hold's monotonic interval), `lease-hold` (takes it and
/// holds it until killed).
#[test]
fn child_entry_point() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    match mode.as_str() {
        "drain" => {
            let store = FsStore::create(env("LIVE_STORE"))
                .unwrap()
                .with_stale_after(Duration::from_millis(STALE_MS));
            let mut o = Orchestrator::builder()
                .store(store)
                .wait_poll(Duration::from_millis(50))
                .build()
                .unwrap();
            let job = ns_job();
            for id in 0..num::<u32>("LIVE_JOBS") {
                let p = NsParams {
                    id,
                    trial: num("LIVE_TRIAL"),
                    steps: num("LIVE_STEPS"),
                    step_ms: num("LIVE_STEP_MS"),
                };
                o.run(&job, p).unwrap();
            }
            match o.drain() {
                Ok(s) => println!("DRAIN ok ran={} skipped={}", s.ran(), s.skipped()),
                Err(f) => {
                    println!("DRAIN failed: {f}");
                    std::process::exit(3);
                }
            }
        }
        "lease-turns" => {
            let campaign = PathBuf::from(env("LIVE_CAMPAIGN"));
            let ctl = campaign.join("controller");
            let ttl = Duration::from_millis(num("LIVE_TTL_MS"));
            let deadline = Instant::now() + Duration::from_secs(120);
            for _ in 0..num::<u32>("LIVE_TURNS") {
                let lease = loop {
                    match Lease::acquire(&campaign, &ctl, ttl) {
                        Ok(l) => break l,
                        Err(ControllerError::LeaseHeld { .. }) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        Err(e) => panic!("acquire: {e}"),
                    }
                };
                let t0 = mono_ns();
                std::thread::sleep(Duration::from_millis(num("LIVE_HOLD_MS")));
                lease.check().unwrap();
                let t1 = mono_ns();
                drop(lease);
                log_line(
                    Path::new(&env("LIVE_LOG")),
                    &format!("hold {} {t0} {t1}", std::process::id()),
                );
                // Let the other side in.
                std::thread::sleep(Duration::from_millis(30));
            }
            println!("LEASE turns done");
        }
        "lease-hold" => {
            let campaign = PathBuf::from(env("LIVE_CAMPAIGN"));
            let ttl = Duration::from_millis(num("LIVE_TTL_MS"));
            let _lease = Lease::acquire(&campaign, &campaign.join("controller"), ttl).unwrap();
            println!("HELD");
            std::io::stdout().flush().unwrap();
            std::thread::sleep(Duration::from_secs(600));
        }
        other => panic!("unknown child mode {other}"),
    }
}

/// Starts the child in mode `mode` with `vars`, in a PID namespace of its own when `in_ns`
/// (`unshare --kill-child`: killing the `unshare` process kills the whole namespace).
fn spawn(mode: &str, vars: &[(&str, String)], in_ns: bool) -> Child {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if in_ns {
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args([
        "child_entry_point",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, mode)
    .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd.spawn()
        .unwrap_or_else(|e| panic!("starting the {mode} child (in_ns {in_ns}): {e}"))
}

/// The host pid of the process `unshare` (pid `outer`) runs as pid 1 of its namespace.
fn inner_pid(outer: u32) -> u32 {
    let path = format!("/proc/{outer}/task/{outer}/children");
    let t = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
        {
            return pid;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "no child in {path}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill {pid} {sig}"
    );
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A store, its job log and lock folder.
struct Sweep {
    _dir: tempfile::TempDir,
    store: PathBuf,
    log: PathBuf,
    marks: PathBuf,
}

impl Sweep {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let marks = dir.path().join("marks");
        std::fs::create_dir_all(&marks).unwrap();
        Self {
            store: dir.path().join("store"),
            log: dir.path().join("executions.log"),
            marks,
            _dir: dir,
        }
    }

    fn vars(&self, trial: u32, jobs: u32, steps: u32, step_ms: u64) -> Vec<(&'static str, String)> {
        vec![
            ("LIVE_STORE", self.store.display().to_string()),
            ("LIVE_LOG", self.log.display().to_string()),
            ("LIVE_MARKS", self.marks.display().to_string()),
            ("LIVE_TRIAL", trial.to_string()),
            ("LIVE_JOBS", jobs.to_string()),
            ("LIVE_STEPS", steps.to_string()),
            ("LIVE_STEP_MS", step_ms.to_string()),
        ]
    }

    /// Counts of each log line kind, by key.
    fn log(&self) -> HashMap<(String, String), usize> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut counts = HashMap::new();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(kind), Some(key)) = (it.next(), it.next()) else {
                continue;
            };
            *counts
                .entry((kind.to_string(), key.to_string()))
                .or_default() += 1;
        }
        counts
    }

    /// Checks that `jobs` runs of this store are done with exact rows; returns the records.
    fn all_done(&self, jobs: usize, steps: u32) -> Vec<puzzletron::store::JobRecord> {
        let store = FsStore::open(&self.store).unwrap();
        let recs = store.done_records().unwrap();
        assert_eq!(recs.len(), jobs, "every run is done: {recs:?}");
        for r in &recs {
            let id = r.params["id"].as_u64().unwrap() as u32;
            let m = store.metrics(&r.key, None).unwrap();
            let want: Vec<f64> = (0..i64::from(steps)).map(|s| value(id, s)).collect();
            assert_eq!(m.value, want, "run {} has its exact rows", r.key);
        }
        recs
    }
}

fn kinds(counts: &HashMap<(String, String), usize>, kind: &str) -> Vec<String> {
    counts
        .keys()
        .filter(|(k, _)| k == kind)
        .map(|(_, key)| key.clone())
        .collect()
}

#[test]
#[cfg_attr(
    not(puzzletron_ns_tests),
    ignore = "needs root for unshare --pid: set PUZZLETRON_NS_TESTS=1"
)]
fn two_drains_across_a_pid_namespace_run_each_job_exactly_once() {
    let _w = watchdog::Watchdog::start(
        "two_drains_across_a_pid_namespace_run_each_job_exactly_once",
        Duration::from_secs(300),
    );
    let sweep = Sweep::new();
    let (jobs, steps, step_ms) = (24, 10, 20);
    let vars = sweep.vars(0, jobs, steps, step_ms);
    let a = spawn("drain", &vars, true);
    std::thread::sleep(Duration::from_millis(150));
    let b = spawn("drain", &vars, false);
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for (name, out) in [("in the namespace", &a), ("on the host", &b)] {
        assert!(
            out.status.success(),
            "the drain {name} failed:\n{}",
            text(out)
        );
    }
    let ran = |out: &Output| -> usize {
        let t = text(out);
        let n = t
            .split("DRAIN ok ran=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next()?.parse().ok());
        n.unwrap_or_else(|| panic!("no DRAIN line: {t}"))
    };
    let (ran_a, ran_b) = (ran(&a), ran(&b));
    assert_eq!(ran_a + ran_b, jobs as usize, "{ran_a} + {ran_b}");
    assert!(
        ran_a > 0 && ran_b > 0,
        "both drains ran jobs: {ran_a}, {ran_b}"
    );
    let counts = sweep.log();
    assert!(kinds(&counts, "DOUBLE").is_empty(), "{counts:?}");
    assert!(kinds(&counts, "RERUN").is_empty(), "{counts:?}");
    let starts = kinds(&counts, "start");
    assert_eq!(starts.len(), jobs as usize, "{counts:?}");
    for key in &starts {
        assert_eq!(counts[&("start".to_string(), key.clone())], 1, "{key}");
        assert_eq!(counts[&("end".to_string(), key.clone())], 1, "{key}");
    }
    let recs = sweep.all_done(jobs as usize, steps);
    let spaces: std::collections::BTreeSet<_> = recs
        .iter()
        .map(|r| r.owner.as_ref().unwrap().pidns.clone())
        .collect();
    assert_eq!(
        spaces.len(),
        2,
        "records of both PID namespaces: {spaces:?}"
    );
}

#[test]
#[cfg_attr(
    not(puzzletron_ns_tests),
    ignore = "needs root for unshare --pid: set PUZZLETRON_NS_TESTS=1"
)]
fn kill_9_of_a_drain_across_the_namespace_boundary_loses_nothing_and_runs_nothing_twice() {
    let _w = watchdog::Watchdog::start(
        "kill_9_of_a_drain_across_the_namespace_boundary_loses_nothing_and_runs_nothing_twice",
        Duration::from_secs(1200),
    );
    let trials: u32 = std::env::var("PUZZLETRON_NS_KILL_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let (jobs, steps, step_ms) = (4, 10, 10);
    // Kill delays span the start-up and the first runs of both drains.
    let window_us = 1_500_000u64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut killed_mid_run = 0;
    let mut executions = 0;
    for trial in 0..trials {
        let sweep = Sweep::new();
        let vars = sweep.vars(trial, jobs, steps, step_ms);
        let a = spawn("drain", &vars, true);
        let b = spawn("drain", &vars, false);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_micros(x % window_us));
        // The victim alternates: the drain in the namespace, then the one on the host.
        let (mut victim, survivor) = if trial % 2 == 0 { (a, b) } else { (b, a) };
        signal(victim.id(), libc::SIGKILL);
        let _ = victim.wait();
        let out = survivor.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "trial {trial}: the surviving drain failed:\n{}",
            text(&out)
        );
        let counts = sweep.log();
        assert!(
            kinds(&counts, "DOUBLE").is_empty(),
            "trial {trial}: a run executed twice at once: {counts:?}"
        );
        assert!(
            kinds(&counts, "RERUN").is_empty(),
            "trial {trial}: a done run executed again: {counts:?}"
        );
        let starts: usize = counts
            .iter()
            .filter(|((k, _), _)| k == "start")
            .map(|(_, n)| n)
            .sum();
        let ends: usize = counts
            .iter()
            .filter(|((k, _), _)| k == "end")
            .map(|(_, n)| n)
            .sum();
        killed_mid_run += starts - ends;
        executions += starts;
        sweep.all_done(jobs as usize, steps);
    }
    eprintln!(
        "{trials} kill -9 trials: {executions} executions, {killed_mid_run} killed mid-run and \
         run again, 0 twice at once, 0 after their result, 0 results lost"
    );
    assert!(
        killed_mid_run > 0,
        "no kill landed during a run: the trials tested nothing"
    );
}

#[test]
#[cfg_attr(
    not(puzzletron_ns_tests),
    ignore = "needs root for unshare --pid: set PUZZLETRON_NS_TESTS=1"
)]
fn a_stopped_holder_is_taken_over_and_stops_without_a_result_when_resumed() {
    let _w = watchdog::Watchdog::start(
        "a_stopped_holder_is_taken_over_and_stops_without_a_result_when_resumed",
        Duration::from_secs(300),
    );
    let sweep = Sweep::new();
    let (steps, step_ms) = (20, 100);
    let vars = sweep.vars(0, 1, steps, step_ms);
    let holder = spawn("drain", &vars, true);
    let inner = inner_pid(holder.id());
    let t = Instant::now();
    while kinds(&sweep.log(), "start").is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the holder never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(inner, libc::SIGSTOP);
    let stopped_at = Instant::now();
    let taker = spawn("drain", &vars, false);
    let taker_pid = taker.id();
    let out = taker.wait_with_output().unwrap();
    assert!(out.status.success(), "the taker failed:\n{}", text(&out));
    assert!(
        stopped_at.elapsed() >= Duration::from_millis(STALE_MS),
        "taken over only after the stale interval"
    );
    let rec = sweep.all_done(1, steps).remove(0);
    let owner = rec.owner.clone().unwrap();
    assert_eq!(owner.pid, taker_pid, "the taker's result");
    assert!(
        rec.attempt >= 2,
        "a takeover is a new attempt: {}",
        rec.attempt
    );
    signal(inner, libc::SIGCONT);
    let out = holder.wait_with_output().unwrap();
    let said = text(&out);
    assert!(
        !out.status.success(),
        "the resumed holder must stop: {said}"
    );
    assert!(said.contains("no longer held"), "{said}");
    let after = sweep.all_done(1, steps).remove(0);
    assert_eq!(after, rec, "the resumed holder wrote nothing");
}

/// Holds one `lease-turns` child's environment.
fn lease_vars(campaign: &Path, log: &Path, ttl_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("LIVE_CAMPAIGN", campaign.display().to_string()),
        ("LIVE_LOG", log.display().to_string()),
        ("LIVE_TTL_MS", ttl_ms.to_string()),
        ("LIVE_TURNS", "4".into()),
        ("LIVE_HOLD_MS", "150".into()),
    ]
}

#[test]
#[cfg_attr(
    not(puzzletron_ns_tests),
    ignore = "needs root for unshare --pid: set PUZZLETRON_NS_TESTS=1"
)]
fn two_controllers_across_a_pid_namespace_hold_the_lease_one_at_a_time() {
    let _w = watchdog::Watchdog::start(
        "two_controllers_across_a_pid_namespace_hold_the_lease_one_at_a_time",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let campaign = dir.path().join("campaign");
    std::fs::create_dir_all(campaign.join("controller")).unwrap();
    let log = dir.path().join("holds.log");
    let vars = lease_vars(&campaign, &log, 800);
    let a = spawn("lease-turns", &vars, true);
    let b = spawn("lease-turns", &vars, false);
    for out in [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()] {
        assert!(out.status.success(), "{}", text(&out));
    }
    let mut holds: Vec<(String, u128, u128)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[1].to_string(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(holds.len(), 8, "{holds:?}");
    holds.sort_by_key(|h| h.1);
    for w in holds.windows(2) {
        assert!(w[1].1 >= w[0].2, "two holders at once: {w:?}");
    }

    // A holder in the namespace killed with the lease: a controller on the host cannot see
    // its pid, so it waits for the heartbeat to stand still for the ttl, then takes over.
    let ttl = Duration::from_millis(800);
    let mut holder = spawn("lease-hold", &lease_vars(&campaign, &log, 800), true);
    // The harness prints `test child_entry_point ... ` before the child's own line.
    let held = std::io::BufReader::new(holder.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .any(|l| l.ends_with("HELD"));
    assert!(held, "the holder took the lease");
    let ctl = campaign.join("controller");
    match Lease::acquire(&campaign, &ctl, ttl) {
        Err(ControllerError::LeaseHeld { holder: h, .. }) => {
            assert!(h.contains("PID namespace"), "named with its namespace: {h}")
        }
        other => panic!("a live holder in another namespace holds the lease: {other:?}"),
    }
    let inner = inner_pid(holder.id());
    signal(holder.id(), libc::SIGKILL);
    let _ = holder.wait();
    // `--kill-child` kills the namespace's pid 1 when `unshare` dies: wait for it to be gone.
    let t = Instant::now();
    while Path::new(&format!("/proc/{inner}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the namespace outlived unshare"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let lease = Lease::acquire(&campaign, &ctl, ttl).expect("taken over");
    assert!(
        t.elapsed() >= ttl,
        "only after its heartbeat stood still for the ttl"
    );
    lease.check().unwrap();
}

#[test]
#[cfg_attr(
    not(puzzletron_ns_tests),
    ignore = "needs root for unshare --pid: set PUZZLETRON_NS_TESTS=1"
)]
fn a_second_campaign_controller_outside_the_namespace_is_refused_while_the_first_runs() {
    let _w = watchdog::Watchdog::start(
        "a_second_campaign_controller_outside_the_namespace_is_refused_while_the_first_runs",
        Duration::from_secs(600),
    );
    let exe = {
        let me = std::env::current_exe().unwrap();
        let e = me
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("examples/campaign");
        assert!(
            e.exists(),
            "{} is missing: run `cargo build --examples`",
            e.display()
        );
        e
    };
    let dir = tempfile::tempdir().unwrap();
    let campaign = dir.path().join("c");
    let first = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"])
        .arg(&exe)
        .arg("--dir")
        .arg(&campaign)
        .args(["--quiet", "--poll-ms", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lease = campaign.join("controller/lease.json");
    let t = Instant::now();
    while !lease.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the first never took the lease"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = Command::new(&exe)
        .arg("--dir")
        .arg(&campaign)
        .args(["--quiet", "--poll-ms", "100"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = text(&second);
    assert!(!second.status.success(), "{said}");
    assert!(said.contains("held by another controller"), "{said}");
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(campaign.join("result.json").exists());
}
