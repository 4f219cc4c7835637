//! What to run: [`AttemptSpec`] and its parts ([`AttemptId`], [`CommandSpec`], [`TaskTopology`],
//! [`TaskLauncher`], [`GpuRequest`], [`SchedulerOptions`], [`ArraySpec`]).
//!
//! These types are executor-neutral: the same spec runs as a local process group or as a Slurm
//! batch job. Fields an executor cannot honour are ignored by it and say so in their docs
//! (e.g. `partition` means nothing to [`LocalExecutor`](super::LocalExecutor)).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::ExecutorError;

/// Longest accepted [`AttemptId`], in bytes. Slurm accepts longer job names, but some sites
/// truncate or reject names beyond 64 characters (C06 in `docs/evidence.md`).
pub const MAX_ATTEMPT_ID_LEN: usize = 64;

/// The identity of one attempt at running one unit of work, e.g. `camp-7f3a.t12.a1`.
///
/// It names the job to the scheduler (Slurm `--job-name`), names the attempt folder of the local
/// executor, and is how [`Executor::find`](super::Executor::find) recovers a job whose handle was
/// never recorded. Because it ends up in file names and scheduler fields it is restricted to
/// `[A-Za-z0-9._-]{1,64}` and must start with a letter or digit (no `..`, no hidden files, no
/// option-like `-x`), so it is safe in a path and never needs quoting.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AttemptId(String);

