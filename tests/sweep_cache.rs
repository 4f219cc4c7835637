//! The cache story: rerun skips, a changed parameter set runs alone, comments do not count, code
//! and Cargo.lock changes re-run with their reason; drain stops at the first failure.

mod support;

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use puzzletron::{Action, FailureCause, JobResult, Outcome, Plan, Run};
use puzzletron::{Orchestrator, store::FsStore, store::Store};
use support::sweep::{EXECUTIONS, FakeCrate, P, train};

/// Tests in this file share the EXECUTIONS counter.
static SERIAL: Mutex<()> = Mutex::new(());

fn grid(o: &mut Orchestrator<FsStore>, c: &FakeCrate, lrs: &[f64]) {
    let job = c.job(train);
    for &lr in lrs {
        o.run(&job, P { lr, hidden: 16 }).unwrap();
    }
}

/// A fresh orchestrator over the store with the grid enqueued, and what it plans.
fn planned(c: &FakeCrate, lrs: &[f64]) -> (Orchestrator<FsStore>, Plan) {
    let mut o = c.orchestrator();
    grid(&mut o, c, lrs);
    let plan = o.plan().unwrap();
    (o, plan)
}

/// Every decision of `plan` gives exactly `reason`.
fn assert_reasons(plan: &Plan, reason: &str) {
    assert!(
        plan.decisions.iter().all(|d| d.reasons == [reason]),
        "{plan}"
    );
}

fn executions<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = EXECUTIONS.load(Ordering::SeqCst);
    let out = f();
    (EXECUTIONS.load(Ordering::SeqCst) - before, out)
}

#[test]
fn cache_story() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let lrs = [0.1, 0.2, 0.3, 0.4];

    // First run: everything runs, reason "no record".
    let (mut o, plan) = planned(&c, &lrs);
    assert_eq!(plan.count(Action::Run), 4);
    assert_reasons(&plan, "no record");
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.ran(), s.skipped()), (4, 4, 0));

    // Same program again: nothing runs, each skip has its reason.
    let (mut o, plan) = planned(&c, &lrs);
    assert_eq!(plan.count(Action::Skip), 4, "{plan}");
    assert_reasons(&plan, "up to date, attempt 1");
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.skipped()), (0, 4));

    // One parameter set changed: only it runs.
    let (mut o, plan) = planned(&c, &[0.1, 0.2, 0.3, 0.45]);
    let runs: Vec<_> = plan.to_run().map(|d| d.run.params().into_owned()).collect();
    assert_eq!(runs, [r#"{"hidden":16,"lr":0.45}"#], "{plan}");
    let (n, _) = executions(|| o.drain().unwrap());
    assert_eq!(n, 1);

    // A comment and formatting edit in owned code: nothing runs.
    c.write(
        "src/lib.rs",
        "/// Doubles.\npub fn model(x: f64) -> f64 { x * 2.0 } // twice\n",
    );
    let mut o = c.orchestrator();
    grid(&mut o, &c, &lrs);
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.skipped()), (0, 4), "{}", s.report());

    // A code edit: everything re-runs, the reason names the file.
    c.write(
        "src/lib.rs",
        "pub fn model(x: f64) -> f64 {\n    x * 3.0\n}\n",
    );
    let (mut o, plan) = planned(&c, &lrs);
    assert_reasons(&plan, "code changed: src/lib.rs");
    let (n, _) = executions(|| o.drain().unwrap());
    assert_eq!(n, 4);

    // A Cargo.lock edit: same keys, re-run in place with "environment changed: Cargo.lock".
    c.write(
        "Cargo.lock",
        "# lock v2\n[[package]]\nname = \"a\"\nversion = \"1.0.1\"\n",
    );
    let (mut o, plan) = planned(&c, &lrs);
    assert_reasons(&plan, "environment changed: Cargo.lock");
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.ran()), (4, 4));
    let rec = o.store().record(&o.enqueued()[0].key).unwrap().unwrap();
    assert_eq!(
        rec.attempt, 2,
        "re-run in place is the job's second attempt"
    );

    // And then it is up to date again.
    let mut o = c.orchestrator();
    grid(&mut o, &c, &lrs);
    assert_eq!(o.plan().unwrap().count(Action::Skip), 4);
}

