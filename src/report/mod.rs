//! Reading a campaign or a sweep after the fact (or while it runs), without taking its lease:
//! the model behind `puzzletron campaign status|report` and `puzzletron sweep status`.
//!
//! - `history`: [`CampaignHistory`], every attempt of a campaign assembled from its journal
//!   and the executor's attempt records, read-only; GPU-hours and wasted GPU-hours.
//! - `lease`: [`LeaseStatus`], whether a controller holds the lease, probed without taking it.
//! - `html`: [`render_campaign_report`], one self-contained HTML file (inline SVG and CSS, no
//!   script, no network): stage DAG, timeline, GPU-hours, waste by failure class, failures;
//!   [`render_campaign_report_files`] adds the attempts CSV written beside a large campaign's
//!   report.
//! - `sweep`: [`SweepHistory`] and [`render_sweep_report`], the same for a sweep store.
//! - `notify`: [`Notifier`], a command run with an event as JSON on its stdin.
//!
//! The report is built from this model, not from the controller's event types, so a change of
//! the journal's entries only touches `history`'s reader: it reads each journal line as a
//! tagged JSON object and takes the fields it knows, skipping entry kinds it does not.

mod history;
mod html;
mod lease;
mod notify;
mod svg;
mod sweep;

use std::path::{Path, PathBuf};

pub use history::{
    AttemptHistory, AttemptOutcome, AttemptTimes, Backoff, CampaignCancel, CampaignHistory,
    StageHistory, StageStatus, clock_text,
};
pub use html::{
    AGGREGATE_ATTEMPTS, AGGREGATE_SLICES, INLINE_ATTEMPTS, ReportFiles, attempts_csv_name,
    render_campaign_report, render_campaign_report_files,
};
pub use lease::LeaseStatus;
pub use notify::{Notifier, NotifyEvent};
pub use sweep::{SweepHistory, SweepRun, SweepStatus, render_sweep_report};

/// Errors of this area.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done, e.g. `reading journal`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file's content is not what was expected.
    #[error("{}{}: {reason}", path.display(), line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The 1-based line, for line-oriented files.
        line: Option<usize>,
        /// What is wrong and what was expected.
        reason: String,
    },
    /// The path is not a campaign folder: it does not exist, is a file, or has no
    /// `controller/journal.jsonl`.
    #[error(
        "{} is not a campaign folder: {reason} (expected the --dir of a `puzzletron campaign run`)",
        path.display()
    )]
    NotACampaign {
        /// The path.
        path: PathBuf,
        /// Why: "the path does not exist", "it is a file, not a folder", or "it has no
        /// controller/journal.jsonl".
        reason: String,
    },
    /// A sweep store could not be read.
    #[error("reading the store: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl ReportError {
    /// Whether retrying can help: only for I/O errors (a file being replaced, an NFS hiccup).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ReportError::Io { .. })
    }

    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        ReportError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}
