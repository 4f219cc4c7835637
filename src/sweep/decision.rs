//! [`JobDecision`] and [`Plan`]: what a drain would do with each run, and why.

use std::fmt;

use super::pending::PendingRun;
use super::reasons::Reasons;
use crate::identity::{self, Hash, Witnesses};
use crate::store::{DoneHead, JobRecord, KeyCollision, Status, Store, StoreError};

/// What a drain does with a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Execute it.
    Run,
    /// Its result is recorded and current.
    Skip,
    /// Another live process is running it; the drain waits for that result.
    Wait,
    /// Its record cannot be read ([`StoreError::Corrupt`]: truncated, emptied, not a
    /// record): the drain leaves it alone, runs the others, and names it in its error at the
    /// end. A sweep built with [`repair(true)`](super::OrchestratorBuilder::repair) repairs it
    /// instead ([`Action::Repair`]).
    Corrupt,
    /// Its record cannot be read and the sweep repairs: the drain moves the record aside
    /// ([`Store::set_aside`], never deleting it), then runs it.
    Repair,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Run => "run",
            Action::Skip => "skip",
            Action::Wait => "wait",
            Action::Corrupt => "corrupt",
            Action::Repair => "repair",
        })
    }
}

/// The decision for one run, with every reason (e.g. `no record`, `code changed: src/lib.rs`,
/// `environment changed: Cargo.lock`, `last attempt failed: ...`, `up to date`).
///
/// Small (a plan of a million runs holds a million): it shares the queued run (its key, job
/// name and parameters: `decision.run.key`) and stores the usual reasons without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobDecision {
    /// The run decided (shared with the queue): `run.key`, `run.job()`, `run.params()`.
    pub run: PendingRun,
    /// What the drain does.
    pub action: Action,
    /// Why.
    pub reasons: Reasons,
    /// When the run replaces a done result (changed witnesses, or forced): that result's
    /// attempt number, so a drain re-runs it only if nobody replaced it meanwhile.
    pub replaces: Option<u32>,
}

impl JobDecision {
    /// The decision `action` for `run`, for `reasons`.
    pub fn new(run: PendingRun, action: Action, reasons: impl Into<Reasons>) -> Self {
        JobDecision {
            run,
            action,
            reasons: reasons.into(),
            replaces: None,
        }
    }
}

impl fmt::Display for JobDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<4}  {}  {}  {}  ({})",
            self.action,
            self.run.key.short(),
            self.run.job(),
            self.run.params(),
            self.reasons
        )
    }
}

/// The decisions for a whole queue, in enqueue order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Plan {
    /// One per distinct queued run.
    pub decisions: Vec<JobDecision>,
}

impl Plan {
    /// How many runs take `action`.
    pub fn count(&self, action: Action) -> usize {
        self.decisions.iter().filter(|d| d.action == action).count()
    }

    /// The decisions that execute.
    pub fn to_run(&self) -> impl Iterator<Item = &JobDecision> {
        self.decisions.iter().filter(|d| d.action == Action::Run)
    }
}

/// A line per run, then a count line.
impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.decisions {
            writeln!(f, "{d}")?;
        }
        write!(
            f,
            "plan: {} to run, {} up to date, {} running elsewhere",
            self.count(Action::Run),
            self.count(Action::Skip),
            self.count(Action::Wait)
        )?;
        if self.count(Action::Repair) > 0 {
            write!(f, ", {} to repair and run", self.count(Action::Repair))?;
        }
        if self.count(Action::Corrupt) > 0 {
            write!(
                f,
                ", {} corrupt (left alone: repair(true) on the sweep, or `puzzletron sweep \
                 repair STORE`, moves their records aside so that they run again)",
                self.count(Action::Corrupt)
            )?;
        }
        Ok(())
    }
}

/// Runs a plan reads records for at once.
const PLAN_CHUNK: usize = 2048;