impl AttemptId {
    /// Validates and wraps `id`.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming the bad value when `id` is empty, longer than
    /// [`MAX_ATTEMPT_ID_LEN`], contains a character outside `[A-Za-z0-9._-]`, or does not start
    /// with a letter or digit.
    pub fn new(id: impl Into<String>) -> Result<Self, ExecutorError> {
        let id = id.into();
        let bad = |expected: &str| ExecutorError::InvalidSpec {
            attempt_id: None,
            field: "attempt_id".into(),
            value: id.clone(),
            expected: expected.into(),
        };
        if id.is_empty() || id.len() > MAX_ATTEMPT_ID_LEN {
            return Err(bad("1 to 64 characters"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(bad("only the characters [A-Za-z0-9._-]"));
        }
        if !id.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(bad("a first character that is a letter or digit"));
        }
        Ok(Self(id))
    }

    /// Builds a valid id from arbitrary text (e.g. a human label like `lr=0.1 (warmup)|seed:3`):
    /// every character outside `[A-Za-z0-9._-]` becomes `_`, a leading non-alphanumeric gets an
    /// `a` prefix, and text longer than 64 bytes is cut to 55 bytes plus `-` and the first 8 hex
    /// digits of its SHA-256, so distinct long labels stay distinct.
    pub fn sanitize(label: &str) -> Self {
        let mut s: String = label
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if s.is_empty() || !s.as_bytes()[0].is_ascii_alphanumeric() {
            s.insert(0, 'a');
        }
        if s.len() > MAX_ATTEMPT_ID_LEN {
            let digest = crate::identity::Hash::of(label.as_bytes()).to_hex();
            s.truncate(MAX_ATTEMPT_ID_LEN - 9);
            s.push('-');
            s.push_str(&digest[..8]);
        }
        Self(s)
    }

    /// The id of task `index` of an array whose base id is `self`: `<base>_<index>`, mirroring
    /// Slurm's `JOBID_TASK` notation.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] when the result would exceed [`MAX_ATTEMPT_ID_LEN`].
    pub fn array_task(&self, index: u32) -> Result<Self, ExecutorError> {
        Self::new(format!("{}_{index}", self.0))
    }

    /// Splits an array task id made by [`AttemptId::array_task`] into base id and task index;
    /// `None` when the id has no `_<digits>` suffix.
    pub fn split_array_task(&self) -> Option<(AttemptId, u32)> {
        let (base, idx) = self.0.rsplit_once('_')?;
        let index = idx.parse().ok()?;
        Some((AttemptId::new(base).ok()?, index))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AttemptId({:?})", self.0)
    }
}

impl FromStr for AttemptId {
    type Err = ExecutorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for AttemptId {
    type Error = ExecutorError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<AttemptId> for String {
    fn from(id: AttemptId) -> Self {
        id.0
    }
}

impl AsRef<str> for AttemptId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// The command an attempt runs: an argv array, never a shell string, unless [`shell`] is set.
///
/// With `shell == false` (the default) `argv[0]` is the program (looked up in `PATH` when it has
/// no `/`) and the rest are its arguments, passed verbatim: no word splitting, no globbing, no
/// `$VAR` expansion. With `shell == true`, `argv` must hold exactly one element, a script run by
/// `/bin/sh -c`; use this only for text the *user* wrote as shell, never for text assembled from
/// data.
///
/// [`shell`]: CommandSpec::shell
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CommandSpec {
    /// Program and arguments (or, with `shell`, the single script).
    pub argv: Vec<String>,
    /// Extra environment variables, added to the executor's environment (later wins).
    pub env: BTreeMap<String, String>,
    /// Working directory; `None` = the executor's default (local: the controller's current
    /// directory; Slurm: the submit directory).
    pub cwd: Option<PathBuf>,
    /// Run `argv[0]` as a `/bin/sh -c` script instead of as a program.
    pub shell: bool,
}

impl CommandSpec {
    /// A command running `program` with no arguments.
    pub fn new(program: impl Into<String>) -> Self {
        Self {
            argv: vec![program.into()],
            env: BTreeMap::new(),
            cwd: None,
            shell: false,
        }
    }

    /// A command running `script` through `/bin/sh -c` (sets [`CommandSpec::shell`]).
    pub fn shell_script(script: impl Into<String>) -> Self {
        Self {
            argv: vec![script.into()],
            env: BTreeMap::new(),
            cwd: None,
            shell: true,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.argv.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, A>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = A>,
        A: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets one environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// The argv actually executed: `argv` itself, or `["/bin/sh", "-c", script]` with `shell`.
    pub fn effective_argv(&self) -> Vec<String> {
        if self.shell {
            let mut v = vec!["/bin/sh".to_string(), "-c".to_string()];
            v.extend(self.argv.iter().cloned());
            v
        } else {
            self.argv.clone()
        }
    }

    /// Checks the command is runnable in principle.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] when `argv` is empty, `argv[0]` is empty, an argument or
    /// env value contains a NUL byte, an env name is empty or contains `=`, or `shell` is set with
    /// more than one element.
    pub fn validate(&self, attempt_id: Option<&AttemptId>) -> Result<(), ExecutorError> {
        let bad = |field: &str, value: &str, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: attempt_id.cloned(),
            field: field.into(),
            value: value.into(),
            expected: expected.into(),
        };
        match self.argv.first() {
            None => return Err(bad("command.argv", "[]", "at least the program name")),
            Some(p) if p.is_empty() => {
                return Err(bad("command.argv[0]", "", "a non-empty program name"));
            }
            _ => {}
        }
        if self.shell && self.argv.len() != 1 {
            return Err(bad(
                "command.argv",
                &format!("{} elements", self.argv.len()),
                "exactly one element (the script) when shell = true",
            ));
        }
        for (i, a) in self.argv.iter().enumerate() {
            if a.contains('\0') {
                return Err(bad(&format!("command.argv[{i}]"), a, "no NUL byte"));
            }
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(bad(
                    "command.env",
                    k,
                    "a variable name without '=' or NUL, not empty",
                ));
            }
            if v.contains('\0') {
                return Err(bad(&format!("command.env.{k}"), v, "no NUL byte"));
            }
        }
        Ok(())
    }
}

/// How the command is started inside the allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TaskLauncher {
    /// Run the command once, directly (in Slurm: in the batch step on the first node).
    #[default]
    Direct,
    /// Slurm: `srun [extra_args] <argv>` so that `nodes * ntasks_per_node` copies run (one per
    /// task). Local: accepted only with one task (then it is `Direct`); a local job is one
    /// process tree.
    Srun {
        /// Extra `srun` arguments, each quoted when rendered (e.g. `--cpu-bind=cores`).
        extra_args: Vec<String>,
    },
    /// PyTorch elastic launch: `torchrun --nnodes=<topology.nodes>
    /// --nproc_per_node=<nproc_per_node> --rdzv_backend=<rdzv_backend>
    /// --rdzv_endpoint=<first node>:<rdzv_port> --rdzv_id=<attempt id> <argv>`, one torchrun per
    /// node (Slurm: via `srun --ntasks-per-node=1`). `nnodes` is taken from
    /// [`TaskTopology::nodes`] so the two cannot disagree. Single node: `--standalone`.
    Torchrun {
        /// Worker processes per node, usually the node's GPU count.
        nproc_per_node: u32,
        /// Rendezvous backend, `c10d` unless you know better.
        rdzv_backend: String,
        /// TCP port of the rendezvous endpoint on the first node.
        rdzv_port: u16,
        /// torchrun's `--max-restarts` (0 = fail fast).
        max_restarts: u32,
        /// torchrun's `--no-python`: the argv is a program with its arguments (`python -m
        /// pkg ...`), not a Python script. Campaign stages set it: their commands are argvs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        no_python: bool,
    },
}

impl TaskLauncher {
    /// `direct`, `srun` or `torchrun`.
    pub fn name(&self) -> &'static str {
        match self {
            TaskLauncher::Direct => "direct",
            TaskLauncher::Srun { .. } => "srun",
            TaskLauncher::Torchrun { .. } => "torchrun",
        }
    }

