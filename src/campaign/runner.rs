//! The runner config: where stages run (`local`, `slurm`, `baremetal`) and the
//! [`ExecutionContract`] every worker runs under.
//!
//! ```yaml
//! runner:
//!   kind: slurm
//!   slurm: {account: acct, partition: [a, b], time_limit: "4:00:00", max_nodes: 20}
//!   execution_contract: {repository: /opt/src, venv: /venv, container: image}
//! ```

use serde::{Deserialize, Serialize};

use super::config::Value;
use super::plan_error::PlanError;
use super::schema::{
    check_keys, did_you_mean, expect_map, expect_opt_str, expect_str_list, expect_u32, field,
    invalid, join,
};
use super::slurm_time::SlurmTime;
use crate::identity::{Hash, Hasher};

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
}

impl RunnerKind {
    /// The config spelling: `local`, `slurm`, `baremetal`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RunnerKind::Local => "local",
            RunnerKind::Slurm => "slurm",
            RunnerKind::Baremetal => "baremetal",
        }
    }
}

/// One or more Slurm partitions; Slurm takes a comma-separated list of eligible partitions.
/// Read from a string (`"a"` or `"a,b"`) or a list of strings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

    fn parse(file: &str, path: &str, node: &Value) -> Result<Self, PlanError> {
        let names: Vec<String> = match node {
            Value::Null => Vec::new(),
            Value::String(s) => s.split(',').map(|p| p.trim().to_string()).collect(),
            Value::List(_) => expect_str_list(file, path, node)?,
            other => {
                return Err(invalid(
                    file,
                    path,
                    other,
                    "a partition name, \"a,b\" or a list of names",
                ));
            }
        };
        for name in &names {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(invalid(
                    file,
                    path,
                    node,
                    "partition names made of letters, digits, '-', '_' or '.'",
                ));
            }
        }
        Ok(Partitions(names))
    }
}

/// Slurm settings of a `slurm` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// `--constraint`.
    pub constraint: Option<String>,
    /// Folder for job logs, relative to the campaign folder unless absolute.
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

/// One host of a bare-metal inventory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// SSH host name.
    pub hostname: String,
    /// GPUs on the host.
    pub gpus: u32,
}

/// The hosts of a `baremetal` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaremetalInventory {
    /// Host of the torchrun rendezvous (must be one of `hosts`).
    pub rendezvous_host: String,
    /// First TCP port for rendezvous; each process group gets its own port from here.
    pub rendezvous_port_base: u16,
    /// The hosts, in placement order.
    pub hosts: Vec<Host>,
}

/// What every worker process runs under; changing it can change results, so it is part of the
/// campaign's contract hash.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionContract {
    /// Source checkout visible on every worker.
    pub repository: Option<String>,
    /// Virtual environment sourced as `<venv>/bin/activate`.
    pub venv: Option<String>,
    /// Container image (Slurm container plugin), if any.
    pub container: Option<String>,
    /// Container mounts `/host:/container` entries, comma-separated.
    pub container_mounts: Option<String>,
    /// Script sourced before activating the venv (bare metal).
    pub setup_env: Option<String>,
    /// Shell commands run, in order, before the venv is activated. They are written verbatim
    /// into the job script: they are the site's own setup, trusted like the runner file itself.
    pub prerun_commands: Vec<String>,
    /// Shell commands run after the stage payload exits.
    pub postrun_commands: Vec<String>,
}

impl ExecutionContract {
    /// SHA-256 over the contract's fields, framed and domain-separated.
    pub fn hash(&self) -> Hash {
        let mut h = Hasher::new("puzzletron/execution-contract/v1");
        for opt in [
            &self.repository,
            &self.venv,
            &self.container,
            &self.container_mounts,
            &self.setup_env,
        ] {
            match opt {
                Some(s) => h.field(b"some").field(s.as_bytes()),
                None => h.field(b"none"),
            };
        }
        for list in [&self.prerun_commands, &self.postrun_commands] {
            h.field(&(list.len() as u64).to_le_bytes());
            for cmd in list {
                h.field(cmd.as_bytes());
            }
        }
        h.finish()
    }
}

