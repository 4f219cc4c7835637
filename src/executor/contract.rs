//! [`ExecutionContract`]: the environment every job of a campaign runs under (checkout, venv,
//! container, setup script, site commands), carried by each [`AttemptSpec`](super::AttemptSpec)
//! and rendered by each executor into what it submits.

use serde::{Deserialize, Serialize};

use crate::identity::{Hash, Hasher};

/// What every worker process runs under (the runner file's `execution_contract:`); changing
/// it can change results, so it is part of a campaign's contract hash.
///
/// Each executor renders it into what it submits, in this order: enter the job's working
/// directory (the spec's `command.cwd`, which a campaign sets to `repository`), source
/// `setup_env`, run the `prerun_commands`, source `<venv>/bin/activate`, run the command, then
/// the `postrun_commands`; the job's exit status is the command's.
///
/// - Slurm: all of it in the batch shell, the steps inherit it; with a `container` the step is
///   `srun --container-image=... [--container-mounts=...] --container-workdir=<cwd>` (pyxis),
///   the setup script and venv are sourced inside the container and the prerun and postrun
///   commands run in the batch shell.
/// - Local and bare metal: all of it in the job's own shell (`sh`); a container cannot be
///   expressed there and is refused ([`ExecutorError::Unsupported`](super::ExecutorError)).
///
/// Build from [`ExecutionContract::default`] with the `with_*` methods:
///
/// ```
/// use puzzletron::executor::ExecutionContract;
/// let c = ExecutionContract::default()
///     .with_repository("/opt/src")
///     .with_venv("/opt/venv")
///     .with_prerun_commands(["module load cuda"]);
/// assert!(!c.is_empty());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ExecutionContract {
    /// Source checkout visible on every worker (and inside the container).
    pub repository: Option<String>,
    /// Virtual environment sourced as `<venv>/bin/activate`.
    pub venv: Option<String>,
    /// Container image for the Slurm container plugin (pyxis/enroot `--container-image`).
    pub container: Option<String>,
    /// Container mounts, comma-separated `/host:/container` entries (`--container-mounts`).
    pub container_mounts: Option<String>,
    /// Script sourced before activating the venv.
    pub setup_env: Option<String>,
    /// Shell commands run, in order, after `setup_env` and before the venv is activated (in
    /// the batch shell on Slurm, so `module load` reaches `srun`). They are written verbatim
    /// into the job script: they are the site's own setup, trusted like the runner file itself.
    pub prerun_commands: Vec<String>,
    /// Shell commands run, in order, after the command exits (its status is kept).
    pub postrun_commands: Vec<String>,
}

impl ExecutionContract {
    /// Sets the source checkout visible on every worker.
    pub fn with_repository(mut self, repository: impl Into<String>) -> Self {
        self.repository = Some(repository.into());
        self
    }

    /// Sets the virtual environment (sourced as `<venv>/bin/activate`).
    pub fn with_venv(mut self, venv: impl Into<String>) -> Self {
        self.venv = Some(venv.into());
        self
    }

    /// Sets the container image (Slurm container plugin `--container-image`).
    pub fn with_container(mut self, image: impl Into<String>) -> Self {
        self.container = Some(image.into());
        self
    }

    /// Sets the container mounts, comma-separated `/host:/container` entries.
    pub fn with_container_mounts(mut self, mounts: impl Into<String>) -> Self {
        self.container_mounts = Some(mounts.into());
        self
    }

    /// Sets the script sourced before the venv is activated.
    pub fn with_setup_env(mut self, script: impl Into<String>) -> Self {
        self.setup_env = Some(script.into());
        self
    }

    /// Sets the shell commands run, in order, before the venv is activated.
    pub fn with_prerun_commands<I, T>(mut self, commands: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.prerun_commands = commands.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the shell commands run, in order, after the command exits.
    pub fn with_postrun_commands<I, T>(mut self, commands: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        self.postrun_commands = commands.into_iter().map(Into::into).collect();
        self
    }

    /// Whether the contract asks for nothing (no checkout, venv, container, setup or commands).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

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
