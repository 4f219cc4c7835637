//! The execution config (defaults + per-stage settings) and the compiled per-stage
//! [`StageExecutionSpec`].
//!
//! ```yaml
//! execution:
//!   defaults: {failure_policy: strict, halt_policy: drain, gpus_per_node: 8}
//!   stages:
//!     vllm_stats: {strategy: sharded, instances: 8, partition: interactive}
//!     build_library: {gpus_per_node: 1, parallel: {tp: 1}}
//! ```

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::{KeyPath, PathSegment, Value};
use super::mesh::{GpuAllocation, ParallelMesh, ParallelMeshOverride, RawMesh};
use super::plan_error::PlanError;
use super::runner::is_partition_name;
use super::schema::{AtLeast, Ordered, read};
use super::slurm_time::SlurmTime;
use crate::executor::WarningSignal;

macro_rules! str_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum $name { $($(#[$vm])* #[serde(rename = $s)] $var),+ }
        impl $name {
            /// All values, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// The config spelling.
            pub fn as_str(&self) -> &'static str { match self { $($name::$var => $s),+ } }
            /// Parses the config spelling.
            pub fn parse(s: &str) -> Option<Self> { match s { $($s => Some($name::$var),)+ _ => None } }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

str_enum! {
    /// How a stage's work is split over instances (`docs/design.md`, "Campaigns").
    Strategy {
        /// One work item on one instance.
        Single = "single",
        /// `instances` independent shards, each `shard_index/shard_count`.
        Sharded = "sharded",
        /// `instances` long-lived workers (model servers) pulling items from a queue.
        PersistentPool = "persistent_pool",
    }
}

str_enum! {
    /// What a failed attempt does to its stage.
    FailurePolicy {
        /// The first non-transient failure fails the stage.
        Strict = "strict",
        /// Resumable failures are re-submitted with the resume flag, up to `max_attempts`.
        Resume = "resume",
    }
}

str_enum! {
    /// What the campaign does when a stage fails.
    HaltPolicy {
        /// Cancel live attempts and stop.
        FailFast = "fail_fast",
        /// Let live attempts finish; start nothing new.
        Drain = "drain",
    }
}

str_enum! {
    /// The kind of resource a stage needs.
    Resource {
        /// GPUs (the mesh decides how many).
        Gpu = "gpu",
        /// CPUs only: no GPU is requested.
        Cpu = "cpu",
    }
}

/// `execution.defaults`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecutionDefaults {
    /// Default failure policy of every stage.
    pub failure_policy: FailurePolicy,
    /// What the campaign does when a stage fails.
    pub halt_policy: HaltPolicy,
    /// GPUs per node of the machines (packing capacity).
    pub gpus_per_node: u32,
    /// Most attempts per work item under [`FailurePolicy::Resume`].
    pub max_attempts: u32,
}

impl Default for ExecutionDefaults {
    fn default() -> Self {
        ExecutionDefaults {
            failure_policy: FailurePolicy::Strict,
            halt_policy: HaltPolicy::Drain,
            gpus_per_node: 8,
            max_attempts: 3,
        }
    }
}

/// `execution.stages.<id>`: settings of one stage; `None` fields fall back to the catalog and
/// the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageExecutionConfig {
    /// Strategy override.
    pub strategy: Option<Strategy>,
    /// Number of instances (shards or pool workers).
    pub instances: Option<u32>,
    /// Failure policy override.
    pub failure_policy: Option<FailurePolicy>,
    /// Partition or partition role (`interactive`, `batch`, `cpu`) for this stage.
    pub partition: Option<String>,
    /// Resource kind.
    pub resource: Option<Resource>,
    /// GPUs per node for this stage's packing.
    pub gpus_per_node: Option<u32>,
    /// Mesh sizes replacing those the experiment config gives.
    pub parallel: ParallelMeshOverride,
    /// Most attempts per work item.
    pub max_attempts: Option<u32>,
    /// Slurm `--time` for this stage, parsed.
    pub time_limit: Option<SlurmTime>,
    /// Heartbeat timeout in seconds (key `heartbeat_timeout_s`, at least 1): a running attempt
    /// whose progress mark does not move for this long is cancelled as hung.
    pub heartbeat_timeout_s: Option<u64>,
    /// `warning_signal: "USR2@180"` (or `180`): a signal sent that long before `time_limit`
    /// so the worker can checkpoint (N03).
    pub warning_signal: Option<WarningSignal>,
}

/// A parsed execution config.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecutionConfig {
    /// `execution.defaults`.
    pub defaults: ExecutionDefaults,
    /// Whether `defaults.gpus_per_node` was given (else the experiment's `execution.gpus_per_node`
    /// may supply it).
    pub gpus_per_node_given: bool,
    /// `execution.stages`, in file order.
    pub stages: Vec<(String, StageExecutionConfig)>,
    /// Where each `execution.stages.<id>` key was written (`file:line:column`), when loaded
    /// from a file; for errors about the id.
    #[serde(skip)]
    stage_origins: BTreeMap<String, String>,
}

impl ExecutionConfig {
    /// The settings given for `stage`, if any.
    pub fn stage(&self, stage: &str) -> Option<&StageExecutionConfig> {
        self.stages
            .iter()
            .find(|(id, _)| id == stage)
            .map(|(_, s)| s)
    }

    /// Loads the YAML file at `path` (anchors, aliases and `<<` merge keys allowed; no
    /// composition or interpolation) and reads it with [`Self::from_value`].
    ///
    /// # Errors
    /// [`PlanError::Config`] for I/O and YAML errors, then those of [`Self::from_value`].
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self, PlanError> {
        let path = path.as_ref();
        let cfg = super::config::load_yaml_file(path)?;
        let label = path.display().to_string();
        let mut config =
            Self::from_value(&label, cfg.value()).map_err(|e| e.locate(&label, cfg.origins()))?;
        for (id, _) in &config.stages {
            let key = super::config::KeyPath(vec![
                PathSegment::Key("execution".into()),
                PathSegment::Key("stages".into()),
                PathSegment::Key(id.clone()),
            ]);
            if let Some(o) = cfg.origins().get(&key) {
                config.stage_origins.insert(id.clone(), o.to_string());
            }
        }
        Ok(config)
    }

    /// Where the settings of `stage` were written (`file:line:column`), if loaded from a file.
    pub fn origin_of_stage(&self, stage: &str) -> Option<&str> {
        self.stage_origins.get(stage).map(String::as_str)
    }

    /// Reads an execution config from a loaded tree (the whole file, with `execution:`).
    ///
    /// The file's shape is a set of `#[serde(deny_unknown_fields)]` types read with serde;
    /// enums, counts, meshes, partitions, the Slurm time limit and the warning signal are
    /// typed there.
    ///
    /// # Errors
    /// [`PlanError::UnknownField`] with the key path and a suggestion, [`PlanError::InvalidValue`]
    /// for bad values (unknown strategy, `instances: 0`, a mesh typo, ...).
    pub fn from_value(file: &str, root: &Value) -> Result<Self, PlanError> {
        let raw: ExecutionFile = if root.is_null() {
            ExecutionFile::default()
        } else {
            read(file, KeyPath::root(), root)?
        };
        let exec = raw.execution.unwrap_or_default();
        let mut defaults = ExecutionDefaults::default();
        let d = exec.defaults.unwrap_or_default();
        if let Some(p) = d.failure_policy {
            defaults.failure_policy = p;
        }
        if let Some(p) = d.halt_policy {
            defaults.halt_policy = p;
        }
        let gpus_per_node_given = d.gpus_per_node.is_some();
        if let Some(AtLeast(g)) = d.gpus_per_node {
            defaults.gpus_per_node = g;
        }
        if let Some(AtLeast(m)) = d.max_attempts {
            defaults.max_attempts = m;
        }
        let stages = exec
            .stages
            .unwrap_or_default()
            .0
            .into_iter()
            .map(|(id, s)| (id, s.map(RawStage::into_config).unwrap_or_default()))
            .collect();
        Ok(ExecutionConfig {
            defaults,
            gpus_per_node_given,
            stages,
            stage_origins: BTreeMap::new(),
        })
    }
}

// The execution file's shape, as serde reads it. Every key is optional (an explicit `null` is
// the same as an absent key).

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with an `execution:` key")]
struct ExecutionFile {
    execution: Option<RawExecution>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping {defaults, stages}")]
struct RawExecution {
    defaults: Option<RawDefaults>,
    stages: Option<Ordered<Option<RawStage>>>,
}

#[derive(Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping {failure_policy, halt_policy, gpus_per_node, max_attempts}"
)]
struct RawDefaults {
    failure_policy: Option<FailurePolicy>,
    halt_policy: Option<HaltPolicy>,
    gpus_per_node: Option<AtLeast<1>>,
    max_attempts: Option<AtLeast<1>>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of the stage's execution settings"
)]
struct RawStage {
    strategy: Option<Strategy>,
    instances: Option<AtLeast<1>>,
    failure_policy: Option<FailurePolicy>,
    partition: Option<StagePartition>,
    resource: Option<Resource>,
    gpus_per_node: Option<AtLeast<1>>,
    parallel: Option<RawMesh>,
    max_attempts: Option<AtLeast<1>>,
    time_limit: Option<SlurmTime>,
    heartbeat_timeout_s: Option<AtLeast<1>>,
    warning_signal: Option<WarningSignalValue>,
}

