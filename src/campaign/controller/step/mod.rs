//! The controller's decisions as pure functions: each takes the state, the plan, the
//! settings it needs, `now_ms` and what the loop read or was told (a decision file, the
//! evidence of an ended attempt, the statuses of a poll, the results of finds and submits),
//! and returns what to do: [`Action`]s or journal entries. None of them touches the
//! executor, the filesystem, the clock or the journal; the loop (`driver` and the area
//! files) reads, performs and journals, so every decision can be tested by feeding it
//! scripted inputs. One file per area: `decide` (manual decision stages), `finish` (an
//! ended attempt), `poll` (polled statuses), `pool` (persistent-pool queues), `submit` (starting attempts), `stage` (stage
//! transitions and the end of a run), `nodes` (exclusions), `retry` (retrying failed units), `shutdown` (cancel
//! requests); each keeps its unit tests.

mod decide;
mod finish;
mod nodes;
mod poll;
mod pool;
mod retry;
mod shutdown;
mod stage;
mod submit;

pub(super) use decide::*;
pub(super) use finish::*;
pub(super) use nodes::*;
pub(super) use poll::*;
pub(super) use pool::*;
pub(super) use retry::*;
pub(super) use shutdown::*;
pub(super) use stage::*;
pub(super) use submit::*;

use std::path::PathBuf;

use super::event::ControllerEvent;
use super::journal::Entry;

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

/// A stage failed for `reason`: journaled, then told.
pub(super) fn stage_failed(stage: &str, reason: String) -> Vec<Action> {
    vec![
        Action::Journal(vec![Entry::StageFailed {
            stage: stage.to_string(),
            reason: reason.clone(),
        }]),
        Action::Notify(ControllerEvent::StageFailed {
            stage: stage.to_string(),
            reason,
        }),
    ]
}

/// A stage is done: journaled, then told.
pub(super) fn stage_done(stage: &str) -> Vec<Action> {
    vec![
        Action::Journal(vec![Entry::StageDone {
            stage: stage.to_string(),
        }]),
        Action::Notify(ControllerEvent::StageDone {
            stage: stage.to_string(),
        }),
    ]
}

/// Plans and states shared by the unit tests of the step modules.
#[cfg(test)]
mod test_util {
    use super::super::journal::Entry;
    use super::super::policy::Decision;
    use super::super::state::State;
    use crate::campaign::CampaignPlan;
    use crate::campaign::config::Value as ConfigValue;
    use crate::campaign::{ExecutionConfig, ManualDecision, RunnerEnvironment, StageCatalog};
    use crate::executor::{AttemptId, JobState};

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
    pub(super) fn decision_plan() -> CampaignPlan {
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

    pub(super) fn si(state: &State, id: &str) -> usize {
        state.stage_index(id).unwrap()
    }

    /// The journaled intent of `unit`'s attempt 1, `id`.
    pub(super) fn intent(unit: &str, id: &AttemptId) -> Entry {
        Entry::Intent {
            unit: unit.into(),
            attempt: 1,
            attempt_id: id.clone(),
            resume: false,
            more_resources: false,
        }
    }

    /// `id` submitted as the mock executor's job `job`.
    pub(super) fn submitted(id: &AttemptId, job: &str) -> Entry {
        Entry::Submitted {
            attempt_id: id.clone(),
            handle: crate::executor::JobHandle::new("mock", id.clone(), job, 0),
            adopted: false,
        }
    }

    /// `unit`'s attempt 1 journaled and submitted: the state and the attempt's index.
    pub(super) fn live(plan: &CampaignPlan, unit: &str, before: &[Entry]) -> (State, usize) {
        let id = AttemptId::sanitize(&format!("n.{}.a1", unit.replace('/', ".")));
        let mut entries = before.to_vec();
        entries.push(intent(unit, &id));
        entries.push(submitted(&id, "1"));
        let s = state_after(plan, &entries);
        let a = s.attempt_index[&id];
        (s, a)
    }

    pub(super) fn one_stage(extra: serde_json::Value) -> CampaignPlan {
        let mut st = serde_json::json!({"id": "a", "command": ["w"]});
        if let (Some(o), Some(e)) = (st.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        plan(serde_json::json!([st]))
    }

    /// Stage `a` of 2 shards with an aggregate step, then `b` after it.
    pub(super) fn sharded_then_b() -> CampaignPlan {
        plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 2, "command": ["w"],
             "aggregate": true},
            {"id": "b", "needs": ["a"], "command": ["w"]},
        ]))
    }

    /// `unit`'s attempt `n` submitted, completed (exit 0) and decided `decision`.
    pub(super) fn decided(unit: &str, n: &str, decision: Decision) -> Vec<Entry> {
        let id = AttemptId::sanitize(n);
        vec![
            intent(unit, &id),
            submitted(&id, "1"),
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
}