/// Below this many runs, [`Decider::fast_skips`] stays on the calling thread.
const PARALLEL_MIN: usize = 256;

/// Decides runs against a store: what the rules of `docs/design.md` ("Sweeps") say a drain does
/// with each.
pub(super) struct Decider<'a, S: Store + ?Sized> {
    pub(super) store: &'a S,
    /// The environment results made now are recorded with.
    pub(super) witnesses: &'a Witnesses,
    /// Re-run even what is current.
    pub(super) force: bool,
    /// Compiled identities: reasons naming changed items, `trace(true)` re-checks.
    pub(super) identity: &'a super::identity::JobIdentities,
    /// Runs whose record is corrupt are repaired ([`Action::Repair`]), not left alone.
    pub(super) repair: bool,
    /// The current witnesses' digest, when a done head may decide a skip alone (not forced,
    /// no `trace(true)` re-check of the recorded items).
    shortcut: Option<crate::identity::Hash>,
}

impl<'a, S: Store + ?Sized> Decider<'a, S> {
    pub(super) fn new(
        store: &'a S,
        witnesses: &'a Witnesses,
        force: bool,
        identity: &'a super::identity::JobIdentities,
    ) -> Self {
        let shortcut =
            (!force && !identity.traces()).then(|| DoneHead::witnesses_digest(witnesses));
        Self {
            store,
            witnesses,
            force,
            identity,
            repair: false,
            shortcut,
        }
    }

