//! Persistent-pool stages (`finalise::advance_pool`): which ended workers give their claimed
//! items back, and what the queue's counts say the stage does next.

use std::path::Path;
use std::time::Duration;

use super::super::event::ControllerEvent;
use super::super::journal::Entry;
use super::super::policy::Decision;
use super::super::pool::QueueCounts;
use super::super::state::{Phase, State, UnitStatus};
use super::{Action, stage_done, stage_failed};
use crate::executor::AttemptId;

/// The finished attempts of pool stage `si` whose unit is no longer live: the workers whose
/// claimed items go back to the queue (the loop asks the queue; a worker with none is a no-op).
pub(in crate::campaign::controller) fn ended_workers(state: &State, si: usize) -> Vec<AttemptId> {
    state.stages[si]
        .units
        .iter()
        .map(|&u| &state.units[u])
        .filter(|unit| unit.status != UnitStatus::Live)
        .flat_map(|unit| unit.attempts.iter().map(|&a| &state.attempts[a]))
        .filter(|at| at.phase == Phase::Finished)
        .map(|at| at.id.clone())
        .collect()
}

/// What the queue gave back for the ended `workers` (`(requeued, failed for good)` each):
/// one event per worker that had items, told and then journaled in one append.
pub(in crate::campaign::controller) fn requeued(
    workers: &[(AttemptId, usize, usize)],
) -> Vec<Action> {
    let events: Vec<ControllerEvent> = workers
        .iter()
        .filter(|(_, r, f)| r + f > 0)
        .map(|(worker, r, f)| ControllerEvent::Requeued {
            worker: worker.clone(),
            requeued: *r,
            failed: *f,
        })
        .collect();
    if events.is_empty() {
        return Vec::new();
    }
    let entries = events.iter().map(Entry::from_event).collect();
    let mut actions: Vec<Action> = events.into_iter().map(Action::Notify).collect();
    actions.push(Action::Journal(entries));
    actions
}

/// Where a pool stage goes next.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::campaign::controller) enum PoolStep {
    /// Workers are running (or exiting after the last item): nothing to do.
    Wait,
    /// Every item is done or failed and no worker is live: the stage ends (done, or failed
    /// when any item failed for good).
    Ended(Vec<Action>),
    /// Items are left and no worker is live: the workers start again, or, after more restarts
    /// in a row without an item done than `max_requeues + 1`, the stage fails.
    Restart(Vec<Action>),
}

