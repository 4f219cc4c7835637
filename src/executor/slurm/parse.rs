//! Parsers for what `sbatch`, `squeue` and `sacct` print, and the mapping of Slurm states to
//! [`JobState`]. Pure functions over text, table-tested against real output forms
//! (`executor/slurm/parse_tests.rs`, cases C01–C19 of `docs/evidence.md`).
//!
//! Conventions of the executor's own calls, which these parsers expect:
//! - `sbatch --parsable` (stdout `ID` or `ID;cluster`; banners and human forms tolerated);
//! - `squeue -h -t all -o '%i|%T|%r|%N'` (job id, long state, reason, nodes);
//! - `sacct -n -P -D -o JobID,State,ExitCode,NodeList,Start,End` (`--parsable2`: `|`-separated,
//!   no trailing `|`; `-D`: every requeue as its own row, oldest first).
//!
//! User-controlled text (job names) is never part of a parsed row, so a `|` in it cannot shift
//! fields (C06).

use std::collections::BTreeMap;
use std::fmt;

use crate::executor::{ExecutorError, JobState};

/// A job as Slurm names it: `4711`, `4711_3` (array task), `21+1` (heterogeneous component),
/// optionally on a named cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub(crate) struct JobRef {
    /// The job id (for an array task: the array's job id, `%A`).
    pub id: u64,
    /// The array task index (`%a`).
    pub array_task: Option<u32>,
    /// The heterogeneous-job component (`+N`).
    pub het_component: Option<u32>,
    /// The cluster from `sbatch --parsable` `ID;cluster`, used as `-M` later (C01).
    pub cluster: Option<String>,
}

impl JobRef {
    /// A plain job id.
    pub(crate) fn new(id: u64) -> Self {
        Self {
            id,
            array_task: None,
            het_component: None,
            cluster: None,
        }
    }

    /// The array task `task` of job `id`.
    pub(crate) fn task(id: u64, task: u32) -> Self {
        Self {
            array_task: Some(task),
            ..Self::new(id)
        }
    }

    /// Sets the heterogeneous-job component (`+N`).
    #[cfg(test)]
    pub(crate) fn with_het_component(mut self, component: u32) -> Self {
        self.het_component = Some(component);
        self
    }

    /// Sets the cluster (used as `-M`).
    #[cfg(test)]
    pub(crate) fn with_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.id)?;
        if let Some(t) = self.array_task {
            write!(f, "_{t}")?;
        }
        if let Some(c) = self.het_component {
            write!(f, "+{c}")?;
        }
        Ok(())
    }
}

fn parse_error(command: &str, detail: impl Into<String>, output: &str) -> ExecutorError {
    ExecutorError::Parse {
        command: command.into(),
        detail: detail.into(),
        output: output.into(),
    }
}

// ------------------------------------------------------------------------------------------
// sbatch
// ------------------------------------------------------------------------------------------

/// The job id in the output of a **successful** `sbatch` (exit code 0).
///
/// Accepts, scanning stdout from the last line up (C01–C03): `ID`, `ID;cluster` (the
/// `--parsable` forms), `Submitted batch job ID`, `Submitted batch job ID on cluster NAME`.
/// Banner lines (`INFO: ...`) are skipped. Success itself is decided by the exit code, not by
/// stderr, which callers keep as a warning.
///
/// # Errors
/// [`ExecutorError::Parse`] with the whole stdout and stderr when no line has a job id; never
/// returns a non-numeric id.
pub(crate) fn parse_sbatch(stdout: &str, stderr: &str) -> Result<JobRef, ExecutorError> {
    for line in stdout.lines().rev() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // `ID` or `ID;cluster`
        let (id_part, cluster) = match line.split_once(';') {
            Some((i, c)) => (i, Some(c)),
            None => (line, None),
        };
        if !id_part.is_empty()
            && id_part.bytes().all(|b| b.is_ascii_digit())
            && cluster.is_none_or(|c| !c.is_empty() && !c.contains(char::is_whitespace))
            && let Ok(id) = id_part.parse()
        {
            return Ok(JobRef {
                cluster: cluster.map(String::from),
                ..JobRef::new(id)
            });
        }
        if let Some(rest) = line.strip_prefix("Submitted batch job ") {
            let mut words = rest.split_whitespace();
            let id = words.next().and_then(|w| w.parse::<u64>().ok());
            let cluster = match (words.next(), words.next(), words.next()) {
                (Some("on"), Some("cluster"), Some(c)) => Some(c.to_string()),
                _ => None,
            };
            if let Some(id) = id {
                return Ok(JobRef {
                    cluster,
                    ..JobRef::new(id)
                });
            }
        }
    }
    Err(parse_error(
        "sbatch --parsable",
        "no job id (expected a last line `ID`, `ID;cluster` or `Submitted batch job ID`)",
        &format!("stdout: {stdout:?}; stderr: {stderr:?}"),
    ))
}

