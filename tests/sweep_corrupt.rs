//! A store degrades per run, never per sweep: a record that cannot be parsed (truncated,
//! emptied, garbage, JSON that is no record) makes that run `corrupt`, named with its file and
//! the fix in `plan()`, the drain's events, summary and error, and `sweep status`; the other
//! runs plan, drain and report as usual. `repair(true)` (or `puzzletron sweep repair`) moves
//! the bad record aside, never deleting it, and the run runs again. A run without a record
//! says `no record`, its nearest neighbour only as a hint.

mod support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use puzzletron::store::SetAside;
use puzzletron::{Action, FailureCause, Outcome};
use puzzletron::{Orchestrator, identity::Hash, metrics::MetricsExt, store::FsStore, store::Store};
use support::sweep::{FakeCrate, P, train};

/// The 9 runs of the grid.
fn grid() -> Vec<P> {
    let mut v = Vec::new();
    for lr in [0.1, 0.2, 0.3] {
        for hidden in [16, 32, 64] {
            v.push(P { lr, hidden });
        }
    }
    v
}

fn sweep(c: &FakeCrate, repair: bool, events: Option<Arc<Mutex<Vec<String>>>>) -> Orchestrator {
    let mut b = Orchestrator::builder()
        .store_root(c.path().join("store"))
        .lock(c.lock())
        .repair(repair);
    if let Some(ev) = events {
        b = b.on_event(move |e| ev.lock().unwrap().push(e.to_string()));
    }
    let mut o = b.build().unwrap();
    for p in grid() {
        o.run(&c.job(train), p).unwrap();
    }
    o
}

fn record_file(c: &FakeCrate, key: &Hash) -> PathBuf {
    c.path()
        .join("store/jobs")
        .join(key.to_hex())
        .join("record.json")
}