/// Settings of a `local` runner.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalSettings {
    /// GPUs of this machine to use (`CUDA_VISIBLE_DEVICES` ids); `None` = all, as the executor
    /// detects them.
    pub gpus: Option<u32>,
    /// Folder for logs.
    pub log_dir: Option<String>,
}

/// A runner config: the kind of machines, their settings and the execution contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerEnvironment {
    /// Which machines.
    pub kind: RunnerKind,
    /// Slurm settings (present iff `kind` is `slurm`).
    pub slurm: Option<SlurmSettings>,
    /// Bare-metal inventory (present iff `kind` is `baremetal`).
    pub inventory: Option<BaremetalInventory>,
    /// Local settings (`kind: local`).
    pub local: Option<LocalSettings>,
    /// What workers run under.
    pub execution_contract: ExecutionContract,
}

const TOP_KEYS: [&str; 1] = ["runner"];
const RUNNER_KEYS: [&str; 5] = ["kind", "slurm", "inventory", "local", "execution_contract"];
const SLURM_KEYS: [&str; 11] = [
    "account",
    "partition",
    "partition_interactive",
    "partition_batch",
    "partition_cpu",
    "interactive_max_nodes",
    "max_nodes",
    "time_limit",
    "qos",
    "constraint",
    "log_dir",
];
const INVENTORY_KEYS: [&str; 3] = ["rendezvous_host", "rendezvous_port_base", "hosts"];
const HOST_KEYS: [&str; 2] = ["hostname", "gpus"];
const CONTRACT_KEYS: [&str; 7] = [
    "repository",
    "venv",
    "container",
    "container_mounts",
    "setup_env",
    "prerun_commands",
    "postrun_commands",
];
const LOCAL_KEYS: [&str; 2] = ["gpus", "log_dir"];

