//! [`RayExecutor`]: attempts as jobs of a Ray cluster (`runner.kind: ray`, feature `ray`),
//! through the Ray Jobs REST API on the dashboard port (a laptop's `ray start --head`, VMs,
//! or KubeRay on Kubernetes: the same API everywhere).
//!
//! - **Submit**: one `POST /api/jobs/` per attempt, its body exactly what
//!   [`render`](Executor::render) shows: `submission_id` = the attempt id (Ray refuses a second
//!   job with the same id, so an attempt can never run twice), the `entrypoint` (a shell line:
//!   `cd` to the job's folder, `exec` the command under the execution contract, within
//!   `timeout` when the spec has a walltime), `entrypoint_num_gpus` / `entrypoint_num_cpus` /
//!   `entrypoint_memory` / `entrypoint_resources` from the topology and the runner's resources
//!   per GPU, `runtime_env.env_vars` (the command's environment, the attempt id, `RAY_NAMESPACE`
//!   for the runner's namespace), and `metadata` (attempt id, campaign tag, namespace, walltime,
//!   log path) so a fresh process reads everything back from the cluster.
//! - **Where it runs**: Ray picks the node and sets `CUDA_VISIBLE_DEVICES` to the GPUs it
//!   reserved for the entrypoint, so concurrent jobs see disjoint GPUs. The job's folder must be
//!   on a filesystem the Ray nodes share (as for Slurm): a local `working_dir` cannot be sent
//!   through the REST API (it takes only URIs of uploaded packages), so the entrypoint `cd`s to
//!   `command.cwd` (or the contract's repository).
//! - **Poll**: one `GET /api/jobs/` per call for all handles; states as in `classify.rs`
//!   (`PENDING/RUNNING/SUCCEEDED/FAILED/STOPPED` with `error_type`, `driver_exit_code` and
//!   Ray's message; a kill by Ray's memory monitor is `OutOfMemory`). A job the cluster does
//!   not list is `Pending` for [`RayExecutorBuilder::lost_after`] after its submit, then `Lost`.
//!   When a job has ended its logs (`GET /api/jobs/{id}/logs`) are written, once, to the
//!   spec's `log_path` for the controller's classification.
//! - **Walltime**: enforced on the node by coreutils `timeout` (TERM, then KILL after the
//!   grace), so it holds with no controller running; exit 124 or 137 of a job that ran its
//!   walltime is `Timeout`.
//! - **Cancel**: `POST /api/jobs/{id}/stop`, then waits for a terminal state. Ray 2.60
//!   answers `stopped` for a job still waiting for resources yet starts it later, so the stop
//!   is repeated while the job pends; a job that pends through the whole
//!   [`RayExecutorBuilder::cancel_timeout`] (it asks for what no node has yet) is
//!   [`ExecutorError::CancelUnconfirmed`] (retryable: the caller cancels again later).
//! - **Find**: `GET /api/jobs/{attempt id}`; works from any process (the cluster keeps the
//!   record).
//! - **Errors**: a dashboard that does not answer (or answers 502-504) is retried with a
//!   doubling pause, then [`ExecutorError::SchedulerUnavailable`] (transient: jobs keep
//!   running); a 401/403 is [`ExecutorError::Misconfigured`] naming `runner.ray.token_env`; a
//!   job asking for more GPUs (or CPUs, memory, custom resources) than any node has is
//!   [`ExecutorError::Unsatisfiable`] at the first submit (it would pend forever), unless the
//!   cluster autoscales ([`RayExecutorBuilder::autoscaler`]).
//! - **Topologies**: one node, one task: a direct command, or single-node torchrun
//!   (`--standalone`, `nproc_per_node` workers over the job's GPUs). Multi-node instances
//!   (`topology.nodes > 1`) and several tasks per node are refused (`InvalidSpec`), as is a
//!   container or a scheduler option (partition, account, ...).
//! - **Security**: the auth token is read from the environment variable the runner names
//!   (`Authorization: Bearer`), kept in memory only, never rendered, logged or written.
//!
//! Plain HTTP only (the client has no TLS stack): reach a TLS dashboard through
//! `kubectl port-forward` or a local proxy.

mod api;
mod classify;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    ATTEMPT_ID_ENV, AttemptId, AttemptSpec, ExecutionContract, Executor, ExecutorError, JobHandle,
    JobState, JobStatus, RenderedCommand, RenderedFile, Rendering, TaskLauncher, check_kind,
    now_ms, shell,
};
use api::{Client, JobInfo, RuntimeEnv, SubmitBody};

