//! The wrapper: a forked copy of the controller that starts the job and records how it ended.
//!
//! Why a fork and not `sh -c` or a helper binary: the record must say whether the job *exited
//! 137* or was *killed by signal 9*, which only the job's parent learns from `waitpid`; a
//! shell folds both into `$? = 137`. A helper binary would have to be installed next to every
//! user's program, and re-executing the user's binary needs a guard in their `main`. So the
//! controller forks a *wrapper* that never returns to Rust code: between `fork` and `_exit` it
//! makes only async-signal-safe system calls on memory prepared before the fork (no
//! allocation, no locks), as POSIX requires of a child of a multi-threaded process.
//!
//! ```text
//! controller --fork--> wrapper (setsid: own session; stdio -> /dev/null, log, log;
//!                       |        every other fd closed; creates `started` exclusively or
//!                       |        exits at once; writes `wrapper`)
//!                       +--clone(CLONE_VM|CLONE_VFORK)--> job (setpgid: own process group;
//!                       |           signals reset; chdir; execve(argv, envp) -- no shell)
//!                       | writes `job` (pid + start ticks), tells the controller "started"
//!                       | waitpid(job), enforcing the walltime (SIGTERM, grace, SIGKILL to the group)
//!                       | SIGKILL to what is left of the job's group
//!                       | writes `exit` (temp, fsync, rename, fsync folder), _exit(0)
//! ```
//!
//! The wrapper lives in its own session, so a Ctrl-C or the death of the controller does not
//! reach it or the job, and the `exit` record is written even when nobody waits for it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use libc::c_int;

use crate::executor::ExecutorError;

use super::folder::{EXIT_FILE, JOB_FILE, STARTED_FILE, WRAPPER_FILE};

/// Everything the wrapper needs, allocated before the fork.
pub(crate) struct Prepared {
    program: CString,
    _argv: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    _envp: Vec<CString>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: Option<CString>,
    dir: CString,
    started_path: CString,
    wrapper_tmp: CString,
    wrapper_path: CString,
    job_tmp: CString,
    job_path: CString,
    exit_tmp: CString,
    exit_path: CString,
    proc_self_stat: CString,
    walltime_ms: Option<u64>,
    grace_ms: u64,
}

// The raw pointers point into the CStrings owned by the same struct.
unsafe impl Send for Prepared {}

fn cstr(what: &str, bytes: &[u8]) -> Result<CString, ExecutorError> {
    CString::new(bytes).map_err(|_| ExecutorError::InvalidSpec {
        attempt_id: None,
        field: what.into(),
        value: String::from_utf8_lossy(bytes).into_owned(),
        expected: "no NUL byte".into(),
    })
}

fn path_c(what: &str, p: &Path) -> Result<CString, ExecutorError> {
    cstr(what, p.as_os_str().as_bytes())
}

impl Prepared {
    /// Prepares a launch of `program` (an absolute or relative path, already resolved) with
    /// `argv` (argv[0] included) and the complete environment `env`.
    pub(crate) fn new(
        dir: &Path,
        program: &Path,
        argv: &[String],
        env: &[(std::ffi::OsString, std::ffi::OsString)],
        cwd: Option<&Path>,
        walltime: Option<Duration>,
        grace: Duration,
    ) -> Result<Self, ExecutorError> {
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| cstr("command.argv", a.as_bytes()))
            .collect::<Result<_, _>>()?;
        let envp: Vec<CString> = env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                cstr("command.env", &kv)
            })
            .collect::<Result<_, _>>()?;
        let mut argv_ptrs: Vec<_> = argv.iter().map(|c| c.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut envp_ptrs: Vec<_> = envp.iter().map(|c| c.as_ptr()).collect();
        envp_ptrs.push(std::ptr::null());
        Ok(Self {
            program: path_c("command.argv[0]", program)?,
            _argv: argv,
            argv_ptrs,
            _envp: envp,
            envp_ptrs,
            cwd: cwd.map(|c| path_c("command.cwd", c)).transpose()?,
            dir: path_c("attempt folder", dir)?,
            started_path: path_c("attempt folder", &dir.join(STARTED_FILE))?,
            wrapper_tmp: path_c("attempt folder", &dir.join(".wrapper.tmp"))?,
            wrapper_path: path_c("attempt folder", &dir.join(WRAPPER_FILE))?,
            job_tmp: path_c("attempt folder", &dir.join(".job.tmp"))?,
            job_path: path_c("attempt folder", &dir.join(JOB_FILE))?,
            exit_tmp: path_c("attempt folder", &dir.join(".exit.tmp"))?,
            exit_path: path_c("attempt folder", &dir.join(EXIT_FILE))?,
            proc_self_stat: cstr("proc", b"/proc/self/stat")?,
            walltime_ms: walltime.map(|w| w.as_millis() as u64),
            grace_ms: grace.as_millis() as u64,
        })
    }
}