#[test]
fn forced_runs_rerun_in_place() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    grid(&mut o, &c, &[0.1, 0.2]);
    o.drain().unwrap();
    let mut o = Orchestrator::builder()
        .store_root(c.path().join("store"))
        .lock(c.lock())
        .force(true)
        .build()
        .unwrap();
    grid(&mut o, &c, &[0.1, 0.2]);
    let plan = o.plan().unwrap();
    assert!(
        plan.decisions
            .iter()
            .all(|d| d.action == Action::Run && d.reasons == ["forced"])
    );
    let (n, _) = executions(|| o.drain().unwrap());
    assert_eq!(n, 2);
}

static FAIL_AT: Mutex<Option<f64>> = Mutex::new(None);

#[derive(Debug)]
struct CheckpointFailed(std::io::Error);
impl std::fmt::Display for CheckpointFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("checkpoint write failed")
    }
}
impl std::error::Error for CheckpointFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

fn flaky(p: &P, run: &mut Run) -> JobResult {
    run.log("loss", 0, p.lr)?;
    if *FAIL_AT.lock().unwrap_or_else(|e| e.into_inner()) == Some(p.lr) {
        return Err(Box::new(CheckpointFailed(std::io::Error::other(
            "disk on fire",
        ))));
    }
    Ok(())
}

#[test]
fn drain_stops_at_first_failure_and_rerun_retries() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    *FAIL_AT.lock().unwrap() = Some(0.2);
    let mut o = c.orchestrator();
    let job = c.job(flaky);
    for lr in [0.1, 0.2, 0.3, 0.4] {
        o.run(&job, P { lr, hidden: 1 }).unwrap();
    }
    let failed = o.drain().unwrap_err();
    let s = &failed.summary;
    assert_eq!(
        (s.ran(), s.failed(), s.pending(), s.skipped()),
        (1, 1, 2, 0),
        "{}",
        s.report()
    );
    assert!(matches!(s.jobs[2].outcome, Outcome::Pending));
    let FailureCause::Job {
        key,
        failure,
        error_file,
        ..
    } = &failed.cause
    else {
        panic!("expected a job failure, got {:?}", failed.cause)
    };
    assert_eq!(*key, o.enqueued()[1].key);
    assert_eq!(failure.kind, "error");
    assert_eq!(failure.chain, ["disk on fire"]);
    let text = std::fs::read_to_string(error_file.as_ref().expect("error file")).unwrap();
    assert!(
        text.starts_with("error: checkpoint write failed\ncaused by: disk on fire"),
        "{text}"
    );
    let rec = o.store().record(key).unwrap().unwrap();
    assert_eq!(rec.status, puzzletron::store::Status::Failed);
    // A failed run's rows stay in their file (its record is replaced when the job reruns).
    let m = rec.metrics.as_ref().expect("metrics");
    assert_eq!(
        (m.file.as_str(), m.inline.as_deref(), m.rows),
        ("metrics.1.tsv", None, 1)
    );
    assert_eq!(rec.format, 1);
    let report = failed.to_string();
    assert!(
        report.contains("failed") && report.contains("1 ran, 0 skipped, 1 failed, 2 pending"),
        "{report}"
    );
    assert_eq!(
        o.queued().len(),
        3,
        "the failed run and the two pending stay queued"
    );

    // Fixed: the next drain retries the failed one with its reason, then runs the rest.
    *FAIL_AT.lock().unwrap() = None;
    let plan = o.plan().unwrap();
    assert_eq!(
        plan.decisions[0].reasons,
        ["last attempt failed: checkpoint write failed"],
        "{plan}"
    );
    let s = o.drain().unwrap();
    assert_eq!(s.ran(), 3);
    let rec = o.store().record(key).unwrap().unwrap();
    assert_eq!(rec.attempt, 2);
    // The done retry's one row is kept in its record (format 2); the failed attempt's row is
    // still in its file.
    let m = rec.metrics.as_ref().expect("metrics");
    assert_eq!(
        (m.inline.as_deref(), rec.format),
        (Some("loss\t0\t0.2\n"), 2)
    );
    for attempt in [1, 2] {
        let (rows, torn) = o.store().attempt_metrics(key, attempt).unwrap();
        assert_eq!(
            (rows.of("loss"), torn),
            (vec![(0, 0.2)], None),
            "attempt {attempt}"
        );
    }
}