/// What a failed Slurm command's stderr means for the caller (C05, C15, C16, C18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ErrorClass {
    /// The controller is busy or unreachable: retry with backoff and jitter. For `sbatch`,
    /// the job may or may not exist: look it up by name before retrying.
    Transient,
    /// A submit limit was reached (`QOSMaxSubmitJobPerUserLimit`): pause submitting.
    Throttle,
    /// `Invalid job id specified` (or `Invalid job id: N` for an id above the cluster's range):
    /// the job is not (or no longer) known to `squeue`/`scontrol`;
    /// ask `sacct`.
    InvalidJobId,
    /// Accounting is off: `sacct` cannot work on this cluster.
    AccountingDisabled,
    /// Accounting is on but slurmdbd cannot be reached (N02: `Problem talking to the
    /// database`, `slurm_persist_conn_open…: Connection refused`, `slurmdbd: Unknown error
    /// 1021`): transient, and distinct from an overloaded slurmctld (squeue still works) and
    /// from accounting disabled (it will come back). Jobs that left squeue wait as "finished,
    /// accounting pending"; they are never failed, lost or resubmitted because of it.
    AccountingUnavailable,
    /// Anything else: retrying will not help (unknown text is fatal by policy, C05).
    Fatal,
}

/// Classifies the stderr of a failed `sbatch`/`squeue`/`sacct`/`scancel`.
pub(crate) fn classify_error(stderr: &str) -> ErrorClass {
    const TRANSIENT: &[&str] = &[
        "socket timed out",
        "unexpected message received",
        "temporarily unable to accept job",
        "unable to contact slurm controller",
        "connection refused",
        "connection reset",
        "transport endpoint is not connected",
        "zero bytes were transmitted",
        "resource temporarily unavailable",
        "controller is not responding",
        "communication connection failure",
        "slurmctld is busy",
        "timed out",
    ];
    const THROTTLE: &[&str] = &[
        "qosmaxsubmitjobperuserlimit",
        "assocmaxsubmitjoblimit",
        "maxsubmitjobs",
    ];
    // slurmdbd (not slurmctld) is the one that does not answer.
    const ACCOUNTING_DOWN: &[&str] = &[
        "problem talking to the database",
        "slurm_persist_conn_open",
        "persistent connection to host",
        "slurmdbd: unknown error",
        "unknown error 1021",
    ];
    let s = stderr.to_ascii_lowercase();
    if s.contains("invalid job id") {
        ErrorClass::InvalidJobId
    } else if s.contains("accounting storage is disabled") {
        ErrorClass::AccountingDisabled
    } else if ACCOUNTING_DOWN.iter().any(|p| s.contains(p)) {
        ErrorClass::AccountingUnavailable
    } else if THROTTLE.iter().any(|p| s.contains(p)) {
        ErrorClass::Throttle
    } else if TRANSIENT.iter().any(|p| s.contains(p)) || s.contains("slurm_load_jobs error") {
        // "slurm_load_jobs error: <transient reason>" is transient; with "Invalid job id" it
        // was caught above.
        ErrorClass::Transient
    } else {
        ErrorClass::Fatal
    }
}

