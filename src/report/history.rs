//! [`CampaignHistory`]: every attempt of a campaign, read without the lease from
//! `controller/journal.jsonl`, `controller/plan.json`, `controller/lease.json` and, for the
//! local executor, the attempt folders under `attempts/`.
//!
//! Reading is strictly read-only: files are opened for reading only, nothing is created,
//! truncated or locked, so a controller appending to the journal at the same moment is never
//! disturbed. A journal line without its newline (a controller mid-append) is left for the next
//! read; a complete line that is not JSON is an error naming the file and line. Entry kinds this
//! reader does not know are skipped, so a newer journal stays readable.
//!
//! # GPU-hours and waste
//!
//! An attempt's GPU-hours are its allocation's GPUs (the plan's placement of the unit's
//! instance: nodes × GPUs per node, 0 for CPU stages) × its run time (start to end, or to the
//! history's `as_of_ms` while it runs). Start and end come from the executor's attempt record
//! when there is one (local: the wrapper's `exit` record), else from what the journal says;
//! without a known start the submit time is used and the attempt is marked
//! [`AttemptHistory::start_estimated`].
//!
//! Wasted GPU-hours, by key (a [`FailureClass`] name, `superseded` or `hung`):
//! - a failed attempt: all of it, under its failure class (`cancelled` for a cancel);
//! - an attempt of an earlier revision (the campaign started over): all of it, `superseded`;
//! - a hung attempt (the journal gives its last heartbeat): the time after the last heartbeat,
//!   `hung`; the time before it follows the rules above (useful if it succeeded);
//! - successful attempts of the current revision and attempts still running: nothing.

pub use crate::sys::clock_text;
use crate::sys::now_ms;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Maps keyed by attempt ids and unit names, 100k+ entries on a large campaign: foldhash
/// instead of SipHash (no HashDoS concern: the keys come from our own journal).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

use super::ReportError;
use super::lease::LeaseStatus;
use crate::campaign::RunnerKind;
use crate::campaign::controller::FailureClass;
use crate::campaign::execution::{Resource, Strategy};

/// An attempt's times and nodes from outside records (e.g. `sacct` rows): `(start_ms, end_ms,
/// nodes)`, milliseconds since the Unix epoch and Slurm's `NodeList`.
pub type AttemptTimes = (Option<u64>, Option<u64>, Option<String>);

/// How an attempt ended (or where it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// The intent is journaled; the submit is not confirmed (yet).
    Intent,
    /// Submitted, not finished (queued or running).
    Live,
    /// Finished successfully.
    Succeeded,
    /// Finished with a failure (its [`AttemptHistory::class`]).
    Failed,
    /// Cancelled (by the controller, a user or the scheduler).
    Cancelled,
    /// The submit failed; no job existed.
    SubmitFailed,
    /// Belongs to an earlier revision: its work was thrown away.
    Superseded,
}

impl AttemptOutcome {
    /// The snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Intent => "intent",
            AttemptOutcome::Live => "live",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::SubmitFailed => "submit_failed",
            AttemptOutcome::Superseded => "superseded",
        }
    }
}

/// A stage's status as the journal tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StageStatus {
    /// No attempt yet.
    Waiting,
    /// Some attempt submitted, not finished.
    Running,
    /// Done.
    Done,
    /// Failed for good.
    Failed,
    /// Not run: a manual decision upstream chose no candidate.
    Skipped,
    /// Not started and never will be in this run: a stage it depends on failed
    /// ([`StageHistory::blocked_by`] names it).
    Blocked,
    /// The campaign was cancelled (`campaign cancel`, Ctrl-C, SIGTERM) before this stage
    /// finished: nothing of it is live and nothing more will be submitted until a new run
    /// ([`CampaignHistory::cancelled`] says by whom and when).
    Cancelled,
    /// No attempt live: a failed unit waits for its retry ([`StageHistory::backoff`] says
    /// until when, which attempt and why).
    BackingOff,
    /// A manual decision stage waits for a person ([`StageHistory::decision_file`]).
    AwaitingDecision,
}

impl StageStatus {
    /// The snake_case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            StageStatus::Waiting => "waiting",
            StageStatus::Running => "running",
            StageStatus::Done => "done",
            StageStatus::Failed => "failed",
            StageStatus::Skipped => "skipped",
            StageStatus::Blocked => "blocked",
            StageStatus::Cancelled => "cancelled",
            StageStatus::BackingOff => "backing_off",
            StageStatus::AwaitingDecision => "awaiting_decision",
        }
    }
}

/// One stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageHistory {
    /// Stage id.
    pub id: String,
    /// Parent stage ids.
    pub parents: Vec<String>,
    /// Units (work items plus the aggregate step); 0 when the plan is unknown.
    pub units: usize,
    /// Units whose last attempt succeeded (current revision).
    pub done_units: usize,
    /// Units with a live attempt.
    pub live_units: usize,
    /// Units whose last attempt failed or was cancelled and no retry is live.
    pub failed_units: usize,
    /// Status.
    pub status: StageStatus,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    /// GPU-hours of all its attempts.
    pub gpu_hours: f64,
    /// Wasted GPU-hours of its attempts.
    pub wasted_gpu_hours: f64,
    /// A manual decision stage waiting for a person: the decision file to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_file: Option<PathBuf>,
    /// A manual decision stage that was decided: the chosen candidates (empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<Vec<String>>,
    /// A blocked stage: the failed stage upstream that blocks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// The earliest pending retry of its units (a unit failed, its next attempt is decided
    /// and not submitted yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Backoff>,
    /// The status in words, the same in `status`, `status --json`, the live view and the
    /// report: `done`, `running`, `cancelled`, `backing off until 14:03:07 UTC (attempt 2,
    /// oom)`, `waiting for a decision`, `blocked by score`, ... ([`StageHistory::state_text`]).
    #[serde(default)]
    pub state: String,
}

/// A unit's pending retry.
///
/// ```
/// use puzzletron::report::Backoff;
/// let b = Backoff::new("score/3", 1_700_000_000_000, 2).with_class("oom");
/// assert_eq!((b.attempt, b.class.as_deref()), (2, Some("oom")));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Backoff {
    /// The unit, e.g. `score/3`.
    pub unit: String,
    /// Not submitted before this time (ms since the Unix epoch, controller clock).
    pub until_ms: u64,
    /// The number of the attempt to come (from 1).
    pub attempt: u32,
    /// The failure class of the attempt that failed (`oom`, `transient`, ...), when known.
    pub class: Option<String>,
}

/// A campaign cancelled as a whole.
///
/// ```
/// use puzzletron::report::CampaignCancel;
/// let c = CampaignCancel::new(1_700_000_000_000, "SIGINT").with_attempts(["train.a1"]);
/// assert_eq!(c.attempts, ["train.a1"]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CampaignCancel {
    /// When (ms since the Unix epoch, controller clock).
    pub at_ms: u64,
    /// By whom: the command or signal and the user, host and pid, as the canceller wrote it
    /// (e.g. `` `puzzletron campaign cancel` (user ana on h1, pid 4242) ``).
    pub by: String,
    /// The attempts that were live and were cancelled.
    pub attempts: Vec<String>,
}

impl Backoff {
    /// Unit `unit`'s attempt `attempt`, not submitted before `until_ms` (ms since the Unix
    /// epoch), failure class unknown.
    pub fn new(unit: impl Into<String>, until_ms: u64, attempt: u32) -> Self {
        Self {
            unit: unit.into(),
            until_ms,
            attempt,
            class: None,
        }
    }

