//! [`BareMetalExecutor`]: attempts on plain GPU hosts over SSH (`runner.kind: baremetal`).
//!
//! - **Transport**: the system OpenSSH client, `ssh -o BatchMode=yes` with an argv array; the
//!   remote side runs fixed `sh` scripts (`remote.rs`) that get every value as a quoted
//!   positional argument, never spliced into shell text. Connections are multiplexed
//!   (`ControlMaster=auto`, `ControlPersist`), and a [`poll`](Executor::poll) asks each host
//!   about all its attempts in one exchange.
//! - **Contract**: each task enters the runner's checkout (`execution_contract.repository`),
//!   sources `setup_env` and `<venv>/bin/activate`, runs the prerun commands, exports its
//!   environment and runs the argv (in `command.cwd` when set).
//! - **Preflight**, once per host before its first task: the repository and venv exist and the
//!   GPU probe (`nvidia-smi -L` by default) lists at least the inventory's GPUs; a host that
//!   answers but fails is [`ExecutorError::HostPreflight`] naming the host and what is missing.
//! - **GPU leases**: first-fit slices in a lock-protected, atomically replaced lease file in
//!   the state folder (the campaign folder), so `CUDA_VISIBLE_DEVICES` are disjoint across
//!   tasks and controller restarts; attempts that do not fit wait there (state `Pending`) and
//!   start when GPUs free up. Multi-host attempts take whole hosts; multi-host torchrun groups
//!   get `<rendezvous_host>:<port>` with a port unique among live leases.
//! - **Tasks** run under `setsid` (pid = process group), with pid, start time and exit record
//!   on the host; [`cancel`](Executor::cancel) and the walltime send SIGTERM to the group, then
//!   SIGKILL after the grace; the wrapper kills what the job leaves in its group.
//! - **Stateless recovery**: the handle (attempt id, hosts, GPUs, state folder) and the lease
//!   file are all a fresh process needs; [`find`](Executor::find) reads the lease file.
//! - **sshd's limits** (`MaxSessions`, `MaxStartups`): at most
//!   [`channel_cap`](BareMetalExecutorBuilder::channel_cap) exchanges per host at once, lowered
//!   when the host refuses a session; an exchange sshd refused for its limits is tried again
//!   after a jittered backoff within the exchange's deadline, never counted against the host.
//!   Launches that reach a host together (within a few ms, or while a launch exchange to it
//!   runs) go in one exchange whose script launches each exactly once and answers each apart;
//!   concurrent submits share one preflight and one program check per host.
//! - **A changed or unknown host key** is never accepted: the host is down with the
//!   operator's message, a submit that may go there is a [`ExecutorError::HostPreflight`]
//!   naming it ([`ExecutorError::refused_host_key`]), and its attempts end
//!   [`JobState::NodeFail`] at the next poll, for the campaign to exclude the host.
//! - **Unreachable hosts** are retried with exponential backoff; their tasks stay `Running`
//!   (reason says since when the host is silent) until `lost_after`, then are reported
//!   [`JobState::NodeFail`] (a transient failure: the controller resubmits elsewhere when the
//!   stage's policy allows). One failed probe never ends an attempt. The GPUs of such a task
//!   stay leased until its host answers again and the task is killed there (it may have kept
//!   running through a network outage).
//!
//! Exit codes are the shell's: a job killed by signal N reports exit code 128+N (state
//! `Failed`, with a reason saying so), except cancel (`Cancelled`) and walltime (`Timeout`).

mod batch;
mod inventory;
mod lease;
mod remote;
mod ssh;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::ExecutionContract;
use super::{
    ATTEMPT_ID_ENV, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobState,
    JobStatus, RenderedCommand, Rendering, TaskLauncher, check_kind, now_ms,
};
pub use inventory::{BaremetalInventory, Host};
pub(crate) use lease::{HostSlots, Lease, LeaseTable, Slice};
use remote::{RemoteState, SubmitAnswer, command_line};
use ssh::{Ssh, SshFailure};

/// Executor kind name, in every handle.
pub(crate) const KIND: &str = "baremetal";

/// A folder on the host whose tasks were started (`started/` made) but never recorded a
/// wrapper is given this long before it counts as lost.
const LAUNCH_GRACE: Duration = Duration::from_secs(30);

/// Builder of a [`BareMetalExecutor`].
#[derive(Debug, Clone)]
pub struct BareMetalExecutorBuilder {
    state_dir: PathBuf,
    hosts: Vec<HostSlots>,
    rendezvous_host: Option<String>,
    rendezvous_port_base: u16,
    contract: ExecutionContract,
    ssh_program: String,
    ssh_config: Option<PathBuf>,
    ssh_options: Vec<String>,
    gpu_probe: Vec<String>,
    remote_root: Option<String>,
    kill_grace: Duration,
    cancel_timeout: Duration,
    lost_after: Duration,
    exchange_timeout: Duration,
    backoff_max: Duration,
    channel_cap: u32,
}

impl BareMetalExecutorBuilder {
    /// Hosts, GPUs and rendezvous settings from a runner's inventory.
    pub fn inventory(mut self, inv: &BaremetalInventory) -> Self {
        self.hosts = inv
            .hosts
            .iter()
            .map(|h| HostSlots {
                host: h.hostname.clone(),
                gpus: h.gpus,
            })
            .collect();
        self.rendezvous_host = Some(inv.rendezvous_host.clone());
        self.rendezvous_port_base = inv.rendezvous_port_base;
        self
    }

    /// Adds one host with `gpus` GPUs (indices `0..gpus`).
    pub fn host(mut self, hostname: impl Into<String>, gpus: u32) -> Self {
        self.hosts.push(HostSlots {
            host: hostname.into(),
            gpus,
        });
        self
    }

    /// The rendezvous host and first port for multi-host torchrun groups (default: the first
    /// host, 29500).
    pub fn rendezvous(mut self, host: impl Into<String>, port_base: u16) -> Self {
        self.rendezvous_host = Some(host.into());
        self.rendezvous_port_base = port_base;
        self
    }

    /// The checkout, venv, setup script and pre/postrun commands every task runs under.
    pub fn contract(mut self, contract: &ExecutionContract) -> Self {
        self.contract = contract.clone();
        self
    }

    /// The OpenSSH client to run (default `ssh`, looked up in `PATH`): a site's wrapper, or a
    /// recording stand-in in tests. It is the first word of every rendered command.
    pub fn ssh_program(mut self, program: impl Into<String>) -> Self {
        self.ssh_program = program.into();
        self
    }

    /// An OpenSSH client config file (`ssh -F`), e.g. with `Host` aliases, users and keys.
    pub fn ssh_config(mut self, path: impl Into<PathBuf>) -> Self {
        self.ssh_config = Some(path.into());
        self
    }

    /// An extra `ssh -o` option, `Key=Value`.
    pub fn ssh_option(mut self, option: impl Into<String>) -> Self {
        self.ssh_options.push(option.into());
        self
    }