fn panics(p: &P, _run: &mut Run) -> JobResult {
    if p.lr > 0.15 {
        panic!("lr {} too high", p.lr);
    }
    Ok(())
}

#[test]
fn a_panic_is_a_recorded_failure_with_backtrace() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let job = c.job(panics);
    o.run(&job, P { lr: 0.1, hidden: 1 }).unwrap();
    o.run(&job, P { lr: 0.2, hidden: 1 }).unwrap();
    let failed = o.drain().unwrap_err();
    let FailureCause::Job { failure, .. } = &failed.cause else {
        panic!()
    };
    assert_eq!(failure.kind, "panic");
    assert!(
        failure
            .message
            .starts_with("lr 0.2 too high at tests/sweep_cache.rs:"),
        "{}",
        failure.message
    );
    let bt = failure.backtrace.as_deref().unwrap_or("");
    assert!(
        bt.contains("panics"),
        "backtrace should show the panicking function: {bt}"
    );
}

#[test]
fn get_returns_this_sweeps_rows_in_enqueue_order_with_typed_columns() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let job = c.job(train);
    // Another sweep's run in the same store must not appear.
    let mut other = c.orchestrator();
    other.run(&job, P { lr: 9.0, hidden: 9 }).unwrap();
    other.drain().unwrap();
    let order = [0.3, 0.1, 0.2];
    let keys: Vec<_> = order
        .iter()
        .map(|&lr| o.run(&job, P { lr, hidden: 4 }).unwrap())
        .collect();
    let t = o.get("loss").unwrap();
    assert_eq!(
        t.column_names(),
        ["step", "value", "lr", "hidden", "job_key"]
    );
    let types: Vec<String> = t
        .batch()
        .schema()
        .fields()
        .iter()
        .map(|f| f.data_type().to_string())
        .collect();
    assert_eq!(types, ["Int64", "Float64", "Float64", "Int64", "Utf8"]);
    assert_eq!(t.num_rows(), 9);
    assert_eq!(t.steps(), [0, 1, 2, 0, 1, 2, 0, 1, 2]);
    let lr: Vec<f64> = t.f64s("lr").unwrap().into_iter().flatten().collect();
    assert_eq!(lr, [0.3, 0.3, 0.3, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2]);
    let want: Vec<f64> = order
        .iter()
        .flat_map(|&lr| (0..3).map(move |s| lr * s as f64))
        .collect();
    assert_eq!(t.values(), want);
    let want_keys: Vec<_> = keys.iter().flat_map(|k| [*k; 3]).collect();
    assert_eq!(t.job_keys(), want_keys);
    assert_eq!(o.metrics().unwrap(), ["acc", "loss"]);

    let e = o.get("val_accuracy").unwrap_err().to_string();
    assert_eq!(
        e,
        "no job recorded metric `val_accuracy`; metrics that exist: acc, loss"
    );
}

#[test]
fn trace_builds_and_isolate_needs_a_folder_store() {
    // trace(true) used to be refused; it now re-checks identities (tests/identity_compiled.rs).
    let c = FakeCrate::new();
    assert!(
        Orchestrator::builder()
            .store_root(c.path().join("s"))
            .trace(true)
            .build()
            .is_ok()
    );
    // Isolated runs reopen the store in worker processes: a folder store works, a memory
    // store is refused with the reason.
    let local = || {
        puzzletron::executor::LocalExecutor::builder(c.path().join("attempts"))
            .build()
            .unwrap()
    };
    assert!(
        Orchestrator::builder()
            .store_root(c.path().join("s"))
            .executor(local())
            .isolate(true)
            .build()
            .is_ok()
    );
    let e = Orchestrator::builder()
        .store_root(c.path().join("s"))
        .isolate(true)
        .build()
        .err()
        .expect("the default in-process executor starts no processes");
    assert!(e.to_string().contains("the in-process executor"), "{e}");
    let e = Orchestrator::builder()
        .store(puzzletron::store::MemoryStore::new())
        .executor(local())
        .isolate(true)
        .build()
        .err()
        .expect("must be refused");
    assert!(
        e.to_string().contains("isolate(true) with the store at")
            && e.to_string().contains("cannot be reopened")
            && e.to_string().contains("store_root"),
        "{e}"
    );
}