/// Executor kind name, in every handle.
pub(super) const KIND: &str = "ray";

/// Metadata key: the attempt id.
pub(super) const META_ATTEMPT: &str = "puzzletron_attempt_id";
/// Metadata key: the campaign tag ([`RayExecutorBuilder::campaign_tag`]).
pub(super) const META_CAMPAIGN: &str = "puzzletron_campaign";
/// Metadata key: the runner's namespace.
pub(super) const META_NAMESPACE: &str = "puzzletron_namespace";
/// Metadata key: the walltime in whole seconds.
pub(super) const META_WALLTIME: &str = "puzzletron_walltime_s";
/// Metadata key: the attempt's log file.
pub(super) const META_LOG: &str = "puzzletron_log_path";

/// Builder of a [`RayExecutor`].
#[derive(Debug, Clone)]
pub struct RayExecutorBuilder {
    address: String,
    token_env: Option<String>,
    namespace: Option<String>,
    resources_per_gpu: BTreeMap<String, f64>,
    campaign_tag: Option<String>,
    contract: ExecutionContract,
    autoscaler: bool,
    lost_after: Duration,
    request_timeout: Duration,
    cancel_timeout: Duration,
    kill_grace: Duration,
}

impl RayExecutorBuilder {
    /// The name of the environment variable holding the cluster's auth token (sent as
    /// `Authorization: Bearer <token>`); the token itself is never written anywhere.
    pub fn token_env(mut self, var: impl Into<String>) -> Self {
        self.token_env = Some(var.into());
        self
    }

    /// The Ray namespace of the jobs' drivers (`RAY_NAMESPACE` in their environment; also in
    /// their metadata, so [`Executor::cancel_matching`] stops only this namespace's jobs).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// Reserves `amount` of the Ray resource `name` per GPU of a job, on top of the GPUs:
    /// `CPU` goes to `entrypoint_num_cpus` (unless the spec sets CPUs per task), `memory`
    /// (bytes) to `entrypoint_memory` (unless the spec sets memory), any other name (a custom
    /// resource such as `accelerator_type:H100`) to `entrypoint_resources`. Jobs without GPUs
    /// reserve none of it.
    pub fn resource_per_gpu(mut self, name: impl Into<String>, amount: f64) -> Self {
        self.resources_per_gpu.insert(name.into(), amount);
        self
    }

    /// A tag written in every job's metadata (`META_CAMPAIGN`): the campaign's, so the
    /// cluster's job list tells which campaign a job belongs to, and
    /// [`Executor::cancel_matching`] stops only its jobs.
    pub fn campaign_tag(mut self, tag: impl Into<String>) -> Self {
        self.campaign_tag = Some(tag.into());
        self
    }

    /// The checkout, venv, setup script and pre/postrun commands jobs run under when their
    /// spec has no contract of its own.
    pub fn contract(mut self, contract: &ExecutionContract) -> Self {
        self.contract = contract.clone();
        self
    }

    /// The cluster adds nodes on demand (KubeRay's autoscaler): a job asking for more than
    /// today's largest node is submitted (it pends until a node fits) instead of refused.
    pub fn autoscaler(mut self, on: bool) -> Self {
        self.autoscaler = on;
        self
    }

    /// How long after its submit a job the cluster does not list is still `Pending` before it
    /// is `Lost` (default 60 s).
    pub fn lost_after(mut self, d: Duration) -> Self {
        self.lost_after = d;
        self
    }

    /// Longest one HTTP request may take (default 10 s).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// How long [`Executor::cancel`] waits for a stopped job to end (default 30 s).
    pub fn cancel_timeout(mut self, d: Duration) -> Self {
        self.cancel_timeout = d;
        self
    }

    /// Time between `timeout`'s TERM at the walltime and its KILL (default 10 s).
    pub fn kill_grace(mut self, d: Duration) -> Self {
        self.kill_grace = d;
        self
    }

