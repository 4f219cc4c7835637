//! The conformance suite every [`Store`] implementation runs (feature `test-util`).
//!
//! ```
//! # #[cfg(feature = "test-util")] {
//! use puzzletron::store::{MemoryStore, conformance};
//! conformance::run_all(|| MemoryStore::new());
//! # }
//! ```
//!
//! Each check panics with a message naming the rule that failed and what the store did
//! (`run_all` adds the check's name: `store conformance `lifecycle_done`: ...`); call it from a
//! `#[test]`. It runs in one process (unlike the executor suite): `make` gives each check a
//! fresh, empty store.
//!
//! # What it asks of a store
//!
//! A store implements the thirteen required methods of [`Store`] (the record/claim lifecycle)
//! and may leave every other one to its default: a store of the required methods alone passes
//! the whole suite (`tests/store_conformance.rs` runs one). The checks, by method:
//!
//! | Required method | Why a store must provide it | Checks |
//! |---|---|---|
//! | `location` | names the store in messages | (every message) |
//! | `record`, `keys` | a run's outcome, and what the store holds | `empty_store_has_nothing`, `lifecycle_done` |
//! | `lineage`, `set_lineage` | the key last run for a job and its parameters: current or superseded | `lifecycle_done`, `reuse_points_lineages`, `deferred_start_keeps_rows` |
//! | `claim`, `release`, `claim_info` | one live holder per job across processes; who holds it | `claim_is_exclusive`, `concurrent_claims_one_winner`, `release_frees_the_job` |
//! | `heartbeat` | a holder's proof of life, so a dead holder's claim is taken over | `stale_claim_taken_over` |
//! | `start`, `metric_sink`, `finish`, `metrics` | an attempt's running record, its rows as logged, its atomic end, its rows read back | `lifecycle_done`, `failed_then_retried`, `bad_metric_names_refused`, `sealed_rows_read_back` |
//!
//! The provided methods are hooks where a store does the same work cheaper, or capabilities it
//! may lack. A check of a hook holds for the default by construction and checks that an
//! override gives the default's answer:
//!
//! | Provided method | Default | Checks |
//! |---|---|---|
//! | `records`, `record_metrics` | `record`, `metrics` per item | `records_batch_matches_single`, `sealed_rows_read_back` |
//! | `done_head`, `done_heads`, `preload` | unknown (the record is read), per key, nothing | `done_head_never_lies` (`preload` is a hint, never needed for correctness) |
//! | `lineages`, `reuse` | `lineage`, `set_lineage` per item | `reuse_points_lineages` |
//! | `finish_many` | `finish` per entry | `finish_many_commits_each` |
//! | `deferrable_start` | `false` (checked only when `true`) | `deferred_start_keeps_rows` |
//! | `job_files` | none (checked only when `Some`) | `job_files_name_the_jobs_files` |
//! | `heartbeat_interval`, `set_aside`, `spec` | 10 s; cannot; cannot | (`tests/store_liveness.rs`, `tests/sweep_corrupt.rs`, `tests/sweep_isolated.rs` for `FsStore`) |

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

use super::{
    ClaimOutcome, FORMAT_VERSION, Failure, JobRecord, MetricsInfo, Owner, Status, Store, StoreError,
};
use crate::identity::{Hash, OwnedDigest, Toolchain, Witnesses};

/// A minimal valid record for `key` (job `conformance::job`), for tests of stores.
pub fn sample_record(key: Hash, status: Status, attempt: u32) -> JobRecord {
    JobRecord {
        format: FORMAT_VERSION,
        key,
        job: "conformance::job".into(),
        params: serde_json::json!({"lr": 0.1}),
        param_order: vec!["lr".into()],
        param_types: Default::default(),
        lineage: Hash::of(format!("lineage-{key}")),
        owned: OwnedDigest {
            digest: Hash::of("code"),
            files: BTreeMap::new(),
            ..OwnedDigest::default()
        },
        witnesses: Witnesses {
            cargo_lock: None,
            toolchain: Toolchain::current(),
            source: None,
        },
        status,
        attempt,
        owner: Some(Owner::current()),
        started_at: 1.0,
        finished_at: (status != Status::Running).then_some(2.0),
        error: (status == Status::Failed).then(|| Failure {
            kind: "error".into(),
            message: "boom".into(),
            chain: vec![],
            backtrace: None,
        }),
        metrics: None,
    }
}

