//! Starting attempts: intents journaled and synced before the submits, handles right after;
//! resolving intents a crash left without a handle (adopt by `find`, or give up after the grace).

use std::collections::HashSet;
use std::path::Path;

use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::pool::WorkQueue;
use super::spec::{output_dir, queue_dir};
use super::state::Phase;
use super::step;
use crate::executor::{AttemptId, ExecutorError};

impl CampaignController {
    /// Intents without a handle (the controller died between intent and handle): asks the
    /// executor for each job by attempt id; [`step::found_entry`] adopts it, or gives up on
    /// the attempt once the grace has passed.
    pub(super) async fn resolve_intents(&mut self) -> Result<bool, ControllerError> {
        let mut entries = Vec::new();
        let now = self.io.clock.now_ms();
        for a in self.state.unresolved_intents() {
            if !matches!(self.state.attempts[a].phase, Phase::Intent { .. }) {
                continue;
            }
            let id = self.state.attempts[a].id.clone();
            let exec = self.io.executor.clone();
            let Some(found) = self.guarded("find", exec.find(&id)).await? else {
                break;
            };
            let found = match found {
                Ok(f) => f,
                Err(e) if e.is_retryable() => continue,
                Err(e) => return Err(e.into()),
            };
            if let Some(e) = step::found_entry(&self.state, &self.settings, now, a, found) {
                if matches!(e, Entry::Submitted { .. }) {
                    self.counters.adopted += 1;
                }
                entries.push(e);
            }
        }
        let changed = !entries.is_empty();
        self.record(entries)?;
        Ok(changed)
    }

    /// Starts the units [`step::ready_units`] picks: fills pool queues, journals every intent
    /// (synced) before any submit, submits, then journals the handles and
    /// [`step::after_submits`]' decisions for the submits that failed.
    pub(super) async fn start_ready(&mut self) -> Result<bool, ControllerError> {
        if self.halted {
            return Ok(false);
        }
        // Counts replayed from the journal may have crossed the threshold before a crash.
        self.exclude_broken_nodes()?;
        let now = self.io.clock.now_ms();
        let picks = step::ready_units(&self.state, &self.settings, now);
        if picks.is_empty() {
            return Ok(false);
        }
        // Pool queues are filled before the first worker starts.
        for si in step::pool_fills(&self.state, &picks) {
            let id = self.state.stages[si].id.clone();
            let src =
                self.settings
                    .pools
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| ControllerError::BadPlan {
                        stage: id.clone(),
                        reason: "no pool item source".into(),
                    })?;
            let items = src(&self.dir).map_err(|reason| ControllerError::BadPlan {
                stage: id.clone(),
                reason,
            })?;
            let n = WorkQueue::new(queue_dir(&self.dir, &id)).fill(&items)?;
            self.record(vec![Entry::PoolFilled {
                stage: id,
                items: n,
            }])?;
        }
        // Intents first, durable, then the submits.
        let mut intents = Vec::with_capacity(picks.len());
        let mut asides = Vec::new();
        let mut specs = Vec::with_capacity(picks.len());
        for &u in &picks {
            let start = step::start(&self.state, &self.plan, &self.dir, u)?;
            let unit = &self.state.units[u];
            let st = &self.plan.stages[unit.stage];
            let out = output_dir(&self.dir, &st.stage_id, unit.item);
            std::fs::create_dir_all(&out).map_err(|e| ControllerError::io("creating", &out, e))?;
            // A retry never meets the declared outputs its failed or killed predecessor left:
            // one it does not rewrite would be promoted with the dead attempt's copy.
            if let Some(prev) = start.previous {
                let moved = move_outputs_aside(&out, &st.worker.outputs, &prev);
                if !moved.is_empty() {
                    asides.push(ControllerEvent::OutputsMovedAside {
                        attempt_id: prev,
                        moved,
                    });
                }
            }
            // A marker left by an earlier revision's attempt must not vouch for this one.
            let marker = out.join(super::spec::SUCCESS_MARKER);
            match std::fs::remove_file(&marker) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ControllerError::io("removing", &marker, e)),
            }
            intents.push(start.intent);
            specs.push(start.spec);
        }
        for ev in asides {
            self.emit(ev)?;
        }
        self.record(intents)?;
        let mut results = Vec::with_capacity(specs.len());
        // Hosts whose SSH host key changed or is unknown (issue 27, P07), with the message.
        let mut refused_hosts: Vec<(String, String)> = Vec::new();
        // Their attempts: retried at once (the host is excluded), not after a delay.
        let mut refused_attempts = HashSet::new();
        for spec in &specs {
            // Crash safety: no submit without its journaled intent.
            debug_assert!(
                self.state
                    .attempt_index
                    .get(&spec.attempt_id)
                    .is_some_and(|&a| matches!(self.state.attempts[a].phase, Phase::Intent { .. })),
                "submit of {} without a journaled intent",
                spec.attempt_id
            );
            let exec = self.io.executor.clone();
            // Interrupted: what was submitted is recorded below; the rest stay intents, which
            // the next run resolves by lookup.
            let Some(submitted) = self.guarded("submit", exec.submit(spec)).await? else {
                break;
            };
            let r = match submitted {
                Ok(h) => Entry::Submitted {
                    attempt_id: spec.attempt_id.clone(),
                    handle: h,
                    adopted: false,
                },
                // The host is at fault, not the attempt: the host is excluded and the attempt
                // placed on the others, neither charged nor delayed.
                Err(e) => match step::refused_host(&self.state, &e) {
                    Some(host) => {
                        refused_hosts.push((host.clone(), e.to_string()));
                        refused_attempts.insert(spec.attempt_id.clone());
                        Entry::SubmitFailed {
                            attempt_id: spec.attempt_id.clone(),
                            error: format!("{e} (host {host} excluded; placed on the other hosts)"),
                        }
                    }
                    None => self.after_submit_error(spec, e).await?,
                },
            };
            results.push(r);
            self.counters.submits_this_process += 1;
            if self.settings.abort_after_submits == Some(self.counters.submits_this_process) {
                // Fault injection for crash tests: die like `kill -9` between a submit and
                // the record of its handle (the worst moment for duplicates).
                std::process::abort();
            }
        }
        self.counters.submitted += results
            .iter()
            .filter(|r| matches!(r, Entry::Submitted { .. }))
            .count() as u64;
        let follow = step::after_submits(
            &self.state,
            &self.settings,
            now,
            &results,
            &refused_attempts,
        );
        results.extend(follow);
        self.record(results)?;
        self.exclude_refused_hosts(refused_hosts)?;
        Ok(true)
    }

    /// After a failed submit: an ambiguous or retryable error may still have created the job,
    /// so ask `find` before deciding.
    pub(super) async fn after_submit_error(
        &mut self,
        spec: &crate::executor::AttemptSpec,
        e: ExecutorError,
    ) -> Result<Entry, ControllerError> {
        let id = spec.attempt_id.clone();
        if step::maybe_created(&e) {
            let exec = self.io.executor.clone();
            let found = match self.guarded("find", exec.find(&id)).await? {
                Some(f) => f,
                // Interrupted: the intent stays open; the next run looks the job up.
                None => Err(ExecutorError::SchedulerUnavailable {
                    command: "find".into(),
                    tries: 0,
                    message: "interrupted by a control request".into(),
                }),
            };
            match found {
                Ok(Some(h)) => {
                    self.counters.adopted += 1;
                    return Ok(Entry::Submitted {
                        attempt_id: id,
                        handle: h,
                        adopted: true,
                    });
                }
                Ok(None) => {}
                // Cannot tell: leave the intent unresolved; `resolve_intents` asks again.
                Err(_) => {
                    let ev = ControllerEvent::SubmitUnknown {
                        attempt_id: id,
                        error: e.to_string(),
                    };
                    self.notify(&ev);
                    return Ok(Entry::from_event(&ev));
                }
            }
        }
        let fatal = !e.is_retryable() && !matches!(e, ExecutorError::SubmitUnknown { .. });
        Ok(Entry::SubmitFailed {
            attempt_id: id,
            error: if fatal {
                format!("fatal: {e}{}", runner_keys_hint(&e.to_string(), spec))
            } else {
                e.to_string()
            },
        })
    }
}