    /// Sets the failure class of the attempt that failed (`oom`, `transient`, ...).
    pub fn with_class(mut self, class: impl Into<String>) -> Self {
        self.class = Some(class.into());
        self
    }
}

impl CampaignCancel {
    /// A cancellation at `at_ms` (ms since the Unix epoch) by `by`, with no attempt cancelled.
    pub fn new(at_ms: u64, by: impl Into<String>) -> Self {
        Self {
            at_ms,
            by: by.into(),
            attempts: Vec::new(),
        }
    }

    /// Sets the attempts that were live and were cancelled.
    pub fn with_attempts<I, T>(mut self, attempts: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.attempts = attempts.into_iter().map(Into::into).collect();
        self
    }
}

impl StageHistory {
    /// The status in words (see [`StageHistory::state`]).
    pub fn state_text(&self) -> String {
        match self.status {
            StageStatus::Cancelled => "cancelled".to_string(),
            StageStatus::BackingOff => match &self.backoff {
                Some(b) => format!(
                    "backing off until {} (attempt {}, {})",
                    clock_text(b.until_ms),
                    b.attempt,
                    b.class.as_deref().unwrap_or("failed")
                ),
                None => "backing off".to_string(),
            },
            StageStatus::AwaitingDecision => "waiting for a decision".to_string(),
            StageStatus::Blocked => match &self.blocked_by {
                Some(b) => format!("blocked by {b}"),
                None => "blocked".to_string(),
            },
            other => other.as_str().to_string(),
        }
    }
}

/// One attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AttemptHistory {
    /// The attempt id (the scheduler job name).
    pub attempt_id: String,
    /// The unit, e.g. `score/3` or `score/agg`.
    pub unit: String,
    /// The stage.
    pub stage: String,
    /// Attempt number of the unit, from 1.
    pub attempt: u32,
    /// The campaign revision it belongs to.
    pub revision: u32,
    /// Submitted with the resume flag.
    pub resume: bool,
    /// Submitted with more resources.
    pub more_resources: bool,
    /// The scheduler's job id, once submitted.
    pub job_id: Option<String>,
    /// Submit time (ms since the Unix epoch).
    pub submitted_ms: u64,
    /// Start time (ms), when known.
    pub started_ms: Option<u64>,
    /// End time (ms), once finished.
    pub ended_ms: Option<u64>,
    /// The start is not known; `submitted_ms` stands in for it in GPU-hours.
    pub start_estimated: bool,
    /// Where it is or how it ended.
    pub outcome: AttemptOutcome,
    /// Scheduler state name at the end, e.g. `OUT_OF_MEMORY`.
    pub state: Option<String>,
    /// Exit code, if any.
    pub exit_code: Option<i32>,
    /// Failure class.
    pub class: Option<FailureClass>,
    /// Evidence (the classification's detail, the submit error, the cancel reason).
    pub detail: String,
    /// Its log.
    pub log_path: Option<PathBuf>,
    /// Nodes it ran on, when known (`localhost` for the local executor).
    pub nodes: Option<String>,
    /// GPUs of its allocation.
    pub gpus: u32,
    /// Last heartbeat of a hung attempt (ms), when one was declared hung.
    pub last_heartbeat_ms: Option<u64>,
    /// Index (in [`CampaignHistory::attempts`]) of the previous attempt of the same unit.
    pub retry_of: Option<usize>,
}

impl AttemptHistory {
    /// Start used for GPU-hours: the start, else the submit time.
    pub fn run_start_ms(&self) -> u64 {
        self.started_ms.unwrap_or(self.submitted_ms)
    }

    /// Run time in ms up to `as_of_ms` for an attempt still running (0 before it started).
    pub fn run_ms(&self, as_of_ms: u64) -> u64 {
        match self.outcome {
            AttemptOutcome::Intent | AttemptOutcome::SubmitFailed => 0,
            AttemptOutcome::Live if self.started_ms.is_none() => 0,
            _ => self
                .ended_ms
                .unwrap_or(as_of_ms)
                .saturating_sub(self.run_start_ms()),
        }
    }

    /// GPU-hours: GPUs × run time.
    pub fn gpu_hours(&self, as_of_ms: u64) -> f64 {
        f64::from(self.gpus) * self.run_ms(as_of_ms) as f64 / 3_600_000.0
    }

    /// Total wasted GPU-hours: the sum of [`AttemptHistory::waste`], without its allocations.
    pub fn wasted_gpu_hours(&self, as_of_ms: u64) -> f64 {
        let total = self.gpu_hours(as_of_ms);
        match self.outcome {
            // All of it, whatever part of it was hung.
            AttemptOutcome::Superseded | AttemptOutcome::Cancelled | AttemptOutcome::Failed => {
                total
            }
            _ => match (self.last_heartbeat_ms, self.ended_ms) {
                (Some(hb), Some(end)) => {
                    let hung_ms = end.saturating_sub(hb.max(self.run_start_ms()));
                    (f64::from(self.gpus) * hung_ms as f64 / 3_600_000.0).min(total)
                }
                _ => 0.0,
            },
        }
    }

    /// Wasted GPU-hours by key (see the module docs).
    pub fn waste(&self, as_of_ms: u64) -> Vec<(String, f64)> {
        let total = self.gpu_hours(as_of_ms);
        if total == 0.0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut rest = total;
        if let (Some(hb), Some(end)) = (self.last_heartbeat_ms, self.ended_ms) {
            let hung_ms = end.saturating_sub(hb.max(self.run_start_ms()));
            let hung = f64::from(self.gpus) * hung_ms as f64 / 3_600_000.0;
            if hung > 0.0 {
                out.push(("hung".to_string(), hung));
                rest -= hung;
            }
        }
        let key = match self.outcome {
            AttemptOutcome::Superseded => Some("superseded".to_string()),
            AttemptOutcome::Cancelled => Some(FailureClass::Cancelled.as_str().to_string()),
            AttemptOutcome::Failed => Some(
                self.class
                    .unwrap_or(FailureClass::Unknown)
                    .as_str()
                    .to_string(),
            ),
            _ => None,
        };
        if let Some(k) = key
            && rest > 0.0
        {
            out.push((k, rest));
        }
        out
    }
}

/// Everything known about a campaign's attempts.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CampaignHistory {
    /// The campaign folder.
    pub dir: PathBuf,
    /// The campaign nonce (prefix of its attempt ids; the tag of `cancel --tag`).
    pub nonce: Option<String>,
    /// The current contract hash.
    pub contract_hash: Option<String>,
    /// The current revision.
    pub revision: u32,
    /// The runner kind of the plan (`local`, `slurm`, ...), when the plan is readable.
    pub runner: Option<String>,
    /// The experiment config of the plan.
    pub experiment: Option<String>,
    /// Journal records read.
    pub records: u64,
    /// First and last journal record times (ms).
    pub first_ms: Option<u64>,
    /// Last journal record time (ms).
    pub last_ms: Option<u64>,
    /// "Now" for attempts still running: the read time.
    pub as_of_ms: u64,
    /// Stages in plan order.
    pub stages: Vec<StageHistory>,
    /// Attempts in journal order.
    pub attempts: Vec<AttemptHistory>,
    /// Whether the campaign has ended: every stage done or failed, nothing live.
    pub finished: bool,
    /// The campaign was cancelled as a whole and not run again since: by whom, when, which
    /// attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<CampaignCancel>,
    /// What could not be read (a journal line or a `plan.json` that does not parse), with its
    /// path and the last good record: the rest is shown from what was read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// The last events (`Event` entries: recovery, halt, detach...), at most 50.
    pub events: Vec<(u64, String, String)>,
    /// Nodes the controller excluded from later submissions (attempts failed fast on them):
    /// `(when, node, why)`, in journal order.
    pub excluded_nodes: Vec<(u64, String, String)>,
    /// The lease, as probed when read.
    pub lease: LeaseStatus,
}