#[test]
fn a_wait_for_another_holder_is_announced_once_then_taken_over() {
    use puzzletron::Event;
    use puzzletron::store::{ClaimOutcome, Owner};
    use std::sync::Arc;
    use std::time::Duration;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let waits = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&waits);
    let mut o = Orchestrator::builder()
        .store_root(c.path().join("store"))
        .lock(c.lock())
        .wait_poll(Duration::from_millis(10))
        .on_event(move |e| {
            if let Event::Waiting { holder, .. } = e {
                seen.lock().unwrap().push(holder.clone());
            }
        })
        .build()
        .unwrap();
    let key = o
        .run(
            &c.job(train),
            P {
                lr: 0.3,
                hidden: 16,
            },
        )
        .unwrap();
    // Another owner (alive: this very process) holds the run for half a second.
    let store = FsStore::open(c.path().join("store")).unwrap();
    let other = Owner::current();
    let ClaimOutcome::Claimed(claim) = store.claim(&key, &other, None).unwrap() else {
        panic!("the run was free");
    };
    // A new job folder's claim is its `mkdir` until the holder starts the run or beats: the
    // beat writes the claim file that names it.
    store.heartbeat(&claim).unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        store.release(&claim).unwrap();
    });
    let (ran, summary) = executions(|| o.drain().unwrap());
    releaser.join().unwrap();
    assert_eq!((ran, summary.ran()), (1, 1));
    let waits = waits.lock().unwrap();
    assert_eq!(
        waits.len(),
        1,
        "about 50 polls, one announcement: {waits:?}"
    );
    assert!(waits[0].contains(&format!("pid {}", std::process::id())));
}

/// A finished sweep's table is one call away, and reading it runs nothing: `recorded` for the
/// runs a sweep enqueued (enqueue order), `MetricsExt::metric_table` for every done run in a
/// store (through `&`, `Box` and `Arc` alike).
#[test]
fn a_finished_sweeps_table_is_read_without_running() {
    use puzzletron::metrics::MetricsExt;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    grid(&mut o, &c, &[0.2, 0.1]);
    o.drain().unwrap();

    let mut o = c.orchestrator();
    grid(&mut o, &c, &[0.1, 0.2, 0.3]); // 0.3 never ran
    let (n, t) = executions(|| o.recorded("loss").unwrap());
    assert_eq!(n, 0, "reading ran a job");
    assert_eq!(t.values(), [0.0, 0.1, 0.2, 0.0, 0.2, 0.4]);
    assert_eq!(
        t.column_names(),
        ["step", "value", "lr", "hidden", "job_key"]
    );
    assert_eq!(
        o.plan().unwrap().count(Action::Run),
        1,
        "the queue is untouched"
    );
    let e = o.recorded("nope").unwrap_err().to_string();
    assert!(e.contains("acc, loss"), "{e}");

    let store = FsStore::open(c.path().join("store")).unwrap();
    let (n, all) = executions(|| store.metric_table("loss").unwrap());
    assert_eq!(n, 0);
    assert_eq!(all.num_rows(), 6);
    let mut lrs = all.f64s("lr").unwrap();
    lrs.dedup();
    assert_eq!(lrs.len(), 2, "{lrs:?}");
    let arc: std::sync::Arc<dyn Store> = std::sync::Arc::new(store);
    assert_eq!(arc.metric_table("loss").unwrap().values(), all.values());
    let boxed: Box<dyn Store> = Box::new(&*arc);
    assert_eq!(boxed.metric_table("acc").unwrap().values().len(), 2);
    let e = boxed.metric_table("nope").unwrap_err().to_string();
    assert!(e.contains("acc, loss"), "{e}");
}

