//! The work queue of a persistent-pool stage, in `<campaign>/queues/<stage>/`, and the small
//! worker-side API ([`PoolWorker`]) Rust payloads use to claim and complete items.
//!
//! Layout (one JSON file per item, all writes crash-safe):
//! - `pending/<item>.json`: waiting;
//! - `claimed/<item>@<worker>.json`: taken by worker attempt `<worker>`. A claim is one
//!   `rename(2)` from `pending/`, which is atomic: of two workers racing for an item exactly
//!   one succeeds, the other gets `ENOENT` and tries the next item. The holder is in the name,
//!   so a claim never exists without its owner;
//! - `done/<item>.json`: the result (written atomically *before* the claim is removed, so a
//!   crash in between leaves a result and a stale claim, which requeueing drops);
//! - `failed/<item>.json`: failed for good (the payload said so, or too many workers died
//!   holding it).
//!
//! The controller returns a dead worker's claims to `pending/` ([`WorkQueue::requeue_worker`])
//! when the worker's attempt ends, counting the requeue in the item.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::ControllerError;
use crate::fsutil::atomic_write;

/// Environment variable naming the queue folder of a pool worker.
pub(super) const QUEUE_DIR_ENV: &str = "PUZZLETRON_QUEUE_DIR";

/// One item of a pool queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolItem {
    /// Unique id in the stage: `[A-Za-z0-9._-]{1,100}`, starting with a letter or digit.
    pub id: String,
    /// What the worker needs to process it.
    pub payload: serde_json::Value,
    /// How many times a worker died holding it.
    #[serde(default)]
    pub requeues: u32,
}

impl PoolItem {
    /// An item with no requeue yet.
    pub fn new(id: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            id: id.into(),
            payload,
            requeues: 0,
        }
    }
}

/// The outcome of an item, in `done/` or `failed/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ItemOutcome {
    /// The item.
    pub item: PoolItem,
    /// The worker attempt that finished it (or `controller` for a requeue limit).
    pub worker: String,
    /// The result (done) or `null`.
    pub result: serde_json::Value,
    /// The error (failed).
    pub error: Option<String>,
}

/// Item counts of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueCounts {
    /// Waiting.
    pub pending: usize,
    /// Claimed by a worker.
    pub claimed: usize,
    /// Done.
    pub done: usize,
    /// Failed for good.
    pub failed: usize,
}

fn check_id(id: &str, what: &str) -> Result<(), ControllerError> {
    let ok = !id.is_empty()
        && id.len() <= 100
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ControllerError::BadOption {
            option: "pool item",
            reason: format!(
                "{what} {id:?}: expected [A-Za-z0-9._-]{{1,100}} starting with a letter or digit"
            ),
        })
    }
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ControllerError> {
    let bytes = fs::read(path).map_err(|e| ControllerError::io("reading", path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| ControllerError::Corrupt {
        path: path.to_path_buf(),
        line: 0,
        reason: e.to_string(),
    })
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), ControllerError> {
    let bytes = serde_json::to_vec(v)
        .map_err(|e| ControllerError::io("encoding", path, std::io::Error::other(e)))?;
    atomic_write(path, &bytes).map_err(|e| ControllerError::io("writing", path, e))
}

fn names(dir: &Path) -> Result<Vec<String>, ControllerError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ControllerError::io("listing", dir, e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| ControllerError::io("listing", dir, e))?;
        let n = e.file_name().to_string_lossy().into_owned();
        if !crate::fsutil::is_temp_name(&n) && n.ends_with(".json") {
            out.push(n);
        }
    }
    out.sort();
    Ok(out)
}

/// The controller's side of a pool queue.
#[derive(Clone, Debug)]
pub struct WorkQueue {
    dir: PathBuf,
}

