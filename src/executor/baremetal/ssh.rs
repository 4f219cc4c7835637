//! The system OpenSSH client: one `ssh -o BatchMode=yes` process per exchange, multiplexed
//! over one master connection per host (`ControlMaster=auto`, `ControlPath`, `ControlPersist`),
//! so an exchange after the first costs no new TCP connection or authentication.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::super::ExecutorError;

/// Why an exchange failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum SshFailure {
    /// The host could not be reached or the connection broke (ssh exit 255, a timeout): no
    /// answer; the remote command may or may not have run.
    Unreachable(String),
    /// The remote command ran and failed (its exit code and stderr).
    Remote { code: Option<i32>, stderr: String },
    /// `ssh` itself could not be started.
    Spawn(std::io::Error),
    /// ssh refused the host for a reason retrying cannot fix (issue 27, P07): a changed or
    /// unknown host key (never accepted automatically) or `Permission denied (publickey)`.
    /// The text says what an operator must do.
    HostConfig(String),
}

/// What an ssh exit 255 means, from its stderr (issue 27, P07): a changed or unknown host key
/// and a refused public key are [`SshFailure::HostConfig`]; anything else (connect timeout,
/// connection reset, `Exceeded MaxStartups`, kex failures) is [`SshFailure::Unreachable`],
/// transient. A task's own exit 255 never comes through here: task exit codes are read from
/// the remote exit file only.
pub fn classify_255(host: &str, stderr: &str) -> SshFailure {
    let lower = stderr.to_ascii_lowercase();
    if lower.contains("remote host identification has changed")
        || lower.contains("host key verification failed")
    {
        return SshFailure::HostConfig(format!(
            "the host key of {host} changed or is unknown (`{}`): it is never accepted \
             automatically; check the host, then update known_hosts (ssh-keygen -R {host})",
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

/// The first line of `text` containing `needle` (case-insensitive), else its first line.
fn first_line<'a>(text: &'a str, needle: &str) -> &'a str {
    text.lines()
        .find(|l| l.to_ascii_lowercase().contains(needle))
        .or_else(|| text.lines().next())
        .unwrap_or("")
        .trim()
}

impl SshFailure {
    /// As an [`ExecutorError`] for `what` on `host`.
    pub fn into_error(self, host: &str, what: &str) -> ExecutorError {
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
        }
    }
}

/// Runs remote command lines over SSH and counts the exchanges.
#[derive(Debug)]
#[non_exhaustive]
pub struct Ssh {
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
    /// Longest one exchange may take before it counts as unreachable.
    pub timeout: Duration,
    exchanges: AtomicU64,
}

impl Ssh {
    /// A client; creates `control_dir` (mode 0700).
    pub fn new(
        program: String,
        config: Option<PathBuf>,
        options: Vec<String>,
        control_dir: PathBuf,
        persist: Duration,
        timeout: Duration,
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
            exchanges: AtomicU64::new(0),
        })
    }

    /// SSH exchanges (ssh processes) started so far.
    pub fn exchanges(&self) -> u64 {
        self.exchanges.load(Ordering::Relaxed)
    }

    /// The argv of one exchange: `ssh [-F cfg] -o BatchMode=yes -o ControlMaster=auto ... --
    /// <host> <line>`. `line` is parsed by the remote login shell: callers build it from
    /// quoted words only.
    pub fn argv(&self, host: &str, line: &str) -> Vec<String> {
        let mut a: Vec<String> = Vec::with_capacity(24);
        if let Some(c) = &self.config {
            a.push("-F".into());
            a.push(c.display().to_string());
        }
        for o in [
            "BatchMode=yes".to_string(),
            "ControlMaster=auto".to_string(),
            format!("ControlPath={}/%C", self.control_dir.display()),
            format!("ControlPersist={}", self.persist.as_secs().max(1)),
            "ConnectTimeout=10".to_string(),
            "LogLevel=ERROR".to_string(),
        ]
        .into_iter()
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

    /// Runs `line` on `host`; stdout on success.
    pub async fn run(&self, host: &str, line: &str) -> Result<String, SshFailure> {
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(self.argv(host, line))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(SshFailure::Spawn)?;
        let mut out = child.stdout.take().expect("piped");
        let mut err = child.stderr.take().expect("piped");
        let work = async {
            // The master connection (forked by the first exchange) keeps no copy of our pipes
            // once it is in the background, so reading to EOF ends with the exchange.
            let mut o = Vec::new();
            let mut e = Vec::new();
            let (r1, r2) = tokio::join!(out.read_to_end(&mut o), err.read_to_end(&mut e));
            r1.and(r2)?;
            let status = child.wait().await?;
            Ok::<_, std::io::Error>((status, o, e))
        };
        match tokio::time::timeout(self.timeout, work).await {
            Err(_) => Err(SshFailure::Unreachable(format!(
                "no answer within {:?}",
                self.timeout
            ))),
            Ok(Err(e)) => Err(SshFailure::Unreachable(format!("reading ssh output: {e}"))),
            Ok(Ok((status, o, e))) => {
                let stderr = String::from_utf8_lossy(&e).trim().to_string();
                match status.code() {
                    Some(0) => Ok(String::from_utf8_lossy(&o).into_owned()),
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
                "ssh-keygen -R node07",
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
                SshFailure::HostConfig(m) => {
                    assert!(*config, "{stderr}: {m}");
                    assert!(m.contains(part), "{m}");
                    assert!(matches!(
                        SshFailure::HostConfig(m).into_error("node07", "poll"),
                        ExecutorError::HostPreflight { .. }
                    ));
                }
                SshFailure::Unreachable(m) => {
                    assert!(!*config, "{stderr}: {m}");
                    assert!(m.contains(part), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
