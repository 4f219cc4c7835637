//! The wrapper: a forked process that starts the job and records how it ended.
//!
//! Why a fork and not `sh -c` or a helper binary: the record must say whether the job *exited
//! 137* or was *killed by signal 9*, which only the job's parent learns from `waitpid`; a
//! shell folds both into `$? = 137`. A helper binary would have to be installed next to every
//! user's program, and re-executing the user's binary needs a guard in their `main`. So a
//! *wrapper* is forked (by the fork server, `forkserver.rs`, or by the controller itself) that
//! never returns to Rust code: between `fork` and `_exit` it makes only async-signal-safe
//! system calls on memory prepared before the fork (no allocation, no locks), as POSIX
//! requires of a child of a multi-threaded process.
//!
//! ```text
//! fork server or controller
//!   --fork--> wrapper (setsid: own session; stdio -> /dev/null, log, log; the notify pipe at
//!              |        fd 3, every other fd closed; creates `started` exclusively or exits
//!              |        at once; writes `wrapper`)
//!              +--clone(CLONE_VM|CLONE_VFORK)--> job (setpgid: own process group;
//!              |           signals reset; chdir; execve(argv, envp) -- no shell)
//!              | writes `job` (pid + start ticks), tells the controller "started"
//!              | waitpid(job), enforcing the walltime (SIGTERM, grace, SIGKILL to the group)
//!              | SIGKILL to what is left of the job's group
//!              | writes `exit` (temp, fsync, rename, fsync folder), _exit(0): the notify
//!              | pipe's EOF tells the controller the record is there
//! ```
//!
//! The wrapper lives in its own session, so a Ctrl-C or the death of the controller does not
//! reach it or the job, and the `exit` record is written even when nobody waits for it.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use libc::c_int;

use crate::executor::ExecutorError;

use super::folder::{EXIT_FILE, JOB_FILE, STARTED_FILE, WRAPPER_FILE};

/// Bytes of a launch request's fixed header: magic, argv count, env count, flags, walltime
/// and grace (ms).
const HEADER: usize = 32;
const MAGIC: &[u8; 4] = b"PZW1";
const HAS_CWD: u32 = 1;
const HAS_WALLTIME: u32 = 2;

/// Everything the wrapper needs, prepared before the fork as one request: a fixed header, then
/// NUL-terminated strings (the program, the attempt folder and its record paths, the working
/// folder if any, argv, `KEY=value` env entries). One buffer so that it can cross to the fork
/// server as one message and be read there, as here, without allocating ([`View::parse`]).
#[derive(Debug)]
pub(crate) struct Prepared {
    bytes: Vec<u8>,
    /// argv + env entries: the pointer slots a [`View`] needs, besides the two NULs.
    entries: usize,
}

fn cstr_check(what: &str, bytes: &[u8]) -> Result<(), ExecutorError> {
    if bytes.contains(&0) {
        return Err(ExecutorError::InvalidSpec {
            attempt_id: None,
            field: what.into(),
            value: String::from_utf8_lossy(bytes).into_owned(),
            expected: "no NUL byte".into(),
        });
    }
    Ok(())
}

fn push_c(out: &mut Vec<u8>, what: &str, parts: &[&[u8]]) -> Result<(), ExecutorError> {
    for p in parts {
        cstr_check(what, p)?;
        out.extend_from_slice(p);
    }
    out.push(0);
    Ok(())
}