/// An owner whose process is certainly dead, as this process can prove: of its own host, boot
/// and PID namespace, with the pid of a child that already exited and was reaped, and a nonce
/// this process did not make.
pub fn dead_owner() -> Owner {
    let mut owner = Owner::current();
    owner.nonce = format!("dead-{}", owner.nonce);
    let child = std::process::Command::new("true")
        .spawn()
        .and_then(|mut c| {
            let pid = c.id();
            c.wait().map(|_| pid)
        });
    owner.pid = child.unwrap_or(u32::MAX - 1);
    owner.start_ticks = Some(1);
    owner
}

pub(crate) fn claimed(store: &dyn Store, key: &Hash, owner: &Owner) -> super::Claim {
    match store.claim(key, owner, None) {
        Ok(ClaimOutcome::Claimed(c)) => c,
        other => panic!("a free job must be Claimed by its first claimer, got {other:?}"),
    }
}

/// Runs every check against fresh stores from `make`.
///
/// # Panics
/// At the first check that fails, with `store conformance `CHECK`:` and the rule broken and
/// what was observed (an error of the store included).
pub fn run_all<S: Store + 'static>(make: impl Fn() -> S) {
    check("empty_store_has_nothing", || {
        empty_store_has_nothing(&make())
    });
    check("claim_is_exclusive", || claim_is_exclusive(&make()));
    check("lifecycle_done", || lifecycle_done(&make()));
    check("failed_then_retried", || failed_then_retried(&make()));
    check("stale_claim_taken_over", || stale_claim_taken_over(&make()));
    check("release_frees_the_job", || release_frees_the_job(&make()));
    check("bad_metric_names_refused", || {
        bad_metric_names_refused(&make())
    });
    check("records_batch_matches_single", || {
        records_batch_matches_single(&make())
    });
    check("sealed_rows_read_back", || sealed_rows_read_back(&make()));
    check("done_head_never_lies", || done_head_never_lies(&make()));
    check("reuse_points_lineages", || reuse_points_lineages(&make()));
    check("finish_many_commits_each", || {
        finish_many_commits_each(&make())
    });
    check("deferred_start_keeps_rows", || {
        deferred_start_keeps_rows(&make())
    });
    check("job_files_name_the_jobs_files", || {
        job_files_name_the_jobs_files(&make())
    });
    check("concurrent_claims_one_winner", || {
        concurrent_claims_one_winner(Arc::new(make()))
    });
}

/// Runs one check, naming it in its failure: a panic inside it (an assertion, or an `unwrap`
/// of the store's own error) is raised again as `store conformance `NAME`: ...`.
fn check(name: &str, f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let what = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(a panic without a message)");
        // `assert_eq!`'s own words add nothing to the rule its message states.
        let what = what
            .strip_prefix("assertion `left == right` failed: ")
            .or_else(|| what.strip_prefix("assertion failed: "))
            .unwrap_or(what);
        panic!("store conformance `{name}`: {what}");
    }
}

/// [`Store::reuse`] points each lineage at its reused key, whether it named another key or
/// none, and leaves the lineages it was not given alone; in batches large enough for a store
/// to split them.
pub fn reuse_points_lineages(store: &dyn Store) {
    let owner = Owner::current();
    let lineage = Hash::of("lineage-reverted");
    let mut keys = Vec::new();
    for name in ["reuse-a", "reuse-b"] {
        let k = Hash::of(name);
        let c = claimed(store, &k, &owner);
        let mut rec = sample_record(k, Status::Running, c.attempt);
        rec.lineage = lineage;
        store.start(&c, &rec).unwrap();
        rec.status = Status::Done;
        rec.finished_at = Some(2.0);
        store.finish(&c, &rec).unwrap();
        keys.push(k);
    }
    assert_eq!(
        store.lineage(&lineage).unwrap(),
        Some(keys[1]),
        "the last started"
    );
    let other = Hash::of("lineage-untouched");
    store.set_lineage(&other, &keys[1]).unwrap();
    store.reuse(&[(lineage, keys[0])]).unwrap();
    assert_eq!(
        store.lineage(&lineage).unwrap(),
        Some(keys[0]),
        "the reused run"
    );
    assert_eq!(
        store.lineage(&other).unwrap(),
        Some(keys[1]),
        "reuse must leave a lineage it was not given alone"
    );
    // A batch: half the lineages already right, half naming nothing.
    let pairs: Vec<(Hash, Hash)> = (0..5000u32)
        .map(|i| (Hash::of(format!("lin-{i}")), Hash::of(format!("key-{i}"))))
        .collect();
    for (l, k) in pairs.iter().step_by(2) {
        store.set_lineage(l, k).unwrap();
    }
    store.reuse(&pairs).unwrap();
    let lineages: Vec<Hash> = pairs.iter().map(|p| p.0).collect();
    let got = store.lineages(&lineages).unwrap();
    for ((l, k), g) in pairs.iter().zip(got) {
        assert_eq!(
            g,
            Some(*k),
            "after reuse of a batch of 5000, lineage {l} must name its reused key"
        );
    }
}

