//! Execution of runs in this process: claim, record, call the job, record the outcome; the
//! in-process drain loop. Knows nothing of the orchestrator's queue: a drain returns what
//! happened ([`Drained`]) and the orchestrator updates its queue from that.

use std::collections::HashMap;
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use super::cancel::Cancel;
use super::commit::{COMMIT_BATCH, COMMITTERS, Commit, Finished, Started, Work, serve};
use super::decision::{Action, Decider, JobDecision};
use super::event::Event;
use super::heart::Heart;
use super::panics;
use super::pending::PendingRun;
use super::reasons::Reasons;
use super::run::Run;
use super::summary::{FailureCause, JobOutcome, Outcome, RunSummary};
use crate::identity::Witnesses;
use crate::store::{Claim, ClaimOutcome, Failure, Owner, SetAside, Status, Store, StoreError};
use crate::sys::unix_now;

/// Runs whose cache hits a drain proves together, ahead of executing them.
const PREFETCH: usize = 1024;

/// The drain's helper threads a run uses: where finished runs go to be committed (`None`:
/// commit in the caller) and the thread that renews the running claim (`None`: a thread of the
/// run's own).
#[derive(Clone, Copy, Default)]
pub(super) struct Helpers<'a> {
    commits: Option<&'a mpsc::SyncSender<Work>>,
    heart: Option<&'a Heart>,
}

/// A drain's progress callback.
pub(super) type EventFn = std::sync::Arc<dyn Fn(&Event) + Send + Sync>;

/// What a drain did: an outcome per queued run (`None`: not reached), and why it stopped early.
pub(super) struct Drained {
    pub(super) outcomes: Vec<Option<Outcome>>,
    pub(super) stop: Option<Stop>,
}

/// Why a drain stopped before the end of its queue.
pub(super) enum Stop {
    /// Run `i` of the queue failed (its outcome is `Failed`).
    JobFailed(usize),
    /// The store or the executor failed, or the drain was cancelled.
    Cause(FailureCause),
}

/// Records run `i`'s outcome; a failed run stops the drain, an interrupted one (the drain was
/// cancelled) too.
fn settle(outcomes: &mut [Option<Outcome>], i: usize, o: Outcome) -> Option<Stop> {
    let stop = match o {
        Outcome::Failed { .. } => Some(Stop::JobFailed(i)),
        Outcome::Interrupted => Some(Stop::Cause(FailureCause::Cancelled)),
        _ => None,
    };
    outcomes[i] = Some(o);
    stop
}

/// Everything executing a run needs: the store, the decision rules, who we are, where events
/// go. Borrowed from the orchestrator in the parent, built from a task file in a worker.
pub(super) struct Engine<'a, S: Store + ?Sized> {
    pub(super) decider: Decider<'a, S>,
    pub(super) owner: &'a Owner,
    pub(super) on_event: Option<&'a EventFn>,
    pub(super) wait_poll: Duration,
    /// Cancels the drain (see `cancel`).
    pub(super) cancel: &'a Cancel,
}

