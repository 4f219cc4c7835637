//! The controller's decisions as pure functions: each takes the state, the plan, the
//! settings it needs, `now_ms` and what the loop read or was told (a decision file, the
//! evidence of an ended attempt, the statuses of a poll, the results of finds and submits),
//! and returns what to do: [`Action`]s or journal entries. None of them touches the
//! executor, the filesystem, the clock or the journal; the loop (`driver` and the area
//! files) reads, performs and journals, so every decision can be tested by feeding it
//! scripted inputs.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::choose_revisions;
use super::classify::{
    Evidence, FailureClass, OomKind, PendingVerdict, classify, classify_hung, pending_verdict,
};
use super::driver::{Settings, describe};
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::policy::{Decision, UnitHistory, decide};
use super::spec::{UnitSpec, decision_file};
use super::state::{Beat, Phase, StageRt, StageStatus, State, UnitStatus};
use crate::campaign::{CampaignPlan, HaltPolicy};
use crate::executor::{AttemptId, AttemptSpec, ExecutorError, JobHandle, JobState, JobStatus};

/// Something the loop does for a step, in order.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Action {
    /// Tell the observers only (an entry of the same step journals it).
    Notify(ControllerEvent),
    /// Tell the observers and journal the event.
    Emit(ControllerEvent),
    /// Journal these entries in one durable append, then apply them to the state.
    Journal(Vec<Entry>),
    /// Create the folder of a decision file, so `echo all > FILE` is all a person has to do.
    MakeDecisionDir(PathBuf),
    /// Write a decision stage's selection (`work/<stage>/0/selected.json`), before the
    /// decision is journaled.
    WriteSelection {
        /// The decision stage.
        stage: String,
        /// The file's JSON.
        body: serde_json::Value,
    },
}

/// Whether any parent of `s` failed, directly or through an open stage that is blocked.
pub(super) fn blocked(state: &State, s: &StageRt) -> bool {
    s.parents.iter().any(|&p| {
        let ps = &state.stages[p];
        ps.status == StageStatus::Failed || (ps.status == StageStatus::Open && blocked(state, ps))
    })
}

/// Whether `s` is a manual decision stage whose parents are done and that waits for a person.
pub(super) fn awaits_decision(state: &State, s: &StageRt) -> bool {
    s.decision
        && s.status == StageStatus::Open
        && s.parents
            .iter()
            .all(|&p| state.stages[p].status == StageStatus::Done)
}

/// The decision file of a stage, as the loop read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum DecisionFile {
    /// No file (yet).
    Absent,
    /// Its content.
    Text(String),
    /// It exists but cannot be read: why.
    Unreadable(String),
}

/// The choice a decision file makes: `Ok(None)` when there is none yet, `Err` with the
/// problem (reported, and the stage keeps waiting) when its content is bad.
pub(super) fn file_choice(
    file: &DecisionFile,
    candidates: &[String],
) -> Result<Option<Vec<String>>, String> {
    match file {
        DecisionFile::Absent => Ok(None),
        DecisionFile::Text(text) => choose_revisions(text, candidates).map(Some),
        DecisionFile::Unreadable(e) => Err(format!("cannot be read: {e}")),
    }
}

/// The report of a bad decision file, unless the same message was the last one reported
/// for the stage (`last`): reported once per message.
pub(super) fn invalid_decision(
    last: Option<&str>,
    stage: &str,
    file: &Path,
    error: String,
) -> Option<ControllerEvent> {
    (last != Some(error.as_str())).then(|| ControllerEvent::DecisionInvalid {
        stage: stage.to_string(),
        file: file.to_path_buf(),
        error,
    })
}

/// What to do for the decision stage `si` (one that [`awaits_decision`]) given its answer
/// (`chosen`, from the file or the prompt): with one, write the selection, then journal the
/// decision, the stage's end and (for `none`) the skipped descendants in one append; without
/// one, announce once that a decision is needed (the `decisions/` folder made first).
pub(super) fn decision_actions(
    state: &State,
    plan: &CampaignPlan,
    dir: &Path,
    si: usize,
    chosen: Option<Vec<String>>,
) -> Vec<Action> {
    let Some(d) = plan.stages[si].decision.as_ref() else {
        return Vec::new();
    };
    let stage = state.stages[si].id.clone();
    let Some(chosen) = chosen else {
        if state.stages[si].decision_announced {
            return Vec::new();
        }
        let file = decision_file(dir, &stage);
        let mut actions = Vec::new();
        if let Some(parent) = file.parent() {
            actions.push(Action::MakeDecisionDir(parent.to_path_buf()));
        }
        actions.push(Action::Notify(ControllerEvent::DecisionNeeded {
            stage: stage.clone(),
            file: file.clone(),
            candidates: d.candidates.clone(),
        }));
        actions.push(Action::Journal(vec![Entry::DecisionNeeded {
            stage,
            file,
            candidates: d.candidates.clone(),
        }]));
        return actions;
    };
    let body = serde_json::json!({
        "stage": stage,
        "input": d.input,
        "candidates": d.candidates,
        "chosen": chosen,
    });
    let skipped = if chosen.is_empty() {
        descendants(state, si)
    } else {
        Vec::new()
    };
    let mut entries = vec![
        Entry::DecisionMade {
            stage: stage.clone(),
            chosen: chosen.clone(),
        },
        Entry::StageDone {
            stage: stage.clone(),
        },
    ];
    entries.extend(skipped.iter().map(|s| Entry::StageSkipped {
        stage: s.clone(),
        reason: format!("the manual decision {stage} chose none"),
    }));
    vec![
        Action::WriteSelection {
            stage: stage.clone(),
            body,
        },
        Action::Notify(ControllerEvent::DecisionMade {
            stage: stage.clone(),
            chosen,
            skipped,
        }),
        Action::Notify(ControllerEvent::StageDone { stage }),
        Action::Journal(entries),
    ]
}

/// Open stages that depend on stage `si`, directly or not, in plan order.
pub(super) fn descendants(state: &State, si: usize) -> Vec<String> {
    let mut below: HashSet<usize> = HashSet::from([si]);
    let mut out = Vec::new();
    // Plan order is topological: parents come before their children.
    for (i, s) in state.stages.iter().enumerate().skip(si + 1) {
        if s.parents.iter().any(|p| below.contains(p)) {
            below.insert(i);
            if s.status == StageStatus::Open {
                out.push(s.id.clone());
            }
        }
    }
    out
}

// ---- An attempt that ended (`finalise`): the loop reads the evidence, these judge it. ----

/// The verdict on an attempt that ended.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Verdict {
    /// `None`: it succeeded.
    pub class: Option<FailureClass>,
    /// What proves it.
    pub detail: String,
    /// It failed fast on its nodes (charged to them and to the infrastructure budget).
    pub fail_fast: bool,
    /// Host or GPU memory, for an OOM.
    pub oom: Option<OomKind>,
}

/// A verdict the loop already knows (a hung or stuck attempt it cancelled, outputs never
/// visible); an OOM names its kind in `detail`.
pub(super) fn forced_verdict(class: FailureClass, detail: String) -> Verdict {
    let oom = (class == FailureClass::Oom).then(|| {
        if detail.contains("out of memory (gpu)") {
            OomKind::Gpu
        } else {
            OomKind::Host
        }
    });
    Verdict {
        class: Some(class),
        detail,
        fail_fast: false,
        oom,
    }
}

/// One file a completed attempt must leave (the success marker, a declared output), as the
/// loop looked for it (`finalise::visible`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Looked {
    /// The path, as shown.
    pub path: String,
    /// Found.
    pub visible: bool,
    /// Found only by `readdir`/`open`, not by `stat`.
    pub late: bool,
}

/// What the files a completed attempt must leave say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Visibility {
    /// All visible; lines for the detail about those that were not at once.
    Seen {
        /// Found late, or visible only after some time.
        late: Vec<String>,
    },
    /// Some not visible yet: looked for again on the next poll (not visible since `since_ms`).
    Wait {
        /// Not visible since (controller clock, ms).
        since_ms: u64,
    },
    /// Not visible after the bound: the attempt ends as [`FailureClass::OutputNotVisible`].
    NotVisible {
        /// Not visible since (controller clock, ms).
        since_ms: u64,
        /// The verdict's detail.
        detail: String,
    },
}

/// Not visible is not missing (issue 27): files not seen are looked for again on later polls
/// until `wait` has passed since `since` (when they were first not seen, `None`: now).
pub(super) fn visibility(
    since: Option<u64>,
    now_ms: u64,
    wait: Duration,
    looked: &[Looked],
) -> Visibility {
    let invisible: Vec<&str> = looked
        .iter()
        .filter(|l| !l.visible)
        .map(|l| l.path.as_str())
        .collect();
    if !invisible.is_empty() {
        let since_ms = since.unwrap_or(now_ms);
        let waited = Duration::from_millis(now_ms.saturating_sub(since_ms));
        if waited < wait {
            return Visibility::Wait { since_ms };
        }
        return Visibility::NotVisible {
            since_ms,
            detail: format!(
                "state COMPLETED (exit 0) but not visible after {} s (stat, readdir of its folder, open; retried with backoff): {}",
                waited.as_secs(),
                invisible.join(", ")
            ),
        };
    }
    let mut late: Vec<String> = looked
        .iter()
        .filter(|l| l.late)
        .map(|l| l.path.clone())
        .collect();
    if let Some(since) = since {
        late.push(format!(
            "visible after {} s",
            now_ms.saturating_sub(since) / 1000
        ));
    }
    Visibility::Seen { late }
}