/// What the controller learns from the wrapper right after the launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Launch {
    /// The job runs as `pid` (also its process group).
    Started { wrapper_pid: i32, job_pid: i32 },
    /// The exec (or chdir) failed with `errno`; the wrapper recorded it and exits.
    Failed { wrapper_pid: i32, errno: i32 },
    /// Another wrapper (or a cancel) got to the attempt first: this one exited without
    /// starting anything.
    AlreadyStarted { wrapper_pid: i32 },
    /// The wrapper died before saying anything (it was killed); nothing is known.
    WrapperDied { wrapper_pid: i32 },
}

/// Forks the wrapper and waits (blocking) until it reports the job started or failed.
/// The caller must later reap `wrapper_pid` with [`reap`].
///
/// # Errors
/// [`ExecutorError::Io`] when a pipe, the log file or the fork fails.
pub(crate) fn launch(p: &Prepared, log: &Path) -> Result<Launch, ExecutorError> {
    use std::os::fd::AsRawFd;
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| ExecutorError::io("opening log file", log, e))?;
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| ExecutorError::io("opening", "/dev/null", e))?;
    let mut fds = [0 as c_int; 2];
    // SAFETY: plain syscall on a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ExecutorError::io(
            "creating pipe for",
            log,
            std::io::Error::last_os_error(),
        ));
    }
    let (notify_r, notify_w) = (fds[0], fds[1]);
    // SAFETY: the child only runs `wrapper_main`, which is async-signal-safe (see module docs).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        unsafe {
            libc::close(notify_r);
            libc::close(notify_w);
        }
        return Err(ExecutorError::io("forking wrapper for", log, e));
    }
    if pid == 0 {
        // SAFETY: we are the forked child; never returns.
        unsafe { wrapper_main(p, null.as_raw_fd(), log_file.as_raw_fd(), notify_w) }
    }
    unsafe { libc::close(notify_w) };
    drop(log_file);
    drop(null);
    let mut msg = [0u8; 5];
    let n = read_full(notify_r, &mut msg);
    unsafe { libc::close(notify_r) };
    let val = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
    Ok(match (n, msg[0]) {
        (5, b'S') => Launch::Started {
            wrapper_pid: pid,
            job_pid: val,
        },
        (5, b'D') => Launch::AlreadyStarted { wrapper_pid: pid },
        (5, b'E') => Launch::Failed {
            wrapper_pid: pid,
            errno: val,
        },
        _ => Launch::WrapperDied { wrapper_pid: pid },
    })
}