#[derive(Deserialize)]
struct RawRecord<'a> {
    at_ms: u64,
    #[serde(borrow)]
    entry: RawEntry<'a>,
}

#[derive(Deserialize)]
struct RawHandle<'a> {
    #[serde(default, borrow)]
    executor: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    job_id: Option<Cow<'a, str>>,
    #[serde(default)]
    array_task: Option<u32>,
    #[serde(default)]
    submitted_at_ms: Option<u64>,
}

/// A journal entry as a bag of optional fields (unknown fields ignored, unknown kinds skipped).
/// Strings borrow from the line where they can: a 100k-attempt journal is ~400k lines, and
/// `status` must read it in well under a second.
#[derive(Deserialize)]
struct RawEntry<'a> {
    #[serde(borrow)]
    t: Cow<'a, str>,
    #[serde(default, borrow)]
    nonce: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    contract_hash: Option<Cow<'a, str>>,
    #[serde(default)]
    revision: Option<u32>,
    #[serde(default, borrow)]
    unit: Option<Cow<'a, str>>,
    #[serde(default)]
    attempt: Option<u32>,
    #[serde(default, borrow)]
    attempt_id: Option<Cow<'a, str>>,
    #[serde(default)]
    resume: Option<bool>,
    #[serde(default)]
    more_resources: Option<bool>,
    #[serde(default, borrow)]
    handle: Option<RawHandle<'a>>,
    #[serde(default, borrow)]
    error: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
    /// `"completed"` or `{"state": "out_of_memory", ...}`; parsed only for `finished`.
    #[serde(default, borrow)]
    state: Option<&'a RawValue>,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    class: Option<FailureClass>,
    #[serde(default, borrow)]
    detail: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    log_path: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    stage: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    message: Option<Cow<'a, str>>,
    // Fields a richer journal may carry (typed controller events); used when present.
    #[serde(default, borrow)]
    nodes: Option<Cow<'a, str>>,
    #[serde(default)]
    started_at_ms: Option<u64>,
    #[serde(default)]
    ended_at_ms: Option<u64>,
    #[serde(default)]
    last_heartbeat_ms: Option<u64>,
    #[serde(default, borrow)]
    node: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    file: Option<Cow<'a, str>>,
    #[serde(default)]
    chosen: Option<Vec<String>>,
    #[serde(default, borrow)]
    decision: Option<&'a RawValue>,
    #[serde(default)]
    not_before_ms: Option<u64>,
}

/// The tag of a journaled decision (`{"decision": "retry", ...}`).
#[derive(Deserialize)]
struct DecisionTag<'a> {
    #[serde(borrow)]
    decision: Cow<'a, str>,
}

/// The two forms a journaled state takes.
#[derive(Deserialize)]
#[serde(untagged)]
enum StateForm<'a> {
    Name(#[serde(borrow)] Cow<'a, str>),
    Tagged {
        #[serde(default, borrow)]
        state: Option<Cow<'a, str>>,
    },
}

fn state_name(v: &RawValue) -> Option<String> {
    match serde_json::from_str::<StateForm>(v.get()).ok()? {
        StateForm::Name(s) => Some(s.to_ascii_uppercase()),
        StateForm::Tagged { state } => state.map(|s| s.to_ascii_uppercase()),
    }
}

/// The parts of `plan.json` the history uses. The rest is skipped without being built: a
/// 100k-item plan is ~30 MB of JSON, and building the whole [`CampaignPlan`] for `status` cost
/// more than the journal. Field names are the plan's own (a test checks the two agree).
#[derive(Deserialize)]
struct PlanView {
    experiment_config_path: String,
    runner: RunnerView,
    stages: Vec<StageView>,
}

#[derive(Deserialize)]
struct RunnerView {
    kind: RunnerKind,
}