impl<S: Store + ?Sized> Engine<'_, S> {
    pub(super) fn store(&self) -> &S {
        self.decider.store
    }

    pub(super) fn witnesses(&self) -> &Witnesses {
        self.decider.witnesses
    }

    pub(super) fn emit(&self, e: Event) {
        if let Some(f) = self.on_event {
            f(&e);
        }
    }

    /// Executes every run of `queue` that is not done, in order, in this process; waits for
    /// runs other processes hold. Stops at the first failure. Each run's start is written, and
    /// runs that finish well are committed, by [`COMMITTERS`] threads while the runs go on
    /// (see `commit`); the drain returns once every commit is durable (a commit that fails
    /// stops it as a store failure).
    pub(super) fn drain(&self, queue: &[PendingRun]) -> Drained {
        let _span = tracing::info_span!("drain", runs = queue.len(), isolated = false).entered();
        let (tx, rx) = mpsc::sync_channel::<Work>(COMMIT_BATCH * 2);
        let rx = Mutex::new(rx);
        let (done_tx, done_rx) = mpsc::channel::<(usize, StoreError)>();
        let heart = Heart::every(self.store().heartbeat_interval());
        // A parent token (the sweep's own) reaches running jobs through the bridge.
        let bridge_stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..COMMITTERS.min(queue.len()) {
                let done_tx = done_tx.clone();
                let rx = &rx;
                s.spawn(move || serve(self, rx, &done_tx));
            }
            drop(done_tx);
            let heart = &heart;
            let beating = s.spawn(move || heart.run(self.store()));
            let bridge_stop = &bridge_stop;
            let bridge = self
                .cancel
                .has_parent()
                .then(|| s.spawn(move || self.cancel.bridge(bridge_stop)));
            let helpers = Helpers {
                commits: Some(&tx),
                heart: Some(heart),
            };
            let mut drained = {
                // Stopped even if the loop unwinds: the scope joins the heartbeat thread.
                let _stop = heart.stop_on_drop();
                self.drain_loop(queue, helpers)
            };
            drop(tx);
            if let Some(b) = bridge {
                bridge_stop.store(true, std::sync::atomic::Ordering::Release);
                b.thread().unpark();
                if let Err(panic) = b.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            if let Err(panic) = beating.join() {
                std::panic::resume_unwind(panic);
            }
            // Every committer ends once the queue is empty: failed commits come back here.
            let mut failed: Vec<(usize, StoreError)> = done_rx.iter().collect();
            failed.sort_by_key(|(i, _)| *i);
            for (i, e) in failed {
                drained.outcomes[i] = None;
                if !matches!(drained.stop, Some(Stop::Cause(_))) {
                    drained.stop = Some(Stop::Cause(FailureCause::Store(e)));
                }
            }
            drained
        })
    }

    /// The drain loop of [`drain`](Self::drain).
    fn drain_loop(&self, queue: &[PendingRun], helpers: Helpers<'_>) -> Drained {
        let total = queue.len();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; total];
        let mut waiting: Vec<usize> = Vec::new();
        macro_rules! stop {
            ($stop:expr) => {
                return Drained {
                    outcomes,
                    stop: Some($stop),
                }
            };
        }
        let mut ahead: Vec<Option<JobDecision>> = Vec::new();
        for (i, p) in queue.iter().enumerate() {
            if self.cancel.is_cancelled() {
                tracing::info!(done = i, total, "drain cancelled: no run starts any more");
                stop!(Stop::Cause(FailureCause::Cancelled));
            }
            if i % PREFETCH == 0 {
                // The cache hits of the next runs, proved together on a few threads. A done
                // record stays done, so a skip proved a moment early is the plan's skip; a miss
                // or an error is decided again at its turn.
                ahead = self
                    .decider
                    .fast_skips(&queue[i..total.min(i + PREFETCH)])
                    .into_iter()
                    .map(|r| r.ok().flatten())
                    .collect();
            }
            let decision = match ahead.get_mut(i % PREFETCH).and_then(Option::take) {
                Some(d) => d,
                None => match self.decider.decide(p) {
                    Ok(d) => d,
                    Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                },
            };
            tracing::debug!(
                key = %p.key.short(),
                job = %p.job(),
                action = %decision.action,
                reasons = ?decision.reasons,
                "decided"
            );
            match decision.action {
                Action::Skip => {
                    outcomes[i] = Some(Outcome::Skipped {
                        reasons: decision.reasons.clone(),
                    });
                    self.emit(Event::Skipped {
                        index: i + 1,
                        total,
                        decision,
                    });
                }
                Action::Wait => waiting.push(i),
                Action::Run | Action::Corrupt | Action::Repair => {
                    match self.try_execute(i, total, p, decision, helpers) {
                        Ok(Some(o)) => {
                            if let Some(s) = settle(&mut outcomes, i, o) {
                                stop!(s);
                            }
                        }
                        Ok(None) => waiting.push(i),
                        Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                    }
                }
            }
        }
        // Runs held by other processes: wait for their result, or take them over if their
        // holder dies. Each wait is announced once per holder, not at every poll.
        let mut announced: HashMap<usize, String> = HashMap::new();
        while !waiting.is_empty() {
            if self.cancel.is_cancelled() {
                stop!(Stop::Cause(FailureCause::Cancelled));
            }
            let mut still = Vec::new();
            for &i in &waiting {
                let p = &queue[i];
                let rec = match self.store().record(&p.key) {
                    Ok(r) => r,
                    // Decided again below: a corrupt run is left alone or repaired.
                    Err(StoreError::Corrupt { .. }) => None,
                    Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                };
                let live = match self.store().claim_info(&p.key) {
                    Ok(c) => c.filter(|c| c.live),
                    Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                };
                match (rec, live) {
                    (Some(r), _) if r.status == Status::Done => {
                        let by = r.owner.map(|o| o.to_string()).unwrap_or_default();
                        outcomes[i] = Some(Outcome::Skipped {
                            reasons: Reasons::one(format!("done by {by}")),
                        });
                    }
                    (Some(r), None) if r.status == Status::Failed => {
                        outcomes[i] = Some(Outcome::Failed {
                            failure: r.error.unwrap_or_else(|| {
                                failure("error", "failed in another process".into(), None)
                            }),
                        });
                        stop!(Stop::JobFailed(i));
                    }
                    (_, Some(c)) => {
                        let holder = c.to_string();
                        if announced.get(&i) != Some(&holder) {
                            tracing::info!(key = %p.key.short(), %holder, "waiting for the run another process holds");
                            announced.insert(i, holder.clone());
                            self.emit(Event::Waiting { key: p.key, holder });
                        }
                        still.push(i);
                    }
                    _ => {
                        let decision = match self.decider.decide(p) {
                            Ok(d) => d,
                            Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                        };
                        match self.try_execute(i, total, p, decision, helpers) {
                            Ok(Some(o)) => {
                                if let Some(s) = settle(&mut outcomes, i, o) {
                                    stop!(s);
                                }
                            }
                            Ok(None) => still.push(i),
                            Err(e) => stop!(Stop::Cause(FailureCause::Store(e))),
                        }
                    }
                }
            }
            waiting = still;
            if !waiting.is_empty() {
                std::thread::sleep(self.wait_poll);
            }
        }
        Drained {
            outcomes,
            stop: None,
        }
    }

    /// What a drain does with a run whose record cannot be read: `Err` with its
    /// [`Outcome::Corrupt`] (left alone, reported; also when the store cannot move records
    /// aside), or, for [`Action::Repair`], the record moved aside and `Ok` with the decision
    /// to run it.
    pub(super) fn corrupt_or_repair(
        &self,
        index: usize,
        total: usize,
        p: &PendingRun,
        mut decision: JobDecision,
    ) -> std::result::Result<Result<JobDecision, Outcome>, StoreError> {
        let reason = decision.reasons.join("; ");
        if decision.action == Action::Repair {
            let why = match self.store().set_aside(&p.key)? {
                SetAside::Moved(to) => Some(format!("repaired: {reason}; moved to {to}")),
                // Another drain repaired it first; the claim finds it done or held.
                SetAside::NotMoved(why) => Some(format!("{reason}; not moved: {why}")),
                _ => None,
            };
            if let Some(why) = why {
                decision.action = Action::Run;
                decision.reasons = Reasons::one(why);
                return Ok(Ok(decision));
            }
            decision.reasons = Reasons::one(format!(
                "{reason}; this store cannot move records aside (Store::set_aside): move it \
                 yourself"
            ));
        }
        tracing::warn!(key = %p.key.short(), job = %p.job(), reason = %decision.reasons.join("; "), "corrupt record: the run is left alone");
        let outcome = Outcome::Corrupt {
            reason: decision.reasons.join("; "),
        };
        decision.action = Action::Corrupt;
        self.emit(Event::Corrupt {
            index: index + 1,
            total,
            decision,
        });
        Ok(Err(outcome))
    }

    /// Claims and executes one run. `Ok(None)`: another process holds it. A run whose record
    /// is corrupt is left alone (its [`Outcome::Corrupt`]) or repaired first
    /// ([`corrupt_or_repair`](Self::corrupt_or_repair)).
    pub(super) fn try_execute(
        &self,
        index: usize,
        total: usize,
        p: &PendingRun,
        decision: JobDecision,
        helpers: Helpers<'_>,
    ) -> std::result::Result<Option<Outcome>, StoreError> {
        let decision = match decision.action {
            Action::Corrupt | Action::Repair => {
                match self.corrupt_or_repair(index, total, p, decision)? {
                    Ok(d) => d,
                    Err(o) => return Ok(Some(o)),
                }
            }
            _ => decision,
        };
        match self.store().claim(&p.key, self.owner, decision.replaces)? {
            ClaimOutcome::Claimed(c) => {
                if decision
                    .reasons
                    .iter()
                    .any(|r| r.starts_with("interrupted"))
                {
                    tracing::info!(
                        key = %p.key.short(),
                        attempt = c.attempt,
                        reasons = ?decision.reasons,
                        "took over an interrupted run"
                    );
                } else {
                    tracing::debug!(key = %p.key.short(), attempt = c.attempt, "claimed");
                }
                self.execute(index, total, p, decision, c, helpers)
                    .map(Some)
            }
            ClaimOutcome::Busy(holder) => {
                tracing::debug!(key = %p.key.short(), %holder, "held by another process");
                Ok(None)
            }
            ClaimOutcome::Done(r) => {
                let by = r.owner.map(|o| o.to_string()).unwrap_or_default();
                tracing::debug!(key = %p.key.short(), %by, "done by another process");
                Ok(Some(Outcome::Skipped {
                    reasons: Reasons::one(format!("done by {by}")),
                }))
            }
        }
    }

    fn execute(
        &self,
        index: usize,
        total: usize,
        p: &PendingRun,
        decision: JobDecision,
        claim: Claim,
        helpers: Helpers<'_>,
    ) -> std::result::Result<Outcome, StoreError> {
        let _span = tracing::info_span!(
            "run",
            key = %p.key.short(),
            job = %p.job(),
            attempt = claim.attempt
        )
        .entered();
        let rec = p.running_record(self.witnesses(), self.owner, claim.attempt);
        // With committers, one of them writes the start while the run goes on (and a run
        // over before it got there has nothing of its start written but its lineage pointer).
        let started = match helpers.commits.filter(|_| self.store().deferrable_start()) {
            Some(tx) => {
                let started = Started::pending(claim.clone(), rec);
                // Not behind a full queue: a claim whose file the start writes must not wait
                // on the committers' flushes (another process judges it by its age).
                if tx.try_send(started.queued()).is_err() {
                    started.write_now(self.store());
                }
                started
            }
            None => {
                self.store().start(&claim, &rec)?;
                Started::written(claim.clone(), rec)
            }
        };
        self.emit(Event::Started {
            index: index + 1,
            total,
            decision,
        });
        let sink = self.store().metric_sink(&claim)?;
        let mut run = Run::new(
            p.key,
            claim.attempt,
            sink,
            self.store().job_files().map(|f| f.artifact_path(&p.key)),
            self.cancel.clone(),
        );
        let t0 = Instant::now();
        // SAFETY: `p.entry()` was made by `Entry::of` in this process (`Orchestrator::run`) or,
        // in a worker, in a process of the same binary (checked before the task is run).
        let call = || panics::catch(|| unsafe { p.entry().call(&p.params(), &mut run) });
        let result = match helpers.heart {
            Some(h) => h.beat_while(&claim, call),
            None => self.with_heartbeat(&claim, call),
        };
        let seconds = t0.elapsed().as_secs_f64();
        let told = run.was_told();
        let mut sink = run.into_sink();
        if told {
            // What a job told of a cancellation returns is not a whole result, whatever it is.
            return self.interrupt(index, total, p.key, &claim, started, sink);
        }
        if let (Some(tx), Ok(Ok(()))) = (helpers.commits, &result) {
            let c = Commit {
                run: Finished {
                    index,
                    total,
                    key: p.key,
                    claim,
                    sink,
                    seconds,
                },
                started,
            };
            return match tx.send(Work::Commit(c)) {
                Ok(()) => Ok(Outcome::Ran { seconds }),
                // No committer left (they only stop when the queue closes): commit here.
                Err(mpsc::SendError(w)) => {
                    // What comes back is the commit just sent.
                    let mut failed = match w {
                        Work::Commit(c) => {
                            let (ready, mut failed) = self.end_starts(vec![c]);
                            failed.extend(self.commit(ready));
                            failed
                        }
                        Work::Start(_) => Vec::new(),
                    };
                    match failed.pop() {
                        None => Ok(Outcome::Ran { seconds }),
                        Some((_, e)) => Err(e),
                    }
                }
            };
        }
        let mut rec = started.end(self.store())?;
        // Only a done run keeps its rows in its record: a failed one's record is replaced when
        // the job runs again, and its rows stay in their file for a look at what went wrong.
        if matches!(result, Ok(Ok(()))) {
            rec.set_metrics(sink.seal()?);
        } else {
            sink.sync()?;
            rec.set_metrics(sink.summary());
        }
        rec.finished_at = Some(unix_now());
        let outcome = match result {
            Ok(Ok(())) => {
                rec.status = Status::Done;
                Outcome::Ran { seconds }
            }
            Ok(Err(e)) => {
                let mut chain = Vec::new();
                let mut src = e.source();
                while let Some(s) = src {
                    chain.push(s.to_string());
                    src = s.source();
                }
                let debug = format!("{e:?}");
                let bt =
                    (debug.contains("backtrace") || debug.contains("Backtrace")).then_some(debug);
                let mut f = failure("error", e.to_string(), bt);
                f.chain = chain;
                rec.status = Status::Failed;
                rec.error = Some(f.clone());
                Outcome::Failed { failure: f }
            }
            Err((msg, bt)) => {
                let f = failure("panic", msg, Some(bt));
                rec.status = Status::Failed;
                rec.error = Some(f.clone());
                Outcome::Failed { failure: f }
            }
        };
        self.store().finish(&claim, &rec)?;
        match &outcome {
            Outcome::Ran { seconds } => self.emit(Event::Finished {
                index: index + 1,
                total,
                key: p.key,
                seconds: *seconds,
                rows: rec.metrics.as_ref().map(|m| m.rows).unwrap_or(0),
            }),
            Outcome::Failed { failure } => {
                tracing::warn!(
                    key = %p.key.short(),
                    kind = %failure.kind,
                    "run failed: {}",
                    failure.message
                );
                self.emit(Event::Failed {
                    index: index + 1,
                    total,
                    key: p.key,
                    failure: failure.clone(),
                })
            }
            _ => {}
        }
        Ok(outcome)
    }

    /// Records a run whose job was told of a cancellation as interrupted: its start is
    /// written (the record says `running`), the rows it logged reach their file, and the
    /// claim is released, so the next drain decides `interrupted: attempt N ... did not
    /// finish` and runs it again at once. Never a failure.
    fn interrupt(
        &self,
        index: usize,
        total: usize,
        key: crate::identity::Hash,
        claim: &Claim,
        started: Started,
        mut sink: Box<dyn crate::store::MetricSink>,
    ) -> std::result::Result<Outcome, StoreError> {
        started.write_now(self.store());
        started.end(self.store())?;
        sink.flush()?;
        self.store().release(claim)?;
        tracing::info!(key = %key.short(), "interrupted by the cancelled drain: runs again at the next drain");
        self.emit(Event::Interrupted {
            index: index + 1,
            total,
            key,
        });
        Ok(Outcome::Interrupted)
    }

    /// Runs `f` while a thread of its own renews the claim's heartbeat every
    /// [`Store::heartbeat_interval`] (a worker's single run; a drain shares one [`Heart`]).
    fn with_heartbeat<T>(&self, claim: &Claim, f: impl FnOnce() -> T) -> T {
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let every = self.store().heartbeat_interval();
        std::thread::scope(|s| {
            s.spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(every) {
                    let _ = self.store().heartbeat(claim);
                }
            });
            let out = f();
            drop(stop_tx);
            out
        })
    }
}

pub(super) fn failure(kind: &str, message: String, backtrace: Option<String>) -> Failure {
    Failure {
        kind: kind.to_string(),
        message,
        chain: Vec::new(),
        backtrace,
    }
}

pub(super) fn summary_of(queue: &[PendingRun], outcomes: &[Option<Outcome>]) -> RunSummary {
    RunSummary {
        jobs: queue
            .iter()
            .zip(outcomes)
            .map(|(p, o)| JobOutcome {
                run: p.clone(),
                outcome: o.clone().unwrap_or(Outcome::Pending),
            })
            .collect(),
    }
}
