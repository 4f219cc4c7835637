//! The attempt folder of the local executor: its files, crash-safe writes, and reading back
//! the state a (possibly dead) wrapper left behind.
//!
//! Layout of `<root>/<attempt id>/`:
//!
//! | file | written by | when | content |
//! | --- | --- | --- | --- |
//! | `attempt.json` | controller | submit (atomic) | the [`AttemptSpec`] and submit time |
//! | `launching` | controller | start, `O_EXCL` (the claim; retaken if its controller died before `started`) | `<ms since epoch> <pid> <start ticks>` of the controller |
//! | `launch.json` | controller | right before the wrapper starts | the [`Rendering`](crate::executor::Rendering) it runs and its GPU ids (`LocalExecutor::launch_record`) |
//! | `started` | wrapper, or a cancel before start | first thing after fork, `O_EXCL` (decides who runs the job) | empty, or `cancelled` |
//! | `wrapper` | wrapper | right after `started` | `<pid> <start ticks>` |
//! | `job` | wrapper | after a successful exec | `<pid> <start ticks>` (pid = process group) |
//! | `cancel` | controller | cancel requested | ms since epoch |
//! | `exit` | wrapper (or controller when cancelled before start) | end (atomic, fsync) | `key=value` lines |
//! | `output.log` | the job | while running | stdout + stderr |
//!
//! Start ticks are field 22 of `/proc/<pid>/stat` (clock ticks since boot), so a recycled pid
//! is never mistaken for the job (proc(5)).

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::executor::{AttemptSpec, ExecutorError};

/// File names inside an attempt folder.
pub(crate) const ATTEMPT_FILE: &str = "attempt.json";
pub(crate) const LAUNCHING_FILE: &str = "launching";
/// Created exclusively by the wrapper before it starts the job: whichever wrapper creates it
/// runs the job, so a launch retaken from a dead controller never runs the job twice.
pub(crate) const STARTED_FILE: &str = "started";
pub(crate) const WRAPPER_FILE: &str = "wrapper";
pub(crate) const JOB_FILE: &str = "job";
pub(crate) const CANCEL_FILE: &str = "cancel";
pub(crate) const EXIT_FILE: &str = "exit";
pub(crate) const LOG_FILE: &str = "output.log";
/// The launch record: the rendering the job was started from and its GPUs (written before the
/// wrapper is started, replaced by a retaken launch).
pub(crate) const LAUNCH_FILE: &str = "launch.json";
/// The job's memory-cgroup counter file and its counters when the job started (N09).
pub(crate) const OOM_BEFORE_FILE: &str = "oom.before";
/// The same counters read once after the job ended (kept, so the verdict never changes).
pub(crate) const OOM_AFTER_FILE: &str = "oom.after";

/// What `attempt.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AttemptRecord {
    /// Format version of this file.
    pub version: u32,
    /// Submission time, ms since the epoch.
    pub submitted_at_ms: u64,
    /// The spec as submitted.
    pub spec: AttemptSpec,
}

/// How the job ended, as recorded in `exit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExitKind {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by a signal.
    Signaled(i32),
    /// `execve` (or `chdir`) failed with this errno.
    LaunchFailed(i32),
    /// Cancelled before it was started.
    CancelledBeforeStart,
}

/// The parsed `exit` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ExitRecord {
    pub kind: ExitKind,
    /// The wrapper killed it for exceeding its walltime.
    pub timed_out: bool,
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
}

/// Writes `bytes` to `dir/name` crash-safely: temp file, fsync, rename, fsync the folder.
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ExecutorError> {
    let path = dir.join(name);
    crate::fsutil::atomic_write(&path, bytes).map_err(|e| ExecutorError::io("writing", &path, e))
}

/// Writes `bytes` to `dir/name` atomically (temp file, rename) but without fsync: for files
/// that describe processes of this machine, which do not survive an OS crash anyway (a
/// process crash keeps the page cache). The `exit` record, the one result that must survive
/// a power loss, uses [`write_atomic`].
pub(crate) fn write_replace(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), ExecutorError> {
    let path = dir.join(name);
    crate::fsutil::replace_file(&path, bytes).map_err(|e| ExecutorError::io("writing", &path, e))
}

/// Creates `dir/name` only if it does not exist; `Ok(false)` when it did (someone else holds
/// the claim). Not fsynced: claims are between processes of this machine.
pub(crate) fn create_exclusive(
    dir: &Path,
    name: &str,
    content: &str,
) -> Result<bool, ExecutorError> {
    let path = dir.join(name);
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(content.as_bytes())
                .map_err(|e| ExecutorError::io("writing", &path, e))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(ExecutorError::io("creating", &path, e)),
    }
}

