//! A per-test deadline. The Rust test harness has no timeout, so a test that waits on other
//! processes (a drain behind a claim, a child, a controller) could hang CI until its global
//! limit; a watchdog ends the test binary with a message naming the test instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Exits the process with status 101 (what a failed test binary returns) unless dropped
/// within `limit`.
#[must_use = "the watchdog stops watching when dropped"]
pub struct Watchdog {
    done: Arc<AtomicBool>,
}

impl Watchdog {
    /// Starts watching `what` for `limit`.
    pub fn start(what: &str, limit: Duration) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&done);
        let what = what.to_string();
        std::thread::spawn(move || {
            let end = Instant::now() + limit;
            while Instant::now() < end {
                if seen.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            eprintln!(
                "WATCHDOG: `{what}` did not finish within {} s: it hangs; ending this test \
                 binary so the run reports it",
                limit.as_secs()
            );
            std::process::exit(101);
        });
        Self { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
    }
}