impl Prepared {
    /// Prepares a launch of `program` (an absolute or relative path, already resolved) with
    /// `argv` (argv[0] included) and the complete environment `env`.
    ///
    /// # Errors
    /// [`ExecutorError::InvalidSpec`] when a string holds a NUL byte.
    pub(crate) fn new(
        dir: &Path,
        program: &Path,
        argv: &[String],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cwd: Option<&Path>,
        walltime: Option<Duration>,
        grace: Duration,
    ) -> Result<Self, ExecutorError> {
        let mut b = Vec::with_capacity(
            HEADER
                + 512
                + argv.iter().map(|a| a.len() + 1).sum::<usize>()
                + env
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 2)
                    .sum::<usize>(),
        );
        let flags = if cwd.is_some() { HAS_CWD } else { 0 }
            | if walltime.is_some() { HAS_WALLTIME } else { 0 };
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&(argv.len() as u32).to_ne_bytes());
        b.extend_from_slice(&(env.len() as u32).to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        let wall = walltime.map_or(0, |w| w.as_millis() as u64);
        b.extend_from_slice(&wall.to_ne_bytes());
        b.extend_from_slice(&(grace.as_millis() as u64).to_ne_bytes());
        let d = dir.as_os_str().as_bytes();
        push_c(&mut b, "command.argv[0]", &[program.as_os_str().as_bytes()])?;
        push_c(&mut b, "attempt folder", &[d])?;
        for name in [
            STARTED_FILE,
            ".wrapper.tmp",
            WRAPPER_FILE,
            ".job.tmp",
            JOB_FILE,
            ".exit.tmp",
            EXIT_FILE,
        ] {
            push_c(&mut b, "attempt folder", &[d, b"/", name.as_bytes()])?;
        }
        if let Some(c) = cwd {
            push_c(&mut b, "command.cwd", &[c.as_os_str().as_bytes()])?;
        }
        for a in argv {
            push_c(&mut b, "command.argv", &[a.as_bytes()])?;
        }
        for (k, v) in env {
            push_c(&mut b, "command.env", &[k.as_bytes(), b"=", v.as_bytes()])?;
        }
        Ok(Self {
            bytes: b,
            entries: argv.len() + env.len(),
        })
    }

    /// The request as sent to the fork server.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Pointer slots a [`View`] of this request needs.
    pub(crate) fn slots(&self) -> usize {
        self.entries + 2
    }
}

/// A launch request read in place: pointers into the request's bytes and into `slots` (argv
/// and envp, each NULL-terminated). Built without allocation, so the fork server can build
/// one between `fork`s.
pub(crate) struct View<'a> {
    program: *const libc::c_char,
    dir: *const libc::c_char,
    started_path: *const libc::c_char,
    wrapper_tmp: *const libc::c_char,
    wrapper_path: *const libc::c_char,
    job_tmp: *const libc::c_char,
    job_path: *const libc::c_char,
    exit_tmp: *const libc::c_char,
    exit_path: *const libc::c_char,
    /// NULL when the job runs in the wrapper's working folder.
    cwd: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    walltime_ms: Option<u64>,
    grace_ms: u64,
    _bytes: std::marker::PhantomData<&'a [u8]>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(x)
}

/// The NUL-terminated string at `*pos`, moving `*pos` past its NUL.
fn next_str(bytes: &[u8], pos: &mut usize) -> Option<*const libc::c_char> {
    let len = bytes.get(*pos..)?.iter().position(|&c| c == 0)?;
    let p = bytes[*pos..].as_ptr().cast();
    *pos += len + 1;
    Some(p)
}

impl<'a> View<'a> {
    /// Reads a request made by [`Prepared::new`]; `None` when `bytes` is not one (bad magic,
    /// truncated, trailing bytes, no argv) or `slots` is too short (argv + env entries + 2).
    /// No allocation, no system call.
    pub(crate) fn parse(bytes: &'a [u8], slots: &'a mut [*const libc::c_char]) -> Option<Self> {
        if bytes.len() < HEADER || &bytes[..4] != MAGIC {
            return None;
        }
        let nargv = u32_at(bytes, 4) as usize;
        let nenv = u32_at(bytes, 8) as usize;
        let flags = u32_at(bytes, 12);
        if nargv == 0 || nargv.checked_add(nenv)?.checked_add(2)? > slots.len() {
            return None;
        }
        let mut pos = HEADER;
        let mut next = || next_str(bytes, &mut pos);
        // In the order `Prepared::new` writes them.
        let program = next()?;
        let dir = next()?;
        let started_path = next()?;
        let wrapper_tmp = next()?;
        let wrapper_path = next()?;
        let job_tmp = next()?;
        let job_path = next()?;
        let exit_tmp = next()?;
        let exit_path = next()?;
        let cwd = if flags & HAS_CWD != 0 {
            next()?
        } else {
            std::ptr::null()
        };
        for s in &mut slots[..nargv] {
            *s = next()?;
        }
        slots[nargv] = std::ptr::null();
        for s in &mut slots[nargv + 1..nargv + 1 + nenv] {
            *s = next()?;
        }
        slots[nargv + 1 + nenv] = std::ptr::null();
        if pos != bytes.len() {
            return None;
        }
        Some(Self {
            program,
            dir,
            started_path,
            wrapper_tmp,
            wrapper_path,
            job_tmp,
            job_path,
            exit_tmp,
            exit_path,
            cwd,
            argv: slots.as_ptr(),
            envp: slots[nargv + 1..].as_ptr(),
            walltime_ms: (flags & HAS_WALLTIME != 0).then(|| u64_at(bytes, 16)),
            grace_ms: u64_at(bytes, 24),
            _bytes: std::marker::PhantomData,
        })
    }
}

