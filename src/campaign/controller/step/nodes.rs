//! Excluded nodes (`nodes`): which hosts and nodes the campaign stops using, and why; the
//! loop journals the exclusions, then tells the observers.

use super::super::driver::Settings;
use super::super::state::State;

/// The hosts of `hosts` (host, the executor's message) whose SSH host key was refused that
/// are not excluded yet, each once, with the reason to journal (issue 27, P07): the key is
/// never accepted automatically, so an operator must check the host.
pub(in crate::campaign::controller) fn refused_host_exclusions(
    state: &State,
    hosts: Vec<(String, String)>,
) -> Vec<(String, String)> {
    let mut newly: Vec<(String, String)> = Vec::new();
    for (host, message) in hosts {
        if state.excluded_nodes.contains_key(&host) || newly.iter().any(|(h, _)| *h == host) {
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
    newly
}

/// Every node charged with at least the builder's threshold of distinct fail-fast units
/// that is not excluded yet, with the reason to journal; none without a threshold.
pub(in crate::campaign::controller) fn broken_node_exclusions(
    state: &State,
    settings: &Settings,
) -> Vec<(String, String)> {
    let Some(threshold) = settings.exclude_node_after else {
        return Vec::new();
    };
    state
        .node_failures
        .iter()
        .filter(|&(n, units)| {
            units.len() >= threshold as usize && !state.excluded_nodes.contains_key(n)
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
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    fn one() -> State {
        let p = plan(serde_json::json!([{"id": "a", "command": ["w"]}]));
        state_after(&p, &[])
    }

    #[test]
    fn a_refused_host_is_excluded_once_and_never_again() {
        let mut s = one();
        s.excluded_nodes.insert("h0".into(), "earlier".into());
        let got = refused_host_exclusions(
            &s,
            vec![
                ("h1".into(), "key changed".into()),
                ("h0".into(), "key changed".into()),
                ("h1".into(), "again".into()),
            ],
        );
        assert_eq!(
            got,
            vec![(
                "h1".to_string(),
                "its SSH host key was refused, never accepted automatically; an operator must \
                 check the host and fix known_hosts: key changed"
                    .to_string()
            )]
        );
    }

    #[test]
    fn a_node_is_excluded_at_the_threshold_of_distinct_units() {
        let mut s = one();
        let units = |v: &[&str]| v.iter().map(|u| u.to_string()).collect();
        s.node_failures.insert("n1".into(), units(&["a/0", "a/1"]));
        s.node_failures.insert("n2".into(), units(&["a/0"]));
        s.node_failures.insert("n3".into(), units(&["a/0", "a/2"]));
        s.excluded_nodes.insert("n3".into(), "earlier".into());
        let mut settings = Settings::defaults();
        settings.exclude_node_after = Some(2);
        assert_eq!(
            broken_node_exclusions(&s, &settings),
            vec![(
                "n1".to_string(),
                "2 distinct units failed fast on it (a/0, a/1: before their start mark or first \
                 progress mark, or node/boot failure); threshold 2"
                    .to_string()
            )]
        );
        settings.exclude_node_after = None;
        assert_eq!(broken_node_exclusions(&s, &settings), Vec::new());
    }
}
