//! Compiled identity seen from a test crate: `job!` bakes the closure of the job function, old
//! (file-scheme) records still read, and `trace(true)` re-checks recorded item digests.

use puzzletron::identity::{CompiledCode, CompiledItem, ITEMS_SCHEME};
use puzzletron::{Action, Job, JobResult, Run};
use puzzletron::{Orchestrator, job, store::FsStore, store::Store};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct P {
    x: i64,
}

const OFFSET: f64 = 0.5;

fn helper(x: i64) -> f64 {
    x as f64 + OFFSET
}

fn not_reached() -> u8 {
    3
}

fn work(p: &P, run: &mut Run) -> JobResult {
    run.log("v", 0, helper(p.x))?;
    Ok(())
}

fn sweep(dir: &std::path::Path, trace: bool) -> Orchestrator<FsStore> {
    Orchestrator::builder()
        .store_root(dir)
        .trace(trace)
        .build()
        .unwrap()
}

#[test]
fn job_macro_bakes_the_closure_and_the_lock() {
    assert_eq!(not_reached(), 3);
    let j = job!(work);
    let code = j.code().expect("job! attaches compiled identity");
    let paths: Vec<&str> = code.items.iter().map(|i| i.path).collect();
    for reached in [
        "identity_compiled::work",
        "identity_compiled::helper",
        "identity_compiled::OFFSET",
        "identity_compiled::P",
    ] {
        assert!(paths.contains(&reached), "{reached} missing from {paths:?}");
    }
    assert!(
        !paths.contains(&"identity_compiled::not_reached"),
        "{paths:?}"
    );
    assert!(!paths.contains(&"identity_compiled::sweep"), "{paths:?}");
    // The workspace lock, found from the package upward at compile time.
    let (lock, digest) = code.lock.unwrap();
    assert_eq!(lock, concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"));
    let bytes = std::fs::read(lock).unwrap();
    assert_eq!(digest, puzzletron::identity::Hash::of(bytes).to_hex());
    assert_eq!(code.owned().scheme.as_deref(), Some(ITEMS_SCHEME));
    // The same code gives the same digest on every call.
    assert_eq!(code.owned(), job!(work).code().unwrap().owned());
}

#[test]
fn witnesses_come_from_the_job_not_the_cwd() {
    let d = tempfile::tempdir().unwrap();
    let mut o = sweep(&d.path().join("s"), false);
    o.run(&job!(work), P { x: 1 }).unwrap();
    let w = o.witnesses().cargo_lock.clone().unwrap();
    assert_eq!(
        w.path,
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
    );
    assert!(
        o.witnesses()
            .toolchain
            .profile
            .as_deref()
            .unwrap()
            .contains("opt-level=")
    );
}

#[test]
fn file_scheme_records_read_and_rerun_only_when_the_key_changed() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("s");
    // A record of today's file scheme: a Job::new job of the same name and params.
    let old_job: Job<P> = Job::new(
        "identity_compiled::work",
        "puzzletron",
        env!("CARGO_MANIFEST_DIR"),
        "tests/identity_compiled.rs",
        work,
    );
    let mut o = sweep(&store, false);
    let old_key = o.run(&old_job, P { x: 2 }).unwrap();
    assert_eq!(o.drain().unwrap().ran(), 1);
    let text = std::fs::read_to_string(
        store
            .join("jobs")
            .join(old_key.to_hex())
            .join("record.json"),
    )
    .unwrap();
    assert!(
        !text.contains("scheme") && text.contains("\"files\""),
        "{text}"
    );

    // Read back by a new process: the Job::new job is still up to date (nothing lost).
    let mut o = sweep(&store, false);
    o.run(&old_job, P { x: 2 }).unwrap();
    let plan = o.plan().unwrap();
    assert_eq!(plan.decisions[0].action, Action::Skip, "{plan}");
    // The job! job has a key of the item scheme: it re-runs, saying the scheme changed.
    let mut o = sweep(&store, false);
    let new_key = o.run(&job!(work), P { x: 2 }).unwrap();
    assert_ne!(new_key, old_key);
    let plan = o.plan().unwrap();
    assert_eq!(plan.decisions[0].action, Action::Run);
    assert_eq!(
        plan.decisions[0].reasons,
        [
            "code changed: identity scheme changed (puzzletron/owned-tree/v1 (files) -> puzzletron/owned-items/v2)"
        ]
    );
    assert_eq!(o.drain().unwrap().ran(), 1);
    // The old record is still there and readable.
    assert!(o.store().record(&old_key).unwrap().is_some());
}

