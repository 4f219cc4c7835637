//! [`Rendering`]: exactly what an executor submits for one [`AttemptSpec`](super::AttemptSpec),
//! as [`Executor::render`](super::Executor::render) returns it and as `submit` sends it.
//!
//! One shape for every executor: the files it writes or sends (Slurm: the batch script; a Ray
//! executor: the JSON body of its job request) and the commands it runs (Slurm: `sbatch`;
//! bare metal: one `ssh` per host, the remote command as its last argument; local: the job's
//! own argv, environment and working directory). A dry run prints it; tests compare it byte
//! for byte with what the executor actually ran.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::AttemptId;
use super::shell::{self, REDACTED};

/// One command the executor runs for an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RenderedCommand {
    /// The host it runs on: `None` for this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Program and arguments, as executed (no shell parses them here).
    pub argv: Vec<String>,
    /// Variables the executor sets on top of the environment it inherits.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory; `None` = the executor's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
}

/// One file the executor writes (or sends) for an attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RenderedFile {
    /// Where it is written (or, for a request body, the endpoint it is sent to).
    pub path: PathBuf,
    /// Its exact content.
    pub content: String,
}

/// Exactly what an executor submits for one attempt, as
/// [`Executor::render`](super::Executor::render) returns it and `submit` sends it: the files it
/// writes or sends (Slurm: the batch script; a Ray executor: its job request body) and the
/// commands it runs (Slurm: `sbatch`; bare metal: one `ssh` per host, the remote command last;
/// local: the job's own argv, environment and working directory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rendering {
    /// The attempt.
    pub attempt_id: AttemptId,
    /// The executor kind (`slurm`, `local`, `baremetal`, ...).
    pub executor: String,
    /// Files written or sent before the commands run, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<RenderedFile>,
    /// Commands run, in order.
    pub commands: Vec<RenderedCommand>,
    /// What the executor decides only when the job starts, in words (e.g. which of its GPUs a
    /// local job gets), so a reader knows what the rendering leaves open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Values of secret variables (see `shell::is_secret_name`) of the spec, replaced by
    /// [`Rendering::redacted`]. Never serialized.
    #[serde(skip)]
    pub secrets: Vec<String>,
}

impl RenderedCommand {
    /// `argv` run on this machine, in the executor's own working directory, with no variable
    /// set on top of the inherited environment (add them with the `with_*` methods).
    ///
    /// ```
    /// use puzzletron::executor::RenderedCommand;
    /// let c = RenderedCommand::new(["sbatch", "--parsable", "job.sh"])
    ///     .with_env("SLURM_EXPORT_ENV", "ALL")
    ///     .with_cwd("/scratch/c");
    /// assert_eq!(c.argv, ["sbatch", "--parsable", "job.sh"]);
    /// assert_eq!(c.env["SLURM_EXPORT_ENV"], "ALL");
    /// assert_eq!(c.host, None);
    /// ```
    pub fn new(argv: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            host: None,
            argv: argv.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
        }
    }

    /// Runs on `host` (as a remote executor's commands do).
    pub fn with_host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// Sets the variable `name` to `value` on top of the inherited environment.
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Runs in `cwd` instead of the executor's own working directory.
    pub fn with_cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
}

impl RenderedFile {
    /// The file written at `path` (or the request body sent to that endpoint) with exactly
    /// `content`.
    pub fn new(path: impl Into<PathBuf>, content: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            content: content.into(),
        }
    }
}

impl Rendering {
    /// A rendering with no file, command or note.
    pub fn new(attempt_id: AttemptId, executor: impl Into<String>) -> Self {
        Self {
            attempt_id,
            executor: executor.into(),
            files: Vec::new(),
            commands: Vec::new(),
            notes: Vec::new(),
            secrets: Vec::new(),
        }
    }

