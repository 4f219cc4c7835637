//! The store API as a user sees it: a sweep over a borrowed store (`&S`, as the `Store` docs
//! say it is forwarded), a user store's own backend errors (`StoreError::Backend`, retried
//! only when it says so), and `FsStore::open` that never makes a store out of a misspelt path
//! (`FsStore::create` does, and a sweep's first run creates its default store).

mod support;

use puzzletron::FailureCause;
use puzzletron::store::{
    Claim, ClaimInfo, ClaimOutcome, JobRecord, MetricSink, Owner, Series, StoreError,
};
use puzzletron::{
    Error, Orchestrator, identity::Hash, metrics::MetricsExt, store::FsStore, store::MemoryStore,
    store::Store, store::StoreExt,
};
use support::sweep::{FakeCrate, P, train};

#[test]
fn a_sweep_borrows_a_store_and_the_store_outlives_it() {
    let c = FakeCrate::new();
    let fs = FsStore::create(c.path().join("store")).unwrap();
    {
        let mut o = Orchestrator::builder()
            .store(&fs)
            .lock(c.lock())
            .build()
            .unwrap();
        o.run(&c.job(train), P { lr: 0.5, hidden: 3 }).unwrap();
        assert_eq!(o.drain().unwrap().ran(), 1);
        assert_eq!(o.recorded("loss").unwrap().num_rows(), 3);
    }
    // The store, borrowed by the sweep, is still ours, with the sweep's run in it.
    assert_eq!(fs.metric_table("loss").unwrap().num_rows(), 3);

    // A borrowed in-memory store: the only way to read its results after the sweep.
    let mem = MemoryStore::new();
    let mut o = Orchestrator::builder()
        .store(&mem)
        .lock(c.lock())
        .build()
        .unwrap();
    o.run(&c.job(train), P { lr: 0.5, hidden: 3 }).unwrap();
    o.run(&c.job(train), P { lr: 0.7, hidden: 3 }).unwrap();
    assert_eq!(o.drain().unwrap().ran(), 2);
    drop(o);
    assert_eq!(mem.done_records().unwrap().len(), 2);
}

/// A user store (here over a `MemoryStore`) whose backend fails every claim with its own
/// error, retryable or not.
struct Flaky {
    inner: MemoryStore,
    retryable: bool,
}

impl Store for Flaky {
    fn location(&self) -> String {
        "flaky-db://test".into()
    }
    fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError> {
        self.inner.record(key)
    }
    fn keys(&self) -> Result<Vec<Hash>, StoreError> {
        self.inner.keys()
    }
    fn lineage(&self, lineage: &Hash) -> Result<Option<Hash>, StoreError> {
        self.inner.lineage(lineage)
    }
    fn set_lineage(&self, lineage: &Hash, key: &Hash) -> Result<(), StoreError> {
        self.inner.set_lineage(lineage, key)
    }
    fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
        self.inner.claim_info(key)
    }
    fn claim(
        &self,
        _key: &Hash,
        _owner: &Owner,
        _replace_done: Option<u32>,
    ) -> Result<ClaimOutcome, StoreError> {
        let why = if self.retryable {
            "database is locked"
        } else {
            "no such table: claims"
        };
        Err(StoreError::backend(
            std::io::Error::other(why),
            self.retryable,
        ))
    }
    fn start(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        self.inner.start(claim, record)
    }
    fn metric_sink(&self, claim: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
        self.inner.metric_sink(claim)
    }
    fn finish(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        self.inner.finish(claim, record)
    }
    fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        self.inner.release(claim)
    }
    fn heartbeat(&self, claim: &Claim) -> Result<(), StoreError> {
        self.inner.heartbeat(claim)
    }
    fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError> {
        self.inner.metrics(key, name)
    }
}

#[test]
fn a_backend_error_of_a_user_store_is_retried_only_when_it_says_so() {
    let c = FakeCrate::new();
    for retryable in [true, false] {
        let mut o = Orchestrator::builder()
            .store(Flaky {
                inner: MemoryStore::new(),
                retryable,
            })
            .lock(c.lock())
            .build()
            .unwrap();
        o.run(&c.job(train), P { lr: 0.5, hidden: 3 }).unwrap();
        let failed = o.drain().unwrap_err();
        let FailureCause::Store(e) = &failed.cause else {
            panic!("the store's error stops the drain: {failed}");
        };
        assert!(
            matches!(e, StoreError::Backend { retryable: r, .. } if *r == retryable),
            "the backend's error is passed through as it is: {e:?}"
        );
        assert_eq!(e.is_retryable(), retryable, "{e}");
        assert_eq!(failed.is_retryable(), retryable, "{failed}");
        let why = if retryable {
            "database is locked"
        } else {
            "no such table: claims"
        };
        // The source chain reaches the backend's own error.
        let src = std::error::Error::source(e).expect("the backend error is the source");
        assert_eq!(src.to_string(), why);
        let whole: Error = failed.into();
        assert_eq!(whole.is_retryable(), retryable, "{whole}");
        let text = whole.to_string();
        assert!(text.contains(why), "the backend's own message: {text}");
        assert!(
            text.contains(if retryable {
                "may succeed if retried"
            } else {
                "retrying will not help"
            }),
            "{text}"
        );
    }
}

#[test]
fn fs_store_open_refuses_a_missing_path_and_create_makes_it() {
    let c = FakeCrate::new();
    let typo = c.path().join("stroe");
    let e = FsStore::open(&typo).unwrap_err();
    assert!(matches!(e, StoreError::NotFound { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&typo.display().to_string())
            && text.contains("does not exist")
            && text.contains("FsStore::create"),
        "names the path and the fix: {text}"
    );
    assert!(!e.is_retryable());
    assert!(!typo.exists(), "nothing was created at the misspelt path");

    // An existing folder that holds no store is not one either (and is left alone).
    let empty = c.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = FsStore::open(&empty).unwrap_err();
    assert!(matches!(e, StoreError::NotAStore { .. }), "{e:?}");
    assert!(
        e.to_string().contains("puzzletron-store.json") && e.to_string().contains("create"),
        "{e}"
    );
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "left empty");

    // `create` makes it (and opens it again); `open` then finds it.
    let root = c.path().join("store");
    FsStore::create(&root).unwrap();
    FsStore::create(&root).unwrap();
    assert!(root.join("puzzletron-store.json").is_file());
    FsStore::open(&root).unwrap();
    FsStore::create(&empty).unwrap();
    FsStore::open(&empty).unwrap();

    // A file is not a store, whichever way it is opened.
    let file = c.path().join("Cargo.lock");
    assert!(matches!(
        FsStore::open(&file),
        Err(StoreError::NotADirectory { .. })
    ));
    assert!(matches!(
        FsStore::create(&file),
        Err(StoreError::NotADirectory { .. })
    ));
}

#[test]
fn a_first_sweep_creates_its_store() {
    let c = FakeCrate::new();
    let root = c.path().join("new/nested/store");
    let mut o = Orchestrator::builder()
        .store_root(&root)
        .lock(c.lock())
        .build()
        .unwrap();
    o.run(&c.job(train), P { lr: 0.5, hidden: 3 }).unwrap();
    assert_eq!(o.drain().unwrap().ran(), 1);
    assert_eq!(
        FsStore::open(&root)
            .unwrap()
            .metric_table("loss")
            .unwrap()
            .num_rows(),
        3
    );
}
