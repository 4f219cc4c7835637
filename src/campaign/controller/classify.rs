//! Failure classification: which [`FailureClass`] a finished attempt belongs to, from all the
//! evidence (scheduler state, exit code and signal, the log tail, whether the controller itself
//! cancelled it), and whether a pending job is waiting normally or stuck.
//!
//! The rules, in order (the first that matches wins; sources in `shared/fixtures/slurm-cases.md`
//! C20–C25):
//! 1. `COMPLETED` is success, except when the log shows an oom-kill event (C21c,
//!    "Detected 1 oom_kill event"): then it is success only if the attempt left its success
//!    marker, else [`FailureClass::Oom`].
//! 2. The log says the job was cancelled `DUE TO TIME LIMIT`, or the state is `TIMEOUT` (C22):
//!    [`FailureClass::TimeoutResumable`] when the stage can resume, else
//!    [`FailureClass::TimeoutFatal`]; decided from state/log, never from the exit code.
//! 3. `OUT_OF_MEMORY` (C20), "CUDA out of memory"/`OutOfMemoryError` in the log (C21a), Slurm's
//!    "Exceeded job/step memory limit", or an exit 137 / SIGKILL together with an oom-kill line
//!    in the log: [`FailureClass::Oom`].
//! 4. `NODE_FAIL`, `BOOT_FAIL`, `PREEMPTED`, launch failures, and a cancel by root (uid 0) that
//!    the controller did not ask for while it runs as another user (a preemption), or a log
//!    `DUE TO PREEMPTION` / `DUE TO NODE FAILURE`: [`FailureClass::Transient`] (C23).
//! 5. `DEADLINE`: [`FailureClass::Expired`] (C25: expired, not failed).
//! 6. Any other cancel: [`FailureClass::Cancelled`].
//! 7. Exit code 2, or argparse/clap style argument errors in the log (`unrecognized arguments`,
//!    `error: the following arguments are required`, `invalid value ... for`, `Usage:` followed
//!    by `error:`): [`FailureClass::Config`].
//! 8. `FAILED` with another exit code: [`FailureClass::Application`].
//! 9. Everything else (`LOST`, SIGKILL without oom evidence — C21b "probable OOM" — unknown
//!    states): [`FailureClass::Unknown`], with the reason in [`Classification::detail`].

use serde::{Deserialize, Serialize};

use crate::executor::{JobState, JobStatus};

/// Why an attempt failed, as far as the evidence tells (DESIGN.md §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureClass {
    /// Out of memory, host (`OUT_OF_MEMORY`, oom-kill) or GPU ("CUDA out of memory").
    Oom,
    /// The infrastructure failed, not the job: node/boot failure, preemption, launch failure.
    Transient,
    /// Hit its time limit, and the stage can resume from a checkpoint.
    TimeoutResumable,
    /// Hit its time limit, and the stage cannot resume.
    TimeoutFatal,
    /// Bad arguments or configuration (exit 2, argument-parser errors).
    Config,
    /// Cancelled by a user (or by this controller).
    Cancelled,
    /// Could not start before its deadline (Slurm `DEADLINE`): expired, not failed.
    Expired,
    /// The program failed on its own (non-zero exit without other evidence).
    Application,
    /// Not enough evidence (lost job, SIGKILL without an oom trace, unknown state).
    Unknown,
}

impl FailureClass {
    /// Every class, in declaration order.
    pub const ALL: &'static [FailureClass] = &[
        FailureClass::Oom,
        FailureClass::Transient,
        FailureClass::TimeoutResumable,
        FailureClass::TimeoutFatal,
        FailureClass::Config,
        FailureClass::Cancelled,
        FailureClass::Expired,
        FailureClass::Application,
        FailureClass::Unknown,
    ];

    /// The snake_case name (`oom`, `timeout_resumable`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureClass::Oom => "oom",
            FailureClass::Transient => "transient",
            FailureClass::TimeoutResumable => "timeout_resumable",
            FailureClass::TimeoutFatal => "timeout_fatal",
            FailureClass::Config => "config",
            FailureClass::Cancelled => "cancelled",
            FailureClass::Expired => "expired",
            FailureClass::Application => "application",
            FailureClass::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for FailureClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an out-of-memory happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OomKind {
    /// Host memory (cgroup / kernel oom-killer).
    Host,
    /// GPU memory (a CUDA allocation failed).
    Gpu,
}

