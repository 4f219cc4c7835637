//! Bad input gets a clear error naming what, where and what was expected, and loses nothing.

mod support;

use puzzletron::store::StoreError;
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, store::FsStore, store::Store};
use serde::{Deserialize, Serialize};
use support::sweep::{FakeCrate, P, train};

#[derive(Serialize, Deserialize)]
struct Nested {
    optimizer: Opt,
}
#[derive(Serialize, Deserialize)]
struct Opt {
    betas: Vec<f64>,
}
fn nested(_: &Nested, _: &mut Run) -> JobResult {
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct Reserved {
    step: u32,
}
fn reserved(_: &Reserved, _: &mut Run) -> JobResult {
    Ok(())
}

#[test]
fn nan_and_infinity_are_refused_at_the_call_site_with_the_path() {
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let e = o.run(
        &c.job(nested),
        Nested {
            optimizer: Opt {
                betas: vec![0.9, f64::NAN],
            },
        },
    );
    let e = e.unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad parameters for job fake::train: parameter `optimizer.betas[1]` is NaN: parameters must \
         be finite numbers (NaN and infinity have no canonical form)"
    );
    assert!(!e.is_retryable());
    let e = o
        .run(
            &c.job(train),
            P {
                lr: f64::INFINITY,
                hidden: 1,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("parameter `lr` is inf"), "{e}");
    assert!(o.queued().is_empty(), "a refused run is not enqueued");
}

#[test]
fn reserved_parameter_names_are_refused() {
    let c = FakeCrate::new();
    let e = c
        .orchestrator()
        .run(&c.job(reserved), Reserved { step: 1 })
        .unwrap_err();
    assert!(
        e.to_string().contains(
            "parameter name `step` is reserved (the metric table has columns step, value, job_key)"
        ),
        "{e}"
    );
}

struct NotSerializable;
impl Serialize for NotSerializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("handles cannot be serialized"))
    }
}
impl<'de> Deserialize<'de> for NotSerializable {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Ok(NotSerializable)
    }
}
#[derive(Serialize, Deserialize)]
struct WithHandle {
    device: NotSerializable,
}
fn handle(_: &WithHandle, _: &mut Run) -> JobResult {
    Ok(())
}

#[test]
fn unserializable_params_name_the_field() {
    let c = FakeCrate::new();
    let e = c
        .orchestrator()
        .run(
            &c.job(handle),
            WithHandle {
                device: NotSerializable,
            },
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad parameters for job fake::train: parameter `device` could not be serialized: handles \
         cannot be serialized"
    );
}

/// What building an orchestrator whose store root is a file (`afile`, holding `x`) says.
fn build_on_a_file(c: &FakeCrate) -> (std::path::PathBuf, puzzletron::Error) {
    let f = c.path().join("afile");
    std::fs::write(&f, "x").unwrap();
    let e = Orchestrator::builder()
        .store_root(&f)
        .build()
        .err()
        .unwrap();
    (f, e)
}

#[test]
fn store_root_that_is_a_file() {
    let c = FakeCrate::new();
    let (f, e) = build_on_a_file(&c);
    assert_eq!(
        e.to_string(),
        format!(
            "store root {} is not a directory: expected a folder (or a path that does not exist yet)",
            f.display()
        )
    );
    assert_eq!(
        std::fs::read_to_string(&f).unwrap(),
        "x",
        "the file is untouched"
    );
}

#[test]
fn store_written_by_a_newer_version_is_refused_untouched() {
    let c = FakeCrate::new();
    let root = c.path().join("store");
    FsStore::create(&root).unwrap();
    let fmt = root.join("puzzletron-store.json");
    std::fs::write(&fmt, r#"{"format": 99}"#).unwrap();
    let e = FsStore::open(&root).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::NewerFormat {
                found: 99,
                supported: puzzletron::store::FORMAT_VERSION,
                ..
            }
        ),
        "{e:?}"
    );
    let want = format!(
        "format version 99, newer than this build's {}",
        puzzletron::store::FORMAT_VERSION
    );
    assert!(e.to_string().contains(&want), "{e}");
    assert_eq!(std::fs::read_to_string(&fmt).unwrap(), r#"{"format": 99}"#);
}