#[test]
fn trace_rechecks_recorded_item_digests() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("s");
    let mut o = sweep(&store, true);
    let key = o.run(&job!(work), P { x: 3 }).unwrap();
    assert_eq!(o.drain().unwrap().ran(), 1);
    // A record whose item digests do not match this binary's (written by another tool, or a
    // key collision): without trace it is trusted, with trace it re-runs naming the item.
    let path = store.join("jobs").join(key.to_hex()).join("record.json");
    let mut rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    rec["owned"]["items"]["identity_compiled::helper"]["digest"] =
        serde_json::Value::String("00".repeat(32));
    std::fs::write(&path, serde_json::to_string(&rec).unwrap()).unwrap();
    let mut plain = sweep(&store, false);
    plain.run(&job!(work), P { x: 3 }).unwrap();
    assert_eq!(plain.plan().unwrap().decisions[0].action, Action::Skip);
    let mut traced = sweep(&store, true);
    traced.run(&job!(work), P { x: 3 }).unwrap();
    let dec = &traced.plan().unwrap().decisions[0];
    assert_eq!(dec.action, Action::Run);
    assert_eq!(
        dec.reasons,
        [
            "trace: recorded items differ: code changed: identity_compiled::helper (tests/identity_compiled.rs)"
        ]
    );
    assert!(traced.store().record(&key).unwrap().is_some());
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Signed {
    x: f64,
}

fn sign_of(p: &Signed, run: &mut Run) -> JobResult {
    // What a job can see of a zero: its sign (`1/x`, `atan2`, `copysign`).
    run.log(
        "negative",
        0,
        if p.x.is_sign_negative() { 1.0 } else { 0.0 },
    )?;
    Ok(())
}

