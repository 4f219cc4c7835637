//! Starting attempts (`submit`): the loop finds and submits, these pick and follow up.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;

use super::super::driver::Settings;
use super::super::error::ControllerError;
use super::super::journal::Entry;
use super::super::policy::Decision;
use super::super::spec::UnitSpec;
use super::super::state::{Phase, StageStatus, State, UnitStatus};
use crate::campaign::CampaignPlan;
use crate::executor::{AttemptId, AttemptSpec, ExecutorError, JobHandle};

/// What resolving an intent left without a handle (a crash between intent and handle) does
/// with `find`'s answer (`None`: no job has the attempt id): adopt the job, give the attempt
/// up once the adoption grace has passed since its intent, or wait.
pub(in crate::campaign::controller) fn found_entry(
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
pub(in crate::campaign::controller) fn ready_units(
    state: &State,
    settings: &Settings,
    now_ms: u64,
) -> Vec<usize> {
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
pub(in crate::campaign::controller) fn pool_fills(state: &State, picks: &[usize]) -> Vec<usize> {
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
pub(in crate::campaign::controller) fn attempt_id_for(
    state: &State,
    unit: usize,
    n: u32,
) -> AttemptId {
    let u = &state.units[unit];
    super::super::spec::attempt_id(
        &state.nonce,
        state.revision,
        &state.stages[u.stage].id,
        u.item,
        n,
    )
}

/// Nodes the next attempt of `unit` must avoid: every node the campaign excluded, and the
/// nodes of the unit's last attempt that failed fast.
pub(in crate::campaign::controller) fn nodes_to_avoid(
    state: &State,
    unit: usize,
) -> BTreeSet<String> {
    state
        .excluded_nodes
        .keys()
        .chain(state.units[unit].exclude.iter())
        .cloned()
        .collect()
}

/// The next attempt of a unit: its intent (journaled before the submit) and its spec.
#[derive(Clone, Debug)]
pub(in crate::campaign::controller) struct Start {
    /// The unit's previous attempt, whose outputs are moved aside first.
    pub previous: Option<AttemptId>,
    /// The `Intent` entry.
    pub intent: Entry,
    /// What is submitted.
    pub spec: AttemptSpec,
}

/// The next attempt of `unit`: the retry's resume and more-resources flags as decided, the
/// nodes to avoid excluded.
pub(in crate::campaign::controller) fn start(
    state: &State,
    plan: &CampaignPlan,
    dir: &Path,
    unit: usize,
) -> Result<Start, ControllerError> {
    let u = &state.units[unit];
    let n = u.attempts.len() as u32 + 1;
    let id = attempt_id_for(state, unit, n);
    let st = &plan.stages[u.stage];
    let mut spec = super::super::spec::attempt_spec(&UnitSpec {
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
    super::super::nodes::add_exclude(
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
pub(in crate::campaign::controller) fn refused_host(
    state: &State,
    e: &ExecutorError,
) -> Option<String> {
    e.refused_host_key()
        .filter(|h| !state.excluded_nodes.contains_key(*h))
        .map(str::to_string)
}

/// Whether a failed submit may still have created the job (`find` is asked before deciding).
pub(in crate::campaign::controller) fn maybe_created(e: &ExecutorError) -> bool {
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
pub(in crate::campaign::controller) fn after_submits(
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

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;
    use std::time::Duration;

    use super::super::super::classify::FailureClass;
    use crate::executor::JobState;

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
            entries.push(intent(&format!("a/{i}"), id));
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
}
