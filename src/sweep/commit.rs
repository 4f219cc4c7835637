//! The in-process drain's committer threads: they write each run's start while the run
//! executes, and make finished runs durable in group commits while the next runs execute.
//!
//! A trivial run ends before a committer gets to its start: then nothing of its start is
//! written but its lineage pointer, and its done record is its first record. A run that
//! lasts longer than a committer's turn (a fraction of a millisecond when the committers are
//! idle) has its running record written as it starts, as if the drain had written it.

use std::sync::{Arc, Mutex, MutexGuard, mpsc};

use super::event::Event;
use super::execute::Engine;
use crate::identity::Hash;
use crate::store::{Claim, JobRecord, MetricSink, Status, Store, StoreError};
use crate::sys::unix_now;

/// Threads that write starts and commit finished runs while the drain goes on. A done record
/// costs a few `fsync`s (the metrics file, the record, its folder: milliseconds on some
/// disks). Two are enough: while one flushes, the runs that finish meanwhile queue up and the
/// other takes them as one batch ([`COMMIT_BATCH`]). More threads would each take one run and
/// flush it alone (measured: 8 committers never formed a batch and cost a third more time per
/// trivial run).
pub(super) const COMMITTERS: usize = 2;

/// The most queued items one committer takes at once: when runs finish faster than their
/// commits, those that queued up meanwhile are committed together ([`Store::finish_many`]:
/// one flush for all). A slow run is committed alone as soon as it ends.
pub(super) const COMMIT_BATCH: usize = 64;

/// What a committer does, in queue order (a run's start is queued before its end).
// A commit is most of what is queued (one per run), so it travels by value: boxing it would
// add an allocation per run to save a few hundred bytes per queue slot.
#[allow(clippy::large_enum_variant)]
pub(super) enum Work {
    /// Write a run's start, unless the run has ended already.
    Start(Arc<Start>),
    /// Commit a run that finished well.
    Commit(Commit),
}

/// A run that finished well and whose record is not committed yet: its claim is still held,
/// so nobody else runs it meanwhile, and a crash before the commit leaves it interrupted.
pub(super) struct Finished {
    pub(super) index: usize,
    pub(super) total: usize,
    pub(super) key: Hash,
    pub(super) claim: Claim,
    pub(super) sink: Box<dyn MetricSink>,
    pub(super) seconds: f64,
}

/// A [`Finished`] run as queued: its start may still be pending.
pub(super) struct Commit {
    pub(super) run: Finished,
    pub(super) started: Started,
}

/// A run's start ([`Store::start`]: its running record and lineage pointer), shared by the
/// committer that writes it and the run's end.
pub(super) struct Start {
    claim: Claim,
    state: Mutex<StartState>,
}

enum StartState {
    /// Not written: the record as the run started.
    Pending(JobRecord),
    /// Written, or failed to be.
    Written(JobRecord, Result<(), StoreError>),
    /// The run ended ([`Started::end`]).
    Ended,
}

impl Start {
    fn lock(&self) -> MutexGuard<'_, StartState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the start, unless it is written or the run has ended.
    pub(super) fn write<S: Store + ?Sized>(&self, store: &S) {
        let mut st = self.lock();
        match std::mem::replace(&mut *st, StartState::Ended) {
            StartState::Pending(rec) => {
                let r = store.start(&self.claim, &rec);
                *st = StartState::Written(rec, r);
            }
            other => *st = other,
        }
    }
}

/// The run's end of its [`Start`]: the one handle that ends it (not `Clone`).
pub(super) struct Started(Arc<Start>);

impl Started {
    /// A start not written yet: queue [`Started::queued`] for a committer.
    pub(super) fn pending(claim: Claim, rec: JobRecord) -> Self {
        Started(Arc::new(Start {
            claim,
            state: Mutex::new(StartState::Pending(rec)),
        }))
    }

    /// A start written already ([`Store::start`] returned `Ok`).
    pub(super) fn written(claim: Claim, rec: JobRecord) -> Self {
        Started(Arc::new(Start {
            claim,
            state: Mutex::new(StartState::Written(rec, Ok(()))),
        }))
    }

    /// Writes the start here and now, unless it is written (its error comes from
    /// [`Started::end`]).
    pub(super) fn write_now<S: Store + ?Sized>(&self, store: &S) {
        self.0.write(store);
    }