#[test]
fn negative_zero_and_zero_are_different_runs() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("s");
    let j = job!(sign_of);
    let mut o = sweep(&store, false);
    let pos = o.run(&j, Signed { x: 0.0 }).unwrap();
    let neg = o.run(&j, Signed { x: -0.0 }).unwrap();
    assert_ne!(pos, neg, "-0.0 reused 0.0's key");
    // Other values keep the keys they always had (existing stores stay valid).
    let owned = j.code().unwrap().owned().digest;
    let key =
        |json: &str| puzzletron::identity::job_key("identity_compiled::sign_of", json, &owned);
    assert_eq!(pos, key(r#"{"x":0}"#));
    assert_eq!(neg, key(r#"{"x":-0}"#));
    assert_eq!(o.run(&j, Signed { x: 0.5 }).unwrap(), key(r#"{"x":0.5}"#));
    assert_eq!(o.drain().unwrap().ran(), 3);
    // Each ran with its own value, and both are up to date now.
    let neg_dir = store.join("jobs").join(neg.to_hex());
    let pos_dir = store.join("jobs").join(pos.to_hex());
    assert!(neg_dir.is_dir() && pos_dir.is_dir());
    let mut o = sweep(&store, false);
    o.run(&j, Signed { x: -0.0 }).unwrap();
    o.run(&j, Signed { x: 0.0 }).unwrap();
    let plan = o.plan().unwrap();
    assert!(
        plan.decisions.iter().all(|d| d.action == Action::Skip),
        "{plan}"
    );
}

/// One closure built twice with two build ids of the path dependency `ccdep` (as after a new
/// Cargo.lock or compiler, which give every path dependency a new build id).
static BUILT_A: CompiledCode = CompiledCode::__new(
    "identity_compiled",
    &[CompiledItem::__new(
        "identity_compiled::work",
        "tests/identity_compiled.rs",
        "0000000000000000000000000000000000000000000000000000000000000001",
    )],
    &[],
    &[("ccdep", "aaaaaaaaaaaaaaaa")],
    &[],
    None,
    "0",
    true,
    &[],
);
static BUILT_B: CompiledCode = CompiledCode::__new(
    "identity_compiled",
    BUILT_A.items,
    &[],
    &[("ccdep", "bbbbbbbbbbbbbbbb")],
    &[],
    None,
    "0",
    true,
    &[],
);

/// A fixed closure, built as `job!`'s expansion builds one (`CompiledCode::__new`).
static GOLDEN: CompiledCode = CompiledCode::__new(
    "golden",
    &[
        CompiledItem::__new(
            "golden::train",
            "src/lib.rs",
            "1111111111111111111111111111111111111111111111111111111111111111",
        ),
        CompiledItem::__new(
            "golden::helper",
            "src/lib.rs",
            "2222222222222222222222222222222222222222222222222222222222222222",
        ),
    ],
    &[("feature = \"wide\"", true)],
    &[("ccdep", "0123456789abcdef")],
    // Neither the files read, the lock, the profile nor the notes are part of the digest.
    &[("/somewhere/src/lib.rs", "ab")],
    Some(("/somewhere/Cargo.lock", "cd")),
    "3",
    false,
    &["a note"],
);

/// Golden: the owned-code digest and the job key of a fixed item set never change (a change
/// to `job!`'s expansion or to `CompiledCode` would change every key of every store).
///
/// The expected values were computed outside this crate, with Python's `hashlib` on the bytes
/// the formulas in `identity::compiled` and `identity::job_key` document
/// (`frame(x) = u64_le(len(x)) ++ x`):
///
/// ```text
/// owned = sha256(frame(b"puzzletron/owned-items/v2")
///   ++ frame(b"golden::helper") ++ frame(bytes.fromhex("22" * 32))
///   ++ frame(b"golden::train") ++ frame(bytes.fromhex("11" * 32))
///   ++ frame(b"cfg") ++ frame(b'feature = "wide"') ++ frame(b"\x01")
///   ++ frame(b"builds") ++ frame(b"ccdep") ++ frame(b"0123456789abcdef"))
/// key = sha256(frame(b"puzzletron/job-key/v1") ++ frame(b"golden::train")
///   ++ frame(b'{"x":1}') ++ frame(owned))
/// ```
#[test]
fn the_job_key_of_a_fixed_item_set_is_unchanged() {
    const OWNED: &str = "fa24bb28f468cc9191fae620769bc65c2d6702b2032367d56869710a07e83f09";
    const KEY: &str = "995ecb2fe5fee709badab2e460a0a5bef40304b9eda3195286792b21f1383a9c";
    let owned = GOLDEN.owned();
    assert_eq!(owned.digest.to_hex(), OWNED);
    assert_eq!(owned.scheme.as_deref(), Some(ITEMS_SCHEME));
    let key = puzzletron::identity::job_key("golden::train", r#"{"x":1}"#, &owned.digest);
    assert_eq!(key.to_hex(), KEY);
    // And through a sweep, as a job `job!` made would be keyed.
    let d = tempfile::tempdir().unwrap();
    let mut o = sweep(&d.path().join("s"), false);
    let j = Job::new(
        "golden::train",
        "puzzletron",
        env!("CARGO_MANIFEST_DIR"),
        "tests/identity_compiled.rs",
        work,
    )
    .with_code(&GOLDEN);
    assert_eq!(o.run(&j, P { x: 1 }).unwrap().to_hex(), KEY);
}

/// Issue 26: when a run's lineage was recorded with another Cargo.lock, the reason names the
/// lock first (the cause), then the build ids it changed; without a lock change, only the build.
#[test]
fn a_new_lock_is_named_before_the_build_ids_it_changed() {
    let d = tempfile::tempdir().unwrap();
    let store = d.path().join("s");
    let lock = |name: &str| {
        let p = d.path().join(name).join("Cargo.lock");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, format!("# lock {name}\n")).unwrap();
        p
    };
    let (lock_a, lock_b) = (lock("a"), lock("b"));
    let job = |code: &'static CompiledCode| {
        Job::new(
            "identity_compiled::work",
            "puzzletron",
            env!("CARGO_MANIFEST_DIR"),
            "tests/identity_compiled.rs",
            work,
        )
        .with_code(code)
    };
    let open = |lock: &std::path::Path| {
        Orchestrator::builder()
            .store_root(&store)
            .lock(lock)
            .build()
            .unwrap()
    };
    let mut o = open(&lock_a);
    o.run(&job(&BUILT_A), P { x: 4 }).unwrap();
    assert_eq!(o.drain().unwrap().ran(), 1);
    let build = "build configuration changed: ccdep build (features, target, profile or dependency versions)";
    let mut o = open(&lock_b);
    o.run(&job(&BUILT_B), P { x: 4 }).unwrap();
    assert_eq!(
        o.plan().unwrap().decisions[0].reasons,
        ["environment changed: Cargo.lock", build]
    );
    let mut o = open(&lock_a);
    o.run(&job(&BUILT_B), P { x: 4 }).unwrap();
    assert_eq!(o.plan().unwrap().decisions[0].reasons, [build]);
}
