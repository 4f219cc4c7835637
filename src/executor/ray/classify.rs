//! A Ray job's `status`, `error_type`, `message` and `driver_exit_code` as a [`JobState`].
//!
//! | Ray | puzzletron |
//! | --- | --- |
//! | `PENDING` | `Pending` (reason: Ray's message) |
//! | `RUNNING` | `Running` |
//! | `SUCCEEDED` | `Completed`, exit 0 |
//! | `STOPPED` | `Cancelled` |
//! | `FAILED`, `JOB_ENTRYPOINT_COMMAND_ERROR` | `Failed` with `driver_exit_code`; `Killed` for a negative code (a signal); `Timeout` for 124 or 137 (`timeout`'s codes) from a job with a walltime that ran at least that long |
//! | `FAILED`, message or logs with Ray's memory monitor (`OutOfMemoryError`, "running low on memory") | `OutOfMemory` |
//! | `FAILED`, `RUNTIME_ENV_SETUP_FAILURE`, `JOB_ENTRYPOINT_COMMAND_START_ERROR`, `JOB_SUPERVISOR_ACTOR_START_FAILURE`, `JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE`, `JOB_SUPERVISOR_ACTOR_START_TIMEOUT` | `LaunchFailed` (never ran) |
//! | `FAILED`, `JOB_SUPERVISOR_ACTOR_DIED`, `JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE` | `NodeFail` (the node or its supervisor died under the job) |
//! | `FAILED`, no or another `error_type` | `Failed` (exit code when Ray gives one) |
//! | another status | `Unknown` (re-polled) |

use std::time::Duration;

use super::api::JobInfo;
use crate::executor::JobState;

/// Texts of Ray's memory monitor in a job's message or logs: the task or actor it killed
/// raised `ray.exceptions.OutOfMemoryError` in the driver.
pub(crate) const OOM_MARKERS: &[&str] = &[
    "OutOfMemoryError",
    "Task was killed due to the node running low on memory",
    "node running low on memory",
];

/// What one Ray job's record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
}

/// Whether `text` shows a kill by Ray's memory monitor.
pub(crate) fn is_oom(text: &str) -> bool {
    OOM_MARKERS.iter().any(|m| text.contains(m))
}