/// The default executor is the in-process marker, not the mock: a plain sweep's type says so.
#[test]
fn the_default_executor_is_in_process() {
    let c = FakeCrate::new();
    let o: Orchestrator<FsStore, puzzletron::executor::InProcess> = c.orchestrator();
    let _ = o;
    assert_eq!(
        puzzletron::executor::Executor::kind(&puzzletron::executor::InProcess),
        "in-process"
    );
}

/// The store's done index only shortens reading a record: a record edited or deleted behind
/// it is never reported done, and a lost or torn index is rebuilt from the record folders.
#[test]
fn the_done_index_never_outlives_its_record() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let lrs = [0.1, 0.2, 0.3];
    let mut o = c.orchestrator();
    grid(&mut o, &c, &lrs);
    let (n, _) = executions(|| o.drain().unwrap());
    assert_eq!(n, 3);
    let keys: Vec<_> = o.enqueued().iter().map(|p| p.key).collect();
    // Its short runs wrote no claim file: a folder whose record is deleted by hand looks like
    // one a claimer just made, held while a handle that may hold it lives (`FsStore` docs).
    drop(o);
    let store = FsStore::open(c.path().join("store")).unwrap();
    let idx = c.path().join("store/done.idx");
    let lines = std::fs::read_to_string(&idx).unwrap();
    assert_eq!(lines.lines().count(), 3, "one entry per done run: {lines}");

    // Run 0: the record now says failed, same attempt (an edit behind the index).
    let r0 = store.job_dir(&keys[0]).join("record.json");
    let text = std::fs::read_to_string(&r0).unwrap();
    let edited = text.replace("\"status\": \"done\"", "\"status\": \"failed\"");
    assert_ne!(edited, text);
    std::fs::write(&r0, edited).unwrap();
    // Run 1: its record is gone.
    std::fs::remove_file(store.job_dir(&keys[1]).join("record.json")).unwrap();

    let (mut o, plan) = planned(&c, &lrs);
    let actions: Vec<Action> = plan.decisions.iter().map(|d| d.action).collect();
    assert_eq!(actions, [Action::Run, Action::Run, Action::Skip], "{plan}");
    assert!(
        plan.decisions[0].reasons[0].starts_with("last attempt failed"),
        "{plan}"
    );
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.ran(), s.skipped()), (2, 2, 1));

    // The index lost, then torn mid-line: every run is still up to date, read from its folder,
    // and the index is whole again afterwards.
    std::fs::remove_file(&idx).unwrap();
    let mut o = c.orchestrator();
    grid(&mut o, &c, &lrs);
    assert_eq!(o.plan().unwrap().count(Action::Skip), 3);
    let rebuilt = std::fs::read_to_string(&idx).unwrap();
    assert_eq!(rebuilt.lines().count(), 3, "{rebuilt}");
    std::fs::write(&idx, &rebuilt[..rebuilt.len() - 40]).unwrap();
    let mut o = c.orchestrator();
    grid(&mut o, &c, &lrs);
    let (n, s) = executions(|| o.drain().unwrap());
    assert_eq!((n, s.skipped()), (0, 3));
    let healed = std::fs::read_to_string(&idx).unwrap();
    assert!(healed.ends_with('\n'), "{healed}");
    assert_eq!(healed.lines().count(), 3, "{healed}");
}