/// Moves the declared outputs (`outputs`, paths relative to the unit's output folder `out`)
/// that attempt `prev` left into `out/outputs_partial/<prev>/`, keeping their relative paths.
/// Returns a line per output found: moved, or why it could not be (an output that cannot be
/// moved stays, and the line says so). Outputs are plan data: a path that leaves `out` is
/// never touched.
fn move_outputs_aside(out: &Path, outputs: &[String], prev: &AttemptId) -> Vec<String> {
    let aside = out.join("outputs_partial").join(prev.as_str());
    let mut lines = Vec::new();
    for o in outputs {
        let rel = Path::new(o);
        let inside = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let from = out.join(rel);
        if !inside || std::fs::symlink_metadata(&from).is_err() {
            continue;
        }
        let to = aside.join(rel);
        let r = to
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::rename(&from, &to));
        lines.push(match r {
            Ok(()) => format!("`{o}` moved to outputs_partial/{prev}/"),
            Err(why) => format!("`{o}` could not be moved aside: {why}"),
        });
    }
    lines
}

/// For a refused submit (a configuration failure, never retried): the runner keys whose values
/// the scheduler's message is about, with the values the spec carried, so the failure names
/// the line to fix (`; check runner.slurm.account = "nope"`). Slurm says `Invalid account or
/// account/partition combination`, `invalid partition`, `Invalid qos specification`,
/// `Requested reservation is invalid`, `Invalid feature specification`, `Requested time limit
/// is invalid`.
fn runner_keys_hint(error: &str, spec: &crate::executor::AttemptSpec) -> String {
    let e = error.to_ascii_lowercase();
    let s = &spec.scheduler;
    let mut keys = Vec::new();
    let time = spec
        .walltime
        .map(|w| format!("{} min", w.as_secs().div_ceil(60)));
    for (words, key, value) in [
        (&["account"][..], "runner.slurm.account", s.account.clone()),
        (
            &["partition"][..],
            "runner.slurm.partition (or the stage's execution partition)",
            s.partition.clone(),
        ),
        (&["qos"][..], "runner.slurm.qos", s.qos.clone()),
        (
            &["reservation"][..],
            "runner.slurm.reservation",
            s.reservation.clone(),
        ),
        (
            &["feature", "constraint"][..],
            "runner.slurm.constraint",
            s.constraint.clone(),
        ),
        (
            &["time limit"][..],
            "runner.slurm.time_limit (or the stage's execution time_limit)",
            time,
        ),
    ] {
        if let Some(v) = value
            && words.iter().any(|w| e.contains(w))
        {
            keys.push(format!("{key} = {v:?}"));
        }
    }
    if keys.is_empty() {
        String::new()
    } else {
        format!("; check {}", keys.join(", "))
    }
}
