//! Stage finalisation: what an attempt that ended proves (scheduler state, steps, logs, the
//! success marker, declared outputs and validation), the policy's decision, and the stage
//! transitions (aggregate steps, pool queues, halt policy).

use std::path::Path;
use std::time::Duration;

use super::classify::{CheckpointEvidence, Evidence, FailureClass, uses_rank_logs};
use super::driver::CampaignController;
use super::error::ControllerError;
use super::event::ControllerEvent;
use super::journal::Entry;
use super::pool::WorkQueue;
use super::spec::{
    START_MARKER, SUCCESS_MARKER, find_checkpoint, move_partial_checkpoints_aside, output_dir,
    queue_dir,
};
use super::step::{self, Transition, Visibility};
use crate::executor::{JobState, JobStatus};

/// Longest run of a stage's validation command.
pub(super) const VALIDATE_TIMEOUT: Duration = Duration::from_secs(120);

/// Most per-rank logs read for one attempt (16 KiB of each).
pub(super) const MAX_RANK_LOGS: usize = 256;

/// One way the controller looks for an output file (see `VisibilityHook`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
// Public for the test hook only (feature `test-util`).
#[cfg_attr(not(any(test, feature = "test-util")), allow(unreachable_pub))]
pub enum VisibilityProbe {
    /// `stat` of the path.
    Stat,
    /// A `readdir` of its folder, looking for its name.
    Readdir,
    /// An `open` of the path for reading.
    Open,
}

/// A test hook: returns `true` to hide `path` from one [`VisibilityProbe`] (as a network
/// filesystem's negative cache would), see
/// [`CampaignControllerBuilder::visibility_hook`](super::CampaignControllerBuilder::visibility_hook).
pub(super) type VisibilityHook = dyn Fn(&Path, VisibilityProbe) -> bool + Send + Sync;

/// Whether `path` is visible: `stat`, then a `readdir` of its folder (clears a network
/// filesystem's negative cache of the folder) and an `open` (clears it for the file). The
/// second element says it took more than `stat`.
pub(super) fn visible(path: &Path, hook: Option<&VisibilityHook>) -> (bool, bool) {
    let hidden = |p: VisibilityProbe| hook.is_some_and(|h| h(path, p));
    if !hidden(VisibilityProbe::Stat) && path.exists() {
        return (true, false);
    }
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return (false, false);
    };
    let listed = !hidden(VisibilityProbe::Readdir)
        && std::fs::read_dir(dir)
            .map(|rd| rd.filter_map(Result::ok).any(|e| e.file_name() == name))
            .unwrap_or(false);
    let opened = !hidden(VisibilityProbe::Open) && std::fs::File::open(path).is_ok();
    // A name in the folder is proof only once an open succeeds (or it is a folder).
    let ok = opened || (listed && path.is_dir());
    (ok, ok)
}

impl CampaignController {
    /// The last 16 KiB of a log; `Err` says why it could not be read (then the log is
    /// evidence "unavailable", never "clean").
    pub(super) fn read_tail(path: &Path) -> Result<String, String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let len = f
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// [`read_tail`](Self::read_tail) and whether the tail decodes: `(text, problem)`, the
    /// problem naming the file and the first byte that is not UTF-8 (a character cut by the
    /// tail's start is not one). An undecodable log is "evidence unavailable" (its text is
    /// kept, decoded lossily, but a verdict never calls it clean); an unreadable one gives
    /// no text.
    pub(super) fn read_tail_checked(path: &Path) -> (String, Option<String>) {
        let raw = match Self::read_tail(path) {
            Ok(t) => t,
            Err(why) => return (String::new(), Some(why)),
        };
        if !raw.contains(char::REPLACEMENT_CHARACTER) {
            return (raw, None);
        }
        // Find the first bad byte in the raw tail (skipping a cut character at its start).
        let bytes = std::fs::File::open(path).and_then(|mut f| {
            use std::io::{Read, Seek, SeekFrom};
            let len = f.metadata()?.len();
            f.seek(SeekFrom::Start(len.saturating_sub(16 * 1024)))?;
            let mut b = Vec::new();
            f.read_to_end(&mut b)?;
            Ok((len.saturating_sub(16 * 1024), b))
        });
        let Ok((start, b)) = bytes else {
            return (raw, None);
        };
        let skip = b.iter().take(3).take_while(|&&x| x & 0xC0 == 0x80).count();
        match std::str::from_utf8(&b[skip..]) {
            Ok(_) => (raw, None),
            Err(e) if e.error_len().is_none() => (raw, None), // cut at the end: still written
            Err(e) => {
                let at = start + (skip + e.valid_up_to()) as u64;
                (
                    raw,
                    Some(format!(
                        "{}: not UTF-8 text (invalid byte at offset {at}); decoded lossily",
                        path.display()
                    )),
                )
            }
        }
    }