/// Reads an optional small text file; `Ok(None)` when it does not exist.
pub(crate) fn read_opt(path: &Path) -> Result<Option<String>, ExecutorError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ExecutorError::io("reading", path, e)),
    }
}

fn parse_err(path: &Path, detail: String, output: &str) -> ExecutorError {
    ExecutorError::Parse {
        command: format!("read {}", path.display()),
        detail,
        output: output.to_string(),
    }
}

/// Reads `attempt.json`; `Ok(None)` when absent.
pub(crate) fn read_attempt(dir: &Path) -> Result<Option<AttemptRecord>, ExecutorError> {
    let path = dir.join(ATTEMPT_FILE);
    let Some(text) = read_opt(&path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| parse_err(&path, format!("invalid attempt record: {e}"), &text))
}

/// Reads a `<pid> <start ticks>` file; `Ok(None)` when absent.
pub(crate) fn read_pid_file(path: &Path) -> Result<Option<(i32, u64)>, ExecutorError> {
    let Some(text) = read_opt(path)? else {
        return Ok(None);
    };
    let mut it = text.split_whitespace();
    let pid = it.next().and_then(|p| p.parse::<i32>().ok());
    let ticks = it.next().and_then(|t| t.parse::<u64>().ok());
    match (pid, ticks) {
        (Some(p), Some(t)) if p > 0 => Ok(Some((p, t))),
        _ => Err(parse_err(
            path,
            "expected `<pid> <start ticks>`".into(),
            &text,
        )),
    }
}

/// Parses an `exit` record (`status=...`, `code=`, `signal=`, `errno=`, `timeout=`,
/// `start_ms=`, `end_ms=` lines).
pub(crate) fn parse_exit(path: &Path, text: &str) -> Result<ExitRecord, ExecutorError> {
    let mut status = None;
    let (mut code, mut signal, mut errno) = (None, None, None);
    let mut rec = ExitRecord {
        kind: ExitKind::CancelledBeforeStart,
        timed_out: false,
        start_ms: None,
        end_ms: None,
    };
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(parse_err(
                path,
                format!("line {}: expected key=value", n + 1),
                line,
            ));
        };
        let int = || {
            v.parse::<i64>().map_err(|_| {
                parse_err(
                    path,
                    format!("line {}: `{k}` is not an integer", n + 1),
                    line,
                )
            })
        };
        match k {
            "status" => status = Some(v.to_string()),
            "code" => code = Some(int()? as i32),
            "signal" => signal = Some(int()? as i32),
            "errno" => errno = Some(int()? as i32),
            "timeout" => rec.timed_out = int()? != 0,
            "start_ms" => rec.start_ms = Some(int()? as u64),
            "end_ms" => rec.end_ms = Some(int()? as u64),
            _ => {} // unknown keys are tolerated: newer writers may add some
        }
    }
    rec.kind = match (status.as_deref(), code, signal, errno) {
        (Some("exited"), Some(c), _, _) => ExitKind::Exited(c),
        (Some("signaled"), _, Some(s), _) => ExitKind::Signaled(s),
        (Some("launch_failed"), _, _, Some(e)) => ExitKind::LaunchFailed(e),
        (Some("cancelled_before_start"), _, _, _) => ExitKind::CancelledBeforeStart,
        _ => {
            return Err(parse_err(
                path,
                "expected status=exited+code, signaled+signal, launch_failed+errno or \
                 cancelled_before_start"
                    .into(),
                text,
            ));
        }
    };
    Ok(rec)
}

/// Reads the `exit` record; `Ok(None)` when absent.
pub(crate) fn read_exit(dir: &Path) -> Result<Option<ExitRecord>, ExecutorError> {
    let path = dir.join(EXIT_FILE);
    match read_opt(&path)? {
        None => Ok(None),
        Some(text) => parse_exit(&path, &text).map(Some),
    }
}

/// The start time (clock ticks since boot, field 22 of `/proc/<pid>/stat`) of a live,
/// non-zombie process; `None` when there is no such process.
pub(crate) fn proc_start_ticks(pid: i32) -> Option<u64> {
    crate::sys::process_start_ticks(u32::try_from(pid).ok()?)
}

/// A launch claim (`launching`): when it was made and, when recorded, by which process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchClaim {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The claiming process: pid and start ticks.
    pub claimer: Option<(i32, u64)>,
}