/// The state of a job whose walltime is `walltime` (from its metadata), as its record says.
pub(crate) fn classify(info: &JobInfo, walltime: Option<Duration>) -> Verdict {
    let message = info.message.clone().filter(|m| !m.is_empty());
    let short = message.as_deref().map(short_reason);
    let ran_past_walltime = match (walltime, info.start_time, info.end_time) {
        (Some(w), Some(s), Some(e)) => e.saturating_sub(s) >= w.as_millis() as u64,
        _ => false,
    };
    let code = info
        .driver_exit_code
        .map(|c| c.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
        .or_else(|| message.as_deref().and_then(exit_code_in_message));
    let v = |state: JobState| Verdict {
        state,
        exit_code: None,
        signal: None,
        reason: short.clone(),
    };
    match info.status.as_deref().unwrap_or("") {
        "PENDING" => v(JobState::Pending),
        "RUNNING" => v(JobState::Running),
        "SUCCEEDED" => Verdict {
            exit_code: Some(0),
            reason: None,
            ..v(JobState::Completed)
        },
        "STOPPED" => v(JobState::Cancelled { by_uid: None }),
        "FAILED" => {
            if message.as_deref().is_some_and(is_oom) {
                return Verdict {
                    exit_code: code,
                    ..v(JobState::OutOfMemory)
                };
            }
            match info.error_type.as_deref() {
                Some(
                    "RUNTIME_ENV_SETUP_FAILURE"
                    | "JOB_ENTRYPOINT_COMMAND_START_ERROR"
                    | "JOB_SUPERVISOR_ACTOR_START_FAILURE"
                    | "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"
                    | "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
                ) => v(JobState::LaunchFailed),
                Some("JOB_SUPERVISOR_ACTOR_DIED" | "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE") => {
                    v(JobState::NodeFail)
                }
                _ if ran_past_walltime && matches!(code, Some(124 | 137)) => Verdict {
                    exit_code: code,
                    reason: Some("ended at its walltime".into()),
                    ..v(JobState::Timeout)
                },
                _ => match code {
                    Some(c) if c < 0 => Verdict {
                        signal: Some(-c),
                        ..v(JobState::Killed { signal: -c })
                    },
                    Some(c) => Verdict {
                        exit_code: Some(c),
                        ..v(JobState::Failed)
                    },
                    None => v(JobState::Failed),
                },
            }
        }
        other => v(JobState::Unknown {
            raw: other.to_string(),
        }),
    }
}

/// `N` of Ray's "Job entrypoint command failed with exit code N" (older Rays have no
/// `driver_exit_code`).
fn exit_code_in_message(m: &str) -> Option<i32> {
    let rest = &m[m.find("exit code ")? + "exit code ".len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Ray's message without the logs it appends (they go to the attempt's log file).
fn short_reason(m: &str) -> String {
    let first = m.split(", last available logs").next().unwrap_or(m);
    let first = first.lines().next().unwrap_or(first);
    first.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(status: &str, error_type: Option<&str>, code: Option<i64>, message: &str) -> JobInfo {
        JobInfo {
            status: Some(status.into()),
            error_type: error_type.map(Into::into),
            driver_exit_code: code,
            message: Some(message.into()),
            start_time: Some(1_000),
            end_time: Some(2_000),
            ..JobInfo::default()
        }
    }

    /// Every `error_type` of Ray 2.60's `JobErrorType`, and the statuses, to their class.
    #[test]
    fn error_types_map_to_classes() {
        let entry = "Job entrypoint command failed with exit code 3, last available logs \
                     (truncated to 20,000 chars):\nboom\n";
        let table: &[(JobInfo, JobState, Option<i32>)] = &[
            (
                job("PENDING", None, None, "waiting for resources"),
                JobState::Pending,
                None,
            ),
            (job("RUNNING", None, None, ""), JobState::Running, None),
            (
                job("SUCCEEDED", None, Some(0), "Job finished successfully."),
                JobState::Completed,
                Some(0),
            ),
            (
                job("STOPPED", None, None, "Job was intentionally stopped."),
                JobState::Cancelled { by_uid: None },
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
                    Some(3),
                    entry,
                ),
                JobState::Failed,
                Some(3),
            ),
            // Older Rays: the code only in the message.
            (
                job("FAILED", Some("JOB_ENTRYPOINT_COMMAND_ERROR"), None, entry),
                JobState::Failed,
                Some(3),
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
                    Some(-9),
                    "killed",
                ),
                JobState::Killed { signal: 9 },
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
                    Some(1),
                    "Job entrypoint command failed with exit code 1, last available logs:\n\
                     ray.exceptions.OutOfMemoryError: Task was killed due to the node running \
                     low on memory.\n",
                ),
                JobState::OutOfMemory,
                Some(1),
            ),
            (
                job(
                    "FAILED",
                    Some("RUNTIME_ENV_SETUP_FAILURE"),
                    None,
                    "pip failed",
                ),
                JobState::LaunchFailed,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_ENTRYPOINT_COMMAND_START_ERROR"),
                    None,
                    "x",
                ),
                JobState::LaunchFailed,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_SUPERVISOR_ACTOR_START_FAILURE"),
                    None,
                    "x",
                ),
                JobState::LaunchFailed,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE"),
                    None,
                    "x",
                ),
                JobState::LaunchFailed,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_SUPERVISOR_ACTOR_START_TIMEOUT"),
                    None,
                    "x",
                ),
                JobState::LaunchFailed,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_SUPERVISOR_ACTOR_DIED"),
                    None,
                    "node died",
                ),
                JobState::NodeFail,
                None,
            ),
            (
                job(
                    "FAILED",
                    Some("JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE"),
                    None,
                    "?",
                ),
                JobState::NodeFail,
                None,
            ),
            (
                job("FAILED", None, None, "Unexpected error"),
                JobState::Failed,
                None,
            ),
            (
                job("SOMETHING_NEW", None, None, ""),
                JobState::Unknown {
                    raw: "SOMETHING_NEW".into(),
                },
                None,
            ),
        ];
        for (info, state, code) in table {
            let got = classify(info, None);
            assert_eq!(
                (&got.state, got.exit_code),
                (state, *code),
                "{:?} / {:?} / {:?}",
                info.status,
                info.error_type,
                info.driver_exit_code
            );
        }
    }

    #[test]
    fn walltime_turns_timeout_exits_past_it_into_timeouts() {
        let w = Some(Duration::from_millis(1_000));
        // A cancel stays a cancel, however long the job ran.
        let stopped = job("STOPPED", None, None, "Job was intentionally stopped.");
        assert_eq!(
            classify(&stopped, w).state,
            JobState::Cancelled { by_uid: None }
        );
        for code in [124, 137] {
            let failed = job(
                "FAILED",
                Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
                Some(code),
                "x",
            );
            assert_eq!(classify(&failed, w).state, JobState::Timeout, "{code}");
            // No walltime, or ended before it: the command's own exit code.
            assert_eq!(classify(&failed, None).state, JobState::Failed);
            let early = JobInfo {
                end_time: Some(1_500),
                ..failed.clone()
            };
            assert_eq!(classify(&early, w).state, JobState::Failed);
        }
        // Another exit code past the walltime is the command's failure.
        let other = job("FAILED", Some("JOB_ENTRYPOINT_COMMAND_ERROR"), Some(3), "x");
        assert_eq!(classify(&other, w).state, JobState::Failed);
        // A success is a success, walltime or not.
        let ok = job("SUCCEEDED", None, Some(0), "");
        assert_eq!(classify(&ok, w).state, JobState::Completed);
    }

    #[test]
    fn reason_drops_the_appended_logs() {
        let v = classify(
            &job(
                "FAILED",
                Some("JOB_ENTRYPOINT_COMMAND_ERROR"),
                Some(2),
                "Job entrypoint command failed with exit code 2, last available logs (truncated \
                 to 20,000 chars):\nsecret output\n",
            ),
            None,
        );
        assert_eq!(
            v.reason.as_deref(),
            Some("Job entrypoint command failed with exit code 2")
        );
    }
}