    /// torchrun's words before the argv, the one place every executor takes them from:
    /// `torchrun --standalone --nnodes=1` on one node (or without an `endpoint`), else
    /// `torchrun --nnodes=<nodes> [--node_rank=<r>] --rdzv_backend=<b>
    /// --rdzv_endpoint=<endpoint> --rdzv_id=<rdzv_id>`; then `--nproc_per_node=<n>
    /// --max-restarts=<m> [--no-python]`. `endpoint` is `host:port`. `None` for the other
    /// launchers.
    pub fn torchrun_args(
        &self,
        nodes: u32,
        endpoint: Option<&str>,
        rdzv_id: &str,
        node_rank: Option<usize>,
    ) -> Option<Vec<String>> {
        let TaskLauncher::Torchrun {
            nproc_per_node,
            rdzv_backend,
            max_restarts,
            no_python,
            ..
        } = self
        else {
            return None;
        };
        let mut t = vec!["torchrun".to_string()];
        match endpoint {
            Some(e) if nodes > 1 => {
                t.push(format!("--nnodes={nodes}"));
                if let Some(r) = node_rank {
                    t.push(format!("--node_rank={r}"));
                }
                t.push(format!("--rdzv_backend={rdzv_backend}"));
                t.push(format!("--rdzv_endpoint={e}"));
                t.push(format!("--rdzv_id={rdzv_id}"));
            }
            _ => t.extend(["--standalone".to_string(), "--nnodes=1".to_string()]),
        }
        t.push(format!("--nproc_per_node={nproc_per_node}"));
        t.push(format!("--max-restarts={max_restarts}"));
        if *no_python {
            t.push("--no-python".into());
        }
        Some(t)
    }