    /// Notes the secret values among `env` (by `shell::is_secret_name`) for
    /// [`Rendering::redacted`].
    pub fn with_secrets_of<'a>(
        mut self,
        env: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        for (k, v) in env {
            if shell::is_secret_name(k) && !v.is_empty() && !self.secrets.contains(v) {
                self.secrets.push(v.clone());
            }
        }
        self
    }

    /// A copy to show people: every secret value of the spec's environment replaced by
    /// `<redacted>` wherever it appears, every secret assignment in a file line or argument
    /// (`export HF_TOKEN=...`) redacted, and the values of secret variables in `env`. What is
    /// submitted is never redacted.
    pub fn redacted(&self) -> Rendering {
        let scrub = |s: &str| {
            let mut t = s.to_string();
            for secret in &self.secrets {
                t = t.replace(secret.as_str(), REDACTED);
            }
            t.lines()
                .map(shell::redact_line)
                .collect::<Vec<_>>()
                .join("\n")
                + if t.ends_with('\n') { "\n" } else { "" }
        };
        Rendering {
            attempt_id: self.attempt_id.clone(),
            executor: self.executor.clone(),
            files: self
                .files
                .iter()
                .map(|f| RenderedFile {
                    path: f.path.clone(),
                    content: scrub(&f.content),
                })
                .collect(),
            commands: self
                .commands
                .iter()
                .map(|c| RenderedCommand {
                    host: c.host.clone(),
                    argv: c.argv.iter().map(|a| scrub(a)).collect(),
                    env: c
                        .env
                        .iter()
                        .map(|(k, v)| (k.clone(), shell::redact_value(k, &scrub(v)).into_owned()))
                        .collect(),
                    cwd: c.cwd.clone(),
                })
                .collect(),
            notes: self.notes.clone(),
            secrets: Vec::new(),
        }
    }

    /// The rendering as text: each file (`file PATH:` and its content), then each command as
    /// one shell line (`[host] (cd DIR) NAME=value ... argv`, every word quoted), then the
    /// notes. Call it on [`Rendering::redacted`] for anything shown or logged.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for f in &self.files {
            let _ = writeln!(s, "file {}:", f.path.display());
            s.push_str(&f.content);
            if !f.content.ends_with('\n') {
                s.push('\n');
            }
        }
        for c in &self.commands {
            if let Some(h) = &c.host {
                let _ = write!(s, "[{h}] ");
            }
            if let Some(d) = &c.cwd {
                let _ = write!(s, "(cd {}) ", shell::quote(&d.to_string_lossy()));
            }
            for (k, v) in &c.env {
                let _ = write!(s, "{k}={} ", shell::quote(v));
            }
            let _ = writeln!(s, "{}", shell::join(&c.argv));
        }
        for n in &self.notes {
            let _ = writeln!(s, "# {n}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_covers_files_arguments_and_environment() {
        let mut env = BTreeMap::new();
        env.insert("HF_TOKEN".to_string(), "s3cr3t-value".to_string());
        env.insert("HOME".to_string(), "/h".to_string());
        let mut r = Rendering::new(AttemptId::new("a.a1").unwrap(), "x").with_secrets_of(&env);
        r.files.push(RenderedFile {
            path: "/x.sh".into(),
            content: "export WANDB_API_KEY=k1\necho s3cr3t-value\n".into(),
        });
        r.commands.push(RenderedCommand {
            host: Some("h1".into()),
            argv: vec![
                "ssh".into(),
                "h1".into(),
                "env 'HF_TOKEN=s3cr3t-value' x".into(),
            ],
            env: env.clone(),
            cwd: None,
        });
        let shown = r.redacted().to_text();
        assert!(
            !shown.contains("s3cr3t") && !shown.contains("k1"),
            "{shown}"
        );
        assert!(shown.contains("export WANDB_API_KEY=<redacted>"), "{shown}");
        assert!(shown.contains("HOME=/h"), "{shown}");
        // The rendering itself is untouched.
        assert!(r.to_text().contains("s3cr3t-value"));
    }
}
