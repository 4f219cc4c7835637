//! Retry policies: what happens after an attempt of a work unit ends, by [`FailureClass`] and
//! the stage's [`FailurePolicy`].
//!
//! The table is in [`RetryPolicy`]'s docs (its `# Retry table` section): the type is public, this
//! module is not.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::classify::FailureClass;
use crate::campaign::FailurePolicy;

/// Retry budgets and backoff of a controller.
///
/// # Retry table
///
/// The one table of what is retried (`decide` implements it; `CONTRIBUTING.md` and the
/// `classify` docs refer to it). A class is "fatal" where it fails the work
/// unit at once.
///
/// | class | `strict` | `resume` |
/// | --- | --- | --- |
/// | success | done | done |
/// | `transient`, `hung` | retried, own budget ([`RetryPolicy::transient_retries`](Self::transient_retries)) | same |
/// | `transient`, failed fast on a node | retried on other nodes, infrastructure budget ([`RetryPolicy::infra_retries`](Self::infra_retries)), then as `transient` | same |
/// | `oom` | retried once with more resources when the stage allows it ([`RetryPolicy::oom_retries`](Self::oom_retries)), else fatal | same |
/// | `timeout_resumable` | fatal | re-submitted with the resume flag, up to `max_attempts` |
/// | `application` (any exit code, NaN loss, `AssertionError`), `unknown` | fatal | re-submitted (resume flag when the stage can resume), up to `max_attempts` |
/// | `timeout_fatal`, `config`, `cancelled`, `expired` | fatal | fatal |
///
/// Delays grow exponentially with jitter ("full jitter" is avoided so a delay never drops to 0):
/// `delay = min(max, base * factor^(n-1)) * (1 - jitter * u)` with `u` in `[0, 1)` derived from
/// the attempt id, so the same attempt always gets the same delay (reproducible tests) while
/// different attempts spread out (AWS Architecture Blog, "Exponential Backoff And Jitter").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Most retries of one work unit for [`FailureClass::Transient`] failures (C23: their own
    /// cap, separate from `max_attempts`). Default 3.
    pub transient_retries: u32,
    /// Most retries of one work unit for transient failures that failed fast on a node
    /// (before the first progress mark, or `NODE_FAIL`/`BOOT_FAIL`; [`UnitHistory::fail_fast`]):
    /// they are charged to this infrastructure budget, not to `transient_retries`, and the
    /// retry excludes the failed attempt's nodes. Beyond it they count as transient. Default 2.
    #[serde(default = "default_infra_retries")]
    pub infra_retries: u32,
    /// Most retries after an out-of-memory, where the stage allows them. Default 1.
    pub oom_retries: u32,
    /// Delay before the first retry. Default 5 s.
    pub base_delay: Duration,
    /// Growth factor per retry. Default 2.
    pub factor: f64,
    /// Largest delay. Default 5 min.
    pub max_delay: Duration,
    /// Fraction of the delay that is randomised away, in `[0, 1]`. Default 0.25.
    pub jitter: f64,
}

fn default_infra_retries() -> u32 {
    2
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            transient_retries: 3,
            infra_retries: default_infra_retries(),
            oom_retries: 1,
            base_delay: Duration::from_secs(5),
            factor: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: 0.25,
        }
    }
}

impl RetryPolicy {
    /// Sets [`transient_retries`](Self::transient_retries).
    pub fn with_transient_retries(mut self, transient_retries: u32) -> Self {
        self.transient_retries = transient_retries;
        self
    }

    /// Sets [`infra_retries`](Self::infra_retries).
    pub fn with_infra_retries(mut self, infra_retries: u32) -> Self {
        self.infra_retries = infra_retries;
        self
    }

    /// Sets [`oom_retries`](Self::oom_retries).
    pub fn with_oom_retries(mut self, oom_retries: u32) -> Self {
        self.oom_retries = oom_retries;
        self
    }

    /// Sets [`base_delay`](Self::base_delay).
    pub fn with_base_delay(mut self, base_delay: Duration) -> Self {
        self.base_delay = base_delay;
        self
    }

    /// Sets [`factor`](Self::factor).
    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Sets [`max_delay`](Self::max_delay).
    pub fn with_max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = max_delay;
        self
    }

    /// Sets [`jitter`](Self::jitter).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay before retry number `n` (1-based) of the attempt named `seed`.
    pub fn delay(&self, n: u32, seed: &str) -> Duration {
        let exp = self
            .factor
            .max(1.0)
            .powi(n.saturating_sub(1).min(64) as i32);
        let raw = (self.base_delay.as_secs_f64() * exp).min(self.max_delay.as_secs_f64());
        let h = crate::identity::Hash::of(seed.as_bytes());
        let u = u64::from_be_bytes(h.as_bytes()[..8].try_into().unwrap_or([0; 8])) as f64
            / (u64::MAX as f64 + 1.0);
        let j = self.jitter.clamp(0.0, 1.0);
        Duration::from_secs_f64((raw * (1.0 - j * u)).max(0.0))
    }
}