impl RawStage {
    fn into_config(self) -> StageExecutionConfig {
        StageExecutionConfig {
            strategy: self.strategy,
            instances: self.instances.map(|n| n.0),
            failure_policy: self.failure_policy,
            partition: self.partition.map(|p| p.0),
            resource: self.resource,
            gpus_per_node: self.gpus_per_node.map(|n| n.0),
            parallel: self.parallel.map(Into::into).unwrap_or_default(),
            max_attempts: self.max_attempts.map(|n| n.0),
            time_limit: self.time_limit,
            heartbeat_timeout_s: self.heartbeat_timeout_s.map(|n| u64::from(n.0)),
            warning_signal: self.warning_signal.map(|w| w.0),
        }
    }
}

/// A stage's `partition`: a role (`interactive`, `batch`, `cpu`) or partition names, `"a,b"`;
/// every name is checked as the runner's are.
struct StagePartition(String);

impl<'de> Deserialize<'de> for StagePartition {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = StagePartition;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a partition role (interactive, batch, cpu) or partition names \"a,b\" made of letters, digits, '-', '_' or '.'",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<StagePartition, E> {
                if s.split(',').all(|p| is_partition_name(p.trim())) {
                    Ok(StagePartition(s.to_string()))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `warning_signal`: `"USR2@180"`, `"SIGUSR2@180"` or a number of seconds (`180`, USR2).
struct WarningSignalValue(WarningSignal);

impl<'de> Deserialize<'de> for WarningSignalValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = WarningSignalValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "`SIGNAL@SECONDS` such as \"USR2@180\" (USR2, USR1, TERM, INT, HUP, URG or ALRM; seconds >= 1)",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<WarningSignalValue, E> {
                WarningSignal::parse(s)
                    .map(WarningSignalValue)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Str(s), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<WarningSignalValue, E> {
                WarningSignal::parse(&n.to_string())
                    .map(WarningSignalValue)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<WarningSignalValue, E> {
                WarningSignal::parse(&n.to_string())
                    .map(WarningSignalValue)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// What is wrong with a stage's warning signal (N03), one line each, for the dry run: no time
/// limit (never sent), a lead not shorter than the limit (sent at the start), a lead under
/// [`MIN_WARNING_LEAD`] (too short for a checkpoint plus Slurm's `KillWait` plus a margin), a
/// stage that cannot resume (the checkpoint is never used), `USR1` on a distributed stage
/// (NCCL uses `SIGUSR1` itself).
pub(crate) fn warning_signal_problems(
    w: &WarningSignal,
    time_limit: Option<std::time::Duration>,
    resumable: bool,
    distributed: bool,
) -> Vec<String> {
    let lead = w.lead_secs();
    let mut out = Vec::new();
    match time_limit {
        None => out.push(format!(
            "warning signal {w} without a time_limit: it is never sent"
        )),
        Some(t) if w.lead >= t => out.push(format!(
            "warning signal lead {lead} s >= time limit {} s: it is sent right at the start",
            t.as_secs()
        )),
        Some(_) => {}
    }
    if w.lead < MIN_WARNING_LEAD {
        out.push(format!(
            "warning signal lead {lead} s is short: it must cover the checkpoint plus KillWait plus a margin (>= {} s advised; Slurm may send it up to 60 s early)",
            MIN_WARNING_LEAD.as_secs()
        ));
    }
    if !resumable {
        out.push(format!(
            "warning signal {w} on a stage that is not resumable: its checkpoint is never resumed"
        ));
    }
    if distributed && w.signal == "USR1" {
        out.push(
            "warning signal USR1 on a distributed stage: NCCL uses SIGUSR1 itself, use USR2".into(),
        );
    }
    out
}

/// The shortest warning lead the dry run accepts without a warning (N03: a 75 s checkpoint,
/// KillWait 30 s and a margin).
pub(crate) const MIN_WARNING_LEAD: std::time::Duration = std::time::Duration::from_secs(180);

/// The compiled execution of one stage: everything the controller needs to run it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageExecutionSpec {
    /// How work is split.
    pub strategy: Strategy,
    /// Instances (1 for `single`).
    pub instances: u32,
    /// Failure policy.
    pub failure_policy: FailurePolicy,
    /// Most attempts per work item.
    pub max_attempts: u32,
    /// Mesh of one instance.
    pub mesh: ParallelMesh,
    /// GPUs and nodes (`gpus_per_instance == 0` for CPU stages).
    pub allocation: GpuAllocation,
    /// Partition or role from the execution config (`None`: the runner's default).
    pub partition: Option<String>,
    /// Resource kind.
    pub resource: Resource,
    /// Whether one instance is a multi-process distributed (torch.distributed) job.
    pub distributed: bool,
    /// Slurm `--time` for this stage, if set.
    pub time_limit: Option<SlurmTime>,
    /// Heartbeat timeout in seconds, if set: a running attempt whose progress mark (a `step N`
    /// line in its logs, or the mtime of `$PUZZLETRON_HEARTBEAT_FILE`) does not move for this
    /// long is cancelled and classified as hung. Not part of the contract hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_s: Option<u64>,
    /// A signal before the time limit, if set (N03). Attempt metadata like `time_limit`: not
    /// in the contract hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning_signal: Option<WarningSignal>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<ExecutionConfig, PlanError> {
        ExecutionConfig::from_value("exec.yaml", &Value::from_json(&v))
    }

    #[test]
    fn parses_defaults_and_stages() {
        let c = parse(json!({"execution": {
            "defaults": {"failure_policy": "strict", "halt_policy": "drain", "gpus_per_node": 8},
            "stages": {"vllm_stats": {"strategy": "sharded", "instances": 8, "partition": "interactive"},
                       "build_library": {"gpus_per_node": 1, "parallel": {"tp": 1, "pp": 1}}}}}))
        .unwrap();
        assert_eq!(c.defaults.gpus_per_node, 8);
        assert!(c.gpus_per_node_given);
        let v = c.stage("vllm_stats").unwrap();
        assert_eq!(
            (v.strategy, v.instances, v.partition.as_deref()),
            (Some(Strategy::Sharded), Some(8), Some("interactive"))
        );
        assert_eq!(c.stage("build_library").unwrap().parallel.pp, Some(1));
    }

    #[test]
    fn heartbeat_timeout_is_seconds_of_at_least_one() {
        let c = parse(json!({"execution": {"stages": {"train": {"heartbeat_timeout_s": 900}}}}))
            .unwrap();
        assert_eq!(c.stage("train").unwrap().heartbeat_timeout_s, Some(900));
        for bad in [json!(0), json!("10m"), json!(-1)] {
            let e =
                parse(json!({"execution": {"stages": {"train": {"heartbeat_timeout_s": bad}}}}))
                    .unwrap_err();
            assert!(
                e.to_string()
                    .contains("execution.stages.train.heartbeat_timeout_s"),
                "{e}"
            );
        }
        let e = parse(json!({"execution": {"stages": {"train": {"heartbeat_timeout": 9}}}}))
            .unwrap_err();
        assert!(
            e.to_string().contains("did you mean `heartbeat_timeout_s`"),
            "{e}"
        );
    }

    #[test]
    fn typed_stage_values() {
        let c = parse(json!({"execution": {"stages": {"train": {
            "time_limit": 90, "warning_signal": 300, "partition": "gpu-a,gpu-b"},
            "mip": {"time_limit": "2-00:00:00", "warning_signal": "SIGUSR1@200", "partition": "cpu"},
            "noop": null}}}))
        .unwrap();
        let t = c.stage("train").unwrap();
        assert_eq!(t.time_limit.as_ref().unwrap().as_duration().as_secs(), 5400);
        assert_eq!(t.warning_signal.as_ref().unwrap().to_string(), "USR2@300");
        assert_eq!(t.partition.as_deref(), Some("gpu-a,gpu-b"));
        let m = c.stage("mip").unwrap();
        assert_eq!(
            m.time_limit.as_ref().unwrap().as_duration().as_secs(),
            172_800
        );
        assert_eq!(m.warning_signal.as_ref().unwrap().to_string(), "USR1@200");
        assert_eq!(c.stage("noop"), Some(&StageExecutionConfig::default()));
        assert_eq!(
            c.stages
                .iter()
                .map(|(id, _)| id.as_str())
                .collect::<Vec<_>>(),
            ["train", "mip", "noop"]
        );

        let e = parse(json!({"execution": {"stages": {"mip": {"partition": "a;rm -rf /"}}}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("exec.yaml: `execution.stages.mip.partition` = \"a;rm -rf /\": expected a partition role"),
            "{e}"
        );
        let e = parse(json!({"execution": {"stages": {"mip": {"time_limit": "4h"}}}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "`execution.stages.mip.time_limit` = \"4h\": expected a Slurm time M, M:S, H:M:S"
            ),
            "{e}"
        );
        let e = parse(json!({"execution": {"stages": {"mip": {"warning_signal": "USR9@10"}}}}))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("= \"USR9@10\": expected `SIGNAL@SECONDS`"),
            "{e}"
        );
        let e = parse(json!({"execution": {"defaults": {"halt_policy": "drian"}}}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "exec.yaml: `execution.defaults.halt_policy` = \"drian\": expected one of fail_fast, drain (did you mean `drain`?)"
        );
        let e = parse(json!({"execution": {"stages": ["mip"]}}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "exec.yaml: `execution.stages` = a list of 1 item(s): expected a mapping"
        );
        let e = parse(json!({"execution": {"stages": {"mip": {"parallel": {"tp": 2, "sequence_parallel": true, "pp": 0}}}}}))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "exec.yaml: `execution.stages.mip.parallel.pp` = 0: expected an integer >= 1"
        );
        let c = parse(json!({"execution": {"defaults": {"gpus_per_node": null}}})).unwrap();
        assert!(!c.gpus_per_node_given);
        assert_eq!(
            ExecutionConfig::from_value("exec.yaml", &Value::Null).unwrap(),
            ExecutionConfig::default()
        );
    }

    #[test]
    fn errors_name_paths() {
        let e = parse(json!({"execution": {"stages": {"mip": {"instance": 2}}}})).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("execution.stages.mip.instance") && m.contains("did you mean `instances`"),
            "{m}"
        );
        let e =
            parse(json!({"execution": {"stages": {"mip": {"strategy": "shardd"}}}})).unwrap_err();
        assert!(e.to_string().contains("did you mean `sharded`"), "{e}");
        let e = parse(json!({"execution": {"stages": {"mip": {"instances": 0}}}})).unwrap_err();
        assert!(
            e.to_string().contains("execution.stages.mip.instances"),
            "{e}"
        );
        let e = parse(json!({"execution": {"stages": {"mip": {"parallel": {"tp_size": 2}}}}}))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("execution.stages.mip.parallel.tp_size"),
            "{e}"
        );
        let e = parse(json!({"execution": {"default": {}}})).unwrap_err();
        assert!(e.to_string().contains("did you mean `defaults`"), "{e}");
    }
}