/// Where pool stage `si` goes, given its queue's `counts` (the queue in `queue_dir`, named in
/// a failure) and `restarts`: the loop's count of restarts in a row, as `(count, items done
/// when it was last counted)`, `None` before the first. Returns the step and the count to
/// keep, which changes only when the workers are restarted (a restart after an item was done
/// counts from 1 again).
pub(in crate::campaign::controller) fn pool_step(
    state: &State,
    si: usize,
    counts: &QueueCounts,
    queue_dir: &Path,
    restarts: Option<(u32, usize)>,
    max_requeues: u32,
) -> (PoolStep, Option<(u32, usize)>) {
    let s = &state.stages[si];
    let c = counts;
    let any_live = s
        .units
        .iter()
        .any(|&u| state.units[u].status == UnitStatus::Live);
    if c.pending + c.claimed == 0 {
        if any_live {
            return (PoolStep::Wait, restarts); // workers are exiting
        }
        let actions = if c.failed > 0 {
            let reason = format!(
                "{} of {} pool items failed (see {}/failed)",
                c.failed,
                c.failed + c.done,
                queue_dir.display()
            );
            stage_failed(&s.id, reason)
        } else {
            stage_done(&s.id)
        };
        return (PoolStep::Ended(actions), restarts);
    }
    if any_live {
        return (PoolStep::Wait, restarts);
    }
    // Items left and no worker: start workers again (not a failure of theirs).
    let reopen: Vec<Entry> = s
        .units
        .iter()
        .filter(|&&u| state.units[u].status == UnitStatus::Done)
        .map(|&u| Entry::Decided {
            unit: state.units[u].key.clone(),
            decision: Decision::Retry {
                delay: Duration::ZERO,
                resume: false,
                more_resources: false,
            },
            not_before_ms: 0,
        })
        .collect();
    let counted = match restarts {
        Some((n, done)) if done == c.done => (n + 1, done),
        _ => (1, c.done),
    };
    let left = c.pending + c.claimed;
    if counted.0 > max_requeues + 1 {
        let reason = format!(
            "workers were restarted {} times and exited without finishing any of the {left} items left",
            counted.0 - 1,
        );
        let actions = stage_failed(&s.id, reason);
        return (PoolStep::Restart(actions), Some(counted));
    }
    if reopen.is_empty() {
        return (PoolStep::Wait, Some(counted));
    }
    let workers = reopen.len();
    let actions = vec![
        Action::Journal(reopen),
        Action::Emit(ControllerEvent::PoolRestarted {
            stage: s.id.clone(),
            items_left: left,
            workers,
        }),
    ];
    (PoolStep::Restart(actions), Some(counted))
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{decided, live, plan, state_after};
    use super::*;
    use crate::campaign::CampaignPlan;

    fn pool_plan() -> CampaignPlan {
        plan(serde_json::json!([
            {"id": "w", "strategy": "persistent_pool", "instances": 2, "command": ["w"]},
        ]))
    }

    fn counts(pending: usize, claimed: usize, done: usize, failed: usize) -> QueueCounts {
        QueueCounts {
            pending,
            claimed,
            done,
            failed,
        }
    }

    fn filled() -> Entry {
        Entry::PoolFilled {
            stage: "w".into(),
            items: 10,
        }
    }

    /// Both workers ended (done); `w/1` also had an earlier attempt.
    fn both_ended() -> Vec<Entry> {
        let mut e = vec![filled()];
        e.extend(decided("w/0", "n.w.0.a1", Decision::Done));
        e.extend(decided("w/1", "n.w.1.a1", Decision::Done));
        e
    }

    #[test]
    fn ended_workers_are_the_finished_attempts_of_units_no_longer_live() {
        let p = pool_plan();
        let s = state_after(&p, &both_ended());
        let ids: Vec<String> = ended_workers(&s, 0)
            .iter()
            .map(|a| a.as_str().to_string())
            .collect();
        assert_eq!(ids, vec!["n.w.0.a1", "n.w.1.a1"]);
        // w/1 live again: only w/0's worker gives items back.
        let mut e = vec![filled()];
        e.extend(decided("w/0", "n.w.0.a1", Decision::Done));
        let (s, _) = live(&p, "w/1", &e);
        let ids: Vec<String> = ended_workers(&s, 0)
            .iter()
            .map(|a| a.as_str().to_string())
            .collect();
        assert_eq!(ids, vec!["n.w.0.a1"]);
    }

    #[test]
    fn requeues_are_told_then_journaled_once_and_empty_ones_are_dropped() {
        let a = AttemptId::new("n.w.0.a1").unwrap();
        let b = AttemptId::new("n.w.1.a1").unwrap();
        assert!(requeued(&[(a.clone(), 0, 0)]).is_empty());
        let acts = requeued(&[(a.clone(), 2, 1), (b, 0, 0)]);
        let ev = ControllerEvent::Requeued {
            worker: a,
            requeued: 2,
            failed: 1,
        };
        assert_eq!(
            acts,
            vec![
                Action::Notify(ev.clone()),
                Action::Journal(vec![Entry::from_event(&ev)])
            ]
        );
    }

    #[test]
    fn a_drained_queue_ends_the_stage_once_no_worker_is_live() {
        let p = pool_plan();
        let dir = Path::new("/c/queue/w");
        // A worker still live (exiting after the last item): wait.
        let mut e = vec![filled()];
        e.extend(decided("w/0", "n.w.0.a1", Decision::Done));
        let (s, _) = live(&p, "w/1", &e);
        assert_eq!(
            pool_step(&s, 0, &counts(0, 0, 10, 0), dir, None, 3),
            (PoolStep::Wait, None)
        );
        let s = state_after(&p, &both_ended());
        let (step, kept) = pool_step(&s, 0, &counts(0, 0, 10, 0), dir, Some((2, 4)), 3);
        assert_eq!(kept, Some((2, 4)), "an end does not count a restart");
        assert_eq!(step, PoolStep::Ended(stage_done("w")));
        let reason = "2 of 10 pool items failed (see /c/queue/w/failed)";
        assert_eq!(
            pool_step(&s, 0, &counts(0, 0, 8, 2), dir, None, 3).0,
            PoolStep::Ended(stage_failed("w", reason.to_string()))
        );
    }

    #[test]
    fn items_left_without_workers_restart_them_until_restarts_stop_helping() {
        let p = pool_plan();
        let dir = Path::new("/c/queue/w");
        let s = state_after(&p, &both_ended());
        let retry = |u: &str| Entry::Decided {
            unit: u.into(),
            decision: Decision::Retry {
                delay: Duration::ZERO,
                resume: false,
                more_resources: false,
            },
            not_before_ms: 0,
        };
        let restart = PoolStep::Restart(vec![
            Action::Journal(vec![retry("w/0"), retry("w/1")]),
            Action::Emit(ControllerEvent::PoolRestarted {
                stage: "w".into(),
                items_left: 3,
                workers: 2,
            }),
        ]);
        // First restart, then a second with no item done since: counted 1, 2.
        let c = counts(2, 1, 7, 0);
        let (step, kept) = pool_step(&s, 0, &c, dir, None, 1);
        assert_eq!((step, kept), (restart.clone(), Some((1, 7))));
        let (step, kept) = pool_step(&s, 0, &c, dir, kept, 1);
        assert_eq!((step, kept), (restart.clone(), Some((2, 7))));
        // An item done since: counted from 1 again.
        let (_, kept2) = pool_step(&s, 0, &counts(1, 1, 8, 0), dir, kept, 1);
        assert_eq!(kept2, Some((1, 8)));
        // A third in a row (max_requeues 1 allows 2): the stage fails.
        let reason =
            "workers were restarted 2 times and exited without finishing any of the 3 items left";
        let (step, kept) = pool_step(&s, 0, &c, dir, kept, 1);
        assert_eq!(kept, Some((3, 7)));
        assert_eq!(
            step,
            PoolStep::Restart(stage_failed("w", reason.to_string()))
        );
    }
}