/// Rows ended with [`MetricSink::seal`](super::MetricSink::seal) read back exactly, for a run
/// with no rows, a few (kept inline by stores that do) and many (past any inline limit), by
/// [`Store::metrics`] and by [`Store::record_metrics`].
pub fn sealed_rows_read_back(store: &dyn Store) {
    let owner = Owner::current();
    for (i, rows) in [0i64, 3, 500].into_iter().enumerate() {
        let k = Hash::of(format!("sealed-{i}"));
        let c = claimed(store, &k, &owner);
        let mut rec = sample_record(k, Status::Running, c.attempt);
        store.start(&c, &rec).unwrap();
        let mut sink = store.metric_sink(&c).unwrap();
        for step in 0..rows {
            sink.append("loss", step, step as f64 / 7.0).unwrap();
        }
        let info = sink.seal().unwrap();
        assert_eq!(info.rows, rows as u64, "{rows} rows");
        rec.status = Status::Done;
        rec.finished_at = Some(2.0);
        rec.metrics = Some(info);
        store.finish(&c, &rec).unwrap();
        let want: Vec<(i64, f64)> = (0..rows).map(|s| (s, s as f64 / 7.0)).collect();
        let got = store.metrics(&k, Some("loss")).unwrap();
        assert_eq!(got.of("loss"), want, "{rows} rows by metrics()");
        let back = store.record(&k).unwrap().expect("done record");
        assert_eq!(back, rec, "{rows} rows: the record reads back as written");
        let got = store.record_metrics(&back, None).unwrap();
        assert_eq!(got.of("loss"), want, "{rows} rows by record_metrics()");
    }
}

/// [`Store::done_head`] (and [`Store::done_heads`], which must agree with it) is `None` for an
/// absent, running or failed job, and for a done job it is `None` or exactly its record's
/// attempt and witnesses digest.
pub fn done_head_never_lies(store: &dyn Store) {
    let k = Hash::of("head");
    // Every head is asked both ways: alone and in a batch with an absent key around it.
    let head = |k: &Hash| {
        let one = store.done_head(k).unwrap();
        let absent = Hash::of("absent");
        let batch: Vec<_> = store
            .done_heads(&[absent, *k, absent])
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(batch, [None, one, None], "done_heads agrees with done_head");
        one
    };
    assert_eq!(head(&k), None, "no record: no head");
    let c = claimed(store, &k, &Owner::current());
    store
        .start(&c, &sample_record(k, Status::Running, c.attempt))
        .unwrap();
    assert_eq!(head(&k), None, "running: no head");
    store
        .finish(&c, &sample_record(k, Status::Failed, c.attempt))
        .unwrap();
    assert_eq!(head(&k), None, "failed: no head");
    let c = claimed(store, &k, &Owner::current());
    let done = sample_record(k, Status::Done, c.attempt);
    store
        .start(&c, &sample_record(k, Status::Running, c.attempt))
        .unwrap();
    store.finish(&c, &done).unwrap();
    if let Some(h) = head(&k) {
        assert_eq!(h.attempt, 2, "the head of the done attempt");
        assert_eq!(
            h.witnesses,
            super::DoneHead::witnesses_digest(&done.witnesses),
            "a done head must carry the digest of its record's witnesses"
        );
    }
    // Forced re-run in place: while it runs, the old done head must not be reported.
    let c = match store.claim(&k, &Owner::current(), Some(2)).unwrap() {
        ClaimOutcome::Claimed(c) => c,
        other => panic!("a forced re-run claims the done job, got {other:?}"),
    };
    store
        .start(&c, &sample_record(k, Status::Running, c.attempt))
        .unwrap();
    assert_eq!(head(&k), None, "re-running: no head");
}