// ------------------------------------------------------------------------------------------
// states and exit codes
// ------------------------------------------------------------------------------------------

/// Maps a Slurm state, long (`RUNNING`) or short (`R`), possibly `+`-truncated (`CANCELLED+`,
/// C08) or with the cancelling uid (`CANCELLED by 12345`, C07), to a [`JobState`].
///
/// | Slurm | `JobState` |
/// | --- | --- |
/// | `PENDING PD`, `CONFIGURING CF`, `REQUEUE_HOLD RH`, `RESV_DEL_HOLD RD` | `Pending` |
/// | `RUNNING R`, `RESIZING RS` | `Running` |
/// | `COMPLETING CG`, `STAGE_OUT SO`, `SIGNALING SI` | `Completing` (not terminal) |
/// | `SUSPENDED S`, `STOPPED ST` | `Suspended` |
/// | `REQUEUED RQ`, `REQUEUE_FED RF` | `Requeued` |
/// | `COMPLETED CD` | `Completed` |
/// | `FAILED F`, `SPECIAL_EXIT SE` | `Failed` |
/// | `CANCELLED CA`, `CANCELLED by N` | `Cancelled { by_uid }` |
/// | `TIMEOUT TO` | `Timeout` |
/// | `OUT_OF_MEMORY OOM` | `OutOfMemory` |
/// | `NODE_FAIL NF` | `NodeFail` |
/// | `PREEMPTED PR` | `Preempted` |
/// | `BOOT_FAIL BF` | `BootFail` |
/// | `DEADLINE DL` | `Deadline` |
/// | anything else (e.g. `REVOKED`, `FOO`) | `Unknown { raw }` (not terminal, re-polled) |
///
/// Source: Slurm `squeue(1)` "JOB STATE CODES" and `sacct(1)` "JOB STATE CODES" (22.05).
pub(crate) fn map_state(raw: &str) -> JobState {
    let t = raw.trim();
    let truncated = t.ends_with('+');
    let s = t.trim_end_matches('+').trim();
    if let Some(rest) = s.strip_prefix("CANCELLED") {
        let by_uid = rest
            .trim()
            .strip_prefix("by")
            .and_then(|u| u.trim().parse::<u32>().ok());
        return JobState::Cancelled { by_uid };
    }
    const TABLE: &[(&str, &str)] = &[
        ("PENDING", "PD"),
        ("CONFIGURING", "CF"),
        ("REQUEUE_HOLD", "RH"),
        ("RESV_DEL_HOLD", "RD"),
        ("RUNNING", "R"),
        ("RESIZING", "RS"),
        ("COMPLETING", "CG"),
        ("STAGE_OUT", "SO"),
        ("SIGNALING", "SI"),
        ("SUSPENDED", "S"),
        ("STOPPED", "ST"),
        ("REQUEUED", "RQ"),
        ("REQUEUE_FED", "RF"),
        ("COMPLETED", "CD"),
        ("FAILED", "F"),
        ("SPECIAL_EXIT", "SE"),
        ("CANCELLED", "CA"),
        ("TIMEOUT", "TO"),
        ("OUT_OF_MEMORY", "OOM"),
        ("NODE_FAIL", "NF"),
        ("PREEMPTED", "PR"),
        ("BOOT_FAIL", "BF"),
        ("DEADLINE", "DL"),
    ];
    let long = TABLE
        .iter()
        .find(|(l, sh)| *l == s || *sh == s)
        .map(|(l, _)| *l)
        .or_else(|| {
            // A truncated long name: accept it when exactly one state starts with it.
            if !truncated || s.is_empty() {
                return None;
            }
            let mut hits = TABLE.iter().filter(|(l, _)| l.starts_with(s));
            match (hits.next(), hits.next()) {
                (Some((l, _)), None) => Some(*l),
                _ => None,
            }
        });
    match long {
        Some("PENDING" | "CONFIGURING" | "REQUEUE_HOLD" | "RESV_DEL_HOLD") => JobState::Pending,
        Some("RUNNING" | "RESIZING") => JobState::Running,
        Some("COMPLETING" | "STAGE_OUT" | "SIGNALING") => JobState::Completing,
        Some("SUSPENDED" | "STOPPED") => JobState::Suspended,
        Some("REQUEUED" | "REQUEUE_FED") => JobState::Requeued,
        Some("COMPLETED") => JobState::Completed,
        Some("FAILED" | "SPECIAL_EXIT") => JobState::Failed,
        Some("CANCELLED") => JobState::Cancelled { by_uid: None },
        Some("TIMEOUT") => JobState::Timeout,
        Some("OUT_OF_MEMORY") => JobState::OutOfMemory,
        Some("NODE_FAIL") => JobState::NodeFail,
        Some("PREEMPTED") => JobState::Preempted,
        Some("BOOT_FAIL") => JobState::BootFail,
        Some("DEADLINE") => JobState::Deadline,
        _ => JobState::Unknown { raw: t.to_string() },
    }
}