/// The nodes an ended attempt ran on, when the executor names any.
pub(super) fn end_nodes(st: &JobStatus) -> Option<String> {
    st.nodes
        .clone()
        .filter(|n| !crate::executor::expand_hostlist(n).is_empty())
}

/// The job log of attempt `id`: the executor's, else `logs/<id>.log` in the campaign folder.
pub(super) fn log_path(dir: &Path, st: &JobStatus, id: &AttemptId) -> PathBuf {
    st.log_path
        .clone()
        .unwrap_or_else(|| dir.join("logs").join(format!("{id}.log")))
}

/// The verdict on attempt `a` from the evidence the loop read (`ev`; its run time and the
/// fast-failure window are filled in here) and the lines about outputs found late.
pub(super) fn classified_verdict(
    state: &State,
    settings: &Settings,
    now_ms: u64,
    a: usize,
    st: &JobStatus,
    ev: Evidence,
    late: &[String],
) -> Verdict {
    let ev = Evidence {
        ran_for: Some(match (st.started_at_ms, st.ended_at_ms) {
            (Some(s), Some(e)) => Duration::from_millis(e.saturating_sub(s)),
            _ => Duration::from_millis(now_ms.saturating_sub(state.attempts[a].intent_ms)),
        }),
        fast_window: Some(settings.fast_failure_window),
        ..ev
    };
    let c = classify(st, &ev);
    let fail_fast = end_nodes(st).is_some() && super::nodes::fails_fast(&st.state, c.class, &ev);
    let detail = if late.is_empty() {
        c.detail
    } else {
        format!(
            "{}; not visible to stat at first, then found by readdir/open: {}",
            c.detail,
            late.join(", ")
        )
    };
    Verdict {
        class: c.class,
        detail,
        fail_fast,
        oom: c.oom,
    }
}

/// The budgets and counts of unit `unit`, for the retry policy.
pub(super) fn history(
    state: &State,
    plan: &CampaignPlan,
    settings: &Settings,
    unit: usize,
) -> UnitHistory {
    let u = &state.units[unit];
    let st = &plan.stages[u.stage];
    UnitHistory {
        failure_policy: st.spec.failure_policy,
        resumable: st.worker.resumable,
        oom_retry_allowed: settings.oom_retry.contains(&st.stage_id),
        max_attempts: st.spec.max_attempts.max(1),
        counted_attempts: u.counted,
        transient_failures: u.transient,
        infra_failures: u.infra,
        fail_fast: false,
        oom_failures: u.oom,
    }
}

/// What an ended attempt leads to: events to tell now, entries to journal with the others.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Ended {
    /// Told at once (the entries journal them).
    pub notify: Vec<ControllerEvent>,
    /// `Finished`, then (unless this controller cancelled it) the unit's `Decided`.
    pub entries: Vec<Entry>,
}

/// The entries of attempt `a` that ended with status `st` and `verdict`: its `Finished`, then
/// the policy's decision for its unit (a retry not before its backoff, a failure naming the
/// verdict); only `Finished` when this controller cancelled it (not a failure: the unit runs
/// again on the next `run`).
#[allow(clippy::too_many_arguments)] // the state, the plan, the settings, now and the input
pub(super) fn finish(
    state: &State,
    plan: &CampaignPlan,
    settings: &Settings,
    now_ms: u64,
    a: usize,
    st: &JobStatus,
    log_path: PathBuf,
    verdict: Verdict,
) -> Ended {
    let Verdict {
        class,
        mut detail,
        fail_fast,
        oom,
    } = verdict;
    let nodes = end_nodes(st);
    let at = &state.attempts[a];
    let unit = at.unit;
    let u = &state.units[unit];
    let stage = &plan.stages[u.stage];
    if fail_fast {
        detail = format!(
            "{detail}; failed fast on {}: charged to the infrastructure budget and the node, the retry avoids it",
            nodes.as_deref().unwrap_or_default()
        );
    }
    let id = at.id.clone();
    let by_us = at.cancel_requested && class == Some(FailureClass::Cancelled);
    let mut h = history(state, plan, settings, unit);
    h.fail_fast = fail_fast;
    match class {
        Some(FailureClass::Transient | FailureClass::Hung) if fail_fast => h.infra_failures += 1,
        Some(FailureClass::Transient | FailureClass::Hung) => h.transient_failures += 1,
        Some(FailureClass::Oom) => {
            h.oom_failures += 1;
            h.counted_attempts += 1
        }
        _ => h.counted_attempts += 1,
    }
    let is_pool_worker = state.stages[u.stage].pool && u.item.is_some();
    let finished = |class, detail| Entry::Finished {
        attempt_id: id.clone(),
        state: st.state.clone(),
        exit_code: st.exit_code,
        class,
        detail,
        log_path: Some(log_path.clone()),
        nodes: nodes.clone(),
        fail_fast,
        oom,
    };
    if by_us {
        // Cancelled by this controller (shutdown, new revision): not a failure and not a
        // retry. No decision is journaled: replaying the `Finished` entry puts the unit
        // back to ready (see `State::apply`), so it runs again on the next `run`.
        return Ended {
            notify: vec![ControllerEvent::AttemptCancelled {
                attempt_id: id.clone(),
                stage: stage.stage_id.clone(),
                detail: format!("{}; {detail}", st.state),
            }],
            entries: vec![finished(class, detail)],
        };
    }
    let decision = if is_pool_worker && class.is_none() {
        Decision::Done
    } else {
        decide(&settings.retry, class, &h, id.as_str())
    };
    let not_before_ms = match &decision {
        Decision::Retry { delay, .. } => now_ms + delay.as_millis() as u64,
        _ => 0,
    };
    let decision = match decision {
        Decision::Fail { reason } => Decision::Fail {
            reason: format!("{reason} ({detail})"),
        },
        d => d,
    };
    Ended {
        notify: vec![ControllerEvent::AttemptFinished {
            attempt_id: id.clone(),
            stage: stage.stage_id.clone(),
            state: st.state.to_string(),
            class,
            detail: detail.clone(),
            decision: class.map(|_| describe(&decision)),
        }],
        entries: vec![
            finished(class, detail),
            Entry::Decided {
                unit: u.key.clone(),
                decision,
                not_before_ms,
            },
        ],
    }
}

// ---- A poll (`poll`): the loop polls and cancels, these say what the statuses mean. ----

/// What to do with one batch of polled statuses.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PollPlan {
    /// In-memory marks to set (never journaled; a restart counts again).
    pub marks: Vec<Mark>,
    /// Attempts whose status is terminal, with the index of their status: their evidence is
    /// read and judged ([`finish`]).
    pub ended: Vec<(usize, usize)>,
    /// Running attempts whose progress mark is due to be read, with their status's index
    /// and the stage's heartbeat timeout: then [`heartbeat`] says whether they hang.
    pub beat_due: Vec<(usize, usize, Duration)>,
    /// Pending attempts stuck for longer than `stuck_after`: cancelled ([`stuck_cancel`]).
    pub stuck: Vec<(usize, FailureClass, String)>,
    /// Hosts whose SSH host key was refused, with the message: excluded.
    pub refused_hosts: Vec<(String, String)>,
}

/// An in-memory mark of an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mark {
    /// Not running (suspended, requeued, pending again): its heartbeat counts from the next
    /// time it runs.
    ClearBeat(usize),
    /// Pending with a reason that does not free up, since (controller clock, ms); `None`: not.
    PendingSince(usize, Option<u64>),
}

/// The heartbeat timeout of stage `si`: the builder's, else the plan's.
pub(super) fn heartbeat_timeout(
    plan: &CampaignPlan,
    settings: &Settings,
    si: usize,
) -> Option<Duration> {
    let st = &plan.stages[si];
    settings
        .heartbeat
        .get(&st.stage_id)
        .copied()
        .or(st.spec.heartbeat_timeout_s.map(Duration::from_secs))
}

