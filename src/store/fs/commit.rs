//! Writing a finished record, alone ([`Store::finish`]) or in a group commit
//! ([`Store::finish_many`]): the running record a start writes, staging (the claim checked,
//! `error.txt` and the record's temp file written), the flushes and renames that make a batch
//! durable, and settling (the claim released, tombs cleared, the done index noted).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::dir::truncate;
use super::index::Entry;
use super::{FsStore, io_err, json_bytes};
use crate::fsutil::{Durability, replace_file, write_file};
use crate::identity::Hash;
#[cfg(doc)]
use crate::store::Store;
use crate::store::{Claim, JobRecord, StoreError};

/// A running record of at most this many bytes stays as it is once its attempt ends; a larger
/// one is emptied (see `settle`).
pub(super) const KEEP_RUNNING_RECORD: usize = 64 * 1024;

/// A finished record written to its temp file, not yet renamed into place.
struct Staged {
    /// The job folder.
    dir: PathBuf,
    /// The temp file, next to `record.json`.
    tmp: PathBuf,
    /// The temp file, open for its `fsync`.
    file: File,
    /// The record's line in the done index (done records only).
    entry: Option<Entry>,
    /// The record's size in bytes (about that of the running record it replaces).
    len: usize,
}

impl Staged {
    /// Renames the temp file over `record.json` (an atomic replace).
    fn rename(&self) -> Result<(), StoreError> {
        let path = self.dir.join("record.json");
        fs::rename(&self.tmp, &path).map_err(io_err(&path))
    }
}

