//! Isolated sweep runs: each job in a worker process of this very binary.
//!
//! A `harness = false` test: like a user's program, `main` calls
//! `puzzletron::worker::main_guard()` first, so the same binary serves as parent, worker and
//! (for the crash trial) as a controller that gets killed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use puzzletron::executor::{JobState, LocalExecutor};
#[cfg(feature = "slurm")]
use puzzletron::executor::{PollPolicy, SchedulerRetry, SlurmExecutor};
use puzzletron::{FailureCause, JobResult, Outcome, Run};
use puzzletron::{Orchestrator, job, store::Store};
use serde::{Deserialize, Serialize};

mod support;
use support::watchdog;

#[cfg(feature = "slurm")]
use support::slurm::{cluster_available, write_shims};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct P {
    x: i64,
    mode: String,
    sleep_ms: u64,
}

fn work(p: &P, run: &mut Run) -> JobResult {
    if let Some(dir) = run.artifact_dir() {
        std::fs::create_dir_all(dir)?;
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("runs"))?;
        writeln!(f, "pid {}", std::process::id())?;
    }
    std::thread::sleep(Duration::from_millis(p.sleep_ms));
    if p.mode == "gate" {
        // Waits, logging, for the gate file in the store's folder (`ROOT/jobs/KEY/artifacts`
        // is the artifact folder): a run that a cancel interrupts.
        let gate = run
            .artifact_dir()
            .and_then(|d| d.ancestors().nth(3))
            .map(|r| r.join("gate"))
            .expect("an FsStore run");
        let mut step = 100;
        while !gate.exists() {
            run.log("wait", step, 0.0)?;
            step += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    match p.mode.as_str() {
        "panic" => panic!("job {} panics on purpose", p.x),
        "abort" => std::process::abort(),
        "kill" => unsafe {
            libc::raise(libc::SIGKILL);
        },
        // A SIGTERM from outside the drain (a walltime, a preemption): the worker tells the
        // job, which stops at its next `log`.
        "term" => {
            unsafe {
                libc::raise(libc::SIGTERM);
            }
            while !run.is_cancelled() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        "error" => return Err(format!("job {} returns an error", p.x).into()),
        _ => {}
    }
    for step in 0..3 {
        run.log("y", step, (p.x * p.x + step) as f64)?;
    }
    Ok(())
}

fn params(x: i64, mode: &str, sleep_ms: u64) -> P {
    P {
        x,
        mode: mode.into(),
        sleep_ms,
    }
}

fn local(root: &Path, n: usize) -> LocalExecutor {
    LocalExecutor::builder(root.join("attempts"))
        .max_concurrent(n)
        .build()
        .expect("local executor")
}

type Table = Vec<(i64, f64, String)>;

fn table(
    o: &mut Orchestrator<puzzletron::store::FsStore, impl puzzletron::executor::Executor>,
) -> Table {
    let t = o.get("y").expect("get y");
    let keys = t.job_keys();
    t.steps()
        .into_iter()
        .zip(t.values())
        .zip(keys)
        .map(|((s, v), k)| (s, v, k.to_string()))
        .collect()
}

/// A user store: an `FsStore` under another kind, that notes in its folder which process
/// opened it through the registered opener (so the test sees workers used that opener).
struct Tagged(puzzletron::store::FsStore, PathBuf, &'static str);

const TAGGED: &str = "tagged";

fn open_tagged(location: &str) -> Result<Box<dyn Store>, puzzletron::store::StoreError> {
    let root = PathBuf::from(location);
    let store = puzzletron::store::FsStore::create(&root)?;
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("opened-by"))
        .map_err(|e| puzzletron::store::StoreError::Io {
            path: root.join("opened-by"),
            source: e,
        })?;
    let _ = writeln!(f, "pid {}", std::process::id());
    Ok(Box::new(Tagged(store, root, TAGGED)))
}

impl Store for Tagged {
    fn location(&self) -> String {
        self.0.location()
    }
    fn record(
        &self,
        key: &puzzletron::identity::Hash,
    ) -> StoreResult<Option<puzzletron::store::JobRecord>> {
        self.0.record(key)
    }
    fn keys(&self) -> StoreResult<Vec<puzzletron::identity::Hash>> {
        self.0.keys()
    }
    fn lineage(
        &self,
        l: &puzzletron::identity::Hash,
    ) -> StoreResult<Option<puzzletron::identity::Hash>> {
        self.0.lineage(l)
    }
    fn set_lineage(
        &self,
        l: &puzzletron::identity::Hash,
        k: &puzzletron::identity::Hash,
    ) -> StoreResult<()> {
        self.0.set_lineage(l, k)
    }
    fn claim_info(
        &self,
        key: &puzzletron::identity::Hash,
    ) -> StoreResult<Option<puzzletron::store::ClaimInfo>> {
        self.0.claim_info(key)
    }
    fn claim(
        &self,
        key: &puzzletron::identity::Hash,
        owner: &puzzletron::store::Owner,
        replace_done: Option<u32>,
    ) -> StoreResult<puzzletron::store::ClaimOutcome> {
        self.0.claim(key, owner, replace_done)
    }
    fn start(
        &self,
        claim: &puzzletron::store::Claim,
        record: &puzzletron::store::JobRecord,
    ) -> StoreResult<()> {
        self.0.start(claim, record)
    }
    fn metric_sink(
        &self,
        claim: &puzzletron::store::Claim,
    ) -> StoreResult<Box<dyn puzzletron::store::MetricSink>> {
        self.0.metric_sink(claim)
    }
    fn finish(
        &self,
        claim: &puzzletron::store::Claim,
        record: &puzzletron::store::JobRecord,
    ) -> StoreResult<()> {
        self.0.finish(claim, record)
    }
    fn release(&self, claim: &puzzletron::store::Claim) -> StoreResult<()> {
        self.0.release(claim)
    }
    fn heartbeat(&self, claim: &puzzletron::store::Claim) -> StoreResult<()> {
        self.0.heartbeat(claim)
    }
    fn metrics(
        &self,
        key: &puzzletron::identity::Hash,
        name: Option<&str>,
    ) -> StoreResult<puzzletron::store::Series> {
        self.0.metrics(key, name)
    }
    fn job_files(&self) -> Option<&dyn puzzletron::store::JobFiles> {
        self.0.job_files()
    }
    fn spec(&self) -> Option<puzzletron::store::StoreSpec> {
        Some(puzzletron::store::StoreSpec::new(
            self.2,
            self.1.display().to_string(),
        ))
    }
}

type StoreResult<T> = Result<T, puzzletron::store::StoreError>;

/// Isolated runs over a user store: workers reopen it through the opener registered with
/// `main_guard_with`, not as a bare FsStore; a store no worker can reopen is refused at build.
fn user_store_isolated(base: &Path) {
    std::fs::create_dir_all(base).unwrap();
    let root = base.join("tagged");
    let store = open_tagged(root.to_str().unwrap()).unwrap();
    // Behind an Arc: the forwarding impls make `Arc<dyn Store>` a store too.
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::from(store);
    let mut o = Orchestrator::builder()
        .store(store)
        .executor(local(base, 3))
        .isolate(true)
        .worker_dir(base.join("tasks"))
        .build()
        .unwrap();
    let j = job!(work);
    for x in [7, 8, 9] {
        o.run(&j, params(x, "ok", 0)).unwrap();
    }
    let s = o
        .drain()
        .unwrap_or_else(|f| panic!("isolated drain failed: {f}"));
    assert_eq!(s.ran(), 3, "{}", s.report());
    let t = o.recorded("y").unwrap();
    assert_eq!(
        t.values(),
        [49.0, 50.0, 51.0, 64.0, 65.0, 66.0, 81.0, 82.0, 83.0]
    );
    let opened = std::fs::read_to_string(root.join("opened-by")).unwrap();
    let me = format!("pid {}", std::process::id());
    let workers: Vec<&str> = opened.lines().filter(|l| *l != me).collect();
    assert_eq!(
        workers.len(),
        3,
        "each worker opens the store once: {opened}"
    );
    // Task files went to the worker_dir, not into the store.
    assert!(std::fs::read_dir(base.join("tasks")).unwrap().count() >= 1);
    assert!(!root.join("isolated").exists());

    // A kind no opener was registered for is refused when the sweep is built.
    let other = Tagged(
        puzzletron::store::FsStore::create(base.join("other")).unwrap(),
        base.join("other"),
        "unknown-kind",
    );
    let boxed: Box<dyn Store> = Box::new(other);
    let err = Orchestrator::builder()
        .store(boxed)
        .executor(local(base, 1))
        .isolate(true)
        .worker_dir(base.join("tasks"))
        .build()
        .err()
        .expect("an unregistered store kind must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("\"unknown-kind\"") && msg.contains("main_guard_with"),
        "{msg}"
    );
    // A memory store cannot be reopened at all.
    let err = Orchestrator::builder()
        .store(puzzletron::store::MemoryStore::new())
        .executor(local(base, 1))
        .isolate(true)
        .build()
        .err()
        .expect("a memory store must be refused");
    assert!(err.to_string().contains("cannot be reopened"), "{err}");
    println!("ok - user_store_isolated");
}

/// Drains from inside tokio runtimes: the blocking drain (isolated: it used to panic with
/// "Cannot start a runtime from within a runtime"), `drain_async` isolated and in process, on
/// both runtime flavors; each gives the same table as a plain in-process drain.
fn async_drivers(base: &Path) {
    let j = job!(work);
    let xs = [2, 3];
    let want: Vec<f64> = xs
        .iter()
        .flat_map(|x| (0..3).map(move |s| (x * x + s) as f64))
        .collect();
    let iso = |name: &str| {
        let mut o = Orchestrator::builder()
            .store_root(base.join(name))
            .executor(local(&base.join(format!("{name}-exec")), 2))
            .isolate(true)
            .build()
            .unwrap();
        for x in xs {
            o.run(&j, params(x, "ok", 0)).unwrap();
        }
        o
    };
    let inproc = |name: &str| {
        let mut o = Orchestrator::builder()
            .store_root(base.join(name))
            .build()
            .unwrap();
        for x in xs {
            o.run(&j, params(x, "ok", 0)).unwrap();
        }
        o
    };
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for (flavor, rt) in [("multi-thread", &multi), ("current-thread", &single)] {
        // The blocking drain inside the runtime.
        let mut o = iso(&format!("blocking-{flavor}"));
        let s = rt
            .block_on(async { o.drain() })
            .unwrap_or_else(|f| panic!("{flavor}: {f}"));
        assert_eq!(s.ran(), 2, "{flavor}: {}", s.report());
        assert_eq!(o.recorded("y").unwrap().values(), want, "{flavor}");
        // The async drain, isolated: another task keeps running meanwhile.
        let mut o = iso(&format!("async-{flavor}"));
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t2 = ticks.clone();
        let s = rt
            .block_on(async {
                let ticker = tokio::spawn(async move {
                    loop {
                        t2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                });
                let s = o.drain_async().await;
                ticker.abort();
                s
            })
            .unwrap_or_else(|f| panic!("{flavor}: {f}"));
        assert_eq!(s.ran(), 2, "{flavor}: {}", s.report());
        assert!(
            ticks.load(std::sync::atomic::Ordering::Relaxed) > 1,
            "{flavor}: the async isolated drain blocked the runtime"
        );
        let t = rt.block_on(o.get_async("y")).unwrap();
        assert_eq!(t.values(), want, "{flavor}");
        // The async drain, in process.
        let mut o = inproc(&format!("inproc-{flavor}"));
        let s = rt
            .block_on(o.drain_async())
            .unwrap_or_else(|f| panic!("{flavor}: {f}"));
        assert_eq!(s.ran(), 2, "{flavor}: {}", s.report());
        assert_eq!(o.recorded("y").unwrap().values(), want, "{flavor}");
    }
    println!("ok - async_drivers");
}

/// Isolated (4 at a time) equals in-process, metric for metric.
fn isolated_equals_in_process(base: &Path) {
    let xs = [1, 2, 3, 4, 5, 6];
    let mut inproc = Orchestrator::builder()
        .store_root(base.join("inproc"))
        .build()
        .unwrap();
    let mut iso = Orchestrator::builder()
        .store_root(base.join("iso"))
        .executor(local(base, 4))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in xs {
        inproc.run(&j, params(x, "ok", 0)).unwrap();
        iso.run(&j, params(x, "ok", 0)).unwrap();
    }
    let s = iso
        .drain()
        .unwrap_or_else(|f| panic!("isolated drain failed: {f}"));
    assert_eq!(s.ran(), 6, "{}", s.report());
    let a = table(&mut inproc);
    let b = table(&mut iso);
    assert_eq!(a.len(), 18);
    assert_eq!(a, b, "isolated results differ from in-process ones");
    // In process too, the job got its artifact folder when it asked for it.
    for p in inproc.enqueued() {
        let runs = inproc.artifact_dir(&p.key).unwrap().join("runs");
        assert!(runs.is_file(), "{} missing", runs.display());
    }
    // Each run in its own worker process, none in the parent.
    let me = format!("pid {}", std::process::id());
    for p in iso.enqueued() {
        let runs = std::fs::read_to_string(iso.artifact_dir(&p.key).unwrap().join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 1, "{runs}");
        assert_ne!(runs.trim(), me, "ran in the parent");
    }
    // The batch's runs of one job share one file with the owned digest and the witnesses;
    // the task files hold only what differs per run.
    let batches: Vec<PathBuf> = std::fs::read_dir(base.join("iso/isolated"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(batches.len(), 1, "{batches:?}");
    let mut shared = 0;
    let mut tasks = 0;
    for e in std::fs::read_dir(&batches[0]).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let len = e.metadata().unwrap().len();
        if name.starts_with("shared-") {
            shared += 1;
            let text = std::fs::read_to_string(e.path()).unwrap();
            assert!(
                text.contains("\"owned\"") && text.contains("\"witnesses\""),
                "{text}"
            );
        } else if name != "manifest.json" {
            tasks += 1;
            let text = std::fs::read_to_string(e.path()).unwrap();
            assert!(
                !text.contains("\"owned\""),
                "{name} carries the owned digest"
            );
            assert!(len < 2048, "{name} is {len} bytes");
        }
    }
    assert_eq!((shared, tasks), (1, 6));
    // Again: nothing runs.
    for x in xs {
        iso.run(&j, params(x, "ok", 0)).unwrap();
    }
    let s = iso.drain().unwrap();
    assert_eq!((s.ran(), s.skipped()), (0, 6), "{}", s.report());
    println!("ok - isolated_equals_in_process");
}

/// A panic, an error, an abort and a SIGKILL each fail their own run only.
fn crashes_fail_only_their_run(base: &Path) {
    let mut iso = Orchestrator::builder()
        .store_root(base.join("crash"))
        .executor(local(base, 3))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    let modes = ["ok", "panic", "ok", "error", "abort", "kill", "ok", "term"];
    for (x, m) in modes.iter().enumerate() {
        iso.run(&j, params(x as i64, m, 0)).unwrap();
    }
    let failed = iso.drain().expect_err("some runs fail");
    let jobs = &failed.summary.jobs;
    let kinds: Vec<String> = jobs
        .iter()
        .map(|j| match &j.outcome {
            Outcome::Ran { .. } => "ran".to_string(),
            Outcome::Failed { failure } => format!("{}: {}", failure.kind, failure.message),
            other => format!("{other:?}"),
        })
        .collect();
    assert!(
        kinds[0] == "ran" && kinds[2] == "ran" && kinds[6] == "ran",
        "{kinds:#?}"
    );
    assert!(
        kinds[1].starts_with("panic: job 1 panics on purpose"),
        "{}",
        kinds[1]
    );
    assert!(
        kinds[3].starts_with("error: job 3 returns an error"),
        "{}",
        kinds[3]
    );
    assert!(
        kinds[4].starts_with("crash:") && kinds[4].contains("signal Some(6)"),
        "{}",
        kinds[4]
    );
    assert!(
        kinds[5].starts_with("crash:")
            && kinds[5].contains(&JobState::Killed { signal: 9 }.to_string()),
        "{}",
        kinds[5]
    );
    // Stopped by a signal from outside the drain: a failure with the evidence, not a
    // cancelled drain.
    assert!(
        kinds[7].starts_with("crash:")
            && kinds[7].contains("after a SIGTERM or SIGINT from outside this drain"),
        "{}",
        kinds[7]
    );
    // The drain names the first failure (enqueue order).
    match &failed.cause {
        FailureCause::Job { failure, .. } => assert_eq!(failure.kind, "panic"),
        other => panic!("{other:?}"),
    }
    // The store has the crash recorded for the next drain to retry.
    let rec = iso.store().record(&jobs[5].run.key).unwrap().unwrap();
    assert_eq!(rec.status, puzzletron::store::Status::Failed);
    println!("ok - crashes_fail_only_their_run");
}

/// Isolated drains degrade per run too: a corrupt record is left alone and named while the
/// other runs run in workers; `repair(true)` moves it aside and a worker runs it again.
fn corrupt_record_isolated(base: &Path) {
    let root = base.join("store");
    let sweep = |repair: bool| {
        let mut o = Orchestrator::builder()
            .store_root(&root)
            .executor(local(base, 2))
            .isolate(true)
            .repair(repair)
            .build()
            .unwrap();
        for x in 0..4 {
            o.run(&job!(work), params(x, "ok", 0)).unwrap();
        }
        o
    };
    let mut o = sweep(false);
    assert_eq!(o.drain().unwrap().ran(), 4);
    let bad = o.enqueued()[1].key;
    let file = root.join("jobs").join(bad.to_hex()).join("record.json");
    std::fs::write(&file, b"{ truncated").unwrap();
    // A run with no record yet, which must still run in a worker.
    let other = o.enqueued()[2].key;
    std::fs::remove_dir_all(root.join("jobs").join(other.to_hex())).unwrap();
    let mut o = sweep(false);
    let failed = o.drain().unwrap_err();
    let s = &failed.summary;
    assert_eq!(
        (s.ran(), s.skipped(), s.corrupt()),
        (1, 2, 1),
        "{}",
        s.report()
    );
    assert!(
        matches!(&failed.cause, FailureCause::Corrupt { keys } if keys == &[bad]),
        "{failed}"
    );
    assert!(
        failed.to_string().contains(&file.display().to_string()),
        "{failed}"
    );
    let mut o = sweep(true);
    let s = o.drain().unwrap();
    assert_eq!((s.ran(), s.skipped()), (1, 3), "{}", s.report());
    let rec = o.store().record(&bad).unwrap().unwrap();
    assert_eq!(rec.status, puzzletron::store::Status::Done);
    assert_eq!(
        std::fs::read_dir(root.join("corrupt")).unwrap().count(),
        1,
        "moved aside, kept"
    );
    println!("ok - corrupt_record_isolated");
}

/// How many runs of the store at `root` have started (each appends to its `runs` file).
fn started(root: &Path) -> usize {
    std::fs::read_dir(root.join("jobs"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.path().join("artifacts/runs").exists())
                .count()
        })
        .unwrap_or(0)
}

/// Waits (the watchdog ends a hang) until `f` holds.
fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every run of `o` was interrupted: a running record (no failure), nobody holds it, and the
/// next drain runs it again because it was interrupted; then, with the gate open, they run.
fn assert_all_interrupted_then_run(
    root: &Path,
    o: &mut Orchestrator<puzzletron::store::FsStore, LocalExecutor>,
) {
    let store = puzzletron::store::FsStore::open(root).unwrap();
    for p in o.enqueued() {
        wait_for("the worker released its claim", || {
            store.claim_info(&p.key).unwrap().is_none_or(|c| !c.live)
        });
        let rec = store.record(&p.key).unwrap().expect("a record");
        assert_eq!(
            rec.status,
            puzzletron::store::Status::Running,
            "interrupted, never failed: {:?}",
            rec.error
        );
        let d = o.decide(p).unwrap();
        assert!(
            d.reasons[0].starts_with("interrupted: attempt 1 by "),
            "{d}"
        );
    }
    std::fs::write(root.join("gate"), b"").unwrap();
    let s = o.drain().unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(s.ran(), o.enqueued().len(), "{}", s.report());
}

/// `tokio::time::timeout` around an isolated `drain_async`: the workers are cancelled through
/// the executor (SIGTERM), each job hears of it at its next `log`, and each worker records its
/// run as interrupted (exit 4), never failed. Before, the workers outlived the dropped future.
fn cancel_isolated_async(base: &Path) {
    let root = base.join("store");
    let mut o = Orchestrator::builder()
        .store_root(&root)
        .executor(local(&base.join("exec"), 2))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in [1, 2] {
        o.run(&j, params(x, "gate", 0)).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let drain = o.drain_async();
        tokio::pin!(drain);
        tokio::select! {
            r = &mut drain => panic!("the drain ended by itself: {r:?}"),
            _ = async {
                while started(&root) < 2 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            } => {}
        }
        let r = tokio::time::timeout(Duration::from_millis(100), drain).await;
        assert!(r.is_err(), "gated workers cannot finish the drain");
    });
    assert_all_interrupted_then_run(&root, &mut o);
    println!("ok - cancel_isolated_async");
}

const SIGINT_ROLE_ENV: &str = "PT_ISOLATED_SIGINT_ROLE";

/// The parent of `sigint_cancels_an_isolated_drain`: a blocking isolated drain.
fn sigint_role(base: &Path) {
    // As in a program started from a shell (a test run in the background of a
    // non-interactive shell inherits SIGINT ignored, which a drain leaves alone).
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
    let mut o = Orchestrator::builder()
        .store_root(base.join("store"))
        .executor(local(&base.join("exec"), 2))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in [1, 2] {
        o.run(&j, params(x, "gate", 0)).unwrap();
    }
    match o.drain() {
        Err(f) => println!(
            "ROLE cancelled={} interrupted={} failed={}",
            matches!(f.cause, FailureCause::Cancelled),
            f.summary.interrupted(),
            f.summary.failed()
        ),
        Ok(s) => println!("ROLE finished: {}", s.report()),
    }
    std::process::exit(0);
}

/// Ctrl-C (a real SIGINT) to a process in a blocking isolated `drain()`: local workers run
/// in sessions of their own, so the terminal's signal does not reach them; the drain cancels
/// them through the executor and they record their runs as interrupted.
fn sigint_cancels_an_isolated_drain(base: &Path) {
    let root = base.join("store");
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(SIGINT_ROLE_ENV, base)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("both workers start", || started(&root) == 2);
    let pid = i32::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ROLE cancelled=true interrupted=2 failed=0"),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut o = Orchestrator::builder()
        .store_root(&root)
        .executor(local(&base.join("exec"), 2))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in [1, 2] {
        o.run(&j, params(x, "gate", 0)).unwrap();
    }
    assert_all_interrupted_then_run(&root, &mut o);
    println!("ok - sigint_cancels_an_isolated_drain");
}

const ROLE_ENV: &str = "PT_ISOLATED_TEST_ROLE";

/// The controller of `killed_parent_loses_nothing`, run in a child process and killed.
fn parent_role(base: &Path) {
    let mut iso = Orchestrator::builder()
        .store_root(base.join("restart"))
        .executor(local(base, 4))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in 0..4 {
        iso.run(&j, params(x, "ok", 1500)).unwrap();
    }
    let _ = iso.drain();
    std::process::exit(0);
}

/// Kill -9 the orchestrator while isolated workers run; a restarted one picks up their results
/// without running them again.
fn killed_parent_loses_nothing(base: &Path) {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(ROLE_ENV, base)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the four workers have started (each appends to its `runs` file).
    let jobs_dir = base.join("restart").join("jobs");
    let t = Instant::now();
    loop {
        let started = std::fs::read_dir(&jobs_dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().join("artifacts/runs").exists())
                    .count()
            })
            .unwrap_or(0);
        if started == 4 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "workers never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let mut again = Orchestrator::builder()
        .store_root(base.join("restart"))
        .executor(local(base, 4))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in 0..4 {
        again.run(&j, params(x, "ok", 1500)).unwrap();
    }
    let s = again.drain().unwrap_or_else(|f| panic!("{f}"));
    assert_eq!((s.ran(), s.skipped()), (0, 4), "{}", s.report());
    for p in again.enqueued() {
        let runs =
            std::fs::read_to_string(again.artifact_dir(&p.key).unwrap().join("runs")).unwrap();
        assert_eq!(runs.lines().count(), 1, "ran twice: {runs}");
    }
    assert_eq!(table(&mut again).len(), 12);
    println!("ok - killed_parent_loses_nothing");
}

