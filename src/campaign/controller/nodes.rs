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
use crate::executor::JobState;

/// Node lists that name no node (`squeue`/`sacct` placeholders, the local executor's host).
const NO_NODE: &[&str] = &["", "none", "(null)", "none assigned", "localhost"];

/// Expands a Slurm hostlist (`n[1-3,7],gpu05`, zero padding kept: `node[08-10]`) into node
/// names, in order, without duplicates. A part that is not a valid range is kept as written
/// (a name with brackets is rare, and never dropped), and placeholders (`None`, `(null)`,
/// `localhost`) give nothing.
pub(crate) fn expand_hostlist(list: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |n: String| {
        if !NO_NODE.contains(&n.to_ascii_lowercase().as_str()) && !out.contains(&n) {
            out.push(n);
        }
    };
    // Split at commas outside brackets.
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    for part in parts.into_iter().map(str::trim) {
        match expand_one(part) {
            Some(names) => names.into_iter().for_each(&mut push),
            None => push(part.to_string()),
        }
    }
    out
}

/// `prefix[a-b,c]suffix` → names; `None` when `part` has no well-formed bracket.
fn expand_one(part: &str) -> Option<Vec<String>> {
    let Some(open) = part.find('[') else {
        return Some(vec![part.to_string()]);
    };
    let close = open + part[open..].find(']')?;
    let (prefix, ranges, suffix) = (&part[..open], &part[open + 1..close], &part[close + 1..]);
    let mut names = Vec::new();
    for r in ranges.split(',') {
        let (lo, hi) = r.split_once('-').unwrap_or((r, r));
        let (a, b): (u64, u64) = (lo.parse().ok()?, hi.parse().ok()?);
        // A list of more than 100k nodes is a parse accident, not a cluster.
        if b < a || b - a > 100_000 {
            return None;
        }
        let width = lo.len();
        for n in a..=b {
            // The suffix may hold another bracket (`a[1-2]b[3-4]`): expand it recursively.
            for tail in expand_one(suffix)? {
                names.push(format!("{prefix}{n:0width$}{tail}"));
            }
        }
    }
    Some(names)
}

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
            all.extend(expand_hostlist(list));
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
    /// Nodes the next attempt of `unit` must avoid: every node the campaign excluded, and the
    /// nodes of the unit's last attempt that failed fast.
    pub(super) fn nodes_to_avoid(&self, unit: usize) -> BTreeSet<String> {
        self.state
            .excluded_nodes
            .keys()
            .chain(self.state.units[unit].exclude.iter())
            .cloned()
            .collect()
    }

    /// Excludes (journals, then tells the observer) each host of `hosts` (host, the executor's
    /// message) whose SSH host key changed or is unknown (issue 27, P07), not excluded yet:
    /// the key is never accepted automatically, so the host takes no more attempts of the
    /// campaign until an operator checks it and fixes `known_hosts`; the others go on. With
    /// every host excluded, the next submit is refused as unsatisfiable (a configuration
    /// failure naming them).
    pub(super) fn exclude_refused_hosts(
        &mut self,
        hosts: Vec<(String, String)>,
    ) -> Result<(), ControllerError> {
        let mut newly: Vec<(String, String)> = Vec::new();
        for (host, message) in hosts {
            if self.state.excluded_nodes.contains_key(&host)
                || newly.iter().any(|(h, _)| *h == host)
            {
                continue;
            }
            newly.push((
                host,
                format!(
                    "its SSH host key was refused, never accepted automatically; an operator \
                     must check the host and fix known_hosts: {message}"
                ),
            ));
        }
        self.exclude_nodes(newly)
    }

    /// Excludes (journals, then tells the observer) every node charged with at least the
    /// threshold of fail-fast attempts that is not excluded yet.
    pub(super) fn exclude_broken_nodes(&mut self) -> Result<(), ControllerError> {
        let Some(threshold) = self.settings.exclude_node_after else {
            return Ok(());
        };
        let newly: Vec<(String, String)> = self
            .state
            .node_failures
            .iter()
            .filter(|&(n, units)| {
                units.len() >= threshold as usize && !self.state.excluded_nodes.contains_key(n)
            })
            .map(|(n, units)| {
                (
                    n.clone(),
                    format!(
                        "{} distinct units failed fast on it ({}: before their start mark or first progress mark, or node/boot failure); threshold {threshold}",
                        units.len(),
                        units.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )
            })
            .collect();
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
    fn hostlists_expand_with_padding_and_placeholders_give_nothing() {
        let cases: &[(&str, &[&str])] = &[
            ("n2", &["n2"]),
            ("n[1-3]", &["n1", "n2", "n3"]),
            ("n[1-2,4],gpu05", &["n1", "n2", "n4", "gpu05"]),
            ("node[08-10]", &["node08", "node09", "node10"]),
            ("a[1-2]b[3-4]", &["a1b3", "a1b4", "a2b3", "a2b4"]),
            ("n1,n1", &["n1"]),
            ("None", &[]),
            ("(null)", &[]),
            ("localhost", &[]),
            ("", &[]),
            // Malformed: kept as written, never dropped or guessed.
            ("n[x-2]", &["n[x-2]"]),
            ("n[3-1]", &["n[3-1]"]),
        ];
        for (input, want) in cases {
            assert_eq!(expand_hostlist(input), *want, "{input}");
        }
    }

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