/// What the controller learns from the wrapper right after the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Launch {
    /// The job runs as `job_pid` (also its process group).
    Started { job_pid: i32 },
    /// The exec (or chdir) failed with `errno`; the wrapper recorded it and exits.
    Failed { errno: i32 },
    /// Another wrapper (or a cancel) got to the attempt first: this one exited without
    /// starting anything.
    AlreadyStarted,
    /// The wrapper died before saying anything (it was killed); nothing is known.
    WrapperDied,
}

/// A wrapper that was forked: what it reported, and its end to wait for.
#[derive(Debug)]
pub(crate) struct Wrapper {
    /// What the wrapper reported about the launch.
    pub(crate) launch: Launch,
    /// The read end of the notify pipe; the wrapper holds the write end until it exits.
    notify: std::os::fd::OwnedFd,
    /// The wrapper's pid when it is our child (forked here, not by the fork server): to reap.
    child: Option<i32>,
}

impl Wrapper {
    pub(crate) fn new(launch: Launch, notify: std::os::fd::OwnedFd, child: Option<i32>) -> Self {
        Self {
            launch,
            notify,
            child,
        }
    }

    /// Blocks until the wrapper has exited (the notify pipe's EOF), reaping it when it is our
    /// child. Its `exit` record is written by then, unless it was killed or could not set
    /// itself up (`_exit(120..=123)`): the folder then says the attempt was lost.
    pub(crate) fn wait(self) {
        use std::os::fd::AsRawFd;
        let mut sink = [0u8; 64];
        while read_full(self.notify.as_raw_fd(), &mut sink) == sink.len() {}
        if let Some(pid) = self.child {
            reap(pid);
        }
    }
}

/// The messages on a notify pipe, five bytes each: a tag and a native-endian i32. The wrapper
/// sends one of `S` (started, job pid), `D` (already started elsewhere), `E` (exec failed,
/// errno); the fork server sends `P` (wrapper forked, its pid), `F` (fork failed, errno) or
/// `X` (request refused, nothing forked), in either order with the wrapper's.
pub(crate) type Msg = [u8; 5];

/// Makes a message.
pub(crate) fn msg(tag: u8, val: i32) -> Msg {
    let v = val.to_ne_bytes();
    [tag, v[0], v[1], v[2], v[3]]
}

/// What a notify pipe said up to the wrapper's message (or EOF).
#[derive(Debug, Default)]
pub(crate) struct Said {
    /// The wrapper's message, if it sent one.
    pub(crate) launch: Option<Launch>,
    /// The fork server's message: `Ok(wrapper pid)` or `Err(errno of fork)`.
    pub(crate) server: Option<Result<i32, i32>>,
    /// The fork server could not read the request (`X`) and forked nothing.
    pub(crate) refused: bool,
}

/// Reads messages from `fd` until the wrapper's (leaving the rest, and the EOF, to
/// [`Wrapper::wait`]) or EOF.
pub(crate) fn read_said(fd: c_int) -> Said {
    let mut said = Said::default();
    loop {
        let mut m: Msg = [0; 5];
        if read_full(fd, &mut m) != m.len() {
            return said;
        }
        let val = i32::from_ne_bytes([m[1], m[2], m[3], m[4]]);
        said.launch = match m[0] {
            b'S' => Some(Launch::Started { job_pid: val }),
            b'D' => Some(Launch::AlreadyStarted),
            b'E' => Some(Launch::Failed { errno: val }),
            b'P' => {
                said.server = Some(Ok(val));
                continue;
            }
            b'F' => {
                said.server = Some(Err(val));
                return said;
            }
            b'X' => {
                said.refused = true;
                return said;
            }
            _ => return said,
        };
        return said;
    }
}

/// Opens what the wrapper's stdio will be: `/dev/null` and the log (appending, created).
pub(crate) fn stdio(log: &Path) -> Result<(std::fs::File, std::fs::File), ExecutorError> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| ExecutorError::io("opening log file", log, e))?;
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| ExecutorError::io("opening", "/dev/null", e))?;
    Ok((null, log_file))
}

