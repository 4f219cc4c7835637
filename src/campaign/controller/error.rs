//! [`ControllerError`]: what can stop a campaign controller.

use std::path::PathBuf;

use crate::executor::ExecutorError;
use crate::identity::Hash;

/// An error of the [`CampaignController`](super::CampaignController), its journal, lease or
/// work queue. Job failures are not errors: they are in the
/// [`CampaignReport`](super::CampaignReport).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// Another controller holds the campaign.
    #[error("campaign {} is held by another controller ({holder}); lease file {}", campaign.display(), lease.display())]
    LeaseHeld {
        /// The campaign folder.
        campaign: PathBuf,
        /// Who holds it, e.g. `pid 4242 on node01 since 2026-01-01T10:00:00Z`.
        holder: String,
        /// The lease file.
        lease: PathBuf,
    },
    /// This controller's lease was taken over by someone else (it must stop at once).
    #[error("lost the lease of campaign {}: now held by {holder}", campaign.display())]
    LeaseLost {
        /// The campaign folder.
        campaign: PathBuf,
        /// The new holder.
        holder: String,
    },
    /// A journal or queue record cannot be read: never skipped silently.
    #[error("unreadable record in {} line {line}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// 1-based line (0 for a whole-file record).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The plan's contract hash differs from the one the campaign was started with.
    #[error("campaign {} was started with contract {old} but the plan now has contract {new} \
             ({}); results would be mixed. Ask for a new revision (`new_revision(true)`) to \
             cancel the old attempts and start over, or restore the old configuration",
             campaign.display(),
             if reasons.is_empty() { "what changed is unknown: the old plan could not be read".to_string() } else { reasons.join("; ") })]
    ContractChanged {
        /// The campaign folder.
        campaign: PathBuf,
        /// What changed, one reason per changed input of the contract hash
        /// ([`contract_changes`](crate::campaign::contract_changes)); empty when the old plan
        /// (`controller/plan.json`) could not be read.
        reasons: Vec<String>,
        /// The journal's contract.
        old: Hash,
        /// The plan's contract.
        new: Hash,
    },
    /// The plan cannot be run as given (e.g. a stage without a command, a pool stage without
    /// an item source).
    #[error("stage {stage}: {reason}")]
    BadPlan {
        /// The stage.
        stage: String,
        /// What is wrong.
        reason: String,
    },
    /// The campaign folder cannot be used: it is a file, or a non-empty folder that this
    /// library did not create (no `controller/` folder), so campaign files would be scattered
    /// among unrelated ones.
    #[error("campaign folder {}: {reason}", path.display())]
    NotACampaign {
        /// The folder given as `campaign_dir`.
        path: PathBuf,
        /// What is wrong and what was expected.
        reason: String,
    },
    /// A builder option is missing or invalid.
    #[error("controller option {option}: {reason}")]
    BadOption {
        /// The option, e.g. `campaign_dir`.
        option: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A file of the campaign folder could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// An executor call failed in a way retrying cannot fix.
    #[error("executor: {0}")]
    Executor(#[from] ExecutorError),
}

impl ControllerError {
    /// Whether retrying the same operation later may succeed: a held lease (its holder may
    /// exit), I/O errors, and retryable executor errors.
    pub fn is_retryable(&self) -> bool {
        match self {
            ControllerError::LeaseHeld { .. } | ControllerError::Io { .. } => true,
            ControllerError::Executor(e) => e.is_retryable(),
            _ => false,
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        ControllerError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