    /// A torchrun launcher with `nproc_per_node` workers, the `c10d` backend on port 29500 and
    /// no restarts (torchrun's documented defaults, except restarts).
    pub fn torchrun(nproc_per_node: u32) -> Self {
        Self::Torchrun {
            nproc_per_node,
            rdzv_backend: "c10d".into(),
            rdzv_port: 29500,
            max_restarts: 0,
            no_python: false,
        }
    }
}

/// GPUs the attempt needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "per", content = "count", rename_all = "snake_case")]
#[non_exhaustive]
pub enum GpuRequest {
    /// No GPU.
    #[default]
    None,
    /// `n` GPUs on every node (Slurm `--gpus-per-node=n`; local: `n` ids of the configured
    /// list; bare metal: `n` GPUs of each host).
    PerNode(u32),
    /// `n` GPUs per task (Slurm `--gpus-per-task=n`; local: `n * ntasks_per_node` ids).
    PerTask(u32),
}

/// The shape of the allocation: nodes, tasks, CPUs, GPUs and how tasks are launched.
///
/// Build with [`TaskTopology::new`] (or [`single`](Self::single)) and the `with_*` methods:
///
/// ```
/// use puzzletron::executor::{GpuRequest, TaskLauncher, TaskTopology};
/// let t = TaskTopology::new(2, 4)
///     .with_gpus(GpuRequest::PerTask(1))
///     .with_cpus_per_task(8)
///     .with_launcher(TaskLauncher::torchrun(4));
/// assert_eq!((t.nodes, t.gpus_per_node()), (2, 4));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskTopology {
    /// Number of nodes (Slurm `--nodes`), at least 1. The local executor accepts only 1.
    pub nodes: u32,
    /// Tasks per node (Slurm `--ntasks-per-node`), at least 1.
    pub ntasks_per_node: u32,
    /// CPUs per task (Slurm `--cpus-per-task`); `None` = scheduler default.
    pub cpus_per_task: Option<u32>,
    /// GPUs requested.
    pub gpus: GpuRequest,
    /// How the command is started.
    pub launcher: TaskLauncher,
}

impl Default for TaskTopology {
    fn default() -> Self {
        Self::single()
    }
}

impl TaskTopology {
    /// One node, one task, no GPU, direct launch.
    pub fn single() -> Self {
        Self::new(1, 1)
    }

    /// `nodes` nodes of `ntasks_per_node` tasks each, the scheduler's default CPUs, no GPU,
    /// direct launch ([`validate`](Self::validate) refuses zeros).
    pub fn new(nodes: u32, ntasks_per_node: u32) -> Self {
        Self {
            nodes,
            ntasks_per_node,
            cpus_per_task: None,
            gpus: GpuRequest::None,
            launcher: TaskLauncher::Direct,
        }
    }

    /// Sets the CPUs per task (Slurm `--cpus-per-task`).
    pub fn with_cpus_per_task(mut self, cpus: u32) -> Self {
        self.cpus_per_task = Some(cpus);
        self
    }

    /// Sets the GPUs requested.
    pub fn with_gpus(mut self, gpus: GpuRequest) -> Self {
        self.gpus = gpus;
        self
    }

    /// Sets how the command is started.
    pub fn with_launcher(mut self, launcher: TaskLauncher) -> Self {
        self.launcher = launcher;
        self
    }

    /// Total GPUs per node this topology asks for.
    pub fn gpus_per_node(&self) -> u32 {
        match self.gpus {
            GpuRequest::None => 0,
            GpuRequest::PerNode(n) => n,
            GpuRequest::PerTask(n) => n.saturating_mul(self.ntasks_per_node),
        }
    }

    /// Checks counts are positive and consistent with the launcher.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming the field when `nodes` or `ntasks_per_node` is 0,
    /// `cpus_per_task` is `Some(0)`, or a torchrun launcher has `nproc_per_node == 0`.
    pub fn validate(&self, attempt_id: Option<&AttemptId>) -> Result<(), ExecutorError> {
        let bad = |field: &str, value: String, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: attempt_id.cloned(),
            field: field.into(),
            value,
            expected: expected.into(),
        };
        if self.nodes == 0 {
            return Err(bad("topology.nodes", "0".into(), "at least 1"));
        }
        if self.ntasks_per_node == 0 {
            return Err(bad("topology.ntasks_per_node", "0".into(), "at least 1"));
        }
        if self.cpus_per_task == Some(0) {
            return Err(bad(
                "topology.cpus_per_task",
                "0".into(),
                "at least 1 or unset",
            ));
        }
        if let TaskLauncher::Torchrun {
            nproc_per_node: 0, ..
        } = self.launcher
        {
            return Err(bad(
                "topology.launcher.nproc_per_node",
                "0".into(),
                "at least 1",
            ));
        }
        Ok(())
    }
}

