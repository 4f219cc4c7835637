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

use super::config::{PathSegment, Value};
use super::mesh::{GpuAllocation, ParallelMesh, ParallelMeshOverride};
use super::plan_error::PlanError;
use super::schema::{
    check_keys, did_you_mean, expect_map, expect_opt_str, expect_u32, field, invalid, join,
};
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
            pub(crate) fn from_value(file: &str, path: &str, node: &Value) -> Result<Self, PlanError> {
                let names: Vec<&str> = Self::ALL.iter().map(|v| v.as_str()).collect();
                match node {
                    Value::String(s) => Self::parse(s).ok_or_else(|| PlanError::InvalidValue {
                        file: file.into(),
                        path: path.into(),
                        value: format!("{s:?}"),
                        expected: format!("one of {}{}", names.join(", "),
                            did_you_mean(s, names.iter().copied()).map(|x| format!(" (did you mean `{x}`?)")).unwrap_or_default()),
                    }),
                    other => Err(invalid(file, path, other, &format!("one of {}", names.join(", ")))),
                }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

str_enum! {
    /// How a stage's work is split over instances (DESIGN.md §6).
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

const TOP_KEYS: [&str; 1] = ["execution"];
const EXEC_KEYS: [&str; 2] = ["defaults", "stages"];
const DEFAULT_KEYS: [&str; 4] = [
    "failure_policy",
    "halt_policy",
    "gpus_per_node",
    "max_attempts",
];
const STAGE_KEYS: [&str; 11] = [
    "strategy",
    "instances",
    "failure_policy",
    "partition",
    "resource",
    "gpus_per_node",
    "parallel",
    "max_attempts",
    "time_limit",
    "heartbeat_timeout_s",
    "warning_signal",
];

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
    /// # Errors
    /// [`PlanError::UnknownField`] with the key path and a suggestion, [`PlanError::InvalidValue`]
    /// for bad values (unknown strategy, `instances: 0`, a mesh typo, ...).
    pub fn from_value(file: &str, root: &Value) -> Result<Self, PlanError> {
        let top = expect_map(file, "", root)?;
        check_keys(file, "", top, &TOP_KEYS)?;
        let exec = expect_map(file, "execution", field(top, "execution"))?;
        check_keys(file, "execution", exec, &EXEC_KEYS)?;
        let dm = expect_map(file, "execution.defaults", field(exec, "defaults"))?;
        check_keys(file, "execution.defaults", dm, &DEFAULT_KEYS)?;
        let mut defaults = ExecutionDefaults::default();
        let mut gpus_per_node_given = false;
        for (key, value) in dm {
            let path = join("execution.defaults", key);
            if value.is_null() {
                continue;
            }
            match key.as_str() {
                "failure_policy" => {
                    defaults.failure_policy = FailurePolicy::from_value(file, &path, value)?
                }
                "halt_policy" => defaults.halt_policy = HaltPolicy::from_value(file, &path, value)?,
                "gpus_per_node" => {
                    defaults.gpus_per_node = expect_u32(file, &path, value, 1)?;
                    gpus_per_node_given = true;
                }
                "max_attempts" => defaults.max_attempts = expect_u32(file, &path, value, 1)?,
                // Every other key was refused by `check_keys` above.
                _ => {}
            }
        }
        let sm = expect_map(file, "execution.stages", field(exec, "stages"))?;
        let mut stages = Vec::with_capacity(sm.len());
        for (id, node) in sm {
            let path = join("execution.stages", id);
            stages.push((id.clone(), parse_stage(file, &path, node)?));
        }
        Ok(ExecutionConfig {
            defaults,
            gpus_per_node_given,
            stages,
            stage_origins: BTreeMap::new(),
        })
    }
}

fn parse_stage(file: &str, path: &str, node: &Value) -> Result<StageExecutionConfig, PlanError> {
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &STAGE_KEYS)?;
    let mut s = StageExecutionConfig::default();
    for (key, value) in m {
        let p = join(path, key);
        if value.is_null() {
            continue;
        }
        match key.as_str() {
            "strategy" => s.strategy = Some(Strategy::from_value(file, &p, value)?),
            "instances" => s.instances = Some(expect_u32(file, &p, value, 1)?),
            "failure_policy" => {
                s.failure_policy = Some(FailurePolicy::from_value(file, &p, value)?)
            }
            "partition" => s.partition = expect_opt_str(file, &p, value)?,
            "resource" => s.resource = Some(Resource::from_value(file, &p, value)?),
            "gpus_per_node" => s.gpus_per_node = Some(expect_u32(file, &p, value, 1)?),
            "parallel" => s.parallel = ParallelMeshOverride::from_mapping(file, &p, value)?,
            "max_attempts" => s.max_attempts = Some(expect_u32(file, &p, value, 1)?),
            "time_limit" => match value {
                Value::String(t) if t.parse::<SlurmTime>().is_ok() => s.time_limit = t.parse().ok(),
                other => return Err(invalid(file, &p, other, "a Slurm time such as \"4:00:00\"")),
            },
            "heartbeat_timeout_s" => {
                s.heartbeat_timeout_s = Some(u64::from(expect_u32(file, &p, value, 1)?))
            }
            "warning_signal" => {
                let text = match value {
                    Value::String(t) => t.clone(),
                    Value::Int(i) => i.to_string(),
                    other => {
                        return Err(invalid(
                            file,
                            &p,
                            other,
                            "`SIGNAL@SECONDS` such as \"USR2@180\"",
                        ));
                    }
                };
                match WarningSignal::parse(&text) {
                    Ok(w) => s.warning_signal = Some(w),
                    Err(_) => {
                        return Err(invalid(
                            file,
                            &p,
                            value,
                            "`SIGNAL@SECONDS` such as \"USR2@180\" (USR2, USR1, TERM, INT, HUP, URG or ALRM; seconds >= 1)",
                        ));
                    }
                }
            }
            // Every other key was refused by `check_keys` above.
            _ => {}
        }
    }
    Ok(s)
}

/// What is wrong with a stage's warning signal (N03), one line each, for the dry run: no time
/// limit (never sent), a lead not shorter than the limit (sent at the start), a lead under
/// [`MIN_WARNING_LEAD`] (too short for a checkpoint plus Slurm's `KillWait` plus a margin), a
/// stage that cannot resume (the checkpoint is never used), `USR1` on a distributed stage
/// (NCCL uses `SIGUSR1` itself).
pub fn warning_signal_problems(
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
pub const MIN_WARNING_LEAD: std::time::Duration = std::time::Duration::from_secs(180);

/// The compiled execution of one stage: everything the controller needs to run it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
