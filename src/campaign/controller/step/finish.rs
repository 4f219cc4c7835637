//! An attempt that ended (`finalise`): the loop reads the evidence, these judge it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::super::classify::{Evidence, FailureClass, OomKind, classify};
use super::super::driver::{Settings, describe};
use super::super::event::ControllerEvent;
use super::super::journal::Entry;
use super::super::policy::{Decision, UnitHistory, decide};
use super::super::state::State;
use crate::campaign::CampaignPlan;
use crate::executor::{AttemptId, JobStatus};

/// The verdict on an attempt that ended.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::campaign::controller) struct Verdict {
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
pub(in crate::campaign::controller) fn forced_verdict(
    class: FailureClass,
    detail: String,
) -> Verdict {
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
pub(in crate::campaign::controller) struct Looked {
    /// The path, as shown.
    pub path: String,
    /// Found.
    pub visible: bool,
    /// Found only by `readdir`/`open`, not by `stat`.
    pub late: bool,
}

/// What the files a completed attempt must leave say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::campaign::controller) enum Visibility {
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
pub(in crate::campaign::controller) fn visibility(
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
pub(in crate::campaign::controller) fn end_nodes(st: &JobStatus) -> Option<String> {
    st.nodes
        .clone()
        .filter(|n| !crate::executor::expand_hostlist(n).is_empty())
}

/// The job log of attempt `id`: the executor's, else `logs/<id>.log` in the campaign folder.
pub(in crate::campaign::controller) fn log_path(
    dir: &Path,
    st: &JobStatus,
    id: &AttemptId,
) -> PathBuf {
    st.log_path
        .clone()
        .unwrap_or_else(|| dir.join("logs").join(format!("{id}.log")))
}

/// The verdict on attempt `a` from the evidence the loop read (`ev`; its run time and the
/// fast-failure window are filled in here) and the lines about outputs found late.
pub(in crate::campaign::controller) fn classified_verdict(
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
    let fail_fast =
        end_nodes(st).is_some() && super::super::nodes::fails_fast(&st.state, c.class, &ev);
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
pub(in crate::campaign::controller) fn history(
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
pub(in crate::campaign::controller) struct Ended {
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
pub(in crate::campaign::controller) fn finish(
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

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use crate::executor::JobState;

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
}
