//! Retrying failed units (`shutdown::reset_failed`, `campaign retry`): which units go back
//! to pending and with what; the loop journals, tells, and resets the budgets.

use std::time::Duration;

use super::super::classify::FailureClass;
use super::super::driver::Settings;
use super::super::event::ControllerEvent;
use super::super::journal::Entry;
use super::super::policy::Decision;
use super::super::state::{State, UnitStatus};

/// The retry of failed units: what to journal, what to tell, and which units they are.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::campaign::controller) struct Retry {
    /// A `Decided` retry per unit, in plan order.
    pub entries: Vec<Entry>,
    /// The [`ControllerEvent::RetryFailed`] to tell (and journal after the entries).
    pub event: ControllerEvent,
    /// The units' keys: their budgets start again.
    pub units: Vec<String>,
}

/// The retry of every failed unit asked by `by`: a `Decided` retry entry per unit (at once,
/// from the start; with more resources for a unit that failed out of memory in a stage now
/// allowed them) and the [`ControllerEvent::RetryFailed`] to tell; `None` when no unit failed.
pub(in crate::campaign::controller) fn retry_failed(
    state: &State,
    settings: &Settings,
    by: &str,
) -> Option<Retry> {
    let failed: Vec<(String, bool)> = state
        .units
        .iter()
        .filter(|u| u.status == UnitStatus::Failed)
        .map(|u| {
            let stage = &state.stages[u.stage].id;
            let more =
                u.last_class == Some(FailureClass::Oom) && settings.oom_retry.contains(stage);
            (u.key.clone(), more)
        })
        .collect();
    if failed.is_empty() {
        return None;
    }
    let entries = failed
        .iter()
        .map(|(k, more)| Entry::Decided {
            unit: k.clone(),
            decision: Decision::Retry {
                delay: Duration::ZERO,
                resume: false,
                more_resources: *more,
            },
            not_before_ms: 0,
        })
        .collect();
    let ev = ControllerEvent::RetryFailed {
        units: failed.iter().map(|(k, _)| k.clone()).collect(),
        by: by.to_string(),
        more_resources: failed
            .iter()
            .filter(|(_, m)| *m)
            .map(|(k, _)| k.clone())
            .collect(),
    };
    Some(Retry {
        entries,
        event: ev,
        units: failed.into_iter().map(|(k, _)| k).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn failed_units_are_retried_at_once_with_more_resources_after_an_allowed_oom() {
        let p = plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 3, "command": ["w"]},
        ]));
        let mut s = state_after(&p, &[]);
        let mut settings = Settings::defaults();
        assert_eq!(retry_failed(&s, &settings, "me"), None);
        let keys: Vec<String> = s.units.iter().map(|u| u.key.clone()).collect();
        s.units[0].status = UnitStatus::Failed;
        s.units[0].last_class = Some(FailureClass::Oom);
        s.units[2].status = UnitStatus::Failed;
        s.units[2].last_class = Some(FailureClass::Application);
        settings.oom_retry.insert("a".into());
        let retry = |k: &str, more: bool| Entry::Decided {
            unit: k.into(),
            decision: Decision::Retry {
                delay: Duration::ZERO,
                resume: false,
                more_resources: more,
            },
            not_before_ms: 0,
        };
        assert_eq!(
            retry_failed(&s, &settings, "me"),
            Some(Retry {
                entries: vec![retry(&keys[0], true), retry(&keys[2], false)],
                event: ControllerEvent::RetryFailed {
                    units: vec![keys[0].clone(), keys[2].clone()],
                    by: "me".into(),
                    more_resources: vec![keys[0].clone()],
                },
                units: vec![keys[0].clone(), keys[2].clone()],
            })
        );
        // Out of memory in a stage not allowed more resources: the same retry, no more.
        settings.oom_retry.clear();
        let r = retry_failed(&s, &settings, "me").unwrap();
        assert_eq!(r.entries[0], retry(&keys[0], false));
    }
}
