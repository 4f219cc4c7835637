//! A result is reused only when it is the requested run's, and is never made of what a dead
//! attempt left (issue 26, items 4 and 5):
//!
//! - a record planted under another run's key (a copy of its folder's record, or one whose key
//!   was rewritten to match) is a `KeyCollision` naming both runs, never `up to date`, with
//!   `trace(true)` too, on the decision's fast path (the done index) and its slow path;
//! - the artifacts a failed or killed attempt left are moved aside (`artifacts.attempt-N/`)
//!   before the next attempt runs, so a file the retry does not rewrite is never its result;
//! - a campaign unit's declared outputs left by a failed attempt are moved aside
//!   (`outputs_partial/<attempt id>/`) before its retry, so a retry that does not rewrite one
//!   is never promoted with the dead attempt's copy.

mod support;
use support::plan::PlanBuilder;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use puzzletron::campaign::controller::{
    CampaignController, ControllerEvent, RetryPolicy, RunOptions,
};
use puzzletron::store::{ClaimOutcome, JobRecord, Status, conformance::dead_owner};
use puzzletron::{Action, JobResult, Run};
use puzzletron::{Orchestrator, identity::Hash, store::FsStore, store::Store};
use serde_json::json;
use support::sweep::{FakeCrate, P, train};

fn orchestrator(krate: &FakeCrate, store: &Path, trace: bool) -> Orchestrator<FsStore> {
    Orchestrator::builder()
        .store_root(store)
        .lock(krate.lock())
        .trace(trace)
        .build()
        .unwrap()
}

fn p(lr: f64) -> P {
    P { lr, hidden: 4 }
}

#[test]
fn a_record_planted_under_another_runs_key_is_a_key_collision_never_a_hit() {
    let krate = FakeCrate::new();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let job = krate.job(train);
    let mut o = orchestrator(&krate, &store, false);
    let a = o.run(&job, p(0.1)).unwrap();
    let b = o.run(&job, p(0.2)).unwrap();
    o.drain().unwrap();
    let fs = FsStore::open(&store).unwrap();
    let rec = |k: &Hash| fs.job_dir(k).join("record.json");
    // B's record copied over A's: as a user's `cp -r`, or a tool writing to the wrong folder.
    std::fs::copy(rec(&b), rec(&a)).unwrap();
    let check = |err: String| {
        assert!(err.contains("key collision"), "{err}");
        assert!(err.contains(&a.to_string()), "names the key: {err}");
        assert!(err.contains("\"lr\":0.2"), "names the stored run: {err}");
        assert!(err.contains("\"lr\":0.1"), "names the request: {err}");
    };
    for trace in [false, true] {
        let mut o = orchestrator(&krate, &store, trace);
        o.run(&job, p(0.1)).unwrap();
        let err = o.plan().unwrap_err().to_string();
        check(err);
        let failed = o.drain().unwrap_err().to_string();
        check(failed);
    }
    // The same record with its key rewritten to A's: it reads as A's own, and is read once
    // (so that the done index learns it): still refused, on the index's path too.
    let text = std::fs::read_to_string(rec(&a))
        .unwrap()
        .replace(&b.to_hex(), &a.to_hex());
    std::fs::write(rec(&a), text).unwrap();
    assert_eq!(
        fs.done_heads(&[a]).remove(0).unwrap(),
        None,
        "loads the index"
    );
    let planted: JobRecord = fs.record(&a).unwrap().unwrap();
    assert_eq!(planted.key, a);
    let head = fs.done_heads(&[a]).remove(0).unwrap().expect("indexed");
    assert_ne!(head.lineage, None);
    for trace in [false, true] {
        let mut o = orchestrator(&krate, &store, trace);
        o.run(&job, p(0.1)).unwrap();
        check(o.plan().unwrap_err().to_string());
    }
    // B itself is still a hit.
    let mut o = orchestrator(&krate, &store, false);
    o.run(&job, p(0.2)).unwrap();
    let plan = o.plan().unwrap();
    assert_eq!(plan.decisions[0].action, Action::Skip, "{plan}");
}

/// Attempt 1 writes two artifacts and fails; later attempts write one.
static ATTEMPTS: Mutex<u32> = Mutex::new(0);

fn half_then_whole(_p: &P, run: &mut Run) -> JobResult {
    let n = {
        let mut a = ATTEMPTS.lock().unwrap();
        *a += 1;
        *a
    };
    let dir = run
        .artifact_dir()
        .expect("an FsStore has artifact folders")
        .to_path_buf();
    if n == 1 {
        std::fs::write(dir.join("weights.bin"), b"half")?;
        std::fs::write(dir.join("scores.json"), b"{\"attempt\": 1}")?;
        return Err("the first attempt dies".into());
    }
    std::fs::write(dir.join("scores.json"), format!("{{\"attempt\": {n}}}"))?;
    Ok(())
}