/// Maps the statuses of the live attempts `chunk` (in the same order) to what to do.
pub(super) fn poll_plan(
    state: &State,
    plan: &CampaignPlan,
    settings: &Settings,
    now_ms: u64,
    chunk: &[usize],
    statuses: &[JobStatus],
) -> PollPlan {
    let mut p = PollPlan::default();
    for (i, (&a, st)) in chunk.iter().zip(statuses.iter()).enumerate() {
        let at = &state.attempts[a];
        if st.state != JobState::Running {
            p.marks.push(Mark::ClearBeat(a));
        }
        if st.state == JobState::NodeFail
            && let Some(host) = st.refused_host_key.as_deref()
        {
            // Its host's SSH key changed or is unknown (issue 27, P07): the host is
            // excluded, the attempt ends as a node failure and is placed elsewhere.
            let why = st.reason.clone().unwrap_or_default();
            p.refused_hosts.push((host.to_string(), why));
        }
        if st.state.is_terminal() {
            p.ended.push((a, i));
        } else if st.state == JobState::Running {
            if let Some(timeout) = beat_due(state, plan, settings, now_ms, a) {
                p.beat_due.push((a, i, timeout));
            }
        } else if matches!(st.state, JobState::Pending) {
            if let Some(PendingVerdict::Stuck(class)) = st.reason.as_deref().map(pending_verdict) {
                let since = at.pending_since_ms.unwrap_or(now_ms);
                p.marks.push(Mark::PendingSince(a, Some(since)));
                if now_ms.saturating_sub(since) >= settings.stuck_after.as_millis() as u64
                    && !at.cancel_requested
                {
                    p.stuck
                        .push((a, class, st.reason.clone().unwrap_or_default()));
                }
            } else {
                p.marks.push(Mark::PendingSince(a, None));
            }
        }
    }
    p
}

/// The heartbeat timeout of running attempt `a` when its logs are due to be read: never for
/// one whose cancel was requested or whose stage has no timeout; at most every 1/20 of the
/// timeout (at least 1 s), so many attempts with many rank logs do not turn each poll into a
/// scan, unless it has been silent for the timeout already.
pub(super) fn beat_due(
    state: &State,
    plan: &CampaignPlan,
    settings: &Settings,
    now_ms: u64,
    a: usize,
) -> Option<Duration> {
    let at = &state.attempts[a];
    if at.cancel_requested {
        return None;
    }
    let timeout = heartbeat_timeout(plan, settings, state.units[at.unit].stage)?;
    let every = (timeout / 20).max(Duration::from_secs(1)).as_millis() as u64;
    if let Some(b) = at.beat
        && now_ms.saturating_sub(b.checked_ms) < every
        && Duration::from_millis(now_ms.saturating_sub(b.moved_ms)) < timeout
    {
        return None;
    }
    Some(timeout)
}

/// The new progress mark of a running attempt from what the loop read (the highest `step N`
/// of its logs, its heartbeat file's time) and whether it hangs: silent for the timeout
/// (`Some((silent for, last step))`).
pub(super) fn heartbeat(
    beat: Option<Beat>,
    step: Option<u64>,
    file_ms: Option<u64>,
    now_ms: u64,
    timeout: Duration,
) -> (Beat, Option<(Duration, Option<u64>)>) {
    let beat = match beat {
        None => Beat {
            step,
            file_ms,
            moved_ms: now_ms,
            checked_ms: now_ms,
        },
        Some(b) if step > b.step || file_ms > b.file_ms => Beat {
            step: step.max(b.step),
            file_ms: file_ms.max(b.file_ms),
            moved_ms: now_ms,
            checked_ms: now_ms,
        },
        Some(b) => Beat {
            checked_ms: now_ms,
            ..b
        },
    };
    let silent = Duration::from_millis(now_ms.saturating_sub(beat.moved_ms));
    (beat, (silent >= timeout).then_some((silent, beat.step)))
}

/// A cancel the controller decided: what to journal and tell before the executor's cancel,
/// and the status the attempt ends with once cancelled.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Cancel {
    /// The attempt.
    pub attempt: usize,
    /// Journaled and told before the cancel (the cancel request first).
    pub before: Vec<Action>,
    /// The status it ends with.
    pub ended: JobStatus,
}

/// The cancel of pending attempt `a`, stuck with `reason` for longer than `stuck_after`; it
/// ends with `class` and the returned detail.
pub(super) fn stuck_cancel(
    state: &State,
    settings: &Settings,
    a: usize,
    reason: &str,
) -> (Cancel, String) {
    let id = state.attempts[a].id.clone();
    let msg = format!(
        "pending with reason {reason} for longer than {:?}",
        settings.stuck_after
    );
    let cancel = Cancel {
        attempt: a,
        before: vec![Action::Journal(vec![Entry::CancelRequested {
            attempt_id: id.clone(),
            reason: msg.clone(),
            last_heartbeat_ms: None,
        }])],
        ended: JobStatus::new(id, JobState::Cancelled { by_uid: None }).with_reason(msg.clone()),
    };
    (cancel, msg)
}

/// The cancel of running attempt `a`, silent for `silent` (its last mark `last_step`): the
/// cancel request journals its last heartbeat, [`ControllerEvent::AttemptStuck`] is
/// reported, and it ends cancelled on the nodes it ran on (`st`).
pub(super) fn hung_cancel(
    state: &State,
    a: usize,
    silent: Duration,
    last_step: Option<u64>,
    st: &JobStatus,
) -> Cancel {
    let at = &state.attempts[a];
    let reason = format!(
        "no progress mark for {} s (heartbeat timeout; last mark {})",
        silent.as_secs(),
        last_step.map_or_else(|| "none".to_string(), |s| format!("step {s}"))
    );
    let mut ended = JobStatus::new(at.id.clone(), JobState::Cancelled { by_uid: None })
        .with_reason(reason.clone());
    ended.nodes = st.nodes.clone();
    Cancel {
        attempt: a,
        before: vec![
            Action::Journal(vec![Entry::CancelRequested {
                attempt_id: at.id.clone(),
                reason: reason.clone(),
                last_heartbeat_ms: at.beat.map(|b| b.moved_ms),
            }]),
            Action::Emit(ControllerEvent::AttemptStuck {
                attempt_id: at.id.clone(),
                reason,
            }),
        ],
        ended,
    }
}

/// The verdict on a hung attempt once cancelled, from its logs as they are then (what it
/// printed on SIGTERM included).
pub(super) fn hung_verdict(ev: &Evidence, silent: Duration, last_step: Option<u64>) -> Verdict {
    let c = classify_hung(ev, silent, last_step);
    forced_verdict(c.class.unwrap_or(FailureClass::Hung), c.detail)
}

/// After a poll that failed with a retryable error, the `n`th in a row: when the next try
/// comes, and the report (the first, then every tenth).
pub(super) fn poll_failed(
    settings: &Settings,
    n: u64,
    error: String,
) -> (Duration, Option<ControllerEvent>) {
    let retry_in = settings
        .poll_min
        .mul_f64(1.5f64.powi(n.min(64) as i32))
        .min(settings.poll_max);
    let report = (n % 10 == 1).then_some(ControllerEvent::SchedulerUnreachable {
        error,
        consecutive: n,
        retry_in,
    });
    (retry_in, report)
}

// ---- Starting attempts (`submit`): the loop finds and submits, these pick and follow up. ----

/// What resolving an intent left without a handle (a crash between intent and handle) does
/// with `find`'s answer (`None`: no job has the attempt id): adopt the job, give the attempt
/// up once the adoption grace has passed since its intent, or wait.
pub(super) fn found_entry(
    state: &State,
    settings: &Settings,
    now_ms: u64,
    a: usize,
    found: Option<JobHandle>,
) -> Option<Entry> {
    let at = &state.attempts[a];
    let Phase::Intent { at_ms } = at.phase else {
        return None;
    };
    match found {
        Some(handle) => Some(Entry::Submitted {
            attempt_id: at.id.clone(),
            handle,
            adopted: true,
        }),
        None if now_ms.saturating_sub(at_ms) >= settings.adopt_grace.as_millis() as u64 => {
            Some(Entry::SubmitFailed {
                attempt_id: at.id.clone(),
                error: "no job found for the intent after the adoption grace (the submit never happened)".into(),
            })
        }
        None => None,
    }
}

/// The units to start now, in plan order: ready, past their backoff, in open stages whose
/// parents are done and none of whose units failed (a failed stage starts nothing more; its
/// live attempts drain), the aggregate step once every item is done; at most `max_live`
/// live in all and `submit_batch` per iteration.
pub(super) fn ready_units(state: &State, settings: &Settings, now_ms: u64) -> Vec<usize> {
    let mut budget = settings
        .max_live
        .map_or(usize::MAX, |m| m.saturating_sub(state.live))
        .min(settings.submit_batch);
    let mut picks = Vec::new();
    for s in &state.stages {
        if s.status != StageStatus::Open
            || !s
                .parents
                .iter()
                .all(|&p| state.stages[p].status == StageStatus::Done)
        {
            continue;
        }
        if s.units
            .iter()
            .chain(s.agg.iter())
            .any(|&u| state.units[u].status == UnitStatus::Failed)
        {
            continue;
        }
        let items_done = s
            .units
            .iter()
            .all(|&u| state.units[u].status == UnitStatus::Done);
        let mut cands: Vec<usize> = s.units.clone();
        if items_done && let Some(a) = s.agg {
            cands.push(a);
        }
        for u in cands {
            if budget == 0 {
                break;
            }
            let unit = &state.units[u];
            if unit.status == UnitStatus::Ready && unit.not_before_ms <= now_ms {
                picks.push(u);
                budget -= 1;
            }
        }
    }
    picks
}

