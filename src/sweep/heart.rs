//! [`Heart`]: renews the claim of the run a drain executes now, from one thread for the whole
//! drain. A thread per run cost a thread start and join for every run of a first pass of
//! trivial runs.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::{Claim, Store};

#[derive(Default)]
struct State {
    /// The claim of the run executing now.
    claim: Option<Claim>,
    /// A renewal of `claim` is in flight (outside the lock).
    beating: bool,
    stop: bool,
}

/// The claim a drain's heartbeat thread renews; see [`Heart::run`] and [`Heart::beat_while`].
pub(super) struct Heart {
    state: Mutex<State>,
    wake: Condvar,
    every: Duration,
}

impl Heart {
    /// A heart that renews every `every` (the store's
    /// [`heartbeat_interval`](crate::store::Store::heartbeat_interval)).
    pub(super) fn every(every: Duration) -> Self {
        Self {
            state: Mutex::default(),
            wake: Condvar::new(),
            every,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` with `claim` renewed at least every heartbeat interval by the thread in
    /// [`run`](Self::run). When it returns, no renewal of `claim` is in flight any more, so
    /// the caller may release the claim without a late renewal touching whoever claims next.
    pub(super) fn beat_while<T>(&self, claim: &Claim, f: impl FnOnce() -> T) -> T {
        struct Clear<'a>(&'a Heart);
        impl Drop for Clear<'_> {
            fn drop(&mut self) {
                let mut g = self.0.lock();
                while g.beating {
                    g = self.0.wake.wait(g).unwrap_or_else(|e| e.into_inner());
                }
                g.claim = None;
            }
        }
        self.lock().claim = Some(claim.clone());
        let _clear = Clear(self);
        f()
    }

    /// The heartbeat loop: renews the current claim every heartbeat interval until
    /// [`stop`](Self::stop). Renewal errors are ignored (a lost claim shows at the commit).
    pub(super) fn run<S: Store + ?Sized>(&self, store: &S) {
        let mut next = Instant::now() + self.every;
        let mut g = self.lock();
        loop {
            if g.stop {
                return;
            }
            let now = Instant::now();
            if now < next {
                g = self
                    .wake
                    .wait_timeout(g, next - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            next = now + self.every;
            if let Some(c) = g.claim.clone() {
                g.beating = true;
                drop(g);
                let _ = store.heartbeat(&c);
                g = self.lock();
                g.beating = false;
                self.wake.notify_all();
            }
        }
    }

    /// A guard that ends [`run`](Self::run) when dropped.
    pub(super) fn stop_on_drop(&self) -> impl Drop + '_ {
        struct Stop<'a>(&'a Heart);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.lock().stop = true;
                self.0.wake.notify_all();
            }
        }
        Stop(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimOutcome, FsStore, Owner};
    use std::time::SystemTime;

    /// The claim of the run executing now is renewed while it runs, and not after.
    #[test]
    fn the_current_claim_is_renewed_while_it_runs_and_not_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsStore::create(dir.path()).unwrap();
        let key = crate::identity::Hash::of("k");
        let ClaimOutcome::Claimed(claim) = store.claim(&key, &Owner::current(), None).unwrap()
        else {
            panic!("not claimed");
        };
        let file = store.job_dir(&key).join("claim");
        // A new folder's claim is its `mkdir`; the first heartbeat writes the claim file.
        assert!(!file.exists());
        store.heartbeat(&claim).unwrap();
        let mtime = || std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let heart = Heart::every(Duration::from_millis(50));
        std::thread::scope(|s| {
            let _stop = heart.stop_on_drop();
            s.spawn(|| heart.run(&store));
            let before = mtime();
            let t = Instant::now();
            heart.beat_while(&claim, || {
                while mtime() == before {
                    assert!(t.elapsed() < Duration::from_secs(10), "never renewed");
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            // Done: a renewal in flight has ended, and none follows.
            let after = mtime();
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(mtime(), after);
            assert!(after > before && after <= SystemTime::now());
        });
    }
}