/// Scheduler placement options (Slurm's names). Executors without a queue (local, bare metal)
/// refuse a spec that sets any of them ([`ExecutorError::Unsupported`]) rather than drop it.
///
/// Build from [`SchedulerOptions::default`] with the `with_*` methods:
///
/// ```
/// use puzzletron::executor::SchedulerOptions;
/// let s = SchedulerOptions::default()
///     .with_partition("gpu")
///     .with_account("proj-x")
///     .with_extra_directives(["--requeue"]);
/// assert_eq!(s.partition.as_deref(), Some("gpu"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// Slurm `--partition` (one name, or several separated by commas).
    pub partition: Option<String>,
    /// Slurm `--account`.
    pub account: Option<String>,
    /// Slurm `--qos`.
    pub qos: Option<String>,
    /// Slurm `--reservation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// Slurm `--constraint` (node features, e.g. `a100&ib`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Extra `#SBATCH` options, one option per element (e.g. `--constraint=a100`), each quoted
    /// when rendered. Must start with `-`.
    pub extra_directives: Vec<String>,
}

impl SchedulerOptions {
    /// Sets the partition (Slurm `--partition`; several separated by commas).
    pub fn with_partition(mut self, partition: impl Into<String>) -> Self {
        self.partition = Some(partition.into());
        self
    }

    /// Sets the account (Slurm `--account`).
    pub fn with_account(mut self, account: impl Into<String>) -> Self {
        self.account = Some(account.into());
        self
    }

    /// Sets the quality of service (Slurm `--qos`).
    pub fn with_qos(mut self, qos: impl Into<String>) -> Self {
        self.qos = Some(qos.into());
        self
    }

    /// Sets the reservation (Slurm `--reservation`).
    pub fn with_reservation(mut self, reservation: impl Into<String>) -> Self {
        self.reservation = Some(reservation.into());
        self
    }

    /// Sets the node features required (Slurm `--constraint`, e.g. `a100&ib`).
    pub fn with_constraint(mut self, constraint: impl Into<String>) -> Self {
        self.constraint = Some(constraint.into());
        self
    }

    /// Sets the extra `#SBATCH` options, one option per element, each starting with `-`.
    pub fn with_extra_directives<I, T>(mut self, directives: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.extra_directives = directives.into_iter().map(Into::into).collect();
        self
    }
}

/// Everything an executor needs to run one attempt.
///
/// Build with [`AttemptSpec::new`] and the `with_*` methods:
///
/// ```
/// use puzzletron::executor::{AttemptId, AttemptSpec, CommandSpec, GpuRequest, TaskTopology};
/// use std::time::Duration;
/// let spec = AttemptSpec::new(
///     AttemptId::new("sweep-1a2b.j3.a1")?,
///     CommandSpec::new("python").args(["train.py", "--lr", "0.1"]),
/// )
/// .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(2)))
/// .with_walltime(Duration::from_secs(3600));
/// assert_eq!(spec.topology.gpus_per_node(), 2);
/// # Ok::<(), puzzletron::executor::ExecutorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AttemptSpec {
    /// Unique id of this attempt; the job name and the key for [`find`](super::Executor::find).
    pub attempt_id: AttemptId,
    /// What to run.
    pub command: CommandSpec,
    /// Nodes, tasks, CPUs, GPUs, launcher.
    pub topology: TaskTopology,
    /// Memory per node in MiB (Slurm `--mem`); `None` = scheduler default. Not enforced locally.
    pub mem_mb: Option<u64>,
    /// Wall-clock limit; the job is killed when it runs longer (Slurm: `--time`, rounded up to
    /// whole minutes, state `Timeout`; local: SIGTERM, then SIGKILL after a grace period, state
    /// `Timeout`). `None` = no limit.
    pub walltime: Option<Duration>,
    /// Whole nodes for this attempt (Slurm `--exclusive`).
    pub exclusive: bool,
    /// Partition, account, qos, extra directives.
    pub scheduler: SchedulerOptions,
    /// Where stdout and stderr go (one file, both streams). `None` = the executor's default
    /// (local: `<attempt folder>/output.log`; Slurm: `<log dir>/<attempt id>-%j.out`).
    pub log_path: Option<PathBuf>,
    /// A signal sent before the wall-clock limit so the worker can checkpoint (N03; Slurm:
    /// `--signal=B:<signal>@<lead>`, forwarded by the batch shell to the step). `None` = none.
    /// Executors without a time-limit signal (local, mock) ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning_signal: Option<WarningSignal>,
    /// The environment the command runs in: checkout, venv, container, setup script, site
    /// commands (see [`ExecutionContract`](super::ExecutionContract) for how each executor
    /// renders it). Empty = the command runs as is.
    #[serde(default, skip_serializing_if = "super::ExecutionContract::is_empty")]
    pub environment: super::ExecutionContract,
}