#[test]
fn what_a_failed_or_killed_attempt_left_in_its_artifacts_is_never_the_retrys_result() {
    let krate = FakeCrate::new();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let job = krate.job(half_then_whole);
    let key = {
        let mut o = orchestrator(&krate, &store, false);
        let key = o.run(&job, p(0.5)).unwrap();
        assert!(o.drain().is_err(), "attempt 1 fails");
        key
    };
    let fs = FsStore::open(&store).unwrap();
    let jd = fs.job_dir(&key);
    let mut o = orchestrator(&krate, &store, false);
    o.run(&job, p(0.5)).unwrap();
    o.drain().unwrap();
    let rec = fs.record(&key).unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Done, 2));
    let art = jd.join("artifacts");
    assert!(
        !art.join("weights.bin").exists(),
        "the dead attempt's file is not the result"
    );
    assert_eq!(
        std::fs::read_to_string(art.join("scores.json")).unwrap(),
        "{\"attempt\": 2}"
    );
    let kept = jd.join("artifacts.attempt-1");
    assert_eq!(
        std::fs::read(kept.join("weights.bin")).unwrap(),
        b"half",
        "kept, named by attempt"
    );

    // Killed: a running attempt 3 of a process that is gone, with a half-written file (a
    // forced re-run of the done job, killed mid-way).
    let ClaimOutcome::Claimed(c) = fs.claim(&key, &dead_owner(), Some(2)).unwrap() else {
        panic!("the done attempt is replaced in place");
    };
    let mut running = rec.clone();
    running.status = Status::Running;
    running.attempt = c.attempt;
    running.owner = Some(c.owner.clone());
    fs.start(&c, &running).unwrap();
    let art = puzzletron::store::JobFiles::artifact_dir(&fs, &key).unwrap();
    std::fs::write(art.join("weights.bin"), b"killed mid-write").unwrap();
    assert!(
        !fs.claim_info(&key).unwrap().unwrap().live,
        "its owner is proved dead"
    );
    let mut o = orchestrator(&krate, &store, false);
    o.run(&job, p(0.5)).unwrap();
    o.drain().unwrap();
    let rec = fs.record(&key).unwrap().unwrap();
    assert_eq!((rec.status, rec.attempt), (Status::Done, 4));
    assert!(!art.join("weights.bin").exists());
    assert_eq!(
        std::fs::read(jd.join("artifacts.attempt-3/weights.bin")).unwrap(),
        b"killed mid-write"
    );
    assert!(
        jd.join("artifacts.attempt-2/scores.json").exists(),
        "attempt 2's, kept"
    );
}

#[test]
fn a_retrys_declared_outputs_are_never_its_failed_predecessors() {
    // Attempt 1 writes both declared outputs, then dies of a transient failure (retried);
    // attempt 2 writes only one of them. Its unit must not pass with attempt 1's other file.
    let script = r#"out=$PUZZLETRON_OUTPUT_DIR
if [ "$PUZZLETRON_ATTEMPT" = 1 ]; then
  echo half > "$out/model.bin"; echo '{"attempt":1}' > "$out/scores.json"
  echo "ncclRemoteError: remote process exited"; exit 1
fi
echo "{\"attempt\":$PUZZLETRON_ATTEMPT}" > "$out/scores.json"; touch "$out/_SUCCESS""#;
    let plan = PlanBuilder::stages(json!([
        {"id": "s", "command": ["sh", "-c", script], "outputs": ["scores.json", "model.bin"]}
    ]))
    .execution(json!({"defaults": {"failure_policy": "strict", "max_attempts": 2}}))
    .build();
    let dir = tempfile::tempdir().unwrap();
    let events: Arc<Mutex<Vec<ControllerEvent>>> = Arc::default();
    let ev = events.clone();
    let mut ctl = CampaignController::builder()
        .plan(plan)
        .local(["0"])
        .campaign_dir(dir.path())
        .retry_policy(RetryPolicy::default().with_base_delay(Duration::from_millis(10)))
        .poll_interval(Duration::from_millis(50), Duration::from_millis(200))
        .output_visibility_wait(Duration::from_millis(500))
        .on_event(move |e| ev.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
    let evs = events.lock().unwrap().clone();
    assert!(!report.is_complete(), "attempt 2 lacks model.bin: {evs:?}");
    let finished: Vec<String> = evs
        .iter()
        .filter_map(|e| match e {
            ControllerEvent::AttemptFinished { detail, .. } => Some(detail.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 2, "{finished:?}");
    assert!(
        finished[1].contains("but not visible after") && finished[1].contains("/model.bin"),
        "{finished:?}"
    );
    let (first, moved) = evs
        .iter()
        .find_map(|e| match e {
            ControllerEvent::OutputsMovedAside { attempt_id, moved } => {
                Some((attempt_id.clone(), moved.clone()))
            }
            _ => None,
        })
        .expect("an OutputsMovedAside event");
    assert_eq!(moved.len(), 2, "{moved:?}");
    let out = dir.path().join("work/s/0");
    let aside = out.join("outputs_partial").join(first.as_str());
    assert_eq!(
        std::fs::read_to_string(aside.join("model.bin")).unwrap(),
        "half\n"
    );
    assert_eq!(
        std::fs::read_to_string(aside.join("scores.json")).unwrap(),
        "{\"attempt\":1}\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("scores.json")).unwrap(),
        "{\"attempt\":2}\n"
    );
}