/// Everything known about a finished attempt, besides its [`JobStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evidence {
    /// The last part of the attempt's log (stdout+stderr), if readable.
    pub log_tail: String,
    /// The stage declares it can resume from a checkpoint.
    pub resumable: bool,
    /// The controller itself asked for this attempt to be cancelled.
    pub cancel_requested: bool,
    /// The uid the controller runs as (to tell a preemption by root from a user's cancel).
    pub own_uid: u32,
    /// Whether the attempt left its success marker: `None` when not checked.
    pub success_marker: Option<bool>,
}

/// The verdict on one finished attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Classification {
    /// `None` when the attempt succeeded.
    pub class: Option<FailureClass>,
    /// For [`FailureClass::Oom`]: host or GPU memory.
    pub oom: Option<OomKind>,
    /// A short human explanation naming the evidence used, e.g. `state OUT_OF_MEMORY`.
    pub detail: String,
}

impl Classification {
    fn success(detail: impl Into<String>) -> Self {
        Self {
            class: None,
            oom: None,
            detail: detail.into(),
        }
    }
    fn failed(class: FailureClass, detail: impl Into<String>) -> Self {
        Self {
            class: Some(class),
            oom: None,
            detail: detail.into(),
        }
    }
    fn oom(kind: OomKind, detail: impl Into<String>) -> Self {
        Self {
            class: Some(FailureClass::Oom),
            oom: Some(kind),
            detail: detail.into(),
        }
    }
}

const GPU_OOM: &[&str] = &[
    "cuda out of memory",
    "outofmemoryerror",
    "cuda error: out of memory",
    "cudaerrormemoryallocation",
];
const HOST_OOM: &[&str] = &[
    "oom_kill event",
    "oom-kill",
    "oom_kill",
    "out of memory: killed process",
    "exceeded job memory limit",
    "exceeded step memory limit",
];
const CONFIG_ERR: &[&str] = &[
    "unrecognized arguments",
    "error: the following arguments are required",
    "error: unexpected argument",
    "error: invalid value",
    "invalid choice:",
];