#[test]
fn a_record_that_is_not_json_makes_its_run_corrupt_naming_the_file_and_nothing_else_is_lost() {
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let job = c.job(train);
    let good = o.run(&job, P { lr: 0.1, hidden: 1 }).unwrap();
    let bad = o.run(&job, P { lr: 0.2, hidden: 1 }).unwrap();
    o.drain().unwrap();
    let bad_file = c
        .path()
        .join("store/jobs")
        .join(bad.to_hex())
        .join("record.json");
    std::fs::write(&bad_file, "{ not json").unwrap();

    let mut o = c.orchestrator();
    o.run(&job, P { lr: 0.1, hidden: 1 }).unwrap();
    o.run(&job, P { lr: 0.2, hidden: 1 }).unwrap();
    // The run is corrupt, named with its file (tests/sweep_corrupt.rs: the whole behaviour);
    // the plan is not an error.
    let plan = o.plan().unwrap();
    let d = plan.decisions.iter().find(|d| d.run.key == bad).unwrap();
    assert_eq!(d.action, puzzletron::Action::Corrupt);
    let msg = d.reasons.join("; ");
    assert!(
        msg.starts_with(&format!(
            "corrupt store file {}: not JSON",
            bad_file.display()
        )),
        "{msg}"
    );
    assert!(msg.contains("expected a puzzletron job record"), "{msg}");
    let e = o.store().record(&bad).unwrap_err();
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e:?}");
    // The other result is intact and readable.
    let rec = o.store().record(&good).unwrap().unwrap();
    assert_eq!(rec.status, puzzletron::store::Status::Done);
    assert_eq!(o.store().metrics(&good, Some("loss")).unwrap().len(), 3);
}

#[test]
fn bad_metric_name_fails_the_job_with_the_name() {
    fn bad_name(_: &P, run: &mut Run) -> JobResult {
        run.log("loss\tv2", 0, 1.0)?;
        Ok(())
    }
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    o.run(&c.job(bad_name), P { lr: 0.1, hidden: 1 }).unwrap();
    let e = o.drain().unwrap_err();
    assert!(
        e.to_string().contains(
            "invalid metric name \"loss\\tv2\": expected a non-empty name without tabs or newlines"
        ),
        "{e}"
    );
}

#[test]
fn a_missing_lock_file_given_explicitly_is_an_error() {
    let c = FakeCrate::new();
    let e = Orchestrator::builder()
        .store_root(c.path().join("s"))
        .lock(c.path().join("nope.lock"))
        .build()
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("nope.lock does not exist: expected a Cargo.lock path"),
        "{e}"
    );
}

#[test]
fn store_roots_that_cannot_be_stores_are_refused_untouched() {
    let c = FakeCrate::new();
    let e = FsStore::open("").unwrap_err();
    assert!(
        e.to_string()
            .contains("the path is empty: expected a folder path"),
        "{e}"
    );
    // An unrelated folder with files in it.
    let e = FsStore::create(c.path()).unwrap_err();
    assert!(matches!(e, StoreError::NotAStore { .. }), "{e:?}");
    assert!(
        e.to_string().contains("is not empty")
            && e.to_string().contains("has no puzzletron-store.json"),
        "{e}"
    );
    assert!(
        !c.path().join("jobs").exists(),
        "nothing was written into the unrelated folder"
    );
    // A store nested in another store's jobs folder.
    let outer = c.path().join("store");
    let mut o = c.orchestrator();
    o.run(&c.job(train), P { lr: 0.1, hidden: 1 }).unwrap();
    o.drain().unwrap();
    let e = FsStore::create(outer.join("jobs")).unwrap_err();
    assert!(matches!(e, StoreError::NotAStore { .. }), "{e:?}");
    // Under a file: the root cannot be created.
    let e = FsStore::create(c.path().join("Cargo.lock/sub")).unwrap_err();
    assert!(e.to_string().contains("cannot create the folder"), "{e}");
    // An existing store and a new empty folder are fine.
    FsStore::open(&outer).unwrap();
    std::fs::create_dir(c.path().join("empty")).unwrap();
    FsStore::create(c.path().join("empty")).unwrap();
}

