//! The runner config: where stages run (`local`, `slurm`, `baremetal`, `ray`) and the
//! [`ExecutionContract`] every worker runs under.
//!
//! ```yaml
//! runner:
//!   kind: slurm
//!   slurm: {account: acct, partition: [a, b], time_limit: "4:00:00", max_nodes: 20}
//!   execution_contract: {repository: /opt/src, venv: /venv, container: image}
//! ```
//!
//! A Ray cluster (the Jobs API of its dashboard; the campaign folder on a filesystem its
//! nodes share):
//!
//! ```yaml
//! runner:
//!   kind: ray
//!   ray:
//!     address: http://127.0.0.1:8265
//!     token_env: RAY_TOKEN            # optional: the variable holding the cluster's token
//!     namespace: my-team              # optional: RAY_NAMESPACE of the jobs' drivers
//!     resources_per_gpu: {CPU: 4}     # optional: reserved per GPU of a job
//!     gpus_per_node: 8                # the GPU nodes' size, for packing (default 8)
//!     autoscaler: false               # true: nodes are added on demand (KubeRay)
//!   execution_contract: {repository: /shared/src, venv: /shared/venv}
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::{KeyPath, Value};
use super::plan_error::PlanError;
use super::schema::{AtLeast, StrList, did_you_mean, get, join, read};
use super::slurm_time::SlurmTime;
use crate::identity::Hash;

/// Which kind of machines run the stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunnerKind {
    /// Processes on this machine.
    Local,
    /// Slurm batch jobs (`sbatch`).
    Slurm,
    /// Hosts reached over SSH, from an inventory.
    Baremetal,
    /// Jobs of a Ray cluster, through its dashboard's Jobs API (feature `ray`).
    Ray,
}

impl RunnerKind {
    /// The config spelling: `local`, `slurm`, `baremetal`, `ray`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunnerKind::Local => "local",
            RunnerKind::Slurm => "slurm",
            RunnerKind::Baremetal => "baremetal",
            RunnerKind::Ray => "ray",
        }
    }
}

/// One or more Slurm partitions; Slurm takes a comma-separated list of eligible partitions.
/// Read from a string (`"a"` or `"a,b"`) or a list of strings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[non_exhaustive]
pub struct Partitions(pub Vec<String>);

impl Partitions {
    /// The `--partition` value: names joined with commas.
    pub fn to_slurm(&self) -> String {
        self.0.join(",")
    }

    /// Whether no partition is named (Slurm then uses the site default).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `name` can be a Slurm partition name: letters, digits, `-`, `_` or `.`.
pub(crate) fn is_partition_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// One partition name, checked ([`is_partition_name`]).
struct PartitionName(String);

const PARTITION_NAME: &str = "a partition name made of letters, digits, '-', '_' or '.'";

impl<'de> Deserialize<'de> for PartitionName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = PartitionName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(PARTITION_NAME)
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<PartitionName, E> {
                if is_partition_name(s) {
                    Ok(PartitionName(s.to_string()))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// Reads a partition name, `"a,b"` (spaces around names allowed) or a list of names; every
/// name is checked (letters, digits, `-`, `_` or `.`), so nothing else reaches `--partition`.
impl<'de> Deserialize<'de> for Partitions {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Partitions;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a partition name, \"a,b\" or a list of names")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Partitions, E> {
                let names: Vec<String> = s.split(',').map(|p| p.trim().to_string()).collect();
                if names.iter().all(|n| is_partition_name(n)) {
                    Ok(Partitions(names))
                } else {
                    Err(E::invalid_value(
                        serde::de::Unexpected::Str(s),
                        &"partition names made of letters, digits, '-', '_' or '.'",
                    ))
                }
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Partitions, A::Error> {
                let mut names = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(PartitionName(n)) = seq.next_element()? {
                    names.push(n);
                }
                Ok(Partitions(names))
            }
        }
        d.deserialize_any(V)
    }
}

/// Slurm settings of a `slurm` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SlurmSettings {
    /// `--account`.
    pub account: Option<String>,
    /// Default `--partition` for stages without their own.
    pub partition: Partitions,
    /// Partition used for stages whose execution `partition` is the role `interactive`.
    pub partition_interactive: Option<Partitions>,
    /// Partition used for the role `batch`.
    pub partition_batch: Option<Partitions>,
    /// Partition used for the role `cpu` (CPU/IO stages).
    pub partition_cpu: Option<Partitions>,
    /// Most nodes a stage on the interactive partition may request.
    pub interactive_max_nodes: Option<u32>,
    /// Most nodes any one stage may request.
    pub max_nodes: Option<u32>,
    /// `--time` (Slurm's `[D-]HH:MM:SS` or minutes), parsed.
    pub time_limit: Option<SlurmTime>,
    /// `--qos`.
    pub qos: Option<String>,
    /// `--reservation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// `--constraint`.
    pub constraint: Option<String>,
    /// Folder for job logs, relative to the campaign folder (absolute paths and `..` are
    /// refused: no config value chooses a path outside the campaign folder).
    pub log_dir: Option<String>,
}

