//! [`MemoryStore`]: the [`Store`] semantics in memory, for tests and ephemeral sweeps.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{
    Claim, ClaimInfo, ClaimOutcome, DEFAULT_STALE_AFTER, JobRecord, Liveness, MetricSink,
    MetricsInfo, Owner, Series, Status, Store, StoreError, check_metric_name,
};
use crate::identity::Hash;

#[derive(Default)]
struct Entry {
    record: Option<JobRecord>,
    claim: Option<(Owner, Instant)>,
    /// Rows per attempt.
    rows: HashMap<u32, Arc<Mutex<Series>>>,
}

#[derive(Default)]
struct Inner {
    jobs: HashMap<Hash, Entry>,
    lineage: HashMap<Hash, Hash>,
}

/// A [`Store`] in memory, shared by clones (and threads) of one value; gone when the last clone
/// drops. Claims are exclusive between owners; a claim whose owner process is gone (judged as
/// for [`super::FsStore`]) or whose heartbeat is older than `stale_after` is taken over.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    stale_after: Duration,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("stale_after", &self.stale_after)
            .finish()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            inner: Arc::default(),
            stale_after: DEFAULT_STALE_AFTER,
        }
    }

    /// Sets how long a claim may go without a heartbeat before it is taken over (default 60 s).
    pub fn with_stale_after(mut self, stale_after: Duration) -> Self {
        self.stale_after = stale_after;
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This process's owners are live, owners proved dead are not, and the others are live
    /// while their heartbeat (an `Instant` of this process's own clock) is younger than
    /// `stale_after` (see [`Owner::liveness`]).
    fn judge(&self, owner: &Owner, beat: Instant) -> bool {
        match owner.liveness() {
            Liveness::Ours => true,
            Liveness::Dead => false,
            _ => beat.elapsed() < self.stale_after,
        }
    }

    fn held<'a>(&self, inner: &'a mut Inner, claim: &Claim) -> Result<&'a mut Entry, StoreError> {
        let lost = || StoreError::ClaimLost {
            key: claim.key,
            owner: claim.owner.to_string(),
        };
        let e = inner.jobs.get_mut(&claim.key).ok_or_else(lost)?;
        match &e.claim {
            Some((o, _)) if o.nonce == claim.owner.nonce => Ok(e),
            _ => Err(lost()),
        }
    }
}

impl Store for MemoryStore {
    fn location(&self) -> String {
        "memory".into()
    }

    fn record(&self, key: &Hash) -> Result<Option<JobRecord>, StoreError> {
        Ok(self.lock().jobs.get(key).and_then(|e| e.record.clone()))
    }

    fn records(&self, keys: &[Hash]) -> Result<Vec<Option<JobRecord>>, StoreError> {
        let inner = self.lock();
        Ok(keys
            .iter()
            .map(|k| inner.jobs.get(k).and_then(|e| e.record.clone()))
            .collect())
    }