fn contains_any(hay: &str, needles: &[&'static str]) -> Option<&'static str> {
    needles.iter().find(|n| hay.contains(**n)).copied()
}

/// Classifies a terminal [`JobStatus`] with its [`Evidence`]. Non-terminal states are
/// classified as [`FailureClass::Unknown`] with a detail saying so (callers only pass terminal
/// ones). See the [module docs](self) for the rules and their order.
pub fn classify(status: &JobStatus, ev: &Evidence) -> Classification {
    let log = ev.log_tail.to_ascii_lowercase();
    let state = &status.state;
    let gpu_oom = contains_any(&log, GPU_OOM);
    let host_oom = contains_any(&log, HOST_OOM);
    // 1. completed, maybe with an oom-kill event behind it (C21c).
    if *state == JobState::Completed {
        return match (host_oom.or(gpu_oom), ev.success_marker) {
            (None, _) => Classification::success("completed"),
            (Some(_), Some(true)) => Classification::success(
                "completed; the log shows an oom-kill event but the success marker is present",
            ),
            (Some(m), _) => Classification::oom(
                OomKind::Host,
                format!(
                    "state COMPLETED but the log shows `{m}` and no success marker (suspect OOM)"
                ),
            ),
        };
    }
    if !state.is_terminal() {
        return Classification::failed(
            FailureClass::Unknown,
            format!("state {state} is not terminal"),
        );
    }
    // 2. time limit, from the state or Slurm's log line (C22).
    if *state == JobState::Timeout || log.contains("due to time limit") {
        let how = if *state == JobState::Timeout {
            "state TIMEOUT".to_string()
        } else {
            format!("state {state}, log says DUE TO TIME LIMIT")
        };
        return if ev.resumable {
            Classification::failed(
                FailureClass::TimeoutResumable,
                format!("{how}; the stage can resume"),
            )
        } else {
            Classification::failed(
                FailureClass::TimeoutFatal,
                format!("{how}; the stage cannot resume"),
            )
        };
    }
    // 3. out of memory (C20, C21a).
    if *state == JobState::OutOfMemory {
        return Classification::oom(OomKind::Host, "state OUT_OF_MEMORY");
    }
    if let Some(m) = gpu_oom {
        return Classification::oom(OomKind::Gpu, format!("state {state}, log shows `{m}`"));
    }
    let sigkill = status.signal == Some(9)
        || status.exit_code == Some(137)
        || matches!(state, JobState::Killed { signal: 9 });
    if let Some(m) = host_oom
        && (sigkill || matches!(state, JobState::Failed | JobState::Killed { .. }))
    {
        return Classification::oom(OomKind::Host, format!("state {state}, log shows `{m}`"));
    }
    // 4. infrastructure (C23, C24) and preemption seen as a cancel by root.
    match state {
        JobState::NodeFail | JobState::BootFail | JobState::Preempted | JobState::LaunchFailed => {
            return Classification::failed(
                FailureClass::Transient,
                format!(
                    "state {state}{}",
                    status
                        .nodes
                        .as_ref()
                        .map(|n| format!(" on {n}"))
                        .unwrap_or_default()
                ),
            );
        }
        _ => {}
    }
    if log.contains("due to preemption") || log.contains("due to node failure") {
        return Classification::failed(
            FailureClass::Transient,
            format!("state {state}, log says the job was preempted or its node failed"),
        );
    }
    if let JobState::Cancelled { by_uid } = state
        && !ev.cancel_requested
        && *by_uid == Some(0)
        && ev.own_uid != 0
    {
        return Classification::failed(
            FailureClass::Transient,
            "cancelled by root (uid 0) without a request from this controller: a preemption",
        );
    }
    // 5. deadline (C25).
    if *state == JobState::Deadline {
        return Classification::failed(
            FailureClass::Expired,
            "state DEADLINE: expired before it could run",
        );
    }
    // 6. cancels.
    if let JobState::Cancelled { by_uid } = state {
        let who = match (ev.cancel_requested, by_uid) {
            (true, _) => "by this controller".to_string(),
            (false, Some(u)) => format!("by uid {u}"),
            (false, None) => "by a user".to_string(),
        };
        return Classification::failed(FailureClass::Cancelled, format!("cancelled {who}"));
    }
    // 7. configuration errors.
    if status.exit_code == Some(2) && *state == JobState::Failed {
        return Classification::failed(
            FailureClass::Config,
            "exit code 2 (bad arguments or configuration)",
        );
    }
    if let Some(m) = contains_any(&log, CONFIG_ERR) {
        return Classification::failed(
            FailureClass::Config,
            format!("state {state}, log shows `{m}`"),
        );
    }
    // 8/9.
    match state {
        JobState::Failed => Classification::failed(
            FailureClass::Application,
            format!(
                "exit code {}",
                status
                    .exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "unknown".into())
            ),
        ),
        JobState::Killed { signal } if *signal == 9 => Classification::failed(
            FailureClass::Unknown,
            "killed by SIGKILL (signal 9) with no oom trace in the log: probable OOM",
        ),
        JobState::Killed { signal } => Classification::failed(
            FailureClass::Application,
            format!("killed by signal {signal}"),
        ),
        other => Classification::failed(FailureClass::Unknown, format!("state {other}")),
    }
}

/// What a pending reason means for a job that has not started (C25).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingVerdict {
    /// A normal wait (priority, resources, limits that free up): keep waiting, never resubmit.
    Wait,
    /// It will not start without someone acting; reported after the controller's
    /// `stuck_after` time, then failed with the given class.
    Stuck(FailureClass),
}