impl SlurmSettings {
    /// The partition for a stage's execution `partition` value: a role (`interactive`,
    /// `batch`, `cpu`) maps through `partition_<role>` when that is set; any other value is a
    /// literal partition list; `None` falls back to the default `partition`.
    pub fn resolve_partition(&self, stage_partition: Option<&str>) -> Partitions {
        let role = match stage_partition {
            None => return self.partition.clone(),
            Some("interactive") => self.partition_interactive.as_ref(),
            Some("batch") => self.partition_batch.as_ref(),
            Some("cpu") => self.partition_cpu.as_ref(),
            Some(_) => None,
        };
        match (role, stage_partition) {
            (Some(p), _) if !p.is_empty() => p.clone(),
            // `cpu` with no `partition_cpu`: "CPU/IO stages use the regular partition when unset".
            (_, Some("cpu")) => self.partition.clone(),
            (_, Some(literal)) => {
                Partitions(literal.split(',').map(|s| s.trim().to_string()).collect())
            }
            (_, None) => self.partition.clone(),
        }
    }
}

use crate::executor::{BaremetalInventory, ExecutionContract, Host};

/// Settings of a `local` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LocalSettings {
    /// How many GPUs of this machine the plan may use (the node size GPU packing assumes, an
    /// integer >= 1; a count, not `CUDA_VISIBLE_DEVICES` ids); `None` = all, as the executor
    /// detects them.
    pub gpus: Option<u32>,
    /// Folder for job logs, relative to the campaign folder (as for Slurm).
    pub log_dir: Option<String>,
}

/// An amount of a Ray resource (CPUs, bytes of memory, a custom resource), compared by its
/// bits so runner configs stay `Eq`.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RayAmount(pub f64);

impl PartialEq for RayAmount {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for RayAmount {}

/// Settings of a `ray` runner (usually read from a runner file; in code, [`RaySettings::new`]
/// and the `with_*` methods).
///
/// ```
/// use puzzletron::campaign::RaySettings;
/// let r = RaySettings::new("http://head:8265")
///     .with_namespace("sweeps")
///     .with_resource_per_gpu("CPU", 4.0)
///     .with_gpus_per_node(8);
/// assert_eq!((r.address.as_str(), r.gpus_per_node), ("http://head:8265", Some(8)));
/// assert_eq!(r.resources_per_gpu["CPU"].0, 4.0);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RaySettings {
    /// The dashboard's Jobs API, `http://host:port` (Ray's default port is 8265).
    pub address: String,
    /// The name of the environment variable holding the cluster's auth token (never the
    /// token: it is read when the executor is built and never written).
    pub token_env: Option<String>,
    /// The Ray namespace of the jobs' drivers.
    pub namespace: Option<String>,
    /// Ray resources reserved per GPU of a job (`CPU`, `memory` in bytes, custom names).
    pub resources_per_gpu: std::collections::BTreeMap<String, RayAmount>,
    /// GPUs of the cluster's GPU nodes, the node size GPU packing assumes (default 8).
    pub gpus_per_node: Option<u32>,
    /// The cluster adds nodes on demand: a job larger than today's nodes is submitted (it
    /// pends) instead of refused.
    #[serde(default)]
    pub autoscaler: bool,
    /// Folder for job logs, relative to the campaign folder (as for Slurm).
    pub log_dir: Option<String>,
}

impl RaySettings {
    /// Settings for the dashboard at `address` (`http://host:port`), everything else unset.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            ..Self::default()
        }
    }

    /// Sets the name of the environment variable holding the cluster's auth token.
    pub fn with_token_env(mut self, name: impl Into<String>) -> Self {
        self.token_env = Some(name.into());
        self
    }

    /// Sets the Ray namespace of the jobs' drivers.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Adds a Ray resource reserved per GPU of a job (`CPU`, `memory` in bytes, a custom name).
    pub fn with_resource_per_gpu(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.resources_per_gpu
            .insert(name.into(), RayAmount(amount));
        self
    }

    /// Sets the GPUs of the cluster's GPU nodes (the node size GPU packing assumes).
    pub fn with_gpus_per_node(mut self, gpus: u32) -> Self {
        self.gpus_per_node = Some(gpus);
        self
    }

    /// Sets whether the cluster adds nodes on demand.
    pub fn with_autoscaler(mut self, autoscaler: bool) -> Self {
        self.autoscaler = autoscaler;
        self
    }

    /// Sets the folder for job logs, relative to the campaign folder.
    pub fn with_log_dir(mut self, dir: impl Into<String>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }
}

/// A runner config: the kind of machines, their settings and the execution contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunnerEnvironment {
    /// Which machines.
    pub kind: RunnerKind,
    /// Slurm settings (present iff `kind` is `slurm`).
    pub slurm: Option<SlurmSettings>,
    /// Bare-metal inventory (present iff `kind` is `baremetal`).
    pub inventory: Option<BaremetalInventory>,
    /// Local settings (`kind: local`).
    pub local: Option<LocalSettings>,
    /// Ray settings (present iff `kind` is `ray`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ray: Option<RaySettings>,
    /// What workers run under.
    pub execution_contract: ExecutionContract,
}

impl RunnerEnvironment {
    /// A local runner with an empty contract.
    pub fn local() -> Self {
        RunnerEnvironment {
            kind: RunnerKind::Local,
            slurm: None,
            inventory: None,
            local: Some(LocalSettings::default()),
            ray: None,
            execution_contract: ExecutionContract::default(),
        }
    }

