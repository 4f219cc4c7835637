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
pub enum SshFailure {
    /// The host could not be reached or the connection broke (ssh exit 255, a timeout): no
    /// answer; the remote command may or may not have run.
    Unreachable(String),
    /// The remote command ran and failed (its exit code and stderr).
    Remote { code: Option<i32>, stderr: String },
    /// `ssh` itself could not be started.
    Spawn(std::io::Error),
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
        }
    }
}

/// Runs remote command lines over SSH and counts the exchanges.
#[derive(Debug)]
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
                    Some(255) | None => Err(SshFailure::Unreachable(if stderr.is_empty() {
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
