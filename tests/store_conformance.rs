//! A user's own `Store` runs the same conformance suite as ours (feature `test-util`).
//! Here: a store that wraps `MemoryStore` and counts calls, as a user's caching layer might.

use std::sync::atomic::{AtomicUsize, Ordering};

use puzzletron::identity::Hash;
use puzzletron::store::{
    Claim, ClaimInfo, ClaimOutcome, JobRecord, MemoryStore, MetricSink, Owner, Series, Store,
    StoreError, conformance,
};

#[derive(Default)]
struct Counting {
    inner: MemoryStore,
    calls: AtomicUsize,
}

impl Counting {
    fn tick(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

impl Store for Counting {
    fn location(&self) -> String {
        format!("counting({})", self.inner.location())
    }
    fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError> {
        self.tick();
        self.inner.record(key)
    }
    fn keys(&self) -> Result<Vec<Hash>, StoreError> {
        self.tick();
        self.inner.keys()
    }
    fn lineage(&self, l: &Hash) -> Result<Option<Hash>, StoreError> {
        self.tick();
        self.inner.lineage(l)
    }
    fn set_lineage(&self, l: &Hash, k: &Hash) -> Result<(), StoreError> {
        self.tick();
        self.inner.set_lineage(l, k)
    }
    fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
        self.tick();
        self.inner.claim_info(key)
    }
    fn claim(&self, key: &Hash, o: &Owner, r: Option<u32>) -> Result<ClaimOutcome, StoreError> {
        self.tick();
        self.inner.claim(key, o, r)
    }
    fn start(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
        self.tick();
        self.inner.start(c, r)
    }
    fn metric_sink(&self, c: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
        self.tick();
        self.inner.metric_sink(c)
    }
    fn finish(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
        self.tick();
        self.inner.finish(c, r)
    }
    fn release(&self, c: &Claim) -> Result<(), StoreError> {
        self.tick();
        self.inner.release(c)
    }
    fn heartbeat(&self, c: &Claim) -> Result<(), StoreError> {
        self.tick();
        self.inner.heartbeat(c)
    }
    fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError> {
        self.tick();
        self.inner.metrics(key, name)
    }
}

#[test]
fn a_user_store_passes_the_conformance_suite() {
    conformance::run_all(Counting::default);
}

/// The suite is not a rubber stamp: a store whose claims are not exclusive fails it.
#[test]
fn a_store_without_exclusive_claims_fails_the_suite() {
    struct Sloppy(MemoryStore);
    impl Store for Sloppy {
        fn location(&self) -> String {
            "sloppy".into()
        }
        fn record(&self, k: &Hash) -> Result<Option<JobRecord>, StoreError> {
            self.0.record(k)
        }
        fn keys(&self) -> Result<Vec<Hash>, StoreError> {
            self.0.keys()
        }
        fn lineage(&self, l: &Hash) -> Result<Option<Hash>, StoreError> {
            self.0.lineage(l)
        }
        fn set_lineage(&self, l: &Hash, k: &Hash) -> Result<(), StoreError> {
            self.0.set_lineage(l, k)
        }
        fn claim_info(&self, k: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
            self.0.claim_info(k)
        }
        fn claim(&self, k: &Hash, o: &Owner, r: Option<u32>) -> Result<ClaimOutcome, StoreError> {
            // Bug: releases any existing claim first.
            if let Some(info) = self.0.claim_info(k)? {
                let c = Claim::new(*k, info.owner, 1);
                self.0.release(&c)?;
            }
            self.0.claim(k, o, r)
        }
        fn start(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
            self.0.start(c, r)
        }
        fn metric_sink(&self, c: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
            self.0.metric_sink(c)
        }
        fn finish(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
            self.0.finish(c, r)
        }
        fn release(&self, c: &Claim) -> Result<(), StoreError> {
            self.0.release(c)
        }
        fn heartbeat(&self, c: &Claim) -> Result<(), StoreError> {
            self.0.heartbeat(c)
        }
        fn metrics(&self, k: &Hash, n: Option<&str>) -> Result<Series, StoreError> {
            self.0.metrics(k, n)
        }
    }
    let store = Sloppy(MemoryStore::new());
    let caught = std::panic::catch_unwind(|| conformance::claim_is_exclusive(&store));
    assert!(
        caught.is_err(),
        "the suite must catch a store whose claims are not exclusive"
    );
}

/// A failure of `run_all` names the check and the rule it broke, and shows what the store did
/// (it was a bare `left: 1 right: 2`).
#[test]
#[should_panic(
    expected = "store conformance `lifecycle_done`: keys must list the one job with a record"
)]
fn a_failure_names_the_check_and_the_rule() {
    /// Forgets its keys: `keys()` is always empty.
    struct NoKeys(MemoryStore);
    impl Store for NoKeys {
        fn location(&self) -> String {
            "no-keys".into()
        }
        fn record(&self, k: &Hash) -> Result<Option<JobRecord>, StoreError> {
            self.0.record(k)
        }
        fn keys(&self) -> Result<Vec<Hash>, StoreError> {
            Ok(Vec::new())
        }
        fn lineage(&self, l: &Hash) -> Result<Option<Hash>, StoreError> {
            self.0.lineage(l)
        }
        fn set_lineage(&self, l: &Hash, k: &Hash) -> Result<(), StoreError> {
            self.0.set_lineage(l, k)
        }
        fn claim_info(&self, k: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
            self.0.claim_info(k)
        }
        fn claim(&self, k: &Hash, o: &Owner, r: Option<u32>) -> Result<ClaimOutcome, StoreError> {
            self.0.claim(k, o, r)
        }
        fn start(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
            self.0.start(c, r)
        }
        fn metric_sink(&self, c: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
            self.0.metric_sink(c)
        }
        fn finish(&self, c: &Claim, r: &JobRecord) -> Result<(), StoreError> {
            self.0.finish(c, r)
        }
        fn release(&self, c: &Claim) -> Result<(), StoreError> {
            self.0.release(c)
        }
        fn heartbeat(&self, c: &Claim) -> Result<(), StoreError> {
            self.0.heartbeat(c)
        }
        fn metrics(&self, k: &Hash, n: Option<&str>) -> Result<Series, StoreError> {
            self.0.metrics(k, n)
        }
    }
    conformance::run_all(|| NoKeys(MemoryStore::new()));
}