/// A parsed `ExitCode` field `N:S` (C10): the exit code (8-bit) and the terminating signal
/// (`None` when 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct ExitCode {
    /// The exit status, 0–255.
    pub code: i32,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
}

impl ExitCode {
    /// A note for codes that usually mean a signal reached the job through a shell
    /// (`128 + N`, e.g. 137 = SIGKILL, often the OOM killer).
    pub(crate) fn note(&self) -> Option<String> {
        match self.code {
            137 => Some("exit 137: likely SIGKILL (often the OOM killer)".into()),
            143 => Some("exit 143: likely SIGTERM".into()),
            c if c > 128 && c < 160 => Some(format!("exit {c}: likely signal {}", c - 128)),
            _ => None,
        }
    }
}

/// Parses `N:S`; `Ok(None)` for an empty field.
///
/// # Errors
/// [`ExecutorError::Parse`] for anything but two unsigned integers separated by `:`.
pub(crate) fn parse_exit_code(field: &str) -> Result<Option<ExitCode>, ExecutorError> {
    let f = field.trim();
    if f.is_empty() {
        return Ok(None);
    }
    let bad = || parse_error("sacct", "ExitCode must be `N:S` (two unsigned integers)", f);
    let (n, s) = f.split_once(':').ok_or_else(bad)?;
    let code: u32 = n.parse().map_err(|_| bad())?;
    let sig: u32 = s.parse().map_err(|_| bad())?;
    if code > 255 {
        return Err(bad());
    }
    Ok(Some(ExitCode {
        code: code as i32,
        signal: (sig != 0).then_some(sig as i32),
    }))
}

// ------------------------------------------------------------------------------------------
// ids
// ------------------------------------------------------------------------------------------

/// One id field as `squeue`/`sacct` print it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum IdField {
    /// One job, array task or het component, with the step suffix (`batch`, `extern`, `0`)
    /// when the row is a step.
    One {
        /// The job.
        job: JobRef,
        /// The step, for step rows.
        step: Option<String>,
    },
    /// Pending array tasks not yet split off: `5000_[3-10%2]` or `5000_[1,4-6]` (C11).
    PendingArray {
        /// The array's job id.
        id: u64,
        /// Every task index listed.
        tasks: Vec<u32>,
        /// The `%N` limit of concurrently running tasks.
        max_running: Option<u32>,
    },
}