/// A new store holds no records, keys, lineage or claims.
pub fn empty_store_has_nothing(store: &dyn Store) {
    let k = Hash::of("nothing");
    assert!(
        store.record(&k).unwrap().is_none(),
        "empty store: record must be None"
    );
    assert!(
        store.keys().unwrap().is_empty(),
        "empty store: keys must be empty"
    );
    assert!(
        store.lineage(&k).unwrap().is_none(),
        "empty store: lineage must be None"
    );
    assert!(
        store.claim_info(&k).unwrap().is_none(),
        "empty store: no claim"
    );
    assert!(
        store.metrics(&k, None).unwrap().is_empty(),
        "empty store: no metrics"
    );
}

/// A second owner cannot claim a job a live owner holds.
pub fn claim_is_exclusive(store: &dyn Store) {
    let k = Hash::of("exclusive");
    let a = Owner::current();
    let b = Owner::current();
    let c = claimed(store, &k, &a);
    assert_eq!(c.attempt, 1, "first claim is attempt 1");
    match store.claim(&k, &b, None).unwrap() {
        ClaimOutcome::Busy(o) => assert_eq!(o.nonce, a.nonce, "Busy must name the holder"),
        other => panic!("a held job must be Busy for another owner, got {other:?}"),
    }
    let info = store
        .claim_info(&k)
        .unwrap()
        .expect("claim_info of a held job");
    assert!(info.live, "the holder (this process) is alive");
    assert_eq!(
        info.owner.nonce, a.nonce,
        "claim_info must name the holder (its owner nonce)"
    );
}

/// claim -> start -> metrics -> finish(done); then the job is Done for everyone.
pub fn lifecycle_done(store: &dyn Store) {
    let k = Hash::of("lifecycle");
    let owner = Owner::current();
    let c = claimed(store, &k, &owner);
    let mut rec = sample_record(k, Status::Running, c.attempt);
    store.start(&c, &rec).unwrap();
    assert_eq!(
        store.record(&k).unwrap().map(|r| r.status),
        Some(Status::Running),
        "after start the record must read back as running"
    );
    assert_eq!(
        store.lineage(&rec.lineage).unwrap(),
        Some(k),
        "start points the lineage at the key"
    );
    assert!(
        store.metrics(&k, None).unwrap().is_empty(),
        "a running job has no finished metrics"
    );
    let mut sink = store.metric_sink(&c).unwrap();
    for step in 0..5 {
        sink.append("loss", step, 1.0 / (step as f64 + 1.0))
            .unwrap();
        sink.append("acc", step, step as f64 * 0.1).unwrap();
    }
    sink.sync().unwrap();
    let info: MetricsInfo = sink.summary();
    assert_eq!(info.rows, 10, "summary must count every appended row");
    assert_eq!(
        info.names,
        ["acc", "loss"],
        "summary must list the distinct metric names, sorted"
    );
    rec.status = Status::Done;
    rec.finished_at = Some(3.0);
    rec.metrics = Some(info);
    store.finish(&c, &rec).unwrap();
    let got = store.record(&k).unwrap().expect("done record");
    assert_eq!(got, rec, "the record reads back as written");
    assert!(
        store.claim_info(&k).unwrap().is_none(),
        "finish releases the claim"
    );
    assert_eq!(
        store.keys().unwrap(),
        vec![k],
        "keys must list the one job with a record"
    );
    let all = store.metrics(&k, None).unwrap();
    assert_eq!(all.len(), 10, "metrics(key, None) must return every row");
    let loss = store.metrics(&k, Some("loss")).unwrap();
    assert_eq!(
        loss.of("loss"),
        (0..5)
            .map(|s| (s, 1.0 / (s as f64 + 1.0)))
            .collect::<Vec<_>>(),
        "metrics must return the rows as appended, in order"
    );
    assert_eq!(loss.len(), 5, "a name filter keeps only that metric");
    match store.claim(&k, &Owner::current(), None).unwrap() {
        ClaimOutcome::Done(r) => assert_eq!(
            r.status,
            Status::Done,
            "ClaimOutcome::Done must carry the done record"
        ),
        other => panic!("a done job must not be claimed again, got {other:?}"),
    }
    match store
        .claim(&k, &Owner::current(), Some(c.attempt + 1))
        .unwrap()
    {
        ClaimOutcome::Done(_) => {}
        other => {
            panic!("replacing an attempt that is not the done one must give Done, got {other:?}")
        }
    }
    // Re-run in place: the done attempt is claimed once, as the next attempt.
    let again = match store.claim(&k, &Owner::current(), Some(c.attempt)).unwrap() {
        ClaimOutcome::Claimed(c2) => c2,
        other => panic!("replacing the done attempt must claim it, got {other:?}"),
    };
    assert_eq!(
        again.attempt,
        c.attempt + 1,
        "a re-run in place of done attempt {} must be attempt {}",
        c.attempt,
        c.attempt + 1
    );
    assert_eq!(
        store.record(&k).unwrap().unwrap().status,
        Status::Done,
        "the old result stays readable during the re-run"
    );
    let second = store.claim(&k, &Owner::current(), Some(c.attempt)).unwrap();
    assert!(
        matches!(second, ClaimOutcome::Busy(_)),
        "a done attempt is re-run once: a second replacing claim must be Busy, got {second:?}"
    );
}