#[derive(Deserialize)]
struct StageView {
    stage_id: String,
    parents: Vec<String>,
    spec: SpecView,
    work: WorkView,
    /// Present for a manual decision stage (no units).
    #[serde(default)]
    decision: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct SpecView {
    resource: Resource,
}

#[derive(Deserialize)]
struct WorkView {
    strategy: Strategy,
    items: Vec<ItemView>,
    aggregate_required: bool,
    topology: TopologyView,
}

#[derive(Deserialize)]
struct ItemView {
    instance: u32,
}

#[derive(Deserialize)]
struct TopologyView {
    groups: Vec<GroupView>,
}

#[derive(Deserialize)]
struct GroupView {
    placement: PlacementView,
}

#[derive(Deserialize)]
struct PlacementView {
    node_count: u32,
    gpus_on_node: u32,
}

/// Per-unit GPUs and per-stage layout from the plan.
struct PlanInfo {
    runner: String,
    experiment: String,
    stages: Vec<(String, Vec<String>, usize)>,
    /// Stage id -> (GPUs of each work item, GPUs of the aggregate step if it has one).
    gpus: HashMap<String, (Vec<u32>, Option<u32>)>,
}

impl PlanInfo {
    /// GPUs of a unit (`score/3`, `score/agg`); 0 when the plan does not know it.
    fn unit_gpus(&self, unit: &str) -> u32 {
        let Some((stage, idx)) = unit.rsplit_once('/') else {
            return 0;
        };
        let Some((items, agg)) = self.gpus.get(stage) else {
            return 0;
        };
        if idx == "agg" {
            return agg.unwrap_or(0);
        }
        idx.parse::<usize>()
            .ok()
            .and_then(|i| items.get(i).copied())
            .unwrap_or(0)
    }
}

fn plan_info(plan: &PlanView) -> PlanInfo {
    let mut gpus = HashMap::new();
    let mut stages = Vec::new();
    for st in &plan.stages {
        let gpu_stage = st.spec.resource == Resource::Gpu;
        let unit_gpus = |instance: u32| -> u32 {
            if !gpu_stage {
                return 0;
            }
            st.work
                .topology
                .groups
                .get(instance as usize)
                .map(|g| g.placement.node_count.max(1) * g.placement.gpus_on_node)
                .unwrap_or(0)
        };
        let items: Vec<u32> = st
            .work
            .items
            .iter()
            .map(|i| unit_gpus(i.instance))
            .collect();
        let agg = st.work.strategy == Strategy::Sharded && st.work.aggregate_required;
        // The aggregate step runs with the topology of item 0 (controller::spec).
        let agg_gpus = agg.then(|| items.first().copied().unwrap_or(0));
        stages.push((
            st.stage_id.clone(),
            st.parents.clone(),
            if st.decision.is_some() {
                0 // a manual decision runs nothing
            } else {
                st.work.items.len() + usize::from(agg)
            },
        ));
        gpus.insert(st.stage_id.clone(), (items, agg_gpus));
    }
    PlanInfo {
        runner: plan.runner.kind.as_str().to_string(),
        experiment: plan.experiment_config_path.clone(),
        stages,
        gpus,
    }
}

/// Streams the complete lines of a journal file, read-only, into `f(at_ms, entry)`; returns
/// the bytes of an unfinished last line left unread (a controller mid-append). One line is in
/// memory at a time.
fn read_journal(path: &Path, mut f: impl FnMut(u64, &RawEntry<'_>)) -> Result<usize, ReportError> {
    let file = File::open(path).map_err(|e| ReportError::io("reading journal", path, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(4096);
    let mut number = 0usize;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| ReportError::io("reading journal", path, e))?;
        if n == 0 {
            return Ok(0);
        }
        if line.last() != Some(&b'\n') {
            return Ok(line.len());
        }
        number += 1;
        let body = &line[..line.len() - 1];
        if body.is_empty() {
            continue;
        }
        // An entry kind this reader does not know is skipped (a newer journal); only a line
        // that is not a record at all is an error.
        match serde_json::from_slice::<RawRecord>(body) {
            Ok(r) => f(r.at_ms, &r.entry),
            Err(e) => {
                let v: Result<serde_json::Value, _> = serde_json::from_slice(body);
                let known =
                    matches!(&v, Ok(v) if v.get("entry").and_then(|e| e.get("t")).is_some());
                if !known {
                    return Err(ReportError::Corrupt {
                        path: path.to_path_buf(),
                        line: Some(number),
                        reason: format!(
                            "not a journal record ({e}); expected one JSON object with seq, at_ms and entry"
                        ),
                    });
                }
            }
        }
    }
}

/// The local executor's record of an attempt: start/end from `exit`, or the `started` marker's
/// time while it runs.
fn local_times(attempts_dir: &Path, id: &str) -> (Option<u64>, Option<u64>) {
    let dir = attempts_dir.join(id);
    let mut start = None;
    let mut end = None;
    if let Ok(text) = std::fs::read_to_string(dir.join("exit")) {
        for line in text.lines() {
            match line.split_once('=') {
                Some(("start_ms", v)) => start = v.trim().parse().ok(),
                Some(("end_ms", v)) => end = v.trim().parse().ok(),
                _ => {}
            }
        }
    }
    if start.is_none() {
        start = crate::sys::mtime_ms(&dir.join("job"));
    }
    (start, end)
}

impl CampaignHistory {
    /// Reads the campaign in `dir`, read-only, without the lease.
    ///
    /// `attempt_records`: also read the local executor's attempt folders (`attempts/<id>/`) for
    /// start and end times (one or two small files per attempt; `status` skips them for speed).
    ///
    /// # Errors
    /// [`ReportError::NotACampaign`] when `dir` has no journal; [`ReportError::Corrupt`] for a
    /// complete journal line that is not a record, or a `plan.json` that does not parse;
    /// [`ReportError::Io`] for read errors.
    pub fn load(dir: &Path, attempt_records: bool) -> Result<Self, ReportError> {
        let ctl = dir.join("controller");
        let journal = ctl.join("journal.jsonl");
        if !journal.is_file() {
            let reason = match std::fs::metadata(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    "the path does not exist".to_string()
                }
                Ok(m) if !m.is_dir() => "it is a file, not a folder".to_string(),
                _ => "it has no controller/journal.jsonl".to_string(),
            };
            return Err(ReportError::NotACampaign {
                path: dir.to_path_buf(),
                reason,
            });
        }
        let lease = LeaseStatus::probe(&ctl)?;
        let plan_path = ctl.join("plan.json");
        let mut problems = Vec::new();
        let plan = match std::fs::read(&plan_path) {
            Ok(b) => match serde_json::from_slice::<PlanView>(&b) {
                Ok(p) => Some(plan_info(&p)),
                // Shown from the journal alone (stages as its attempts name them).
                Err(e) => {
                    problems.push(format!(
                        "{}: line {}: not a campaign plan ({e}); stages are shown as the \
                         journal's attempts name them, without their parents and GPU counts",
                        plan_path.display(),
                        e.line()
                    ));
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(ReportError::io("reading plan", &plan_path, e)),
        };
        let mut b = HistoryBuilder::new(dir, plan.as_ref(), lease, now_ms());
        match read_journal(&journal, |at, e| b.apply(at, e)) {
            Ok(_torn) => {}
            // What was read before the bad line is shown; the rest is named missing.
            Err(ReportError::Corrupt { path, line, reason }) => problems.push(format!(
                "{}: line {}: {reason}; shown: the {} records before it (the last good record \
                 at {}), missing: everything after it",
                path.display(),
                line.map_or("?".to_string(), |l| l.to_string()),
                b.h.records,
                b.h.last_ms.map_or("-".to_string(), clock_text),
            )),
            Err(e) => return Err(e),
        }
        let mut h = b.finish();
        h.problems = problems;
        if attempt_records {
            let adir = dir.join("attempts");
            if adir.is_dir() {
                for a in &mut h.attempts {
                    if matches!(
                        a.outcome,
                        AttemptOutcome::Intent | AttemptOutcome::SubmitFailed
                    ) {
                        continue;
                    }
                    let (s, e) = local_times(&adir, &a.attempt_id);
                    if s.is_some() {
                        a.started_ms = s;
                        a.start_estimated = false;
                    }
                    if e.is_some() {
                        a.ended_ms = e;
                    }
                    a.nodes.get_or_insert_with(|| "localhost".to_string());
                }
                h.recompute_stages();
            }
        }
        Ok(h)
    }

    /// Recomputes the stages' unit counts, GPU-hours and the `finished` flag from the attempts.
    fn recompute_stages(&mut self) {
        let idx: HashMap<String, usize> = self
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.clone(), i))
            .collect();
        for s in &mut self.stages {
            s.done_units = 0;
            s.live_units = 0;
            s.failed_units = 0;
            s.gpu_hours = 0.0;
            s.wasted_gpu_hours = 0.0;
        }
        // Last attempt per unit decides the unit's state.
        let mut last: FastMap<&str, usize> = FastMap::default();
        for (i, a) in self.attempts.iter().enumerate() {
            if let Some(&si) = idx.get(&a.stage) {
                let s = &mut self.stages[si];
                s.gpu_hours += a.gpu_hours(self.as_of_ms);
                s.wasted_gpu_hours += a.wasted_gpu_hours(self.as_of_ms);
            }
            if a.outcome != AttemptOutcome::Superseded {
                last.insert(a.unit.as_str(), i);
            }
        }
        let mut live_any = false;
        for &i in last.values() {
            let a = &self.attempts[i];
            let Some(&si) = idx.get(&a.stage) else {
                continue;
            };
            let s = &mut self.stages[si];
            match a.outcome {
                AttemptOutcome::Succeeded => s.done_units += 1,
                AttemptOutcome::Live | AttemptOutcome::Intent => {
                    s.live_units += 1;
                    live_any = true;
                }
                AttemptOutcome::Failed
                | AttemptOutcome::Cancelled
                | AttemptOutcome::SubmitFailed => s.failed_units += 1,
                AttemptOutcome::Superseded => {}
            }
        }
        let cancelled = self.cancelled.is_some();
        for s in &mut self.stages {
            s.blocked_by = None;
            if matches!(
                s.status,
                StageStatus::Waiting
                    | StageStatus::Running
                    | StageStatus::Blocked
                    | StageStatus::Cancelled
                    | StageStatus::BackingOff
                    | StageStatus::AwaitingDecision
            ) {
                let touched = s.live_units > 0 || s.done_units > 0 || s.failed_units > 0;
                s.status = if s.live_units > 0 {
                    StageStatus::Running
                } else if cancelled {
                    StageStatus::Cancelled
                } else if s.decision_file.is_some() && s.chosen.is_none() {
                    StageStatus::AwaitingDecision
                } else if s.backoff.is_some() {
                    StageStatus::BackingOff
                } else if touched {
                    StageStatus::Running
                } else {
                    StageStatus::Waiting
                };
            }
        }
        // A waiting stage below a failed one never starts (the controller starts nothing under
        // a failed parent): blocked, so a campaign that failed reads as ended, not pending.
        // Plan order lists parents first.
        for i in 0..self.stages.len() {
            if !matches!(
                self.stages[i].status,
                StageStatus::Waiting | StageStatus::Cancelled
            ) {
                continue;
            }
            let by = self.stages[i].parents.iter().find_map(|p| {
                let &pi = idx.get(p)?;
                let ps = &self.stages[pi];
                match ps.status {
                    StageStatus::Failed => Some(ps.id.clone()),
                    StageStatus::Blocked => Some(ps.blocked_by.clone().unwrap_or(ps.id.clone())),
                    _ => None,
                }
            });
            if let Some(by) = by {
                self.stages[i].status = StageStatus::Blocked;
                self.stages[i].blocked_by = Some(by);
            }
        }
        for s in &mut self.stages {
            s.state = s.state_text();
        }
        self.finished = !live_any
            && !self.stages.is_empty()
            && self.stages.iter().all(|s| {
                matches!(
                    s.status,
                    StageStatus::Done
                        | StageStatus::Failed
                        | StageStatus::Skipped
                        | StageStatus::Blocked
                )
            });
    }

    /// Total GPU-hours of every attempt.
    pub fn gpu_hours(&self) -> f64 {
        self.attempts
            .iter()
            .map(|a| a.gpu_hours(self.as_of_ms))
            .sum::<f64>()
            + 0.0 // no -0.0 for a campaign without attempts
    }

    /// Wasted GPU-hours by key (failure class name, `superseded`, `hung`), sorted by key.
    pub fn waste_by_class(&self) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        for a in &self.attempts {
            for (k, v) in a.waste(self.as_of_ms) {
                *m.entry(k).or_insert(0.0) += v;
            }
        }
        m
    }

