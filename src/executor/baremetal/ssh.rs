//! The system OpenSSH client: one `ssh -o BatchMode=yes` process per exchange, multiplexed
//! over one master connection per host (`ControlMaster=auto`, `ControlPath`, `ControlPersist`),
//! so an exchange after the first costs no new TCP connection or authentication.
//!
//! sshd's limits (issue 27, P06) are met, not fought: at most `channel_cap` exchanges run on a
//! host at once (lowered by one, down to 1, each time the master answers `Session open
//! refused`: the host's `MaxSessions` is lower than assumed), and an exchange that sshd refused
//! for its limits (a refused session, `Exceeded MaxStartups`, a reset before the banner) is
//! tried again after a jittered, doubling pause (100 ms to 800 ms) until the exchange's overall
//! deadline: nothing ran on the host, so another try is safe, and the refusal is never the
//! host's failure.
//!
//! A control socket left behind by a dead master (issue 27, P05) is checked with `ssh -O check`
//! (at most [`CHECK_TIMEOUT`]) before this process's first exchange with a host and after an
//! exchange that ran out of time: a refused or missing socket is removed (only ours, only a
//! socket) and the next exchange starts a new master; a check that gets no answer (a listener
//! that accepts and never speaks, where ssh itself would hang) keeps the socket and turns
//! multiplexing off for that host for [`MUX_RETRY`] ("multiplexing lost": exchanges are full
//! logins, counted), then checks again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;

use super::super::ExecutorError;

/// Longest `ssh -O check` of a control socket may take; longer is inconclusive.
pub(super) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long multiplexing stays off for a host whose control socket did not answer a check.
pub(super) const MUX_RETRY: Duration = Duration::from_secs(60);

/// What `ssh -O check` said of a control socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MasterCheck {
    /// A master answers.
    Alive,
    /// No socket, or a socket nobody listens on (removed when it was ours).
    Stale,
    /// No answer within [`CHECK_TIMEOUT`], or an answer that says neither.
    Inconclusive(String),
}

/// Why an exchange failed.
#[derive(Debug)]
#[non_exhaustive]
pub(super) enum SshFailure {
    /// The host could not be reached or the connection broke (ssh exit 255, a timeout): no
    /// answer; the remote command may or may not have run.
    Unreachable(String),
    /// The remote command ran and failed (its exit code and stderr).
    Remote { code: Option<i32>, stderr: String },
    /// `ssh` itself could not be started.
    Spawn(std::io::Error),
    /// ssh refused the host for a reason retrying cannot fix: `Permission denied
    /// (publickey)`. The text says what an operator must do.
    HostConfig(String),
    /// The host's key changed or is unknown (issue 27, P07): never accepted automatically;
    /// the host alone is at fault. The text quotes ssh and the operator's fix.
    HostKeyRefused(String),
}

/// What an ssh exit 255 means, from its stderr (issue 27, P07): a changed or unknown host key
/// is [`SshFailure::HostKeyRefused`], a refused public key [`SshFailure::HostConfig`]; anything else (connect timeout,
/// connection reset, `Exceeded MaxStartups`, kex failures) is [`SshFailure::Unreachable`],
/// transient. A task's own exit 255 never comes through here: task exit codes are read from
/// the remote exit file only.
pub(super) fn classify_255(host: &str, stderr: &str) -> SshFailure {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("remote host identification has changed")
        || lower.contains("host key verification failed")
    {
        // ssh names the known_hosts entry itself (`[address]:port` for an ssh_config alias
        // on another port, which `ssh-keygen -R alias` would not find): quote its command.
        let fix = stderr
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("ssh-keygen "))
            .map(str::to_string)
            .unwrap_or_else(|| {
                format!(
                    "ssh-keygen -R {host}; for an ssh_config alias, its HostName, as \
                     `[HostName]:Port` when the port is not 22"
                )
            });
        return SshFailure::HostKeyRefused(format!(
            "host key refused: the host key of {host} changed or is unknown (`{}`): it is never \
             accepted automatically; check the host, then update known_hosts ({fix})",
            first_line(stderr, "host key")
        ));
    }
    if lower.contains("permission denied (publickey") {
        return SshFailure::HostConfig(format!(
            "{host} refused our key (`{}`): configure the key or the user for this host",
            first_line(stderr, "permission denied")
        ));
    }
    SshFailure::Unreachable(if stderr.trim().is_empty() {
        "ssh ended with exit 255".to_string()
    } else {
        stderr.trim().to_string()
    })
}