    /// A Slurm runner with these settings and an empty contract.
    pub fn slurm(settings: SlurmSettings) -> Self {
        RunnerEnvironment {
            kind: RunnerKind::Slurm,
            slurm: Some(settings),
            local: None,
            ..Self::local()
        }
    }

    /// A bare-metal (SSH) runner over these hosts, with an empty contract.
    pub fn baremetal(inventory: BaremetalInventory) -> Self {
        RunnerEnvironment {
            kind: RunnerKind::Baremetal,
            inventory: Some(inventory),
            local: None,
            ..Self::local()
        }
    }

    /// A Ray runner with these settings and an empty contract.
    ///
    /// ```
    /// use puzzletron::campaign::{RaySettings, RunnerEnvironment, RunnerKind};
    /// use puzzletron::executor::ExecutionContract;
    /// let r = RunnerEnvironment::ray(RaySettings::new("http://head:8265").with_gpus_per_node(8))
    ///     .with_execution_contract(ExecutionContract::default());
    /// assert_eq!(r.kind, RunnerKind::Ray);
    /// assert_eq!(r.ray.unwrap().gpus_per_node, Some(8));
    /// ```
    pub fn ray(settings: RaySettings) -> Self {
        RunnerEnvironment {
            kind: RunnerKind::Ray,
            ray: Some(settings),
            local: None,
            ..Self::local()
        }
    }

    /// Sets what workers run under (repository, venv, container, setup commands).
    pub fn with_execution_contract(mut self, contract: ExecutionContract) -> Self {
        self.execution_contract = contract;
        self
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
        Self::from_value(&label, cfg.value()).map_err(|e| e.locate(&label, cfg.origins()))
    }