    fn keys(&self) -> Result<Vec<Hash>, StoreError> {
        let inner = self.lock();
        let mut keys: Vec<Hash> = inner
            .jobs
            .iter()
            .filter(|(_, e)| e.record.is_some())
            .map(|(k, _)| *k)
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn lineage(&self, lineage: &Hash) -> Result<Option<Hash>, StoreError> {
        Ok(self.lock().lineage.get(lineage).copied())
    }

    fn set_lineage(&self, lineage: &Hash, key: &Hash) -> Result<(), StoreError> {
        self.lock().lineage.insert(*lineage, *key);
        Ok(())
    }

    fn claim_info(&self, key: &Hash) -> Result<Option<ClaimInfo>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .jobs
            .get(key)
            .and_then(|e| e.claim.as_ref())
            .map(|(o, beat)| ClaimInfo::new(o.clone(), self.judge(o, *beat))))
    }

    fn claim(
        &self,
        key: &Hash,
        owner: &Owner,
        replace_done: Option<u32>,
    ) -> Result<ClaimOutcome, StoreError> {
        let mut inner = self.lock();
        let e = inner.jobs.entry(*key).or_default();
        if let Some(r) = &e.record
            && r.status == Status::Done
            && replace_done != Some(r.attempt)
        {
            return Ok(ClaimOutcome::Done(Box::new(r.clone())));
        }
        if let Some((o, beat)) = &e.claim
            && self.judge(o, *beat)
        {
            return Ok(ClaimOutcome::Busy(o.clone()));
        }
        e.claim = Some((owner.clone(), Instant::now()));
        let attempt = e.record.as_ref().map(|r| r.attempt).unwrap_or(0) + 1;
        Ok(ClaimOutcome::Claimed(Claim {
            key: *key,
            owner: owner.clone(),
            attempt,
        }))
    }

    fn start(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let e = self.held(&mut inner, claim)?;
        e.record = Some(record.clone());
        e.rows.remove(&claim.attempt);
        inner.lineage.insert(record.lineage, claim.key);
        Ok(())
    }

    fn metric_sink(&self, claim: &Claim) -> Result<Box<dyn MetricSink>, StoreError> {
        let mut inner = self.lock();
        let e = self.held(&mut inner, claim)?;
        let series = Arc::new(Mutex::new(Series::default()));
        e.rows.insert(claim.attempt, series.clone());
        Ok(Box::new(MemSink {
            series,
            attempt: claim.attempt,
            names: BTreeSet::new(),
        }))
    }

    fn finish(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let e = self.held(&mut inner, claim)?;
        e.record = Some(record.clone());
        e.claim = None;
        Ok(())
    }

    fn release(&self, claim: &Claim) -> Result<(), StoreError> {
        let mut inner = self.lock();
        if let Ok(e) = self.held(&mut inner, claim) {
            e.claim = None;
        }
        Ok(())
    }

    /// A quarter of the stale interval, at most 10 s (see [`super::heartbeat_for`]).
    fn heartbeat_interval(&self) -> Duration {
        super::heartbeat_for(self.stale_after)
    }

    fn heartbeat(&self, claim: &Claim) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let e = self.held(&mut inner, claim)?;
        if let Some((_, beat)) = &mut e.claim {
            *beat = Instant::now();
        }
        Ok(())
    }

    fn metrics(&self, key: &Hash, name: Option<&str>) -> Result<Series, StoreError> {
        let inner = self.lock();
        let Some(e) = inner.jobs.get(key) else {
            return Ok(Series::default());
        };
        let Some(r) = e.record.as_ref().filter(|r| r.status != Status::Running) else {
            return Ok(Series::default());
        };
        let Some(info) = &r.metrics else {
            return Ok(Series::default());
        };
        let Some(rows) = e.rows.get(&r.attempt) else {
            return Err(StoreError::Corrupt {
                path: format!("memory:{key}").into(),
                reason: format!(
                    "attempt {} has no rows; the record says {}",
                    r.attempt, info.rows
                ),
            });
        };
        let all = rows.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Series::default();
        for i in 0..(info.rows as usize).min(all.len()) {
            let n = &all.names[all.name_index[i] as usize];
            if name.is_none_or(|want| want == n) {
                out.push(n, all.step[i], all.value[i]);
            }
        }
        Ok(out)
    }
}

struct MemSink {
    series: Arc<Mutex<Series>>,
    attempt: u32,
    names: BTreeSet<String>,
}

impl MetricSink for MemSink {
    fn append(&mut self, name: &str, step: i64, value: f64) -> Result<(), StoreError> {
        check_metric_name(name)?;
        self.series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name, step, value);
        if !self.names.contains(name) {
            self.names.insert(name.to_string());
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    fn summary(&self) -> MetricsInfo {
        let rows = self.series.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
        MetricsInfo {
            file: format!("memory:attempt-{}", self.attempt),
            rows,
            names: self.names.iter().cloned().collect(),
            inline: None,
        }
    }
}