/// Whether ssh's stderr says sshd refused the exchange for its limits before running anything
/// (issue 27, P06): a session the multiplexing master could not open (`MaxSessions`:
/// `Session open refused by peer`, `open failed: administratively prohibited`), or a
/// connection dropped before the banner (`MaxStartups`: `Exceeded MaxStartups`,
/// `kex_exchange_identification: ... Connection reset`/`closed`). Transient: tried again.
pub(super) fn is_sshd_limit(stderr: &str) -> bool {
    let l = stderr.to_ascii_lowercase();
    is_session_refused(&l)
        || l.contains("exceeded maxstartups")
        || l.contains("kex_exchange_identification:")
        || l.contains("ssh_exchange_identification:")
}

/// Whether (lower-cased) stderr says the master was refused a new session: the host's
/// `MaxSessions` is reached, so its channel cap is too high.
fn is_session_refused(lower: &str) -> bool {
    lower.contains("session open refused") || lower.contains("administratively prohibited")
}

/// The pause before try `tries + 1` after an sshd-limit refusal: 100 ms doubling to 800 ms,
/// each drawn in `[pause/2, pause]` so refused exchanges started together do not come back
/// together (`u` in `[0, 1)`).
pub(super) fn refusal_backoff(tries: u32, u: f64) -> Duration {
    let full = 100u64 << tries.min(3);
    let u = if u.is_finite() {
        u.clamp(0.0, 1.0)
    } else {
        0.0
    };
    Duration::from_millis(full / 2 + ((full / 2) as f64 * u) as u64)
}

/// A number in `[0, 1)` from the process's randomly seeded hasher (no random crate needed
/// for a jitter).
fn jitter_unit(salt: u64) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(salt);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// How many exchanges may run on one host at once, and how many do.
#[derive(Debug)]
struct Gate {
    state: Mutex<GateState>,
    free: tokio::sync::Notify,
}

#[derive(Debug)]
struct GateState {
    cap: u32,
    in_flight: u32,
}

/// A running exchange's place in its host's [`Gate`]; given back on drop.
struct Slot(Arc<Gate>);

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.0.free.notify_waiters();
    }
}

/// The first line of `text` containing `needle` (case-insensitive), else its first line.
fn first_line<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.to_ascii_lowercase().contains(needle))
        .or_else(|| text.lines().next())
        .unwrap_or("")
        .trim()
}

impl SshFailure {
    /// The same failure again (for each attempt of a launch exchange that failed as a whole;
    /// `std::io::Error` is not `Clone`, so a spawn error is rebuilt from its kind and text).
    pub(super) fn copy(&self) -> SshFailure {
        match self {
            SshFailure::Unreachable(m) => SshFailure::Unreachable(m.clone()),
            SshFailure::Remote { code, stderr } => SshFailure::Remote {
                code: *code,
                stderr: stderr.clone(),
            },
            SshFailure::Spawn(e) => SshFailure::Spawn(std::io::Error::new(e.kind(), e.to_string())),
            SshFailure::HostConfig(m) => SshFailure::HostConfig(m.clone()),
            SshFailure::HostKeyRefused(m) => SshFailure::HostKeyRefused(m.clone()),
        }
    }

    /// As an [`ExecutorError`] for `what` on `host`.
    pub(super) fn into_error(self, host: &str, what: &str) -> ExecutorError {
        match self {
            SshFailure::Unreachable(m) => ExecutorError::SchedulerUnavailable {
                command: format!("ssh {host} ({what})"),
                tries: 1,
                message: m,
            },
            SshFailure::Remote { code, stderr } => ExecutorError::CommandFailed {
                command: format!("ssh {host} ({what})"),
                exit_code: code,
                stderr,
            },
            SshFailure::Spawn(e) => ExecutorError::Spawn {
                program: "ssh".into(),
                source: e,
            },
            SshFailure::HostConfig(problem) => ExecutorError::HostPreflight {
                host: host.to_string(),
                problem,
            },
            SshFailure::HostKeyRefused(problem) => ExecutorError::HostKeyRefused {
                host: host.to_string(),
                problem,
            },
        }
    }
}

