//! Stage transitions (`finalise::advance_stages`) and the end of a run.

use super::super::state::{StageStatus, State, UnitStatus};
use super::{Action, blocked, stage_done, stage_failed};
use crate::campaign::{CampaignPlan, HaltPolicy};

/// Where an open stage goes next.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::campaign::controller) enum Transition {
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
pub(in crate::campaign::controller) fn stage_transition(
    state: &State,
    plan: &CampaignPlan,
    si: usize,
) -> Transition {
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
            actions: stage_failed(&s.id, reason),
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
        return Transition::Done(stage_done(&s.id));
    }
    Transition::Stay
}

/// Whether a run has nothing left to do: nothing live, no intent to resolve, and no open
/// stage that can still run (or the campaign halted).
pub(in crate::campaign::controller) fn finished(state: &State, halted: bool) -> bool {
    let open = state
        .stages
        .iter()
        .any(|s| s.status == StageStatus::Open && !blocked(state, s));
    state.live == 0 && state.unresolved_intents().is_empty() && (!open || halted)
}

#[cfg(test)]
mod tests {
    use super::super::super::journal::Entry;
    use super::super::super::policy::Decision;
    use super::super::test_util::*;
    use super::*;

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
            Transition::Done(stage_done("a"))
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
                actions: stage_failed("a", reason.to_string()),
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