#[cfg(feature = "slurm")]
fn slurm(base: &Path, bin: Option<&Path>, retry_tries: u32) -> SlurmExecutor {
    let mut b = SlurmExecutor::builder(base.join("slurm-logs"))
        .poll_policy(
            PollPolicy::default()
                .with_intervals(Duration::from_millis(250), Duration::from_secs(2))
                .with_missing_grace(Duration::from_secs(120)),
        )
        .retry_policy(
            SchedulerRetry::default()
                .with_max_tries(retry_tries)
                .with_base_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_millis(500)),
        );
    if let Some(bin) = bin {
        b = b.bin_dir(bin);
    }
    b.build().unwrap()
}

#[cfg(feature = "slurm")]
/// The sweep isolated on Slurm (one job array) equals the in-process result.
fn slurm_isolated_equals_in_process(base: &Path) {
    if !cfg!(puzzletron_slurm_tests) {
        println!(
            "ignored - slurm_isolated_equals_in_process (needs the local Slurm cluster: start it and set \
             PUZZLETRON_SLURM_TESTS=1)"
        );
        return;
    }
    if !cluster_available("slurm_isolated_equals_in_process") {
        return;
    }
    let mut inproc = Orchestrator::builder()
        .store_root(base.join("inproc"))
        .build()
        .unwrap();
    let mut iso = Orchestrator::builder()
        .store_root(base.join("iso"))
        .executor(slurm(base, None, 8))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in 1..=6 {
        inproc.run(&j, params(x, "ok", 0)).unwrap();
        iso.run(&j, params(x, "ok", 0)).unwrap();
    }
    let s = iso
        .drain()
        .unwrap_or_else(|f| panic!("isolated Slurm drain failed: {f}"));
    assert_eq!(s.ran(), 6, "{}", s.report());
    assert_eq!(table(&mut inproc), table(&mut iso));
    println!("ok - slurm_isolated_equals_in_process");
}

