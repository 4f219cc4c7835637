//! The fork server: a small single-threaded process that forks the wrappers, so that the
//! controller never forks once per job.
//!
//! Why: a `fork` of the controller copies its page tables, and until the child is gone every
//! write of the controller's threads to one of its pages takes a copy-on-write fault and a
//! TLB shootdown on every CPU the controller runs on; the wrapper then tears the copied tables
//! down when it exits. With many short jobs that was the largest single cost of a local drain
//! (a perf profile put about 13 % of all CPU samples in the controller's copy-on-write faults
//! and IPIs, and 14.5 % of the wrappers' samples in `unmap_page_range` at their exit). The
//! server is forked once, when the first [`super::LocalExecutor`] of the process is built
//! (usually early, while the process is small), touches almost nothing afterwards, and is
//! single-threaded: forking it is cheap and disturbs no one.
//!
//! ```text
//! controller --socketpair(SOCK_SEQPACKET)--> server (setsid; SIGCHLD ignored: the kernel
//!   | one message per launch: the request             |   reaps the wrappers; loops on recvmsg)
//!   | bytes (Prepared) + 3 fds (/dev/null, log,       +--fork--> wrapper (as before: wrapper.rs)
//!   | notify pipe's write end)                        | writes `P` + wrapper pid (or `F` +
//!   | reads the notify pipe: the wrapper's `S`/`D`/`E`|   errno) on the notify pipe, closes
//!   | and the server's `P`, then EOF when the wrapper |   its copies of the fds (`X`: a
//!   |                                                 |   request it cannot read)
//!   | has exited (its `exit` record is written)       | EOF on the socket (the controller is
//!                                                     |   gone): exits
//! ```
//!
//! The server makes only async-signal-safe system calls (it is a child of a multi-threaded
//! process) on memory it maps for itself after the fork. Whatever goes wrong with it, a launch
//! falls back to forking the wrapper from the controller ([`wrapper::launch_direct`]): a
//! request too large for one message, a failed send, a fork that failed in the server (`F`), a
//! request it could not read (`X`), a process whose user or group ids changed since the server
//! started (it must not fork jobs with the old ones), a server that died (replaced at the next
//! launch; at most [`MAX_STARTS`] servers per process), or `PUZZLETRON_LOCAL_FORK_SERVER=0` in
//! the environment. A wrapper outlives the server either way (it is in its own session; the
//! nearest subreaper, init by default, reaps it). A server that dies on its own stays a zombie
//! of the process until the next launch finds it gone and reaps it.
//!
//! What a job inherits from the process is what the process had when the server started: the
//! environment, working folder and program travel with each request (the working folder is
//! made absolute against the controller's at launch), but the umask, resource limits, CPU
//! affinity, nice value, `oom_score_adj` and cgroup are the server's. A process that changes
//! those after building its first executor, and wants its jobs to follow, sets
//! `PUZZLETRON_LOCAL_FORK_SERVER=0`.
//!
//! The controller learns a wrapper's end from the EOF of its notify pipe, so a child the
//! process forks without `exec` while a launch is being sent (a window of a few system calls)
//! holds that pipe, and delays that job's end, for as long as it lives.
//!
//! Memory: like any forked process, the server shares copy-on-write the memory the process had
//! when it started, for as long as it lives (the process's lifetime): pages the controller
//! frees later stay allocated, and pages it writes later are copied. Build the first
//! [`super::LocalExecutor`] before loading large data (the wrappers that the controller forked
//! before the server did the same, for the length of each job).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use libc::c_int;

use super::wrapper::{self, Launch, Prepared, View, Wrapper};
use crate::executor::ExecutorError;

/// Largest request sent to the server, bytes (a `SOCK_SEQPACKET` message must fit the socket's
/// send buffer, about 208 KiB by default); larger ones (a huge environment) fork directly.
const MAX_REQUEST: usize = 128 * 1024;
/// Most argv + env entries of a request sent to the server.
const MAX_ENTRIES: usize = 8 * 1024;
/// Most servers started per process (the first included): a server that keeps dying is not
/// replaced forever.
pub(crate) const MAX_STARTS: u32 = 4;
/// Environment variable that turns the server off (`0`): every wrapper is forked directly.
pub const FORK_SERVER_ENV: &str = "PUZZLETRON_LOCAL_FORK_SERVER";

/// The process's server, if one runs.
static SERVER: Mutex<Option<Arc<Server>>> = Mutex::new(None);
static STARTS: AtomicU32 = AtomicU32::new(0);