/// A pipe with both ends close-on-exec: (read, write).
pub(crate) fn pipe(
    log: &Path,
) -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), ExecutorError> {
    use std::os::fd::FromRawFd;
    let mut fds = [0 as c_int; 2];
    // SAFETY: plain syscall on a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ExecutorError::io(
            "creating pipe for",
            log,
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Forks the wrapper from this process and waits (blocking) until it reports the job
/// started or failed. [`super::forkserver::launch`] is the usual way in; this is its fallback.
///
/// # Errors
/// [`ExecutorError::Io`] when a pipe, the log file or the fork fails.
pub(crate) fn launch_direct(p: &Prepared, log: &Path) -> Result<Wrapper, ExecutorError> {
    use std::os::fd::AsRawFd;
    let (null, log_file) = stdio(log)?;
    let (notify_r, notify_w) = pipe(log)?;
    let mut slots = vec![std::ptr::null(); p.slots()];
    let view = View::parse(p.bytes(), &mut slots).ok_or_else(|| ExecutorError::InvalidSpec {
        attempt_id: None,
        field: "launch request".into(),
        value: format!("{} bytes", p.bytes().len()),
        expected: "a request made by Prepared::new".into(),
    })?;
    // SAFETY: the child only runs `wrapper_main`, which is async-signal-safe (see module docs).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ExecutorError::io(
            "forking wrapper for",
            log,
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        // SAFETY: we are the forked child; never returns.
        unsafe {
            wrapper_main(
                &view,
                null.as_raw_fd(),
                log_file.as_raw_fd(),
                notify_w.as_raw_fd(),
            )
        }
    }
    drop(notify_w);
    drop(log_file);
    drop(null);
    let said = read_said(notify_r.as_raw_fd());
    Ok(Wrapper {
        launch: said.launch.unwrap_or(Launch::WrapperDied),
        notify: notify_r,
        child: Some(pid),
    })
}

/// Waits (blocking) for the wrapper `pid` to exit and reaps it.
fn reap(pid: i32) {
    let mut status = 0;
    loop {
        // SAFETY: plain syscall.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return;
        }
    }
}

/// Sends `sig` to the process group `pgid`; `false` when no such group exists any more.
pub(crate) fn signal_group(pgid: i32, sig: c_int) -> bool {
    // SAFETY: plain syscall; pgid > 1 is checked so we never signal init or everyone.
    pgid > 1 && unsafe { libc::kill(-pgid, sig) } == 0
}

// ---------------------------------------------------------------------------------------
// Everything below runs in the forked children: async-signal-safe calls only, no allocation.
// ---------------------------------------------------------------------------------------

fn read_full(fd: c_int, buf: &mut [u8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: buf[got..] is valid for writes of its length.
        let r = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if r > 0 {
            got += r as usize;
        } else if r == 0 || errno() != libc::EINTR {
            break;
        }
    }
    got
}

pub(crate) fn write_all(fd: c_int, mut buf: &[u8]) -> bool {
    while !buf.is_empty() {
        // SAFETY: buf is valid for reads of its length.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if r > 0 {
            buf = &buf[r as usize..];
        } else if r < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

fn errno() -> c_int {
    // SAFETY: __errno_location is thread-local and async-signal-safe.
    unsafe { *libc::__errno_location() }
}

/// A fixed-size text buffer (no allocation) for the records.
struct StackBuf {
    buf: [u8; 256],
    len: usize,
}

impl StackBuf {
    fn new() -> Self {
        Self {
            buf: [0; 256],
            len: 0,
        }
    }
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl core::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let b = s.as_bytes();
        if self.len + b.len() > self.buf.len() {
            return Err(core::fmt::Error);
        }
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        Ok(())
    }
}