impl RunnerEnvironment {
    /// A local runner with an empty contract.
    pub fn local() -> Self {
        RunnerEnvironment {
            kind: RunnerKind::Local,
            slurm: None,
            inventory: None,
            local: Some(LocalSettings::default()),
            execution_contract: ExecutionContract::default(),
        }
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
    /// # Errors
    /// [`PlanError::UnknownField`] (key path + suggestion), [`PlanError::InvalidValue`],
    /// [`PlanError::MissingField`] for a missing `runner.kind`, or a section that does not
    /// belong to the kind (e.g. `inventory` in a Slurm runner).
    pub fn from_value(file: &str, root: &Value) -> Result<Self, PlanError> {
        let top = expect_map(file, "", root)?;
        check_keys(file, "", top, &TOP_KEYS)?;
        let runner = expect_map(file, "runner", field(top, "runner"))?;
        if runner.is_empty() {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: "runner".into(),
                expected: "a runner mapping".into(),
            });
        }
        check_keys(file, "runner", runner, &RUNNER_KEYS)?;
        let kind = match field(runner, "kind") {
            Value::Null => {
                return Err(PlanError::MissingField {
                    file: file.into(),
                    path: "runner.kind".into(),
                    expected: "local, slurm or baremetal".into(),
                });
            }
            Value::String(s) => match s.as_str() {
                "local" => RunnerKind::Local,
                "slurm" => RunnerKind::Slurm,
                "baremetal" => RunnerKind::Baremetal,
                other => {
                    return Err(PlanError::InvalidValue {
                        file: file.into(),
                        path: "runner.kind".into(),
                        value: format!("{other:?}"),
                        expected: format!(
                            "local, slurm or baremetal{}",
                            did_you_mean(other, ["local", "slurm", "baremetal"])
                                .map(|s| format!(" (did you mean `{s}`?)"))
                                .unwrap_or_default()
                        ),
                    });
                }
            },
            other => {
                return Err(invalid(
                    file,
                    "runner.kind",
                    other,
                    "local, slurm or baremetal",
                ));
            }
        };
        let wrong_section = |section: &str| PlanError::InvalidValue {
            file: file.into(),
            path: format!("runner.{section}"),
            value: "present".into(),
            expected: format!("no `{section}` section in a `{}` runner", kind.as_str()),
        };
        let slurm = if !field(runner, "slurm").is_null() {
            if kind != RunnerKind::Slurm {
                return Err(wrong_section("slurm"));
            }
            Some(parse_slurm(file, field(runner, "slurm"))?)
        } else if kind == RunnerKind::Slurm {
            Some(SlurmSettings::default())
        } else {
            None
        };
        let inventory = if !field(runner, "inventory").is_null() {
            if kind != RunnerKind::Baremetal {
                return Err(wrong_section("inventory"));
            }
            Some(parse_inventory(file, field(runner, "inventory"))?)
        } else if kind == RunnerKind::Baremetal {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: "runner.inventory".into(),
                expected: "the hosts of a baremetal runner".into(),
            });
        } else {
            None
        };
        let local = if !field(runner, "local").is_null() {
            if kind != RunnerKind::Local {
                return Err(wrong_section("local"));
            }
            let path = "runner.local";
            let m = expect_map(file, path, field(runner, "local"))?;
            check_keys(file, path, m, &LOCAL_KEYS)?;
            let gpus = match field(m, "gpus") {
                Value::Null => None,
                n => Some(expect_u32(file, "runner.local.gpus", n, 1)?),
            };
            Some(LocalSettings {
                gpus,
                log_dir: expect_opt_str(file, "runner.local.log_dir", field(m, "log_dir"))?,
            })
        } else if kind == RunnerKind::Local {
            Some(LocalSettings::default())
        } else {
            None
        };
        let execution_contract = parse_contract(file, field(runner, "execution_contract"))?;
        if kind != RunnerKind::Slurm && execution_contract.container.is_some() {
            return Err(PlanError::InvalidValue {
                file: file.into(),
                path: "runner.execution_contract.container".into(),
                value: format!(
                    "{:?}",
                    execution_contract.container.as_deref().unwrap_or_default()
                ),
                expected: "no container: only the slurm runner starts containers".into(),
            });
        }
        Ok(RunnerEnvironment {
            kind,
            slurm,
            inventory,
            local,
            execution_contract,
        })
    }

    /// Hash of the execution contract (see [`ExecutionContract::hash`]).
    pub fn contract_hash(&self) -> Hash {
        self.execution_contract.hash()
    }
}

fn parse_slurm(file: &str, node: &Value) -> Result<SlurmSettings, PlanError> {
    let path = "runner.slurm";
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &SLURM_KEYS)?;
    let opt_part = |key: &str| -> Result<Option<Partitions>, PlanError> {
        match field(m, key) {
            Value::Null => Ok(None),
            n => Partitions::parse(file, &join(path, key), n).map(Some),
        }
    };
    let opt_u32 = |key: &str| -> Result<Option<u32>, PlanError> {
        match field(m, key) {
            Value::Null => Ok(None),
            n => expect_u32(file, &join(path, key), n, 1).map(Some),
        }
    };
    let time_limit = match field(m, "time_limit") {
        Value::Null => None,
        Value::String(s) if s.parse::<SlurmTime>().is_ok() => s.parse().ok(),
        Value::Int(i) if *i > 0 && *i < 1_000_000 => Some(SlurmTime::from_minutes(*i as u32)),
        other => {
            return Err(invalid(
                file,
                "runner.slurm.time_limit",
                other,
                "a Slurm time such as \"4:00:00\", \"1-00:00:00\" or minutes",
            ));
        }
    };
    Ok(SlurmSettings {
        account: expect_opt_str(file, "runner.slurm.account", field(m, "account"))?,
        partition: opt_part("partition")?.unwrap_or_default(),
        partition_interactive: opt_part("partition_interactive")?,
        partition_batch: opt_part("partition_batch")?,
        partition_cpu: opt_part("partition_cpu")?,
        interactive_max_nodes: opt_u32("interactive_max_nodes")?,
        max_nodes: opt_u32("max_nodes")?,
        time_limit,
        qos: expect_opt_str(file, "runner.slurm.qos", field(m, "qos"))?,
        constraint: expect_opt_str(file, "runner.slurm.constraint", field(m, "constraint"))?,
        log_dir: expect_opt_str(file, "runner.slurm.log_dir", field(m, "log_dir"))?,
    })
}