/// A failed job is claimed again with the next attempt number.
pub fn failed_then_retried(store: &dyn Store) {
    let k = Hash::of("failed");
    let c = claimed(store, &k, &Owner::current());
    let rec = sample_record(k, Status::Failed, c.attempt);
    store
        .start(&c, &sample_record(k, Status::Running, c.attempt))
        .unwrap();
    store.finish(&c, &rec).unwrap();
    assert_eq!(
        store
            .record(&k)
            .unwrap()
            .and_then(|r| r.error)
            .map(|e| e.message),
        Some("boom".to_string()),
        "a failed record must keep its error as written"
    );
    let c2 = claimed(store, &k, &Owner::current());
    assert_eq!(c2.attempt, 2, "a retry is attempt 2");
}

/// A claim whose owner process is dead is taken over; the dead owner's claim is then lost.
pub fn stale_claim_taken_over(store: &dyn Store) {
    let k = Hash::of("stale");
    let dead = dead_owner();
    let c_dead = claimed(store, &k, &dead);
    store
        .start(&c_dead, &sample_record(k, Status::Running, 1))
        .unwrap();
    let info = store.claim_info(&k).unwrap().expect("claim");
    assert!(
        !info.live,
        "a claim of a dead process must be seen as not live"
    );
    let fresh = Owner::current();
    let c = claimed(store, &k, &fresh);
    assert_eq!(
        c.attempt, 2,
        "taking over an interrupted attempt starts the next attempt"
    );
    match store.finish(&c_dead, &sample_record(k, Status::Done, 1)) {
        Err(StoreError::ClaimLost { .. }) => {}
        other => panic!("the dead owner's finish must fail with ClaimLost, got {other:?}"),
    }
    let beat = store.heartbeat(&c_dead);
    assert!(
        matches!(beat, Err(StoreError::ClaimLost { .. })),
        "the dead owner's heartbeat must fail with ClaimLost after a takeover, got {beat:?}"
    );
    store
        .heartbeat(&c)
        .unwrap_or_else(|e| panic!("the taker's heartbeat must succeed, got {e}"));
}