/// What the controller knows about a unit when one of its attempts ends.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnitHistory {
    /// The stage's failure policy.
    pub failure_policy: FailurePolicy,
    /// The stage can resume from a checkpoint.
    pub resumable: bool,
    /// The stage allows a retry with more resources after an out-of-memory.
    pub oom_retry_allowed: bool,
    /// The stage's `max_attempts` (counts every attempt except transient ones).
    pub max_attempts: u32,
    /// Attempts so far, this one included, excluding transient failures.
    pub counted_attempts: u32,
    /// Transient (and hung) failures so far that did not fail fast on a node, this one
    /// included.
    pub transient_failures: u32,
    /// Transient failures so far that failed fast on a node (see [`UnitHistory::fail_fast`]),
    /// this one included.
    pub infra_failures: u32,
    /// This attempt failed fast on a node: a transient failure before its first progress mark
    /// (or `NODE_FAIL`/`BOOT_FAIL`), on known nodes.
    pub fail_fast: bool,
    /// Out-of-memory failures so far, this one included.
    pub oom_failures: u32,
}

/// The controller's next step for a unit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Decision {
    /// The unit is done.
    Done,
    /// Submit a new attempt after `delay`.
    Retry {
        /// Wait before submitting.
        delay: Duration,
        /// Set the resume flag (`PUZZLETRON_RESUME=1`).
        resume: bool,
        /// Ask for more resources (see [`Decision::Retry`] docs on the controller).
        more_resources: bool,
    },
    /// The unit failed for good.
    Fail {
        /// Why, e.g. `oom: no retry allowed for stage score`.
        reason: String,
    },
}