struct Server {
    sock: OwnedFd,
    pid: i32,
    /// [`credentials`] when it was forked.
    creds: [libc::uid_t; 4],
}

/// The pid of the running server, if any (tests kill it).
#[cfg(test)]
pub(crate) fn server_pid() -> Option<i32> {
    lock().as_ref().map(|s| s.pid)
}

fn lock() -> std::sync::MutexGuard<'static, Option<Arc<Server>>> {
    SERVER.lock().unwrap_or_else(|p| p.into_inner())
}

fn enabled() -> bool {
    std::env::var_os(FORK_SERVER_ENV).is_none_or(|v| v != "0")
}

/// Starts the server unless one runs, it is turned off or it was restarted too often.
/// Best effort: when it cannot, launches fork directly.
pub(crate) fn ensure() {
    current();
}

/// The running server, started if need be; `None`: launches fork directly.
fn current() -> Option<Arc<Server>> {
    if !enabled() {
        return None;
    }
    let mut g = lock();
    if let Some(s) = g.as_ref() {
        return Some(Arc::clone(s));
    }
    // Under the lock: a plain load and store count exactly.
    let starts = STARTS.load(Ordering::Relaxed);
    if starts >= MAX_STARTS {
        return None;
    }
    STARTS.store(starts + 1, Ordering::Relaxed);
    let s = Arc::new(spawn().ok()?);
    *g = Some(Arc::clone(&s));
    Some(s)
}

/// Forgets a server found dead and reaps it (it is our child). Only the caller that takes it
/// out of the slot kills and reaps it: once reaped, its pid may name another process.
fn forget(dead: &Arc<Server>) {
    let mut g = lock();
    if !g.as_ref().is_some_and(|s| Arc::ptr_eq(s, dead)) {
        return;
    }
    *g = None;
    drop(g);
    // SAFETY: plain syscalls on our child, not reaped yet (only this call reaps it).
    unsafe {
        libc::kill(dead.pid, libc::SIGKILL);
        let mut st = 0;
        while libc::waitpid(dead.pid, &mut st, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
    }
}

/// The credentials a process forks with: a server started before the controller changed its
/// own must not fork jobs with the old ones.
fn credentials() -> [libc::uid_t; 4] {
    // SAFETY: plain syscalls without arguments; they cannot fail.
    unsafe {
        [
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        ]
    }
}

fn spawn() -> std::io::Result<Server> {
    let mut sv = [0 as c_int; 2];
    // SAFETY: plain syscall on a local array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both ends were just created and belong to nobody else.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) };
    // SAFETY: the child only runs `server_main`: async-signal-safe calls on its own memory.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: we are the forked child; never returns.
        unsafe { server_main(theirs.as_raw_fd()) }
    }
    drop(theirs);
    Ok(Server {
        sock: ours,
        pid,
        creds: credentials(),
    })
}

/// Starts the wrapper of a launch through the fork server, or directly when there is none, it
/// cannot take this request (too large, a failed send or fork) or it was forked with other
/// credentials than the process has now; blocks until the wrapper reports the job started or
/// failed.
///
/// # Errors
/// [`ExecutorError::Io`] when a pipe, the log file or the fork fails.
pub(crate) fn launch(p: &Prepared, log: &Path) -> Result<Wrapper, ExecutorError> {
    let fits = p.bytes().len() <= MAX_REQUEST && p.slots() <= MAX_ENTRIES + 2;
    if let Some(server) = current().filter(|s| fits && s.creds == credentials()) {
        match via(&server, p, log)? {
            Via::Forked(w) => return Ok(w),
            Via::Refused => {}
            Via::Dead => forget(&server),
        }
    }
    wrapper::launch_direct(p, log)
}

/// How a launch through the server went.
enum Via {
    /// The server forked the wrapper.
    Forked(Wrapper),
    /// The server did not get or could not read the request, or its fork failed: it forked
    /// nothing.
    Refused,
    /// The server is gone; it forked nothing.
    Dead,
}