/// Parses a job id field: `4711`, `4711.batch`, `4711_3`, `4711_3.0`, `21+1`, `21+0.batch`,
/// `5000_[3-10%2]`.
///
/// # Errors
/// [`ExecutorError::Parse`] for anything else, including `+`-truncated ids like `4711.ba+`
/// (C08).
pub(crate) fn parse_id_field(field: &str) -> Result<IdField, ExecutorError> {
    let f = field.trim();
    let bad = |why: &str| parse_error("squeue/sacct", format!("bad job id: {why}"), f);
    if f.ends_with('+') {
        return Err(bad("truncated (ends with '+'); request --parsable2 output"));
    }
    let (main, step) = match f.split_once('.') {
        Some((m, s)) if !s.is_empty() => (m, Some(s.to_string())),
        Some(_) => return Err(bad("empty step")),
        None => (f, None),
    };
    if let Some(step) = &step
        && !step
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(bad("step must be alphanumeric (batch, extern, 0, ...)"));
    }
    let num = |s: &str| -> Result<u64, ExecutorError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("expected digits"));
        }
        s.parse().map_err(|_| bad("number too large"))
    };
    if let Some((id, het)) = main.split_once('+') {
        let job = JobRef {
            het_component: Some(num(het)? as u32),
            ..JobRef::new(num(id)?)
        };
        return Ok(IdField::One { job, step });
    }
    if let Some((id, task)) = main.split_once('_') {
        let id = num(id)?;
        if let Some(inner) = task.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
            if step.is_some() {
                return Err(bad("a pending task range has no steps"));
            }
            let (list, max) = match inner.split_once('%') {
                Some((l, m)) => (l, Some(num(m)? as u32)),
                None => (inner, None),
            };
            let mut tasks = Vec::new();
            for part in list.split(',') {
                match part.split_once('-') {
                    Some((a, b)) => {
                        let (a, b) = (num(a)? as u32, num(b)? as u32);
                        if a > b || b - a > 1_000_000 {
                            return Err(bad("bad task range"));
                        }
                        tasks.extend(a..=b);
                    }
                    None => tasks.push(num(part)? as u32),
                }
            }
            return Ok(IdField::PendingArray {
                id,
                tasks,
                max_running: max,
            });
        }
        return Ok(IdField::One {
            job: JobRef::task(id, num(task)? as u32),
            step,
        });
    }
    Ok(IdField::One {
        job: JobRef::new(num(main)?),
        step,
    })
}

// ------------------------------------------------------------------------------------------
// squeue
// ------------------------------------------------------------------------------------------

/// One job (or pending array task) as `squeue` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct SqueueRow {
    /// The job.
    pub job: JobRef,
    /// Its state.
    pub state: JobState,
    /// The reason field (`Priority`, `Resources`, `None`, ...); `None` when empty or `None`.
    pub reason: Option<String>,
    /// The node list (`%N`), when non-empty.
    pub nodes: Option<String>,
    /// For tasks expanded from a pending range: the range's `%N` limit.
    pub max_running: Option<u32>,
}

/// Parses `squeue -h -o '%i|%T|%r|%N'` output (the last two fields optional). Pending array
/// ranges are expanded into one row per task (C11).
///
/// # Errors
/// [`ExecutorError::Parse`] naming the line for a row with too few fields or a bad id.
pub(crate) fn parse_squeue(stdout: &str) -> Result<Vec<SqueueRow>, ExecutorError> {
    let mut rows = Vec::new();
    for (n, line) in stdout.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.splitn(4, '|').collect();
        if fields.len() < 2 {
            return Err(parse_error(
                "squeue",
                format!("line {}: expected `id|state[|reason|nodes]`", n + 1),
                line,
            ));
        }
        let state = map_state(fields[1]);
        let reason = fields
            .get(2)
            .map(|r| r.trim())
            .filter(|r| !r.is_empty() && *r != "None" && *r != "(null)")
            .map(String::from);
        let nodes = fields
            .get(3)
            .map(|r| r.trim())
            .filter(|r| !r.is_empty() && *r != "(null)")
            .map(String::from);
        match parse_id_field(fields[0]).map_err(|e| match e {
            ExecutorError::Parse { detail, .. } => {
                parse_error("squeue", format!("line {}: {detail}", n + 1), line)
            }
            other => other,
        })? {
            IdField::One { job, step: None } => rows.push(SqueueRow {
                job,
                state,
                reason,
                nodes,
                max_running: None,
            }),
            IdField::One { step: Some(_), .. } => {} // squeue -s step rows: not ours
            IdField::PendingArray {
                id,
                tasks,
                max_running,
            } => rows.extend(tasks.into_iter().map(|t| SqueueRow {
                job: JobRef::task(id, t),
                state: state.clone(),
                reason: reason.clone(),
                nodes: None,
                max_running,
            })),
        }
    }
    Ok(rows)
}