/// [`Store::finish_many`] commits each entry as [`Store::finish`] would (done and failed
/// records read back as written, their claims released, done heads set), in batches of one,
/// two and many; an entry whose claim was lost fails alone with [`StoreError::ClaimLost`].
pub fn finish_many_commits_each(store: &dyn Store) {
    for n in [0usize, 1, 2, 9] {
        let owner = Owner::current();
        let mut claims = Vec::new();
        let mut recs = Vec::new();
        for i in 0..n {
            let k = Hash::of(format!("many-{n}-{i}"));
            // The third entry's claim is lost: its dead holder was taken over.
            let holder = if i == 2 { dead_owner() } else { owner.clone() };
            let c = claimed(store, &k, &holder);
            let status = if i % 4 == 3 {
                Status::Failed
            } else {
                Status::Done
            };
            let mut rec = sample_record(k, Status::Running, c.attempt);
            store.start(&c, &rec).unwrap();
            let mut sink = store.metric_sink(&c).unwrap();
            sink.append("loss", 0, i as f64).unwrap();
            rec.set_metrics(sink.seal().unwrap());
            rec.status = status;
            rec.finished_at = Some(2.0);
            if status == Status::Failed {
                rec.error = sample_record(k, Status::Failed, 1).error;
            }
            claims.push(c);
            recs.push(rec);
        }
        let taker = (n > 2).then(|| claimed(store, &claims[2].key, &owner));
        let pairs: Vec<_> = claims.iter().zip(&recs).collect();
        let results = store.finish_many(&pairs);
        assert_eq!(results.len(), n, "one result per entry");
        for (i, ((c, rec), r)) in pairs.iter().zip(results).enumerate() {
            if i == 2 {
                assert!(
                    matches!(r, Err(StoreError::ClaimLost { .. })),
                    "batch of {n}: a lost claim fails alone, got {r:?}"
                );
                assert_eq!(
                    store.record(&c.key).unwrap().map(|r| r.status),
                    Some(Status::Running),
                    "batch of {n}: the lost entry's record is untouched"
                );
                continue;
            }
            r.unwrap_or_else(|e| panic!("batch of {n}, entry {i}: {e}"));
            let back = store.record(&c.key).unwrap().expect("a finished record");
            assert_eq!(&&back, rec, "batch of {n}, entry {i} reads back as written");
            assert!(
                store.claim_info(&c.key).unwrap().is_none(),
                "batch of {n}, entry {i}: its claim is released"
            );
            let head = store.done_head(&c.key).unwrap();
            if rec.status == Status::Done {
                assert!(
                    head.is_none_or(|h| h.attempt == rec.attempt),
                    "batch of {n}, entry {i}: head {head:?}"
                );
                assert_eq!(
                    store.metrics(&c.key, Some("loss")).unwrap().of("loss"),
                    vec![(0, i as f64)],
                    "batch of {n}, entry {i}: its rows must read back"
                );
            } else {
                assert!(
                    head.is_none(),
                    "batch of {n}: a failed entry has no done head"
                );
            }
        }
        if let Some(t) = taker {
            store.release(&t).unwrap();
        }
    }
}

/// For a store whose [`Store::deferrable_start`] is `true`: a start written after the sink
/// took rows leaves them alone, and a run finished with no start at all (its lineage pointed
/// with [`Store::set_lineage`]) reads back as one that started. Nothing to check otherwise.
pub fn deferred_start_keeps_rows(store: &dyn Store) {
    if !store.deferrable_start() {
        return;
    }
    for (i, write_start) in [true, false].into_iter().enumerate() {
        let k = Hash::of(format!("deferred-{i}"));
        let c = claimed(store, &k, &Owner::current());
        let mut rec = sample_record(k, Status::Running, c.attempt);
        let mut sink = store.metric_sink(&c).unwrap();
        for step in 0..3 {
            sink.append("loss", step, step as f64).unwrap();
        }
        sink.sync().unwrap();
        if write_start {
            store.start(&c, &rec).unwrap();
            assert_eq!(
                store.record(&k).unwrap().map(|r| r.status),
                Some(Status::Running),
                "a start written late reads as running"
            );
        } else {
            store.set_lineage(&rec.lineage, &k).unwrap();
        }
        for step in 3..5 {
            sink.append("loss", step, step as f64).unwrap();
        }
        rec.set_metrics(sink.seal().unwrap());
        rec.status = Status::Done;
        rec.finished_at = Some(2.0);
        store.finish(&c, &rec).unwrap();
        let back = store.record(&k).unwrap().expect("a done record");
        assert_eq!(back, rec, "start written: {write_start}");
        let want: Vec<(i64, f64)> = (0..5).map(|s| (s, s as f64)).collect();
        assert_eq!(
            store
                .record_metrics(&back, Some("loss"))
                .unwrap()
                .of("loss"),
            want,
            "start written: {write_start}: every row, those before the start included"
        );
        assert_eq!(
            store.lineage(&rec.lineage).unwrap(),
            Some(k),
            "start written: {write_start}: the lineage must name the key"
        );
        assert!(
            store.claim_info(&k).unwrap().is_none(),
            "start written: {write_start}: finish must release the claim"
        );
    }
}

