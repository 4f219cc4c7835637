//! Time for the controller: the system clock, or a virtual clock for tests.

use std::time::Duration;

use async_trait::async_trait;

#[cfg(any(test, feature = "test-util"))]
use crate::executor::MockClock;

/// The controller's source of time and of waiting.
#[async_trait]
pub trait Clock: Send + Sync {
    /// Now, in ms since the Unix epoch (virtual clocks start where they like).
    fn now_ms(&self) -> u64;
    /// Waits `d` (a virtual clock just moves forward).
    async fn sleep(&self, d: Duration);
}

/// Wall-clock time and `tokio::time::sleep`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        crate::sys::now_ms()
    }
    async fn sleep(&self, d: Duration) {
        tokio::time::sleep(d).await
    }
}

/// (Feature `test-util`.) A virtual clock shared with a [`MockExecutor`](crate::executor::MockExecutor): sleeping
/// advances it, so a campaign of hours runs in milliseconds and every time is exact.
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct VirtualClock(pub MockClock);

#[cfg(any(test, feature = "test-util"))]
impl VirtualClock {
    /// A virtual clock reading (and advancing) `clock`.
    pub fn new(clock: MockClock) -> Self {
        Self(clock)
    }
}

#[cfg(any(test, feature = "test-util"))]
#[async_trait]
impl Clock for VirtualClock {
    fn now_ms(&self) -> u64 {
        self.0.now().as_millis() as u64
    }
    async fn sleep(&self, d: Duration) {
        self.0.advance(d)
    }
}