    /// The GPU probe's argv (default `nvidia-smi -L`); its output must have a line
    /// `GPU <i>: ...` for every inventory GPU.
    pub fn gpu_probe<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.gpu_probe = argv.into_iter().map(Into::into).collect();
        self
    }

    /// The folder on each host holding attempt folders (default `$PUZZLETRON_BAREMETAL_ROOT`
    /// of the SSH session, else `$HOME/.puzzletron/baremetal`).
    pub fn remote_root(mut self, root: impl Into<String>) -> Self {
        self.remote_root = Some(root.into());
        self
    }

    /// Time between SIGTERM and SIGKILL on cancel and walltime (default 10 s).
    pub fn kill_grace(mut self, grace: Duration) -> Self {
        self.kill_grace = grace;
        self
    }

    /// How long cancel waits after SIGKILL for the exit record (default 10 s).
    pub fn cancel_timeout(mut self, t: Duration) -> Self {
        self.cancel_timeout = t;
        self
    }

    /// How long a host may stay unreachable before its tasks are reported `NodeFail`
    /// (default 120 s).
    pub fn lost_after(mut self, d: Duration) -> Self {
        self.lost_after = d;
        self
    }

    /// Longest one SSH exchange may take (default 30 s); longer counts as unreachable.
    pub fn exchange_timeout(mut self, d: Duration) -> Self {
        self.exchange_timeout = d;
        self
    }

    /// Longest pause between two tries of an unreachable host (default 30 s; the pause
    /// doubles from 0.5 s).
    pub fn backoff_max(mut self, d: Duration) -> Self {
        self.backoff_max = d;
        self
    }

    /// How many SSH exchanges may run on one host at once (default 10, sshd's default
    /// `MaxSessions`); lowered per host, down to 1, each time the host refuses a session.
    pub fn channel_cap(mut self, cap: u32) -> Self {
        self.channel_cap = cap.max(1);
        self
    }

    /// Checks the settings and creates the SSH control folder (the state folder is created at
    /// the first submit).
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] for no host, a host name that is empty, has whitespace
    /// or starts with `-`, a host given twice, an empty GPU probe, a rendezvous host not in the
    /// inventory; [`ExecutorError::Io`] when a folder cannot be created.
    pub fn build(self) -> Result<BareMetalExecutor, ExecutorError> {
        let bad = |field: String, value: String, expected: &str| ExecutorError::InvalidSpec {
            attempt_id: None,
            field,
            value,
            expected: expected.into(),
        };
        if self.hosts.is_empty() {
            return Err(bad(
                "baremetal.hosts".into(),
                "[]".into(),
                "at least one host",
            ));
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if h.host.is_empty() || h.host.starts_with('-') || h.host.contains(char::is_whitespace)
            {
                return Err(bad(
                    format!("baremetal.hosts[{i}].hostname"),
                    h.host.clone(),
                    "a host name (no spaces, not starting with '-')",
                ));
            }
            if self.hosts[..i].iter().any(|o| o.host == h.host) {
                return Err(bad(
                    format!("baremetal.hosts[{i}].hostname"),
                    h.host.clone(),
                    "a host not already in the inventory",
                ));
            }
        }
        if self.gpu_probe.is_empty() || self.gpu_probe[0].is_empty() {
            return Err(bad(
                "baremetal.gpu_probe".into(),
                format!("{:?}", self.gpu_probe),
                "a command, e.g. [\"nvidia-smi\", \"-L\"]",
            ));
        }
        let rdzv = self
            .rendezvous_host
            .clone()
            .unwrap_or_else(|| self.hosts[0].host.clone());
        if !self.hosts.iter().any(|h| h.host == rdzv) {
            return Err(bad(
                "baremetal.rendezvous_host".into(),
                rdzv,
                "one of the inventory's hosts",
            ));
        }
        // Made at the first lease: building (for a dry run) creates no state folder.
        let state_dir = super::resolve_dir(&self.state_dir)?;
        // Control sockets: short paths (108-byte limit), one folder per state folder and user.
        let tag = crate::identity::Hash::of(state_dir.display().to_string().as_bytes()).to_hex();
        let control_dir = std::env::temp_dir().join(format!(
            "ptron-ssh-{}-{}",
            unsafe { libc::getuid() },
            &tag[..10]
        ));
        let ssh = Ssh::new(
            self.ssh_program.clone(),
            self.ssh_config.clone(),
            self.ssh_options.clone(),
            control_dir,
            Duration::from_secs(120),
            self.exchange_timeout
                .max(self.kill_grace + self.cancel_timeout + Duration::from_secs(10)),
            self.channel_cap,
        )?;
        Ok(BareMetalExecutor {
            inner: Arc::new(Inner {
                leases: lease::LeaseFile::new(&state_dir),
                state_dir,
                rendezvous_host: rdzv,
                ssh,
                health: Mutex::new(HashMap::new()),
                launching: Mutex::new(HashSet::new()),
                preflighted: Mutex::new(HashSet::new()),
                pacer: Mutex::new(PollPacer::default()),
                resolved: Mutex::new(HashSet::new()),
                launches: batch::Coalescer::new(LAUNCH_WINDOW),
                checks: batch::Coalescer::new(LAUNCH_WINDOW),
                cfg: self,
            }),
        })
    }
}

/// Runs attempts on SSH hosts. See the module docs.
///
/// ```no_run
/// use puzzletron::executor::*;
/// # async fn demo() -> Result<(), ExecutorError> {
/// let exec = BareMetalExecutor::builder("/data/campaign")
///     .host("gpu-a", 8)
///     .host("gpu-b", 8)
///     .build()?;
/// exec.preflight().await?;
/// let spec = AttemptSpec::new(AttemptId::new("hello.a1")?, CommandSpec::new("nvidia-smi"));
/// let h = exec.submit(&spec).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BareMetalExecutor {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BareMetalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareMetalExecutor")
            .field("state_dir", &self.inner.state_dir)
            .field("hosts", &self.inner.cfg.hosts)
            .finish()
    }
}

struct Inner {
    cfg: BareMetalExecutorBuilder,
    state_dir: PathBuf,
    rendezvous_host: String,
    leases: lease::LeaseFile,
    ssh: Ssh,
    health: Mutex<HashMap<String, Health>>,
    /// Attempts this process is launching right now (a poll must not launch them again).
    launching: Mutex<HashSet<AttemptId>>,
    preflighted: Mutex<HashSet<String>>,
    /// Polls of hosts whose multiplexing is lost, spaced out.
    pacer: Mutex<PollPacer>,
    /// Programs found on a host after a given setup (keys of [`Inner::check_program`]).
    resolved: Mutex<HashSet<String>>,
    /// Launches per host, coalesced into one exchange (issue 27, P06).
    launches: batch::Coalescer<(String, String), Result<SubmitAnswer, SshFailure>>,
    /// Checks (preflight, program lookup) that concurrent submits would each send to a host,
    /// sent once: the callers that ask within the window share the answer.
    checks: batch::Coalescer<(), Result<String, SshFailure>>,
}

/// How long the first launch to a host waits for others to share its exchange.
const LAUNCH_WINDOW: Duration = Duration::from_millis(10);

/// The longest pause between two polls of a host whose multiplexing is lost.
const MUX_LOST_POLL_MAX: Duration = Duration::from_secs(8);

/// Spaces the polls of a host whose multiplexing is lost (issue 27, P05): each exchange is then
/// a full SSH login (key exchange, authentication, a `MaxStartups` slot), so polls back off,
/// 0.5 s doubling to [`MUX_LOST_POLL_MAX`], until the host's master answers again.
#[derive(Debug, Default)]
struct PollPacer {
    /// Per host: the earliest next poll and how many polls the loss has had.
    next: HashMap<String, (Instant, u32)>,
}

impl PollPacer {
    /// Whether `host` may be polled at `now` (`lost`: its multiplexing is lost now); when not,
    /// how long until it may.
    fn admit(&mut self, host: &str, lost: bool, now: Instant) -> Result<(), Duration> {
        let pause = |n: u32| {
            Duration::from_millis(500)
                .saturating_mul(1 << n.min(5))
                .min(MUX_LOST_POLL_MAX)
        };
        if !lost {
            self.next.remove(host);
            return Ok(());
        }
        match self.next.get_mut(host) {
            Some((at, _)) if now < *at => Err(*at - now),
            Some((at, n)) => {
                *n += 1;
                *at = now + pause(*n);
                Ok(())
            }
            None => {
                self.next.insert(host.to_string(), (now + pause(0), 0));
                Ok(())
            }
        }
    }
}

/// What this process knows about an unreachable host.
#[derive(Debug, Clone)]
struct Health {
    down_since_ms: u64,
    failures: u32,
    next_try: Instant,
    last_error: String,
    /// The last exchange failed on the host's SSH key (issue 27, P07).
    key_refused: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BareMetalExecutor {
    /// A builder keeping the lease file in `state_dir` (the campaign folder), with no host yet.
    pub fn builder(state_dir: impl Into<PathBuf>) -> BareMetalExecutorBuilder {
        BareMetalExecutorBuilder {
            state_dir: state_dir.into(),
            hosts: Vec::new(),
            rendezvous_host: None,
            rendezvous_port_base: 29500,
            contract: ExecutionContract::default(),
            ssh_program: "ssh".into(),
            ssh_config: None,
            ssh_options: Vec::new(),
            gpu_probe: vec!["nvidia-smi".into(), "-L".into()],
            remote_root: None,
            kill_grace: Duration::from_secs(10),
            cancel_timeout: Duration::from_secs(10),
            lost_after: Duration::from_secs(120),
            exchange_timeout: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30),
            channel_cap: 10,
        }
    }

    /// SSH exchanges (ssh processes) this executor has started.
    pub fn ssh_exchanges(&self) -> u64 {
        self.inner.ssh.exchanges()
    }

    /// SSH exchanges that launched attempts (each one remote script starting every attempt
    /// that reached its host within a few ms, or while the previous launch there ran).
    pub fn ssh_launch_exchanges(&self) -> u64 {
        self.inner.launches.batches()
    }

    /// SSH exchanges that sshd refused for its limits (`MaxSessions`, `MaxStartups`) and that
    /// were tried again: never a failure of the task or of the host.
    pub fn ssh_refusals(&self) -> u64 {
        self.inner.ssh.refusals()
    }

    /// How many SSH exchanges may run on `host` at once now (the configured
    /// [`channel_cap`](BareMetalExecutorBuilder::channel_cap), lower after refused sessions).
    pub fn ssh_channel_cap(&self, host: &str) -> u32 {
        self.inner.ssh.channel_cap_of(host)
    }