/// One launch through `server`.
fn via(server: &Server, p: &Prepared, log: &Path) -> Result<Via, ExecutorError> {
    let (null, log_file) = wrapper::stdio(log)?;
    let (notify_r, notify_w) = wrapper::pipe(log)?;
    let fds = [null.as_raw_fd(), log_file.as_raw_fd(), notify_w.as_raw_fd()];
    if let Err(e) = send(server.sock.as_raw_fd(), p.bytes(), &fds) {
        return match e.raw_os_error() {
            Some(libc::EPIPE | libc::ECONNRESET | libc::ECONNREFUSED | libc::ENOTCONN) => {
                Ok(Via::Dead)
            }
            // A SEQPACKET send is all or nothing: nothing reached the server (EMSGSIZE,
            // ENOBUFS, ENOMEM, ETOOMANYREFS...), so forking directly is safe.
            _ => Ok(Via::Refused),
        };
    }
    // The server and then the wrapper hold the only other copies of the write end.
    drop(notify_w);
    drop(log_file);
    drop(null);
    let said = wrapper::read_said(notify_r.as_raw_fd());
    if said.refused {
        return Ok(Via::Refused);
    }
    match said.server {
        // The server's fork failed (EAGAIN: a process limit; ENOMEM): nothing was started,
        // and a fork from here reports its own error if it fails too.
        Some(Err(_)) => Ok(Via::Refused),
        // EOF before the server's `P` and the wrapper's message: the server died before it
        // forked (had it forked, the wrapper's message or the `P` would be there).
        None if said.launch.is_none() => Ok(Via::Dead),
        _ => Ok(Via::Forked(Wrapper::new(
            said.launch.unwrap_or(Launch::WrapperDied),
            notify_r,
            None,
        ))),
    }
}
/// A `msghdr` over one buffer (`iov`) and a control buffer of `controllen` bytes of `control`.
fn msghdr(iov: &mut libc::iovec, control: &mut [u64; 8], controllen: usize) -> libc::msghdr {
    // SAFETY: msghdr is plain data, valid zeroed.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov;
    m.msg_iovlen = 1;
    m.msg_control = control.as_mut_ptr().cast();
    m.msg_controllen = controllen.min(std::mem::size_of_val(control)) as _;
    m
}