    /// Checks the settings and reads the token. Nothing is sent to the cluster (the first
    /// submit, or [`RayExecutor::preflight`], checks it).
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] naming `runner.ray.address` for an address that is not
    /// `http://host:port`, `runner.ray.resources_per_gpu.<name>` for an amount that is not a
    /// positive number (or names `GPU`), `runner.ray.namespace` for an empty namespace. A
    /// token variable that is not set is reported by the first request
    /// ([`ExecutorError::Misconfigured`] naming `runner.ray.token_env`), so a dry run needs no
    /// token.
    pub fn build(self) -> Result<RayExecutor, ExecutorError> {
        let bad = |field: String, value: String, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: None,
            field,
            value,
            expected: expected.into(),
        };
        let base = self.address.trim_end_matches('/').to_string();
        let hostport = base.strip_prefix("http://").unwrap_or("");
        if hostport.is_empty()
            || hostport.contains(['/', '?', '#', ' ', '@'])
            || hostport.chars().any(char::is_control)
        {
            return Err(bad(
                "runner.ray.address".into(),
                self.address.clone(),
                "the dashboard's http://HOST:PORT (plain HTTP; e.g. http://127.0.0.1:8265; \
                 reach a TLS dashboard through kubectl port-forward or a local proxy)",
            ));
        }
        for (name, amount) in &self.resources_per_gpu {
            if name.is_empty() || name == "GPU" || !amount.is_finite() || *amount <= 0.0 {
                return Err(bad(
                    format!("runner.ray.resources_per_gpu.{name}"),
                    amount.to_string(),
                    "a positive amount of a resource other than GPU (GPUs come from the \
                     stage's topology)",
                ));
            }
        }
        if self.namespace.as_deref() == Some("") {
            return Err(bad(
                "runner.ray.namespace".into(),
                String::new(),
                "a non-empty namespace, or none",
            ));
        }
        // Unset: every request is refused (Misconfigured) before anything is sent; a dry run,
        // which sends nothing, does not need the token.
        let token = self
            .token_env
            .as_ref()
            .and_then(|var| std::env::var(var).ok())
            .filter(|t| !t.is_empty());
        let client = Client::new(
            base,
            token,
            self.token_env.clone(),
            "runner.ray.address".into(),
            self.request_timeout,
        );
        Ok(RayExecutor {
            inner: Arc::new(Inner {
                client,
                nodes: Mutex::new(None),
                cfg: self,
            }),
        })
    }
}

/// Runs attempts as Ray jobs. See the module docs.
///
/// ```no_run
/// use puzzletron::executor::*;
/// # async fn demo() -> Result<(), ExecutorError> {
/// let exec = RayExecutor::builder("http://127.0.0.1:8265")
///     .namespace("sweeps")
///     .resource_per_gpu("CPU", 4.0)
///     .build()?;
/// exec.preflight().await?;
/// let spec = AttemptSpec::new(AttemptId::new("hello.a1")?, CommandSpec::new("nvidia-smi"))
///     .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(1)));
/// let h = exec.submit(&spec).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RayExecutor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RayExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RayExecutor")
            .field("address", &self.inner.client.base)
            .field("token_env", &self.inner.cfg.token_env)
            .field("namespace", &self.inner.cfg.namespace)
            .finish()
    }
}

struct Inner {
    cfg: RayExecutorBuilder,
    client: Client,
    /// The resources of each live node, from the first preflight.
    nodes: Mutex<Option<Vec<BTreeMap<String, f64>>>>,
}

/// What a preflight found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RayCluster {
    /// Ray's version (`GET /api/version`).
    pub ray_version: String,
    /// Each live node's total resources (`GPU`, `CPU`, `memory` in bytes, custom ones).
    pub nodes: Vec<BTreeMap<String, f64>>,
}

impl RayCluster {
    /// The most of `resource` one node has.
    pub fn max_per_node(&self, resource: &str) -> f64 {
        max_per_node(&self.nodes, resource)
    }
}