/// The wrapper's own copy of `crate::sys::now_ms`, kept apart on purpose: this runs in the
/// forked child, where only async-signal-safe calls may be made (`clock_gettime` is one;
/// `SystemTime::now` is not promised to be).
fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn mono_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: nanosleep is async-signal-safe; an early wake-up is harmless.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Start ticks of a process from its stat file path (`/proc/self/stat` or `/proc/<pid>/stat`
/// built in a stack buffer).
fn start_ticks(stat_path: *const libc::c_char) -> u64 {
    let mut buf = [0u8; 1024];
    // SAFETY: stat_path is NUL-terminated.
    let fd = unsafe { libc::open(stat_path, libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return 0;
    }
    let n = read_full(fd, &mut buf);
    unsafe { libc::close(fd) };
    let s = &buf[..n];
    let Some(close) = s.iter().rposition(|&b| b == b')') else {
        return 0;
    };
    // fields after ')': state is field 3, starttime field 22 -> the 20th token
    let mut field = 0;
    let mut in_tok = false;
    let mut val: u64 = 0;
    for &b in &s[close + 1..] {
        if b == b' ' || b == b'\n' {
            if in_tok && field == 20 {
                return val;
            }
            in_tok = false;
        } else {
            if !in_tok {
                in_tok = true;
                field += 1;
                val = 0;
            }
            if field == 20 && b.is_ascii_digit() {
                val = val * 10 + (b - b'0') as u64;
            }
        }
    }
    if field == 20 { val } else { 0 }
}

fn proc_stat_path(pid: i32, out: &mut [u8; 64]) -> *const libc::c_char {
    use core::fmt::Write;
    let mut b = StackBuf::new();
    let _ = write!(b, "/proc/{pid}/stat\0");
    out[..b.len].copy_from_slice(b.bytes());
    out.as_ptr().cast()
}

/// Writes `bytes` to `tmp`, optionally fsyncs, renames onto `path`, fsyncs `dir`.
fn write_file_atomic(
    dir: *const libc::c_char,
    tmp: *const libc::c_char,
    path: *const libc::c_char,
    bytes: &[u8],
    durable: bool,
) -> bool {
    // SAFETY: NUL-terminated paths prepared before the fork.
    unsafe {
        let fd = libc::open(
            tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return false;
        }
        let ok = write_all(fd, bytes) && (!durable || libc::fsync(fd) == 0);
        libc::close(fd);
        if !ok || libc::rename(tmp, path) != 0 {
            return false;
        }
        if durable {
            let d = libc::open(dir, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC);
            if d >= 0 {
                libc::fsync(d);
                libc::close(d);
            }
        }
    }
    true
}

pub(crate) fn close_from(first: c_int) {
    // SAFETY: close_range(2) (Linux >= 5.9); fall back to closing one by one.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) };
    if r != 0 {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
            rl.rlim_cur.min(1 << 20) as c_int
        } else {
            4096
        };
        for fd in first..max {
            unsafe { libc::close(fd) };
        }
    }
}

/// Resets every catchable signal to its default action and unblocks all signals, so the job
/// starts as from a fresh login (Rust ignores SIGPIPE; the runtime may have handlers).
unsafe fn reset_signals() {
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        // The real-time signals too (an ignored one stays ignored across execve). glibc's
        // `signal` refuses the two it keeps for itself (32, 33), so this is the raw syscall,
        // with the kernel's `struct sigaction` (handler, flags, restorer, mask). Every field is
        // zero (SIG_DFL, no flags, empty mask), so architectures that order or size it
        // differently read the same thing, or refuse the call, which leaves the signal as is.
        #[repr(C)]
        struct KernelSigaction {
            handler: usize,
            flags: libc::c_ulong,
            restorer: usize,
            mask: u64,
        }
        let dfl = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for sig in 32..=64 {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &raw const dfl,
                std::ptr::null_mut::<KernelSigaction>(),
                std::mem::size_of::<u64>(),
            );
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Bytes of the stack the job's child runs on between `clone` and `execve`.
const SPAWN_STACK: usize = 64 * 1024;

/// What the job's child needs: the prepared job and the write end of the exec-error pipe.
struct SpawnArgs<'a> {
    p: &'a View<'a>,
    err_r: c_int,
    err_w: c_int,
}

/// Starts the job as the wrapper's child with `clone(CLONE_VM | CLONE_VFORK)` (what
/// `posix_spawn` does in glibc and musl): the child borrows the wrapper's memory until its
/// `execve`, so the wrapper's page tables, a copy of the controller's, are neither copied nor
/// torn down once per job; the wrapper sleeps meanwhile, so nothing the child writes (its own
/// stack, `errno`) races with it. Returns the child's pid, or -1 when `mmap` or `clone` fails.
///
/// # Safety
/// Called in the wrapper only (single-threaded; async-signal-safe calls, no allocation).
unsafe fn spawn_job(p: &View<'_>, err_r: c_int, err_w: c_int) -> i32 {
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            SPAWN_STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return -1;
        }
        let mut args = SpawnArgs { p, err_r, err_w };
        // The stack grows down on every architecture Linux runs Rust on but HP PA-RISC.
        let top = stack.cast::<u8>().add(SPAWN_STACK).cast::<libc::c_void>();
        let pid = libc::clone(
            job_child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw mut args).cast::<libc::c_void>(),
        );
        // The child has exec'd or exited: its stack is ours again.
        libc::munmap(stack, SPAWN_STACK);
        pid
    }
}