/// The persistent-pool stages among `picks` whose queue is not filled yet (filled before
/// their first worker starts), in order.
pub(super) fn pool_fills(state: &State, picks: &[usize]) -> Vec<usize> {
    let mut fills = Vec::new();
    for &u in picks {
        let si = state.units[u].stage;
        if state.stages[si].pool && !state.stages[si].pool_filled && !fills.contains(&si) {
            fills.push(si);
        }
    }
    fills
}

/// The id of attempt `n` of `unit`.
pub(super) fn attempt_id_for(state: &State, unit: usize, n: u32) -> AttemptId {
    let u = &state.units[unit];
    super::spec::attempt_id(
        &state.nonce,
        state.revision,
        &state.stages[u.stage].id,
        u.item,
        n,
    )
}

/// Nodes the next attempt of `unit` must avoid: every node the campaign excluded, and the
/// nodes of the unit's last attempt that failed fast.
pub(super) fn nodes_to_avoid(state: &State, unit: usize) -> BTreeSet<String> {
    state
        .excluded_nodes
        .keys()
        .chain(state.units[unit].exclude.iter())
        .cloned()
        .collect()
}

/// The next attempt of a unit: its intent (journaled before the submit) and its spec.
#[derive(Clone, Debug)]
pub(super) struct Start {
    /// The unit's previous attempt, whose outputs are moved aside first.
    pub previous: Option<AttemptId>,
    /// The `Intent` entry.
    pub intent: Entry,
    /// What is submitted.
    pub spec: AttemptSpec,
}

/// The next attempt of `unit`: the retry's resume and more-resources flags as decided, the
/// nodes to avoid excluded.
pub(super) fn start(
    state: &State,
    plan: &CampaignPlan,
    dir: &Path,
    unit: usize,
) -> Result<Start, ControllerError> {
    let u = &state.units[unit];
    let n = u.attempts.len() as u32 + 1;
    let id = attempt_id_for(state, unit, n);
    let st = &plan.stages[u.stage];
    let mut spec = super::spec::attempt_spec(&UnitSpec {
        campaign: dir,
        plan,
        stage: st,
        unit_key: &u.key,
        item: u.item,
        attempt_id: &id,
        attempt: n,
        resume: u.next_resume,
        more_resources: u.next_more_resources,
    })?;
    super::nodes::add_exclude(
        &mut spec.scheduler.extra_directives,
        &nodes_to_avoid(state, unit),
    );
    Ok(Start {
        previous: (n > 1).then(|| attempt_id_for(state, unit, n - 1)),
        intent: Entry::Intent {
            unit: u.key.clone(),
            attempt: n,
            attempt_id: id,
            resume: u.next_resume,
            more_resources: u.next_more_resources,
        },
        spec,
    })
}

/// The host whose SSH host key refused a submit, when it is not excluded yet (an executor
/// that names a host already excluded does not honour the exclusion: that is not retried
/// this way, never a loop).
pub(super) fn refused_host(state: &State, e: &ExecutorError) -> Option<String> {
    e.refused_host_key()
        .filter(|h| !state.excluded_nodes.contains_key(*h))
        .map(str::to_string)
}

/// Whether a failed submit may still have created the job (`find` is asked before deciding).
pub(super) fn maybe_created(e: &ExecutorError) -> bool {
    e.is_retryable()
        || matches!(
            e,
            ExecutorError::DuplicateAttempt { .. } | ExecutorError::SubmitUnknown { .. }
        )
}

/// The `Decided` entries that follow the submits' results (after the intents were applied):
/// a submit refused for good fails its unit as a configuration error, any other is retried
/// after the backoff, at once for one whose host was refused (`refused`: the host is
/// excluded, neither the attempt is charged nor delayed).
pub(super) fn after_submits(
    state: &State,
    settings: &Settings,
    now_ms: u64,
    results: &[Entry],
    refused: &HashSet<AttemptId>,
) -> Vec<Entry> {
    let mut follow = Vec::new();
    for r in results {
        let Entry::SubmitFailed { attempt_id, error } = r else {
            continue;
        };
        let Some(&a) = state.attempt_index.get(attempt_id) else {
            continue;
        };
        let u = &state.units[state.attempts[a].unit];
        let decision = if error.starts_with("fatal: ") {
            Decision::Fail {
                reason: format!("config: {error}"),
            }
        } else {
            Decision::Retry {
                delay: settings.retry.delay(1, attempt_id.as_str()),
                resume: u.next_resume,
                more_resources: u.next_more_resources,
            }
        };
        let not_before_ms = match &decision {
            Decision::Retry { .. } if refused.contains(attempt_id) => now_ms,
            Decision::Retry { delay, .. } => now_ms + delay.as_millis() as u64,
            _ => 0,
        };
        follow.push(Entry::Decided {
            unit: u.key.clone(),
            decision,
            not_before_ms,
        });
    }
    follow
}

// ---- Stage transitions (`finalise::advance_stages`) and the end of a run. ----

/// Where an open stage goes next.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Transition {
    /// Nowhere yet.
    Stay,
    /// A unit failed: the stage fails (journaled, then told); `halt`: the `fail_fast` halt
    /// policy stops the campaign (its live attempts cancelled).
    Failed {
        /// What to do.
        actions: Vec<Action>,
        /// Stop the campaign.
        halt: bool,
    },
    /// A persistent pool: its queue decides (the loop reads it).
    Pool,
    /// Every unit and parent is done: the stage is (journaled, then told).
    Done(Vec<Action>),
}

/// Where open stage `si` goes next (a manual decision stage ends by its decision, never
/// here): failed when a unit failed (under `drain`, once its own live attempts have ended),
/// done when its items, aggregate step and parents are.
pub(super) fn stage_transition(state: &State, plan: &CampaignPlan, si: usize) -> Transition {
    let s = &state.stages[si];
    if s.status != StageStatus::Open || s.decision {
        return Transition::Stay;
    }
    let mut units = s.units.iter().chain(s.agg.iter()).map(|&u| &state.units[u]);
    if let Some(failed) = units.clone().find(|u| u.status == UnitStatus::Failed) {
        let halt = plan.execution_defaults.halt_policy;
        if halt == HaltPolicy::Drain && units.any(|u| u.status == UnitStatus::Live) {
            return Transition::Stay; // let the stage's own live attempts finish first
        }
        let reason = format!(
            "unit {} failed: {}",
            failed.key,
            failed.fail_reason.clone().unwrap_or_default()
        );
        return Transition::Failed {
            actions: vec![
                Action::Journal(vec![Entry::StageFailed {
                    stage: s.id.clone(),
                    reason: reason.clone(),
                }]),
                Action::Notify(ControllerEvent::StageFailed {
                    stage: s.id.clone(),
                    reason,
                }),
            ],
            halt: halt == HaltPolicy::FailFast,
        };
    }
    if s.pool {
        return Transition::Pool;
    }
    let done = |u: &usize| state.units[*u].status == UnitStatus::Done;
    if s.units.iter().all(done)
        && s.agg.iter().all(done)
        && s.parents
            .iter()
            .all(|&p| state.stages[p].status == StageStatus::Done)
    {
        return Transition::Done(vec![
            Action::Journal(vec![Entry::StageDone {
                stage: s.id.clone(),
            }]),
            Action::Notify(ControllerEvent::StageDone {
                stage: s.id.clone(),
            }),
        ]);
    }
    Transition::Stay
}