#[test]
fn errors_debug_print_their_message_for_main() {
    let c = FakeCrate::new();
    let (_, e) = build_on_a_file(&c);
    assert_eq!(
        format!("{e:?}"),
        e.to_string(),
        "`fn main() -> Result` shows the readable message"
    );
}

#[derive(Serialize, Deserialize)]
struct WithSet {
    lr: f64,
    model: Model,
}
#[derive(Serialize, Deserialize)]
struct Model {
    name: String,
    frozen: std::collections::HashSet<String>,
}
fn with_set(_: &WithSet, _: &mut Run) -> JobResult {
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct WithMaps {
    tags: std::collections::BTreeSet<String>,
    by_name: std::collections::HashMap<String, f64>,
    by_layer: std::collections::HashMap<u32, f64>,
}
fn with_maps(_: &WithMaps, _: &mut Run) -> JobResult {
    Ok(())
}

/// A HashSet (any depth) would give a new key in every process: refused at `run()` with its
/// path and the fix, and nothing is enqueued. Ordered sets and maps of any kind (canonical
/// JSON sorts keys) are accepted, and their keys are the same for values built anew.
#[test]
fn a_hash_set_parameter_is_refused_with_its_path_and_maps_are_fine() {
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    let e = o
        .run(
            &c.job(with_set),
            WithSet {
                lr: 0.1,
                model: Model {
                    name: "mlp".into(),
                    frozen: ["embed", "head", "norm"].map(String::from).into(),
                },
            },
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("bad parameters for job fake::train: parameter `model.frozen` lists its elements in a different order"),
        "{msg}"
    );
    assert!(msg.contains("BTreeSet or BTreeMap"), "{msg}");
    assert!(!e.is_retryable());
    assert!(o.queued().is_empty(), "a refused run must not be enqueued");

    let make = || WithMaps {
        tags: ["b", "a"].map(String::from).into(),
        by_name: (0..16).map(|i| (format!("w{i}"), i as f64)).collect(),
        by_layer: (0..16).map(|i| (i, i as f64 / 2.0)).collect(),
    };
    let k1 = o.run(&c.job(with_maps), make()).unwrap();
    let k2 = o.run(&c.job(with_maps), make()).unwrap();
    assert_eq!(k1, k2, "equal maps built anew must give one key");
    assert_eq!(o.queued().len(), 1);
}

#[derive(Serialize, Deserialize)]
struct Typed {
    lr: f64,
    layers: u32,
    wide: bool,
    act: String,
    dropout: Option<f64>,
}
fn typed(p: &Typed, run: &mut Run) -> JobResult {
    run.log("loss", 0, p.lr)?;
    Ok(())
}

/// A column's Arrow type comes from the parameter's Rust type, not from the values: whole f64
/// values stay Float64, in `get`, `recorded` and `MetricsExt::metric_table` alike, and an
/// `Option` that is `None` in every run is still a column of its own type (nulls), a `u32` is
/// `UInt64`.
#[test]
fn metric_columns_take_their_type_from_the_rust_type() {
    use puzzletron::arrow::DataType;
    use puzzletron::metrics::MetricsExt;
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    for lr in [1.0, 2.0] {
        o.run(
            &c.job(typed),
            Typed {
                lr,
                layers: 2,
                wide: true,
                act: "relu".into(),
                dropout: None,
            },
        )
        .unwrap();
    }
    let t = o.get("loss").unwrap();
    let schema = t.batch().schema();
    let ty = |n: &str| schema.field_with_name(n).unwrap().data_type().clone();
    assert_eq!(ty("lr"), DataType::Float64);
    assert_eq!(ty("layers"), DataType::UInt64);
    assert_eq!(
        ty("dropout"),
        DataType::Float64,
        "Option<f64>, None in every run"
    );
    assert_eq!(t.f64s("dropout").unwrap(), [None, None]);
    assert_eq!(ty("wide"), DataType::Boolean);
    assert_eq!(ty("act"), DataType::Utf8);
    assert_eq!(t.f64s("lr").unwrap(), [Some(1.0), Some(2.0)]);
    let stored = o.store().metric_table("loss").unwrap();
    assert_eq!(
        stored.batch().schema(),
        schema,
        "the store's table has the same schema"
    );
    assert_eq!(o.recorded("loss").unwrap().batch().schema(), schema);
    // The record says the types, for other tools too.
    let rec = o.store().record(&o.enqueued()[0].key).unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&rec.param_types).unwrap(),
        serde_json::json!({
            "act": "string", "dropout": "float", "layers": "uint", "lr": "float", "wide": "bool"
        })
    );
}