    /// The line number (from 1) of the first line of the 16 KiB tail [`read_tail`] returns,
    /// counted over the part before it; 0 (unknown) when that part is over 256 MiB or cannot
    /// be read. Read only when an attempt ends, to cite its lines as `file:line`.
    ///
    /// [`read_tail`]: Self::read_tail
    pub(super) fn tail_first_line(path: &Path) -> usize {
        use std::io::Read;
        let Ok(f) = std::fs::File::open(path) else {
            return 0;
        };
        let Ok(len) = f.metadata().map(|m| m.len()) else {
            return 0;
        };
        let prefix = len.saturating_sub(16 * 1024);
        if prefix > 256 << 20 {
            return 0;
        }
        let mut lines = 1usize;
        let mut buf = vec![0u8; 64 * 1024];
        let mut r = f.take(prefix);
        loop {
            match r.read(&mut buf) {
                Ok(0) => return lines,
                Ok(n) => lines += buf[..n].iter().filter(|&&b| b == b'\n').count(),
                Err(_) => return 0,
            }
        }
    }

    /// The tails of the per-rank logs under `dir` (the unit's `logs/` folder, where a worker
    /// points e.g. `torchrun --log-dir`) modified since `since_ms` (the attempt's submit; the
    /// folder outlives attempts, an earlier attempt's logs are not this one's evidence), at
    /// most [`MAX_RANK_LOGS`] files four levels deep, in name order. An unreadable one is
    /// listed with its error as its text.
    pub(super) fn rank_logs(dir: &Path, since_ms: u64) -> Vec<(String, String)> {
        if !dir.is_dir() {
            return Vec::new();
        }
        walkdir::WalkDir::new(dir)
            .max_depth(4)
            .sort_by_file_name()
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file())
            .filter(|e| {
                // 1 s of slack for filesystems that round modification times.
                e.metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .map(crate::sys::epoch_ms)
                    .is_none_or(|t| t + 1000 >= since_ms)
            })
            .take(MAX_RANK_LOGS)
            .map(|e| {
                let name = e
                    .path()
                    .strip_prefix(dir)
                    .unwrap_or(e.path())
                    .display()
                    .to_string();
                let text =
                    Self::read_tail(e.path()).unwrap_or_else(|why| format!("unreadable: {why}"));
                (format!("rank log {name}"), text)
            })
            .collect()
    }

    /// Whether the start mark in `out` names attempt `id` (a mark an earlier attempt left
    /// names that one; an unreadable mark counts as absent).
    pub(super) fn start_mark_of(out: &Path, id: &str) -> bool {
        std::fs::read_to_string(out.join(START_MARKER))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == id))
    }

    /// Why the stage's declared outputs do not validate in `out`, if they do not: a missing
    /// output, or a validation command that failed (it runs in `out`, argv without a shell,
    /// with the attempt's environment basics, for at most [`VALIDATE_TIMEOUT`]).
    pub(super) fn outputs_problem(
        stage: &crate::campaign::StagePlan,
        out: &Path,
    ) -> Option<String> {
        if let Some(missing) = stage.worker.outputs.iter().find(|o| !out.join(o).exists()) {
            return Some(format!(
                "declared output `{missing}` is missing in {}",
                out.display()
            ));
        }
        let (prog, args) = stage.worker.validate.split_first()?;
        let mut child = match std::process::Command::new(prog)
            .args(args)
            .current_dir(out)
            .env("PUZZLETRON_OUTPUT_DIR", out)
            .env("PUZZLETRON_STAGE", &stage.stage_id)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                return Some(format!(
                    "the validation command `{}` could not start: {e}",
                    stage.worker.validate.join(" ")
                ));
            }
        };
        let t = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    let err = err.trim();
                    let tail: String = err
                        .chars()
                        .rev()
                        .take(300)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    return Some(format!(
                        "the validation command `{}` failed ({status}){}",
                        stage.worker.validate.join(" "),
                        if tail.is_empty() {
                            String::new()
                        } else {
                            format!(": {tail}")
                        }
                    ));
                }
                Ok(None) if t.elapsed() < VALIDATE_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Some(format!(
                        "the validation command `{}` did not finish within {:?}",
                        stage.worker.validate.join(" "),
                        VALIDATE_TIMEOUT
                    ));
                }
                Err(e) => {
                    return Some(format!(
                        "the validation command `{}` could not be waited for: {e}",
                        stage.worker.validate.join(" ")
                    ));
                }
            }
        }
    }

    /// The Finished + Decided entries of an attempt that ended (only Finished for one this
    /// controller cancelled). Reads the evidence here (the files it must leave, then its logs,
    /// markers and checkpoints); the verdict and the entries are [`step`]'s.
    pub(super) fn finish_entries(
        &mut self,
        a: usize,
        st: &JobStatus,
        forced: Option<(FailureClass, String)>,
    ) -> Vec<Entry> {
        let now = self.io.clock.now_ms();
        let log_path = step::log_path(&self.dir, st, &self.state.attempts[a].id);
        let verdict = match forced {
            Some((class, detail)) => step::forced_verdict(class, detail),
            None => {
                // Not visible is not missing (issue 27): a completed attempt's marker and
                // declared outputs are looked for with stat, readdir and open, and looked for
                // again on later polls (the poll interval's backoff) until the bound.
                let mut late = Vec::new();
                if st.state == JobState::Completed {
                    let looked = self.look_for_outputs(a);
                    let since = self.state.attempts[a].invisible_since_ms;
                    match step::visibility(since, now, self.settings.visibility_wait, &looked) {
                        Visibility::Wait { since_ms } => {
                            self.state.attempts[a].invisible_since_ms = Some(since_ms);
                            return Vec::new(); // looked for again on the next poll
                        }
                        Visibility::NotVisible { since_ms, detail } => {
                            self.state.attempts[a].invisible_since_ms = Some(since_ms);
                            return self.finish_entries(
                                a,
                                st,
                                Some((FailureClass::OutputNotVisible, detail)),
                            );
                        }
                        Visibility::Seen { late: l } => {
                            self.state.attempts[a].invisible_since_ms = None;
                            late = l;
                        }
                    }
                }
                let ev = self.end_evidence(a, st, &log_path);
                step::classified_verdict(&self.state, &self.settings, now, a, st, ev, &late)
            }
        };
        let ended = step::finish(
            &self.state,
            &self.plan,
            &self.settings,
            now,
            a,
            st,
            log_path,
            verdict,
        );
        for ev in &ended.notify {
            self.notify(ev);
        }
        ended.entries
    }

    /// Looks for the files completed attempt `a` must leave: the success marker (when
    /// required), then the stage's declared outputs.
    fn look_for_outputs(&self, a: usize) -> Vec<step::Looked> {
        let u = &self.state.units[self.state.attempts[a].unit];
        let stage = &self.plan.stages[u.stage];
        let out = output_dir(&self.dir, &stage.stage_id, u.item);
        let mut wanted: Vec<std::path::PathBuf> =
            stage.worker.outputs.iter().map(|o| out.join(o)).collect();
        if self.settings.require_success_marker {
            wanted.insert(0, out.join(SUCCESS_MARKER));
        }
        let hook = self.settings.visibility_hook.as_deref();
        wanted
            .iter()
            .map(|w| {
                let (visible, late) = visible(w, hook);
                step::Looked {
                    path: w.display().to_string(),
                    visible,
                    late: visible && late,
                }
            })
            .collect()
    }

    /// Reads what attempt `a`, ended with `st`, left: its log's tail, the success marker, the
    /// rank logs (failures only), the checkpoint of a resumable stage's timeout (partial ones
    /// moved aside first), the declared outputs' validation, its start mark. The run time and
    /// the fast-failure window are filled in by [`step::classified_verdict`].
    fn end_evidence(&self, a: usize, st: &JobStatus, log_path: &Path) -> Evidence {
        let at = &self.state.attempts[a];
        let u = &self.state.units[at.unit];
        let stage = &self.plan.stages[u.stage];
        let out = output_dir(&self.dir, &stage.stage_id, u.item);
        let (log_tail, log_unavailable) = Self::read_tail_checked(log_path);
        let marker = visible(
            &out.join(SUCCESS_MARKER),
            self.settings.visibility_hook.as_deref(),
        )
        .0;
        // Rank logs only decide failures (rule 6b): a success reads none. The output
        // folder outlives attempts: only logs this attempt wrote count.
        let rank_logs = if uses_rank_logs(&st.state) {
            let since = at.handle.as_ref().map_or(0, |h| h.submitted_at_ms);
            Self::rank_logs(&out.join("logs"), since)
        } else {
            Vec::new()
        };
        let completed = st.state == JobState::Completed;
        // N03: a resumable stage's timeout resumes only from a complete checkpoint;
        // partial ones are moved aside first so the resume never loads them.
        let timed_out = st.state == JobState::Timeout
            || log_tail.to_ascii_lowercase().contains("due to time limit");
        let checkpoint = if stage.worker.resumable && timed_out {
            let moved = move_partial_checkpoints_aside(&out, &at.id);
            match find_checkpoint(&out) {
                CheckpointEvidence::Found(c) if !moved.is_empty() => {
                    CheckpointEvidence::Found(format!("{c} ({})", moved.join("; ")))
                }
                c => c,
            }
        } else {
            CheckpointEvidence::NotChecked
        };
        Evidence {
            checkpoint,
            log_tail,
            log_unavailable,
            rank_logs,
            resumable: stage.worker.resumable,
            cancel_requested: at.cancel_requested,
            own_uid: self.own_uid,
            scheduler_uid: self.scheduler_uid,
            success_marker: if self.settings.require_success_marker || marker {
                Some(marker)
            } else {
                None
            },
            outputs_problem: if completed {
                Self::outputs_problem(stage, &out)
            } else {
                None
            },
            program: stage
                .work
                .items
                .get(u.item.unwrap_or(0))
                .and_then(|item| crate::campaign::item_argv(stage, item, &self.dir).ok())
                .and_then(|argv| argv.into_iter().next()),
            lookup: Some(format!(
                "PATH={} (the controller's; the job inherits it, then its setup and prerun commands change it), working directory {}",
                std::env::var("PATH").unwrap_or_default(),
                self.plan
                    .runner
                    .execution_contract
                    .repository
                    .as_ref()
                    .map_or_else(|| self.dir.display().to_string(), |r| r.to_string())
            )),
            log_first_line: Self::tail_first_line(log_path),
            log_path: Some(log_path.to_path_buf()),
            rank_dir: Some(out.join("logs")),
            start_mark: self
                .io
                .executor
                .writes_start_mark()
                .then(|| Self::start_mark_of(&out, at.id.as_str())),
            ..Evidence::default()
        }
    }

    /// Stage transitions: aggregate steps, pool queues, stage done/failed and the halt policy
    /// ([`step::stage_transition`] decides; a pool's queue is read here).
    pub(super) async fn advance_stages(&mut self) -> Result<bool, ControllerError> {
        let mut progressed = false;
        // Stage by stage, in plan order: a stage done above lets its children end below.
        for si in 0..self.state.stages.len() {
            match step::stage_transition(&self.state, &self.plan, si) {
                Transition::Stay => {}
                Transition::Failed { actions, halt } => {
                    self.perform(actions)?;
                    if halt {
                        let id = self.state.stages[si].id.clone();
                        self.halted = true;
                        let n = self.cancel_all(&format!("fail_fast: stage {id} failed"))?;
                        self.cancel_live_now().await?;
                        self.emit(ControllerEvent::Halted {
                            stage: id,
                            cancelled: n,
                        })?;
                    }
                    progressed = true;
                }
                Transition::Pool => progressed |= self.advance_pool(si).await?,
                Transition::Done(actions) => {
                    self.perform(actions)?;
                    progressed = true;
                }
            }
        }
        Ok(progressed)
    }

    /// A persistent pool's step: ended workers give their items back, then the queue's counts
    /// end the stage, restart its workers or wait (`step::pool`). Returns whether anything
    /// changed.
    pub(super) async fn advance_pool(&mut self, si: usize) -> Result<bool, ControllerError> {
        if !self.state.stages[si].pool_filled {
            return Ok(false);
        }
        let q = WorkQueue::new(queue_dir(&self.dir, &self.state.stages[si].id));
        // Workers whose attempt ended: their claimed items go back to the queue.
        let mut back = Vec::new();
        for worker in step::ended_workers(&self.state, si) {
            let (r, f) = q.requeue_worker(worker.as_str(), self.settings.max_requeues)?;
            back.push((worker, r, f));
        }
        self.perform(step::requeued(&back))?;
        let counts = q.counts()?;
        let restarts = self.counters.pool_restarts.get(&si).copied();
        let (next, kept) = step::pool_step(
            &self.state,
            si,
            &counts,
            q.dir(),
            restarts,
            self.settings.max_requeues,
        );
        if let Some(k) = kept {
            self.counters.pool_restarts.insert(si, k);
        }
        match next {
            step::PoolStep::Wait => Ok(false),
            step::PoolStep::Ended(actions) | step::PoolStep::Restart(actions) => {
                self.perform(actions)?;
                Ok(true)
            }
        }
    }
}