// ------------------------------------------------------------------------------------------
// sacct
// ------------------------------------------------------------------------------------------

/// A step of a job as `sacct` shows it (`4711.batch`, `4711.extern`, `4711.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct StepRecord {
    /// Its state.
    pub state: JobState,
    /// Its exit code.
    pub exit: Option<ExitCode>,
}

/// A job's accounting record, steps folded in (C09), requeues counted (C24).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct SacctRecord {
    /// The job.
    pub job: JobRef,
    /// The state of the allocation row (the newest one, with `-D`).
    pub state: JobState,
    /// The raw state text.
    pub raw_state: String,
    /// The allocation's `ExitCode`.
    pub exit: Option<ExitCode>,
    /// Steps by name (`batch`, `extern`, `0`, ...), from the newest run.
    pub steps: BTreeMap<String, StepRecord>,
    /// How many earlier runs ended `REQUEUED` (or preempted and requeued) under this id.
    pub restarts: u32,
    /// `NodeList`, when given and not `None assigned`.
    pub nodes: Option<String>,
    /// `Start`, when given and not `Unknown`/`None`.
    pub start: Option<String>,
    /// `End`, when given and not `Unknown`/`None`.
    pub end: Option<String>,
    /// `Submit` (local time `YYYY-MM-DDTHH:MM:SS`), when given.
    pub submit: Option<String>,
    /// `JobName` of the allocation row, when given (always the last field: it is
    /// user-controlled and may contain `|`).
    pub name: Option<String>,
}

/// The fields of one `sacct` allocation row that tell whose job it is, for
/// [`parse_sacct_for`]'s filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct RowIdentity<'a> {
    /// The job.
    pub job: &'a JobRef,
    /// `Submit`, when the row has it.
    pub submit: Option<&'a str>,
    /// `JobName`, when the row has it.
    pub name: Option<&'a str>,
}

/// The `sacct` fields the executor's poll asks for, in order: user-controlled `JobName` last.
pub(crate) const SACCT_POLL_FIELDS: &str = "JobID,State,ExitCode,NodeList,Start,End,Submit,JobName";

/// Parses `sacct -n -P [-D] -o JobID,State,ExitCode[,NodeList,Start,End]` output into one
/// record per job (array task, het component), in order of first appearance. With `-D`, the
/// newest row of a job wins and earlier `REQUEUED`/`PREEMPTED` rows count as restarts.
///
/// # Errors
/// [`ExecutorError::Parse`] naming the line for a bad id (e.g. truncated, C08), a missing
/// field, or a bad `ExitCode`.
pub(crate) fn parse_sacct(stdout: &str) -> Result<Vec<SacctRecord>, ExecutorError> {
    Ok(parse_sacct_for(stdout, 3, |_| true)?.0)
}