    /// Reads a runner from a loaded config tree (the whole file, with its top-level `runner:`).
    /// `file` names the source in errors.
    ///
    /// The file's shape is a set of `#[serde(deny_unknown_fields)]` types read with serde;
    /// values whose grammar is known are typed there (a Slurm time limit, partition names,
    /// host names, ports, counts), the rest is checked here.
    ///
    /// # Errors
    /// [`PlanError::UnknownField`] (key path + suggestion), [`PlanError::InvalidValue`],
    /// [`PlanError::MissingField`] for a missing `runner.kind`, or a section that does not
    /// belong to the kind (e.g. `inventory` in a Slurm runner).
    pub fn from_value(file: &str, root: &Value) -> Result<Self, PlanError> {
        let raw: RunnerFile = if root.is_null() {
            RunnerFile::default()
        } else {
            read(file, KeyPath::root(), root)?
        };
        let has_runner = get(root, "runner")
            .and_then(Value::as_mapping)
            .is_some_and(|m| !m.is_empty());
        let runner = match raw.runner {
            Some(r) if has_runner => r,
            _ => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: "runner".into(),
                    expected: "a runner mapping".into(),
                });
            }
        };
        let Some(kind) = runner.kind else {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: "runner.kind".into(),
                expected: "local, slurm, baremetal or ray".into(),
            });
        };
        let wrong_section = |section: &str| PlanError::InvalidValue {
            file: file.into(),
            path: format!("runner.{section}"),
            value: "present".into(),
            expected: format!(
                "no `{section}` section in a `{kind}` runner: {}",
                match (kind, section) {
                    (RunnerKind::Slurm, _) => "a slurm runner takes `slurm` settings",
                    (_, "slurm") =>
                        "its executor has no scheduler, so account, partition, \
                                     qos, reservation, constraint and time_limit cannot be \
                                     expressed (the job's environment goes in \
                                     `execution_contract`)",
                    (RunnerKind::Local, _) => "a local runner takes `local: {gpus, log_dir}`",
                    (RunnerKind::Baremetal, _) => "a baremetal runner takes `inventory`",
                    (RunnerKind::Ray, _) =>
                        "a ray runner takes `ray: {address, token_env, \
                                             namespace, resources_per_gpu, gpus_per_node, \
                                             autoscaler, log_dir}`",
                },
                kind = kind.as_str()
            ),
        };
        let slurm = match (runner.slurm, kind) {
            (Some(_), k) if k != RunnerKind::Slurm => return Err(wrong_section("slurm")),
            (Some(raw), _) => Some(raw.into_settings()),
            (None, RunnerKind::Slurm) => Some(SlurmSettings::default()),
            (None, _) => None,
        };
        let inventory = match (runner.inventory, kind) {
            (Some(_), k) if k != RunnerKind::Baremetal => return Err(wrong_section("inventory")),
            (Some(raw), _) => Some(raw.into_inventory(file)?),
            (None, RunnerKind::Baremetal) => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: "runner.inventory".into(),
                    expected: "the hosts of a baremetal runner".into(),
                });
            }
            (None, _) => None,
        };
        let local = match (runner.local, kind) {
            (Some(_), k) if k != RunnerKind::Local => return Err(wrong_section("local")),
            (Some(raw), _) => Some(LocalSettings {
                gpus: raw.gpus.map(|g| g.0),
                log_dir: raw.log_dir,
            }),
            (None, RunnerKind::Local) => Some(LocalSettings::default()),
            (None, _) => None,
        };
        let ray = match (runner.ray, kind) {
            (Some(_), k) if k != RunnerKind::Ray => return Err(wrong_section("ray")),
            (Some(raw), _) => Some(raw.into_settings(file)?),
            (None, RunnerKind::Ray) => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: "runner.ray".into(),
                    expected: "the Ray settings, at least `address: http://HOST:8265`".into(),
                });
            }
            (None, _) => None,
        };
        let execution_contract = runner
            .execution_contract
            .map(RawContract::into_contract)
            .unwrap_or_default();
        if kind != RunnerKind::Slurm
            && let Some(container) = execution_contract
                .container
                .as_ref()
                .or(execution_contract.container_mounts.as_ref())
        {
            return Err(PlanError::InvalidValue {
                file: file.into(),
                path: if execution_contract.container.is_some() {
                    "runner.execution_contract.container".into()
                } else {
                    "runner.execution_contract.container_mounts".into()
                },
                value: format!("{container:?}"),
                expected: format!(
                    "no container: the {} executor has no container runtime (only the slurm \
                     runner starts containers, through pyxis's srun --container-image); \
                     the {} runner supports repository, venv, setup_env, prerun_commands and \
                     postrun_commands",
                    kind.as_str(),
                    kind.as_str()
                ),
            });
        }
        let env = RunnerEnvironment {
            kind,
            slurm,
            inventory,
            local,
            ray,
            execution_contract,
        };
        if let Some(d) = env.log_dir() {
            let p = std::path::Path::new(d);
            if d.is_empty()
                || p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(PlanError::InvalidValue {
                    file: file.into(),
                    path: format!("runner.{}.log_dir", kind.as_str()),
                    value: format!("{d:?}"),
                    expected: "a folder relative to the campaign folder, without `..` (job \
                               logs stay inside the campaign folder)"
                        .into(),
                });
            }
        }
        Ok(env)
    }

    /// A [`BareMetalExecutorBuilder`](crate::executor::BareMetalExecutorBuilder) keeping its
    /// GPU leases in `state_dir` (the campaign folder), with this runner's inventory (hosts,
    /// rendezvous host and first port) and execution contract (checked by the preflight).
    ///
    /// # Errors
    /// [`PlanError::InvalidValue`] naming `runner.kind` when the runner is not `baremetal`, or
    /// [`PlanError::MissingField`] for `runner.inventory` when it has no inventory.
    pub fn baremetal_executor(
        &self,
        state_dir: impl Into<std::path::PathBuf>,
    ) -> Result<crate::executor::BareMetalExecutorBuilder, PlanError> {
        if self.kind != RunnerKind::Baremetal {
            return Err(PlanError::InvalidValue {
                file: "<runner>".into(),
                path: "runner.kind".into(),
                value: self.kind.as_str().into(),
                expected: "baremetal for the bare-metal executor".into(),
            });
        }
        let inv = self
            .inventory
            .as_ref()
            .ok_or_else(|| PlanError::MissingField {
                file: "<runner>".into(),
                path: "runner.inventory".into(),
                expected: "the hosts of the baremetal runner".into(),
            })?;
        Ok(crate::executor::BareMetalExecutor::builder(state_dir)
            .inventory(inv)
            .contract(&self.execution_contract))
    }

    /// A [`RayExecutorBuilder`](crate::executor::RayExecutorBuilder) for this runner's
    /// cluster, namespace, token variable, resources per GPU and contract, tagging every job
    /// with `campaign_tag` (feature `ray`).
    ///
    /// # Errors
    /// [`PlanError::InvalidValue`] naming `runner.kind` when the runner is not `ray`.
    #[cfg(feature = "ray")]
    pub fn ray_executor(
        &self,
        campaign_tag: &str,
    ) -> Result<crate::executor::RayExecutorBuilder, PlanError> {
        let Some(r) = self.ray.as_ref().filter(|_| self.kind == RunnerKind::Ray) else {
            return Err(PlanError::InvalidValue {
                file: "<runner>".into(),
                path: "runner.kind".into(),
                value: self.kind.as_str().into(),
                expected: "ray (with a `ray:` section) for the Ray executor".into(),
            });
        };
        let mut b = crate::executor::RayExecutor::builder(r.address.clone())
            .campaign_tag(campaign_tag)
            .autoscaler(r.autoscaler)
            .contract(&self.execution_contract);
        if let Some(t) = &r.token_env {
            b = b.token_env(t.clone());
        }
        if let Some(ns) = &r.namespace {
            b = b.namespace(ns.clone());
        }
        for (k, v) in &r.resources_per_gpu {
            b = b.resource_per_gpu(k.clone(), v.0);
        }
        Ok(b)
    }

    /// The values still reading `REPLACE_WITH_...` (the placeholders of the shared runner
    /// files), as `(key path, value)` sorted by key path: `runner.slurm.account`,
    /// `runner.slurm.partition[0]`, `runner.execution_contract.prerun_commands[1]`, ...
    pub fn placeholders(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Ok(v) = serde_json::to_value(self) {
            collect_placeholders("runner", &v, &mut out);
        }
        // Never serde_json's map order (a dependency's `preserve_order` would change it).
        out.sort();
        out
    }

    /// Refuses a runner with a placeholder value ([`Self::placeholders`]): the first one by
    /// key path, naming the others, as [`PlanError::Placeholder`] (locate it with
    /// [`PlanError::locate_runner`]).
    ///
    /// # Errors
    /// [`PlanError::Placeholder`] naming the key and value.
    pub fn check_placeholders(&self, file: &str) -> Result<(), PlanError> {
        let mut all = self.placeholders().into_iter();
        match all.next() {
            Some((path, value)) => Err(PlanError::Placeholder {
                file: file.into(),
                path,
                value,
                more: all.map(|(p, _)| format!("`{p}`")).collect(),
            }),
            None => Ok(()),
        }
    }

    /// The job log folder the runner names (`slurm.log_dir` or `local.log_dir`), relative to
    /// the campaign folder; `None` = the default `logs`.
    pub fn log_dir(&self) -> Option<&str> {
        match self.kind {
            RunnerKind::Slurm => self.slurm.as_ref().and_then(|s| s.log_dir.as_deref()),
            RunnerKind::Local => self.local.as_ref().and_then(|l| l.log_dir.as_deref()),
            RunnerKind::Ray => self.ray.as_ref().and_then(|r| r.log_dir.as_deref()),
            RunnerKind::Baremetal => None,
        }
    }

    /// Hash of the execution contract (see [`ExecutionContract::hash`]).
    pub fn contract_hash(&self) -> Hash {
        self.execution_contract.hash()
    }
}