/// For a store with [`Store::job_files`]: a job's artifact folder is not made until asked for
/// (a job without artifacts costs no folder), is made by `artifact_dir` at `artifact_path`, and
/// a failed finish leaves a failure file holding the failure's message. A store without
/// `job_files` passes.
pub fn job_files_name_the_jobs_files(store: &dyn Store) {
    let Some(files) = store.job_files() else {
        return;
    };
    let k = Hash::of("files");
    assert_eq!(
        files.failure_file(&k),
        None,
        "a job that never ran has no failure file"
    );
    let path = files.artifact_path(&k);
    assert!(
        !path.exists(),
        "artifact_path must not create the folder, but {} exists",
        path.display()
    );
    let c = claimed(store, &k, &Owner::current());
    store
        .start(&c, &sample_record(k, Status::Running, c.attempt))
        .unwrap();
    assert_eq!(
        files.artifact_dir(&k).as_deref(),
        Some(path.as_path()),
        "artifact_dir must be artifact_path"
    );
    assert!(path.is_dir(), "artifact_dir must create {}", path.display());
    store
        .finish(&c, &sample_record(k, Status::Failed, c.attempt))
        .unwrap();
    let failure = files
        .failure_file(&k)
        .expect("a failed finish must leave a failure file");
    let text = std::fs::read_to_string(&failure).unwrap();
    assert!(
        text.contains("boom"),
        "the failure file {} must hold the failure's message, got {text:?}",
        failure.display()
    );
}

/// A released claim leaves the job claimable.
pub fn release_frees_the_job(store: &dyn Store) {
    let k = Hash::of("release");
    let c = claimed(store, &k, &Owner::current());
    store.release(&c).unwrap();
    let info = store.claim_info(&k).unwrap();
    assert!(
        info.is_none(),
        "after release the job must have no claim, got {info:?}"
    );
    claimed(store, &k, &Owner::current());
}

/// Metric names with tabs or newlines, or empty, are refused.
pub fn bad_metric_names_refused(store: &dyn Store) {
    let k = Hash::of("names");
    let c = claimed(store, &k, &Owner::current());
    let mut sink = store.metric_sink(&c).unwrap();
    for bad in ["", "a\tb", "a\nb"] {
        assert!(
            matches!(
                sink.append(bad, 0, 1.0),
                Err(StoreError::BadMetricName { .. })
            ),
            "metric name {bad:?} must be refused"
        );
    }
    sink.append("ok name", 0, f64::NAN).unwrap();
}

/// `records` returns what `record` returns, in order, including for many keys.
pub fn records_batch_matches_single(store: &dyn Store) {
    let mut keys = Vec::new();
    for i in 0..100 {
        let k = Hash::of(format!("batch-{i}"));
        keys.push(k);
        if i % 3 == 0 {
            let c = claimed(store, &k, &Owner::current());
            store
                .finish(&c, &sample_record(k, Status::Done, 1))
                .unwrap();
        }
    }
    let batch = store.records(&keys).unwrap();
    for (k, r) in keys.iter().zip(&batch) {
        assert_eq!(
            r,
            &store.record(k).unwrap(),
            "records() must match record() for {k}"
        );
    }
    assert_eq!(
        batch.iter().filter(|r| r.is_some()).count(),
        34,
        "records() must find the 34 of 100 keys that have a record"
    );
}

/// Eight threads race to claim one job: exactly one wins.
pub fn concurrent_claims_one_winner<S: Store + 'static>(store: Arc<S>) {
    let k = Hash::of("race");
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (store, barrier) = (store.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                matches!(
                    store.claim(&k, &Owner::current(), None),
                    Ok(ClaimOutcome::Claimed(_))
                )
            })
        })
        .collect();
    let wins = handles
        .into_iter()
        .filter_map(|h| h.join().ok())
        .filter(|w| *w)
        .count();
    assert_eq!(wins, 1, "exactly one concurrent claimer must win");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{FsStore, MemoryStore};

    #[test]
    fn memory_store_conforms() {
        run_all(MemoryStore::new);
    }

    #[test]
    fn fs_store_conforms() {
        let dirs = std::sync::Mutex::new(Vec::new());
        run_all(|| {
            let d = tempfile::tempdir().unwrap();
            let s = FsStore::create(d.path().join("store")).unwrap();
            dirs.lock().unwrap().push(d);
            s
        });
    }
}
