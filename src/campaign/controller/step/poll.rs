//! A poll (`poll`): the loop polls and cancels, these say what the statuses mean.

use std::time::Duration;

use super::super::classify::{
    Evidence, FailureClass, PendingVerdict, classify_hung, pending_verdict,
};
use super::super::driver::Settings;
use super::super::event::ControllerEvent;
use super::super::journal::Entry;
use super::super::state::{Beat, State};
use super::{Action, Verdict, forced_verdict};
use crate::campaign::CampaignPlan;
use crate::executor::{JobState, JobStatus};

/// What to do with one batch of polled statuses.
#[derive(Clone, Debug, Default, PartialEq)]
pub(in crate::campaign::controller) struct PollPlan {
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
pub(in crate::campaign::controller) enum Mark {
    /// Not running (suspended, requeued, pending again): its heartbeat counts from the next
    /// time it runs.
    ClearBeat(usize),
    /// Pending with a reason that does not free up, since (controller clock, ms); `None`: not.
    PendingSince(usize, Option<u64>),
}

/// The heartbeat timeout of stage `si`: the builder's, else the plan's.
pub(in crate::campaign::controller) fn heartbeat_timeout(
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
pub(in crate::campaign::controller) fn poll_plan(
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
pub(in crate::campaign::controller) fn beat_due(
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
pub(in crate::campaign::controller) fn heartbeat(
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
pub(in crate::campaign::controller) struct Cancel {
    /// The attempt.
    pub attempt: usize,
    /// Journaled and told before the cancel (the cancel request first).
    pub before: Vec<Action>,
    /// The status it ends with.
    pub ended: JobStatus,
}

/// The cancel of pending attempt `a`, stuck with `reason` for longer than `stuck_after`; it
/// ends with `class` and the returned detail.
pub(in crate::campaign::controller) fn stuck_cancel(
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
pub(in crate::campaign::controller) fn hung_cancel(
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
pub(in crate::campaign::controller) fn hung_verdict(
    ev: &Evidence,
    silent: Duration,
    last_step: Option<u64>,
) -> Verdict {
    let c = classify_hung(ev, silent, last_step);
    forced_verdict(c.class.unwrap_or(FailureClass::Hung), c.detail)
}

/// After a poll that failed with a retryable error, the `n`th in a row: when the next try
/// comes, and the report (the first, then every tenth).
pub(in crate::campaign::controller) fn poll_failed(
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

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::executor::AttemptId;

    /// Stage `a` of 4 shards, every shard's attempt 1 live: the state and the attempts.
    fn four_live() -> (CampaignPlan, State, Vec<usize>) {
        let p = plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 4, "command": ["w"]},
        ]));
        let mut entries = Vec::new();
        for i in 0..4 {
            let id = AttemptId::sanitize(&format!("n.a.{i}.a1"));
            entries.push(intent(&format!("a/{i}"), &id));
            entries.push(submitted(&id, &i.to_string()));
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
}