impl FsStore {
    /// Writes the running record of attempt `attempt` as `running.N.json` and links it as
    /// `record.json`: the name `running.N.json` keeps its inode alive when `finish` renames the
    /// done record over `record.json` (see [`RELEASED`](super::claim::RELEASED) for why that
    /// matters). When
    /// `record.json` already exists (a rerun) or `running.N.json` does (an attempt that died
    /// before its link), it is replaced by temp file and rename as any record.
    pub(super) fn write_running(
        &self,
        dir: &Path,
        attempt: u32,
        record: &JobRecord,
    ) -> Result<(), StoreError> {
        let path = dir.join("record.json");
        let running = dir.join(format!("running.{attempt}.json"));
        let bytes = json_bytes(&path, record)?;
        let created = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&running)
            .and_then(|mut f| f.write_all(&bytes));
        match created {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return write_file(&path, &bytes, Durability::Process).map_err(io_err(&path));
            }
            Err(e) => return Err(io_err(&running)(e)),
        }
        match fs::hard_link(&running, &path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // A rerun: the previous record is replaced atomically by a second name of the
                // running record. Only the holder of this attempt's claim writes this name.
                let tmp = dir.join(format!(".record.json.tmp.link.{attempt}"));
                let _ = fs::remove_file(&tmp);
                let swapped = fs::hard_link(&running, &tmp).and_then(|()| fs::rename(&tmp, &path));
                if swapped.is_err() {
                    let _ = fs::remove_file(&tmp);
                }
                swapped.map_err(io_err(&path))
            }
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// The first half of a finish: checks the claim, writes `error.txt` for a failed record and
    /// the record to a temp file next to `record.json` (not synced).
    fn stage(&self, claim: &Claim, record: &JobRecord) -> Result<Staged, StoreError> {
        // A written claim is always read back: another host may have judged it stale (a
        // clock skewed, a heartbeat lost). An unwritten one made a moment ago is trusted, as
        // `start` trusts a new claim file (a short run spares a failed `openat`); an older one
        // is written now, which finds a takeover (see `Holder`).
        let young_unwritten = self.held(&claim.key, false).is_some_and(|h| {
            h.attempt == claim.attempt && h.unwritten.is_some() && self.is_new(&h)
        });
        if !young_unwritten {
            self.write_unwritten(claim)?;
            self.holds(claim)?;
        }
        let dir = self.job_dir(&claim.key);
        if let Some(f) = &record.error {
            let mut text = format!("{}: {}\n", f.kind, f.message);
            for c in &f.chain {
                text.push_str(&format!("caused by: {c}\n"));
            }
            if let Some(bt) = &f.backtrace {
                text.push_str("\nbacktrace:\n");
                text.push_str(bt);
                text.push('\n');
            }
            // A readable copy of what the record holds: the record is the durable one.
            let p = dir.join("error.txt");
            replace_file(&p, text.as_bytes()).map_err(io_err(&p))?;
        }
        let path = dir.join("record.json");
        let bytes = json_bytes(&path, record)?;
        let tmp = crate::fsutil::temp_path(&path);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes).map(|()| f));
        match written {
            Ok(file) => Ok(Staged {
                entry: Entry::of(record, &bytes),
                len: bytes.len(),
                dir,
                tmp,
                file,
            }),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(io_err(&tmp)(e))
            }
        }
    }

    /// The last half of a finish, once the record is durable in place (the record is the
    /// commit point; the claim goes after it).
    fn settle(&self, claim: &Claim, staged: Staged) {
        if let Some(e) = staged.entry {
            self.index.note_written(&claim.key, e);
        }
        self.settle_unindexed(claim, staged.dir, staged.len);
    }

    /// [`settle`](Self::settle) but for the done index, which the caller notes.
    fn settle_unindexed(&self, claim: &Claim, dir: PathBuf, len: usize) {
        // The running record is a copy of the record as it started: one of hundreds of KiB
        // (a large owned digest) is emptied, not removed, so its inode stays linked (see
        // `RELEASED`). A small one is kept: emptying it costs more (a `truncate` that frees
        // and discards a block) than the few KiB it holds. A failure here costs only disk.
        let held = self
            .held(&claim.key, true)
            .filter(|h| h.attempt == claim.attempt);
        // An unwritten claim has no claim file, and no running record (written after it).
        let unwritten = held.as_ref().is_some_and(|h| h.unwritten.is_some());
        if len > KEEP_RUNNING_RECORD && !unwritten {
            truncate(&dir.join(format!("running.{}.json", claim.attempt)));
        }
        // The record is done whatever happens to the claim now: a claim left behind is stale
        // once its holder is gone, and a done record is never run again.
        if !unwritten {
            let _ = self.release_held(&dir, &claim.owner);
        }
        // A takeover leaves a tomb, and nobody takes over a claim in a fresh folder while its
        // holder lives (`holds` in `stage` would have failed).
        if !held.is_some_and(|h| h.fresh) {
            self.clean_tombs(&claim.key);
        }
    }

    /// [`Store::finish`]: stage, `fsync` the temp file, rename it over `record.json`, `fsync`
    /// the folder, settle.
    pub(super) fn commit_one(&self, claim: &Claim, record: &JobRecord) -> Result<(), StoreError> {
        let staged = self.stage(claim, record)?;
        let synced = staged.file.sync_all().map_err(io_err(&staged.tmp));
        let renamed = synced.and_then(|()| staged.rename());
        if let Err(e) = renamed {
            let _ = fs::remove_file(&staged.tmp);
            return Err(e);
        }
        crate::fsutil::sync_dir(&staged.dir).map_err(io_err(&staged.dir))?;
        self.settle(claim, staged);
        Ok(())
    }

    /// [`Store::finish_many`], a group commit: every record is written to its temp file, then
    /// one `syncfs` makes them durable, then each is renamed into place, then a second `syncfs`
    /// makes the renames durable: two flushes for the batch where `finish` costs two per run.
    /// Where `syncfs` is missing, each file and each folder is `fsync`ed in turn.
    pub(super) fn commit_many(&self, done: &[(&Claim, &JobRecord)]) -> Vec<Result<(), StoreError>> {
        if done.len() < 2 {
            return done.iter().map(|(c, r)| self.commit_one(c, r)).collect();
        }
        let mut staged: Vec<Result<Staged, StoreError>> =
            done.iter().map(|(c, r)| self.stage(c, r)).collect();
        let flush = |staged: &mut Vec<Result<Staged, StoreError>>,
                     one: &dyn Fn(&Staged) -> Result<(), StoreError>| {
            let all = crate::fsutil::sync_filesystem(&self.jobs);
            for slot in staged.iter_mut() {
                let Ok(s) = slot else { continue };
                let r = match &all {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Unsupported => one(s),
                    Err(e) => Err(StoreError::Io {
                        path: self.jobs.clone(),
                        source: io::Error::new(e.kind(), e.to_string()),
                    }),
                };
                if let Err(e) = r {
                    let _ = fs::remove_file(&s.tmp);
                    *slot = Err(e);
                }
            }
        };
        flush(&mut staged, &|s| s.file.sync_all().map_err(io_err(&s.tmp)));
        for slot in staged.iter_mut() {
            if let Ok(s) = slot
                && let Err(e) = s.rename()
            {
                let _ = fs::remove_file(&s.tmp);
                *slot = Err(e);
            }
        }
        flush(&mut staged, &|s| {
            crate::fsutil::sync_dir(&s.dir).map_err(io_err(&s.dir))
        });
        // The batch's done-index lines go in one append.
        let entries: Vec<(Hash, Entry)> = staged
            .iter()
            .zip(done)
            .filter_map(|(slot, (claim, _))| Some((claim.key, slot.as_ref().ok()?.entry?)))
            .collect();
        self.index.note_written_many(&entries);
        staged
            .into_iter()
            .zip(done)
            .map(|(slot, (claim, _))| slot.map(|s| self.settle_unindexed(claim, s.dir, s.len)))
            .collect()
    }
}