    /// Total wasted GPU-hours.
    pub fn wasted_gpu_hours(&self) -> f64 {
        // `+ 0.0`: an empty f64 sum is -0.0, printed "-0.000".
        self.waste_by_class().values().sum::<f64>() + 0.0
    }

    /// Attempts that ended badly (failed, cancelled, submit failed), in journal order.
    pub fn failures(&self) -> impl Iterator<Item = &AttemptHistory> {
        self.attempts.iter().filter(|a| {
            matches!(
                a.outcome,
                AttemptOutcome::Failed | AttemptOutcome::Cancelled | AttemptOutcome::SubmitFailed
            )
        })
    }

    /// Attempts submitted and not finished.
    pub fn live(&self) -> impl Iterator<Item = &AttemptHistory> {
        self.attempts
            .iter()
            .filter(|a| matches!(a.outcome, AttemptOutcome::Live | AttemptOutcome::Intent))
    }

    /// Fills start/end/nodes of attempts from outside records (e.g. `sacct` rows), keyed by
    /// attempt id: `(start_ms, end_ms, nodes)`.
    pub fn apply_times(&mut self, times: &HashMap<String, AttemptTimes>) {
        for a in &mut self.attempts {
            if let Some((s, e, n)) = times.get(&a.attempt_id) {
                if s.is_some() {
                    a.started_ms = *s;
                    a.start_estimated = false;
                }
                if e.is_some() && a.ended_ms.is_some() {
                    a.ended_ms = *e;
                }
                if n.is_some() {
                    a.nodes = n.clone();
                }
            }
        }
        self.recompute_stages();
    }
}

/// Builds a [`CampaignHistory`] one journal record at a time (the journal is streamed, never
/// held whole).
struct HistoryBuilder<'p> {
    h: CampaignHistory,
    plan: Option<&'p PlanInfo>,
    by_id: FastMap<String, usize>,
    last_of_unit: FastMap<String, usize>,
    stage_end: HashMap<String, (StageStatus, Option<String>)>,
    /// Manual decisions: stage -> (decision file while it waits, chosen once decided).
    decisions: HashMap<String, (Option<PathBuf>, Option<Vec<String>>)>,
    /// Units whose retry is decided and not submitted yet.
    backoffs: FastMap<String, Backoff>,
    /// Attempts asked to cancel and why, since the last whole-campaign cancel.
    cancel_requests: Vec<(usize, String)>,
}

impl<'p> HistoryBuilder<'p> {
    fn new(dir: &Path, plan: Option<&'p PlanInfo>, lease: LeaseStatus, as_of_ms: u64) -> Self {
        HistoryBuilder {
            h: CampaignHistory {
                dir: dir.to_path_buf(),
                nonce: None,
                contract_hash: None,
                revision: 0,
                runner: plan.map(|p| p.runner.clone()),
                experiment: plan.map(|p| p.experiment.clone()),
                records: 0,
                first_ms: None,
                last_ms: None,
                as_of_ms,
                stages: Vec::new(),
                attempts: Vec::new(),
                finished: false,
                cancelled: None,
                problems: Vec::new(),
                events: Vec::new(),
                excluded_nodes: Vec::new(),
                lease,
            },
            plan,
            by_id: FastMap::default(),
            last_of_unit: FastMap::default(),
            stage_end: HashMap::new(),
            decisions: HashMap::new(),
            backoffs: FastMap::default(),
            cancel_requests: Vec::new(),
        }
    }

    fn attempt_index(&self, e: &RawEntry<'_>) -> Option<usize> {
        e.attempt_id
            .as_deref()
            .and_then(|id| self.by_id.get(id))
            .copied()
    }

