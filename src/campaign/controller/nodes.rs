//! Broken nodes (issue 9, item 5): attempts that fail fast on a node are charged to an
//! infrastructure budget and to the node; a node charged often enough is excluded from every
//! later submission (`#SBATCH --exclude=<nodes>`), and a unit's retry after a fail-fast
//! failure avoids the nodes of the failed attempt.
//!
//! *Failing fast* means: a [`FailureClass::Transient`] failure (node or boot failure, launch
//! failure, preemption, a collective/rendezvous failure) that came before the attempt's first
//! progress mark (`step N` / `iteration N` in any of its logs), or a `NODE_FAIL`/`BOOT_FAIL`
//! whatever the progress, on nodes the scheduler named. Preemptions (the scheduler's choice),
//! application, configuration and OOM failures are never the node's fault and are never
//! charged to it.

use std::collections::BTreeSet;

use super::classify::{Evidence, FailureClass, progress_step};
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::step;
use crate::executor::JobState;

/// Whether an attempt that ended in `state` with `class` failed fast on its nodes (see the
/// [module docs](self)), from the logs in `ev` (job log and rank logs).
pub(crate) fn fails_fast(state: &JobState, class: Option<FailureClass>, ev: &Evidence) -> bool {
    if class != Some(FailureClass::Transient) {
        return false;
    }
    match state {
        JobState::NodeFail | JobState::BootFail => return true,
        // A preemption is the scheduler's decision, not the node's fault.
        JobState::Preempted | JobState::Cancelled { .. } => return false,
        _ => {}
    }
    let progress = std::iter::once(ev.log_tail.as_str())
        .chain(ev.rank_logs.iter().map(|(_, t)| t.as_str()))
        .filter_map(|t| progress_step(&t.to_ascii_lowercase()))
        .max();
    progress.is_none()
}

/// Adds `nodes` to the `--exclude` of `directives` (merged with an `--exclude=` already there,
/// so sbatch sees one list), sorted; nothing when `nodes` is empty.
pub(crate) fn add_exclude(directives: &mut Vec<String>, nodes: &BTreeSet<String>) {
    if nodes.is_empty() {
        return;
    }
    let mut all = nodes.clone();
    directives.retain(|d| match d.strip_prefix("--exclude=") {
        Some(list) => {
            all.extend(crate::executor::expand_hostlist(list));
            false
        }
        None => true,
    });
    directives.push(format!(
        "--exclude={}",
        all.into_iter().collect::<Vec<_>>().join(",")
    ));
}

impl CampaignController {
    /// Excludes (journals, then tells the observer) each host of `hosts` (host, the executor's
    /// message) whose SSH host key changed or is unknown (issue 27, P07), not excluded yet:
    /// the key is never accepted automatically, so the host takes no more attempts of the
    /// campaign until an operator checks it and fixes `known_hosts`; the others go on. With
    /// every host excluded, the next submit is refused as unsatisfiable (a configuration
    /// failure naming them). [`step::refused_host_exclusions`] decides.
    pub(super) fn exclude_refused_hosts(
        &mut self,
        hosts: Vec<(String, String)>,
    ) -> Result<(), ControllerError> {
        let newly = step::refused_host_exclusions(&self.state, hosts);
        self.exclude_nodes(newly)
    }

    /// Excludes (journals, then tells the observer) every node charged with at least the
    /// threshold of fail-fast attempts that is not excluded yet
    /// ([`step::broken_node_exclusions`] decides).
    pub(super) fn exclude_broken_nodes(&mut self) -> Result<(), ControllerError> {
        let newly = step::broken_node_exclusions(&self.state, &self.settings);
        self.exclude_nodes(newly)
    }

    /// Excludes `newly` (node, reason) campaign-wide: journaled first, then told to the
    /// observer.
    fn exclude_nodes(&mut self, newly: Vec<(String, String)>) -> Result<(), ControllerError> {
        if newly.is_empty() {
            return Ok(());
        }
        self.record(
            newly
                .iter()
                .map(|(node, reason)| Entry::NodeExcluded {
                    node: node.clone(),
                    reason: reason.clone(),
                })
                .collect(),
        )?;
        for (node, reason) in newly {
            self.notify(&ControllerEvent::NodeExcluded { node, reason });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_fast_needs_a_transient_failure_before_the_first_progress_mark() {
        let ev = |log: &str| Evidence {
            log_tail: log.into(),
            ..Evidence::default()
        };
        let t = Some(FailureClass::Transient);
        assert!(fails_fast(
            &JobState::Failed,
            t,
            &ev("RendezvousTimeoutError")
        ));
        assert!(!fails_fast(
            &JobState::Failed,
            t,
            &ev("step 40\nRendezvousTimeoutError")
        ));
        // A node failure is the node's whatever the progress (C23); a preemption never is.
        assert!(fails_fast(&JobState::NodeFail, t, &ev("step 40")));
        assert!(!fails_fast(&JobState::Preempted, t, &ev("")));
        assert!(!fails_fast(
            &JobState::Cancelled { by_uid: Some(0) },
            t,
            &ev("")
        ));
        // Never the node's fault: application, config, OOM, success.
        for c in [
            Some(FailureClass::Application),
            Some(FailureClass::Config),
            Some(FailureClass::Oom),
            Some(FailureClass::Unknown),
            None,
        ] {
            assert!(!fails_fast(&JobState::Failed, c, &ev("")), "{c:?}");
        }
        // A rank log's progress counts too.
        let mut e = ev("watchdog caught collective operation timeout");
        e.rank_logs = vec![("rank log 1".into(), "iteration 3".into())];
        assert!(!fails_fast(&JobState::Failed, t, &e));
    }

    #[test]
    fn exclude_directive_merges_with_one_already_there() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let mut d = vec!["--constraint=a100".to_string()];
        add_exclude(&mut d, &set(&[]));
        assert_eq!(d, ["--constraint=a100"]);
        add_exclude(&mut d, &set(&["n2"]));
        assert_eq!(d, ["--constraint=a100", "--exclude=n2"]);
        let mut d = vec!["--exclude=n[3-4]".to_string()];
        add_exclude(&mut d, &set(&["n2", "n3"]));
        assert_eq!(d, ["--exclude=n2,n3,n4"]);
    }
}