fn parse_inventory(file: &str, node: &Value) -> Result<BaremetalInventory, PlanError> {
    let path = "runner.inventory";
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &INVENTORY_KEYS)?;
    let rendezvous_host = match field(m, "rendezvous_host") {
        Value::String(s) => s.clone(),
        other => {
            return Err(invalid(
                file,
                "runner.inventory.rendezvous_host",
                other,
                "the host name of the rendezvous",
            ));
        }
    };
    let rendezvous_port_base = match field(m, "rendezvous_port_base") {
        Value::Null => 29500,
        Value::Int(p) if (1024..=65535).contains(p) => *p as u16,
        other => {
            return Err(invalid(
                file,
                "runner.inventory.rendezvous_port_base",
                other,
                "a TCP port in 1024..=65535",
            ));
        }
    };
    let hosts_node = field(m, "hosts");
    let items = match hosts_node {
        Value::List(items) if !items.is_empty() => items,
        other => {
            return Err(invalid(
                file,
                "runner.inventory.hosts",
                other,
                "a non-empty list of {hostname, gpus}",
            ));
        }
    };
    let mut hosts = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let hp = format!("runner.inventory.hosts[{i}]");
        let hm = expect_map(file, &hp, item)?;
        check_keys(file, &hp, hm, &HOST_KEYS)?;
        let hostname = match field(hm, "hostname") {
            Value::String(s)
                if !s.is_empty()
                    && !s.starts_with('-')
                    && !s.chars().any(|c| c.is_whitespace()) =>
            {
                s.clone()
            }
            other => {
                return Err(invalid(
                    file,
                    &join(&hp, "hostname"),
                    other,
                    "a host name (no spaces, not starting with '-')",
                ));
            }
        };
        let gpus = expect_u32(file, &join(&hp, "gpus"), field(hm, "gpus"), 0)?;
        if hosts.iter().any(|h: &Host| h.hostname == hostname) {
            return Err(invalid(
                file,
                &join(&hp, "hostname"),
                field(hm, "hostname"),
                "a host name not already in the inventory",
            ));
        }
        hosts.push(Host { hostname, gpus });
    }
    if !hosts.iter().any(|h| h.hostname == rendezvous_host) {
        return Err(PlanError::InvalidValue {
            file: file.into(),
            path: "runner.inventory.rendezvous_host".into(),
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
        rendezvous_port_base,
        hosts,
    })
}

fn parse_contract(file: &str, node: &Value) -> Result<ExecutionContract, PlanError> {
    let path = "runner.execution_contract";
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &CONTRACT_KEYS)?;
    let s = |key: &str| expect_opt_str(file, &join(path, key), field(m, key));
    Ok(ExecutionContract {
        repository: s("repository")?,
        venv: s("venv")?,
        container: s("container")?,
        container_mounts: s("container_mounts")?,
        setup_env: s("setup_env")?,
        prerun_commands: expect_str_list(
            file,
            &join(path, "prerun_commands"),
            field(m, "prerun_commands"),
        )?,
        postrun_commands: expect_str_list(
            file,
            &join(path, "postrun_commands"),
            field(m, "postrun_commands"),
        )?,
    })
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
}