    fn apply(&mut self, at_ms: u64, e: &RawEntry<'_>) {
        let h = &mut self.h;
        h.records += 1;
        h.first_ms.get_or_insert(at_ms);
        h.last_ms = Some(at_ms);
        match e.t.as_ref() {
            "header" => {
                h.nonce = e.nonce.as_deref().map(str::to_string);
                h.contract_hash = e.contract_hash.as_deref().map(str::to_string);
            }
            "revision" => {
                h.revision = e.revision.unwrap_or(h.revision + 1);
                h.contract_hash = e
                    .contract_hash
                    .as_deref()
                    .map(str::to_string)
                    .or(h.contract_hash.take());
                // A new revision starts over: what the old one did is thrown away.
                for a in &mut h.attempts {
                    a.outcome = AttemptOutcome::Superseded;
                }
                self.last_of_unit.clear();
                self.stage_end.clear();
                self.decisions.clear();
                self.backoffs.clear();
            }
            "intent" => {
                let (Some(unit), Some(id)) = (e.unit.as_deref(), e.attempt_id.as_deref()) else {
                    return;
                };
                let stage = unit.rsplit_once('/').map_or(unit, |(s, _)| s).to_string();
                // A new submit: the campaign runs again, the unit's back-off is over.
                h.cancelled = None;
                self.backoffs.remove(unit);
                let gpus = self.plan.map_or(0, |p| p.unit_gpus(unit));
                let idx = h.attempts.len();
                h.attempts.push(AttemptHistory {
                    attempt_id: id.to_string(),
                    unit: unit.to_string(),
                    stage,
                    attempt: e.attempt.unwrap_or(1),
                    revision: h.revision,
                    resume: e.resume.unwrap_or(false),
                    more_resources: e.more_resources.unwrap_or(false),
                    job_id: None,
                    submitted_ms: at_ms,
                    started_ms: None,
                    ended_ms: None,
                    start_estimated: true,
                    outcome: AttemptOutcome::Intent,
                    state: None,
                    exit_code: None,
                    class: None,
                    detail: String::new(),
                    log_path: None,
                    nodes: None,
                    gpus,
                    last_heartbeat_ms: None,
                    retry_of: self.last_of_unit.get(unit).copied(),
                });
                self.by_id.insert(id.to_string(), idx);
                self.last_of_unit.insert(unit.to_string(), idx);
            }
            "submitted" => {
                let Some(i) = self.attempt_index(e) else {
                    return;
                };
                let a = &mut self.h.attempts[i];
                if a.outcome == AttemptOutcome::Intent {
                    a.outcome = AttemptOutcome::Live;
                }
                if let Some(hd) = &e.handle {
                    a.job_id = hd.job_id.as_deref().map(|j| match hd.array_task {
                        Some(t) => format!("{j}_{t}"),
                        None => j.to_string(),
                    });
                    if let Some(t) = hd.submitted_at_ms.filter(|&t| t > 0) {
                        a.submitted_ms = t;
                    }
                    if hd.executor.as_deref() == Some("local") {
                        a.nodes = Some("localhost".into());
                    }
                }
            }
            "submit_failed" => {
                if let Some(i) = self.attempt_index(e) {
                    let a = &mut self.h.attempts[i];
                    if a.outcome != AttemptOutcome::Superseded {
                        a.outcome = AttemptOutcome::SubmitFailed;
                    }
                    a.detail = e.error.as_deref().unwrap_or_default().to_string();
                    a.ended_ms = Some(at_ms);
                }
            }
            "cancel_requested" => {
                if let Some(i) = self.attempt_index(e) {
                    self.cancel_requests
                        .push((i, e.reason.as_deref().unwrap_or_default().to_string()));
                    let a = &mut self.h.attempts[i];
                    if a.detail.is_empty() {
                        a.detail =
                            format!("cancel requested: {}", e.reason.as_deref().unwrap_or(""));
                    }
                }
            }
            "finished" => {
                let Some(i) = self.attempt_index(e) else {
                    return;
                };
                let a = &mut self.h.attempts[i];
                a.state = e.state.and_then(state_name);
                a.exit_code = e.exit_code;
                a.class = e.class;
                if let Some(d) = &e.detail {
                    a.detail = d.to_string();
                }
                a.log_path = e.log_path.as_deref().map(PathBuf::from);
                a.ended_ms = Some(e.ended_at_ms.unwrap_or(at_ms));
                if let Some(s) = e.started_at_ms {
                    a.started_ms = Some(s);
                    a.start_estimated = false;
                }
                if let Some(n) = &e.nodes {
                    a.nodes = Some(n.to_string());
                }
                if a.outcome != AttemptOutcome::Superseded {
                    let cancelled = a.class == Some(FailureClass::Cancelled)
                        || a.state.as_deref() == Some("CANCELLED");
                    a.outcome = match a.class {
                        None => AttemptOutcome::Succeeded,
                        Some(_) if cancelled => AttemptOutcome::Cancelled,
                        Some(_) => AttemptOutcome::Failed,
                    };
                }
            }
            "node_excluded" => {
                if let Some(n) = &e.node {
                    h.excluded_nodes.push((
                        at_ms,
                        n.to_string(),
                        e.reason.as_deref().unwrap_or_default().to_string(),
                    ));
                }
            }
            "stage_done" => {
                if let Some(s) = &e.stage {
                    self.stage_end
                        .insert(s.to_string(), (StageStatus::Done, None));
                }
            }
            "stage_skipped" => {
                if let Some(s) = &e.stage {
                    self.stage_end.insert(
                        s.to_string(),
                        (
                            StageStatus::Skipped,
                            e.reason.as_deref().map(str::to_string),
                        ),
                    );
                }
            }
            "decision_needed" => {
                if let Some(s) = &e.stage {
                    self.decisions.entry(s.to_string()).or_default().0 =
                        e.file.as_deref().map(PathBuf::from);
                }
            }
            "decision_made" => {
                if let Some(s) = &e.stage {
                    *self.decisions.entry(s.to_string()).or_default() =
                        (None, Some(e.chosen.clone().unwrap_or_default()));
                }
            }
            "stage_failed" => {
                if let Some(s) = &e.stage {
                    self.stage_end.insert(
                        s.to_string(),
                        (StageStatus::Failed, e.reason.as_deref().map(str::to_string)),
                    );
                }
            }
            "decided" => {
                let retry = e
                    .decision
                    .and_then(|d| serde_json::from_str::<DecisionTag>(d.get()).ok())
                    .is_some_and(|d| d.decision == "retry");
                let Some(unit) = e.unit.as_deref() else {
                    return;
                };
                if retry {
                    let last = self.last_of_unit.get(unit).map(|&i| &h.attempts[i]);
                    self.backoffs.insert(
                        unit.to_string(),
                        Backoff {
                            unit: unit.to_string(),
                            until_ms: e.not_before_ms.unwrap_or(at_ms),
                            attempt: last.map_or(1, |a| a.attempt + 1),
                            class: last.and_then(|a| a.class).map(|c| c.as_str().to_string()),
                        },
                    );
                } else {
                    self.backoffs.remove(unit);
                }
            }
            "event" => {
                // A whole-campaign cancel: `shut_down` with "cancelled by ...: N attempts
                // cancelled" (a new revision also shuts down, and is not a cancel).
                if e.kind.as_deref() == Some("shut_down")
                    && let Some(m) = e.message.as_deref()
                    && let Some(by) = m.strip_prefix("cancelled by ")
                {
                    let reason = m.rsplit_once(": ").map_or(m, |(r, _)| r);
                    let by = by.rsplit_once(": ").map_or(by, |(b, _)| b);
                    let attempts = self
                        .cancel_requests
                        .iter()
                        .filter(|(_, r)| r == reason)
                        .map(|(i, _)| h.attempts[*i].attempt_id.clone())
                        .collect();
                    h.cancelled = Some(CampaignCancel {
                        at_ms,
                        by: by.to_string(),
                        attempts,
                    });
                    self.cancel_requests.clear();
                }
                h.events.push((
                    at_ms,
                    e.kind.as_deref().unwrap_or_default().to_string(),
                    e.message.as_deref().unwrap_or_default().to_string(),
                ));
                if h.events.len() > 100 {
                    h.events.drain(..50);
                }
            }
            _ => {}
        }
        // Any entry naming an attempt may carry its last heartbeat (a hung attempt) or its
        // start (a richer journal).
        if (e.last_heartbeat_ms.is_some() || e.started_at_ms.is_some())
            && e.t != "finished"
            && let Some(i) = self.attempt_index(e)
        {
            let a = &mut self.h.attempts[i];
            if e.last_heartbeat_ms.is_some() {
                a.last_heartbeat_ms = e.last_heartbeat_ms;
            }
            if let Some(s) = e.started_at_ms {
                a.started_ms = Some(s);
                a.start_estimated = false;
            }
        }
    }