/// A revert (`git checkout` back to code whose runs are done) reuses those runs, and from then
/// on they are the current ones: the runs of the reverted edit are the superseded ones, never
/// the other way round (`sweep gc` removes what is superseded).
#[test]
fn after_a_revert_the_reused_runs_are_current_and_the_edits_superseded() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    let lrs = [0.1, 0.2, 0.3];
    let v1 = "pub fn model(x: f64) -> f64 {\n    x * 2.0\n}\n";
    let drain = |c: &FakeCrate| {
        let mut o = c.orchestrator();
        grid(&mut o, c, &lrs);
        let keys: Vec<String> = o.enqueued().iter().map(|p| p.key.to_string()).collect();
        let (n, s) = executions(|| o.drain().unwrap());
        (keys, n, s.skipped())
    };
    c.write("src/lib.rs", v1);
    let (a, n, _) = drain(&c);
    assert_eq!(n, 3);
    c.write(
        "src/lib.rs",
        "pub fn model(x: f64) -> f64 {\n    x * 5.0\n}\n",
    );
    let (b, n, _) = drain(&c);
    assert_eq!(n, 3);
    assert!(
        a.iter().all(|k| !b.contains(k)),
        "an edit changes every key"
    );
    c.write("src/lib.rs", v1);
    let (again, n, skipped) = drain(&c);
    assert_eq!(
        (again.clone(), n, skipped),
        (a.clone(), 0, 3),
        "the revert reuses every run"
    );
    let store = FsStore::open(c.path().join("store")).unwrap();
    let h = puzzletron::report::SweepHistory::load(&store).unwrap();
    let superseded: Vec<&str> = {
        let mut v: Vec<&str> = h
            .runs
            .iter()
            .filter(|r| r.superseded)
            .map(|r| r.key.as_str())
            .collect();
        v.sort_unstable();
        v
    };
    let mut want: Vec<&str> = b.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(
        superseded, want,
        "the reverted edit's runs, not the current ones"
    );
    let st = puzzletron::report::SweepStatus::scan(&store).unwrap();
    assert_eq!((st.runs, st.superseded), (h.runs.len(), want.len()));
    assert_eq!(st.counts[0], ("done".to_string(), 6));
}

/// Where `watch` finds the store (set by the test that runs it, under `SERIAL`).
static WATCHED: Mutex<Option<std::path::PathBuf>> = Mutex::new(None);

/// `hidden == 1`: waits (up to 20 s) until its own record reads as running, and fails if it
/// never does; `hidden == 2`: fails at once; otherwise returns at once.
fn watch(p: &P, run: &mut Run) -> JobResult {
    run.log("loss", 0, p.lr)?;
    if p.hidden == 2 {
        return Err("fails on purpose".into());
    }
    if p.hidden == 1 {
        let root = WATCHED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let store = FsStore::open(root.ok_or("no store root")?)?;
        let t = std::time::Instant::now();
        loop {
            let status = store.record(&run.key())?.map(|r| r.status);
            if status == Some(puzzletron::store::Status::Running) {
                break;
            }
            if t.elapsed() > std::time::Duration::from_secs(20) {
                return Err(format!("never read as running: {status:?}").into());
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
    Ok(())
}

/// A drain's committers write each run's start while it runs: a run that lasts reads as
/// running from the store meanwhile, a trivial one may be over first and have only its done
/// record; either way, and for a failed run, the run's lineage names its key afterwards.
#[test]
fn a_run_reads_as_running_while_it_lasts_and_every_run_points_its_lineage() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let c = FakeCrate::new();
    *WATCHED.lock().unwrap() = Some(c.path().join("store"));
    let mut o = c.orchestrator();
    let job = c.job(watch);
    // Trivial runs around two that wait to be seen running, then one that fails.
    let mut hidden = vec![0; 40];
    hidden[5] = 1;
    hidden[30] = 1;
    hidden.push(2);
    for (i, &h) in hidden.iter().enumerate() {
        o.run(
            &job,
            P {
                lr: i as f64,
                hidden: h,
            },
        )
        .unwrap();
    }
    let failed = o.drain().unwrap_err();
    let s = &failed.summary;
    assert_eq!((s.ran(), s.failed()), (40, 1), "{}", s.report());
    let store = FsStore::open(c.path().join("store")).unwrap();
    for (i, p) in o.enqueued().iter().enumerate() {
        let rec = store.record(&p.key).unwrap().expect("a record per run");
        let want = if i == 40 {
            puzzletron::store::Status::Failed
        } else {
            puzzletron::store::Status::Done
        };
        assert_eq!(rec.status, want, "run {i}");
        assert_eq!(
            store.lineage(&rec.lineage).unwrap(),
            Some(p.key),
            "run {i}: its lineage names it"
        );
        assert!(store.claim_info(&p.key).unwrap().is_none(), "run {i}");
    }
}