/// [`parse_sacct`] for [`SACCT_POLL_FIELDS`]-style output, keeping only allocation rows that
/// `accept` (and their steps): the poll's guard against a namesake (a recycled job id whose
/// old row has another job name or an earlier submit time). Every line must have at least
/// `min_fields` fields (a truncated line is an error, never a guess); with 8 or more, fields
/// 7 and 8 are `Submit` and `JobName`, and the line is split at most 8 times so a `|` in the
/// name cannot shift a field (C06). Returns the records and the rejected allocation rows.
///
/// # Errors
/// [`ExecutorError::Parse`] naming the line and what was expected.
pub(crate) fn parse_sacct_for(
    stdout: &str,
    min_fields: usize,
    accept: impl Fn(RowIdentity<'_>) -> bool,
) -> Result<(Vec<SacctRecord>, Vec<String>), ExecutorError> {
    let mut order: Vec<JobRef> = Vec::new();
    let mut recs: BTreeMap<JobRef, SacctRecord> = BTreeMap::new();
    let mut rejected = Vec::new();
    // Whether the newest allocation row of a job was accepted (its steps follow it).
    let mut alloc_ok: BTreeMap<JobRef, bool> = BTreeMap::new();
    for (n, line) in stdout.lines().enumerate() {
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        let ctx = |e: ExecutorError| match e {
            ExecutorError::Parse { detail, .. } => {
                parse_error("sacct", format!("line {}: {detail}", n + 1), line)
            }
            other => other,
        };
        let f: Vec<&str> = line.splitn(8, '|').collect();
        if f.len() < min_fields.max(3) {
            return Err(parse_error(
                "sacct",
                format!(
                    "line {}: {} fields, expected at least {} (`{}`)",
                    n + 1,
                    f.len(),
                    min_fields.max(3),
                    if min_fields >= 8 {
                        SACCT_POLL_FIELDS.replace(',', "|")
                    } else {
                        "JobID|State|ExitCode[|...]".to_string()
                    }
                ),
                line,
            ));
        }
        let state = map_state(f[1]);
        let exit = parse_exit_code(f[2]).map_err(ctx)?;
        let opt = |i: usize| {
            f.get(i)
                .map(|s| s.trim())
                .filter(|s| !s.is_empty() && !matches!(*s, "Unknown" | "None" | "None assigned"))
                .map(String::from)
        };
        let submit = opt(6);
        let name = f.get(7).map(|s| s.to_string());
        match parse_id_field(f[0]).map_err(ctx)? {
            IdField::PendingArray { id, tasks, .. } => {
                // sacct shows a pending range as `ID_[a-b]`: one pending record per task.
                for t in tasks {
                    let job = JobRef::task(id, t);
                    let ok = accept(RowIdentity {
                        job: &job,
                        submit: submit.as_deref(),
                        name: name.as_deref(),
                    });
                    alloc_ok.insert(job.clone(), ok);
                    if !ok {
                        rejected.push(line.to_string());
                        continue;
                    }
                    if !recs.contains_key(&job) {
                        order.push(job.clone());
                    }
                    recs.insert(
                        job.clone(),
                        SacctRecord {
                            job,
                            state: state.clone(),
                            raw_state: f[1].trim().to_string(),
                            exit,
                            steps: BTreeMap::new(),
                            restarts: 0,
                            nodes: None,
                            start: None,
                            end: None,
                            submit: submit.clone(),
                            name: name.clone(),
                        },
                    );
                }
            }
            IdField::One { job, step: None }
                if !accept(RowIdentity {
                    job: &job,
                    submit: submit.as_deref(),
                    name: name.as_deref(),
                }) =>
            {
                alloc_ok.insert(job, false);
                rejected.push(line.to_string());
            }
            IdField::One { job, step: None } => match recs.get_mut(&job) {
                Some(prev) => {
                    // -D: a newer run of the same job; the older one was requeued.
                    if matches!(
                        prev.state,
                        JobState::Requeued | JobState::Preempted | JobState::NodeFail
                    ) {
                        prev.restarts += 1;
                    }
                    prev.state = state;
                    prev.raw_state = f[1].trim().to_string();
                    prev.exit = exit;
                    prev.steps.clear();
                    prev.nodes = opt(3);
                    prev.start = opt(4);
                    prev.end = opt(5);
                    prev.submit = submit.clone();
                    prev.name = name.clone();
                    alloc_ok.insert(job, true);
                }
                None => {
                    order.push(job.clone());
                    alloc_ok.insert(job.clone(), true);
                    recs.insert(
                        job.clone(),
                        SacctRecord {
                            job,
                            state,
                            raw_state: f[1].trim().to_string(),
                            exit,
                            steps: BTreeMap::new(),
                            restarts: 0,
                            nodes: opt(3),
                            start: opt(4),
                            end: opt(5),
                            submit: submit.clone(),
                            name: name.clone(),
                        },
                    );
                }
            },
            IdField::One {
                job,
                step: Some(step),
            } => {
                // Steps belong to the allocation row just before them (with -D, a namesake's
                // steps follow the namesake's row and are dropped with it).
                if alloc_ok.get(&job).copied().unwrap_or(false)
                    && let Some(rec) = recs.get_mut(&job)
                {
                    rec.steps.insert(step, StepRecord { state, exit });
                }
                // A step row before its allocation row does not happen with sacct; ignore.
            }
        }
    }
    Ok((
        order.into_iter().filter_map(|j| recs.remove(&j)).collect(),
        rejected,
    ))
}

/// The uid of `SlurmUser` in `scontrol show config` output (`SlurmUser = slurm(64030)`);
/// `None` when the line is absent (an old or trimmed configuration).
///
/// # Errors
/// [`ExecutorError::Parse`] naming the line when it is present but not `NAME(UID)`.
pub(crate) fn parse_slurm_user(stdout: &str) -> Result<Option<u32>, ExecutorError> {
    let Some((n, line, value)) = config_value(stdout, "SlurmUser") else {
        return Ok(None);
    };
    value
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .and_then(|u| u.parse::<u32>().ok())
        .map(Some)
        .ok_or_else(|| {
            parse_error(
                "scontrol show config",
                format!("line {n}: expected `SlurmUser = NAME(UID)`"),
                line,
            )
        })
}

/// The first `key = value` line of `scontrol show config` output whose key is `key`: its
/// 1-based line number, the whole line and the trimmed value.
fn config_value<'a>(stdout: &'a str, key: &str) -> Option<(usize, &'a str, &'a str)> {
    stdout.lines().enumerate().find_map(|(n, line)| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| (n + 1, line, v.trim()))
    })
}

