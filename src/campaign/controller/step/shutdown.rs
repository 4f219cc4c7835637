//! Shutdown (`shutdown::cancel_all`): which live attempts get a cancel request; the loop
//! journals them before any executor cancel.

use super::super::journal::Entry;
use super::super::state::State;

/// A `CancelRequested` entry with `reason` for every live attempt whose cancel was not
/// requested yet, in attempt order.
pub(in crate::campaign::controller) fn cancel_requests(state: &State, reason: &str) -> Vec<Entry> {
    state
        .live_attempts()
        .into_iter()
        .filter(|&a| !state.attempts[a].cancel_requested)
        .map(|a| Entry::CancelRequested {
            attempt_id: state.attempts[a].id.clone(),
            reason: reason.into(),
            last_heartbeat_ms: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn every_live_attempt_is_asked_to_cancel_once() {
        let p = plan(serde_json::json!([
            {"id": "a", "strategy": "sharded", "instances": 2, "command": ["w"]},
        ]));
        let (s, a) = live(&p, "a/0", &[]);
        let id = s.attempts[a].id.clone();
        let asked = cancel_requests(&s, "user cancel");
        assert_eq!(
            asked,
            vec![Entry::CancelRequested {
                attempt_id: id,
                reason: "user cancel".into(),
                last_heartbeat_ms: None,
            }]
        );
        // Once journaled, a second pass asks nothing more.
        let mut s = s;
        for e in &asked {
            s.apply(e, &p, 1_000).unwrap();
        }
        assert_eq!(cancel_requests(&s, "again"), Vec::new());
    }
}
