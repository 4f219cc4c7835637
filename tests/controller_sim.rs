//! A simulated campaign of 10k work items with injected faults on the mock executor (the
//! 100k-item figure comes from `cargo bench --bench controller_sim`): every unit completes,
//! every injected failure is retried exactly as the policy says, no attempt is submitted twice.

mod support;
use support::sim;

#[test]
fn ten_thousand_items_with_injected_faults() {
    let dir = tempfile::tempdir().unwrap();
    let n = 10_000u32;
    let r = sim::run(n, dir.path());
    assert!(r.report.is_complete(), "{}", r.report);
    // Expected attempts: every unit once, plus one retry per injected job fault.
    let keys: Vec<String> = (0..n)
        .map(|i| format!("big/{i}"))
        .chain(["prep/0", "big/agg", "post/0"].map(String::from))
        .collect();
    let faults = keys.iter().filter(|k| sim::faulty(k)).count();
    assert!(faults > 300, "the simulation injects faults ({faults})");
    assert!(r.injected_poll_failures >= 3);
    let units = n as usize + 3; // + prep, aggregate, post
    assert_eq!(
        r.jobs,
        units + faults,
        "one job per attempt, one retry per injected fault"
    );
    assert_eq!(r.submits, r.jobs, "no submit was refused as a duplicate");
    let a = support::campaign::audit_journal(dir.path());
    assert_eq!(a.attempts, units + faults);
}
