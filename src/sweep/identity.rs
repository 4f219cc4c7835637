//! The orchestrator's identity bookkeeping: compiled owned digests per job, the build witnesses
//! they carry, `trace(true)` re-checks and the texts of `no record` reasons.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::decision::Action;
use super::pending::PendingRun;
use crate::error::Result;
use crate::identity::{self, CompiledCode, Hash, LockWitness, OwnedDigest, Witnesses};
use crate::store::{JobRecord, Status, Store, StoreError};

/// Most records read to explain a `no record` (beyond that the reason stays `no record`).
const MAX_SCAN: usize = 10_000;

/// Runs that get a "nearest" hint in their `no record` reason, per sweep: a hint is for the
/// few runs of a grid someone edited (a parse and up to [`MAX_COMPARED`] comparisons each);
/// a plan of a million new runs beside a store of earlier ones would spend seconds on hints
/// nobody reads.
const MAX_HINTS: usize = 1000;

/// When it was made, how long making it took, and per job name the parameters of its runs.
type ParamsIndex = (Instant, Duration, HashMap<String, Vec<serde_json::Value>>);

pub(super) struct JobIdentities {
    trace: bool,
    /// Whether the Cargo.lock witness comes from the jobs (no explicit `lock(path)`).
    lock_from_jobs: bool,
    compiled: Vec<(usize, Arc<OwnedDigest>)>,
    /// `trace(true)`: per job name, the covered files that differ from the binary's.
    stale: HashMap<String, Vec<&'static str>>,
    params: Mutex<Option<ParamsIndex>>,
    /// Hints given so far (see [`MAX_HINTS`]).
    hints: std::sync::atomic::AtomicUsize,
}