/// The job's child, from `clone` to `execve`: own process group, SIGPIPE back to its default
/// (the wrapper ignores it, and an ignored signal stays ignored across `execve`), the working
/// folder, then the program. On failure it sends `errno` down the exec-error pipe.
extern "C" fn job_child(arg: *mut libc::c_void) -> c_int {
    // SAFETY: `arg` is the `SpawnArgs` of `spawn_job`, alive while the wrapper waits for us
    // (CLONE_VFORK); only async-signal-safe calls follow.
    unsafe {
        let a = &*arg.cast::<SpawnArgs<'_>>();
        let p = a.p;
        // Our own descriptor table (no CLONE_FILES): this closes the read end for us only.
        libc::close(a.err_r);
        libc::setpgid(0, 0);
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        if p.cwd.is_null() || libc::chdir(p.cwd) == 0 {
            libc::execve(p.program, p.argv, p.envp);
        }
        // chdir or execve failed: the wrapper records why.
        write_all(a.err_w, &errno().to_ne_bytes());
        libc::_exit(127)
    }
}

/// The wrapper process. Never returns.
pub(crate) unsafe fn wrapper_main(
    p: &View<'_>,
    null_fd: c_int,
    log_fd: c_int,
    notify_w: c_int,
) -> ! {
    use core::fmt::Write;
    unsafe {
        libc::setsid();
        // Named for `ps` (it would otherwise show the controller's name).
        libc::prctl(libc::PR_SET_NAME, c"pzt-wrapper".as_ptr());
        reset_signals();
        // A controller that died must not kill us through a write to its closed pipe.
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        // stdio: /dev/null, log, log; the notify pipe at fd 3; everything else closed so that
        // the controller's pipes and sockets are not kept open by a detached wrapper. The
        // sources go to high numbers first so that no dup2 overwrites another source.
        let n = libc::fcntl(notify_w, libc::F_DUPFD, 10);
        let l = libc::fcntl(log_fd, libc::F_DUPFD, 10);
        let z = libc::fcntl(null_fd, libc::F_DUPFD, 10);
        if n < 0 || l < 0 || z < 0 {
            libc::_exit(120);
        }
        if libc::dup2(z, 0) < 0
            || libc::dup2(l, 1) < 0
            || libc::dup2(l, 2) < 0
            || libc::dup2(n, 3) < 0
        {
            libc::_exit(121);
        }
        let notify = 3;
        close_from(4);
        libc::fcntl(notify, libc::F_SETFD, libc::FD_CLOEXEC);

        // The one decision that keeps a job from starting twice when a launch is retaken from
        // a dead controller: only the wrapper that creates `started` goes on.
        let sfd = libc::open(
            p.started_path,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o644,
        );
        if sfd < 0 {
            let err = errno();
            if err == libc::EEXIST {
                write_all(notify, &[b'D', 0, 0, 0, 0]);
                libc::_exit(0);
            }
            let mut r = StackBuf::new();
            let t = now_ms();
            let _ = write!(
                r,
                "status=launch_failed\nerrno={err}\nstart_ms={t}\nend_ms={t}\n"
            );
            write_file_atomic(p.dir, p.exit_tmp, p.exit_path, r.bytes(), true);
            let mut m = [b'E', 0, 0, 0, 0];
            m[1..].copy_from_slice(&err.to_ne_bytes());
            write_all(notify, &m);
            libc::_exit(0);
        }
        libc::close(sfd);

        let me = libc::getpid();
        let mut b = StackBuf::new();
        let _ = writeln!(b, "{me} {}", start_ticks(c"/proc/self/stat".as_ptr()));
        write_file_atomic(p.dir, p.wrapper_tmp, p.wrapper_path, b.bytes(), false);

        // exec-error pipe: CLOEXEC, so EOF means the exec succeeded
        let mut efd = [0 as c_int; 2];
        if libc::pipe2(efd.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            libc::_exit(122);
        }
        let start_ms = now_ms();
        let child = spawn_job(p, efd[0], efd[1]);
        if child < 0 {
            libc::_exit(123);
        }
        // The child set its group before its execve, and CLONE_VFORK held us until then, so a
        // signal sent right after "started" reaches the group (the setpgid race of
        // setpgid(2) cannot happen; this call fails with EACCES after the execve and is kept
        // for the exec-error path, where the child has exited).
        libc::setpgid(child, child);
        libc::close(efd[1]);
        let mut eb = [0u8; 4];
        let n = read_full(efd[0], &mut eb);
        libc::close(efd[0]);
        if n == 4 {
            let err = i32::from_ne_bytes(eb);
            let mut st = 0;
            libc::waitpid(child, &mut st, 0);
            let mut r = StackBuf::new();
            let _ = write!(
                r,
                "status=launch_failed\nerrno={err}\nstart_ms={start_ms}\nend_ms={}\n",
                now_ms()
            );
            write_file_atomic(p.dir, p.exit_tmp, p.exit_path, r.bytes(), true);
            let mut m = [b'E', 0, 0, 0, 0];
            m[1..].copy_from_slice(&err.to_ne_bytes());
            write_all(notify, &m);
            libc::_exit(0);
        }
        let mut stat_buf = [0u8; 64];
        let ticks = start_ticks(proc_stat_path(child, &mut stat_buf));
        let mut j = StackBuf::new();
        let _ = writeln!(j, "{child} {ticks}");
        write_file_atomic(p.dir, p.job_tmp, p.job_path, j.bytes(), false);
        let mut m = [b'S', 0, 0, 0, 0];
        m[1..].copy_from_slice(&child.to_ne_bytes());
        write_all(notify, &m);
        // `notify` stays open until we exit: its EOF tells the controller the `exit` record
        // is written (it is close-on-exec, so the job does not hold it).

        let (status, timed_out) = wait_job(child, p.walltime_ms, p.grace_ms);
        // Like Slurm, a job's processes end with the job.
        libc::kill(-child, libc::SIGKILL);
        let end_ms = now_ms();
        let mut r = StackBuf::new();
        if libc::WIFSIGNALED(status) {
            let _ = write!(r, "status=signaled\nsignal={}\n", libc::WTERMSIG(status));
        } else {
            let _ = write!(r, "status=exited\ncode={}\n", libc::WEXITSTATUS(status));
        }
        let _ = write!(
            r,
            "timeout={}\nstart_ms={start_ms}\nend_ms={end_ms}\n",
            timed_out as u8
        );
        write_file_atomic(p.dir, p.exit_tmp, p.exit_path, r.bytes(), true);
        libc::_exit(0)
    }
}