impl WorkQueue {
    /// The queue in `dir` (created on [`fill`](WorkQueue::fill)).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The queue folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn sub(&self, s: &str) -> PathBuf {
        self.dir.join(s)
    }

    /// Enqueues every item not yet anywhere in the queue (idempotent: a fill interrupted by a
    /// crash is completed by the next one). Returns how many were written.
    ///
    /// # Errors
    /// [`ControllerError::BadOption`] for a bad or duplicate item id; I/O errors.
    pub fn fill(&self, items: &[PoolItem]) -> Result<usize, ControllerError> {
        let mut seen = std::collections::HashSet::new();
        for it in items {
            check_id(&it.id, "item id")?;
            if !seen.insert(it.id.as_str()) {
                return Err(ControllerError::BadOption {
                    option: "pool item",
                    reason: format!("duplicate item id {:?}", it.id),
                });
            }
        }
        for s in ["pending", "claimed", "done", "failed"] {
            fs::create_dir_all(self.sub(s))
                .map_err(|e| ControllerError::io("creating", self.sub(s), e))?;
        }
        let mut present = std::collections::HashSet::new();
        for s in ["pending", "done", "failed"] {
            for n in names(&self.sub(s))? {
                present.insert(n.trim_end_matches(".json").to_string());
            }
        }
        for n in names(&self.sub("claimed"))? {
            if let Some((id, _)) = n.split_once('@') {
                present.insert(id.to_string());
            }
        }
        let mut written = 0;
        for it in items.iter().filter(|it| !present.contains(&it.id)) {
            write_json(&self.sub("pending").join(format!("{}.json", it.id)), it)?;
            written += 1;
        }
        Ok(written)
    }

    /// Counts items per state.
    ///
    /// # Errors
    /// I/O errors listing the folders.
    pub fn counts(&self) -> Result<QueueCounts, ControllerError> {
        let done = names(&self.sub("done"))?;
        // A claim whose result already exists is stale (crash between the two writes).
        let claimed = names(&self.sub("claimed"))?
            .into_iter()
            .filter(|n| {
                let id = n.split_once('@').map_or(n.as_str(), |(i, _)| i);
                !done.iter().any(|d| d.trim_end_matches(".json") == id)
            })
            .count();
        Ok(QueueCounts {
            pending: names(&self.sub("pending"))?.len(),
            claimed,
            done: done.len(),
            failed: names(&self.sub("failed"))?.len(),
        })
    }

    /// Returns the items claimed by `worker` to `pending/` (or to `failed/` once an item has
    /// been requeued `max_requeues` times). Returns `(requeued, failed)`.
    ///
    /// # Errors
    /// I/O errors; [`ControllerError::Corrupt`] for an unreadable claim.
    pub fn requeue_worker(
        &self,
        worker: &str,
        max_requeues: u32,
    ) -> Result<(usize, usize), ControllerError> {
        let suffix = format!("@{worker}.json");
        let (mut requeued, mut failed) = (0, 0);
        for n in names(&self.sub("claimed"))?
            .into_iter()
            .filter(|n| n.ends_with(&suffix))
        {
            let path = self.sub("claimed").join(&n);
            let id = &n[..n.len() - suffix.len()];
            if self.sub("done").join(format!("{id}.json")).exists() {
                fs::remove_file(&path)
                    .map_err(|e| ControllerError::io("removing stale claim", &path, e))?;
                continue;
            }
            let mut item: PoolItem = read_json(&path)?;
            item.requeues += 1;
            if item.requeues > max_requeues {
                let out = ItemOutcome {
                    item,
                    worker: "controller".into(),
                    result: serde_json::Value::Null,
                    error: Some(format!(
                        "{} workers died holding it (limit {max_requeues})",
                        max_requeues + 1
                    )),
                };
                write_json(&self.sub("failed").join(format!("{id}.json")), &out)?;
                failed += 1;
            } else {
                write_json(&self.sub("pending").join(format!("{id}.json")), &item)?;
                requeued += 1;
            }
            fs::remove_file(&path).map_err(|e| ControllerError::io("removing claim", &path, e))?;
        }
        Ok((requeued, failed))
    }

    /// The results of the done items, sorted by item id.
    ///
    /// # Errors
    /// I/O errors; [`ControllerError::Corrupt`] for an unreadable result.
    pub fn results(&self) -> Result<Vec<ItemOutcome>, ControllerError> {
        names(&self.sub("done"))?
            .iter()
            .map(|n| read_json(&self.sub("done").join(n)))
            .collect()
    }
}

/// An item a worker holds.
#[derive(Debug)]
#[non_exhaustive]
pub struct ClaimedItem {
    /// The item.
    pub item: PoolItem,
    path: PathBuf,
}

/// The worker side of a pool queue: claim an item, process it, complete or fail it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use puzzletron::campaign::controller::PoolWorker;
/// let worker = PoolWorker::from_env()?; // PUZZLETRON_QUEUE_DIR, PUZZLETRON_ATTEMPT_ID
/// while let Some(claimed) = worker.claim()? {
///     let x = claimed.item.payload["x"].as_f64().unwrap_or(0.0);
///     worker.complete(claimed, &serde_json::json!({ "y": x * 2.0 }))?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PoolWorker {
    dir: PathBuf,
    worker: String,
}

impl PoolWorker {
    /// A worker named `worker` (its attempt id) on the queue in `dir`.
    ///
    /// # Errors
    /// [`ControllerError::BadOption`] when `worker` is not a valid id (it goes into file names).
    pub fn new(
        dir: impl Into<PathBuf>,
        worker: impl Into<String>,
    ) -> Result<Self, ControllerError> {
        let worker = worker.into();
        check_id(&worker, "worker id")?;
        Ok(Self {
            dir: dir.into(),
            worker,
        })
    }

