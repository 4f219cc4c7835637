//! Crash trials on the local executor: the `campaign` example (real processes, real data) is
//! killed with SIGKILL at random moments and restarted until it completes. Every campaign must
//! end complete, with results identical to an uninterrupted run, no attempt started twice, no
//! job unknown to the journal, and every unit's success marker present.
//!
//! Trials: `PUZZLETRON_CRASH_TRIALS` kills in all (default 50), over as many campaigns as
//! needed. Each kill waits 50 ms .. 2 s (seeded; seed in the output).

mod support;
use support::watchdog;

use std::time::{Duration, Instant};

use support::campaign::{KillPlan, Rng, Trials, audit, kill_9_trials, result, spawn, spawn_env};

fn run_to_completion(dir: &std::path::Path) {
    // Output is kept (in the campaign folder) so a failure says why the campaign exited.
    let log = dir.with_extension("log");
    let (status, text) = support::examples::run_to_text(
        std::process::Command::new(support::campaign::campaign_exe())
            .arg("--dir")
            .arg(dir)
            .args(["--quiet", "--poll-ms", "100"]),
    );
    let _ = std::fs::write(&log, &text);
    let tail: String = text
        .lines()
        .rev()
        .take(15)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    if !status.success() {
        // Kept outside the temporary folder, which is removed as the test unwinds.
        let keep = std::env::temp_dir().join(format!(
            "controller_crash-{}-{}.log",
            std::process::id(),
            dir.file_name().map_or("x".into(), |n| n.to_string_lossy())
        ));
        let _ = std::fs::write(&keep, &text);
        panic!(
            "campaign in {} exited with {} after {} bytes of output (kept in {}); last output:\n{tail}",
            dir.display(),
            status,
            text.len(),
            keep.display()
        );
    }
}

#[test]
fn kill_9_at_random_moments_and_restart() {
    let _watchdog = watchdog::Watchdog::start(
        "kill_9_at_random_moments_and_restart",
        Duration::from_secs(1200),
    );
    let trials: usize = std::env::var("PUZZLETRON_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed = std::env::var("PUZZLETRON_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_u64);
    let mut rng = Rng(seed | 1);
    let root = tempfile::tempdir().unwrap();

    // Reference: one uninterrupted run.
    let reference_dir = root.path().join("reference");
    run_to_completion(&reference_dir);
    let reference = result(&reference_dir);
    let a = audit(&reference_dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");

    let started = Instant::now();
    let t = kill_9_trials(
        root.path(),
        KillPlan {
            trials,
            window_ms: 1950,
            limit: Duration::from_secs(900),
        },
        &mut rng,
        &reference,
        |dir| spawn(dir, &[]),
        |_, _| {},
    );
    let Trials {
        kills,
        campaigns,
        adopted,
        attempts,
    } = t;
    eprintln!(
        "crash trials: {kills} kill -9 over {campaigns} campaigns (seed {seed}), {attempts} attempts, {adopted} adopted, 0 duplicates, 0 lost results, {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// The worst moment, on purpose: the controller dies right after the n-th submit, before the
/// handle is journaled (fault injection: `abort()`, which the kernel treats like `kill -9`).
/// The restarted controller must adopt that job through the executor's `find`, not submit it
/// again. n = 1 (`prepare`), 3 and 5 (shards of `score`, in one batch).
#[test]
fn crash_between_submit_and_handle_is_adopted_not_resubmitted() {
    let _watchdog = watchdog::Watchdog::start(
        "crash_between_submit_and_handle_is_adopted_not_resubmitted",
        Duration::from_secs(1200),
    );
    let root = tempfile::tempdir().unwrap();
    let reference_dir = root.path().join("reference");
    run_to_completion(&reference_dir);
    let reference = result(&reference_dir);
    for n in ["1", "3", "5"] {
        let dir = root.path().join(format!("abort{n}"));
        let st = spawn_env(&dir, &[], &[("CAMPAIGN_ABORT_AFTER_SUBMITS", n)])
            .wait()
            .unwrap();
        assert!(!st.success(), "aborted after submit {n}");
        run_to_completion(&dir);
        assert_eq!(result(&dir), reference);
        let a = audit(&dir);
        assert!(
            a.duplicates.is_empty(),
            "after submit {n}: {:?}",
            a.duplicates
        );
        assert!(a.missing.is_empty(), "after submit {n}: {:?}", a.missing);
        assert!(
            a.adopted >= 1,
            "after submit {n}: the job submitted before the crash was adopted ({a:?})"
        );
    }
}