/// Whether a run has nothing left to do: nothing live, no intent to resolve, and no open
/// stage that can still run (or the campaign halted).
pub(super) fn finished(state: &State, halted: bool) -> bool {
    let open = state
        .stages
        .iter()
        .any(|s| s.status == StageStatus::Open && !blocked(state, s));
    state.live == 0 && state.unresolved_intents().is_empty() && (!open || halted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::config::Value as ConfigValue;
    use crate::campaign::{ExecutionConfig, ManualDecision, RunnerEnvironment, StageCatalog};

    /// Compiles `{"stages": stages}` for the local runner.
    pub(super) fn plan(stages: serde_json::Value) -> CampaignPlan {
        let config = ConfigValue::from_json(&serde_json::json!({ "stages": stages }));
        let catalog = StageCatalog::from_config("exp", &config).unwrap();
        crate::campaign::compile_resolved(
            "exp",
            config,
            &[],
            &catalog,
            &RunnerEnvironment::local(),
            &ExecutionConfig::default(),
            None,
        )
        .unwrap()
    }

    /// a (3 shards) -> pick (manual decision over a's items) -> c -> d; b independent.
    fn decision_plan() -> CampaignPlan {
        let mut p = plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 3, "command": ["w"]},
            {"id": "pick", "needs": ["a"], "command": ["w"]},
            {"id": "c", "needs": ["pick"], "command": ["w"]},
            {"id": "d", "needs": ["c"], "command": ["w"]},
            {"id": "b", "command": ["w"]},
        ]));
        let i = p.stages.iter().position(|s| s.stage_id == "pick").unwrap();
        p.stages[i].decision = Some(ManualDecision::new(
            "a",
            vec!["a:0".into(), "a:1".into(), "a:2".into()],
        ));
        p
    }

    /// A state where the entries were journaled.
    pub(super) fn state_after(plan: &CampaignPlan, entries: &[Entry]) -> State {
        let mut s = State::new(plan);
        for e in entries {
            s.apply(e, plan, 1_000).unwrap();
        }
        s
    }

    fn si(state: &State, id: &str) -> usize {
        state.stage_index(id).unwrap()
    }

    #[test]
    fn file_choice_reads_all_numbers_and_problems() {
        let c: Vec<String> = vec!["a:0".into(), "a:1".into(), "a:2".into()];
        assert_eq!(file_choice(&DecisionFile::Absent, &c), Ok(None));
        assert_eq!(
            file_choice(&DecisionFile::Text("all\n".into()), &c),
            Ok(Some(c.clone()))
        );
        assert_eq!(
            file_choice(&DecisionFile::Text("1 3".into()), &c),
            Ok(Some(vec!["a:0".into(), "a:2".into()]))
        );
        assert_eq!(
            file_choice(&DecisionFile::Text("none".into()), &c),
            Ok(Some(vec![]))
        );
        assert!(file_choice(&DecisionFile::Text("7".into()), &c).is_err());
        assert_eq!(
            file_choice(&DecisionFile::Unreadable("EACCES".into()), &c),
            Err("cannot be read: EACCES".into())
        );
    }

    #[test]
    fn a_bad_file_is_reported_once_per_message() {
        let f = Path::new("/c/decisions/pick.txt");
        assert_eq!(
            invalid_decision(None, "pick", f, "bad".into()),
            Some(ControllerEvent::DecisionInvalid {
                stage: "pick".into(),
                file: f.to_path_buf(),
                error: "bad".into(),
            })
        );
        assert_eq!(invalid_decision(Some("bad"), "pick", f, "bad".into()), None);
        assert!(invalid_decision(Some("bad"), "pick", f, "worse".into()).is_some());
    }

    #[test]
    fn a_decision_waits_for_its_parents() {
        let p = decision_plan();
        let s = state_after(&p, &[]);
        assert!(!awaits_decision(&s, &s.stages[si(&s, "pick")]));
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        assert!(awaits_decision(&s, &s.stages[si(&s, "pick")]));
        assert!(
            !awaits_decision(&s, &s.stages[si(&s, "c")]),
            "not a decision"
        );
        let s = state_after(
            &p,
            &[Entry::StageFailed {
                stage: "a".into(),
                reason: "x".into(),
            }],
        );
        assert!(!awaits_decision(&s, &s.stages[si(&s, "pick")]));
        assert!(
            blocked(&s, &s.stages[si(&s, "d")]),
            "blocked through pick, c"
        );
        assert!(!blocked(&s, &s.stages[si(&s, "b")]));
    }

    #[test]
    fn no_answer_announces_once() {
        let p = decision_plan();
        let dir = Path::new("/c");
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let file = decision_file(dir, "pick");
        let candidates: Vec<String> = vec!["a:0".into(), "a:1".into(), "a:2".into()];
        assert_eq!(
            decision_actions(&s, &p, dir, si(&s, "pick"), None),
            vec![
                Action::MakeDecisionDir(file.parent().unwrap().to_path_buf()),
                Action::Notify(ControllerEvent::DecisionNeeded {
                    stage: "pick".into(),
                    file: file.clone(),
                    candidates: candidates.clone(),
                }),
                Action::Journal(vec![Entry::DecisionNeeded {
                    stage: "pick".into(),
                    file: file.clone(),
                    candidates: candidates.clone(),
                }]),
            ]
        );
        let s = state_after(
            &p,
            &[
                Entry::StageDone { stage: "a".into() },
                Entry::DecisionNeeded {
                    stage: "pick".into(),
                    file,
                    candidates,
                },
            ],
        );
        assert_eq!(decision_actions(&s, &p, dir, si(&s, "pick"), None), vec![]);
    }

    #[test]
    fn a_file_present_advances_the_stage() {
        let p = decision_plan();
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let chosen = vec!["a:0".to_string(), "a:2".to_string()];
        let actions = decision_actions(
            &s,
            &p,
            Path::new("/c"),
            si(&s, "pick"),
            Some(chosen.clone()),
        );
        assert_eq!(
            actions,
            vec![
                Action::WriteSelection {
                    stage: "pick".into(),
                    body: serde_json::json!({
                        "stage": "pick",
                        "input": "a",
                        "candidates": ["a:0", "a:1", "a:2"],
                        "chosen": ["a:0", "a:2"],
                    }),
                },
                Action::Notify(ControllerEvent::DecisionMade {
                    stage: "pick".into(),
                    chosen: chosen.clone(),
                    skipped: vec![],
                }),
                Action::Notify(ControllerEvent::StageDone {
                    stage: "pick".into()
                }),
                Action::Journal(vec![
                    Entry::DecisionMade {
                        stage: "pick".into(),
                        chosen,
                    },
                    Entry::StageDone {
                        stage: "pick".into()
                    },
                ]),
            ]
        );
    }

    #[test]
    fn choosing_none_skips_every_open_descendant() {
        let p = decision_plan();
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let actions = decision_actions(&s, &p, Path::new("/c"), si(&s, "pick"), Some(vec![]));
        let Some(Action::Journal(entries)) = actions.last() else {
            panic!("no journal action: {actions:?}");
        };
        assert_eq!(
            entries[2..],
            [
                Entry::StageSkipped {
                    stage: "c".into(),
                    reason: "the manual decision pick chose none".into(),
                },
                Entry::StageSkipped {
                    stage: "d".into(),
                    reason: "the manual decision pick chose none".into(),
                },
            ]
        );
        assert_eq!(descendants(&s, si(&s, "a")), ["pick", "c", "d"]);
    }

    /// `unit`'s attempt 1 journaled and submitted: the state and the attempt's index.
    pub(super) fn live(plan: &CampaignPlan, unit: &str, before: &[Entry]) -> (State, usize) {
        let id = AttemptId::sanitize(&format!("n.{}.a1", unit.replace('/', ".")));
        let mut entries = before.to_vec();
        entries.push(Entry::Intent {
            unit: unit.into(),
            attempt: 1,
            attempt_id: id.clone(),
            resume: false,
            more_resources: false,
        });
        entries.push(Entry::Submitted {
            attempt_id: id.clone(),
            handle: crate::executor::JobHandle::new("mock", id.clone(), "1", 0),
            adopted: false,
        });
        let s = state_after(plan, &entries);
        let a = s.attempt_index[&id];
        (s, a)
    }

    fn looked(path: &str, visible: bool, late: bool) -> Looked {
        Looked {
            path: path.into(),
            visible,
            late,
        }
    }

    #[test]
    fn outputs_not_visible_are_looked_for_again_until_the_bound() {
        let wait = Duration::from_secs(60);
        let seen = [
            looked("/o/_SUCCESS", true, false),
            looked("/o/m.pt", false, false),
        ];
        assert_eq!(
            visibility(None, 5_000, wait, &seen),
            Visibility::Wait { since_ms: 5_000 }
        );
        assert_eq!(
            visibility(Some(5_000), 64_999, wait, &seen),
            Visibility::Wait { since_ms: 5_000 }
        );
        assert_eq!(
            visibility(Some(5_000), 65_000, wait, &seen),
            Visibility::NotVisible {
                since_ms: 5_000,
                detail: "state COMPLETED (exit 0) but not visible after 60 s (stat, readdir of its folder, open; retried with backoff): /o/m.pt".into(),
            }
        );
        let all = [
            looked("/o/_SUCCESS", true, false),
            looked("/o/m.pt", true, true),
        ];
        assert_eq!(
            visibility(None, 5_000, wait, &all),
            Visibility::Seen {
                late: vec!["/o/m.pt".into()]
            }
        );
        assert_eq!(
            visibility(Some(5_000), 17_000, wait, &all),
            Visibility::Seen {
                late: vec!["/o/m.pt".into(), "visible after 12 s".into()]
            }
        );
    }

    #[test]
    fn a_forced_oom_names_its_kind() {
        let v = forced_verdict(FailureClass::Oom, "hung; out of memory (gpu)".into());
        assert_eq!(v.oom, Some(OomKind::Gpu));
        assert_eq!(
            forced_verdict(FailureClass::Oom, "oom-kill".into()).oom,
            Some(OomKind::Host)
        );
        assert_eq!(forced_verdict(FailureClass::Hung, "x".into()).oom, None);
        assert!(!forced_verdict(FailureClass::Hung, "x".into()).fail_fast);
    }

    fn one_stage(extra: serde_json::Value) -> CampaignPlan {
        let mut st = serde_json::json!({"id": "a", "command": ["w"]});
        if let (Some(o), Some(e)) = (st.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        plan(serde_json::json!([st]))
    }

    #[test]
    fn a_transient_failure_with_retries_left_is_retried_after_its_backoff() {
        let p = one_stage(serde_json::json!({}));
        let (s, a) = live(&p, "a/0", &[]);
        let settings = Settings::defaults();
        let id = s.attempts[a].id.clone();
        let st = JobStatus::new(id.clone(), JobState::NodeFail);
        let ended = finish(
            &s,
            &p,
            &settings,
            10_000,
            a,
            &st,
            PathBuf::from("/l"),
            forced_verdict(FailureClass::Transient, "node failure".into()),
        );
        let delay = settings.retry.delay(1, id.as_str());
        assert_eq!(
            ended.entries,
            vec![
                Entry::Finished {
                    attempt_id: id.clone(),
                    state: JobState::NodeFail,
                    exit_code: None,
                    class: Some(FailureClass::Transient),
                    detail: "node failure".into(),
                    log_path: Some(PathBuf::from("/l")),
                    nodes: None,
                    fail_fast: false,
                    oom: None,
                },
                Entry::Decided {
                    unit: "a/0".into(),
                    decision: Decision::Retry {
                        delay,
                        resume: false,
                        more_resources: false,
                    },
                    not_before_ms: 10_000 + delay.as_millis() as u64,
                },
            ]
        );
        assert_eq!(
            ended.notify,
            vec![ControllerEvent::AttemptFinished {
                attempt_id: id,
                stage: "a".into(),
                state: JobState::NodeFail.to_string(),
                class: Some(FailureClass::Transient),
                detail: "node failure".into(),
                decision: Some(describe(&Decision::Retry {
                    delay,
                    resume: false,
                    more_resources: false,
                })),
            }]
        );
    }

    #[test]
    fn an_application_failure_under_strict_fails_the_unit_naming_the_evidence() {
        let mut p = one_stage(serde_json::json!({}));
        p.stages[0].spec.failure_policy = crate::campaign::FailurePolicy::Strict;
        let (s, a) = live(&p, "a/0", &[]);
        let st = JobStatus::new(s.attempts[a].id.clone(), JobState::Failed).with_exit_code(1);
        let ended = finish(
            &s,
            &p,
            &Settings::defaults(),
            10_000,
            a,
            &st,
            PathBuf::from("/l"),
            forced_verdict(FailureClass::Application, "exit 1: NaN loss".into()),
        );
        assert_eq!(
            ended.entries[1],
            Entry::Decided {
                unit: "a/0".into(),
                decision: Decision::Fail {
                    reason: "application: failure policy strict (exit 1: NaN loss)".into()
                },
                not_before_ms: 0,
            }
        );
    }

    #[test]
    fn an_attempt_this_controller_cancelled_gets_no_decision() {
        let p = one_stage(serde_json::json!({}));
        let id = AttemptId::sanitize("n.a.0.a1");
        let (s, a) = live(&p, "a/0", &[]);
        let s = {
            let mut s = s;
            s.apply(
                &Entry::CancelRequested {
                    attempt_id: id.clone(),
                    reason: "shutdown".into(),
                    last_heartbeat_ms: None,
                },
                &p,
                2_000,
            )
            .unwrap();
            s
        };
        let st = JobStatus::new(id.clone(), JobState::Cancelled { by_uid: None });
        let ended = finish(
            &s,
            &p,
            &Settings::defaults(),
            10_000,
            a,
            &st,
            PathBuf::from("/l"),
            forced_verdict(FailureClass::Cancelled, "by us".into()),
        );
        assert_eq!(ended.entries.len(), 1);
        assert!(matches!(ended.entries[0], Entry::Finished { .. }));
        assert_eq!(
            ended.notify,
            vec![ControllerEvent::AttemptCancelled {
                attempt_id: id,
                stage: "a".into(),
                detail: format!("{}; by us", st.state),
            }]
        );
    }

    #[test]
    fn a_clean_completion_is_done_and_a_missing_marker_is_not() {
        let p = one_stage(serde_json::json!({}));
        let (s, a) = live(&p, "a/0", &[]);
        let settings = Settings::defaults();
        let st = JobStatus::new(s.attempts[a].id.clone(), JobState::Completed).with_exit_code(0);
        let ev = Evidence {
            success_marker: Some(true),
            ..Evidence::default()
        };
        let v = classified_verdict(&s, &settings, 10_000, a, &st, ev, &["/o/m.pt".into()]);
        assert_eq!(v.class, None, "{}", v.detail);
        assert!(
            v.detail
                .ends_with("; not visible to stat at first, then found by readdir/open: /o/m.pt"),
            "{}",
            v.detail
        );
        let ended = finish(&s, &p, &settings, 10_000, a, &st, PathBuf::from("/l"), v);
        assert_eq!(
            ended.entries[1],
            Entry::Decided {
                unit: "a/0".into(),
                decision: Decision::Done,
                not_before_ms: 0,
            }
        );
        let ev = Evidence {
            success_marker: Some(false),
            ..Evidence::default()
        };
        let v = classified_verdict(&s, &settings, 10_000, a, &st, ev, &[]);
        assert!(
            v.class.is_some(),
            "no marker is not a success: {}",
            v.detail
        );
    }

    /// Stage `a` of 4 shards, every shard's attempt 1 live: the state and the attempts.
    fn four_live() -> (CampaignPlan, State, Vec<usize>) {
        let p = plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 4, "command": ["w"]},
        ]));
        let mut entries = Vec::new();
        for i in 0..4 {
            let id = AttemptId::sanitize(&format!("n.a.{i}.a1"));
            entries.push(Entry::Intent {
                unit: format!("a/{i}"),
                attempt: 1,
                attempt_id: id.clone(),
                resume: false,
                more_resources: false,
            });
            entries.push(Entry::Submitted {
                attempt_id: id.clone(),
                handle: crate::executor::JobHandle::new("mock", id, i.to_string(), 0),
                adopted: false,
            });
        }
        let s = state_after(&p, &entries);
        let live = s.live_attempts();
        (p, s, live)
    }

    #[test]
    fn statuses_map_to_ends_heartbeat_reads_stuck_cancels_and_refused_hosts() {
        let (p, mut s, live) = four_live();
        let mut settings = Settings::defaults();
        settings
            .heartbeat
            .insert("a".into(), Duration::from_secs(100));
        let ids: Vec<AttemptId> = s.attempts.iter().map(|a| a.id.clone()).collect();
        let id = |a: usize| ids[a].clone();
        let statuses = vec![
            JobStatus::new(id(live[0]), JobState::Completed).with_exit_code(0),
            JobStatus::new(id(live[1]), JobState::Running),
            JobStatus::new(id(live[2]), JobState::Pending).with_reason("JobHeldAdmin"),
            JobStatus::new(id(live[3]), JobState::NodeFail)
                .with_reason("host key changed")
                .with_refused_host_key("h2"),
        ];
        let got = poll_plan(&s, &p, &settings, 1_000, &live, &statuses);
        assert_eq!(
            got,
            PollPlan {
                marks: vec![
                    Mark::ClearBeat(live[0]),
                    Mark::ClearBeat(live[2]),
                    Mark::PendingSince(live[2], Some(1_000)),
                    Mark::ClearBeat(live[3]),
                ],
                ended: vec![(live[0], 0), (live[3], 3)],
                beat_due: vec![(live[1], 1, Duration::from_secs(100))],
                stuck: vec![],
                refused_hosts: vec![("h2".into(), "host key changed".into())],
            }
        );
        // Pending with the same reason for `stuck_after`: cancelled, once.
        s.attempts[live[2]].pending_since_ms = Some(1_000);
        let later = 1_000 + settings.stuck_after.as_millis() as u64;
        let got = poll_plan(&s, &p, &settings, later, &live[2..3], &statuses[2..3]);
        assert_eq!(
            got.stuck,
            vec![(live[2], FailureClass::Config, "JobHeldAdmin".into())]
        );
        let got = poll_plan(&s, &p, &settings, later - 1, &live[2..3], &statuses[2..3]);
        assert_eq!(got.stuck, vec![]);
        s.attempts[live[2]].cancel_requested = true;
        let got = poll_plan(&s, &p, &settings, later, &live[2..3], &statuses[2..3]);
        assert_eq!(got.stuck, vec![], "its cancel is already requested");
        // A reason that frees up clears the mark.
        let waiting = [JobStatus::new(id(live[2]), JobState::Pending).with_reason("Priority")];
        let got = poll_plan(&s, &p, &settings, later, &live[2..3], &waiting);
        assert_eq!(got.marks[1], Mark::PendingSince(live[2], None));
    }

    #[test]
    fn heartbeat_reads_are_rate_limited_unless_silent_for_the_timeout() {
        let (p, mut s, live) = four_live();
        let mut settings = Settings::defaults();
        assert_eq!(beat_due(&s, &p, &settings, 0, live[0]), None, "no timeout");
        let t = Duration::from_secs(100);
        settings.heartbeat.insert("a".into(), t);
        assert_eq!(beat_due(&s, &p, &settings, 0, live[0]), Some(t));
        s.attempts[live[0]].beat = Some(Beat {
            step: Some(3),
            file_ms: None,
            moved_ms: 10_000,
            checked_ms: 10_000,
        });
        // Every 1/20 of the timeout: 5 s.
        assert_eq!(beat_due(&s, &p, &settings, 14_999, live[0]), None);
        assert_eq!(beat_due(&s, &p, &settings, 15_000, live[0]), Some(t));
        s.attempts[live[0]].beat = Some(Beat {
            step: Some(3),
            file_ms: None,
            moved_ms: 0,
            checked_ms: 99_000,
        });
        assert_eq!(beat_due(&s, &p, &settings, 100_000, live[0]), Some(t));
        s.attempts[live[0]].cancel_requested = true;
        assert_eq!(beat_due(&s, &p, &settings, 100_000, live[0]), None);
    }

    #[test]
    fn a_mark_that_does_not_move_for_the_timeout_is_a_hang() {
        let t = Duration::from_secs(100);
        let (b, hung) = heartbeat(None, Some(3), None, 1_000, t);
        assert_eq!(
            b,
            Beat {
                step: Some(3),
                file_ms: None,
                moved_ms: 1_000,
                checked_ms: 1_000
            }
        );
        assert_eq!(hung, None);
        let (b2, hung) = heartbeat(Some(b), Some(3), None, 100_999, t);
        assert_eq!((b2.moved_ms, b2.checked_ms), (1_000, 100_999));
        assert_eq!(hung, None);
        let (_, hung) = heartbeat(Some(b2), Some(3), None, 101_000, t);
        assert_eq!(hung, Some((t, Some(3))));
        // A later step or a newer heartbeat file is progress.
        let (b3, hung) = heartbeat(Some(b2), Some(4), None, 101_000, t);
        assert_eq!((b3.step, b3.moved_ms, hung), (Some(4), 101_000, None));
        let (b4, hung) = heartbeat(Some(b2), None, Some(7), 101_000, t);
        assert_eq!(
            (b4.step, b4.file_ms, b4.moved_ms, hung),
            (Some(3), Some(7), 101_000, None)
        );
    }

    #[test]
    fn a_hung_job_is_cancelled_with_its_last_heartbeat_journaled_first() {
        let (_, mut s, live) = four_live();
        let a = live[1];
        s.attempts[a].beat = Some(Beat {
            step: Some(7),
            file_ms: None,
            moved_ms: 4_000,
            checked_ms: 9_000,
        });
        let id = s.attempts[a].id.clone();
        let st = JobStatus::new(id.clone(), JobState::Running).with_nodes("n[1-2]");
        let c = hung_cancel(&s, a, Duration::from_secs(120), Some(7), &st);
        let reason = "no progress mark for 120 s (heartbeat timeout; last mark step 7)";
        assert_eq!(c.attempt, a);
        assert_eq!(
            c.before,
            vec![
                Action::Journal(vec![Entry::CancelRequested {
                    attempt_id: id.clone(),
                    reason: reason.into(),
                    last_heartbeat_ms: Some(4_000),
                }]),
                Action::Emit(ControllerEvent::AttemptStuck {
                    attempt_id: id.clone(),
                    reason: reason.into(),
                }),
            ]
        );
        assert_eq!(c.ended.state, JobState::Cancelled { by_uid: None });
        assert_eq!(c.ended.reason.as_deref(), Some(reason));
        assert_eq!(c.ended.nodes.as_deref(), Some("n[1-2]"));
        let v = hung_verdict(&Evidence::default(), Duration::from_secs(120), Some(7));
        assert_eq!(v.class, Some(FailureClass::Hung), "{}", v.detail);
    }

    #[test]
    fn a_stuck_pending_job_is_cancelled_naming_its_reason() {
        let (_, s, live) = four_live();
        let settings = Settings::defaults();
        let (c, msg) = stuck_cancel(&s, &settings, live[2], "JobHeldAdmin");
        assert_eq!(msg, "pending with reason JobHeldAdmin for longer than 600s");
        assert_eq!(
            c.before,
            vec![Action::Journal(vec![Entry::CancelRequested {
                attempt_id: s.attempts[live[2]].id.clone(),
                reason: msg.clone(),
                last_heartbeat_ms: None,
            }])]
        );
        assert_eq!(c.ended.reason, Some(msg));
    }

    #[test]
    fn poll_errors_back_off_and_are_reported_first_then_every_tenth() {
        let s = Settings::defaults(); // poll 0.5 s .. 30 s
        let (d, ev) = poll_failed(&s, 1, "down".into());
        assert_eq!(d, Duration::from_millis(750));
        assert_eq!(
            ev,
            Some(ControllerEvent::SchedulerUnreachable {
                error: "down".into(),
                consecutive: 1,
                retry_in: d,
            })
        );
        assert_eq!(poll_failed(&s, 2, "down".into()).1, None);
        assert!(poll_failed(&s, 11, "down".into()).1.is_some());
        assert_eq!(
            poll_failed(&s, 40, "down".into()).0,
            Duration::from_secs(30)
        );
    }

    /// Stage `a` of 2 shards with an aggregate step, then `b` after it.
    fn sharded_then_b() -> CampaignPlan {
        plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 2, "command": ["w"],
             "aggregate": true},
            {"id": "b", "needs": ["a"], "command": ["w"]},
        ]))
    }

    #[test]
    fn an_intent_without_a_handle_is_adopted_or_given_up_after_the_grace() {
        let p = one_stage(serde_json::json!({}));
        let id = AttemptId::sanitize("n.a.0.a1");
        let s = state_after(
            &p,
            &[Entry::Intent {
                unit: "a/0".into(),
                attempt: 1,
                attempt_id: id.clone(),
                resume: false,
                more_resources: false,
            }],
        ); // journaled at 1 000 ms
        let a = s.attempt_index[&id];
        let settings = Settings::defaults(); // grace 30 s
        let h = JobHandle::new("mock", id.clone(), "7", 900);
        assert_eq!(
            found_entry(&s, &settings, 2_000, a, Some(h.clone())),
            Some(Entry::Submitted {
                attempt_id: id.clone(),
                handle: h,
                adopted: true,
            })
        );
        assert_eq!(found_entry(&s, &settings, 30_999, a, None), None);
        assert_eq!(
            found_entry(&s, &settings, 31_000, a, None),
            Some(Entry::SubmitFailed {
                attempt_id: id,
                error: "no job found for the intent after the adoption grace (the submit never happened)".into(),
            })
        );
    }

    #[test]
    fn ready_units_follow_the_dag_backoffs_failures_and_budgets() {
        let p = sharded_then_b();
        let mut settings = Settings::defaults();
        let s = state_after(&p, &[]);
        let key = |s: &State, u: &[usize]| -> Vec<String> {
            u.iter().map(|&u| s.units[u].key.clone()).collect()
        };
        // b waits for a; a's aggregate for its shards.
        assert_eq!(key(&s, &ready_units(&s, &settings, 0)), ["a/0", "a/1"]);
        settings.max_live = Some(1);
        assert_eq!(key(&s, &ready_units(&s, &settings, 0)), ["a/0"]);
        settings.max_live = None;
        settings.submit_batch = 0;
        assert!(ready_units(&s, &settings, 0).is_empty());
        settings.submit_batch = 1000;
        // Both shards done: the aggregate step, not b.
        let done = |u: &str, n: &str| {
            let id = AttemptId::sanitize(n);
            vec![
                Entry::Intent {
                    unit: u.into(),
                    attempt: 1,
                    attempt_id: id.clone(),
                    resume: false,
                    more_resources: false,
                },
                Entry::Decided {
                    unit: u.into(),
                    decision: Decision::Done,
                    not_before_ms: 0,
                },
            ]
        };
        let mut e = done("a/0", "n.a.0.a1");
        e.extend(done("a/1", "n.a.1.a1"));
        let s2 = state_after(&p, &e);
        assert_eq!(key(&s2, &ready_units(&s2, &settings, 0)), ["a/agg"]);
        // A retry waits for its backoff.
        let mut e = done("a/0", "n.a.0.a1");
        e.push(Entry::Decided {
            unit: "a/0".into(),
            decision: Decision::Retry {
                delay: Duration::from_secs(5),
                resume: false,
                more_resources: false,
            },
            not_before_ms: 6_000,
        });
        let s3 = state_after(&p, &e);
        assert_eq!(key(&s3, &ready_units(&s3, &settings, 5_999)), ["a/1"]);
        assert_eq!(
            key(&s3, &ready_units(&s3, &settings, 6_000)),
            ["a/0", "a/1"]
        );
        // A failed unit: its stage starts nothing more.
        let mut e = done("a/0", "n.a.0.a1");
        e.push(Entry::Decided {
            unit: "a/0".into(),
            decision: Decision::Fail { reason: "x".into() },
            not_before_ms: 0,
        });
        let s4 = state_after(&p, &e);
        assert!(ready_units(&s4, &settings, 0).is_empty());
    }

    #[test]
    fn a_retry_starts_as_the_next_attempt_avoiding_excluded_nodes() {
        let p = one_stage(serde_json::json!({}));
        let (mut s, a) = live(&p, "a/0", &[]);
        let fresh = state_after(&p, &[]);
        let st = start(&fresh, &p, Path::new("/c"), 0).unwrap();
        assert_eq!(st.previous, None);
        let Entry::Intent {
            attempt,
            attempt_id,
            ..
        } = &st.intent
        else {
            panic!("{:?}", st.intent);
        };
        assert_eq!(*attempt, 1);
        assert_eq!(&st.spec.attempt_id, attempt_id);
        // After attempt 1 failed on n3 (fail fast) with h9 excluded by the campaign.
        let id = s.attempts[a].id.clone();
        for e in [
            Entry::Finished {
                attempt_id: id.clone(),
                state: JobState::NodeFail,
                exit_code: None,
                class: Some(FailureClass::Transient),
                detail: "x".into(),
                log_path: None,
                nodes: Some("n3".into()),
                fail_fast: true,
                oom: None,
            },
            Entry::Decided {
                unit: "a/0".into(),
                decision: Decision::Retry {
                    delay: Duration::ZERO,
                    resume: true,
                    more_resources: false,
                },
                not_before_ms: 0,
            },
            Entry::NodeExcluded {
                node: "h9".into(),
                reason: "host key".into(),
            },
        ] {
            s.apply(&e, &p, 2_000).unwrap();
        }
        let st = start(&s, &p, Path::new("/c"), 0).unwrap();
        assert_eq!(st.previous, Some(attempt_id_for(&s, 0, 1)));
        assert_eq!(st.spec.attempt_id, attempt_id_for(&s, 0, 2));
        assert!(st.spec.attempt_id.as_str().ends_with(".a.0.a2"));
        let Entry::Intent {
            attempt, resume, ..
        } = &st.intent
        else {
            panic!("{:?}", st.intent);
        };
        assert_eq!((*attempt, *resume), (2, true));
        assert!(
            st.spec
                .scheduler
                .extra_directives
                .contains(&"--exclude=h9,n3".to_string()),
            "{:?}",
            st.spec.scheduler.extra_directives
        );
    }

    #[test]
    fn failed_submits_are_retried_after_the_backoff_refused_hosts_at_once_fatal_never() {
        let p = sharded_then_b();
        let mut entries = Vec::new();
        let ids: Vec<AttemptId> = (0..2)
            .map(|i| AttemptId::sanitize(&format!("n.a.{i}.a1")))
            .collect();
        for (i, id) in ids.iter().enumerate() {
            entries.push(Entry::Intent {
                unit: format!("a/{i}"),
                attempt: 1,
                attempt_id: id.clone(),
                resume: false,
                more_resources: false,
            });
        }
        let s = state_after(&p, &entries);
        let settings = Settings::defaults();
        let results = vec![
            Entry::SubmitFailed {
                attempt_id: ids[0].clone(),
                error: "fatal: invalid account".into(),
            },
            Entry::SubmitFailed {
                attempt_id: ids[1].clone(),
                error: "scheduler down".into(),
            },
        ];
        let delay = settings.retry.delay(1, ids[1].as_str());
        let retry = Decision::Retry {
            delay,
            resume: false,
            more_resources: false,
        };
        assert_eq!(
            after_submits(&s, &settings, 1_000, &results, &HashSet::new()),
            vec![
                Entry::Decided {
                    unit: "a/0".into(),
                    decision: Decision::Fail {
                        reason: "config: fatal: invalid account".into()
                    },
                    not_before_ms: 0,
                },
                Entry::Decided {
                    unit: "a/1".into(),
                    decision: retry.clone(),
                    not_before_ms: 1_000 + delay.as_millis() as u64,
                },
            ]
        );
        let refused = HashSet::from([ids[1].clone()]);
        assert_eq!(
            after_submits(&s, &settings, 1_000, &results[1..], &refused),
            vec![Entry::Decided {
                unit: "a/1".into(),
                decision: retry,
                not_before_ms: 1_000,
            }]
        );
        // A refused host key: the host is excluded once, never twice.
        let e = ExecutorError::HostKeyRefused {
            host: "h2".into(),
            problem: "changed".into(),
        };
        assert_eq!(refused_host(&s, &e), Some("h2".into()));
        let mut s2 = state_after(&p, &entries);
        s2.apply(
            &Entry::NodeExcluded {
                node: "h2".into(),
                reason: "x".into(),
            },
            &p,
            0,
        )
        .unwrap();
        assert_eq!(refused_host(&s2, &e), None);
        assert!(!maybe_created(&e));
        assert!(maybe_created(&ExecutorError::SubmitUnknown {
            attempt_id: ids[0].clone(),
            tries: 3,
            message: "timeout".into(),
        }));
    }

    #[test]
    fn pool_queues_are_filled_once_before_their_first_worker() {
        let p = plan(serde_json::json!([
            {"id": "w", "strategy": "persistent_pool", "instances": 3, "command": ["w"]},
        ]));
        let s = state_after(&p, &[]);
        let picks = ready_units(&s, &Settings::defaults(), 0);
        assert_eq!(picks.len(), 3);
        assert_eq!(pool_fills(&s, &picks), vec![0]);
        let s = state_after(
            &p,
            &[Entry::PoolFilled {
                stage: "w".into(),
                items: 5,
            }],
        );
        assert_eq!(pool_fills(&s, &picks), Vec::<usize>::new());
    }

    fn decided(unit: &str, n: &str, decision: Decision) -> Vec<Entry> {
        let id = AttemptId::sanitize(n);
        vec![
            Entry::Intent {
                unit: unit.into(),
                attempt: 1,
                attempt_id: id.clone(),
                resume: false,
                more_resources: false,
            },
            Entry::Submitted {
                attempt_id: id.clone(),
                handle: JobHandle::new("mock", id.clone(), "1", 0),
                adopted: false,
            },
            Entry::Finished {
                attempt_id: id,
                state: JobState::Completed,
                exit_code: Some(0),
                class: None,
                detail: String::new(),
                log_path: None,
                nodes: None,
                fail_fast: false,
                oom: None,
            },
            Entry::Decided {
                unit: unit.into(),
                decision,
                not_before_ms: 0,
            },
        ]
    }

    #[test]
    fn a_stage_is_done_once_its_items_aggregate_and_parents_are() {
        let p = sharded_then_b();
        let s = state_after(&p, &decided("a/0", "n.a.0.a1", Decision::Done));
        assert_eq!(stage_transition(&s, &p, 0), Transition::Stay);
        let mut e = decided("a/0", "n.a.0.a1", Decision::Done);
        e.extend(decided("a/1", "n.a.1.a1", Decision::Done));
        let s = state_after(&p, &e);
        assert_eq!(stage_transition(&s, &p, 0), Transition::Stay, "aggregate");
        e.extend(decided("a/agg", "n.a.agg.a1", Decision::Done));
        let s = state_after(&p, &e);
        assert_eq!(
            stage_transition(&s, &p, 0),
            Transition::Done(vec![
                Action::Journal(vec![Entry::StageDone { stage: "a".into() }]),
                Action::Notify(ControllerEvent::StageDone { stage: "a".into() }),
            ])
        );
        assert_eq!(stage_transition(&s, &p, 1), Transition::Stay, "b not run");
        assert!(!finished(&s, false), "b can still run");
    }

    #[test]
    fn a_failed_unit_fails_its_stage_after_draining_or_at_once_under_fail_fast() {
        let mut p = sharded_then_b();
        let fail = Decision::Fail {
            reason: "oom".into(),
        };
        // a/0 failed while a/1 still runs.
        let e = decided("a/0", "n.a.0.a1", fail);
        let (s, _) = live(&p, "a/1", &e);
        assert_eq!(stage_transition(&s, &p, 0), Transition::Stay, "drain");
        p.execution_defaults.halt_policy = HaltPolicy::FailFast;
        let reason = "unit a/0 failed: oom";
        assert_eq!(
            stage_transition(&s, &p, 0),
            Transition::Failed {
                actions: vec![
                    Action::Journal(vec![Entry::StageFailed {
                        stage: "a".into(),
                        reason: reason.into(),
                    }]),
                    Action::Notify(ControllerEvent::StageFailed {
                        stage: "a".into(),
                        reason: reason.into(),
                    }),
                ],
                halt: true,
            }
        );
        // Under drain once nothing of it is live: failed, no halt; then b is blocked and
        // nothing is left to run.
        p.execution_defaults.halt_policy = HaltPolicy::Drain;
        let s = state_after(&p, &e);
        assert!(matches!(
            stage_transition(&s, &p, 0),
            Transition::Failed { halt: false, .. }
        ));
        let mut e2 = e.clone();
        e2.push(Entry::StageFailed {
            stage: "a".into(),
            reason: reason.into(),
        });
        let s = state_after(&p, &e2);
        assert!(finished(&s, false));
    }

    #[test]
    fn pool_and_decision_stages_are_not_ended_by_their_units() {
        let p = plan(serde_json::json!([
            {"id": "w", "strategy": "persistent_pool", "instances": 2, "command": ["w"]},
        ]));
        let s = state_after(&p, &[]);
        assert_eq!(stage_transition(&s, &p, 0), Transition::Pool);
        let p = decision_plan();
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        assert_eq!(stage_transition(&s, &p, si(&s, "pick")), Transition::Stay);
    }
}