    /// Hosts whose control socket did not answer a check: their exchanges are full logins
    /// for a while ("multiplexing lost"), sorted.
    pub fn ssh_multiplexing_lost(&self) -> Vec<String> {
        self.inner.ssh.multiplexing_lost()
    }

    /// Exchanges run as full logins because multiplexing was lost.
    pub fn ssh_full_logins(&self) -> u64 {
        self.inner.ssh.full_logins()
    }

    /// The folder of this executor's SSH control sockets (one per host; only this executor's
    /// masters live there).
    pub fn ssh_control_dir(&self) -> &Path {
        &self.inner.ssh.control_dir
    }

    /// The lease table as it is on disk now.
    ///
    /// # Errors
    /// I/O or a damaged file.
    pub fn leases(&self) -> Result<LeaseTable, ExecutorError> {
        self.inner.leases.read()
    }

    /// The state folder (canonical).
    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    /// Checks every host now (see the module docs); also done lazily before a host's first
    /// task. Hosts that do not answer are skipped (checked when they come back).
    ///
    /// # Errors
    /// [`ExecutorError::HostPreflight`] for the first host that answers but lacks something;
    /// [`ExecutorError::SchedulerUnavailable`] when no host answers.
    pub async fn preflight(&self) -> Result<(), ExecutorError> {
        let hosts: Vec<String> = self
            .inner
            .cfg
            .hosts
            .iter()
            .map(|h| h.host.clone())
            .collect();
        self.inner.preflight_hosts(&hosts).await
    }
}