    /// The same decider, repairing corrupt runs when `repair`.
    pub(super) fn repairing(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// The decision for `run` whose record cannot be read (`e`, a [`StoreError::Corrupt`]):
    /// [`Action::Corrupt`] naming the file, what is wrong and the fix, or [`Action::Repair`].
    fn corrupt(&self, run: &PendingRun, e: &StoreError) -> JobDecision {
        let (action, reason) = if self.repair {
            (
                Action::Repair,
                format!("{e}; the record is moved aside (kept) and the run runs again"),
            )
        } else {
            (
                Action::Corrupt,
                format!(
                    "{e}; left alone: repair(true) on the sweep (or `puzzletron sweep repair \
                     {}`) moves it aside, never deleting it, and runs it again",
                    self.store.location()
                ),
            )
        };
        JobDecision::new(run.clone(), action, reason)
    }

    /// The skip decision for `run` when the store proves its record done with the current
    /// witnesses (no record parse); `None`: decide from the record.
    fn fast_skip(&self, run: &PendingRun) -> Result<Option<JobDecision>, StoreError> {
        if self.shortcut.is_none() {
            return Ok(None);
        }
        let head = self.store.done_head(&run.key)?;
        Ok(self.skip_of(run, head))
    }

    /// The skip decision a done head proves, if it is current.
    fn skip_of(&self, run: &PendingRun, head: Option<DoneHead>) -> Option<JobDecision> {
        let current = self.shortcut?;
        // A head of another run's record (planted under this key) is no hit: the record is
        // read and refused (`StoreError::KeyCollision`).
        head.filter(|h| h.witnesses == current && h.lineage == Some(run.lineage))
            .map(|h| JobDecision::new(run.clone(), Action::Skip, Reasons::up_to_date(h.attempt)))
    }

    /// [`fast_skip`](Self::fast_skip) of a slice of runs, asking the store in one batch.
    fn fast_skip_batch(&self, runs: &[PendingRun]) -> Vec<Result<Option<JobDecision>, StoreError>> {
        let keys: Vec<Hash> = runs.iter().map(|p| p.key).collect();
        runs.iter()
            .zip(self.store.done_heads(&keys))
            .map(|(p, h)| h.map(|h| self.skip_of(p, h)))
            .collect()
    }

    /// [`fast_skip`](Self::fast_skip) of every run of `runs`, in order, on up to four threads
    /// when there are many (a cache hit is a few syscalls and a digest; they overlap well).
    /// `Err` entries are the store's errors of those runs.
    pub(super) fn fast_skips(
        &self,
        runs: &[PendingRun],
    ) -> Vec<Result<Option<JobDecision>, StoreError>> {
        if self.shortcut.is_none() {
            return runs.iter().map(|_| Ok(None)).collect();
        }
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(4);
        if threads < 2 || runs.len() < PARALLEL_MIN {
            return self.fast_skip_batch(runs);
        }
        let chunk = runs.len().div_ceil(threads);
        let mut parts = runs.chunks(chunk);
        let mine = parts.next().unwrap_or_default();
        std::thread::scope(|s| {
            let others: Vec<_> = parts
                .map(|c| s.spawn(move || self.fast_skip_batch(c)))
                .collect();
            // The calling thread takes the first slice itself.
            let mut out = self.fast_skip_batch(mine);
            for o in others {
                match o.join() {
                    Ok(v) => out.extend(v),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            out
        })
    }

    /// The decision for `run`, reading its record (and its lineage when it has none).
    pub(super) fn decide(&self, run: &PendingRun) -> Result<JobDecision, StoreError> {
        if let Some(d) = self.fast_skip(run)? {
            return Ok(d);
        }
        let rec = match self.store.record(&run.key) {
            Ok(r) => r,
            Err(e @ StoreError::Corrupt { .. }) => return Ok(self.corrupt(run, &e)),
            Err(e) => return Err(e),
        };
        let lineage = match rec {
            None => self.store.lineage(&run.lineage)?,
            Some(_) => None,
        };
        self.decide_with(run, rec, lineage)
    }

    /// The decision for every run of `queue`, in order, reading records in bulk.
    pub(super) fn plan(&self, queue: &[PendingRun]) -> Result<Plan, StoreError> {
        let mut decisions = Vec::with_capacity(queue.len());
        // In slices, so what is read for a slice (records, lineages) is dropped before the
        // next: a plan's peak memory is its decisions plus one slice's records.
        for chunk in queue.chunks(PLAN_CHUNK) {
            let fast = self
                .fast_skips(chunk)
                .into_iter()
                .collect::<Result<Vec<_>, _>>()?;
            let rest: Vec<&PendingRun> = chunk
                .iter()
                .zip(&fast)
                .filter(|(_, f)| f.is_none())
                .map(|(p, _)| p)
                .collect();
            let mut slow = self.plan_slow(&rest)?.into_iter();
            for f in fast {
                // `plan_slow` returns one decision per run of `rest`, in order.
                if let Some(d) = f.or_else(|| slow.next()) {
                    decisions.push(d);
                }
            }
        }
        Ok(Plan { decisions })
    }

    /// The decisions for `queue` from its records, read in bulk.
    fn plan_slow(&self, queue: &[&PendingRun]) -> Result<Vec<JobDecision>, StoreError> {
        if queue.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<Hash> = queue.iter().map(|p| p.key).collect();
        // A corrupt record is its run's decision, not the plan's error.
        let recs = crate::store::records_per_key(self.store, &keys)?;
        // Lineages only matter for runs without a record ("code changed" vs "no record").
        let (missing, lineages): (Vec<usize>, Vec<Hash>) = recs
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Ok(None)))
            .map(|(i, _)| (i, queue[i].lineage))
            .unzip();
        let mut prev = vec![None; recs.len()];
        for (i, l) in missing.into_iter().zip(self.store.lineages(&lineages)?) {
            prev[i] = l;
        }
        queue
            .iter()
            .zip(recs)
            .zip(prev)
            .map(|((p, r), l)| match r {
                Ok(r) => self.decide_with(p, r, l),
                Err(e) => Ok(self.corrupt(p, &e)),
            })
            .collect()
    }

    /// Checks that the record found under `run`'s key is `run`'s: its key, its job and its
    /// parameters are the request's.
    ///
    /// # Errors
    /// [`StoreError::KeyCollision`] naming both when they are not.
    fn check_same_run(&self, run: &PendingRun, rec: &JobRecord) -> Result<(), StoreError> {
        let params = serde_json::from_str::<serde_json::Value>(&run.params());
        let same = rec.key == run.key
            && *rec.job == *run.job()
            && params.as_ref().is_ok_and(|p| *p == rec.params);
        if same {
            return Ok(());
        }
        let stored_params =
            identity::canonical_json(&rec.params).unwrap_or_else(|_| rec.params.to_string());
        let stored_job = if rec.key == run.key {
            rec.job.clone()
        } else {
            format!("{} (recorded under key {})", rec.job, rec.key)
        };
        Err(StoreError::KeyCollision(Box::new(KeyCollision {
            location: self.store.location(),
            key: run.key,
            stored_job,
            stored_params,
            requested_job: run.job().to_string(),
            requested_params: run.params().to_string(),
        })))
    }

    fn decide_with(
        &self,
        run: &PendingRun,
        rec: Option<JobRecord>,
        lineage: Option<Hash>,
    ) -> Result<JobDecision, StoreError> {
        if let Some(r) = &rec {
            self.check_same_run(run, r)?;
        }
        let mut reasons = Vec::new();
        let mut action = Action::Run;
        let mut replaces = None;
        match &rec {
            None => match lineage {
                Some(prev) if prev != run.key => match self.store.record(&prev) {
                    Err(StoreError::Corrupt { .. }) => reasons.push("code changed".to_string()),
                    Err(e) => return Err(e),
                    Ok(Some(old)) => {
                        // A new Cargo.lock or compiler also gives path dependencies new build
                        // ids: name it first, it is the cause.
                        reasons.extend(
                            self.witnesses
                                .differences(&old.witnesses)
                                .into_iter()
                                .filter(|d| d.starts_with("environment changed:")),
                        );
                        reasons.extend(identity::code_differences(run.owned(), &old.owned))
                    }
                    Ok(None) => reasons.push("code changed".to_string()),
                },
                // The lineage names this very run: its record was there and is gone (deleted,
                // or moved aside by a repair), which a nearest-run hint would hide.
                Some(_) => reasons.push(
                    "no record: this run's record was removed or set aside (a corrupt record \
                     moved to corrupt/ by `sweep repair`)"
                        .to_string(),
                ),
                None => reasons.push(self.identity.no_record_reason(self.store, run)?),
            },
            Some(r) => match r.status {
                Status::Done => {
                    let diffs = self.witnesses.differences(&r.witnesses);
                    if diffs.is_empty() {
                        action = Action::Skip;
                        reasons.push(format!("up to date, attempt {}", r.attempt));
                    } else {
                        reasons.extend(diffs);
                        replaces = Some(r.attempt);
                    }
                }
                Status::Failed => {
                    let msg = r
                        .error
                        .as_ref()
                        .map(|e| e.message.as_str())
                        .unwrap_or("unknown");
                    reasons.push(format!("last attempt failed: {msg}"));
                }
                Status::Running => match self.store.claim_info(&run.key)? {
                    Some(c) if c.live => {
                        action = Action::Wait;
                        // The claim as judged: its holder, and a note (an unreadable claim
                        // file's path and when it will be taken over).
                        reasons.push(format!("running in {c}"));
                    }
                    _ => {
                        let by = r.owner.as_ref().map(|o| o.to_string()).unwrap_or_default();
                        reasons.push(format!(
                            "interrupted: attempt {} by {by} did not finish",
                            r.attempt
                        ));
                    }
                },
            },
        }
        self.identity
            .trace_check(run, rec.as_ref(), &mut action, &mut reasons, &mut replaces);
        if self.force && action == Action::Skip {
            action = Action::Run;
            reasons = vec!["forced".to_string()];
            replaces = rec.as_ref().map(|r| r.attempt);
        }
        Ok(JobDecision {
            run: run.clone(),
            action,
            reasons: reasons.into(),
            replaces,
        })
    }
}