/// Waits for `child`; with a walltime, sends SIGTERM to its group at the limit and SIGKILL
/// `grace_ms` later. Returns the wait status and whether the walltime was hit.
unsafe fn wait_job(child: i32, walltime_ms: Option<u64>, grace_ms: u64) -> (c_int, bool) {
    let mut status: c_int = 0;
    unsafe {
        let Some(limit) = walltime_ms else {
            loop {
                let r = libc::waitpid(child, &mut status, 0);
                if r == child || (r < 0 && errno() != libc::EINTR) {
                    return (status, false);
                }
            }
        };
        let start = mono_ms();
        let mut timed_out = false;
        let mut killed = false;
        let mut nap = 1;
        loop {
            let r = libc::waitpid(child, &mut status, libc::WNOHANG);
            if r == child || (r < 0 && errno() != libc::EINTR) {
                return (status, timed_out);
            }
            let elapsed = mono_ms() - start;
            if !timed_out && elapsed >= limit {
                timed_out = true;
                libc::kill(-child, libc::SIGTERM);
            } else if timed_out && !killed && elapsed >= limit + grace_ms {
                killed = true;
                libc::kill(-child, libc::SIGKILL);
            }
            sleep_ms(nap);
            nap = (nap * 2).min(50);
        }
    }
}

#[cfg(test)]
impl Prepared {
    /// A launch of `/bin/sh -c script` for attempt folder `dir`, with `PATH` and `extra_env`.
    pub(crate) fn sh(
        dir: &Path,
        script: &str,
        extra_env: &[(std::ffi::OsString, std::ffi::OsString)],
    ) -> Self {
        let argv = ["sh".to_string(), "-c".into(), script.to_string()];
        let mut env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        env.extend_from_slice(extra_env);
        Self::new(
            dir,
            Path::new("/bin/sh"),
            &argv,
            &env,
            None,
            None,
            Duration::from_secs(1),
        )
        .expect("a valid request")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_matches_proc_parser() {
        let me = std::process::id() as i32;
        assert_eq!(
            Some(start_ticks(c"/proc/self/stat".as_ptr())),
            super::super::folder::proc_start_ticks(me)
        );
        let mut b = [0u8; 64];
        assert_eq!(
            Some(start_ticks(proc_stat_path(me, &mut b))),
            super::super::folder::proc_start_ticks(me)
        );
    }

    #[test]
    fn only_the_wrapper_that_creates_started_runs_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let marker = d.join("ran");
        let p = Prepared::sh(d, &format!("echo ran >> '{}'", marker.display()), &[]);
        let log = d.join("log");
        let first = launch_direct(&p, &log).unwrap();
        assert!(
            matches!(first.launch, Launch::Started { .. }),
            "first launch: {first:?}"
        );
        first.wait();
        // A second wrapper for the same folder (a launch retaken from a controller thought
        // dead) must stand down.
        let second = launch_direct(&p, &log).unwrap();
        assert_eq!(second.launch, Launch::AlreadyStarted, "second launch");
        second.wait();
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
        assert!(d.join(EXIT_FILE).exists());
    }