impl LaunchClaim {
    /// A claim by this process, now.
    pub(crate) fn mine(now_ms: u64) -> Self {
        // This process's identity does not change: read `/proc/self/stat` once, not per launch.
        static ME: std::sync::OnceLock<Option<(i32, u64)>> = std::sync::OnceLock::new();
        let claimer = *ME.get_or_init(|| {
            let pid = std::process::id() as i32;
            proc_start_ticks(pid).map(|t| (pid, t))
        });
        Self {
            at_ms: now_ms,
            claimer,
        }
    }

    /// The file's text: `<ms> [<pid> <start ticks>]`.
    pub(crate) fn text(&self) -> String {
        match self.claimer {
            Some((pid, ticks)) => format!("{} {pid} {ticks}\n", self.at_ms),
            None => format!("{}\n", self.at_ms),
        }
    }

    /// Reads `dir/launching`; `None` when absent. Text that does not parse (its creator is
    /// between create and write, or died there) is dated by the file's mtime, claimer unknown.
    pub(crate) fn read(dir: &Path) -> Result<Option<Self>, ExecutorError> {
        let path = dir.join(LAUNCHING_FILE);
        let Some(text) = read_opt(&path)? else {
            return Ok(None);
        };
        let mut it = text.split_whitespace();
        let at_ms = it.next().and_then(|t| t.parse::<u64>().ok());
        let pid = it.next().and_then(|p| p.parse::<i32>().ok());
        let ticks = it.next().and_then(|t| t.parse::<u64>().ok());
        let at_ms = at_ms.unwrap_or_else(|| crate::sys::mtime_ms(&path).unwrap_or(0));
        let claimer = match (pid, ticks) {
            (Some(p), Some(t)) if p > 0 => Some((p, t)),
            _ => None,
        };
        Ok(Some(Self { at_ms, claimer }))
    }

    /// Whether the claimer is known to be dead.
    pub(crate) fn claimer_dead(&self) -> bool {
        self.claimer
            .is_some_and(|(pid, ticks)| !is_same_process_alive(pid, ticks))
    }

    /// Whether this claim (of the attempt folder `dir`) was made by a controller that died
    /// before any wrapper got as far as `started`: the job never ran, and may be launched again.
    pub(crate) fn abandoned(&self, dir: &Path) -> bool {
        self.claimer_dead()
            && !dir.join(STARTED_FILE).exists()
            && !dir.join(WRAPPER_FILE).exists()
            && !dir.join(EXIT_FILE).exists()
    }
}

/// Claims the launch of the attempt in `dir` for this process: a fresh claim, or one retaken
/// from a controller that died before its job started (if that controller's wrapper is
/// starting after all, the exclusive `started` decides who runs the job). `false`: another
/// live controller holds it, or the job started.
pub(crate) fn claim_launch(dir: &Path, now_ms: u64) -> Result<bool, ExecutorError> {
    let claim = LaunchClaim::mine(now_ms).text();
    if create_exclusive(dir, LAUNCHING_FILE, &claim)? {
        return Ok(true);
    }
    if !LaunchClaim::read(dir)?.is_some_and(|c| c.abandoned(dir)) {
        return Ok(false);
    }
    write_replace(dir, LAUNCHING_FILE, claim.as_bytes())?;
    Ok(true)
}

/// Whether the process `pid` is alive and is the one that started at `ticks`.
pub(crate) fn is_same_process_alive(pid: i32, ticks: u64) -> bool {
    proc_start_ticks(pid) == Some(ticks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_records_parse() {
        let p = Path::new("/x/exit");
        let r = parse_exit(
            p,
            "status=exited\ncode=3\ntimeout=0\nstart_ms=5\nend_ms=9\n",
        )
        .unwrap();
        assert_eq!(r.kind, ExitKind::Exited(3));
        assert_eq!(
            (r.start_ms, r.end_ms, r.timed_out),
            (Some(5), Some(9), false)
        );
        let r = parse_exit(p, "status=signaled\nsignal=9\ntimeout=1\n").unwrap();
        assert_eq!((r.kind, r.timed_out), (ExitKind::Signaled(9), true));
        let r = parse_exit(p, "status=launch_failed\nerrno=2\n").unwrap();
        assert_eq!(r.kind, ExitKind::LaunchFailed(2));
        let e = parse_exit(p, "status=exited\n").unwrap_err().to_string();
        assert!(
            e.contains("/x/exit") && e.contains("expected status=exited+code"),
            "{e}"
        );
        let e = parse_exit(p, "status=exited\ncode=x\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("code"), "{e}");
    }

    #[test]
    fn own_process_start_ticks() {
        let me = std::process::id() as i32;
        let t = proc_start_ticks(me).expect("own stat");
        assert!(is_same_process_alive(me, t));
        assert!(!is_same_process_alive(me, t + 1));
    }
}