#[cfg(feature = "slurm")]
/// Shims fail sbatch/squeue/sacct 30% of the time: a sweep of 50 isolated runs still
/// completes, with exactly 50 array tasks (one array) in sacct.
fn slurm_fault_injection_50_isolated(base: &Path) {
    if !cfg!(puzzletron_slurm_tests) {
        println!(
            "ignored - slurm_fault_injection_50_isolated (needs the local Slurm cluster: start it and set \
             PUZZLETRON_SLURM_TESTS=1)"
        );
        return;
    }
    if !cluster_available("slurm_fault_injection_50_isolated") {
        return;
    }
    std::fs::create_dir_all(base).unwrap();
    let bin = write_shims(base, 30);
    let mut iso = Orchestrator::builder()
        .store_root(base.join("store"))
        .executor(slurm(base, Some(&bin), 12))
        .isolate(true)
        .build()
        .unwrap();
    let j = job!(work);
    for x in 0..50 {
        iso.run(&j, params(x, "ok", 0)).unwrap();
    }
    let s = iso
        .drain()
        .unwrap_or_else(|f| panic!("drain under faults failed: {f}"));
    assert_eq!(s.ran(), 50, "{}", s.report());
    // The array's job name is the batch's attempt id: sweep-<stamp>.
    let stamp = std::fs::read_dir(base.join("store/isolated"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name()
        .into_string()
        .unwrap();
    let name = format!("sweep-{stamp}");
    let count = || {
        let out = std::process::Command::new("sacct")
            .args([
                "-n",
                "-X",
                "-P",
                "-S",
                "now-1hour",
                "-o",
                "JobID,JobName%80",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('|'))
            .filter(|(_, n)| n.trim() == name)
            .map(|(id, _)| id.to_string())
            .collect::<Vec<_>>()
    };
    let t = Instant::now();
    while count().len() < 50 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(2));
    let ids = count();
    let log = std::fs::read_to_string(base.join("calls.log")).unwrap_or_default();
    let fails = log.lines().filter(|l| l.contains("FAIL")).count();
    println!(
        "# fault injection: {fails} injected failures; {} array tasks named {name} in sacct",
        ids.len()
    );
    assert_eq!(ids.len(), 50, "{ids:?}");
    let bases: std::collections::BTreeSet<&str> =
        ids.iter().map(|i| i.split('_').next().unwrap()).collect();
    assert_eq!(
        bases.len(),
        1,
        "more than one array was submitted: {bases:?}"
    );
    println!("ok - slurm_fault_injection_50_isolated");
}

fn main() {
    puzzletron::worker::main_guard_with(&[(TAGGED, open_tagged)]);
    if let Some(base) = std::env::var_os(ROLE_ENV) {
        parent_role(&PathBuf::from(base));
    }
    if let Some(base) = std::env::var_os(SIGINT_ROLE_ENV) {
        sigint_role(&PathBuf::from(base));
    }
    let _watchdog = watchdog::Watchdog::start("sweep_isolated", Duration::from_secs(900));
    let tmp = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    isolated_equals_in_process(&tmp.path().join("a"));
    crashes_fail_only_their_run(&tmp.path().join("b"));
    killed_parent_loses_nothing(&tmp.path().join("c"));
    user_store_isolated(&tmp.path().join("f"));
    async_drivers(&tmp.path().join("g"));
    cancel_isolated_async(&tmp.path().join("h"));
    sigint_cancels_an_isolated_drain(&tmp.path().join("i"));
    corrupt_record_isolated(&tmp.path().join("j"));
    // Slurm: the "compute nodes" are this machine, so a folder under /tmp is shared.
    #[cfg(feature = "slurm")]
    {
        slurm_isolated_equals_in_process(&tmp.path().join("d"));
        slurm_fault_injection_50_isolated(&tmp.path().join("e"));
    }
    println!("all passed in {:.1} s", t0.elapsed().as_secs_f64());
}