/// A signal delivered `lead` before an attempt's wall-clock limit (N03), so a resumable worker
/// can write a checkpoint before `SIGTERM`/`SIGKILL`.
///
/// The lead must cover the checkpoint's duration plus the scheduler's `KillWait` plus a margin;
/// Slurm may send the signal up to 60 s earlier than asked (its event resolution).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WarningSignal {
    /// The signal's name without `SIG` (`USR2`, the default; NCCL uses `USR1` itself).
    pub signal: String,
    /// How long before the limit it is sent.
    pub lead: Duration,
}

/// Signals a [`WarningSignal`] may use (names without `SIG`).
pub const WARNING_SIGNALS: &[&str] = &["USR2", "USR1", "TERM", "INT", "HUP", "URG", "ALRM"];

impl WarningSignal {
    /// Signal `signal` (name without `SIG`), `lead` before the limit. Not checked here:
    /// [`AttemptSpec::validate`] refuses a name that is not one of [`WARNING_SIGNALS`].
    pub fn new(signal: impl Into<String>, lead: Duration) -> Self {
        Self {
            signal: signal.into(),
            lead,
        }
    }

    /// `USR2`, `lead` before the limit.
    pub fn usr2(lead: Duration) -> Self {
        Self {
            signal: "USR2".into(),
            lead,
        }
    }

    /// Parses `SIG@SECONDS` (`USR2@180`, `SIGUSR2@180`) or bare `SECONDS` (= `USR2`).
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming the text when the signal is not one of
    /// [`WARNING_SIGNALS`] or the lead is not a whole number of seconds from 1.
    pub fn parse(text: &str) -> Result<Self, ExecutorError> {
        let (sig, secs) = text.trim().split_once('@').unwrap_or(("USR2", text.trim()));
        let w = Self {
            signal: sig.trim_start_matches("SIG").to_string(),
            lead: Duration::from_secs(secs.parse::<u64>().unwrap_or(0)),
        };
        w.validate(None).map_err(|_| ExecutorError::InvalidSpec {
            attempt_id: None,
            field: "warning_signal".into(),
            value: text.into(),
            expected: format!(
                "`SIGNAL@SECONDS` (e.g. `USR2@180`) or `SECONDS`, SIGNAL one of {}, SECONDS >= 1",
                WARNING_SIGNALS.join(", ")
            ),
        })?;
        Ok(w)
    }

    /// The lead in whole seconds (rounded up; Slurm's `@` takes seconds).
    pub fn lead_secs(&self) -> u64 {
        let s = self.lead.as_secs();
        if self.lead.subsec_nanos() > 0 {
            s + 1
        } else {
            s
        }
    }

    /// Checks the signal name and that the lead is at least 1 s.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming `warning_signal.signal` or `warning_signal.lead`.
    pub fn validate(&self, attempt_id: Option<&AttemptId>) -> Result<(), ExecutorError> {
        if !WARNING_SIGNALS.contains(&self.signal.as_str()) {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: attempt_id.cloned(),
                field: "warning_signal.signal".into(),
                value: self.signal.clone(),
                expected: format!("one of {}", WARNING_SIGNALS.join(", ")),
            });
        }
        if self.lead < Duration::from_secs(1) {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: attempt_id.cloned(),
                field: "warning_signal.lead".into(),
                value: format!("{:?}", self.lead),
                expected: "at least 1 s".into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for WarningSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.signal, self.lead_secs())
    }
}