/// Slurm's default `MaxArraySize` (slurm.conf(5)): array indices run `0..=1000`.
pub(crate) const DEFAULT_MAX_ARRAY_SIZE: u32 = 1001;

/// `MaxArraySize` from `scontrol show config` output (`MaxArraySize = 1001`); `None` when the
/// line is absent. Indices of an array must be below it (slurm.conf(5), "MaxArraySize").
///
/// # Errors
/// [`ExecutorError::Parse`] naming the line when it is present but not a positive integer.
pub(crate) fn parse_max_array_size(stdout: &str) -> Result<Option<u32>, ExecutorError> {
    let Some((n, line, value)) = config_value(stdout, "MaxArraySize") else {
        return Ok(None);
    };
    match value.parse::<u32>() {
        Ok(v) if v >= 1 => Ok(Some(v)),
        _ => Err(parse_error(
            "scontrol show config",
            format!("line {n}: expected `MaxArraySize = N` with N >= 1"),
            line,
        )),
    }
}

/// How an array of `size` tasks is submitted when indices must stay below `max_array_size`
/// (N01): chunks of at most `max_array_size` tasks, each a Slurm array `0-(len-1)` whose task
/// `i` is the array's task `offset + i`, with the `%N` throttle split between the chunks so
/// that at most `max(max_concurrent, chunks)` tasks run at once overall.
///
/// Returns `(offset, len, throttle)` per chunk, in index order.
pub(crate) fn array_chunks(
    size: u32,
    max_concurrent: Option<u32>,
    max_array_size: u32,
) -> Vec<(u32, u32, Option<u32>)> {
    let cap = max_array_size.max(1);
    let n = size.div_ceil(cap).max(1);
    // Each chunk gets its share of the throttle (at least 1, or it would never run).
    let throttle = max_concurrent.map(|m| if n == 1 { m } else { (m / n).max(1) });
    (0..n)
        .map(|c| {
            let offset = c * cap;
            (offset, (size - offset).min(cap), throttle)
        })
        .collect()
}