/// Waits (blocking) for the wrapper `pid` to exit and reaps it.
pub(crate) fn reap(pid: i32) {
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

fn write_all(fd: c_int, mut buf: &[u8]) -> bool {
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
    dir: &CString,
    tmp: &CString,
    path: &CString,
    bytes: &[u8],
    durable: bool,
) -> bool {
    // SAFETY: NUL-terminated paths prepared before the fork.
    unsafe {
        let fd = libc::open(
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        );
        if fd < 0 {
            return false;
        }
        let ok = write_all(fd, bytes) && (!durable || libc::fsync(fd) == 0);
        libc::close(fd);
        if !ok || libc::rename(tmp.as_ptr(), path.as_ptr()) != 0 {
            return false;
        }
        if durable {
            let d = libc::open(
                dir.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            );
            if d >= 0 {
                libc::fsync(d);
                libc::close(d);
            }
        }
    }
    true
}

fn close_from(first: c_int) {
    // SAFETY: close_range(2) (Linux >= 5.9); fall back to closing one by one.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first as u32, u32::MAX, 0u32) };
    if r != 0 {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        let max = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
            rl.rlim_cur.min(65536) as c_int
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
    p: &'a Prepared,
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
unsafe fn spawn_job(p: &Prepared, err_r: c_int, err_w: c_int) -> i32 {
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
        if p.cwd
            .as_ref()
            .is_none_or(|cwd| libc::chdir(cwd.as_ptr()) == 0)
        {
            libc::execve(
                p.program.as_ptr(),
                p.argv_ptrs.as_ptr(),
                p.envp_ptrs.as_ptr(),
            );
        }
        // chdir or execve failed: the wrapper records why.
        write_all(a.err_w, &errno().to_ne_bytes());
        libc::_exit(127)
    }
}

/// The wrapper process. Never returns.
unsafe fn wrapper_main(p: &Prepared, null_fd: c_int, log_fd: c_int, notify_w: c_int) -> ! {
    use core::fmt::Write;
    unsafe {
        libc::setsid();
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
            p.started_path.as_ptr(),
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
            write_file_atomic(&p.dir, &p.exit_tmp, &p.exit_path, r.bytes(), true);
            let mut m = [b'E', 0, 0, 0, 0];
            m[1..].copy_from_slice(&err.to_ne_bytes());
            write_all(notify, &m);
            libc::_exit(0);
        }
        libc::close(sfd);

        let me = libc::getpid();
        let mut b = StackBuf::new();
        let _ = writeln!(b, "{me} {}", start_ticks(p.proc_self_stat.as_ptr()));
        write_file_atomic(&p.dir, &p.wrapper_tmp, &p.wrapper_path, b.bytes(), false);

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
            write_file_atomic(&p.dir, &p.exit_tmp, &p.exit_path, r.bytes(), true);
            let mut m = [b'E', 0, 0, 0, 0];
            m[1..].copy_from_slice(&err.to_ne_bytes());
            write_all(notify, &m);
            libc::_exit(0);
        }
        let mut stat_buf = [0u8; 64];
        let ticks = start_ticks(proc_stat_path(child, &mut stat_buf));
        let mut j = StackBuf::new();
        let _ = writeln!(j, "{child} {ticks}");
        write_file_atomic(&p.dir, &p.job_tmp, &p.job_path, j.bytes(), false);
        let mut m = [b'S', 0, 0, 0, 0];
        m[1..].copy_from_slice(&child.to_ne_bytes());
        write_all(notify, &m);
        libc::close(notify);

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
        write_file_atomic(&p.dir, &p.exit_tmp, &p.exit_path, r.bytes(), true);
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
mod tests {
    use super::*;

    #[test]
    fn start_ticks_matches_proc_parser() {
        let me = std::process::id() as i32;
        let c = CString::new("/proc/self/stat").unwrap();
        assert_eq!(
            Some(start_ticks(c.as_ptr())),
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
        let script = format!("echo ran >> '{}'", marker.display());
        let argv = ["sh".to_string(), "-c".into(), script];
        let env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
            vec![("PATH".into(), "/usr/bin:/bin".into())];
        let p = Prepared::new(
            d,
            Path::new("/bin/sh"),
            &argv,
            &env,
            None,
            None,
            Duration::from_secs(1),
        )
        .unwrap();
        let log = d.join("log");
        let first = launch(&p, &log).unwrap();
        let Launch::Started { wrapper_pid, .. } = first else {
            panic!("first launch: {first:?}");
        };
        reap(wrapper_pid);
        // A second wrapper for the same folder (a launch retaken from a controller thought
        // dead) must stand down.
        let second = launch(&p, &log).unwrap();
        let Launch::AlreadyStarted { wrapper_pid } = second else {
            panic!("second launch: {second:?}");
        };
        reap(wrapper_pid);
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran\n");
        assert!(d.join(EXIT_FILE).exists());
    }
}
