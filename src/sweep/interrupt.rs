//! Signals that cancel a drain while it runs: SIGINT (Ctrl-C) in a blocking
//! [`drain`](super::Orchestrator::drain), SIGTERM and SIGINT in an isolated worker (what
//! `scancel` and a `LocalExecutor` cancel send). Scoped: the handler is installed when the first
//! [`Guard`] is made and the default disposition restored when the last one is dropped, so a
//! Ctrl-C outside a drain ends the program as usual.
//!
//! A signal whose disposition is not the default when the drain starts (the program handles
//! or ignores it: tokio's `ctrl_c`, the `ctrlc` crate, `nohup`) is left alone: the program
//! owns it, and cancels the drain with its own
//! [`CancellationToken`](super::CancellationToken).
//!
//! A second signal while the first is being handled (the job has not reached a
//! [`Run::log`](super::Run::log) yet) gets the default action at once: Ctrl-C twice always
//! ends the program.
//!
//! The handler only writes a byte to a pipe (async-signal-safe); a watcher thread, started
//! with the first guard and parked on the pipe for the rest of the process, cancels the
//! drains registered at that moment.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::cancel::Cancel;

/// The signals a guard can hold (index = position).
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// The pipe's write end, for the handler (-1 until made).
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// Per signal: it arrived since its handler was installed (a second one is not waited for).
static FIRED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

struct State {
    /// Per signal: how many live guards hold it, and whether our handler is installed.
    held: [(usize, bool); 2],
    /// The drains to cancel, by guard id.
    drains: Vec<(u64, Vec<libc::c_int>, Cancel)>,
    next_id: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    held: [(0, false); 2],
    drains: Vec::new(),
    next_id: 0,
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn slot(sig: libc::c_int) -> usize {
    SIGNALS
        .iter()
        .position(|&s| s == sig)
        .expect("a signal of SIGNALS")
}

extern "C" fn on_signal(sig: libc::c_int) {
    let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
        return;
    };
    if FIRED[i].swap(true, Ordering::AcqRel) {
        // The second one: the default action now (for SIGINT/SIGTERM, the end of the process).
        // SAFETY: signal(2) and raise(3) are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return;
    }
    let fd = PIPE_WRITE.load(Ordering::Acquire);
    if fd >= 0 {
        // SAFETY: write(2) is async-signal-safe; errno is saved and restored around it.
        unsafe {
            let errno = *libc::__errno_location();
            let byte = sig as u8;
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Makes the pipe and starts the watcher thread, once per process.
fn watcher() -> bool {
    static STARTED: OnceLock<bool> = OnceLock::new();
    *STARTED.get_or_init(|| {
        let mut fds: [RawFd; 2] = [-1; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return false;
        }
        // SAFETY: `fds[0]` was just made and is owned here alone.
        let mut read = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        let spawned = std::thread::Builder::new()
            .name("puzzletron-signals".into())
            .spawn(move || {
                let mut byte = [0u8; 1];
                while let Ok(1) = read.read(&mut byte) {
                    let sig = libc::c_int::from(byte[0]);
                    let st = state();
                    for (_, signals, cancel) in &st.drains {
                        if signals.contains(&sig) {
                            cancel.trigger();
                        }
                    }
                }
            });
        if spawned.is_err() {
            return false;
        }
        PIPE_WRITE.store(fds[1], Ordering::Release);
        true
    })
}

/// Whether `sig` has the default disposition now.
fn is_default(sig: libc::c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL
    }
}

fn set_handler(sig: libc::c_int, handler: libc::sighandler_t) {
    // SAFETY: installs a plain handler (`on_signal` is async-signal-safe) or SIG_DFL.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(sig, &act, std::ptr::null_mut());
    }
}

/// While it lives, `signals` cancel the drain of `cancel` (see the module docs). Dropping the
/// last guard of a signal restores its default disposition.
pub(crate) struct Guard {
    id: u64,
    signals: Vec<libc::c_int>,
}

impl Guard {
    /// Installs the handler for each of `signals` (of SIGINT, SIGTERM) that has the default
    /// disposition or is held by another guard already; the others are left to the program.
    pub(crate) fn install(signals: &[libc::c_int], cancel: &Cancel) -> Self {
        let mut st = state();
        let id = st.next_id;
        st.next_id += 1;
        let mut mine = Vec::new();
        if watcher() {
            for &sig in signals {
                let i = slot(sig);
                let (count, ours) = st.held[i];
                if count == 0 {
                    if !is_default(sig) {
                        continue;
                    }
                    FIRED[i].store(false, Ordering::Release);
                    set_handler(sig, on_signal as *const () as libc::sighandler_t);
                    st.held[i] = (1, true);
                } else {
                    st.held[i] = (count + 1, ours);
                }
                mine.push(sig);
            }
        }
        st.drains.push((id, mine.clone(), cancel.clone()));
        Guard { id, signals: mine }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut st = state();
        st.drains.retain(|(id, ..)| *id != self.id);
        for &sig in &self.signals {
            let i = slot(sig);
            let (count, ours) = st.held[i];
            if count == 1 {
                if ours {
                    set_handler(sig, libc::SIG_DFL);
                }
                st.held[i] = (0, false);
            } else {
                st.held[i] = (count - 1, ours);
            }
        }
    }
}