fn max_per_node(nodes: &[BTreeMap<String, f64>], resource: &str) -> f64 {
    nodes
        .iter()
        .filter_map(|n| n.get(resource).copied())
        .fold(0.0, f64::max)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RayExecutor {
    /// A builder for the dashboard at `address` (`http://host:8265`).
    pub fn builder(address: impl Into<String>) -> RayExecutorBuilder {
        RayExecutorBuilder {
            address: address.into(),
            token_env: None,
            namespace: None,
            resources_per_gpu: BTreeMap::new(),
            campaign_tag: None,
            contract: ExecutionContract::default(),
            autoscaler: false,
            lost_after: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            cancel_timeout: Duration::from_secs(30),
            kill_grace: Duration::from_secs(10),
        }
    }

    /// The dashboard's address, `http://host:port`.
    pub fn address(&self) -> &str {
        &self.inner.client.base
    }

    /// Asks the cluster for its version and nodes (also done before the first submit): the
    /// address answers, the token is accepted, and there is a live node.
    ///
    /// # Errors
    /// [`ExecutorError::SchedulerUnavailable`] naming `runner.ray.address` when the dashboard
    /// does not answer; [`ExecutorError::Misconfigured`] naming `runner.ray.token_env` for a
    /// 401/403; [`ExecutorError::Parse`] for answers that are not Ray's.
    pub async fn preflight(&self) -> Result<RayCluster, ExecutorError> {
        let ray_version = self.inner.client.version().await?;
        let nodes: Vec<BTreeMap<String, f64>> = self
            .inner
            .client
            .nodes()
            .await?
            .into_iter()
            .map(|n| n.resources_total)
            .collect();
        *lock(&self.inner.nodes) = Some(nodes.clone());
        tracing::debug!(address = %self.address(), ray_version, nodes = nodes.len(), "Ray preflight");
        Ok(RayCluster { ray_version, nodes })
    }

    /// The job request for `spec`: the body [`render`](Executor::render) shows and
    /// [`submit`](Executor::submit) posts.
    fn request(&self, spec: &AttemptSpec) -> Result<SubmitBody, ExecutorError> {
        spec.validate()?;
        spec.refuse_scheduler_options(KIND)?;
        let id = Some(spec.attempt_id.clone());
        let bad = |field: &str, value: String, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: id.clone(),
            field: field.into(),
            value,
            expected: expected.into(),
        };
        let t = &spec.topology;
        if t.nodes != 1 {
            return Err(bad(
                "topology.nodes",
                t.nodes.to_string(),
                "1: the ray executor runs one entrypoint on one node (single-node torchrun \
                 for several GPUs); multi-node instances need the slurm or baremetal runner",
            ));
        }
        if t.ntasks_per_node != 1 {
            return Err(bad(
                "topology.ntasks_per_node",
                t.ntasks_per_node.to_string(),
                "1: a Ray job runs one entrypoint (use the torchrun launcher for several \
                 workers)",
            ));
        }
        let c = if spec.environment.is_empty() {
            &self.inner.cfg.contract
        } else {
            &spec.environment
        };
        if let Some(image) = &c.container {
            return Err(bad(
                "environment.container",
                image.clone(),
                "nothing: the ray executor starts no container (use the image of the Ray \
                 nodes)",
            ));
        }
        let mut argv = match &t.launcher {
            TaskLauncher::Direct | TaskLauncher::Srun { .. } => Vec::new(),
            l @ TaskLauncher::Torchrun { .. } => l
                .torchrun_args(1, None, spec.attempt_id.as_str(), None)
                .unwrap_or_default(),
        };
        argv.extend(spec.command.effective_argv());
        let mut argv = shell::with_contract(argv, c);
        if let Some(w) = spec.walltime {
            let secs = w.as_secs() + u64::from(w.subsec_nanos() > 0);
            let grace = self.inner.cfg.kill_grace.as_secs().max(1);
            let mut v = vec![
                "timeout".to_string(),
                "-k".into(),
                format!("{grace}s"),
                format!("{secs}s"),
            ];
            v.append(&mut argv);
            argv = v;
        }
        let cwd = spec
            .command
            .cwd
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .or_else(|| c.repository.clone());
        let entrypoint = match &cwd {
            Some(d) => format!("cd -- {} && exec {}", shell::quote(d), shell::join(&argv)),
            None => format!("exec {}", shell::join(&argv)),
        };
        let mut env_vars = spec.command.env.clone();
        env_vars.insert(ATTEMPT_ID_ENV.into(), spec.attempt_id.to_string());
        let cfg = &self.inner.cfg;
        if let Some(ns) = &cfg.namespace {
            env_vars.insert("RAY_NAMESPACE".into(), ns.clone());
        }
        let gpus = t.gpus_per_node();
        let per_gpu = |name: &str| {
            cfg.resources_per_gpu
                .get(name)
                .filter(|_| gpus > 0)
                .map(|a| a * f64::from(gpus))
        };
        let cpus = t.cpus_per_task.map(f64::from).or_else(|| per_gpu("CPU"));
        let memory = spec
            .mem_mb
            .map(|m| m.saturating_mul(1 << 20))
            .or_else(|| per_gpu("memory").map(|b| b.ceil() as u64));
        let resources: BTreeMap<String, f64> = cfg
            .resources_per_gpu
            .keys()
            .filter(|k| *k != "CPU" && *k != "memory")
            .filter_map(|k| per_gpu(k).map(|a| (k.clone(), a)))
            .collect();
        let mut metadata = BTreeMap::new();
        metadata.insert(META_ATTEMPT.to_string(), spec.attempt_id.to_string());
        if let Some(tag) = &cfg.campaign_tag {
            metadata.insert(META_CAMPAIGN.into(), tag.clone());
        }
        if let Some(ns) = &cfg.namespace {
            metadata.insert(META_NAMESPACE.into(), ns.clone());
        }
        if let Some(w) = spec.walltime {
            metadata.insert(
                META_WALLTIME.into(),
                (w.as_secs() + u64::from(w.subsec_nanos() > 0)).to_string(),
            );
        }
        if let Some(l) = &spec.log_path {
            metadata.insert(META_LOG.into(), l.to_string_lossy().into_owned());
        }
        Ok(SubmitBody {
            entrypoint,
            submission_id: spec.attempt_id.to_string(),
            entrypoint_num_cpus: cpus,
            entrypoint_num_gpus: (gpus > 0).then_some(f64::from(gpus)),
            entrypoint_memory: memory,
            entrypoint_resources: resources,
            runtime_env: RuntimeEnv { env_vars },
            metadata,
        })
    }

    /// Refuses a request no node of the cluster can ever hold (it would pend forever).
    async fn check_fits(&self, spec: &AttemptSpec, body: &SubmitBody) -> Result<(), ExecutorError> {
        if self.inner.cfg.autoscaler {
            return Ok(());
        }
        let cached = lock(&self.inner.nodes).clone();
        let nodes = match cached {
            Some(n) => n,
            None => self.preflight().await?.nodes,
        };
        let mut wants: Vec<(&str, f64, String)> = Vec::new();
        if let Some(g) = body.entrypoint_num_gpus {
            wants.push(("GPU", g, "the stage's GPUs (entrypoint_num_gpus)".into()));
        }
        if let Some(c) = body.entrypoint_num_cpus {
            wants.push((
                "CPU",
                c,
                if spec.topology.cpus_per_task.is_some() {
                    "topology.cpus_per_task (entrypoint_num_cpus)".into()
                } else {
                    "runner.ray.resources_per_gpu.CPU (entrypoint_num_cpus)".into()
                },
            ));
        }
        if let Some(m) = body.entrypoint_memory {
            wants.push((
                "memory",
                m as f64,
                if spec.mem_mb.is_some() {
                    "mem_mb (entrypoint_memory, bytes)".into()
                } else {
                    "runner.ray.resources_per_gpu.memory (entrypoint_memory, bytes)".into()
                },
            ));
        }
        for (k, a) in &body.entrypoint_resources {
            wants.push((k, *a, format!("runner.ray.resources_per_gpu.{k}")));
        }
        // One node must hold all of it at once.
        if nodes.iter().any(|n| {
            wants
                .iter()
                .all(|(r, a, _)| n.get(*r).copied().unwrap_or(0.0) >= *a)
        }) {
            return Ok(());
        }
        let (r, a, key) = wants
            .iter()
            .find(|(r, a, _)| max_per_node(&nodes, r) < *a)
            .cloned()
            .unwrap_or(("node", 1.0, "one live node".into()));
        Err(ExecutorError::Unsatisfiable {
            attempt_id: spec.attempt_id.clone(),
            needed: format!("{a} {r} on one node, from {key}"),
            available: format!(
                "{} {r} on the largest of the {} live node(s) of the Ray cluster at {} \
                 (runner.ray.address; the job would pend forever; set runner.ray.autoscaler: \
                 true if the cluster adds nodes on demand)",
                max_per_node(&nodes, r),
                nodes.len(),
                self.address()
            ),
        })
    }

    fn handle_of(&self, id: &AttemptId, submitted_at_ms: u64, log: Option<&str>) -> JobHandle {
        let mut h = JobHandle::new(KIND, id.clone(), id.as_str(), submitted_at_ms)
            .with_data("address", self.address());
        if let Some(l) = log {
            h = h.with_data("log_path", l);
        }
        h
    }

    /// Writes the job's logs to `log`, once (an existing file is left alone).
    async fn save_logs(&self, job_id: &str, log: &std::path::Path) {
        if log.exists() {
            return;
        }
        let result = match self.inner.client.logs(job_id).await {
            Ok(text) => {
                let log = log.to_path_buf();
                tokio::task::spawn_blocking(move || {
                    if let Some(dir) = log.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    crate::fsutil::atomic_write(&log, text.as_bytes())
                })
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = result {
            tracing::warn!(job_id, log = %log.display(), error = %e, "cannot save a Ray job's logs");
        }
    }

    fn status_of(&self, h: &JobHandle, info: Option<&JobInfo>) -> (JobStatus, Option<PathBuf>) {
        let log = h
            .data
            .get("log_path")
            .cloned()
            .or_else(|| info.and_then(|i| i.meta(META_LOG)).map(String::from))
            .map(PathBuf::from);
        let Some(info) = info else {
            let age = now_ms().saturating_sub(h.submitted_at_ms);
            let mut st = if u128::from(age) < self.inner.cfg.lost_after.as_millis() {
                JobStatus::new(h.attempt_id.clone(), JobState::Pending)
                    .with_reason("not listed by the Ray cluster yet")
            } else {
                JobStatus::new(h.attempt_id.clone(), JobState::Lost).with_reason(format!(
                    "the Ray cluster at {} does not know submission id {} (a head restarted \
                     without GCS fault tolerance, or a purged job)",
                    self.address(),
                    h.job_id
                ))
            };
            if let Some(l) = &log {
                st = st.with_log_path(l);
            }
            return (st, None);
        };
        let walltime = info
            .meta(META_WALLTIME)
            .and_then(|s| s.parse::<u64>().ok())
            .map(Duration::from_secs);
        let v = classify::classify(info, walltime);
        let mut st = JobStatus::new(h.attempt_id.clone(), v.state).with_times(
            info.start_time,
            info.end_time
                .filter(|_| info.status.as_deref() != Some("RUNNING")),
        );
        if let Some(c) = v.exit_code {
            st = st.with_exit_code(c);
        }
        if let Some(s) = v.signal {
            st = st.with_signal(s);
        }
        if let Some(r) = v.reason {
            st = st.with_reason(r);
        }
        if let Some(n) = &info.driver_node_id {
            st = st.with_nodes(n.chars().take(12).collect::<String>());
        }
        if let Some(l) = &log {
            st = st.with_log_path(l);
        }
        let save = log.filter(|_| st.state.is_terminal() && st.state != JobState::Lost);
        (st, save)
    }
}

#[async_trait]
impl Executor for RayExecutor {
    fn kind(&self) -> &str {
        KIND
    }

    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        let body = self.request(spec)?;
        let content = serde_json::to_string_pretty(&body).map_err(|e| ExecutorError::Other {
            message: format!("cannot write the Ray job request as JSON: {e}"),
            retryable: false,
        })? + "\n";
        let mut r = Rendering::new(spec.attempt_id.clone(), KIND)
            .with_secrets_of(&body.runtime_env.env_vars);
        r.files.push(RenderedFile {
            path: PathBuf::from(format!("{}/api/jobs/", self.address())),
            content,
        });
        r.commands.push(RenderedCommand {
            host: Some("ray-node".into()),
            argv: vec!["/bin/sh".into(), "-c".into(), body.entrypoint.clone()],
            env: body.runtime_env.env_vars.clone(),
            cwd: None,
        });
        r.notes.push(
            "the file is the body POSTed to the Ray Jobs API; the command is how the Ray node \
             Ray picks runs its entrypoint, with CUDA_VISIBLE_DEVICES set to the GPUs Ray \
             reserves for it"
                .into(),
        );
        Ok(r)
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        let r = self.render(spec)?;
        let body = self.request(spec)?;
        self.check_fits(spec, &body).await?;
        let log = spec
            .log_path
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned());
        let handle = self.handle_of(&spec.attempt_id, now_ms(), log.as_deref());
        match self.inner.client.submit(&r.files[0].content).await {
            Ok(Ok(())) => Ok(handle),
            Ok(Err(m)) if m.contains("already exists") => Err(ExecutorError::DuplicateAttempt {
                attempt_id: spec.attempt_id.clone(),
                job_id: spec.attempt_id.to_string(),
            }),
            Ok(Err(m)) => Err(ExecutorError::SubmitRejected {
                attempt_id: spec.attempt_id.clone(),
                message: format!("the Ray cluster at {} refused the job: {m}", self.address()),
            }),
            Err(e) if e.is_retryable() => {
                // The POST may have reached Ray before the connection broke: look it up.
                match self.inner.client.get(spec.attempt_id.as_str()).await {
                    Ok(Some(_)) => Ok(handle),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        for h in handles {
            check_kind(KIND, h)?;
        }
        if handles.is_empty() {
            return Ok(Vec::new());
        }
        let jobs = self.inner.client.list().await?;
        let by_id: std::collections::HashMap<&str, &JobInfo> = jobs
            .iter()
            .filter_map(|j| j.submission_id.as_deref().map(|id| (id, j)))
            .collect();
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            let (st, save) = self.status_of(h, by_id.get(h.job_id.as_str()).copied());
            if let Some(log) = save {
                self.save_logs(&h.job_id, &log).await;
            }
            out.push(st);
        }
        Ok(out)
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        check_kind(KIND, handle)?;
        let c = &self.inner.client;
        if !c.stop(&handle.job_id).await? {
            return Ok(()); // Ray does not know it: nothing runs.
        }
        let deadline = std::time::Instant::now() + self.inner.cfg.cancel_timeout;
        let mut last_stop = std::time::Instant::now();
        loop {
            let info = c.get(&handle.job_id).await?;
            let state = match &info {
                None => return Ok(()),
                Some(i) => classify::classify(i, None).state,
            };
            if state.is_terminal() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(ExecutorError::CancelUnconfirmed {
                    attempt_id: handle.attempt_id.clone(),
                    job_id: handle.job_id.clone(),
                    state: state.to_string(),
                });
            }
            // Ray 2.60 answers `stopped` for a job still waiting for resources but lets it
            // start later: stop it again until it is over.
            if state == JobState::Pending && last_stop.elapsed() >= Duration::from_secs(1) {
                c.stop(&handle.job_id).await?;
                last_stop = std::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        Ok(self
            .inner
            .client
            .get(attempt_id.as_str())
            .await?
            .map(|info| {
                self.handle_of(
                    attempt_id,
                    info.start_time.unwrap_or_else(now_ms),
                    info.meta(META_LOG),
                )
            }))
    }

    async fn cancel_matching(
        &self,
        matches: &(dyn for<'s> Fn(&'s str) -> bool + Send + Sync),
    ) -> Result<Vec<String>, ExecutorError> {
        let cfg = &self.inner.cfg;
        let jobs = self.inner.client.list().await?;
        let mut stopped = Vec::new();
        for j in &jobs {
            let Some(id) = j.submission_id.as_deref() else {
                continue;
            };
            let live = matches!(j.status.as_deref(), Some("PENDING" | "RUNNING"));
            let ours = j.meta(META_ATTEMPT).is_some()
                && cfg
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| j.meta(META_NAMESPACE) == Some(ns))
                && cfg
                    .campaign_tag
                    .as_deref()
                    .is_none_or(|t| j.meta(META_CAMPAIGN) == Some(t));
            if live && ours && matches(id) && self.inner.client.stop(id).await? {
                stopped.push(id.to_string());
            }
        }
        Ok(stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::{CommandSpec, GpuRequest, TaskTopology};

    fn exec() -> RayExecutor {
        RayExecutor::builder("http://127.0.0.1:8265/")
            .namespace("ns1")
            .campaign_tag("camp")
            .resource_per_gpu("CPU", 2.0)
            .resource_per_gpu("accel", 0.5)
            .build()
            .unwrap()
    }

    #[test]
    fn render_is_the_exact_request_body() {
        let spec = AttemptSpec::new(
            AttemptId::new("c.s1.a1").unwrap(),
            CommandSpec::new("python")
                .args(["train.py", "--lr", "0.1 x"])
                .env("HF_TOKEN", "s3cr3t")
                .cwd("/shared/run dir"),
        )
        .with_topology(TaskTopology {
            gpus: GpuRequest::PerNode(2),
            ..TaskTopology::single()
        })
        .with_walltime(Duration::from_millis(1500))
        .with_log_path("/shared/logs/c.s1.a1.log");
        let r = exec().render(&spec).unwrap();
        assert_eq!(
            r.files[0].path,
            PathBuf::from("http://127.0.0.1:8265/api/jobs/")
        );
        let body: serde_json::Value = serde_json::from_str(&r.files[0].content).unwrap();
        assert_eq!(
            body["entrypoint"],
            "cd -- '/shared/run dir' && exec timeout -k 10s 2s python train.py --lr '0.1 x'"
        );
        assert_eq!(body["submission_id"], "c.s1.a1");
        assert_eq!(body["entrypoint_num_gpus"], 2.0);
        assert_eq!(body["entrypoint_num_cpus"], 4.0);
        assert_eq!(body["entrypoint_resources"]["accel"], 1.0);
        assert_eq!(body["runtime_env"]["env_vars"]["RAY_NAMESPACE"], "ns1");
        assert_eq!(body["runtime_env"]["env_vars"][ATTEMPT_ID_ENV], "c.s1.a1");
        assert_eq!(body["metadata"][META_CAMPAIGN], "camp");
        assert_eq!(body["metadata"][META_WALLTIME], "2");
        assert_eq!(body["metadata"][META_LOG], "/shared/logs/c.s1.a1.log");
        // Fixed field order: the same bytes whatever map order serde_json keeps.
        let c = &r.files[0].content;
        let order = [
            "\"entrypoint\"",
            "\"submission_id\"",
            "\"entrypoint_num_cpus\"",
            "\"entrypoint_num_gpus\"",
            "\"entrypoint_resources\"",
            "\"runtime_env\"",
            "\"metadata\"",
        ];
        let pos: Vec<usize> = order.iter().map(|k| c.find(k).unwrap()).collect();
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{c}");
        // Secrets are sent, and redacted for display.
        assert!(c.contains("s3cr3t"));
        assert!(!r.redacted().to_text().contains("s3cr3t"));
    }

    #[test]
    fn unsupported_topologies_and_options_are_refused_naming_the_field() {
        let base = AttemptSpec::new(AttemptId::new("c.a1").unwrap(), CommandSpec::new("true"));
        let multi = base.clone().with_topology(TaskTopology {
            nodes: 2,
            ..TaskTopology::single()
        });
        let tasks = base.clone().with_topology(TaskTopology {
            ntasks_per_node: 4,
            ..TaskTopology::single()
        });
        let mut part = base.clone();
        part.scheduler.partition = Some("gpu".into());
        for (spec, field) in [
            (multi, "topology.nodes"),
            (tasks, "topology.ntasks_per_node"),
            (part, "scheduler.partition"),
        ] {
            match exec().render(&spec) {
                Err(ExecutorError::InvalidSpec { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn single_node_torchrun_is_standalone_over_the_jobs_gpus() {
        let spec = AttemptSpec::new(
            AttemptId::new("c.t.a1").unwrap(),
            CommandSpec::new("train.py"),
        )
        .with_topology(TaskTopology {
            gpus: GpuRequest::PerNode(4),
            launcher: TaskLauncher::torchrun(4),
            ..TaskTopology::single()
        });
        let body = exec().request(&spec).unwrap();
        assert_eq!(
            body.entrypoint,
            "exec torchrun --standalone --nnodes=1 --nproc_per_node=4 --max-restarts=0 train.py"
        );
        assert_eq!(body.entrypoint_num_gpus, Some(4.0));
    }

    #[test]
    fn bad_settings_are_refused_naming_the_runner_key() {
        for (b, key) in [
            (RayExecutor::builder("127.0.0.1:8265"), "runner.ray.address"),
            (RayExecutor::builder("https://h:8265"), "runner.ray.address"),
            (
                RayExecutor::builder("http://h:8265").resource_per_gpu("GPU", 1.0),
                "runner.ray.resources_per_gpu.GPU",
            ),
            (
                RayExecutor::builder("http://h:8265").resource_per_gpu("CPU", -1.0),
                "runner.ray.resources_per_gpu.CPU",
            ),
        ] {
            match b.build() {
                Err(ExecutorError::InvalidSpec { field, .. }) => assert_eq!(field, key),
                other => panic!("{key}: {other:?}"),
            }
        }
        // An unset token variable: built (a dry run needs no token), refused at the first
        // request, before anything is sent.
        let exec = RayExecutor::builder("http://127.0.0.1:1")
            .token_env("PUZZLETRON_TEST_SURELY_UNSET_TOKEN")
            .build()
            .unwrap();
        let e = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(exec.preflight())
            .unwrap_err();
        assert!(
            matches!(&e, ExecutorError::Misconfigured { key, .. } if key.contains("runner.ray.token_env")),
            "{e}"
        );
        assert!(!e.is_retryable());
    }
}