    fn finish(self) -> CampaignHistory {
        let HistoryBuilder {
            mut h,
            plan,
            stage_end,
            mut decisions,
            backoffs,
            ..
        } = self;
        if h.events.len() > 50 {
            let cut = h.events.len() - 50;
            h.events.drain(..cut);
        }
        // Stages: the plan's, else those the attempts name, in first-seen order.
        let mut stages: Vec<StageHistory> = match plan {
            Some(p) => p
                .stages
                .iter()
                .map(|(id, parents, units)| StageHistory::new(id, parents.clone(), *units))
                .collect(),
            None => Vec::new(),
        };
        let mut known: std::collections::HashSet<String> =
            stages.iter().map(|s| s.id.clone()).collect();
        for a in &h.attempts {
            if !known.contains(&a.stage) {
                known.insert(a.stage.clone());
                stages.push(StageHistory::new(&a.stage, Vec::new(), 0));
            }
        }
        for s in &mut stages {
            if let Some((st, reason)) = stage_end.get(&s.id) {
                s.status = *st;
                s.reason = reason.clone();
            }
            if let Some((file, chosen)) = decisions.remove(&s.id) {
                s.decision_file = file;
                s.chosen = chosen;
            }
        }
        for b in backoffs.into_values() {
            let stage = b.unit.rsplit_once('/').map_or(b.unit.as_str(), |(s, _)| s);
            if let Some(s) = stages.iter_mut().find(|s| s.id == stage)
                && s.backoff.as_ref().is_none_or(|o| b.until_ms < o.until_ms)
            {
                s.backoff = Some(b);
            }
        }
        h.stages = stages;
        h.recompute_stages();
        h
    }
}