/// A copy for a drain on a thread of its own ([`drain_async`](super::Orchestrator::drain_async)).
impl Clone for JobIdentities {
    fn clone(&self) -> Self {
        Self {
            trace: self.trace,
            lock_from_jobs: self.lock_from_jobs,
            compiled: self.compiled.clone(),
            stale: self.stale.clone(),
            params: Mutex::new(
                self.params
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            ),
            hints: std::sync::atomic::AtomicUsize::new(
                self.hints.load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }
}

impl JobIdentities {
    pub(super) fn new(trace: bool, lock_from_jobs: bool) -> Self {
        Self {
            trace,
            lock_from_jobs,
            compiled: Vec::new(),
            stale: HashMap::new(),
            params: Mutex::new(None),
            hints: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Lets the next [`MAX_HINTS`] runs without a record have a "nearest" hint (each plan,
    /// drain or decision starts anew).
    pub(super) fn reset_hints(&self) {
        self.hints.store(0, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether `trace(true)` re-checks done records' items (then no decision skips the record).
    pub(super) fn traces(&self) -> bool {
        self.trace
    }

    /// The owned digest of a `job!` job (made once per job), and its build witnesses.
    pub(super) fn compiled(
        &mut self,
        job: &str,
        code: &'static CompiledCode,
        witnesses: &mut Witnesses,
    ) -> Arc<OwnedDigest> {
        let id = code as *const CompiledCode as usize;
        if let Some((_, d)) = self.compiled.iter().find(|(p, _)| *p == id) {
            return d.clone();
        }
        if self.lock_from_jobs
            && witnesses.cargo_lock.is_none()
            && let Some((path, digest)) = code.lock
            && let Ok(digest) = digest.parse::<Hash>()
        {
            witnesses.cargo_lock = Some(LockWitness {
                path: path.into(),
                digest,
            });
        }
        if witnesses.toolchain.profile.is_none() {
            witnesses.toolchain.profile = Some(code.profile());
        }
        // Said once per job, by the driver: an isolated worker (a process the driver started,
        // which computes the same keys) stays quiet, so a sweep says it once, not once per run.
        let worker = std::env::var_os(super::worker::MANIFEST_ENV).is_some();
        if !code.notes.is_empty() && !worker {
            // What the analysis included conservatively.
            static SAID: Mutex<Vec<usize>> = Mutex::new(Vec::new());
            if let Ok(mut said) = SAID.lock()
                && !said.contains(&id)
            {
                said.push(id);
                for n in code.notes {
                    tracing_note(job, n);
                }
            }
        }
        if self.trace {
            self.stale.insert(job.to_string(), code.stale_files());
        }
        let d = Arc::new(code.owned());
        self.compiled.push((id, d.clone()));
        d
    }

    /// For jobs without compiled identity: the Cargo.lock upward from the job's crate folder.
    pub(super) fn runtime_lock(
        &mut self,
        crate_dir: &Path,
        witnesses: &mut Witnesses,
    ) -> Result<()> {
        if self.lock_from_jobs
            && witnesses.cargo_lock.is_none()
            && let Some(p) = identity::find_lock_file(crate_dir)
        {
            witnesses.cargo_lock = Some(identity::lock_witness(&p)?);
        }
        Ok(())
    }

    /// `trace(true)`: re-check a done record's per-item digests against this binary's, and say
    /// when this binary is stale for its sources.
    pub(super) fn trace_check(
        &self,
        run: &PendingRun,
        rec: Option<&JobRecord>,
        action: &mut Action,
        reasons: &mut Vec<String>,
        replaces: &mut Option<u32>,
    ) {
        if !self.trace {
            return;
        }
        if let Some(r) = rec
            && r.status == Status::Done
            && *action == Action::Skip
            && (r.owned.items != run.owned().items || r.owned.cfg != run.owned().cfg)
        {
            *action = Action::Run;
            *replaces = Some(r.attempt);
            reasons.clear();
            reasons.extend(
                identity::code_differences(run.owned(), &r.owned)
                    .into_iter()
                    .map(|d| format!("trace: recorded items differ: {d}")),
            );
        }
        if let Some(files) = self.stale.get(run.job())
            && !files.is_empty()
        {
            reasons.push(format!(
                "stale binary: {} changed after this binary was built (rebuild to run the new code)",
                files.join(", ")
            ));
        }
    }

    /// The reason for a run with no record and no earlier run of its lineage: `no record`,
    /// with its nearest neighbour as a hint (`no record (nearest: params changed: dropout 0.5
    /// -> 0.25)`) when the store has a run of the same job whose parameters differ (the
    /// closest one).
    pub(super) fn no_record_reason<S: Store + ?Sized>(
        &self,
        store: &S,
        run: &PendingRun,
    ) -> std::result::Result<String, StoreError> {
        let mut guard = self.params.lock().unwrap_or_else(|e| e.into_inner());
        // Kept for 2 s, or 20 times as long as it took to make, so that a first pass over a
        // growing store spends at most ~5% of its time rebuilding it.
        let fresh = guard
            .as_ref()
            .is_some_and(|(at, took, _)| at.elapsed() < Duration::from_secs(2).max(*took * 20));
        if !fresh {
            let t0 = Instant::now();
            let mut index: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
            let keys = store.keys()?;
            if keys.len() <= MAX_SCAN {
                // A corrupt record is no neighbour (it is reported where it is decided).
                for r in crate::store::records_per_key(store, &keys)? {
                    if let Ok(Some(r)) = r {
                        index.entry(r.job).or_default().push(r.params);
                    }
                }
            }
            *guard = Some((Instant::now(), t0.elapsed(), index));
        }
        let others = guard
            .as_ref()
            .and_then(|(_, _, ix)| ix.get(run.job()))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        if others.is_empty()
            || self
                .hints
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                >= MAX_HINTS
        {
            // No run of the job to compare with (a first pass), or hints enough: no parse of
            // the parameters.
            return Ok("no record".to_string());
        }
        let new = run.params_value();
        Ok(match params_changed(&new, others) {
            Some(hint) => format!("no record (nearest: {hint})"),
            None => "no record".to_string(),
        })
    }
}

fn tracing_note(job: &str, note: &str) {
    tracing::warn!(job, "identity: {note}");
}

/// At most this many runs of the job (the latest stored) are compared by [`params_changed`]: a
/// first pass over a growing store would otherwise compare every new run with every stored one.
const MAX_COMPARED: usize = 2048;

/// `params changed: a 1 -> 2, b 3 -> 4` against the closest of `others` (fewest differing
/// top-level fields; among the last [`MAX_COMPARED`]); `None` when `others` is empty or one of
/// them is equal.
pub(super) fn params_changed(
    new: &serde_json::Value,
    others: &[serde_json::Value],
) -> Option<String> {
    let empty = serde_json::Map::new();
    let new_f = new.as_object().unwrap_or(&empty);
    // Counted without allocating; only the closest run's differences are written out.
    let differing = |old: &serde_json::Value| -> usize {
        let old_f = old.as_object().unwrap_or(&empty);
        new_f
            .iter()
            .filter(|(n, v)| old_f.get(*n) != Some(*v))
            .count()
            + old_f.keys().filter(|n| !new_f.contains_key(*n)).count()
    };
    let mut best: Option<(usize, &serde_json::Value)> = None;
    // Ties go to the earliest, as before the cap.
    for old in &others[others.len().saturating_sub(MAX_COMPARED)..] {
        let d = differing(old);
        if d == 0 {
            return None;
        }
        if best.is_none_or(|(b, _)| d < b) {
            best = Some((d, old));
        }
    }
    let (_, old) = best?;
    let old_f = old.as_object().unwrap_or(&empty);
    let mut names: Vec<&String> = new_f.keys().chain(old_f.keys()).collect();
    names.sort();
    names.dedup();
    let show = |v: Option<&serde_json::Value>| v.map_or_else(|| "(none)".into(), |v| v.to_string());
    let d: Vec<String> = names
        .into_iter()
        .filter(|n| new_f.get(*n) != old_f.get(*n))
        .map(|n| format!("{n} {} -> {}", show(old_f.get(n)), show(new_f.get(n))))
        .collect();
    Some(format!("params changed: {}", d.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn params_changed_names_the_fields_of_the_closest_run() {
        let new = json!({"lr": 0.1, "dropout": 0.25});
        let others = [
            json!({"lr": 0.2, "dropout": 0.5}),
            json!({"lr": 0.1, "dropout": 0.5}),
        ];
        assert_eq!(
            params_changed(&new, &others).unwrap(),
            "params changed: dropout 0.5 -> 0.25"
        );
        assert_eq!(params_changed(&new, &[]), None);
        assert_eq!(params_changed(&new, std::slice::from_ref(&new)), None);
        assert_eq!(
            params_changed(&json!({"a": 1}), &[json!({"a": 1, "b": 2})]).unwrap(),
            "params changed: b 2 -> (none)"
        );
        // The closest wins whatever its position; an equal run means no params reason.
        let mut many: Vec<_> = (0..100).map(|i| json!({"lr": i, "dropout": 0.5})).collect();
        many.push(json!({"lr": 0.1, "dropout": 0.5}));
        many.push(json!({"lr": 7, "dropout": 0.1}));
        assert_eq!(
            params_changed(&new, &many).unwrap(),
            "params changed: dropout 0.5 -> 0.25"
        );
        many.insert(50, new.clone());
        assert_eq!(params_changed(&new, &many), None);
    }
}