impl AttemptSpec {
    /// Refuses what only a scheduler or a container runtime can honour, for executors that have
    /// neither (local, bare metal): a container, a partition, account, QOS, reservation or
    /// constraint.
    pub(crate) fn refuse_scheduler_options(&self, kind: &str) -> Result<(), ExecutorError> {
        let spec = self;
        let s = &spec.scheduler;
        let set = [
            (
                "environment.container",
                spec.environment.container.as_deref(),
            ),
            (
                "environment.container_mounts",
                spec.environment.container_mounts.as_deref(),
            ),
            ("scheduler.partition", s.partition.as_deref()),
            ("scheduler.account", s.account.as_deref()),
            ("scheduler.qos", s.qos.as_deref()),
            ("scheduler.reservation", s.reservation.as_deref()),
            ("scheduler.constraint", s.constraint.as_deref()),
        ];
        match set.into_iter().find(|(_, v)| v.is_some()) {
            Some((field, Some(v))) => Err(ExecutorError::InvalidSpec {
                attempt_id: Some(spec.attempt_id.clone()),
                field: field.into(),
                value: v.into(),
                expected: format!(
                    "nothing: the {kind} executor has no scheduler or container runtime (it runs \
                     the command with its environment, working folder, venv, setup script and \
                     site commands)"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// A spec for `command` on one node, one task, no GPU, no limits.
    pub fn new(attempt_id: AttemptId, command: CommandSpec) -> Self {
        Self {
            attempt_id,
            command,
            topology: TaskTopology::single(),
            mem_mb: None,
            walltime: None,
            exclusive: false,
            scheduler: SchedulerOptions::default(),
            log_path: None,
            warning_signal: None,
            environment: super::ExecutionContract::default(),
        }
    }

    /// Sets the topology.
    pub fn with_topology(mut self, topology: TaskTopology) -> Self {
        self.topology = topology;
        self
    }

    /// Sets the memory per node, MiB.
    pub fn with_mem_mb(mut self, mem_mb: u64) -> Self {
        self.mem_mb = Some(mem_mb);
        self
    }

    /// Sets the wall-clock limit.
    pub fn with_walltime(mut self, walltime: Duration) -> Self {
        self.walltime = Some(walltime);
        self
    }

    /// Asks for whole nodes.
    pub fn with_exclusive(mut self, exclusive: bool) -> Self {
        self.exclusive = exclusive;
        self
    }

    /// Sets the scheduler options.
    pub fn with_scheduler(mut self, scheduler: SchedulerOptions) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// Asks for a warning signal before the wall-clock limit (see [`WarningSignal`]).
    pub fn with_warning_signal(mut self, signal: WarningSignal) -> Self {
        self.warning_signal = Some(signal);
        self
    }

    /// Sets the execution environment (checkout, venv, container, site commands).
    pub fn with_environment(mut self, environment: super::ExecutionContract) -> Self {
        self.environment = environment;
        self
    }

    /// Sets the log file path.
    pub fn with_log_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_path = Some(path.into());
        self
    }

    /// Checks command and topology (see [`CommandSpec::validate`], [`TaskTopology::validate`])
    /// and that extra scheduler directives start with `-`.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming the field, the value and what was expected.
    pub fn validate(&self) -> Result<(), ExecutorError> {
        let id = Some(&self.attempt_id);
        self.command.validate(id)?;
        self.topology.validate(id)?;
        if self.walltime == Some(Duration::ZERO) {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: id.cloned(),
                field: "walltime".into(),
                value: "0s".into(),
                expected: "a positive duration or none".into(),
            });
        }
        if let Some(w) = &self.warning_signal {
            w.validate(id)?;
        }
        for (i, d) in self.scheduler.extra_directives.iter().enumerate() {
            if !d.starts_with('-') || d.contains('\n') || d.contains('\0') {
                return Err(ExecutorError::InvalidSpec {
                    attempt_id: id.cloned(),
                    field: format!("scheduler.extra_directives[{i}]"),
                    value: d.clone(),
                    expected: "one option starting with '-' on one line".into(),
                });
            }
        }
        Ok(())
    }
}

/// Many identical attempts that differ only by their index: a Slurm job array, or N local jobs.
///
/// Task `i` runs `template.command` with the environment variable [`ARRAY_INDEX_ENV`] set to
/// `i` (Slurm also sets `SLURM_ARRAY_TASK_ID`), under attempt id
/// `template.attempt_id.array_task(i)`; the task decides from its index what to do (e.g. the
/// `i`-th line of a manifest).
///
/// Build with [`ArraySpec::new`] and [`with_max_concurrent`](Self::with_max_concurrent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ArraySpec {
    /// The spec every task runs; its `attempt_id` is the array's base id.
    pub template: AttemptSpec,
    /// Number of tasks, indices `0..size`.
    pub size: u32,
    /// At most this many tasks run at once (Slurm `--array=0-N%max`); `None` = no limit.
    pub max_concurrent: Option<u32>,
}

/// Environment variable holding an array task's index (`0..size`) for every executor.
pub const ARRAY_INDEX_ENV: &str = "PUZZLETRON_ARRAY_INDEX";

/// Environment variable holding the attempt id, set for every attempt by every built-in executor.
pub const ATTEMPT_ID_ENV: &str = "PUZZLETRON_ATTEMPT_ID";

/// Environment variable naming the attempt's *start mark*: when a spec's environment sets it,
/// an executor whose [`Executor::writes_start_mark`](super::Executor::writes_start_mark) is
/// `true` writes the attempt id (one line) to that file once the job's own setup (working
/// directory, `setup_env`, prerun commands, venv) succeeded, just before the payload starts.
/// A job that ends without it never reached its payload: the failure is the node's or the
/// site's until proved otherwise (issue 27, item 1).
pub const START_FILE_ENV: &str = "PUZZLETRON_START_FILE";

impl ArraySpec {
    /// `size` tasks (indices `0..size`) running `template`, with no limit on how many run at
    /// once.
    pub fn new(template: AttemptSpec, size: u32) -> Self {
        Self {
            template,
            size,
            max_concurrent: None,
        }
    }