/// The marker of a placeholder in the shared runner files.
pub(crate) const PLACEHOLDER_MARKER: &str = "REPLACE_WITH_";

fn collect_placeholders(path: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::String(s) if s.contains(PLACEHOLDER_MARKER) => {
            out.push((path.to_string(), s.clone()));
        }
        serde_json::Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                collect_placeholders(&format!("{path}[{i}]"), x, out);
            }
        }
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                collect_placeholders(&format!("{path}.{k}"), x, out);
            }
        }
        _ => {}
    }
}

// The runner file's shape, as serde reads it. Every key is optional here (an explicit `null`
// is the same as an absent key); what is required, and which sections go with which kind, is
// checked by `RunnerEnvironment::from_value`.

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with a `runner:` key")]
struct RunnerFile {
    runner: Option<RawRunner>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a runner mapping {kind, slurm, inventory, local, ray, execution_contract}"
)]
struct RawRunner {
    kind: Option<RunnerKind>,
    slurm: Option<RawSlurm>,
    inventory: Option<RawInventory>,
    local: Option<RawLocal>,
    ray: Option<RawRay>,
    execution_contract: Option<RawContract>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of Slurm settings")]
struct RawSlurm {
    account: Option<OneLine>,
    partition: Option<Partitions>,
    partition_interactive: Option<Partitions>,
    partition_batch: Option<Partitions>,
    partition_cpu: Option<Partitions>,
    interactive_max_nodes: Option<AtLeast<1>>,
    max_nodes: Option<AtLeast<1>>,
    time_limit: Option<SlurmTime>,
    qos: Option<OneLine>,
    reservation: Option<OneLine>,
    constraint: Option<OneLine>,
    log_dir: Option<OneLine>,
}

impl RawSlurm {
    fn into_settings(self) -> SlurmSettings {
        SlurmSettings {
            account: self.account.map(|v| v.0),
            partition: self.partition.unwrap_or_default(),
            partition_interactive: self.partition_interactive,
            partition_batch: self.partition_batch,
            partition_cpu: self.partition_cpu,
            interactive_max_nodes: self.interactive_max_nodes.map(|n| n.0),
            max_nodes: self.max_nodes.map(|n| n.0),
            time_limit: self.time_limit,
            qos: self.qos.map(|v| v.0),
            reservation: self.reservation.map(|v| v.0),
            constraint: self.constraint.map(|v| v.0),
            log_dir: self.log_dir.map(|v| v.0),
        }
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping {rendezvous_host, rendezvous_port_base, hosts}"
)]
struct RawInventory {
    rendezvous_host: Option<HostName>,
    rendezvous_port_base: Option<Port>,
    hosts: Option<Vec<RawHost>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a host mapping {hostname, gpus}")]
struct RawHost {
    hostname: Option<HostName>,
    gpus: Option<AtLeast<0>>,
}

impl RawInventory {
    fn into_inventory(self, file: &str) -> Result<BaremetalInventory, PlanError> {
        let path = "runner.inventory";
        let Some(HostName(rendezvous_host)) = self.rendezvous_host else {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: join(path, "rendezvous_host"),
                expected: "the host name of the rendezvous".into(),
            });
        };
        let raw_hosts = match self.hosts {
            Some(h) if !h.is_empty() => h,
            _ => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: join(path, "hosts"),
                    expected: "a non-empty list of {hostname, gpus}".into(),
                });
            }
        };
        let mut hosts: Vec<Host> = Vec::with_capacity(raw_hosts.len());
        for (i, h) in raw_hosts.into_iter().enumerate() {
            let hp = format!("{path}.hosts[{i}]");
            let Some(HostName(hostname)) = h.hostname else {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: join(&hp, "hostname"),
                    expected: "a host name".into(),
                });
            };
            let Some(AtLeast(gpus)) = h.gpus else {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: join(&hp, "gpus"),
                    expected: "the number of GPUs of the host, an integer >= 0".into(),
                });
            };
            if hosts.iter().any(|h| h.hostname == hostname) {
                return Err(PlanError::InvalidValue {
                    file: file.into(),
                    path: join(&hp, "hostname"),
                    value: format!("{hostname:?}"),
                    expected: "a host name not already in the inventory".into(),
                });
            }
            hosts.push(Host { hostname, gpus });
        }
        if !hosts.iter().any(|h| h.hostname == rendezvous_host) {
            return Err(PlanError::InvalidValue {
                file: file.into(),
                path: join(path, "rendezvous_host"),
                value: format!("{rendezvous_host:?}"),
                expected: format!(
                    "one of the inventory hosts ({}){}",
                    hosts
                        .iter()
                        .map(|h| h.hostname.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    did_you_mean(&rendezvous_host, hosts.iter().map(|h| h.hostname.as_str()))
                        .map(|s| format!("; did you mean `{s}`?"))
                        .unwrap_or_default()
                ),
            });
        }
        Ok(BaremetalInventory {
            rendezvous_host,
            rendezvous_port_base: self.rendezvous_port_base.map_or(29500, |p| p.0),
            hosts,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping {gpus, log_dir}")]
struct RawLocal {
    gpus: Option<AtLeast<1>>,
    log_dir: Option<String>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping {address, token_env, namespace, resources_per_gpu, gpus_per_node, \
                 autoscaler, log_dir}"
)]
struct RawRay {
    address: Option<String>,
    token_env: Option<String>,
    namespace: Option<String>,
    resources_per_gpu: Option<std::collections::BTreeMap<String, f64>>,
    gpus_per_node: Option<AtLeast<1>>,
    autoscaler: Option<bool>,
    log_dir: Option<String>,
}

impl RawRay {
    fn into_settings(self, file: &str) -> Result<RaySettings, PlanError> {
        let invalid = |path: String, value: String, expected: &str| PlanError::InvalidValue {
            file: file.into(),
            path,
            value,
            expected: expected.into(),
        };
        let Some(address) = self.address else {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: "runner.ray.address".into(),
                expected: "the Ray dashboard's http://HOST:PORT (e.g. http://127.0.0.1:8265)"
                    .into(),
            });
        };
        let hostport = address.trim_end_matches('/').strip_prefix("http://");
        if hostport.is_none_or(|h| {
            h.is_empty() || h.contains(['/', '?', '#', ' ', '@']) || h.chars().any(char::is_control)
        }) {
            return Err(invalid(
                "runner.ray.address".into(),
                format!("{address:?}"),
                "the dashboard's http://HOST:PORT (plain HTTP, e.g. http://127.0.0.1:8265; \
                 reach a TLS dashboard through kubectl port-forward or a local proxy)",
            ));
        }
        if let Some(v) = &self.token_env
            && !super::super::executor::shell::is_var_name(v)
        {
            return Err(invalid(
                "runner.ray.token_env".into(),
                format!("{v:?}"),
                "the NAME of an environment variable holding the token (letters, digits, _), \
                 never the token itself",
            ));
        }
        if self.namespace.as_deref() == Some("") {
            return Err(invalid(
                "runner.ray.namespace".into(),
                "\"\"".into(),
                "a non-empty namespace, or no key",
            ));
        }
        let mut resources = std::collections::BTreeMap::new();
        for (k, v) in self.resources_per_gpu.unwrap_or_default() {
            if k.is_empty() || k == "GPU" || !v.is_finite() || v <= 0.0 {
                return Err(invalid(
                    join("runner.ray.resources_per_gpu", &k),
                    v.to_string(),
                    "a positive amount of a resource other than GPU (GPUs come from the stage)",
                ));
            }
            resources.insert(k, RayAmount(v));
        }
        Ok(RaySettings {
            address,
            token_env: self.token_env,
            namespace: self.namespace,
            resources_per_gpu: resources,
            gpus_per_node: self.gpus_per_node.map(|g| g.0),
            autoscaler: self.autoscaler.unwrap_or(false),
            log_dir: self.log_dir,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of the execution contract")]
struct RawContract {
    repository: Option<ContractPath>,
    venv: Option<ContractPath>,
    container: Option<String>,
    container_mounts: Option<String>,
    setup_env: Option<String>,
    prerun_commands: Option<StrList>,
    postrun_commands: Option<StrList>,
}

impl RawContract {
    fn into_contract(self) -> ExecutionContract {
        ExecutionContract {
            repository: self.repository.map(|v| v.0),
            venv: self.venv.map(|v| v.0),
            container: self.container,
            container_mounts: self.container_mounts,
            setup_env: self.setup_env,
            prerun_commands: self.prerun_commands.unwrap_or_default().0,
            postrun_commands: self.postrun_commands.unwrap_or_default().0,
        }
    }
}

/// A value that goes into one line of a job script (`#SBATCH --account=...`): no newline or
/// other control character, which would end the line and start another directive.
struct OneLine(String);

impl<'de> Deserialize<'de> for OneLine {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OneLine;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "a single line without control characters (it goes into one #SBATCH line \
                     of the job script; remove the newline)",
                )
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<OneLine, E> {
                if s.chars().any(char::is_control) {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                } else {
                    Ok(OneLine(s.to_string()))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A path of the execution contract (the repository, the virtual environment; empty = none):
/// one line, no `..` component (a path that climbs out of where it names is refused, not normalised).
struct ContractPath(String);

impl<'de> Deserialize<'de> for ContractPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ContractPath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path without `..` components or control characters (write the folder itself)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ContractPath, E> {
                let climbs = std::path::Path::new(s)
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
                if climbs || s.chars().any(char::is_control) {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                } else {
                    Ok(ContractPath(s.to_string()))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// An SSH host name: not empty, no whitespace, not starting with `-` (it is an `ssh` argument).
struct HostName(String);

impl<'de> Deserialize<'de> for HostName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = HostName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a host name (no spaces, not starting with '-')")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<HostName, E> {
                if !s.is_empty() && !s.starts_with('-') && !s.chars().any(char::is_whitespace) {
                    Ok(HostName(s.to_string()))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A rendezvous TCP port, 1024..=65535.
struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Port;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TCP port in 1024..=65535")
            }
            fn visit_u64<E: serde::de::Error>(self, p: u64) -> Result<Port, E> {
                match u16::try_from(p) {
                    Ok(p) if p >= 1024 => Ok(Port(p)),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Unsigned(p), &self)),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, p: i64) -> Result<Port, E> {
                match u64::try_from(p) {
                    Ok(p) => self.visit_u64(p),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(p), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<RunnerEnvironment, PlanError> {
        RunnerEnvironment::from_value("runner.yaml", &Value::from_json(&v))
    }

    #[test]
    fn partitions_from_string_comma_list_and_list() {
        for p in [json!("a,b"), json!(["a", "b"]), json!("a, b")] {
            let r = parse(json!({"runner": {"kind": "slurm", "slurm": {"partition": p}}})).unwrap();
            assert_eq!(
                r.slurm.unwrap().partition,
                Partitions(vec!["a".into(), "b".into()])
            );
        }
        let r =
            parse(json!({"runner": {"kind": "slurm", "slurm": {"partition": "batch"}}})).unwrap();
        assert_eq!(r.slurm.unwrap().partition.to_slurm(), "batch");
        assert!(
            parse(json!({"runner": {"kind": "slurm", "slurm": {"partition": "a;rm -rf /"}}}))
                .is_err()
        );
    }

    #[test]
    fn unknown_keys_name_the_path_and_suggest() {
        let e = parse(json!({"runner": {"kind": "slurm", "slurm": {"acount": "x"}}})).unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("runner.slurm.acount") && m.contains("did you mean `account`"),
            "{m}"
        );
        let e = parse(json!({"runner": {"kind": "slurm", "execution_contract": {"venvv": "/v"}}}))
            .unwrap_err();
        assert!(
            e.to_string().contains("runner.execution_contract.venvv"),
            "{e}"
        );
        let e = parse(json!({"runner": {"kind": "slurmm"}})).unwrap_err();
        assert!(e.to_string().contains("did you mean `slurm`"), "{e}");
    }

    fn err(v: serde_json::Value) -> String {
        parse(v).unwrap_err().to_string()
    }

    #[test]
    fn typed_values_are_checked_where_they_are_read() {
        // Partition names are checked one by one: the error names the list index and value.
        let m = err(json!({"runner": {"kind": "slurm", "slurm": {"partition": ["a", "b;rm"]}}}));
        assert_eq!(
            m,
            "runner.yaml: `runner.slurm.partition[1]` = \"b;rm\": expected a partition name made of letters, digits, '-', '_' or '.'"
        );
        // The Slurm time is parsed once, at reading; the error gives the grammar.
        let m = err(json!({"runner": {"kind": "slurm", "slurm": {"time_limit": "4h"}}}));
        assert!(
            m.starts_with("runner.yaml: `runner.slurm.time_limit` = \"4h\": expected a Slurm time M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"),
            "{m}"
        );
        let r = parse(json!({"runner": {"kind": "slurm", "slurm": {"time_limit": "1-02:00:00", "max_nodes": 4}}}))
            .unwrap();
        let s = r.slurm.unwrap();
        assert_eq!(s.time_limit.unwrap().as_duration().as_secs(), 93_600);
        assert_eq!(s.max_nodes, Some(4));
        let m = err(json!({"runner": {"kind": "slurm", "slurm": {"max_nodes": 0}}}));
        assert_eq!(
            m,
            "runner.yaml: `runner.slurm.max_nodes` = 0: expected an integer >= 1"
        );
        let m = err(
            json!({"runner": {"kind": "slurm", "execution_contract": {"prerun_commands": "echo"}}}),
        );
        assert_eq!(
            m,
            "runner.yaml: `runner.execution_contract.prerun_commands` = \"echo\": expected a list of strings"
        );
        let m = err(json!({"runner": {"kind": 3}}));
        assert!(
            m.contains("`runner.kind` = 3: expected one of local, slurm, baremetal"),
            "{m}"
        );
    }

    #[test]
    fn inventory_hosts_are_typed_and_required_keys_named() {
        let inv = |hosts: serde_json::Value| json!({"runner": {"kind": "baremetal", "inventory": {"rendezvous_host": "h1", "hosts": hosts}}});
        let m = err(inv(json!([{"hostname": "h1"}])));
        assert!(
            m.contains("missing required key `runner.inventory.hosts[0].gpus`"),
            "{m}"
        );
        let m = err(inv(
            json!([{"hostname": "h1", "gpus": 8}, {"hostname": "-oProxy", "gpus": 8}]),
        ));
        assert!(
            m.contains("`runner.inventory.hosts[1].hostname` = \"-oProxy\": expected a host name"),
            "{m}"
        );
        let m = err(inv(
            json!([{"hostname": "h1", "gpus": 8}, {"hostname": "h1", "gpus": 8}]),
        ));
        assert!(m.contains("not already in the inventory"), "{m}");
        let m = err(inv(json!([{"hostname": "h1", "gpus": 8, "gpu": 2}])));
        assert!(
            m.contains("unknown key `runner.inventory.hosts[0].gpu` (did you mean `gpus`?)"),
            "{m}"
        );
        let m = err(
            json!({"runner": {"kind": "baremetal", "inventory": {"rendezvous_host": "h1", "rendezvous_port_base": 80, "hosts": [{"hostname": "h1", "gpus": 8}]}}}),
        );
        assert!(
            m.contains("= 80: expected a TCP port in 1024..=65535"),
            "{m}"
        );
        let m = err(json!({"runner": {"kind": "local", "slurm": {"account": "a"}}}));
        assert!(m.contains("no `slurm` section in a `local` runner"), "{m}");
        let m =
            err(json!({"runner": {"kind": "local", "execution_contract": {"container": "img"}}}));
        assert!(m.contains("only the slurm runner starts containers"), "{m}");
        assert!(err(json!({"runner": {}})).contains("missing required key `runner`"));
        assert!(
            err(json!({"runner": {"slurm": {}}})).contains("missing required key `runner.kind`")
        );
    }

    #[test]
    fn load_errors_point_at_the_line_and_column_of_the_value() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("runner.yaml");
        std::fs::write(
            &p,
            "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: h1\n    hosts:\n      - {hostname: h1, gpus: 8}\n      - {hostname: h2, gpus: many}\n",
        )
        .unwrap();
        let m = RunnerEnvironment::load(&p).unwrap_err().to_string();
        assert_eq!(
            m,
            format!(
                "{}:7:30: `runner.inventory.hosts[1].gpus` = \"many\": expected an integer >= 0",
                p.display()
            )
        );
    }

    #[test]
    fn role_partitions_resolve() {
        let s = SlurmSettings {
            partition: Partitions(vec!["batch".into()]),
            partition_interactive: Some(Partitions(vec!["interactive".into()])),
            ..Default::default()
        };
        assert_eq!(
            s.resolve_partition(Some("interactive")).to_slurm(),
            "interactive"
        );
        assert_eq!(s.resolve_partition(Some("cpu")).to_slurm(), "batch");
        assert_eq!(s.resolve_partition(None).to_slurm(), "batch");
        assert_eq!(s.resolve_partition(Some("gpu-x")).to_slurm(), "gpu-x");
    }

    #[test]
    fn baremetal_requires_known_rendezvous_host() {
        let e = parse(json!({"runner": {"kind": "baremetal", "inventory": {"rendezvous_host": "h3", "hosts": [{"hostname": "h1", "gpus": 8}]}}})).unwrap_err();
        assert!(e.to_string().contains("rendezvous_host"), "{e}");
        let r = parse(json!({"runner": {"kind": "baremetal", "inventory": {"rendezvous_host": "h1", "hosts": [{"hostname": "h1", "gpus": 8}]}}})).unwrap();
        assert_eq!(r.inventory.unwrap().rendezvous_port_base, 29500);
    }

    #[test]
    fn ray_runner_reads_its_settings_and_refuses_bad_ones_by_key() {
        let r = parse(json!({"runner": {"kind": "ray", "ray": {
            "address": "http://127.0.0.1:8265", "token_env": "RAY_TOKEN", "namespace": "team",
            "resources_per_gpu": {"CPU": 4, "accel": 0.5}, "gpus_per_node": 4, "log_dir": "raylogs"
        }}}))
        .unwrap();
        assert_eq!(r.kind, RunnerKind::Ray);
        let ray = r.ray.as_ref().unwrap();
        assert_eq!(ray.address, "http://127.0.0.1:8265");
        assert_eq!(ray.token_env.as_deref(), Some("RAY_TOKEN"));
        assert_eq!(ray.resources_per_gpu["CPU"], RayAmount(4.0));
        assert_eq!(ray.gpus_per_node, Some(4));
        assert!(!ray.autoscaler);
        assert_eq!(r.log_dir(), Some("raylogs"));
        for (v, key) in [
            (json!({"runner": {"kind": "ray"}}), "runner.ray"),
            (
                json!({"runner": {"kind": "ray", "ray": {}}}),
                "runner.ray.address",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "127.0.0.1:8265"}}}),
                "runner.ray.address",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "https://h:8265"}}}),
                "runner.ray.address",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265", "token_env": "abc def-123"}}}),
                "runner.ray.token_env",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265", "resources_per_gpu": {"GPU": 1}}}}),
                "runner.ray.resources_per_gpu.GPU",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265", "resources_per_gpu": {"CPU": 0}}}}),
                "runner.ray.resources_per_gpu.CPU",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265", "adress": "x"}}}),
                "runner.ray.adress",
            ),
            (
                json!({"runner": {"kind": "slurm", "ray": {"address": "http://h:8265"}}}),
                "runner.ray",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265"}, "execution_contract": {"container": "img"}}}),
                "runner.execution_contract.container",
            ),
            (
                json!({"runner": {"kind": "ray", "ray": {"address": "http://h:8265", "log_dir": "/abs"}}}),
                "runner.ray.log_dir",
            ),
        ] {
            let m = err(v.clone());
            assert!(m.contains(key), "{v}: {m}");
        }
    }
}