/// Sends one request with three descriptors (`SCM_RIGHTS`).
fn send(sock: c_int, bytes: &[u8], fds: &[c_int; 3]) -> std::io::Result<()> {
    // u64 words: aligned for a cmsghdr.
    let mut control = [0u64; 8];
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as usize;
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call, and
    // the control buffer (64 bytes) holds CMSG_SPACE(12) = 32 bytes.
    unsafe {
        let m = msghdr(&mut iov, &mut control, space);
        let c = libc::CMSG_FIRSTHDR(&m);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<c_int>(), 3);
        loop {
            let r = libc::sendmsg(sock, &m, libc::MSG_NOSIGNAL);
            if r >= 0 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The server process: async-signal-safe calls only, no allocation.
// ---------------------------------------------------------------------------------------

/// The server's loop. Never returns.
///
/// # Safety
/// Called in the forked child only.
unsafe fn server_main(sock: c_int) -> ! {
    unsafe {
        libc::setsid();
        libc::prctl(libc::PR_SET_NAME, c"pzt-forkserver".as_ptr());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        // The kernel reaps the wrappers (no zombies, no wait loop); they reset it for theirs.
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // stdio to /dev/null, the socket at 3, nothing else: the server keeps none of the
        // controller's pipes or files open.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        let s = libc::fcntl(sock, libc::F_DUPFD, 10);
        if null < 0 || s < 0 {
            libc::_exit(120);
        }
        for fd in 0..3 {
            libc::dup2(null, fd);
        }
        if libc::dup2(s, 3) < 0 {
            libc::_exit(121);
        }
        let sock = 3;
        wrapper::close_from(4);
        let buf_len = MAX_REQUEST + 1;
        let slots_len = MAX_ENTRIES + 2;
        let ptr_size = std::mem::size_of::<*const libc::c_char>();
        let mem = libc::mmap(
            std::ptr::null_mut(),
            buf_len + slots_len * ptr_size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if mem == libc::MAP_FAILED {
            libc::_exit(122);
        }
        // The slots first: mmap returns page-aligned memory, so they are aligned.
        let slots = std::slice::from_raw_parts_mut(mem.cast::<*const libc::c_char>(), slots_len);
        let buf =
            std::slice::from_raw_parts_mut(mem.cast::<u8>().add(slots_len * ptr_size), buf_len);
        loop {
            let mut fds = [-1 as c_int; 3];
            let n = recv(sock, buf, &mut fds);
            if n == 0 {
                // The controller is gone.
                libc::_exit(0);
            }
            if n == -1 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(123);
            }
            let [null_fd, log_fd, notify] = fds;
            let view = if n > 0 {
                View::parse(&buf[..n as usize], slots)
            } else {
                None
            };
            let m = match view {
                Some(view) => {
                    let pid = libc::fork();
                    if pid == 0 {
                        wrapper::wrapper_main(&view, null_fd, log_fd, notify);
                    }
                    if pid < 0 {
                        wrapper::msg(b'F', *libc::__errno_location())
                    } else {
                        wrapper::msg(b'P', pid)
                    }
                }
                // A request we cannot read: the controller forks the wrapper itself.
                None => wrapper::msg(b'X', 0),
            };
            if notify >= 0 {
                wrapper::write_all(notify, &m);
            }
            for fd in fds {
                if fd >= 0 {
                    libc::close(fd);
                }
            }
        }
    }
}

/// Receives one request into `buf` and its descriptors into `fds` (extra ones closed).
/// Returns the request's length, 0 at EOF, -1 on error (`errno` set), -2 for a message that
/// is not a request (cut short, or without exactly three descriptors).
///
/// # Safety
/// Async-signal-safe; `sock` is a `SOCK_SEQPACKET` socket.
unsafe fn recv(sock: c_int, buf: &mut [u8], fds: &mut [c_int; 3]) -> isize {
    let mut control = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    unsafe {
        let mut m = msghdr(&mut iov, &mut control, usize::MAX);
        let n = libc::recvmsg(sock, &mut m, libc::MSG_CMSG_CLOEXEC);
        if n <= 0 {
            return n;
        }
        let mut got = 0;
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<c_int>();
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<c_int>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    if got < fds.len() {
                        fds[got] = fd;
                        got += 1;
                    } else {
                        libc::close(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
        if m.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || got != fds.len() {
            // Not a request we can trust: the caller refuses it and closes what came.
            return -2;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    /// Runs `script` under a wrapper launched by [`launch`] and returns its log: the script
    /// prints the pid of its wrapper's parent (field 4 of the wrapper's `/proc/<pid>/stat`).
    fn run(dir: &Path, script: &str, extra_env: &[(OsString, OsString)]) -> String {
        let p = Prepared::sh(dir, script, extra_env);
        let log = dir.join("log");
        let w = launch(&p, &log).unwrap();
        assert!(matches!(w.launch, Launch::Started { .. }), "{:?}", w.launch);
        w.wait();
        // The wrapper's EOF comes after its `exit` record.
        assert!(dir.join(super::super::folder::EXIT_FILE).exists());
        std::fs::read_to_string(&log).unwrap()
    }

    const WRAPPER_PARENT: &str = "read -r pid comm state ppid rest < /proc/$PPID/stat; echo $ppid";

    #[test]
    fn wrappers_are_forked_by_the_server_and_launches_survive_its_death() {
        if !enabled() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a");
        std::fs::create_dir(&a).unwrap();
        let server = current().expect("a fork server").pid;
        assert_eq!(run(&a, WRAPPER_PARENT, &[]).trim(), server.to_string());

        // Killed: the next launch finds it gone, forgets it, and the job still runs, under a
        // new server (or, past MAX_STARTS, forked from here).
        unsafe { libc::kill(server, libc::SIGKILL) };
        let b = root.path().join("b");
        std::fs::create_dir(&b).unwrap();
        let parent: i32 = run(&b, WRAPPER_PARENT, &[]).trim().parse().unwrap();
        assert_ne!(parent, server);
        let me = std::process::id() as i32;
        assert!(
            parent == me || Some(parent) == server_pid(),
            "wrapper parent {parent}: neither this process ({me}) nor the new server ({:?})",
            server_pid()
        );
    }

    #[test]
    fn a_request_too_large_for_the_server_is_forked_directly() {
        let root = tempfile::tempdir().unwrap();
        // Two variables: one string over 128 KiB is more than execve takes (MAX_ARG_STRLEN).
        let half: OsString = "x".repeat(MAX_REQUEST / 2 + 1).into();
        let env = [("BIG1".into(), half.clone()), ("BIG2".into(), half)];
        let out = run(root.path(), WRAPPER_PARENT, &env);
        assert_eq!(out.trim(), std::process::id().to_string());
    }

    #[test]
    fn the_server_exits_when_its_controller_is_gone() {
        let s = spawn().unwrap();
        let pid = s.pid;
        drop(s);
        let mut st = 0;
        // SAFETY: plain syscall on our child.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        assert_eq!(r, pid);
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "{st:#x}");
    }
}