    #[test]
    fn a_request_reads_back_whole_and_nothing_else_parses() {
        let argv = ["prog".to_string(), "a b".into(), String::new()];
        let env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            vec![("K".into(), "v=1".into()), ("EMPTY".into(), "".into())];
        let p = Prepared::new(
            Path::new("/att/x"),
            Path::new("/bin/prog"),
            &argv,
            &env,
            Some(Path::new("/work")),
            Some(Duration::from_millis(90_061)),
            Duration::from_millis(2500),
        )
        .unwrap();
        let s = |c: *const libc::c_char| {
            // SAFETY: every pointer of a parsed view is a NUL-terminated string in the request.
            unsafe { std::ffi::CStr::from_ptr(c) }
                .to_str()
                .unwrap()
                .to_string()
        };
        let list = |mut c: *const *const libc::c_char| {
            let mut out = Vec::new();
            // SAFETY: argv and envp are NULL-terminated arrays of such strings.
            unsafe {
                while !(*c).is_null() {
                    out.push(s(*c));
                    c = c.add(1);
                }
            }
            out
        };
        let mut slots = vec![std::ptr::null(); p.slots()];
        let v = View::parse(p.bytes(), &mut slots).unwrap();
        assert_eq!(s(v.program), "/bin/prog");
        assert_eq!(s(v.dir), "/att/x");
        assert_eq!(s(v.started_path), "/att/x/started");
        assert_eq!(s(v.exit_tmp), "/att/x/.exit.tmp");
        assert_eq!(s(v.exit_path), format!("/att/x/{EXIT_FILE}"));
        assert_eq!(s(v.job_path), format!("/att/x/{JOB_FILE}"));
        assert_eq!(s(v.wrapper_path), format!("/att/x/{WRAPPER_FILE}"));
        assert_eq!(s(v.cwd), "/work");
        assert_eq!(list(v.argv), ["prog", "a b", ""]);
        assert_eq!(list(v.envp), ["K=v=1", "EMPTY="]);
        assert_eq!((v.walltime_ms, v.grace_ms), (Some(90_061), 2500));

        let q = Prepared::new(
            Path::new("/d"),
            Path::new("p"),
            &["p".to_string()],
            &[],
            None,
            None,
            Duration::ZERO,
        )
        .unwrap();
        let mut slots = vec![std::ptr::null(); q.slots()];
        let v = View::parse(q.bytes(), &mut slots).unwrap();
        assert!(v.cwd.is_null());
        assert_eq!(v.walltime_ms, None);
        assert_eq!(list(v.envp), Vec::<String>::new());

        // Cut anywhere, extended, with a wrong magic or too few slots: never a view.
        let b = p.bytes();
        let mut slots = vec![std::ptr::null(); p.slots()];
        for cut in 0..b.len() {
            assert!(View::parse(&b[..cut], &mut slots).is_none(), "cut at {cut}");
        }
        let mut longer = b.to_vec();
        longer.extend_from_slice(b"x\0");
        assert!(View::parse(&longer, &mut slots).is_none());
        let mut bad = b.to_vec();
        bad[0] = b'Q';
        assert!(View::parse(&bad, &mut slots).is_none());
        let mut few = vec![std::ptr::null(); p.slots() - 1];
        assert!(View::parse(b, &mut few).is_none());
        // A NUL inside a string is refused when the request is made.
        let e = Prepared::new(
            Path::new("/d"),
            Path::new("p"),
            &["p\0q".to_string()],
            &[],
            None,
            None,
            Duration::ZERO,
        )
        .unwrap_err();
        assert!(e.to_string().contains("command.argv"), "{e}");
    }
}
