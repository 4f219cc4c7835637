//! The durable journal of a campaign: an append-only log of [`Entry`]s in
//! `<campaign>/controller/journal.jsonl`, one JSON record per line.
//!
//! Why a log and not one file per attempt: a controller records an intent before every submit
//! and a handle after it; with 100k work items that is 200k records, and one `fsync` per batch
//! of records (not per record) keeps that affordable while keeping the rule "intent is durable
//! before the submit happens". Records are never rewritten, so events never overwrite each
//! other.
//!
//! Crash safety: records are appended with one `write` per batch and made durable with
//! `fdatasync` before [`Journal::append`] returns. A crash can only leave a *torn last line*
//! (no trailing newline): [`Journal::open`] cuts it off, since its batch was never
//! acknowledged, and says so in the returned [`Replay::torn_tail`]. Any complete line that does
//! not parse is an error ([`ControllerError::Corrupt`]) naming the file and line: unreadable
//! records are never skipped.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::classify::{FailureClass, OomKind};
use super::error::ControllerError;
use super::policy::Decision;
use crate::executor::{AttemptId, JobHandle, JobState};
use crate::identity::Hash;

/// Version of the journal format.
pub(super) const JOURNAL_FORMAT: u32 = 1;

/// One journal record's content.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Entry {
    /// First record: the campaign's identity.
    Header {
        /// `JOURNAL_FORMAT`.
        format: u32,
        /// Random id of this campaign folder; prefixes every attempt id so that jobs of an
        /// earlier campaign (same plan, folder deleted) are never adopted.
        nonce: String,
        /// The plan's contract hash.
        contract_hash: Hash,
    },
    /// A new revision starts (the contract changed and the user asked for a new revision).
    Revision {
        /// Revision number (the first one is 0).
        revision: u32,
        /// The new contract.
        contract_hash: Hash,
    },
    /// About to submit `attempt_id` (written and synced before the submit).
    Intent {
        /// The work unit, e.g. `score/3`, `score/agg`.
        unit: String,
        /// Attempt number of the unit, from 1.
        attempt: u32,
        /// The attempt id (the scheduler job name).
        attempt_id: AttemptId,
        /// Submitted with the resume flag.
        resume: bool,
        /// Submitted with more resources after an out-of-memory.
        more_resources: bool,
    },
    /// The executor accepted the attempt.
    Submitted {
        /// The attempt.
        attempt_id: AttemptId,
        /// Its handle.
        handle: JobHandle,
        /// Found through `find` at recovery rather than returned by `submit`.
        adopted: bool,
    },
    /// The submit failed and no job exists (or, at recovery, none was found after the grace).
    SubmitFailed {
        /// The attempt.
        attempt_id: AttemptId,
        /// The error.
        error: String,
    },
    /// The controller asked the executor to cancel the attempt.
    CancelRequested {
        /// The attempt.
        attempt_id: AttemptId,
        /// Why.
        reason: String,
        /// For a hung attempt (heartbeat timeout): when its progress mark last moved, as the
        /// controller saw it (ms since the Unix epoch, controller clock; within one poll
        /// interval). The report counts the time after it as wasted (`hung`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_heartbeat_ms: Option<u64>,
    },
    /// The attempt reached a terminal state.
    Finished {
        /// The attempt.
        attempt_id: AttemptId,
        /// Its final state.
        state: JobState,
        /// Exit code, if any.
        exit_code: Option<i32>,
        /// Failure class (`None`: success).
        class: Option<FailureClass>,
        /// Evidence used.
        detail: String,
        /// Its log.
        log_path: Option<PathBuf>,
        /// Nodes it ran on, in the scheduler's notation (`n[1-2]`), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nodes: Option<String>,
        /// It failed fast on `nodes` (a transient failure before its first progress mark, or
        /// `NODE_FAIL`/`BOOT_FAIL`): charged to the infrastructure budget and to those nodes.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        fail_fast: bool,
        /// For an out-of-memory failure: host or GPU memory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oom: Option<OomKind>,
    },
    /// A node is excluded from every later submission of the campaign (`--exclude`): attempts
    /// failed fast on it as often as the controller's threshold.
    NodeExcluded {
        /// The node.
        node: String,
        /// Why, e.g. `2 attempts failed fast on it (...)`.
        reason: String,
    },
    /// What follows for a unit.
    Decided {
        /// The unit.
        unit: String,
        /// The decision.
        decision: Decision,
        /// For a retry: not before this time (ms since the Unix epoch, controller clock).
        not_before_ms: u64,
    },
    /// A persistent-pool stage's queue was filled.
    PoolFilled {
        /// Stage.
        stage: String,
        /// Items enqueued.
        items: usize,
    },
    /// A stage finished.
    StageDone {
        /// Stage.
        stage: String,
    },
    /// A stage failed.
    StageFailed {
        /// Stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// A manual decision stage is ready and waits for a person: off a terminal, for the
    /// decision file (journaled once per stage, so a restart does not announce it again).
    DecisionNeeded {
        /// The decision stage.
        stage: String,
        /// The decision file the controller reads.
        file: PathBuf,
        /// The candidates (work ids of the input stage), numbered from 1.
        candidates: Vec<String>,
    },
    /// A person decided a manual decision stage (journaled with its `stage_done`, so a restart
    /// never asks again).
    DecisionMade {
        /// The decision stage.
        stage: String,
        /// The chosen candidates, in candidate order (empty: `none`).
        chosen: Vec<String>,
    },
    /// A stage will not run: a manual decision upstream chose no candidate.
    StageSkipped {
        /// Stage.
        stage: String,
        /// Why.
        reason: String,
    },
    /// Anything else worth keeping (recovery, halt, detach, lease, view).
    Event {
        /// Short kind, e.g. `recovered`, `halt`, `detach`.
        kind: String,
        /// Human text.
        message: String,
    },
}

