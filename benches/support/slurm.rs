//! Following Slurm jobs to their end, as the Slurm benches do.

use std::time::{Duration, Instant};

use puzzletron::executor::{ExecutorExt, JobHandle, JobState, SlurmExecutor};

/// Waits until every job of `hs` has ended (`wait_terminal`, asking every `every`: the
/// executor answers from its cache until its poll policy's interval has passed, so the
/// scheduler calls counted are the policy's), asserts that each completed, and returns the
/// seconds since `t`.
pub async fn wait_all_completed(
    e: &SlurmExecutor,
    hs: &[JobHandle],
    every: Duration,
    t: Instant,
) -> f64 {
    let st = e
        .wait_terminal(hs, every, Duration::from_secs(1800))
        .await
        .unwrap();
    let total = t.elapsed().as_secs_f64();
    let done = st.iter().filter(|s| s.state == JobState::Completed).count();
    assert_eq!(
        done,
        hs.len(),
        "{:?}",
        st.iter().find(|s| s.state != JobState::Completed)
    );
    total
}