impl StageHistory {
    pub(crate) fn new(id: &str, parents: Vec<String>, units: usize) -> Self {
        StageHistory {
            id: id.to_string(),
            parents,
            units,
            done_units: 0,
            live_units: 0,
            failed_units: 0,
            status: StageStatus::Waiting,
            reason: None,
            gpu_hours: 0.0,
            wasted_gpu_hours: 0.0,
            decision_file: None,
            chosen: None,
            blocked_by: None,
            backoff: None,
            state: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(at: u64, entry: serde_json::Value) -> String {
        serde_json::json!({"seq": 1, "at_ms": at, "entry": entry}).to_string()
    }

    /// What `load` builds from these journal lines, without a plan.
    fn from_lines(lines: &[String], as_of_ms: u64) -> CampaignHistory {
        let mut b = HistoryBuilder::new(Path::new("/c"), None, LeaseStatus::default(), as_of_ms);
        for l in lines {
            let r: RawRecord = serde_json::from_str(l).unwrap();
            b.apply(r.at_ms, &r.entry);
        }
        b.finish()
    }

    #[test]
    fn stages_below_a_failed_stage_are_blocked_and_the_campaign_ended() {
        let mut h = from_lines(&[], 0);
        let st = |id: &str, parents: &[&str]| {
            StageHistory::new(id, parents.iter().map(|p| p.to_string()).collect(), 1)
        };
        h.stages = vec![st("a", &[]), st("b", &["a"]), st("c", &["b"]), st("d", &[])];
        h.stages[0].status = StageStatus::Failed;
        h.recompute_stages();
        let status: Vec<&str> = h.stages.iter().map(|s| s.status.as_str()).collect();
        assert_eq!(status, ["failed", "blocked", "blocked", "waiting"]);
        let state: Vec<&str> = h.stages.iter().map(|s| s.state.as_str()).collect();
        assert_eq!(state, ["failed", "blocked by a", "blocked by a", "waiting"]);
        assert!(!h.finished, "d can still run");
        h.stages[3].status = StageStatus::Done;
        h.recompute_stages();
        assert!(h.finished, "nothing left that can run");
        // No attempts: totals are +0.0 (an empty f64 sum is -0.0, printed "-0.000").
        assert_eq!(format!("{:.3}", h.wasted_gpu_hours()), "0.000");
        assert_eq!(format!("{:.3}", h.gpu_hours()), "0.000");
    }

    #[test]
    fn backoff_decision_and_cancel_are_shown_as_themselves() {
        let attempt = |at: u64, unit: &str, n: u32| {
            let id = format!("n.{}.a{n}", unit.replace('/', "."));
            [
                rec(
                    at,
                    serde_json::json!({"t":"intent","unit":unit,"attempt":n,"attempt_id":id,"resume":false,"more_resources":false}),
                ),
                rec(
                    at,
                    serde_json::json!({"t":"submitted","attempt_id":id,"handle":{"executor":"mock","attempt_id":id,"job_id":"1","array_task":null,"cluster":null,"submitted_at_ms":at,"data":{}},"adopted":false}),
                ),
            ]
        };
        let mut recs = vec![rec(
            0,
            serde_json::json!({"t":"header","format":1,"nonce":"n","contract_hash":"h"}),
        )];
        recs.extend(attempt(0, "a/0", 1));
        recs.extend(attempt(0, "b/0", 1));
        recs.push(rec(
            1000,
            serde_json::json!({"t":"finished","attempt_id":"n.a.0.a1","state":{"state":"out_of_memory"},"exit_code":null,"class":"oom","detail":"OOM","log_path":null}),
        ));
        // 13:00:05 UTC on day 0.
        recs.push(rec(
            1000,
            serde_json::json!({"t":"decided","unit":"a/0","decision":{"decision":"retry","delay":{"secs":5,"nanos":0},"resume":false,"more_resources":true},"not_before_ms":46_805_000}),
        ));
        recs.push(rec(
            1000,
            serde_json::json!({"t":"decision_needed","stage":"pick","file":"/c/decisions/pick.txt","candidates":["x:0"]}),
        ));
        let h = from_lines(&recs, 2000);
        let st = |h: &CampaignHistory, id: &str| {
            let s = h.stages.iter().find(|s| s.id == id).unwrap();
            (s.status.as_str().to_string(), s.state.clone())
        };
        assert_eq!(
            st(&h, "a"),
            (
                "backing_off".into(),
                "backing off until 13:00:05 UTC (attempt 2, oom)".into()
            )
        );
        assert_eq!(st(&h, "b"), ("running".into(), "running".into()));
        assert!(h.cancelled.is_none());

        // The retry is submitted: running again, no back-off.
        let mut more = recs.clone();
        more.extend(attempt(46_805_000, "a/0", 2));
        let h2 = from_lines(&more, 46_806_000);
        assert_eq!(st(&h2, "a"), ("running".into(), "running".into()));

        // A whole-campaign cancel: by whom, when, which attempts; nothing `running`.
        let mut c = recs.clone();
        c.push(rec(
            3000,
            serde_json::json!({"t":"cancel_requested","attempt_id":"n.b.0.a1","reason":"cancelled by `puzzletron campaign cancel` (user u on h, pid 7)"}),
        ));
        c.push(rec(
            3100,
            serde_json::json!({"t":"finished","attempt_id":"n.b.0.a1","state":{"state":"cancelled","by_uid":null},"exit_code":null,"class":"cancelled","detail":"cancelled","log_path":null}),
        ));
        c.push(rec(
            3200,
            serde_json::json!({"t":"event","kind":"shut_down","message":"cancelled by `puzzletron campaign cancel` (user u on h, pid 7): 1 attempts cancelled"}),
        ));
        let h3 = from_lines(&c, 4000);
        let cancel = h3.cancelled.clone().expect("cancelled");
        assert_eq!(
            cancel.by,
            "`puzzletron campaign cancel` (user u on h, pid 7)"
        );
        assert_eq!(
            (cancel.at_ms, cancel.attempts),
            (3200, vec!["n.b.0.a1".to_string()])
        );
        assert_eq!(st(&h3, "a"), ("cancelled".into(), "cancelled".into()));
        assert_eq!(st(&h3, "b"), ("cancelled".into(), "cancelled".into()));
        assert!(!h3.finished, "a cancelled campaign can run again");
        // A new revision's shutdown is not a cancel.
        let mut r = recs.clone();
        r.push(rec(
            3200,
            serde_json::json!({"t":"event","kind":"shut_down","message":"new revision: the contract changed: 1 attempts cancelled"}),
        ));
        assert!(from_lines(&r, 4000).cancelled.is_none());
    }

    #[test]
    fn waste_follows_outcomes_and_revisions() {
        let recs = vec![
            rec(
                0,
                serde_json::json!({"t":"header","format":1,"nonce":"n","contract_hash":"h"}),
            ),
            rec(
                0,
                serde_json::json!({"t":"intent","unit":"a/0","attempt":1,"attempt_id":"n.a.0.a1","resume":false,"more_resources":false}),
            ),
            rec(
                0,
                serde_json::json!({"t":"submitted","attempt_id":"n.a.0.a1","handle":{"executor":"mock","attempt_id":"n.a.0.a1","job_id":"1","array_task":null,"cluster":null,"submitted_at_ms":0,"data":{}},"adopted":false}),
            ),
            rec(
                3_600_000,
                serde_json::json!({"t":"finished","attempt_id":"n.a.0.a1","state":{"state":"out_of_memory"},"exit_code":null,"class":"oom","detail":"OOM","log_path":"/l","started_at_ms":0}),
            ),
            rec(3_600_000, serde_json::json!({"t":"something_new","x":1})),
            rec(
                3_600_000,
                serde_json::json!({"t":"intent","unit":"a/0","attempt":2,"attempt_id":"n.a.0.a2","resume":false,"more_resources":true}),
            ),
            rec(
                3_600_000,
                serde_json::json!({"t":"submitted","attempt_id":"n.a.0.a2","handle":{"executor":"mock","attempt_id":"n.a.0.a2","job_id":"2","array_task":null,"cluster":null,"submitted_at_ms":3_600_000,"data":{}},"adopted":false}),
            ),
            rec(
                5_400_000,
                serde_json::json!({"t":"finished","attempt_id":"n.a.0.a2","state":{"state":"completed"},"exit_code":0,"class":null,"detail":"","log_path":null,"started_at_ms":3_600_000}),
            ),
        ];
        let mut h = from_lines(&recs, 10_000_000);
        for a in &mut h.attempts {
            a.gpus = 2;
        }
        h.recompute_stages();
        assert_eq!(h.attempts.len(), 2);
        assert_eq!(h.attempts[1].retry_of, Some(0));
        assert_eq!(h.attempts[0].outcome, AttemptOutcome::Failed);
        assert_eq!(h.attempts[0].state.as_deref(), Some("OUT_OF_MEMORY"));
        assert!((h.gpu_hours() - 3.0).abs() < 1e-9);
        let w = h.waste_by_class();
        assert_eq!(w.len(), 1);
        assert!((w["oom"] - 2.0).abs() < 1e-9, "{w:?}");
        for a in &h.attempts {
            let by_key: f64 = a.waste(h.as_of_ms).iter().map(|w| w.1).sum();
            assert!((a.wasted_gpu_hours(h.as_of_ms) - by_key).abs() < 1e-12);
        }
        // A hung attempt (heartbeat 1400 s before its end): only the hung part is waste if it
        // succeeded; all of it otherwise.
        let mut a = h.attempts[1].clone();
        a.last_heartbeat_ms = Some(4_000_000);
        let hung = 2.0 * 1_400_000.0 / 3_600_000.0;
        for (outcome, want) in [
            (AttemptOutcome::Succeeded, hung),
            (AttemptOutcome::Failed, 1.0),
            (AttemptOutcome::Cancelled, 1.0),
            (AttemptOutcome::Superseded, 1.0),
        ] {
            a.outcome = outcome;
            let by_key: f64 = a.waste(h.as_of_ms).iter().map(|w| w.1).sum();
            assert!((by_key - want).abs() < 1e-12, "{outcome:?}: {by_key}");
            assert!(
                (a.wasted_gpu_hours(h.as_of_ms) - want).abs() < 1e-12,
                "{outcome:?}"
            );
        }
        assert_eq!(h.stages[0].done_units, 1);
    }

    /// `PlanView` reads the fields of a real compiled plan's JSON (a MoE plan with GPU and CPU
    /// stages and a sharded aggregate): what `status` and the report charge per unit equals
    /// what the full [`crate::campaign::CampaignPlan`] says.
    #[test]
    fn plan_view_agrees_with_the_full_plan() {
        use crate::campaign::config::{ConfigLoader, Env};
        use crate::campaign::{ExecutionConfig, RunnerEnvironment, compile_campaign_plan_with};
        let fx =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/puzzletron-configs");
        let runner =
            RunnerEnvironment::load(fx.join("orchestration/qwen_moe/runner.slurm.yaml")).unwrap();
        let execution =
            ExecutionConfig::load(fx.join("orchestration/qwen_moe/execution.production.yaml"))
                .unwrap();
        let loader = ConfigLoader::new().env(
            Env::new()
                .with("PUZZLETRON_RUN_ROOT", "runs/test")
                .with("PUZZLETRON_DATASET_PATH", "data/ds"),
        );
        let plan = compile_campaign_plan_with(
            &loader,
            fx.join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
            &runner,
            &execution,
            &[],
            None,
        )
        .unwrap();
        let json = serde_json::to_vec(&plan).unwrap();
        let info = plan_info(&serde_json::from_slice::<PlanView>(&json).unwrap());
        assert_eq!(info.runner, "slurm");
        assert_eq!(info.experiment, plan.experiment_config_path);
        assert_eq!(info.stages.len(), plan.stages.len());
        let mut gpu_units = 0;
        for (st, (id, parents, units)) in plan.stages.iter().zip(&info.stages) {
            assert_eq!(id, &st.stage_id);
            assert_eq!(parents, &st.parents);
            let agg = st.work.strategy == Strategy::Sharded && st.work.aggregate_required;
            assert_eq!(*units, st.work.items.len() + usize::from(agg), "{id}");
            for (i, item) in st.work.items.iter().enumerate() {
                let want = if st.spec.resource == Resource::Gpu {
                    let g = &st.work.topology.groups[item.instance as usize].placement;
                    g.node_count.max(1) * g.gpus_on_node
                } else {
                    0
                };
                gpu_units += usize::from(want > 0);
                assert_eq!(info.unit_gpus(&format!("{id}/{i}")), want, "{id}/{i}");
            }
            let agg_want = if agg {
                info.unit_gpus(&format!("{id}/0"))
            } else {
                0
            };
            assert_eq!(info.unit_gpus(&format!("{id}/agg")), agg_want, "{id}/agg");
        }
        assert!(gpu_units > 0, "the fixture has GPU work items");
        assert_eq!(info.unit_gpus("no-such-stage/0"), 0);
        assert_eq!(info.unit_gpus("malformed"), 0);
    }

    /// The journal is streamed: a torn last line is left unread, and a complete line that is
    /// not a record is an error naming its line number.
    #[test]
    fn journal_stream_leaves_a_torn_tail_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal.jsonl");
        let good = rec(5, serde_json::json!({"t":"header","format":1,"nonce":"n"}));
        std::fs::write(&p, format!("{good}\n\n{good}\n{{\"seq\":3,\"at")).unwrap();
        let mut seen = Vec::new();
        let torn = read_journal(&p, |at, e| seen.push((at, e.t.to_string()))).unwrap();
        assert_eq!(torn, "{\"seq\":3,\"at".len());
        assert_eq!(
            seen,
            vec![(5, "header".to_string()), (5, "header".to_string())]
        );
        std::fs::write(&p, format!("{good}\nnot json\n")).unwrap();
        match read_journal(&p, |_, _| {}) {
            Err(ReportError::Corrupt { line, .. }) => assert_eq!(line, Some(2)),
            other => panic!("expected Corrupt at line 2, got {other:?}"),
        }
    }
}