impl Entry {
    /// The journal entry of an event the observers are told (its kind and message).
    pub(super) fn from_event(ev: &super::event::ControllerEvent) -> Self {
        Entry::Event {
            kind: ev.kind().into(),
            message: ev.to_string(),
        }
    }
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Record {
    /// Sequence number, from 1, without gaps.
    pub seq: u64,
    /// When it was written (ms since the Unix epoch, controller clock).
    pub at_ms: u64,
    /// The content.
    pub entry: Entry,
}

/// What [`Journal::open`] found.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Replay {
    /// Every record, in order.
    pub records: Vec<Record>,
    /// Bytes of a torn last line that were cut off (a crash during an append).
    pub torn_tail: usize,
}

/// An open journal (append only).
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    next_seq: u64,
    buf: Vec<u8>,
}

impl Journal {
    /// The journal file of a controller folder.
    pub fn file_in(dir: &Path) -> PathBuf {
        dir.join("journal.jsonl")
    }

    /// Opens (creating if needed) the journal in `dir` and replays it.
    ///
    /// # Errors
    /// [`ControllerError::Corrupt`] for a complete line that does not parse or a sequence gap;
    /// [`ControllerError::Io`] for file errors.
    pub fn open(dir: &Path) -> Result<(Self, Replay), ControllerError> {
        let path = Self::file_in(dir);
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| ControllerError::io("opening journal", &path, e))?;
        if !existed {
            crate::fsutil::sync_dir(dir).map_err(|e| ControllerError::io("syncing", dir, e))?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| ControllerError::io("reading journal", &path, e))?;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let torn_tail = bytes.len() - complete;
        if torn_tail > 0 {
            file.set_len(complete as u64)
                .and_then(|_| file.sync_data())
                .map_err(|e| ControllerError::io("cutting the torn tail of", &path, e))?;
            file.seek(SeekFrom::End(0))
                .map_err(|e| ControllerError::io("seeking", &path, e))?;
        }
        let mut records = Vec::new();
        for (i, line) in bytes[..complete].split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let rec: Record =
                serde_json::from_slice(line).map_err(|e| ControllerError::Corrupt {
                    path: path.clone(),
                    line: i + 1,
                    reason: e.to_string(),
                })?;
            if rec.seq != records.len() as u64 + 1 {
                return Err(ControllerError::Corrupt {
                    path: path.clone(),
                    line: i + 1,
                    reason: format!(
                        "sequence {} where {} was expected",
                        rec.seq,
                        records.len() + 1
                    ),
                });
            }
            records.push(rec);
        }
        let next_seq = records.len() as u64 + 1;
        Ok((
            Journal {
                path,
                file,
                next_seq,
                buf: Vec::new(),
            },
            Replay { records, torn_tail },
        ))
    }

    /// The journal file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records appended so far (including replayed ones).
    pub fn len(&self) -> u64 {
        self.next_seq - 1
    }

    /// Whether the journal has no record.
    pub fn is_empty(&self) -> bool {
        self.next_seq == 1
    }

    /// Appends `entries` stamped `at_ms` and makes them durable (`fdatasync`) before returning.
    ///
    /// # Errors
    /// [`ControllerError::Io`]; after an error the journal may hold a torn last line, which the
    /// next [`open`](Journal::open) cuts off.
    pub fn append<I: IntoIterator<Item = Entry>>(
        &mut self,
        entries: I,
        at_ms: u64,
    ) -> Result<(), ControllerError> {
        self.buf.clear();
        let mut n = 0;
        for entry in entries {
            let rec = Record {
                seq: self.next_seq + n,
                at_ms,
                entry,
            };
            serde_json::to_writer(&mut self.buf, &rec).map_err(|e| {
                ControllerError::io("encoding a record of", &self.path, std::io::Error::other(e))
            })?;
            self.buf.push(b'\n');
            n += 1;
        }
        if n == 0 {
            return Ok(());
        }
        self.file
            .write_all(&self.buf)
            .and_then(|_| self.file.sync_data())
            .map_err(|e| ControllerError::io("appending to journal", &self.path, e))?;
        self.next_seq += n;
        if self.buf.capacity() > 1 << 22 {
            self.buf = Vec::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(m: &str) -> Entry {
        Entry::Event {
            kind: "test".into(),
            message: m.into(),
        }
    }

    #[test]
    fn append_replay_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, r) = Journal::open(dir.path()).unwrap();
            assert!(r.records.is_empty());
            j.append([ev("a"), ev("b")], 10).unwrap();
            j.append([ev("c")], 11).unwrap();
        }
        // A crash in the middle of a write leaves half a line.
        let p = Journal::file_in(dir.path());
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"seq\":4,\"at_ms\":12,\"ent").unwrap();
        drop(f);
        let (mut j, r) = Journal::open(dir.path()).unwrap();
        assert_eq!(r.torn_tail, 24);
        assert_eq!(r.records.len(), 3);
        assert_eq!(r.records[2].entry, ev("c"));
        assert_eq!(r.records[1].at_ms, 10);
        j.append([ev("d")], 13).unwrap();
        let (_, r) = Journal::open(dir.path()).unwrap();
        assert_eq!(r.records.len(), 4);
        assert_eq!(r.records[3].seq, 4);
        assert_eq!(r.torn_tail, 0);
    }

    #[test]
    fn a_bad_complete_line_is_an_error_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut j, _) = Journal::open(dir.path()).unwrap();
            j.append([ev("a")], 1).unwrap();
        }
        let p = Journal::file_in(dir.path());
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"not json\n").unwrap();
        drop(f);
        let err = Journal::open(dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, ControllerError::Corrupt { line: 2, .. }),
            "{msg}"
        );
        assert!(msg.contains("journal.jsonl line 2"), "{msg}");
    }

    #[test]
    fn a_sequence_gap_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = Journal::file_in(dir.path());
        std::fs::write(
            &p,
            "{\"seq\":1,\"at_ms\":0,\"entry\":{\"t\":\"event\",\"kind\":\"k\",\"message\":\"m\"}}\n\
             {\"seq\":3,\"at_ms\":0,\"entry\":{\"t\":\"event\",\"kind\":\"k\",\"message\":\"m\"}}\n",
        )
        .unwrap();
        let err = Journal::open(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("sequence 3 where 2 was expected"),
            "{err}"
        );
    }
}