/// Runs remote command lines over SSH and counts the exchanges.
#[derive(Debug)]
#[non_exhaustive]
pub(super) struct Ssh {
    /// The OpenSSH client run (`ssh` from `PATH` by default).
    pub program: String,
    /// `-F` file, when given.
    pub config: Option<PathBuf>,
    /// Extra `-o` options (`Key=Value`).
    pub options: Vec<String>,
    /// Folder of the control sockets (short: a socket path must fit in 108 bytes).
    pub control_dir: PathBuf,
    /// How long an idle master connection stays.
    pub persist: Duration,
    /// Longest one exchange may take before it counts as unreachable, tries after sshd-limit
    /// refusals and the wait for a free channel included.
    pub timeout: Duration,
    /// Exchanges at once per host to start with (lowered per host by `Session open refused`).
    pub channel_cap: u32,
    exchanges: AtomicU64,
    refusals: AtomicU64,
    full_logins: AtomicU64,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
    /// Hosts whose socket was checked by this process (the check runs once, concurrent first
    /// exchanges wait for it).
    checked: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<()>>>>,
    /// Hosts with multiplexing off, until when.
    mux_lost: Mutex<HashMap<String, Instant>>,
}

impl Ssh {
    /// A client; creates `control_dir` (mode 0700).
    pub(super) fn new(
        program: String,
        config: Option<PathBuf>,
        options: Vec<String>,
        control_dir: PathBuf,
        persist: Duration,
        timeout: Duration,
        channel_cap: u32,
    ) -> Result<Self, ExecutorError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&control_dir)
            .map_err(|e| ExecutorError::io("creating the SSH control folder", &control_dir, e))?;
        Ok(Self {
            program,
            config,
            options,
            control_dir,
            persist,
            timeout,
            channel_cap: channel_cap.max(1),
            exchanges: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            full_logins: AtomicU64::new(0),
            gates: Mutex::new(HashMap::new()),
            checked: Mutex::new(HashMap::new()),
            mux_lost: Mutex::new(HashMap::new()),
        })
    }

    /// SSH exchanges (ssh processes) started so far.
    pub(super) fn exchanges(&self) -> u64 {
        self.exchanges.load(Ordering::Relaxed)
    }

    /// Exchanges sshd refused for its limits (each tried again) so far.
    pub(super) fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Exchanges run without multiplexing (full logins) because a host's control socket did
    /// not answer.
    pub(super) fn full_logins(&self) -> u64 {
        self.full_logins.load(Ordering::Relaxed)
    }

    /// Hosts whose multiplexing is off now ("multiplexing lost"), sorted.
    pub(super) fn multiplexing_lost(&self) -> Vec<String> {
        let now = Instant::now();
        let m = self.mux_lost.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<String> = m
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(h, _)| h.clone())
            .collect();
        v.sort();
        v
    }

    /// Whether exchanges with `host` use the master now; an expired "lost" state is dropped
    /// and the socket checked again.
    fn mux_on(&self, host: &str) -> bool {
        let mut m = self.mux_lost.lock().unwrap_or_else(|p| p.into_inner());
        match m.get(host) {
            Some(until) if *until > Instant::now() => false,
            Some(_) => {
                m.remove(host);
                drop(m);
                self.recheck(host);
                true
            }
            None => true,
        }
    }

    /// The next exchange with `host` checks its socket first.
    fn recheck(&self, host: &str) {
        let mut c = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        c.remove(host);
    }

    /// The control socket of `host` (`ssh -G` expands `%C` as ssh itself does).
    async fn socket_of(&self, host: &str) -> Option<PathBuf> {
        let mut a = self.config_args();
        a.extend(["-o".into(), self.control_path_option(), "-G".into()]);
        a.extend(
            self.options
                .iter()
                .flat_map(|o| ["-o".to_string(), o.clone()]),
        );
        a.extend(["--".into(), host.to_string()]);
        let out = tokio::time::timeout(
            CHECK_TIMEOUT,
            tokio::process::Command::new(&self.program)
                .args(&a)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .ok()?
        .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("controlpath "))
            .map(|p| PathBuf::from(p.trim()))
    }

    /// Checks the control socket of `host` with `ssh -O check` (at most [`CHECK_TIMEOUT`]);
    /// removes it when stale and ours (in `control_dir`, a socket).
    pub(super) async fn check_master(&self, host: &str) -> MasterCheck {
        let mut a = self.config_args();
        a.extend(["-o".into(), self.control_path_option()]);
        a.extend(
            self.options
                .iter()
                .flat_map(|o| ["-o".to_string(), o.clone()]),
        );
        a.extend(["-O".into(), "check".into(), "--".into(), host.to_string()]);
        let run = tokio::process::Command::new(&self.program)
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output();
        // Only a refused socket is on disk to remove (a missing one is not).
        let mut refused = false;
        let verdict = match tokio::time::timeout(CHECK_TIMEOUT, run).await {
            Err(_) => MasterCheck::Inconclusive(format!(
                "`ssh -O check` got no answer within {CHECK_TIMEOUT:?}"
            )),
            Ok(Err(e)) => MasterCheck::Inconclusive(format!("cannot run ssh -O check: {e}")),
            Ok(Ok(out)) if out.status.success() => MasterCheck::Alive,
            Ok(Ok(out)) => {
                let err = String::from_utf8_lossy(&out.stderr).to_ascii_lowercase();
                refused = err.contains("connection refused");
                if refused || err.contains("no such file") {
                    MasterCheck::Stale
                } else {
                    MasterCheck::Inconclusive(err.trim().to_string())
                }
            }
        };
        if refused
            && let Some(sock) = self.socket_of(host).await
            && sock.parent() == Some(self.control_dir.as_path())
        {
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(&sock).is_ok_and(|m| m.file_type().is_socket()) {
                // A new master cannot bind over it; ssh removes a refused one itself, but not
                // every version does.
                let _ = std::fs::remove_file(&sock);
                tracing::info!(host, socket = %sock.display(), "ssh: stale control socket removed");
            }
        }
        verdict
    }

    /// Checks `host`'s socket once per process (and again after [`recheck`](Self::recheck));
    /// no answer turns multiplexing off for the host for [`MUX_RETRY`].
    async fn check_once(&self, host: &str) {
        let cell = {
            let mut c = self.checked.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(c.entry(host.to_string()).or_default())
        };
        cell.get_or_init(|| async {
            if let MasterCheck::Inconclusive(why) = self.check_master(host).await {
                tracing::warn!(
                    host,
                    "ssh: multiplexing lost for {MUX_RETRY:?} (the control socket does not \
                     answer: {why}); exchanges log in afresh"
                );
                let mut m = self.mux_lost.lock().unwrap_or_else(|p| p.into_inner());
                m.insert(host.to_string(), Instant::now() + MUX_RETRY);
            }
        })
        .await;
    }

    fn config_args(&self) -> Vec<String> {
        match &self.config {
            Some(c) => vec!["-F".into(), c.display().to_string()],
            None => Vec::new(),
        }
    }

    fn control_path_option(&self) -> String {
        format!("ControlPath={}/%C", self.control_dir.display())
    }

    /// The channel cap of `host` now.
    pub(super) fn channel_cap_of(&self, host: &str) -> u32 {
        let g = self.gate(host);
        let s = g.state.lock().unwrap_or_else(|p| p.into_inner());
        s.cap
    }

    fn gate(&self, host: &str) -> Arc<Gate> {
        let mut m = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(m.entry(host.to_string()).or_insert_with(|| {
            Arc::new(Gate {
                state: Mutex::new(GateState {
                    cap: self.channel_cap,
                    in_flight: 0,
                }),
                free: tokio::sync::Notify::new(),
            })
        }))
    }

    /// Waits for a free channel on `host`.
    async fn enter(&self, host: &str) -> Slot {
        let gate = self.gate(host);
        loop {
            // Registered before the check: a slot given back in between still wakes us.
            let notified = gate.free.notified();
            {
                let mut s = gate.state.lock().unwrap_or_else(|p| p.into_inner());
                if s.in_flight < s.cap {
                    s.in_flight += 1;
                    return Slot(Arc::clone(&gate));
                }
            }
            notified.await;
        }
    }

    /// The master was refused a session: one channel fewer for `host` from now on.
    fn lower_cap(&self, host: &str) {
        let g = self.gate(host);
        let mut s = g.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.cap > 1 {
            s.cap -= 1;
            tracing::debug!(
                host,
                cap = s.cap,
                "ssh: session refused, channel cap lowered"
            );
        }
    }

    /// The argv of one exchange: `ssh [-F cfg] -o BatchMode=yes -o ControlMaster=auto ... --
    /// <host> <line>`. `line` is parsed by the remote login shell: callers build it from
    /// quoted words only.
    pub(super) fn argv(&self, host: &str, line: &str) -> Vec<String> {
        self.argv_mux(host, line, true)
    }

    /// [`argv`](Self::argv), or without multiplexing (`ControlMaster=no`, `ControlPath=none`:
    /// a full login) when `mux` is false.
    fn argv_mux(&self, host: &str, line: &str, mux: bool) -> Vec<String> {
        let mut a: Vec<String> = Vec::with_capacity(24);
        a.extend(self.config_args());
        let control = if mux {
            vec![
                "ControlMaster=auto".to_string(),
                self.control_path_option(),
                format!("ControlPersist={}", self.persist.as_secs().max(1)),
            ]
        } else {
            vec![
                "ControlMaster=no".to_string(),
                "ControlPath=none".to_string(),
            ]
        };
        for o in std::iter::once("BatchMode=yes".to_string())
            .chain(control)
            .chain([
                "ConnectTimeout=10".to_string(),
                "LogLevel=ERROR".to_string(),
            ])
            .chain(self.options.iter().cloned())
        {
            a.push("-o".into());
            a.push(o);
        }
        a.push("--".into());
        a.push(host.to_string());
        a.push(line.to_string());
        a
    }

    /// Runs `line` on `host`; stdout on success. Exchanges refused by sshd's limits are tried
    /// again (see the module docs); all tries together end by [`timeout`](Self::timeout).
    pub(super) async fn run(&self, host: &str, line: &str) -> Result<String, SshFailure> {
        let deadline = Instant::now() + self.timeout;
        let work = async {
            let mut tries: u32 = 0;
            loop {
                if self.mux_on(host) {
                    self.check_once(host).await;
                }
                let mux = self.mux_on(host);
                if !mux {
                    self.full_logins.fetch_add(1, Ordering::Relaxed);
                }
                let slot = self.enter(host).await;
                let r = self.run_once(host, line, mux).await;
                drop(slot);
                let stderr = match &r {
                    Ok((_, e)) | Err(SshFailure::Remote { stderr: e, .. }) => e.as_str(),
                    Err(SshFailure::Unreachable(e)) => e.as_str(),
                    Err(_) => "",
                };
                // The exchange may have gone over a full login after the refusal (ssh falls
                // back and succeeds): the cap is too high all the same.
                if is_session_refused(&stderr.to_ascii_lowercase()) {
                    self.lower_cap(host);
                }
                match r {
                    Ok((out, _)) => return Ok(out),
                    Err(SshFailure::Unreachable(e)) if is_sshd_limit(&e) => {
                        self.refusals.fetch_add(1, Ordering::Relaxed);
                        let pause = refusal_backoff(
                            tries,
                            jitter_unit(self.exchanges() ^ u64::from(tries)),
                        );
                        if Instant::now() + pause >= deadline {
                            return Err(SshFailure::Unreachable(format!(
                                "sshd refused {} tries for its limits (MaxSessions/MaxStartups) \
                                 within {:?}; last: {e}",
                                tries + 1,
                                self.timeout
                            )));
                        }
                        tracing::debug!(host, tries, ?pause, "ssh: refused by sshd limits: {e}");
                        tokio::time::sleep(pause).await;
                        tries += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        match tokio::time::timeout_at(deadline.into(), work).await {
            Ok(r) => r,
            Err(_) => {
                // A slow remote command, a silent network, or a master that hangs: the next
                // exchange checks the socket first.
                self.recheck(host);
                Err(SshFailure::Unreachable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            }
        }
    }

    /// One ssh process: stdout and stderr on success (a dropped future kills it).
    async fn run_once(
        &self,
        host: &str,
        line: &str,
        mux: bool,
    ) -> Result<(String, String), SshFailure> {
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(self.argv_mux(host, line, mux))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(SshFailure::Spawn)?;
        let (Some(mut out), Some(mut err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(SshFailure::Unreachable(
                "ssh's pipes were not set up".into(),
            ));
        };
        // The master connection (forked by the first exchange) keeps no copy of our pipes once
        // it is in the background, so reading to EOF ends with the exchange.
        let mut o = Vec::new();
        let mut e = Vec::new();
        let (r1, r2) = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
        let status = r1
            .and(r2)
            .and(child.wait().await)
            .map_err(|e| SshFailure::Unreachable(format!("reading ssh output: {e}")))?;
        let stderr = String::from_utf8_lossy(&e).trim().to_string();
        match status.code() {
            Some(0) => Ok((String::from_utf8_lossy(&o).into_owned(), stderr)),
            Some(255) => Err(classify_255(host, &stderr)),
            None => Err(SshFailure::Unreachable(if stderr.is_empty() {
                format!("ssh ended with {status}")
            } else {
                stderr
            })),
            Some(c) => Err(SshFailure::Remote {
                code: Some(c),
                stderr,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 27 (P07): ssh's exit 255 is classified from its stderr.
    #[test]
    fn exit_255_is_classified_from_stderr() {
        let changed = "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\nHost key verification failed.\n";
        let table: &[(&str, bool, &str)] = &[
            (
                changed,
                true,
                "the host key of node07 changed or is unknown (`Host key verification failed.`): it is never accepted automatically",
            ),
            (
                "Host key verification failed.\n",
                true,
                "ssh-keygen -R node07; for an ssh_config alias, its HostName",
            ),
            (
                "Offending ED25519 key in /k/known_hosts:1\n  remove with:\n  ssh-keygen -f \"/k/known_hosts\" -R \"[127.0.10.2]:2222\"\nHost key verification failed.\n",
                true,
                "update known_hosts (ssh-keygen -f \"/k/known_hosts\" -R \"[127.0.10.2]:2222\")",
            ),
            (
                "user@node07: Permission denied (publickey).\n",
                true,
                "node07 refused our key (`user@node07: Permission denied (publickey).`)",
            ),
            (
                "ssh: connect to host node07 port 22: Connection timed out\n",
                false,
                "Connection timed out",
            ),
            (
                "kex_exchange_identification: banner line 0: Exceeded MaxStartups\n",
                false,
                "Exceeded MaxStartups",
            ),
            (
                "kex_exchange_identification: read: Connection reset by peer\n",
                false,
                "Connection reset by peer",
            ),
            ("", false, "ssh ended with exit 255"),
        ];
        for (stderr, config, part) in table {
            match classify_255("node07", stderr) {
                f @ (SshFailure::HostConfig(_) | SshFailure::HostKeyRefused(_)) => {
                    let key = matches!(f, SshFailure::HostKeyRefused(_));
                    let e = f.into_error("node07", "poll");
                    let m = e.to_string();
                    assert!(*config, "{stderr}: {m}");
                    assert!(m.contains(part), "{m}");
                    // Only a host key makes the host (not the campaign) at fault (P07 c), and
                    // every stderr naming the host key is classified so.
                    assert_eq!(key, stderr.contains("Host key verification failed"), "{m}");
                    assert_eq!(
                        matches!(e, ExecutorError::HostKeyRefused { .. }),
                        key,
                        "{m}"
                    );
                    assert_eq!(e.refused_host_key(), key.then_some("node07"), "{e}");
                }
                SshFailure::Unreachable(m) => {
                    assert!(!*config, "{stderr}: {m}");
                    assert!(m.contains(part), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// Issue 27 (P06): which stderr is sshd refusing for its limits (tried again), and the
    /// backoff's bounds.
    #[test]
    fn sshd_limit_refusals_are_recognised_and_backed_off_with_jitter() {
        for refused in [
            "mux_client_request_session: session request failed: Session open refused by peer",
            "channel 0: open failed: administratively prohibited: open failed",
            "kex_exchange_identification: banner line 0: Exceeded MaxStartups",
            "kex_exchange_identification: read: Connection reset by peer\r\nConnection reset by 127.0.10.7 port 2222",
            "kex_exchange_identification: Connection closed by remote host",
        ] {
            assert!(is_sshd_limit(refused), "{refused}");
        }
        for other in [
            "ssh: connect to host node03 port 22: Connection timed out",
            "ssh: connect to host 127.0.10.6 port 2222: Connection refused",
            "Host key verification failed.",
            "user@node07: Permission denied (publickey).",
            "",
        ] {
            assert!(!is_sshd_limit(other), "{other}");
        }
        // 100 ms doubling to 800 ms, each pause in [half, full].
        let lo: Vec<u128> = (0..6)
            .map(|t| refusal_backoff(t, 0.0).as_millis())
            .collect();
        let hi: Vec<u128> = (0..6)
            .map(|t| refusal_backoff(t, 0.999_999).as_millis())
            .collect();
        assert_eq!(lo, [50, 100, 200, 400, 400, 400]);
        assert_eq!(hi, [99, 199, 399, 799, 799, 799]);
        assert_eq!(refusal_backoff(0, f64::NAN), Duration::from_millis(50));
        let u: Vec<f64> = (0..64).map(jitter_unit).collect();
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)), "{u:?}");
        let distinct: std::collections::BTreeSet<u64> = u.iter().map(|x| x.to_bits()).collect();
        assert!(distinct.len() > 32, "jitter must vary: {u:?}");
    }

    /// A stand-in `ssh` (a script; the executor takes any program) that answers from a file
    /// of canned failures, one per call, then succeeds: `fail` lines are `<exit> <stderr>`.
    fn fake_ssh(dir: &std::path::Path, fails: &[(i32, &str)]) -> Ssh {
        use std::os::unix::fs::PermissionsExt;
        let plan = dir.join("plan");
        let text: String = fails.iter().map(|(c, e)| format!("{c} {e}\n")).collect();
        std::fs::write(&plan, text).unwrap();
        let prog = dir.join("ssh");
        std::fs::write(
            &prog,
            format!(
                "#!/bin/sh\n\
                 case \" $* \" in *\" -O \"*|*\" -G \"*) echo 'Control socket connect(x): No such file or directory' >&2; exit 255;; esac\n\
                 # Serialised by mkdir: concurrent calls take distinct lines.\n\
                 while ! mkdir {d}/lock 2>/dev/null; do sleep 0.01; done\n\
                 n=$(cat {d}/n 2>/dev/null || echo 0); echo $((n+1)) > {d}/n\n\
                 line=$(sed -n \"$((n+1))p\" {p}); rmdir {d}/lock\n\
                 if [ -n \"$line\" ]; then echo \"${{line#* }}\" >&2; exit \"${{line%% *}}\"; fi\n\
                 echo ran\n",
                d = dir.display(),
                p = plan.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        Ssh::new(
            prog.display().to_string(),
            None,
            Vec::new(),
            dir.join("cm"),
            Duration::from_secs(1),
            Duration::from_secs(5),
            4,
        )
        .unwrap()
    }

    /// Issue 27 (P06): MaxStartups drops and kex resets are tried again with backoff and the
    /// exchange succeeds; a refused session lowers the host's channel cap, also when ssh fell
    /// back to a full login and succeeded; other failures are not retried.
    #[tokio::test]
    async fn sshd_limit_refusals_are_retried_within_the_deadline() {
        let d = tempfile::tempdir().unwrap();
        let ssh = fake_ssh(
            d.path(),
            &[
                (
                    255,
                    "kex_exchange_identification: banner line 0: Exceeded MaxStartups",
                ),
                (
                    255,
                    "kex_exchange_identification: read: Connection reset by peer",
                ),
                (
                    255,
                    "mux_client_request_session: session request failed: Session open refused by peer",
                ),
                (
                    0,
                    "mux_client_request_session: session request failed: Session open refused by peer",
                ),
            ],
        );
        let t0 = Instant::now();
        assert_eq!(ssh.run("node01", "true").await.unwrap(), "");
        // Three refusals, then the fourth try got through (exit 0 over a full login, whose
        // stderr still says the session was refused).
        assert_eq!((ssh.refusals(), ssh.exchanges()), (3, 4));
        assert!(
            t0.elapsed() >= Duration::from_millis(50 + 100 + 200),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(ssh.channel_cap_of("node01"), 2, "lowered twice from 4");
        assert_eq!(ssh.channel_cap_of("node02"), 4, "per host");
        assert_eq!(ssh.run("node01", "true").await.unwrap(), "ran\n");

        // A connect timeout is not an sshd limit: one try, Unreachable.
        let d = tempfile::tempdir().unwrap();
        let ssh = fake_ssh(
            d.path(),
            &[(
                255,
                "ssh: connect to host node03 port 22: Connection timed out",
            )],
        );
        match ssh.run("node03", "true").await {
            Err(SshFailure::Unreachable(m)) => assert!(m.contains("timed out"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!((ssh.refusals(), ssh.exchanges()), (0, 1));

        // Refused past the deadline: Unreachable, saying so.
        let d = tempfile::tempdir().unwrap();
        let many: Vec<(i32, &str)> = vec![
            (
                255,
                "kex_exchange_identification: Connection closed by remote host"
            );
            200
        ];
        let mut ssh = fake_ssh(d.path(), &many);
        ssh.timeout = Duration::from_secs(2);
        let t0 = Instant::now();
        match ssh.run("node04", "true").await {
            Err(SshFailure::Unreachable(m)) => {
                assert!(
                    m.contains("sshd refused") && m.contains("MaxStartups"),
                    "{m}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert!(ssh.refusals() >= 3, "{}", ssh.refusals());
    }

    /// The channel cap holds: with cap 2, no more than 2 exchanges of one host run at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_channel_cap_bounds_exchanges_per_host() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let prog = d.path().join("ssh");
        // Records the exchanges running at once (a file per running call).
        std::fs::write(
            &prog,
            format!(
                "#!/bin/sh\ncase \" $* \" in *\" -O \"*|*\" -G \"*) exit 255;; esac\nf={d}/run.$$; : > $f; ls {d} | grep -c '^run\\.' >> {d}/seen; sleep 0.2; rm -f $f\n",
                d = d.path().display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ssh = Arc::new(
            Ssh::new(
                prog.display().to_string(),
                None,
                Vec::new(),
                d.path().join("cm"),
                Duration::from_secs(1),
                Duration::from_secs(20),
                2,
            )
            .unwrap(),
        );
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..8 {
            let s = Arc::clone(&ssh);
            set.spawn(async move { s.run("node01", "true").await.map(|_| ()) });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().unwrap();
        }
        let seen = std::fs::read_to_string(d.path().join("seen")).unwrap();
        let most = seen
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .max();
        assert_eq!(seen.lines().count(), 8, "{seen}");
        assert_eq!(most, Some(2), "{seen}");
    }

    /// Issue 27 (P05), with the real OpenSSH client and no server: a control socket whose
    /// listener accepts and never answers (where ssh itself hangs) costs one bounded check,
    /// then multiplexing is off for the host ("lost", counted) and the exchange goes straight
    /// to the host; a socket nobody listens on is removed (ours, a socket).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_control_socket_that_never_answers_is_not_a_hang() {
        let d = tempfile::tempdir().unwrap();
        // No site or user config: port 1 on loopback refuses at once.
        let cfg = d.path().join("config");
        std::fs::write(&cfg, "").unwrap();
        let client = |dir: &str| {
            Ssh::new(
                "ssh".into(),
                Some(cfg.clone()),
                vec!["Port=1".into()],
                d.path().join(dir),
                Duration::from_secs(1),
                Duration::from_secs(8),
                4,
            )
            .expect("ssh client (openssh-client)")
        };
        let ssh = client("hang");
        let sock = ssh
            .socket_of("127.0.0.1")
            .await
            .expect("ssh -G names the socket");
        assert_eq!(sock.parent(), Some(d.path().join("hang").as_path()));
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in listener.incoming() {
                held.push(c);
            }
        });
        let t0 = Instant::now();
        match ssh.run("127.0.0.1", "true").await {
            Err(SshFailure::Unreachable(m)) => assert!(m.contains("Connection refused"), "{m}"),
            other => panic!("{other:?}"),
        }
        let took = t0.elapsed();
        assert!(
            took >= CHECK_TIMEOUT && took < Duration::from_secs(6),
            "{took:?}"
        );
        assert_eq!(ssh.multiplexing_lost(), ["127.0.0.1"]);
        assert_eq!(ssh.full_logins(), 1);
        assert!(sock.exists(), "an inconclusive check keeps the socket");
        // While lost, no further check: the next exchange is quick.
        let t0 = Instant::now();
        assert!(ssh.run("127.0.0.1", "true").await.is_err());
        assert!(t0.elapsed() < CHECK_TIMEOUT, "{:?}", t0.elapsed());
        assert_eq!(ssh.full_logins(), 2);

        // A dead master's socket: removed, multiplexing stays on.
        let ssh = client("stale");
        let sock = ssh.socket_of("127.0.0.1").await.unwrap();
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(sock.exists());
        assert_eq!(ssh.check_master("127.0.0.1").await, MasterCheck::Stale);
        assert!(!sock.exists(), "stale socket removed");
        // No socket at all is stale too (nothing to remove).
        assert_eq!(ssh.check_master("127.0.0.1").await, MasterCheck::Stale);
        assert!(ssh.multiplexing_lost().is_empty());
    }
}