/// Judges a pending reason (Slurm's `%r`, see "Job Reason Codes").
///
/// Stuck: `DependencyNeverSatisfied`, `JobHeldAdmin`, `JobHeldUser`, `QOSMaxGRESPerJob`,
/// `PartitionTimeLimit`, `InvalidQOS`, `InvalidAccount`, `ReqNodeNotAvail` with `Down` nodes,
/// (all [`FailureClass::Config`]) and `launch failed requeued held` ([`FailureClass::Transient`]).
/// Everything else (`Priority`, `Resources`, `Dependency`, `QOSMaxGRESPerUser`,
/// `AssocGrpGRES`, `JobArrayTaskLimit`, `BeginTime`, unknown reasons) is a wait.
pub fn pending_verdict(reason: &str) -> PendingVerdict {
    let r = reason.trim();
    let lower = r.to_ascii_lowercase();
    if lower.contains("launch failed requeued held") {
        return PendingVerdict::Stuck(FailureClass::Transient);
    }
    const STUCK: &[&str] = &[
        "DependencyNeverSatisfied",
        "JobHeldAdmin",
        "JobHeldUser",
        "QOSMaxGRESPerJob",
        "PartitionTimeLimit",
        "InvalidQOS",
        "InvalidAccount",
        "PartitionNodeLimit",
        "QOSMaxWallDurationPerJobLimit",
    ];
    if STUCK.iter().any(|s| r.starts_with(s)) {
        PendingVerdict::Stuck(FailureClass::Config)
    } else {
        PendingVerdict::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::AttemptId;

    fn st(state: JobState) -> JobStatus {
        JobStatus::new(AttemptId::new("c.s.0.a1").unwrap(), state)
    }
    fn ev(log: &str) -> Evidence {
        Evidence {
            log_tail: log.into(),
            own_uid: 1000,
            ..Evidence::default()
        }
    }
    fn class(s: &JobStatus, e: &Evidence) -> Option<FailureClass> {
        classify(s, e).class
    }

    #[test]
    fn completed_is_success() {
        let c = classify(&st(JobState::Completed).with_exit_code(0), &ev("done\n"));
        assert_eq!(c.class, None);
        assert_eq!(c.detail, "completed");
    }

    #[test]
    fn c20_out_of_memory_state() {
        // 4711|OUT_OF_MEMORY|0:125
        let s = st(JobState::OutOfMemory).with_exit_code(0).with_signal(125);
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Host));
    }

    #[test]
    fn c21a_cuda_oom_behind_failed() {
        let s = st(JobState::Failed).with_exit_code(1);
        let c = classify(
            &s,
            &ev(
                "Traceback...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
            ),
        );
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Gpu));
    }

    #[test]
    fn c21b_exit_137_without_hint_is_probable_oom_not_oom() {
        let s = st(JobState::Killed { signal: 9 }).with_exit_code(137);
        let c = classify(&s, &ev("step 100\n"));
        assert_eq!(c.class, Some(FailureClass::Unknown));
        assert!(c.detail.contains("probable OOM"), "{}", c.detail);
        // FAILED|137:0 as Slurm reports it.
        let s = st(JobState::Failed).with_exit_code(137);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Application));
    }

    #[test]
    fn exit_137_with_oom_kill_is_oom() {
        let s = st(JobState::Failed).with_exit_code(137);
        let c = classify(&s, &ev("Out of memory: Killed process 4242 (python)\n"));
        assert_eq!(c.class, Some(FailureClass::Oom));
        assert_eq!(c.oom, Some(OomKind::Host));
    }

    #[test]
    fn c21c_completed_with_oom_kill_event_needs_the_marker() {
        let log = "slurmstepd: error: Detected 1 oom_kill event in StepId=4711.batch. Some of your processes may have been killed by the cgroup out-of-memory handler.\n";
        let s = st(JobState::Completed).with_exit_code(0);
        let mut e = ev(log);
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
        e.success_marker = Some(false);
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
        e.success_marker = Some(true);
        assert_eq!(class(&s, &e), None);
    }

    #[test]
    fn c22_timeout_by_state_and_by_log_not_exit_code() {
        let mut e =
            ev("*** JOB 4711 ON node01 CANCELLED AT 2024-01-01T10:00:00 DUE TO TIME LIMIT ***\n");
        let s = st(JobState::Timeout).with_exit_code(0).with_signal(15);
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutFatal));
        e.resumable = true;
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutResumable));
        // Reported as a user cancel, but the log says time limit.
        let s = st(JobState::Cancelled { by_uid: Some(0) });
        assert_eq!(class(&s, &e), Some(FailureClass::TimeoutResumable));
        // Exit 143 alone is not a timeout.
        let s = st(JobState::Failed).with_exit_code(143);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Application));
    }

    #[test]
    fn c23_node_and_boot_fail_are_transient() {
        let s = st(JobState::NodeFail)
            .with_exit_code(1)
            .with_nodes("node07");
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Transient));
        assert!(c.detail.contains("node07"), "{}", c.detail);
        let s = st(JobState::BootFail)
            .with_exit_code(0)
            .with_nodes("node08");
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
    }

    #[test]
    fn c24_preempted_and_requeue() {
        assert_eq!(
            class(&st(JobState::Preempted), &ev("")),
            Some(FailureClass::Transient)
        );
        // A requeued job is not terminal: nothing to classify as failed for good.
        let c = classify(&st(JobState::Requeued).with_restarts(3), &ev(""));
        assert!(c.detail.contains("not terminal"));
        // A final COMPLETED after three requeues is a success.
        assert_eq!(
            class(&st(JobState::Completed).with_restarts(3), &ev("")),
            None
        );
    }

    #[test]
    fn c25_deadline_is_expired_and_pending_reasons() {
        assert_eq!(
            class(&st(JobState::Deadline), &ev("")),
            Some(FailureClass::Expired)
        );
        for r in [
            "Priority",
            "Resources",
            "Dependency",
            "QOSMaxGRESPerUser",
            "AssocGrpGRES",
            "JobArrayTaskLimit",
            "BeginTime",
        ] {
            assert_eq!(pending_verdict(r), PendingVerdict::Wait, "{r}");
        }
        for r in [
            "DependencyNeverSatisfied",
            "JobHeldAdmin",
            "QOSMaxGRESPerJob",
            "PartitionTimeLimit",
            "InvalidQOS",
        ] {
            assert_eq!(
                pending_verdict(r),
                PendingVerdict::Stuck(FailureClass::Config),
                "{r}"
            );
        }
        assert_eq!(
            pending_verdict("launch failed requeued held"),
            PendingVerdict::Stuck(FailureClass::Transient)
        );
    }

    #[test]
    fn launch_failure_is_transient() {
        let s = st(JobState::LaunchFailed).with_reason("program not found: pythn");
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
    }

    #[test]
    fn cancel_by_root_unrequested_is_preemption_but_requested_is_cancel() {
        let s = st(JobState::Cancelled { by_uid: Some(0) });
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Transient));
        let mut e = ev("");
        e.cancel_requested = true;
        assert_eq!(class(&s, &e), Some(FailureClass::Cancelled));
        // When we run as root ourselves a cancel by root cannot be told from a user's.
        let mut e = ev("");
        e.own_uid = 0;
        assert_eq!(class(&s, &e), Some(FailureClass::Cancelled));
        let s = st(JobState::Cancelled {
            by_uid: Some(12345),
        });
        let c = classify(&s, &ev(""));
        assert_eq!(c.class, Some(FailureClass::Cancelled));
        assert_eq!(c.detail, "cancelled by uid 12345");
        // Slurm's log line for a preemption.
        let s = st(JobState::Cancelled { by_uid: None });
        let e = ev(
            "slurmstepd: error: *** JOB 4711 ON n1 CANCELLED AT 2024-01-01T10:00:00 DUE TO PREEMPTION ***",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Transient));
    }

    #[test]
    fn config_errors_by_exit_2_and_by_log() {
        let s = st(JobState::Failed).with_exit_code(2);
        assert_eq!(class(&s, &ev("")), Some(FailureClass::Config));
        let s = st(JobState::Failed).with_exit_code(1);
        let e = ev(
            "usage: train.py [-h] --lr LR\ntrain.py: error: unrecognized arguments: --lrr 0.1\n",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Config));
        let e = ev(
            "error: invalid value 'abc' for '--epochs <EPOCHS>': invalid digit found in string\n",
        );
        assert_eq!(class(&s, &e), Some(FailureClass::Config));
    }

    #[test]
    fn application_unknown_and_other_signals() {
        let s = st(JobState::Failed).with_exit_code(1);
        let c = classify(&s, &ev("ValueError: nan loss\n"));
        assert_eq!(c.class, Some(FailureClass::Application));
        assert_eq!(c.detail, "exit code 1");
        assert_eq!(
            class(&st(JobState::Killed { signal: 11 }), &ev("")),
            Some(FailureClass::Application)
        );
        assert_eq!(
            class(&st(JobState::Lost), &ev("")),
            Some(FailureClass::Unknown)
        );
    }

    #[test]
    fn exceeded_step_memory_limit_is_oom() {
        let s = st(JobState::Failed).with_exit_code(1);
        let e = ev("slurmstepd: error: Exceeded step memory limit at some point.\n");
        assert_eq!(class(&s, &e), Some(FailureClass::Oom));
    }

    #[test]
    fn class_names_roundtrip_serde() {
        for c in FailureClass::ALL {
            let j = serde_json::to_string(c).unwrap();
            assert_eq!(j, format!("\"{}\"", c.as_str()));
            let back: FailureClass = serde_json::from_str(&j).unwrap();
            assert_eq!(back, *c);
        }
    }
}