    /// The work item that writes this start.
    pub(super) fn queued(&self) -> Work {
        Work::Start(Arc::clone(&self.0))
    }

    /// Ends the run's start: the record as it started, and whether its start was written
    /// (`false`: the run ended first and nothing was written; a committer that gets to it
    /// later does nothing). When it is not written, the record's lineage pointer is written
    /// now, which is all of a start that outlives a run that is over.
    ///
    /// # Errors
    /// The start's error, or that of the lineage pointer.
    pub(super) fn end<S: Store + ?Sized>(self, store: &S) -> Result<JobRecord, StoreError> {
        let state = std::mem::replace(&mut *self.0.lock(), StartState::Ended);
        match state {
            StartState::Pending(rec) => {
                store.set_lineage(&rec.lineage, &rec.key)?;
                Ok(rec)
            }
            StartState::Written(rec, r) => r.map(|()| rec),
            // `end` takes the one `Started` by value, and nothing else leaves `Ended`.
            StartState::Ended => unreachable!("a run's start ended twice"),
        }
    }
}

/// One committer: takes what is queued (up to [`COMMIT_BATCH`] items) until the queue closes;
/// sends back each run that failed to commit (queue index and error).
pub(super) fn serve<S: Store + ?Sized>(
    engine: &Engine<'_, S>,
    rx: &Mutex<mpsc::Receiver<Work>>,
    failed: &mpsc::Sender<(usize, StoreError)>,
) {
    loop {
        let batch = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            let Ok(first) = rx.recv() else { break };
            let mut batch = vec![first];
            while batch.len() < COMMIT_BATCH {
                match rx.try_recv() {
                    Ok(w) => batch.push(w),
                    Err(_) => break,
                }
            }
            batch
        };
        let mut starts = Vec::new();
        let mut commits = Vec::new();
        for w in batch {
            match w {
                Work::Start(s) => starts.push(s),
                Work::Commit(c) => commits.push(c),
            }
        }
        // The runs that ended are taken first: a start whose run is over in this batch is
        // never written.
        let ended = engine.end_starts(commits);
        for s in starts {
            s.write(engine.store());
        }
        for f in ended.1.into_iter().chain(engine.commit(ended.0)) {
            let _ = failed.send(f);
        }
    }
}

/// A finished run whose start is ended, with its record: ready for its commit.
pub(super) struct Ready {
    run: Finished,
    rec: JobRecord,
}

impl<S: Store + ?Sized> Engine<'_, S> {
    /// Ends the starts of these finished runs: those ready to commit, and those whose start
    /// failed (queue index and error).
    pub(super) fn end_starts(
        &self,
        commits: Vec<Commit>,
    ) -> (Vec<Ready>, Vec<(usize, StoreError)>) {
        let mut ready = Vec::with_capacity(commits.len());
        let mut failed = Vec::new();
        for Commit { run, started } in commits {
            match started.end(self.store()) {
                Ok(rec) => ready.push(Ready { run, rec }),
                Err(e) => failed.push((run.index, e)),
            }
        }
        (ready, failed)
    }

    /// Makes finished runs' metrics and done records durable and releases their claims, in one
    /// group commit; returns the runs that failed to commit (queue index and error).
    pub(super) fn commit(&self, batch: Vec<Ready>) -> Vec<(usize, StoreError)> {
        let mut failed = Vec::new();
        let mut ready = Vec::with_capacity(batch.len());
        for mut c in batch {
            match c.run.sink.seal() {
                Ok(m) => {
                    c.rec.set_metrics(m);
                    c.rec.finished_at = Some(unix_now());
                    c.rec.status = Status::Done;
                    ready.push(c);
                }
                Err(e) => failed.push((c.run.index, e)),
            }
        }
        let pairs: Vec<(&Claim, &JobRecord)> =
            ready.iter().map(|c| (&c.run.claim, &c.rec)).collect();
        let results = self.store().finish_many(&pairs);
        for (c, r) in ready.iter().zip(results) {
            match r {
                Ok(()) => self.emit(Event::Finished {
                    index: c.run.index + 1,
                    total: c.run.total,
                    key: c.run.key,
                    seconds: c.run.seconds,
                    rows: c.rec.metrics.as_ref().map(|m| m.rows).unwrap_or(0),
                }),
                Err(e) => failed.push((c.run.index, e)),
            }
        }
        failed
    }
}