/// The ways a record is found broken.
fn break_record(path: &Path, how: &str) {
    let bytes = std::fs::read(path).unwrap();
    match how {
        // A cut write, a full disk: the first half.
        "truncated" => std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap(),
        // `: > record.json`: the done record's own inode emptied (not what a crash leaves).
        "emptied" => {
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(path)
                .unwrap();
        }
        "garbage" => std::fs::write(path, b"\x7fELF\x02\x01garbage{{{").unwrap(),
        "not a record" => std::fs::write(path, br#"{"format": 1, "hello": "world"}"#).unwrap(),
        _ => unreachable!(),
    }
}

#[test]
fn one_corrupt_record_of_nine_is_named_everywhere_and_the_rest_of_the_sweep_goes_on() {
    for how in ["truncated", "emptied", "garbage", "not a record"] {
        let c = FakeCrate::new();
        let mut o = sweep(&c, false, None);
        assert_eq!(o.drain().unwrap().ran(), 9, "{how}");
        let bad = o.enqueued()[4].key;
        let file = record_file(&c, &bad);
        break_record(&file, how);
        let broken = std::fs::read(&file).unwrap();
        let name = file.display().to_string();

        // plan: 8 up to date, 1 corrupt, named with its file and the fix.
        let events: Arc<Mutex<Vec<String>>> = Arc::default();
        let mut o = sweep(&c, false, Some(events.clone()));
        // And a new run after it, which must still run.
        o.run(
            &c.job(train),
            P {
                lr: 0.9,
                hidden: 64,
            },
        )
        .unwrap();
        let plan = o.plan().unwrap();
        assert_eq!(plan.count(Action::Skip), 8, "{how}: {plan}");
        assert_eq!(plan.count(Action::Corrupt), 1, "{how}: {plan}");
        assert_eq!(plan.count(Action::Run), 1, "{how}: {plan}");
        let d = plan.decisions.iter().find(|d| d.run.key == bad).unwrap();
        assert_eq!(d.action, Action::Corrupt, "{how}");
        let why = d.reasons.join("; ");
        assert!(
            why.contains(&name) && why.contains("repair(true)") && why.contains("sweep repair"),
            "{how}: the file and the fix: {why}"
        );
        let text = plan.to_string();
        assert!(
            text.contains("corrupt") && text.contains("1 corrupt"),
            "{text}"
        );
        // The single decision says the same.
        assert_eq!(o.decide(&o.queued()[4]).unwrap().action, Action::Corrupt);

        // drain: the others skip or run; the corrupt one is left alone and named at the end.
        let failed = o.drain().unwrap_err();
        let s = &failed.summary;
        assert_eq!(
            (s.skipped(), s.ran(), s.corrupt(), s.failed(), s.pending()),
            (8, 1, 1, 0, 0),
            "{how}: {}",
            s.report()
        );
        let FailureCause::Corrupt { keys } = &failed.cause else {
            panic!("{how}: {failed}");
        };
        assert_eq!(keys, &[bad]);
        assert!(!failed.is_retryable());
        let msg = failed.to_string();
        assert!(
            msg.contains(&name) && msg.contains("left alone") && msg.contains("1 corrupt"),
            "{how}: {msg}"
        );
        assert!(s.report().contains("CORR"), "{}", s.report());
        let ev = events.lock().unwrap().clone();
        assert!(
            ev.iter().any(|e| e.contains("CORR")
                && e.contains(&bad.short().to_string())
                && e.contains(&name)),
            "{how}: an event names it: {ev:#?}"
        );
        // It stays queued (and only it); the bytes were not touched.
        assert_eq!(o.queued().len(), 1);
        assert_eq!(o.queued()[0].key, bad);
        assert_eq!(std::fs::read(&file).unwrap(), broken, "{how}: left alone");
        // What is recorded reads as usual: 9 runs with rows (8 old, 1 new).
        assert_eq!(o.recorded("loss").unwrap().num_rows(), 9 * 3, "{how}");
        let store = FsStore::open(c.path().join("store")).unwrap();
        assert_eq!(store.metric_table("loss").unwrap().num_rows(), 9 * 3);

        // The store's status: 9 done, 1 corrupt with its file and the fix.
        let h = puzzletron::report::SweepHistory::load(&store).unwrap();
        let counts: Vec<_> = h.counts();
        assert!(counts.contains(&("done", 9)), "{how}: {counts:?}");
        assert!(counts.contains(&("corrupt", 1)), "{how}: {counts:?}");
        let r = h.runs.iter().find(|r| r.state == "corrupt").unwrap();
        assert_eq!(r.key, bad.to_string());
        let err = r.error.as_deref().unwrap();
        assert!(err.contains(&name) && err.contains("sweep repair"), "{err}");
        // The chunked scan of `sweep status` says the same.
        let st = puzzletron::report::SweepStatus::scan(&store).unwrap();
        let want: Vec<(String, usize)> = counts.iter().map(|(s, n)| (s.to_string(), *n)).collect();
        assert_eq!(st.counts, want, "{how}");
        assert_eq!(st.runs, 10, "{how}");
        assert_eq!(st.corrupt, [(bad.to_string(), err.to_string())], "{how}");

        // repair(true): moved aside (kept, byte for byte), run again; the rest untouched.
        let mut o = sweep(&c, true, None);
        let plan = o.plan().unwrap();
        assert_eq!(plan.count(Action::Repair), 1, "{how}: {plan}");
        let s = o.drain().unwrap();
        assert_eq!((s.ran(), s.skipped()), (1, 8), "{how}: {}", s.report());
        let j = s.jobs.iter().find(|j| j.run.key == bad).unwrap();
        assert!(
            matches!(&j.outcome, Outcome::Ran { .. }),
            "{how}: {:?}",
            j.outcome
        );
        let rec = store.record(&bad).unwrap().unwrap();
        assert_eq!(rec.status, puzzletron::store::Status::Done);
        assert_eq!(rec.attempt, 1, "a fresh folder");
        let aside: Vec<PathBuf> = std::fs::read_dir(c.path().join("store/corrupt"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(aside.len(), 1, "{aside:?}");
        assert!(
            aside[0]
                .file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&bad.to_hex()),
            "{aside:?}"
        );
        assert_eq!(
            std::fs::read(aside[0].join("record.json")).unwrap(),
            broken,
            "{how}: the bad record is kept as it was"
        );
        // Everything is current now.
        let o = sweep(&c, false, None);
        assert_eq!(o.plan().unwrap().count(Action::Skip), 9, "{how}");
    }
}

#[cfg(feature = "cli")]
#[test]
fn sweep_status_names_a_corrupt_run_and_sweep_repair_moves_it_aside() {
    use std::process::Command;
    let c = FakeCrate::new();
    let mut o = sweep(&c, false, None);
    o.drain().unwrap();
    let bad = o.enqueued()[2].key;
    let file = record_file(&c, &bad);
    break_record(&file, "truncated");
    let root = c.path().join("store");
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_puzzletron"))
            .args(args)
            .arg(&root)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = cli(&["sweep", "status"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("9 runs"), "{out}");
    let counted = |state: &str, n: &str| {
        out.lines()
            .any(|l| l.starts_with("  ") && l.split_whitespace().eq([state, n]))
    };
    assert!(counted("done", "8") && counted("corrupt", "1"), "{out}");
    assert!(
        out.contains(&file.display().to_string()) && out.contains("sweep repair"),
        "{out}"
    );
    let (code, out, err) = cli(&["sweep", "status", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["states"]["corrupt"], 1, "{out}");
    assert_eq!(v["states"]["done"], 8, "{out}");
    let (code, out, _) = cli(&["sweep", "ls", "--state", "corrupt"]);
    assert_eq!(code, Some(0));
    assert_eq!(out.lines().count(), 1, "{out}");
    // gc never removes a corrupt run, even one not kept.
    let keep = c.path().join("keep.txt");
    std::fs::write(&keep, "").unwrap();
    let (code, _, err) = cli(&["sweep", "gc", "--keep", keep.to_str().unwrap(), "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");

    let (code, out, _) = cli(&["sweep", "repair", "--dry-run"]);
    assert_eq!(code, Some(0));
    assert!(out.contains("would move"), "{out}");
    assert!(
        out.contains("\n1 corrupt run(s) would be moved aside"),
        "{out}"
    );
    assert!(file.exists(), "a dry run moves nothing");
    let (code, out, err) = cli(&["sweep", "repair"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("moved") && out.contains("corrupt/"), "{out}");
    assert!(out.contains("\n1 corrupt run(s) moved aside"), "{out}");
    assert!(!out.contains("another process"), "{out}");
    assert!(!file.exists());
    // Counted by what this repair moved: nothing is left to move.
    let (code, out, err) = cli(&["sweep", "repair"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("0 corrupt run(s) moved aside"), "{out}");
    // The next drain runs it again; nothing else. Its plan says why: the record is gone,
    // not "no record (nearest: ...)" as for a run never seen.
    let mut o = sweep(&c, false, None);
    let plan = o.plan().unwrap();
    let d = plan.decisions.iter().find(|d| d.run.key == bad).unwrap();
    assert_eq!(
        d.reasons,
        [
            "no record: this run's record was removed or set aside (a corrupt record moved to corrupt/ by `sweep repair`)"
        ],
        "{plan}"
    );
    let s = o.drain().unwrap();
    assert_eq!((s.ran(), s.skipped()), (1, 8), "{}", s.report());
}

#[test]
fn a_run_without_a_record_says_no_record_with_its_nearest_neighbour_as_a_hint() {
    let c = FakeCrate::new();
    let mut o = sweep(&c, false, None);
    o.drain().unwrap();
    let mut o = sweep(&c, false, None);
    o.run(&c.job(train), P { lr: 0.1, hidden: 8 }).unwrap();
    let plan = o.plan().unwrap();
    let d = plan.decisions.last().unwrap();
    assert_eq!(d.action, Action::Run);
    // The closest stored runs differ in `hidden` only (16, 32 or 64: equally close).
    assert_eq!(d.reasons.len(), 1, "{plan}");
    assert!(
        d.reasons[0].starts_with("no record (nearest: params changed: hidden ")
            && d.reasons[0].ends_with(" -> 8)"),
        "{plan}"
    );
    // An empty store: `no record` alone.
    let c = FakeCrate::new();
    let o = sweep(&c, false, None);
    assert!(
        o.plan()
            .unwrap()
            .decisions
            .iter()
            .all(|d| d.reasons == ["no record"])
    );
}

/// A drained 9-run sweep whose 5th record is truncated: (crate, key, good bytes, record path).
fn broken_sweep() -> (FakeCrate, Hash, Vec<u8>, PathBuf) {
    let c = FakeCrate::new();
    let mut o = sweep(&c, false, None);
    assert_eq!(o.drain().unwrap().ran(), 9);
    let bad = o.enqueued()[4].key;
    let file = record_file(&c, &bad);
    let good = std::fs::read(&file).unwrap();
    break_record(&file, "truncated");
    (c, bad, good, file)
}

/// What `ROOT/corrupt/` holds, by name (no lock or tomb may be left there).
fn set_aside_names(c: &FakeCrate) -> Vec<String> {
    match std::fs::read_dir(c.path().join("store/corrupt")) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The 9-run sweep on `store`, repairing.
fn repairing_sweep(c: &FakeCrate, store: FsStore) -> Orchestrator<FsStore> {
    let mut o = Orchestrator::builder()
        .store(store)
        .lock(c.lock())
        .repair(true)
        .build()
        .unwrap();
    for p in grid() {
        o.run(&c.job(train), p).unwrap();
    }
    o
}

/// A drain that planned the repair, while another drain repaired the run and wrote a good
/// record before this one took the repair lock: nothing is moved aside, the good record stays,
/// and the run is not run again.
#[cfg(feature = "test-util")]
#[test]
fn a_record_repaired_between_the_check_and_the_repair_lock_is_not_set_aside() {
    use puzzletron::store::{FaultHook, FaultOp};
    let (c, bad, good, file) = broken_sweep();
    let (hook_file, hook_good) = (file.clone(), good.clone());
    let tries = Arc::new(Mutex::new(0usize));
    let t = tries.clone();
    // Called right before each try to take the lock: "another drain" repairs the record there.
    let hook: FaultHook = Arc::new(move |op, path, _| {
        if op == FaultOp::RepairLock {
            assert!(path.ends_with("corrupt/repair.lock"), "{}", path.display());
            *t.lock().unwrap() += 1;
            std::fs::write(&hook_file, &hook_good).unwrap();
        }
        None
    });
    let store = FsStore::open(c.path().join("store"))
        .unwrap()
        .with_fault_hook(hook);
    let mut o = repairing_sweep(&c, store);
    assert_eq!(
        o.plan().unwrap().count(Action::Repair),
        1,
        "checked: corrupt"
    );
    let s = o.drain().unwrap();
    assert_eq!(
        *tries.lock().unwrap(),
        1,
        "the drain took the repair lock once"
    );
    assert_eq!((s.ran(), s.skipped()), (0, 9), "{}", s.report());
    let j = s.jobs.iter().find(|j| j.run.key == bad).unwrap();
    assert!(
        matches!(&j.outcome, Outcome::Skipped { .. }),
        "{:?}",
        j.outcome
    );
    assert_eq!(std::fs::read(&file).unwrap(), good, "the good record stays");
    assert_eq!(
        set_aside_names(&c),
        Vec::<String>::new(),
        "nothing moved, no lock left"
    );

    // Store level: a readable record is never moved, and the answer says why.
    let store = FsStore::open(c.path().join("store")).unwrap();
    let to = store.set_aside(&bad).unwrap();
    assert!(
        matches!(&to, SetAside::NotMoved(why) if why.contains("repaired by another")),
        "{to:?}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), good);
}

/// Eight drains (threads, each with its own store handle) repairing the same corrupt run at
/// once: exactly one moves it aside, it runs once, and the final record is good.
#[test]
fn concurrent_repairs_of_one_corrupt_run_set_it_aside_once_and_run_it_once() {
    const N: usize = 8;
    for round in 0..3 {
        let (c, bad, _, file) = broken_sweep();
        let broken = std::fs::read(&file).unwrap();
        let go = Arc::new(std::sync::Barrier::new(N));
        let summaries: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..N)
                .map(|_| {
                    let (c, go) = (&c, go.clone());
                    s.spawn(move || {
                        let store = FsStore::open(c.path().join("store")).unwrap();
                        let mut o = repairing_sweep(c, store);
                        go.wait();
                        o.drain().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ran: usize = summaries
            .iter()
            .map(|s| {
                s.jobs
                    .iter()
                    .filter(|j| j.run.key == bad && matches!(j.outcome, Outcome::Ran { .. }))
                    .count()
            })
            .sum();
        assert_eq!(ran, 1, "round {round}: the repaired run ran once");
        for s in &summaries {
            assert_eq!(s.ran() + s.skipped(), 9, "round {round}: {}", s.report());
        }
        let names = set_aside_names(&c);
        assert_eq!(names.len(), 1, "round {round}: set aside once: {names:?}");
        assert!(names[0].starts_with(&bad.to_hex()), "{names:?}");
        let aside = c.path().join("store/corrupt").join(&names[0]);
        assert_eq!(std::fs::read(aside.join("record.json")).unwrap(), broken);
        let store = FsStore::open(c.path().join("store")).unwrap();
        let rec = store.record(&bad).unwrap().unwrap();
        assert_eq!(rec.status, puzzletron::store::Status::Done, "round {round}");
        assert_eq!(
            rec.attempt, 1,
            "round {round}: one fresh folder, one attempt"
        );
        assert_eq!(store.metric_table("loss").unwrap().num_rows(), 9 * 3);
    }
}

/// The JSON of an owner as `Owner::current` writes it, with `edit` applied.
fn owner_json(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v = serde_json::to_value(puzzletron::store::Owner::current()).unwrap();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

/// A repair lock left by a killed process of this host is taken over at once (its holder is
/// proved dead); one whose holder cannot be judged from here (another host) only once it has
/// been seen unchanged for the store's stale interval; neither blocks forever, and neither is
/// left behind.
#[test]
fn a_stale_repair_lock_is_taken_over_by_the_claim_rules() {
    // A pid that no longer runs: a child that exited and was reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = owner_json(|v| {
        v["pid"] = dead_pid.into();
        v["nonce"] = "killed-drain".into();
    });
    let elsewhere = owner_json(|v| {
        v["host"] = "another-host.example".into();
        v["nonce"] = "elsewhere".into();
    });
    for (what, lock, stale, at_least, at_most) in [
        ("dead", dead, 60_000, 0, 5_000),
        ("unproven", elsewhere.clone(), 300, 300, 30_000),
        ("empty", Vec::new(), 300, 300, 30_000),
    ] {
        let (c, bad, _, file) = broken_sweep();
        let aside = c.path().join("store/corrupt");
        std::fs::create_dir_all(&aside).unwrap();
        std::fs::write(aside.join("repair.lock"), &lock).unwrap();
        let store = FsStore::open(c.path().join("store"))
            .unwrap()
            .with_stale_after(std::time::Duration::from_millis(stale));
        let t0 = std::time::Instant::now();
        let SetAside::Moved(to) = store.set_aside(&bad).unwrap() else {
            panic!("{what}: not moved")
        };
        let took = t0.elapsed().as_millis() as u64;
        assert!(
            (at_least..at_most).contains(&took),
            "{what}: took {took} ms, expected {at_least}..{at_most}"
        );
        assert!(to.contains("corrupt/"), "{what}: {to}");
        assert!(!file.exists(), "{what}: moved");
        let names = set_aside_names(&c);
        assert_eq!(
            names.len(),
            1,
            "{what}: the folder only, no lock or tomb: {names:?}"
        );
        assert!(names[0].starts_with(&bad.to_hex()), "{what}: {names:?}");
    }
}
