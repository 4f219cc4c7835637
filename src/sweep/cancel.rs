//! Cancellation of a drain: what a dropped [`drain_async`](super::Orchestrator::drain_async)
//! future, a [`CancellationToken`] given to
//! [`OrchestratorBuilder::cancellation_token`](super::OrchestratorBuilder::cancellation_token),
//! Ctrl-C in a blocking [`drain`](super::Orchestrator::drain) or SIGTERM in an isolated worker
//! do to the runs: the job is told through [`Run::is_cancelled`](super::Run::is_cancelled)
//! and the errors of [`Run::log`](super::Run::log)/[`Run::flush`](super::Run::flush), and a run
//! that stops because of it is recorded as interrupted (it runs again at the next drain),
//! never as failed.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Wake, Waker};
use std::thread::Thread;

pub use tokio_util::sync::CancellationToken;

/// A drain's cancellation: a token (what async code and the isolated drain wait on) and a flag
/// that a running job reads at every [`Run::log`](super::Run::log) without a lock.
#[derive(Clone, Default)]
pub(crate) struct Cancel {
    token: CancellationToken,
    flag: Arc<AtomicBool>,
    /// The token has a parent that may cancel it without [`trigger`](Self::trigger).
    parent: bool,
}

impl Cancel {
    /// A cancellation of its own, cancelled too when `parent` is (if any).
    pub(crate) fn child_of(parent: Option<&CancellationToken>) -> Self {
        Self {
            token: parent
                .map(CancellationToken::child_token)
                .unwrap_or_default(),
            flag: Arc::default(),
            parent: parent.is_some(),
        }
    }

    /// Cancels: the flag at once, the token's waiters too.
    pub(crate) fn trigger(&self) {
        self.flag.store(true, Ordering::Release);
        self.token.cancel();
    }

    /// Whether it is cancelled (the flag, or the token through a parent not bridged yet).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Acquire) || self.token.is_cancelled()
    }

    /// The flag alone: one atomic load (what a job's [`Run::log`](super::Run::log) reads; a
    /// parent token reaches it through [`bridge`](Self::bridge)).
    pub(crate) fn flagged(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    /// Whether a parent token may cancel it: then a drain runs [`bridge`](Self::bridge).
    pub(crate) fn has_parent(&self) -> bool {
        self.parent
    }

    /// The token (for `select!` in async code).
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Sets the flag when the token is cancelled (by a parent token), until `stop` is set and
    /// this thread unparked. Runs on a thread of its own for the length of a drain.
    pub(crate) fn bridge(&self, stop: &AtomicBool) {
        struct Unpark(Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut cancelled = pin!(self.token.cancelled());
        loop {
            if stop.load(Ordering::Acquire) {
                return;
            }
            if cancelled.as_mut().poll(&mut cx).is_ready() {
                self.flag.store(true, Ordering::Release);
                return;
            }
            std::thread::park();
        }
    }
}

/// Cancels `cancel` when dropped, unless [`disarm`](Self::disarm)ed: how dropping a
/// `drain_async` future cancels its drain.
pub(crate) struct CancelOnDrop(Option<Cancel>);

impl CancelOnDrop {
    pub(crate) fn new(cancel: Cancel) -> Self {
        Self(Some(cancel))
    }

    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.trigger();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_token_reaches_the_flag_through_the_bridge() {
        let parent = CancellationToken::new();
        let c = Cancel::child_of(Some(&parent));
        assert!(!c.is_cancelled() && !c.flagged());
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| c.bridge(&stop));
            parent.cancel();
            h.join().unwrap();
        });
        assert!(c.flagged() && c.is_cancelled());
    }

    #[test]
    fn a_bridge_stops_when_told() {
        let c = Cancel::child_of(None);
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let h = s.spawn(|| c.bridge(&stop));
            stop.store(true, Ordering::Release);
            h.thread().unpark();
            h.join().unwrap();
        });
        assert!(!c.flagged());
    }

    #[test]
    fn dropping_the_guard_cancels_and_disarming_does_not() {
        let c = Cancel::default();
        CancelOnDrop::new(c.clone()).disarm();
        assert!(!c.is_cancelled());
        drop(CancelOnDrop::new(c.clone()));
        assert!(c.flagged() && c.token().is_cancelled());
    }
}
