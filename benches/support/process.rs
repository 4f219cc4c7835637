//! Measuring a child process as a whole: wall time, CPU time (user + system, all threads) and
//! peak RSS, from `wait4(2)`'s rusage of that child alone; and the machine load.
#![allow(
    dead_code,
    reason = "each bench that includes this module uses part of it"
)]

use std::process::Command;
use std::time::{Duration, Instant};

/// What [`measure`] saw of one child.
pub struct Measured {
    /// From spawn to exit.
    pub wall: Duration,
    /// User + system CPU time of the child (all its threads).
    pub cpu: Duration,
    /// Peak resident set of the child, MB (2^20 bytes).
    pub rss_mb: f64,
    /// Exit code; -1 when killed by a signal.
    pub code: i32,
}

/// Spawns `cmd` (its stdio as the caller set it) and reaps it with `wait4`.
///
/// # Panics
/// When the child cannot be spawned or reaped.
// The child is reaped by `wait4` (for its own rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
pub fn measure(cmd: &mut Command) -> Measured {
    let t = Instant::now();
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let pid = child.id() as libc::pid_t;
    let mut status: libc::c_int = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own unwaited child; status and usage point to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let wall = t.elapsed();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Measured {
        wall,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        // Linux reports ru_maxrss in kilobytes.
        rss_mb: usage.ru_maxrss as f64 / 1024.0,
        code,
    }
}

/// The load averages (1, 5, 15 min) from `/proc/loadavg`.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