/// Decides what follows an attempt that ended with `class` (`None`: success). `seed` (the
/// attempt id) makes the jitter reproducible. See the [module docs](self) for the table.
pub(super) fn decide(
    policy: &RetryPolicy,
    class: Option<FailureClass>,
    h: &UnitHistory,
    seed: &str,
) -> Decision {
    let Some(class) = class else {
        return Decision::Done;
    };
    let resume_policy = h.failure_policy == FailurePolicy::Resume;
    let budget_left = h.counted_attempts < h.max_attempts;
    let fail = |why: &str| Decision::Fail {
        reason: format!("{class}: {why}"),
    };
    match class {
        FailureClass::Transient | FailureClass::Hung => {
            if h.fail_fast && h.infra_failures <= policy.infra_retries {
                return Decision::Retry {
                    delay: policy.delay(h.infra_failures, seed),
                    resume: h.resumable,
                    more_resources: false,
                };
            }
            // Fail-fast failures beyond the infrastructure budget count as transient.
            let n = h.transient_failures + h.infra_failures.saturating_sub(policy.infra_retries);
            if n <= policy.transient_retries {
                Decision::Retry {
                    delay: policy.delay(n, seed),
                    resume: h.resumable,
                    more_resources: false,
                }
            } else {
                fail(&format!(
                    "{n} transient failures, budget {}",
                    policy.transient_retries
                ))
            }
        }
        FailureClass::Oom => {
            if !h.oom_retry_allowed {
                fail(
                    "the stage does not allow a retry with more resources; retry it in place \
                     with `puzzletron campaign retry DIR --allow-oom-retry STAGE` (finished \
                     stages stay finished)",
                )
            } else if h.oom_failures > policy.oom_retries {
                fail(&format!(
                    "{} out-of-memory failures, budget {}",
                    h.oom_failures, policy.oom_retries
                ))
            } else {
                Decision::Retry {
                    delay: policy.delay(h.oom_failures, seed),
                    resume: resume_policy && h.resumable,
                    more_resources: true,
                }
            }
        }
        FailureClass::TimeoutResumable
        | FailureClass::Application
        | FailureClass::Unknown
        | FailureClass::OutputNotVisible => {
            if !resume_policy {
                fail("failure policy strict")
            } else if !budget_left {
                fail(&format!(
                    "{} attempts, max_attempts {}",
                    h.counted_attempts, h.max_attempts
                ))
            } else {
                Decision::Retry {
                    delay: policy.delay(h.counted_attempts, seed),
                    resume: h.resumable || class == FailureClass::TimeoutResumable,
                    more_resources: false,
                }
            }
        }
        FailureClass::TimeoutFatal => fail("the stage cannot resume"),
        FailureClass::Config => fail("retrying cannot fix a configuration error"),
        FailureClass::Cancelled => fail("cancelled"),
        FailureClass::Expired => fail("expired before it could run"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(p: FailurePolicy) -> UnitHistory {
        UnitHistory {
            failure_policy: p,
            resumable: true,
            oom_retry_allowed: true,
            max_attempts: 3,
            counted_attempts: 1,
            transient_failures: 0,
            infra_failures: 0,
            fail_fast: false,
            oom_failures: 0,
        }
    }
    fn no_jitter() -> RetryPolicy {
        RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        }
    }

    #[test]
    fn backoff_grows_and_caps_and_jitter_is_bounded_and_reproducible() {
        let p = no_jitter();
        assert_eq!(p.delay(1, "a"), Duration::from_secs(5));
        assert_eq!(p.delay(2, "a"), Duration::from_secs(10));
        assert_eq!(p.delay(3, "a"), Duration::from_secs(20));
        assert_eq!(p.delay(20, "a"), Duration::from_secs(300));
        let j = RetryPolicy::default();
        let d = j.delay(2, "x.s.0.a1");
        assert!(
            d <= Duration::from_secs(10) && d >= Duration::from_secs_f64(7.5),
            "{d:?}"
        );
        assert_eq!(d, j.delay(2, "x.s.0.a1"));
        assert_ne!(j.delay(2, "x.s.0.a1"), j.delay(2, "x.s.1.a1"));
    }

    #[test]
    fn success_is_done() {
        assert_eq!(
            decide(&no_jitter(), None, &hist(FailurePolicy::Strict), "a"),
            Decision::Done
        );
    }

    #[test]
    fn transient_has_own_budget_under_both_policies() {
        for p in [FailurePolicy::Strict, FailurePolicy::Resume] {
            let mut h = hist(p);
            h.transient_failures = 3;
            assert!(matches!(
                decide(&no_jitter(), Some(FailureClass::Transient), &h, "a"),
                Decision::Retry {
                    more_resources: false,
                    ..
                }
            ));
            h.transient_failures = 4;
            assert!(matches!(
                decide(&no_jitter(), Some(FailureClass::Transient), &h, "a"),
                Decision::Fail { .. }
            ));
        }
    }

    #[test]
    fn fail_fast_is_charged_to_the_infra_budget_then_to_the_transient_one() {
        let p = no_jitter();
        let mut h = hist(FailurePolicy::Strict);
        h.fail_fast = true;
        // Within the infrastructure budget (2): retried, the transient budget untouched.
        h.transient_failures = 3;
        for n in 1..=2 {
            h.infra_failures = n;
            assert!(
                matches!(
                    decide(&p, Some(FailureClass::Transient), &h, "a"),
                    Decision::Retry { .. }
                ),
                "infra failure {n}"
            );
        }
        // Beyond it, the third counts as transient failure number 4: budget spent.
        h.infra_failures = 3;
        let Decision::Fail { reason } = decide(&p, Some(FailureClass::Transient), &h, "a") else {
            panic!("expected a failure")
        };
        assert_eq!(reason, "transient: 4 transient failures, budget 3");
        // A hang is retried like a transient failure, on its budget.
        let mut h = hist(FailurePolicy::Strict);
        h.transient_failures = 1;
        assert_eq!(
            decide(&p, Some(FailureClass::Hung), &h, "a"),
            Decision::Retry {
                delay: Duration::from_secs(5),
                resume: true,
                more_resources: false
            }
        );
        h.transient_failures = 4;
        assert!(matches!(
            decide(&p, Some(FailureClass::Hung), &h, "a"),
            Decision::Fail { .. }
        ));
    }

    #[test]
    fn oom_retried_once_with_more_resources_only_where_allowed() {
        let mut h = hist(FailurePolicy::Strict);
        h.oom_failures = 1;
        assert_eq!(
            decide(&no_jitter(), Some(FailureClass::Oom), &h, "a"),
            Decision::Retry {
                delay: Duration::from_secs(5),
                resume: false,
                more_resources: true
            }
        );
        h.oom_failures = 2;
        assert!(matches!(
            decide(&no_jitter(), Some(FailureClass::Oom), &h, "a"),
            Decision::Fail { .. }
        ));
        h.oom_failures = 1;
        h.oom_retry_allowed = false;
        let Decision::Fail { reason } = decide(&no_jitter(), Some(FailureClass::Oom), &h, "a")
        else {
            panic!("expected a failure")
        };
        assert_eq!(
            reason,
            "oom: the stage does not allow a retry with more resources; retry it in place with \
             `puzzletron campaign retry DIR --allow-oom-retry STAGE` (finished stages stay \
             finished)"
        );
    }

    #[test]
    fn resumable_timeout_and_application_depend_on_policy_and_budget() {
        for c in [
            FailureClass::TimeoutResumable,
            FailureClass::Application,
            FailureClass::Unknown,
        ] {
            assert!(matches!(
                decide(&no_jitter(), Some(c), &hist(FailurePolicy::Strict), "a"),
                Decision::Fail { .. }
            ));
            let mut h = hist(FailurePolicy::Resume);
            assert_eq!(
                decide(&no_jitter(), Some(c), &h, "a"),
                Decision::Retry {
                    delay: Duration::from_secs(5),
                    resume: true,
                    more_resources: false
                }
            );
            h.counted_attempts = 3;
            assert!(matches!(
                decide(&no_jitter(), Some(c), &h, "a"),
                Decision::Fail { .. }
            ));
        }
    }

    #[test]
    fn fatal_classes_never_retry() {
        for c in [
            FailureClass::TimeoutFatal,
            FailureClass::Config,
            FailureClass::Cancelled,
            FailureClass::Expired,
        ] {
            for p in [FailurePolicy::Strict, FailurePolicy::Resume] {
                assert!(
                    matches!(
                        decide(&no_jitter(), Some(c), &hist(p), "a"),
                        Decision::Fail { .. }
                    ),
                    "{c}"
                );
            }
        }
    }
}