    /// Sets how many tasks may run at once (Slurm `--array=0-N%max`); `None`: no limit.
    pub fn with_max_concurrent(mut self, max: Option<u32>) -> Self {
        self.max_concurrent = max;
        self
    }

    /// The stand-alone spec of task `index`: the template with attempt id `<base>_<index>` and
    /// [`ARRAY_INDEX_ENV`] set. Used by executors without native arrays.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] when the task id would be too long.
    pub fn task_spec(&self, index: u32) -> Result<AttemptSpec, ExecutorError> {
        let mut spec = self.template.clone();
        spec.attempt_id = self.template.attempt_id.array_task(index)?;
        spec.command
            .env
            .insert(ARRAY_INDEX_ENV.to_string(), index.to_string());
        Ok(spec)
    }

    /// Checks the template and that `size >= 1` and `max_concurrent != Some(0)`.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming the field.
    pub fn validate(&self) -> Result<(), ExecutorError> {
        self.template.validate()?;
        let id = Some(self.template.attempt_id.clone());
        if self.size == 0 {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: id,
                field: "array.size".into(),
                value: "0".into(),
                expected: "at least 1 task".into(),
            });
        }
        if self.max_concurrent == Some(0) {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: id,
                field: "array.max_concurrent".into(),
                value: "0".into(),
                expected: "at least 1 or unset".into(),
            });
        }
        // The longest task id must be valid too.
        self.template.attempt_id.array_task(self.size - 1)?;
        Ok(())
    }
}