impl Inner {
    fn handle(&self, l: &Lease) -> JobHandle {
        let mut h = JobHandle::new(
            KIND,
            l.attempt_id.clone(),
            l.attempt_id.as_str(),
            l.submitted_at_ms,
        )
        .with_data("state_dir", self.state_dir.display().to_string());
        if !l.slices.is_empty() {
            h = h.with_data(
                "hosts",
                l.slices
                    .iter()
                    .map(|s| s.host.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            );
            h = h.with_data(
                "gpus",
                l.slices
                    .iter()
                    .map(|s| {
                        s.gpus
                            .iter()
                            .map(|g| g.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .collect::<Vec<_>>()
                    .join(";"),
            );
        }
        h
    }

    fn check_handle(&self, h: &JobHandle) -> Result<(), ExecutorError> {
        check_kind(KIND, h)?;
        match h.data.get("state_dir") {
            Some(d) if Path::new(d) != self.state_dir => Err(ExecutorError::ForeignHandle {
                expected: format!("baremetal at {}", self.state_dir.display()),
                found: format!("baremetal at {d}"),
                attempt_id: h.attempt_id.clone(),
            }),
            _ => Ok(()),
        }
    }

    fn root_arg(&self) -> String {
        self.cfg.remote_root.clone().unwrap_or_default()
    }

    fn down_hosts(&self) -> BTreeSet<String> {
        lock(&self.health).keys().cloned().collect()
    }

    /// Whether `host` may be contacted now (not inside a backoff pause).
    fn may_try(&self, host: &str) -> bool {
        lock(&self.health)
            .get(host)
            .is_none_or(|h| Instant::now() >= h.next_try)
    }

    /// Records a failed exchange; `key_refused`: it failed on the host's SSH host key.
    fn mark_down(&self, host: &str, err: &str, key_refused: bool) {
        let mut m = lock(&self.health);
        let e = m.entry(host.to_string()).or_insert_with(|| Health {
            down_since_ms: now_ms(),
            failures: 0,
            next_try: Instant::now(),
            last_error: String::new(),
            key_refused: false,
        });
        e.failures += 1;
        let pause = Duration::from_millis(500)
            .saturating_mul(1u32 << e.failures.min(10).saturating_sub(1))
            .min(self.cfg.backoff_max);
        e.next_try = Instant::now() + pause;
        e.last_error = err.to_string();
        e.key_refused = key_refused;
    }

    /// The operator's message when `host`'s last exchange failed on its SSH host key.
    fn refused_key(&self, host: &str) -> Option<String> {
        lock(&self.health)
            .get(host)
            .filter(|h| h.key_refused)
            .map(|h| h.last_error.clone())
    }

    fn mark_up(&self, host: &str) {
        lock(&self.health).remove(host);
    }

    /// One exchange with `host`, recording its health.
    async fn exchange(&self, host: &str, line: &str) -> Result<String, SshFailure> {
        let r = self.ssh.run(host, line).await;
        match &r {
            // A refused host key or public key keeps the host down, with the operator's
            // message, until someone fixes it (issue 27, P07).
            Err(SshFailure::Unreachable(m) | SshFailure::HostConfig(m)) => {
                self.mark_down(host, m, false)
            }
            Err(SshFailure::HostKeyRefused(m)) => self.mark_down(host, m, true),
            _ => self.mark_up(host),
        }
        r
    }

    /// One exchange of `line` with `host` shared by every caller asking the same `key` at
    /// about the same time (a fan-out of submits checks a host once, not once each).
    async fn shared_exchange(
        &self,
        key: &str,
        host: &str,
        line: &str,
    ) -> Result<String, SshFailure> {
        let run = |items: Vec<()>| async move {
            let r = self.exchange(host, line).await;
            items
                .iter()
                .map(|_| match &r {
                    Ok(o) => Ok(o.clone()),
                    Err(e) => Err(e.copy()),
                })
                .collect()
        };
        self.checks.submit(key, (), run).await.unwrap_or_else(|| {
            Err(SshFailure::Unreachable(format!(
                "the check of {host} was abandoned"
            )))
        })
    }

    async fn preflight_hosts(self: &Inner, hosts: &[String]) -> Result<(), ExecutorError> {
        let mut answered = 0;
        let mut last_err = String::new();
        for host in hosts {
            if lock(&self.preflighted).contains(host) {
                answered += 1;
                continue;
            }
            let c = &self.cfg.contract;
            let mut args = vec![
                self.root_arg(),
                c.repository.clone().unwrap_or_default(),
                c.venv.clone().unwrap_or_default(),
            ];
            args.extend(self.cfg.gpu_probe.iter().cloned());
            let line = command_line("ptron-preflight", remote::preflight_body(), &[], &args);
            let out = match self
                .shared_exchange(&format!("preflight\0{host}"), host, &line)
                .await
            {
                Ok(o) => o,
                Err(SshFailure::Unreachable(m)) => {
                    last_err = format!("{host}: {m}");
                    continue;
                }
                Err(e) => return Err(e.into_error(host, "preflight")),
            };
            answered += 1;
            let gpus = self
                .cfg
                .hosts
                .iter()
                .find(|h| &h.host == host)
                .map_or(0, |h| h.gpus);
            check_preflight(host, &out, c, &self.cfg.gpu_probe, gpus)?;
            lock(&self.preflighted).insert(host.clone());
        }
        if answered == 0 && !hosts.is_empty() {
            return Err(ExecutorError::SchedulerUnavailable {
                command: "ssh (preflight)".into(),
                tries: 1,
                message: format!("no host answered; last: {last_err}"),
            });
        }
        Ok(())
    }

    /// Issue 27, item 4: the first word of `spec`'s command must resolve (`command -v`) on
    /// every host it may be placed on, after the job's setup (repository, `setup_env`, venv,
    /// the spec's `PATH`, working directory): a missing program is a configuration error
    /// ([`ExecutorError::HostPreflight`], naming the host, the program, the `PATH` and the
    /// directory), found before anything is leased. Checked once per host and setup; a host
    /// that does not answer, or whose setup fails in the check, is not judged (the job meets
    /// it). Skipped when the contract has prerun commands: those may change `PATH` (`module
    /// load`) and are the site's to run, once, in the job.
    async fn check_program(&self, spec: &AttemptSpec) -> Result<(), ExecutorError> {
        let c = if spec.environment.is_empty() {
            &self.cfg.contract
        } else {
            &spec.environment
        };
        if !c.prerun_commands.is_empty() {
            return Ok(());
        }
        let program = match spec.topology.launcher {
            TaskLauncher::Torchrun { .. } => "torchrun".to_string(),
            _ => match spec.command.effective_argv().into_iter().next() {
                Some(p) => p,
                None => return Ok(()),
            },
        };
        let excluded = lease::excluded_hosts(spec);
        let need = spec.topology.gpus_per_node();
        let mut a = vec![self.root_arg()];
        a.extend(setup_args(c, spec));
        a.push(spec.command.env.get("PATH").cloned().unwrap_or_default());
        a.push(program.clone());
        for h in &self.cfg.hosts {
            if excluded.contains(&h.host) || h.gpus < need {
                continue;
            }
            if !self.may_try(&h.host) {
                // A host whose key was refused stays the host's problem, named at each
                // submit that may go there until the campaign excludes it (issue 27, P07).
                if let Some(m) = self.refused_key(&h.host) {
                    return Err(SshFailure::HostKeyRefused(m).into_error(&h.host, "submit"));
                }
                continue;
            }
            let key = std::iter::once(h.host.as_str())
                .chain(a.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join("\0");
            if lock(&self.resolved).contains(&key) {
                continue;
            }
            let line = command_line("ptron-resolve", remote::resolve_body(), &[], &a);
            let out = match self
                .shared_exchange(&format!("resolve\0{key}"), &h.host, &line)
                .await
            {
                Ok(out) => out,
                // A changed or unknown host key is the host's problem, named now (issue 27,
                // P07): a campaign excludes the host and places the attempt elsewhere.
                Err(e @ SshFailure::HostKeyRefused(_)) => {
                    return Err(e.into_error(&h.host, "submit"));
                }
                // Not judged: the launch meets the host's state itself.
                Err(_) => continue,
            };
            match remote::parse_resolve(&out) {
                Some((dir, path)) => {
                    return Err(ExecutorError::HostPreflight {
                        host: h.host.clone(),
                        problem: format!(
                            "the program `{program}` of attempt {} is not found after the job's \
                             setup: not in PATH={path} (working directory {dir}); install it or \
                             fix the command, the venv or setup_env",
                            spec.attempt_id
                        ),
                    });
                }
                None if out.starts_with("FOUND ") => {
                    lock(&self.resolved).insert(key);
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Places waiting attempts and launches those it placed and every placed attempt of
    /// `only`, concurrently (launches that reach one host together share one exchange, issue
    /// 27, P06). Returns the table and the launch errors, each with its attempt: one attempt's
    /// failure is its own (the caller reports the ones it owns; an attempt left placed and
    /// absent from its host is launched again by the next poll).
    async fn pump(
        &self,
        only: Option<&[AttemptId]>,
    ) -> Result<(LeaseTable, Vec<(AttemptId, ExecutorError)>), ExecutorError> {
        let down = self.down_hosts();
        let base = self.cfg.rendezvous_port_base;
        let hosts = self.cfg.hosts.clone();
        let (table, placed) = self.leases.update(|t| {
            let placed = t.place_waiting(&hosts, &down, base);
            (!placed.is_empty(), (t.clone(), placed))
        })?;
        let mut to_launch: Vec<AttemptId> = placed;
        if let Some(ids) = only {
            for id in ids {
                if !to_launch.contains(id) {
                    to_launch.push(id.clone());
                }
            }
        }
        let launches: Vec<_> = to_launch
            .iter()
            .filter_map(|id| table.get(id))
            .filter(|l| l.is_live() && !l.lost)
            .map(|l| async move { (l.attempt_id.clone(), self.launch(l).await) })
            .collect();
        let errors: Vec<(AttemptId, ExecutorError)> = batch::join_all(launches)
            .await
            .into_iter()
            .filter_map(|(id, r)| r.err().map(|e| (id, e)))
            .collect();
        self.reap_lost(&table).await?;
        Ok((table, errors))
    }

    /// Frees the leases of attempts whose launch was refused before anything ran on their
    /// hosts (a refused host key, an attempt folder that cannot be written): they never run.
    fn release_refused(&self, errors: &[(AttemptId, ExecutorError)]) -> Result<(), ExecutorError> {
        let refused: Vec<&AttemptId> = errors
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    ExecutorError::HostPreflight { .. } | ExecutorError::SubmitRejected { .. }
                )
            })
            .map(|(id, _)| id)
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        self.leases.update(|t| {
            for id in &refused {
                if let Some(l) = t.get_mut(id) {
                    l.released = true;
                }
            }
            (true, ())
        })
    }

    /// Kills the tasks of leases given up as `NODE_FAIL` once their hosts answer again, then
    /// frees their GPUs (until then the GPUs stay leased: the task may still run there).
    async fn reap_lost(&self, table: &LeaseTable) -> Result<(), ExecutorError> {
        let mut freed = Vec::new();
        for l in table.leases.iter().filter(|l| l.lost && !l.released) {
            let mut all = true;
            for s in &l.slices {
                if !self.may_try(&s.host) {
                    all = false;
                    continue;
                }
                let line = command_line(
                    "ptron-cancel",
                    remote::cancel_body(),
                    &[],
                    &[
                        self.root_arg(),
                        l.attempt_id.to_string(),
                        "1".into(),
                        "5".into(),
                    ],
                );
                match self.exchange(&s.host, &line).await {
                    Ok(out) if out.trim() == "DONE" => {}
                    _ => all = false,
                }
            }
            if all {
                freed.push(l.attempt_id.clone());
            }
        }
        if !freed.is_empty() {
            self.leases.update(|t| {
                for id in &freed {
                    if let Some(l) = t.get_mut(id) {
                        l.released = true;
                    }
                }
                (true, ())
            })?;
        }
        Ok(())
    }

    /// Starts `l` on each of its hosts (node rank = slice order). A host that does not answer
    /// leaves the attempt placed there: a later poll finds it absent and launches again (the
    /// host's exclusive `mkdir` keeps it from running twice).
    async fn launch(&self, l: &Lease) -> Result<(), ExecutorError> {
        if !lock(&self.launching).insert(l.attempt_id.clone()) {
            return Ok(());
        }
        let r = self.launch_inner(l).await;
        lock(&self.launching).remove(&l.attempt_id);
        r
    }

    async fn launch_inner(&self, l: &Lease) -> Result<(), ExecutorError> {
        let hosts: Vec<String> = l.slices.iter().map(|s| s.host.clone()).collect();
        self.preflight_hosts(&hosts).await?;
        // What is sent is the rendering of the placed lease (the dry run renders the same
        // function on idle hosts).
        let n = l.slices.len();
        for (rank, slice) in l.slices.iter().enumerate() {
            if !self.may_try(&slice.host) {
                continue;
            }
            let words = self.submit_words(&l.spec, n, rank, slice, l.rdzv_port);
            match self.launch_on(&slice.host, &l.attempt_id, words).await {
                Ok(SubmitAnswer::Ok | SubmitAnswer::Dup) => {}
                Ok(SubmitAnswer::Err(why)) => {
                    return Err(ExecutorError::SubmitRejected {
                        attempt_id: l.attempt_id.clone(),
                        message: format!("host {}: {why}", slice.host),
                    });
                }
                Err(SshFailure::Unreachable(_)) => {}
                Err(e) => return Err(e.into_error(&slice.host, "submit")),
            }
        }
        Ok(())
    }

    /// Launches attempt `id` (its job arguments `words`) on `host`, in one exchange with the
    /// other launches that reach the host at about the same time; its own answer.
    async fn launch_on(
        &self,
        host: &str,
        id: &AttemptId,
        words: String,
    ) -> Result<SubmitAnswer, SshFailure> {
        let run = |items: Vec<(String, String)>| async move {
            let line = self.submit_line(&items);
            match self.exchange(host, &line).await {
                Ok(out) => {
                    let answers = remote::parse_submit(&out);
                    items
                        .iter()
                        .map(|(id, _)| match answers.get(id) {
                            Some(a) => Ok(a.clone()),
                            // Started or not, it cannot be told: the poll finds out (the
                            // host's exclusive mkdir keeps a second launch from running it).
                            None => Err(SshFailure::Unreachable(format!(
                                "no answer about {id} from the launch on {host}: {out:?}"
                            ))),
                        })
                        .collect()
                }
                Err(e) => items.iter().map(|_| Err(e.copy())).collect(),
            }
        };
        self.launches
            .submit(host, (id.to_string(), words), run)
            .await
            .unwrap_or_else(|| {
                Err(SshFailure::Unreachable(format!(
                    "the launch exchange to {host} was abandoned"
                )))
            })
    }

    /// The remote command line launching `items` (attempt id, job arguments) in one script.
    fn submit_line(&self, items: &[(String, String)]) -> String {
        let mut args = vec![
            self.root_arg(),
            remote::wrapper_script(),
            remote::JOB.to_string(),
        ];
        for (id, words) in items {
            args.push(id.clone());
            args.push(words.clone());
        }
        command_line("ptron-submit", remote::submit_body(), &[], &args)
    }

    /// The `ssh` commands that start `spec` on `slices` (node rank = slice order), with the
    /// rendezvous port of a multi-host group: one per host, the remote command last.
    fn render_placed(
        &self,
        spec: &AttemptSpec,
        slices: &[Slice],
        rdzv_port: Option<u16>,
    ) -> Rendering {
        let mut r =
            Rendering::new(spec.attempt_id.clone(), KIND).with_secrets_of(&spec.command.env);
        for (rank, slice) in slices.iter().enumerate() {
            let words = self.submit_words(spec, slices.len(), rank, slice, rdzv_port);
            let line = self.submit_line(&[(spec.attempt_id.to_string(), words)]);
            r.commands.push(RenderedCommand {
                host: Some(slice.host.clone()),
                argv: std::iter::once(self.ssh.program.clone())
                    .chain(self.ssh.argv(&slice.host, &line))
                    .collect(),
                env: BTreeMap::new(),
                cwd: None,
            });
        }
        r
    }

    /// What [`submit`](Executor::submit) sends for `spec` when its hosts are idle: the lease
    /// first-fit on an empty table (the executor leases the first free GPUs at run time).
    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        validate(spec, &self.cfg.hosts)?;
        let mut table = LeaseTable::default();
        table.leases.push(Lease {
            attempt_id: spec.attempt_id.clone(),
            spec: spec.clone(),
            submitted_at_ms: 0,
            slices: Vec::new(),
            whole: false,
            rdzv_port: None,
            released: false,
            cancelled: false,
            lost: false,
        });
        table.place_waiting(
            &self.cfg.hosts,
            &BTreeSet::new(),
            self.cfg.rendezvous_port_base,
        );
        let l = &table.leases[0];
        let mut r = self.render_placed(spec, &l.slices, l.rdzv_port);
        r.notes.push(
            "hosts and GPUs as leased on idle hosts; at run time the lease takes the first free \
             ones (gpu-leases.json in the state folder)"
                .into(),
        );
        Ok(r)
    }

    /// The job's arguments for `spec` on `slice` (node `rank` of `nodes`), as quoted shell
    /// words (the `args` file of its attempt folder).
    fn submit_words(
        &self,
        spec: &AttemptSpec,
        nodes: usize,
        rank: usize,
        slice: &Slice,
        rdzv_port: Option<u16>,
    ) -> String {
        // The spec's contract when it has one (a campaign's), else the executor's.
        let c = if spec.environment.is_empty() {
            &self.cfg.contract
        } else {
            &spec.environment
        };
        let mut env: BTreeMap<String, String> = spec.command.env.clone();
        env.insert(ATTEMPT_ID_ENV.into(), spec.attempt_id.to_string());
        env.insert(
            "CUDA_VISIBLE_DEVICES".into(),
            slice
                .gpus
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        env.insert("PUZZLETRON_NODE_RANK".into(), rank.to_string());
        env.insert("PUZZLETRON_NNODES".into(), nodes.to_string());
        env.insert("PUZZLETRON_HOST".into(), slice.host.clone());
        let mut argv = spec.command.effective_argv();
        if let Some(port) = rdzv_port {
            env.insert("MASTER_ADDR".into(), self.rendezvous_host.clone());
            env.insert("MASTER_PORT".into(), port.to_string());
        }
        // A group over several hosts meets at the rendezvous host on its leased port.
        let endpoint = rdzv_port.map(|port| format!("{}:{port}", self.rendezvous_host));
        if let Some(mut t) = spec.topology.launcher.torchrun_args(
            nodes as u32,
            endpoint.as_deref(),
            spec.attempt_id.as_str(),
            Some(rank),
        ) {
            t.extend(argv);
            argv = t;
        }
        let log = spec
            .log_path
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let wall = spec.walltime.map_or(0, |w| w.as_secs().max(1));
        let mut a = vec![
            log,
            wall.to_string(),
            self.cfg.kill_grace.as_secs().max(1).to_string(),
        ];
        a.extend(setup_args(c, spec));
        a.push(c.prerun_commands.len().to_string());
        a.extend(c.prerun_commands.iter().cloned());
        a.push(c.postrun_commands.len().to_string());
        a.extend(c.postrun_commands.iter().cloned());
        a.push(env.len().to_string());
        a.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        a.extend(argv);
        let words: Vec<String> = a.iter().map(|w| remote::quote(w)).collect();
        words.join(" ")
    }

    /// The states of `ids` on `host` in one exchange; `Err` with the reason when the host did
    /// not answer (or is inside its backoff pause).
    async fn poll_host(&self, host: &str, ids: &[AttemptId]) -> Result<HostAnswer, String> {
        if !self.may_try(host) {
            return Err(self.down_reason(host));
        }
        let lost = self.ssh.multiplexing_lost().iter().any(|h| h == host);
        if let Err(wait) = lock(&self.pacer).admit(host, lost, Instant::now()) {
            return Err(format!(
                "host {host}: ssh multiplexing lost (every exchange a full login): polls back \
                 off, next in {} ms",
                wait.as_millis()
            ));
        }
        let mut args = vec![self.root_arg()];
        args.extend(ids.iter().map(|i| i.to_string()));
        let line = command_line("ptron-poll", remote::poll_body(), &[], &args);
        match self.exchange(host, &line).await {
            Ok(out) => {
                let mut bad: HashMap<String, Vec<(String, String)>> = HashMap::new();
                for (id, file, text) in remote::parse_bad_records(&out) {
                    bad.entry(id).or_default().push((file, text));
                }
                Ok(HostAnswer {
                    states: remote::parse_poll(&out).into_iter().collect(),
                    bad,
                })
            }
            Err(SshFailure::Unreachable(_)) => Err(self.down_reason(host)),
            Err(SshFailure::Remote { code, stderr }) => {
                Err(format!("poll script on {host} failed ({code:?}): {stderr}"))
            }
            Err(SshFailure::Spawn(e)) => Err(format!("cannot run ssh: {e}")),
            Err(SshFailure::HostConfig(m) | SshFailure::HostKeyRefused(m)) => {
                Err(format!("{host}: {m}"))
            }
        }
    }

    fn down_reason(&self, host: &str) -> String {
        match lock(&self.health).get(host) {
            Some(h) => format!(
                "host {host} unreachable for {} s ({} tries): {}",
                now_ms().saturating_sub(h.down_since_ms) / 1000,
                h.failures,
                h.last_error
            ),
            None => format!("host {host} not asked"),
        }
    }

    fn down_for(&self, host: &str) -> Option<Duration> {
        lock(&self.health)
            .get(host)
            .map(|h| Duration::from_millis(now_ms().saturating_sub(h.down_since_ms)))
    }
}

/// Reads the preflight answer.
fn check_preflight(
    host: &str,
    out: &str,
    c: &ExecutionContract,
    probe: &[String],
    gpus: u32,
) -> Result<(), ExecutorError> {
    let fail = |problem: String| ExecutorError::HostPreflight {
        host: host.to_string(),
        problem,
    };
    let mut lines = out.lines();
    let mut probe_out = String::new();
    let mut probe_rc = None;
    for l in lines.by_ref() {
        match l.split_once(' ') {
            Some(("REPO", "missing")) => {
                return Err(fail(format!(
                    "the repository {} does not exist",
                    c.repository.as_deref().unwrap_or_default()
                )));
            }
            Some(("VENV", "missing")) => {
                return Err(fail(format!(
                    "the venv {} has no bin/activate",
                    c.venv.as_deref().unwrap_or_default()
                )));
            }
            Some(("ROOT", r)) if r.starts_with("unwritable") => {
                return Err(fail(format!(
                    "the state folder {} is not writable",
                    &r[11..]
                )));
            }
            Some(("PROBE", rc)) => {
                probe_rc = rc.parse::<i32>().ok();
                break;
            }
            _ => {}
        }
    }
    for l in lines {
        probe_out.push_str(l);
        probe_out.push('\n');
    }
    if probe_rc != Some(0) {
        return Err(fail(format!(
            "the GPU probe `{}` failed (exit {:?}): {}",
            probe.join(" "),
            probe_rc,
            probe_out.trim()
        )));
    }
    let listed: BTreeSet<u32> = probe_out
        .lines()
        .filter_map(|l| l.strip_prefix("GPU "))
        .filter_map(|l| l.split(':').next()?.trim().parse().ok())
        .collect();
    let missing: Vec<u32> = (0..gpus).filter(|g| !listed.contains(g)).collect();
    if !missing.is_empty() {
        return Err(fail(format!(
            "the GPU probe `{}` lists {} GPU(s), the inventory says {gpus}; missing GPU {:?}",
            probe.join(" "),
            listed.len(),
            missing
        )));
    }
    Ok(())
}

/// The status of one host's part of an attempt.
fn host_status(
    id: &AttemptId,
    st: &RemoteState,
    now: u64,
    submitted: u64,
    host: &str,
    root: &str,
) -> JobStatus {
    let s = |state| JobStatus::new(id.clone(), state);
    match st {
        RemoteState::Absent => {
            if now.saturating_sub(submitted) < LAUNCH_GRACE.as_millis() as u64 {
                s(JobState::Pending).with_reason("launching")
            } else {
                s(JobState::Lost).with_reason("no attempt folder on the host")
            }
        }
        RemoteState::Submitted { submitted_ms } => {
            if now.saturating_sub(*submitted_ms.max(&submitted)) < LAUNCH_GRACE.as_millis() as u64 {
                s(JobState::Pending).with_reason("starting")
            } else {
                s(JobState::Lost).with_reason("the wrapper never started")
            }
        }
        RemoteState::Wrapping => s(JobState::Running),
        RemoteState::Running { start_ms } => s(JobState::Running).with_times(*start_ms, None),
        RemoteState::Dead => s(JobState::Lost)
            .with_reason("the wrapper ended without recording an exit (host rebooted?)"),
        RemoteState::Exited(r) => {
            let base = s(JobState::Completed).with_times(r.start_ms, r.end_ms);
            if r.status == "cancelled_before_start" {
                let mut b = base;
                b.state = JobState::Cancelled { by_uid: None };
                return b.with_reason("cancelled before it started");
            }
            if !r.malformed.is_empty() || (r.status == "exited" && r.code.is_none()) {
                // Bad input (issue 27): named with its path; no exit code is made up, the
                // attempt is judged by the rest of the evidence (its log, its outputs).
                let root = if root.is_empty() {
                    "$HOME/.puzzletron/baremetal"
                } else {
                    root
                };
                let mut b = base.with_reason(format!(
                    "malformed exit file {root}/{id}/exit on {host}: {}; the exit code is unknown",
                    if r.malformed.is_empty() {
                        "no `code=` entry".to_string()
                    } else {
                        r.malformed
                            .iter()
                            .map(|m| format!("`{m}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
                b.state = if r.timeout {
                    JobState::Timeout
                } else {
                    JobState::Failed
                };
                b.exit_code = r.code;
                return b;
            }
            let code = r.code.unwrap_or(-1);
            let mut b = base.with_exit_code(code);
            b.state = if r.timeout {
                JobState::Timeout
            } else if r.cancelled && code != 0 {
                JobState::Cancelled { by_uid: None }
            } else if code == 0 {
                JobState::Completed
            } else {
                JobState::Failed
            };
            if b.state == JobState::Failed && code > 128 {
                b = b.with_reason(format!(
                    "exit {code}: the shell's code for death by signal {} (or an exit {code})",
                    code - 128
                ));
            }
            b
        }
    }
}

/// One host's poll answer: the state of each attempt asked about, and the malformed pid
/// records (`job`/`wrapper`: file name, first bytes) of those that have one.
struct HostAnswer {
    states: HashMap<String, RemoteState>,
    bad: HashMap<String, Vec<(String, String)>>,
}

/// Names the malformed pid records of `st`'s attempt on `host` (bad input, issue 27): with
/// their path and host, before the reason the rest of the evidence gave (the exit record, a
/// live wrapper, or a process of the host running in the attempt's folder); the records
/// themselves were not used.
fn with_bad_records(
    mut st: JobStatus,
    bad: &[(String, String)],
    host: &str,
    root: &str,
) -> JobStatus {
    if bad.is_empty() {
        return st;
    }
    let root = if root.is_empty() {
        "$HOME/.puzzletron/baremetal"
    } else {
        root
    };
    let mut why = bad
        .iter()
        .map(|(file, text)| {
            format!(
                "malformed pid file {root}/{}/{file} on {host}: `{text}` (not used)",
                st.attempt_id
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    why.push_str(match st.state {
        JobState::Running => "; a process of the attempt still runs there",
        JobState::Lost => "; no process of the attempt runs there and no exit record",
        _ => "",
    });
    if let Some(r) = &st.reason {
        why = format!("{why}; {r}");
    }
    st.reason = Some(why);
    st
}

/// Combines the parts of a multi-host attempt: running while any part runs; else the first
/// part that did not complete; else completed.
fn combine(parts: Vec<JobStatus>) -> JobStatus {
    if let Some(p) = parts.iter().find(|p| p.state.is_active()) {
        return p.clone();
    }
    parts
        .iter()
        .find(|p| !p.state.is_success())
        .cloned()
        .unwrap_or_else(|| parts[0].clone())
}

fn validate(spec: &AttemptSpec, hosts: &[HostSlots]) -> Result<(), ExecutorError> {
    spec.validate()?;
    spec.refuse_scheduler_options(KIND)?;
    let id = &spec.attempt_id;
    let bad = |field: &str, value: String, expected: &str| ExecutorError::InvalidSpec {
        attempt_id: Some(id.clone()),
        field: field.into(),
        value,
        expected: expected.into(),
    };
    for k in spec.command.env.keys() {
        let ok = k
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        if !ok {
            return Err(bad(
                "command.env",
                k.clone(),
                "a shell variable name ([A-Za-z_][A-Za-z0-9_]*) for the bare-metal executor",
            ));
        }
    }
    let t = &spec.topology;
    let torchrun = matches!(t.launcher, TaskLauncher::Torchrun { .. });
    if t.ntasks_per_node != 1 && !torchrun {
        return Err(bad(
            "topology.ntasks_per_node",
            t.ntasks_per_node.to_string(),
            "1 for the bare-metal executor (use the Torchrun launcher for several processes)",
        ));
    }
    if torchrun && spec.command.shell {
        return Err(bad(
            "command.shell",
            "true".into(),
            "false with the Torchrun launcher (torchrun runs a script file)",
        ));
    }
    let need = t.gpus_per_node();
    // Hosts the campaign excluded never count (issue 27): an attempt that fits only on them
    // is refused now, never left waiting for ever.
    let excluded = lease::excluded_hosts(spec);
    let fit = hosts
        .iter()
        .filter(|h| h.gpus >= need && !excluded.contains(&h.host))
        .count();
    if (t.nodes as usize) > fit {
        return Err(ExecutorError::Unsatisfiable {
            attempt_id: id.clone(),
            needed: format!("{} host(s) with {need} GPU(s) each", t.nodes),
            available: format!(
                "{} host(s): {}",
                hosts.len(),
                hosts
                    .iter()
                    .map(|h| if excluded.contains(&h.host) {
                        format!("{} ({} GPUs, excluded by --exclude)", h.host, h.gpus)
                    } else {
                        format!("{} ({} GPUs)", h.host, h.gpus)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(())
}

#[async_trait]
impl Executor for BareMetalExecutor {
    fn kind(&self) -> &str {
        KIND
    }

    fn render(&self, spec: &AttemptSpec) -> Result<Rendering, ExecutorError> {
        self.inner.render(spec)
    }

    async fn submit(&self, spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        let inner = &self.inner;
        validate(spec, &inner.cfg.hosts)?;
        inner.check_program(spec).await?;
        let id = spec.attempt_id.clone();
        let dup = inner.leases.update(|t| match t.get(&id) {
            Some(_) => (false, true),
            None => {
                t.leases.push(Lease {
                    attempt_id: id.clone(),
                    spec: spec.clone(),
                    submitted_at_ms: now_ms(),
                    slices: Vec::new(),
                    whole: false,
                    rdzv_port: None,
                    released: false,
                    cancelled: false,
                    lost: false,
                });
                (true, false)
            }
        })?;
        if dup {
            return Err(ExecutorError::DuplicateAttempt {
                attempt_id: id.clone(),
                job_id: id.to_string(),
            });
        }
        let (table, errors) = inner.pump(Some(std::slice::from_ref(&id))).await?;
        inner.release_refused(&errors)?;
        // Only this attempt's own launch error fails this submit.
        if let Some((_, e)) = errors.into_iter().find(|(a, _)| *a == id) {
            return Err(e);
        }
        let l = table.get(&id).expect("just added");
        Ok(inner.handle(l))
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        let inner = &self.inner;
        for h in handles {
            inner.check_handle(h)?;
        }
        if handles.is_empty() {
            return Ok(Vec::new());
        }
        let (table, errors) = inner.pump(None).await?;
        inner.release_refused(&errors)?;
        // Launches refused for a changed or unknown host key (issue 27, P07): nothing ran; the
        // attempt ends as a node failure naming the host, for the campaign to exclude it.
        let mut refused: HashMap<AttemptId, (String, String)> = errors
            .iter()
            .filter_map(|(id, e)| {
                let host = e.refused_host_key()?.to_string();
                Some((id.clone(), (host, e.to_string())))
            })
            .collect();
        let now = now_ms();
        // Which hosts to ask about which attempts.
        let mut by_host: BTreeMap<String, Vec<AttemptId>> = BTreeMap::new();
        let mut placement: Vec<Option<Vec<String>>> = Vec::with_capacity(handles.len());
        for h in handles {
            let hosts: Option<Vec<String>> = match table.get(&h.attempt_id) {
                Some(l) if !l.slices.is_empty() => {
                    Some(l.slices.iter().map(|s| s.host.clone()).collect())
                }
                Some(_) => None,
                None => h
                    .data
                    .get("hosts")
                    .map(|s| s.split(',').map(str::to_string).collect()),
            };
            if let Some(hs) = &hosts {
                for host in hs {
                    by_host
                        .entry(host.clone())
                        .or_default()
                        .push(h.attempt_id.clone());
                }
            }
            placement.push(hosts);
        }
        let mut answers: HashMap<String, Result<HostAnswer, String>> = HashMap::new();
        let mut set = tokio::task::JoinSet::new();
        for (host, ids) in by_host {
            let me = Arc::clone(inner);
            set.spawn(async move {
                let r = me.poll_host(&host, &ids).await;
                (host, r)
            });
        }
        while let Some(r) = set.join_next().await {
            let (host, res) = r.map_err(|e| ExecutorError::Other {
                message: format!("poll task failed: {e}"),
                retryable: true,
            })?;
            answers.insert(host, res);
        }
        let mut out = Vec::with_capacity(handles.len());
        let mut finished: Vec<(AttemptId, bool)> = Vec::new();
        let mut relaunch: Vec<AttemptId> = Vec::new();
        for (h, hosts) in handles.iter().zip(placement) {
            let id = &h.attempt_id;
            let lease = table.get(id);
            let submitted = lease.map_or(h.submitted_at_ms, |l| l.submitted_at_ms);
            let status = match hosts {
                _ if lease.is_some_and(|l| l.lost) => {
                    JobStatus::new(id.clone(), JobState::NodeFail).with_reason(format!(
                        "host unreachable for more than {} s; its GPUs stay leased until the \
                         host answers and the task is killed there",
                        inner.cfg.lost_after.as_secs()
                    ))
                }
                None => match lease {
                    Some(l) if l.cancelled => {
                        JobStatus::new(id.clone(), JobState::Cancelled { by_uid: None })
                            .with_reason("cancelled while waiting for GPUs")
                    }
                    Some(l) => JobStatus::new(id.clone(), JobState::Pending).with_reason(format!(
                        "waiting for {} GPU(s) on {} host(s)",
                        l.spec.topology.gpus_per_node(),
                        l.spec.topology.nodes
                    )),
                    None => JobStatus::new(id.clone(), JobState::Lost).with_reason(
                        "unknown attempt: not in the lease file and no hosts in the handle",
                    ),
                },
                Some(hosts) => {
                    let mut parts = Vec::new();
                    for host in &hosts {
                        let part = match answers.get(host) {
                            Some(Ok(a)) => match a.states.get(id.as_str()) {
                                Some(RemoteState::Absent)
                                    if lease.is_some_and(|l| l.is_live() && !l.cancelled) =>
                                {
                                    relaunch.push(id.clone());
                                    JobStatus::new(id.clone(), JobState::Pending)
                                        .with_reason(format!("launching on {host}"))
                                }
                                Some(st) => with_bad_records(
                                    host_status(id, st, now, submitted, host, &inner.root_arg()),
                                    a.bad.get(id.as_str()).map_or(&[], Vec::as_slice),
                                    host,
                                    &inner.root_arg(),
                                ),
                                None => JobStatus::new(id.clone(), JobState::Running)
                                    .with_reason(format!("no answer about it from {host}")),
                            },
                            Some(Err(reason)) => {
                                // A host whose key changed or is unknown is not talked to
                                // again until an operator fixes it: what ran there is given
                                // up now (issue 27, P07), not after `lost_after`.
                                if inner.refused_key(host).is_some() {
                                    JobStatus::new(id.clone(), JobState::NodeFail)
                                        .with_reason(reason.clone())
                                        .with_refused_host_key(host.clone())
                                } else if inner
                                    .down_for(host)
                                    .is_some_and(|d| d >= inner.cfg.lost_after)
                                {
                                    JobStatus::new(id.clone(), JobState::NodeFail)
                                        .with_reason(reason.clone())
                                } else {
                                    JobStatus::new(id.clone(), JobState::Running)
                                        .with_reason(reason.clone())
                                }
                            }
                            None => JobStatus::new(id.clone(), JobState::Running),
                        };
                        parts.push(part.with_nodes(host.clone()));
                    }
                    let mut s = combine(parts);
                    s.nodes = Some(hosts.join(","));
                    s
                }
            };
            let mut status = status;
            if let Some(l) = lease {
                let log = l
                    .spec
                    .log_path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(format!("<remote root>/{id}/output.log")));
                status = status.with_log_path(log);
            }
            if status.state.is_terminal() && lease.is_some_and(|l| !l.released && !l.lost) {
                finished.push((id.clone(), status.state == JobState::NodeFail));
            }
            out.push(status);
        }
        if !finished.is_empty() {
            inner.leases.update(|t| {
                for (id, node_fail) in &finished {
                    if let Some(l) = t.get_mut(id) {
                        // A node failure (a host silent past lost_after): the task may still
                        // run there; reap_lost frees the GPUs once the host confirms it gone.
                        if *node_fail {
                            l.lost = true;
                        } else {
                            l.released = true;
                        }
                    }
                }
                (true, ())
            })?;
        }
        if !relaunch.is_empty() {
            let (_, errors) = inner.pump(Some(&relaunch)).await?;
            inner.release_refused(&errors)?;
            for (id, e) in errors {
                if let Some(host) = e.refused_host_key() {
                    refused.insert(id, (host.to_string(), e.to_string()));
                } else {
                    return Err(e);
                }
            }
        }
        for s in &mut out {
            if let Some((host, why)) = refused.get(&s.attempt_id) {
                s.state = JobState::NodeFail;
                s.reason = Some(why.clone());
                s.refused_host_key = Some(host.clone());
            }
        }
        Ok(out)
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        let inner = &self.inner;
        inner.check_handle(handle)?;
        let id = &handle.attempt_id;
        // A waiting attempt is taken out of the queue under the lock: it can never start.
        let placed = inner.leases.update(|t| match t.get_mut(id) {
            Some(l) if l.slices.is_empty() && !l.released => {
                l.released = true;
                l.cancelled = true;
                (true, None)
            }
            Some(l) => (
                false,
                Some(l.slices.iter().map(|s| s.host.clone()).collect::<Vec<_>>()),
            ),
            None => (
                false,
                handle
                    .data
                    .get("hosts")
                    .map(|s| s.split(',').map(str::to_string).collect()),
            ),
        })?;
        let Some(hosts) = placed else { return Ok(()) };
        let deadline = Instant::now() + inner.cfg.kill_grace + inner.cfg.cancel_timeout * 2;
        for host in hosts {
            let args = vec![
                inner.root_arg(),
                id.to_string(),
                inner.cfg.kill_grace.as_secs().max(1).to_string(),
                inner.cfg.cancel_timeout.as_secs().max(1).to_string(),
            ];
            let line = command_line("ptron-cancel", remote::cancel_body(), &[], &args);
            loop {
                match inner.exchange(&host, &line).await {
                    Ok(out) if out.trim() == "DONE" || out.trim() == "ABSENT" => break,
                    Ok(out) => {
                        return Err(ExecutorError::CancelUnconfirmed {
                            attempt_id: id.clone(),
                            job_id: id.to_string(),
                            state: format!("{host}: {}", out.trim()),
                        });
                    }
                    Err(SshFailure::Unreachable(m)) => {
                        if Instant::now() >= deadline {
                            return Err(ExecutorError::CancelUnconfirmed {
                                attempt_id: id.clone(),
                                job_id: id.to_string(),
                                state: format!("host {host} unreachable: {m}"),
                            });
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(e.into_error(&host, "cancel")),
                }
            }
        }
        inner.leases.update(|t| match t.get_mut(id) {
            Some(l) if !l.released => {
                l.released = true;
                (true, ())
            }
            _ => (false, ()),
        })?;
        Ok(())
    }

    async fn find(&self, attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        let t = self.inner.leases.read()?;
        Ok(t.get(attempt_id).map(|l| self.inner.handle(l)))
    }

    /// The job script writes the start mark after its setup, just before the payload (issue
    /// 27: the `JOB` script of `remote.rs`).
    fn writes_start_mark(&self) -> bool {
        true
    }
}

/// The job's setup as the host scripts take it (`JOB` and the program check of `remote.rs`):
/// repository, setup_env script, venv and working directory, empty when unset.
fn setup_args(c: &ExecutionContract, spec: &AttemptSpec) -> [String; 4] {
    [
        c.repository.clone().unwrap_or_default(),
        c.setup_env.clone().unwrap_or_default(),
        c.venv.clone().unwrap_or_default(),
        spec.command
            .cwd
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
    ]
}

#[cfg(test)]
mod pacer_tests {
    use super::*;

    /// Issue 27, P05: while a host's multiplexing is lost its polls back off (0.5 s doubling
    /// to 8 s); other hosts and the host once its master is back are polled at once.
    #[test]
    fn polls_back_off_while_multiplexing_is_lost() {
        let mut p = PollPacer::default();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(p.admit("h1", false, t0), Ok(()));
        assert_eq!(p.admit("h1", false, t0), Ok(()));
        // Lost: the first poll goes, the next waits 0.5 s, then 1 s, 2 s, ... 8 s.
        assert_eq!(p.admit("h1", true, t0), Ok(()));
        assert_eq!(p.admit("h1", true, t0 + ms(100)), Err(ms(400)));
        let mut t = t0 + ms(500);
        for want in [1000, 2000, 4000, 8000, 8000, 8000] {
            assert_eq!(p.admit("h1", true, t), Ok(()));
            assert_eq!(p.admit("h1", true, t + ms(1)), Err(ms(want - 1)));
            t += ms(want);
        }
        // Another host is not slowed down.
        assert_eq!(p.admit("h2", false, t0), Ok(()));
        // The master is back: polled at once, and a later loss starts from 0.5 s again.
        assert_eq!(p.admit("h1", false, t0 + ms(1)), Ok(()));
        assert_eq!(p.admit("h1", true, t), Ok(()));
        assert_eq!(p.admit("h1", true, t + ms(1)), Err(ms(499)));
    }
}

#[cfg(test)]
mod exclusion_tests {
    use super::*;
    use crate::executor::{CommandSpec, GpuRequest, TaskTopology};

    /// Issue 27: hosts the campaign excluded (`--exclude=` in the spec) never count; an
    /// attempt that fits only on them is refused at once, naming them, never left waiting.
    #[test]
    fn an_attempt_fitting_only_on_excluded_hosts_is_refused_naming_them() {
        let hosts = [("h1", 4), ("h2", 2)].map(|(h, g)| HostSlots {
            host: h.into(),
            gpus: g,
        });
        let spec = |gpus: u32, exclude: &str| {
            let mut t = TaskTopology::single();
            t.gpus = GpuRequest::PerNode(gpus);
            let mut s = AttemptSpec::new(
                AttemptId::new("c.s.0.a1").unwrap(),
                CommandSpec::new("true"),
            )
            .with_topology(t);
            s.scheduler.extra_directives = vec![format!("--exclude={exclude}")];
            s
        };
        validate(&spec(2, "h1"), &hosts).expect("fits on h2");
        let e = validate(&spec(4, "h1"), &hosts).unwrap_err();
        assert!(matches!(e, ExecutorError::Unsatisfiable { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains("h1 (4 GPUs, excluded by --exclude)") && m.contains("h2 (2 GPUs)"),
            "{m}"
        );
        let m = validate(&spec(1, "h[1-2]"), &hosts)
            .unwrap_err()
            .to_string();
        assert!(m.contains("h2 (2 GPUs, excluded by --exclude)"), "{m}");
    }
}

#[cfg(test)]
mod malformed_exit_tests {
    use super::remote::{ExitRecord, RemoteState};
    use super::*;

    /// The poll script run here on `<root>/a1` holding `files` (name, text): its answer.
    fn poll_here(root: &Path, files: &[(&str, &str)]) -> String {
        let d = root.join("a1");
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
        remote::poll_here(root, "a1")
    }

    /// Issue 27, bad input: a malformed pid file (`job`, `wrapper`) on a host is reported with
    /// its path and host and is not used; the attempt is judged by the rest of the evidence
    /// (its exit record, a live wrapper, a process running in its folder).
    #[test]
    fn a_malformed_pid_file_is_named_with_its_path_and_the_task_judged_by_the_rest() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // Nothing runs in the folder: lost, both records named.
        let out = poll_here(r, &[("job", "12x 5\n"), ("wrapper", "\u{1}garbage\n")]);
        assert_eq!(
            out, "M a1 job 12x 5?\nM a1 wrapper ?garbage?\nD a1",
            "{out}"
        );
        // A process of the attempt (its folder an argument, as the wrapper's and the job's)
        // still runs: running, whatever the records say.
        let d = r.join("a1");
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30; :", "ptron-wrap"])
            .arg(&d)
            .spawn()
            .unwrap();
        let out = poll_here(r, &[]);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            out, "M a1 job 12x 5?\nM a1 wrapper ?garbage?\nW a1",
            "{out}"
        );
        // A well-formed, live wrapper record decides alone.
        let pid = std::process::id();
        let ticks = crate::sys::process_start_ticks(pid).unwrap();
        let out = poll_here(r, &[("wrapper", &format!("{pid} {ticks}\n"))]);
        assert_eq!(out, "M a1 job 12x 5?\nW a1", "{out}");
        // The exit record is the evidence: the pid records are not even read.
        let out = poll_here(
            r,
            &[("exit", "status=exited\ncode=3\nstart_ms=5\nend_ms=9\n")],
        );
        assert_eq!(
            out, "E a1 status=exited code=3 start_ms=5 end_ms=9",
            "{out}"
        );

        // The status names each record with its path and host, then the verdict's reason.
        let id = AttemptId::new("a1").unwrap();
        let bad = remote::parse_bad_records("M a1 job 12x 5?\nM a1 wrapper ?garbage?\nD a1\n");
        let bad: Vec<(String, String)> = bad.into_iter().map(|(_, f, t)| (f, t)).collect();
        let st = with_bad_records(
            host_status(&id, &RemoteState::Dead, 0, 0, "h3", "/srv/pt"),
            &bad,
            "h3",
            "/srv/pt",
        );
        assert_eq!(st.state, JobState::Lost);
        assert_eq!(
            st.reason.as_deref(),
            Some(
                "malformed pid file /srv/pt/a1/job on h3: `12x 5?` (not used); malformed pid \
                 file /srv/pt/a1/wrapper on h3: `?garbage?` (not used); no process of the \
                 attempt runs there and no exit record; the wrapper ended without recording an \
                 exit (host rebooted?)"
            )
        );
        let c = crate::campaign::controller::classify::classify(
            &st,
            &crate::campaign::controller::classify::Evidence::default(),
        );
        assert!(
            c.detail.contains("malformed pid file /srv/pt/a1/job on h3"),
            "{c:?}"
        );
        let st = with_bad_records(
            host_status(&id, &RemoteState::Wrapping, 0, 0, "h3", ""),
            &bad[..1],
            "h3",
            "",
        );
        assert_eq!(st.state, JobState::Running);
        assert_eq!(
            st.reason.as_deref(),
            Some(
                "malformed pid file $HOME/.puzzletron/baremetal/a1/job on h3: `12x 5?` (not \
                 used); a process of the attempt still runs there"
            )
        );
    }

    /// Issue 27, bad input: a malformed exit file on a host is reported with its path and
    /// host; no exit code is made up (the attempt is judged by the rest of the evidence).
    #[test]
    fn a_malformed_exit_file_is_named_with_its_path() {
        let id = AttemptId::new("c.s.0.a1").unwrap();
        let rec = |code: Option<i32>, malformed: &[&str]| {
            RemoteState::Exited(ExitRecord {
                status: "exited".into(),
                code,
                malformed: malformed.iter().map(|m| m.to_string()).collect(),
                ..ExitRecord::default()
            })
        };
        let st = host_status(&id, &rec(None, &["code=12x"]), 0, 0, "node03", "/srv/pt");
        assert_eq!(st.state, JobState::Failed);
        assert_eq!(st.exit_code, None);
        assert_eq!(
            st.reason.as_deref(),
            Some(
                "malformed exit file /srv/pt/c.s.0.a1/exit on node03: `code=12x`; the exit code is unknown"
            )
        );
        let st = host_status(&id, &rec(None, &[]), 0, 0, "node03", "");
        assert!(
            st.reason.as_deref().is_some_and(|r| r.starts_with(
                "malformed exit file $HOME/.puzzletron/baremetal/c.s.0.a1/exit on node03: no `code=` entry"
            )),
            "{st:?}"
        );
        // A well-formed record is untouched.
        let st = host_status(&id, &rec(Some(3), &[]), 0, 0, "node03", "");
        assert_eq!((st.state, st.exit_code), (JobState::Failed, Some(3)));
        // The controller's verdict names it.
        let c = crate::campaign::controller::classify::classify(
            &host_status(&id, &rec(None, &["code=12x"]), 0, 0, "node03", "/srv/pt"),
            &crate::campaign::controller::classify::Evidence::default(),
        );
        assert!(
            c.detail.starts_with(
                "exit code unknown (malformed exit file /srv/pt/c.s.0.a1/exit on node03"
            ),
            "{c:?}"
        );
    }
}