#[test]
fn an_unreadable_claim_file_is_reported_with_its_path_and_taken_over_after_the_stale_interval() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    let c = FakeCrate::new();
    let root = c.path().join("store");
    let stale = Duration::from_millis(300);
    let store = FsStore::create(&root).unwrap().with_stale_after(stale);
    let events: Arc<Mutex<Vec<String>>> = Arc::default();
    let ev = events.clone();
    let mut o = Orchestrator::builder()
        .store(store.clone())
        .lock(c.lock())
        .wait_poll(Duration::from_millis(20))
        .on_event(move |e| ev.lock().unwrap().push(e.to_string()))
        .build()
        .unwrap();
    let key = o.run(&c.job(train), P { lr: 0.5, hidden: 2 }).unwrap();
    // A claim file a crash (or a hand) left damaged: no owner to ask.
    let claim = store.job_dir(&key).join("claim");
    std::fs::create_dir_all(store.job_dir(&key)).unwrap();
    std::fs::write(&claim, b"{\"host\": \"node01\", \"pid\": 1").unwrap();
    let t = std::time::Instant::now();
    let summary = o.drain().expect("never a crash of the drain");
    assert!(t.elapsed() >= stale, "not free at once");
    assert_eq!(summary.ran(), 1);
    let events = events.lock().unwrap();
    let waiting = events
        .iter()
        .find(|e| e.contains(&claim.display().to_string()))
        .unwrap_or_else(|| panic!("the claim file is named: {events:?}"));
    assert!(waiting.contains("cannot be read as an owner"), "{waiting}");
    assert!(waiting.contains("0 s stale interval"), "{waiting}");
    let rec = store.record(&key).unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.attempt),
        (puzzletron::store::Status::Done, 2)
    );
}

#[derive(Serialize, Deserialize)]
struct Skips {
    lr: f64,
    /// Not in the key, so not in the run: the job sees the default.
    #[serde(skip)]
    seed: u64,
}
fn skips(p: &Skips, run: &mut Run) -> JobResult {
    run.log("seed", 0, p.seed as f64)?;
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct Stricter {
    /// Written as a float, read back only as an integer.
    #[serde(deserialize_with = "int_only")]
    lr: f64,
}
fn int_only<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    u32::deserialize(d).map(f64::from)
}
fn stricter(_: &Stricter, _: &mut Run) -> JobResult {
    Ok(())
}

#[test]
fn parameters_that_do_not_come_back_from_their_json_are_refused_at_enqueue() {
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    // A decoder that refuses what the encoder wrote: named with its message and the text.
    let e = o
        .run(&c.job(stricter), Stricter { lr: 0.5 })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("Stricter") && e.contains("invalid type") && e.contains(r#"{"lr":0.5}"#),
        "{e}"
    );
    assert!(o.enqueued().is_empty(), "nothing refused is queued");
    // A value that round-trips is accepted by the same sweep.
    assert!(o.run(&c.job(stricter), Stricter { lr: 2.0 }).is_ok());
}

#[test]
fn a_run_executes_the_parameters_its_key_covers_not_a_skipped_field() {
    use puzzletron::metrics::MetricsExt;
    let c = FakeCrate::new();
    let mut o = c.orchestrator();
    // `seed` is skipped by serde: the key does not cover it, so two runs that differ only in
    // it are one run, and the job sees what the key covers (the default), in process as in a
    // worker, never a value that a later cache hit would silently ignore.
    let a = o.run(&c.job(skips), Skips { lr: 0.1, seed: 7 }).unwrap();
    let b = o.run(&c.job(skips), Skips { lr: 0.1, seed: 8 }).unwrap();
    assert_eq!(a, b);
    assert_eq!(o.drain().unwrap().ran(), 1);
    let t = o.store().metric_table("seed").unwrap();
    assert_eq!(t.num_rows(), 1);
    assert_eq!(t.values(), [0.0]);
}