    /// The worker of the current attempt: queue from `QUEUE_DIR_ENV`, id from
    /// [`ATTEMPT_ID_ENV`](crate::executor::ATTEMPT_ID_ENV).
    ///
    /// # Errors
    /// [`ControllerError::BadOption`] when a variable is missing or invalid.
    pub fn from_env() -> Result<Self, ControllerError> {
        let get = |k: &'static str| {
            std::env::var(k).map_err(|_| ControllerError::BadOption {
                option: k,
                reason: "environment variable not set (is this running as a pool worker?)".into(),
            })
        };
        Self::new(get(QUEUE_DIR_ENV)?, get(crate::executor::ATTEMPT_ID_ENV)?)
    }

    /// Claims the next pending item (in id order), or `None` when nothing is pending.
    ///
    /// # Errors
    /// I/O errors; [`ControllerError::Corrupt`] for an unreadable item.
    pub fn claim(&self) -> Result<Option<ClaimedItem>, ControllerError> {
        for n in names(&self.dir.join("pending"))? {
            let from = self.dir.join("pending").join(&n);
            let id = n.trim_end_matches(".json");
            let to = self
                .dir
                .join("claimed")
                .join(format!("{id}@{}.json", self.worker));
            match fs::rename(&from, &to) {
                Ok(()) => {
                    crate::fsutil::sync_dir(&self.dir.join("claimed"))
                        .map_err(|e| ControllerError::io("syncing", self.dir.join("claimed"), e))?;
                    let item = read_json(&to)?;
                    return Ok(Some(ClaimedItem { item, path: to }));
                }
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(ControllerError::io("claiming", &from, e)),
            }
        }
        Ok(None)
    }

    fn finish(
        &self,
        c: ClaimedItem,
        folder: &str,
        result: serde_json::Value,
        error: Option<String>,
    ) -> Result<(), ControllerError> {
        let path = self.dir.join(folder).join(format!("{}.json", c.item.id));
        let out = ItemOutcome {
            item: c.item,
            worker: self.worker.clone(),
            result,
            error,
        };
        write_json(&path, &out)?;
        fs::remove_file(&c.path).map_err(|e| ControllerError::io("removing claim", &c.path, e))
    }

    /// Records the result of an item (atomically) and releases the claim.
    ///
    /// # Errors
    /// I/O errors.
    pub fn complete(
        &self,
        claimed: ClaimedItem,
        result: &serde_json::Value,
    ) -> Result<(), ControllerError> {
        self.finish(claimed, "done", result.clone(), None)
    }

    /// Marks an item failed for good.
    ///
    /// # Errors
    /// I/O errors.
    pub fn fail(
        &self,
        claimed: ClaimedItem,
        error: impl Into<String>,
    ) -> Result<(), ControllerError> {
        self.finish(
            claimed,
            "failed",
            serde_json::Value::Null,
            Some(error.into()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claims_are_exclusive_under_concurrency_and_complete() {
        let dir = tempfile::tempdir().unwrap();
        let q = WorkQueue::new(dir.path());
        let items: Vec<_> = (0..200)
            .map(|i| PoolItem::new(format!("i{i:03}"), json!(i)))
            .collect();
        assert_eq!(q.fill(&items).unwrap(), 200);
        assert_eq!(q.fill(&items).unwrap(), 0, "fill is idempotent");
        let threads: Vec<_> = (0..4)
            .map(|w| {
                let w = PoolWorker::new(dir.path(), format!("w{w}")).unwrap();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while let Some(c) = w.claim().unwrap() {
                        got.push(c.item.id.clone());
                        let v = c.item.payload.as_i64().unwrap();
                        w.complete(c, &json!(v * 2)).unwrap();
                    }
                    got
                })
            })
            .collect();
        let mut all: Vec<String> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        all.sort();
        assert_eq!(all.len(), 200, "every item processed exactly once");
        all.dedup();
        assert_eq!(all.len(), 200);
        assert_eq!(
            q.counts().unwrap(),
            QueueCounts {
                pending: 0,
                claimed: 0,
                done: 200,
                failed: 0
            }
        );
        let r = q.results().unwrap();
        assert_eq!(r[7].result, json!(14));
    }

    #[test]
    fn dead_worker_items_are_requeued_then_failed_after_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let q = WorkQueue::new(dir.path());
        q.fill(&[PoolItem::new("a", json!(1)), PoolItem::new("b", json!(2))])
            .unwrap();
        let w = PoolWorker::new(dir.path(), "w1").unwrap();
        let a = w.claim().unwrap().unwrap();
        let _b = w.claim().unwrap().unwrap();
        w.complete(a, &json!("ok")).unwrap();
        assert_eq!(
            q.counts().unwrap(),
            QueueCounts {
                pending: 0,
                claimed: 1,
                done: 1,
                failed: 0
            }
        );
        assert_eq!(q.requeue_worker("w1", 1).unwrap(), (1, 0));
        assert_eq!(q.counts().unwrap().pending, 1);
        let w2 = PoolWorker::new(dir.path(), "w2").unwrap();
        let b = w2.claim().unwrap().unwrap();
        assert_eq!(b.item.requeues, 1);
        assert_eq!(q.requeue_worker("w2", 1).unwrap(), (0, 1));
        assert_eq!(
            q.counts().unwrap(),
            QueueCounts {
                pending: 0,
                claimed: 0,
                done: 1,
                failed: 1
            }
        );
    }

    #[test]
    fn bad_ids_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let q = WorkQueue::new(dir.path());
        let err = q.fill(&[PoolItem::new("../x", json!(0))]).unwrap_err();
        assert!(err.to_string().contains("\"../x\""), "{err}");
        assert!(PoolWorker::new(dir.path(), "a@b").is_err());
    }
}
