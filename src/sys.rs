//! This process, its host and the wall clock: the `/proc` readings (a process's start time,
//! the [`ProcessSpace`] a pid means something in), the host name and the time in ms. Below
//! every other module (it imports nothing of the crate), so the store and the executors share
//! one copy.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Where a pid means something: the host, the kernel's boot and the PID namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessSpace {
    /// Host name (`gethostname(2)`).
    pub host: String,
    /// Kernel boot id (`/proc/sys/kernel/random/boot_id`); `None` where unreadable.
    pub boot_id: Option<String>,
    /// PID namespace, as `readlink /proc/self/ns/pid` writes it (`pid:[4026531836]`); `None`
    /// where unreadable.
    pub pidns: Option<String>,
    /// Whether `/proc/<pid>` shows this namespace's processes (a `/proc` mounted by another
    /// PID namespace, as `unshare --pid` without `--mount-proc` leaves it, shows other pids).
    pub own_proc: bool,
}

impl ProcessSpace {
    /// The current process's space (read once per process).
    pub fn here() -> &'static ProcessSpace {
        static HERE: OnceLock<ProcessSpace> = OnceLock::new();
        HERE.get_or_init(|| {
            let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty());
            let pidns = std::fs::read_link("/proc/self/ns/pid")
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            let own_proc = std::fs::read_link("/proc/self")
                .is_ok_and(|p| p.to_string_lossy() == std::process::id().to_string());
            ProcessSpace {
                host: hostname(),
                boot_id,
                pidns,
                own_proc,
            }
        })
    }

    /// Whether a pid recorded with `host`, `boot_id` and `pidns` can be looked up here: every
    /// part known and equal to this space's, and `/proc` showing this namespace.
    pub fn can_look_up(&self, host: &str, boot_id: Option<&str>, pidns: Option<&str>) -> bool {
        self.own_proc
            && self.host == host
            && self.boot_id.is_some()
            && self.pidns.is_some()
            && self.boot_id.as_deref() == boot_id
            && self.pidns.as_deref() == pidns
    }
}

/// The host name (`gethostname(2)`), or `"unknown"`.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// A process's start time in clock ticks since boot, from `/proc/PID/stat` (field 22, see
/// proc(5)); `None` when the process does not exist (or on systems without procfs). The pid is
/// looked up in the PID namespace `/proc` was mounted for: see [`ProcessSpace::own_proc`].
pub(crate) fn process_start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    start_ticks_of(&stat)
}

/// This process's start time in clock ticks since boot (`/proc/self/stat` field 22): right
/// even where `/proc` belongs to another PID namespace.
pub(crate) fn own_start_ticks() -> Option<u64> {
    static TICKS: OnceLock<Option<u64>> = OnceLock::new();
    *TICKS.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        start_ticks_of(&stat)
    })
}

/// Field 22 of a `/proc/<pid>/stat` line; `None` for a zombie or dying process (see proc(5)).
pub(crate) fn start_ticks_of(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    // `rest` starts at field 3 (state); field 22 is index 19 here.
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z") | Some("X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970). The local
/// executor's wrapper keeps a copy of its own (`executor/local/wrapper.rs`): it runs in a
/// forked child between `fork` and `_exit`, where only async-signal-safe calls
/// (`clock_gettime`) may be made, and `SystemTime::now` is not promised to be one.
pub(crate) fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

/// `t` in milliseconds since the Unix epoch (0 for a time before 1970): a file's modification
/// time, a clock reading.
pub(crate) fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The modification time of `path` in milliseconds since the Unix epoch; `None` when it cannot
/// be read.
pub(crate) fn mtime_ms(path: &Path) -> Option<u64> {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .map(epoch_ms)
}

/// Now, as Unix seconds (the records' `started_at`/`finished_at`).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `HH:MM:SS UTC` of a time in ms since the Unix epoch.
pub fn clock_text(ms: u64) -> String {
    let s = (ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s / 60) % 60, s % 60)
}

/// The memory this process may use, bytes, and where the figure comes from: the smallest of
/// its cgroup's limit (v2 `memory.max`, v1 `memory.limit_in_bytes`; see the kernel's
/// `Documentation/admin-guide/cgroup-v2.rst`), its `RLIMIT_DATA` (`getrlimit(2)`; `ulimit -d`)
/// and `MemAvailable` of `/proc/meminfo` (`proc(5)`). `None` where none can be read.
pub(crate) fn memory_available() -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    let mut offer = |bytes: u64, source: String| {
        if best.as_ref().is_none_or(|(b, _)| bytes < *b) {
            best = Some((bytes, source));
        }
    };
    // SAFETY: getrlimit fills the struct it is given.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut rl) } == 0
        && rl.rlim_cur != libc::RLIM_INFINITY
    {
        offer(rl.rlim_cur, "the RLIMIT_DATA soft limit (ulimit -d)".into());
    }
    if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo")
        && let Some(kb) = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        offer(kb * 1024, "MemAvailable of /proc/meminfo".into());
    }
    if let Ok(groups) = std::fs::read_to_string("/proc/self/cgroup") {
        for line in groups.lines() {
            // `hierarchy-ID:controllers:path` (cgroups(7)); v2 has the empty controller list.
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = match (parts.next(), parts.next(), parts.next()) {
                (Some(a), Some(b), Some(c)) => (a, b, c),
                _ => continue,
            };
            let file = if controllers.is_empty() {
                format!("/sys/fs/cgroup{path}/memory.max")
            } else if controllers.split(',').any(|c| c == "memory") {
                format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
            } else {
                continue;
            };
            // "max" (v2) or a huge number (v1) when there is no limit.
            if let Ok(text) = std::fs::read_to_string(&file)
                && let Ok(limit) = text.trim().parse::<u64>()
                && limit < (1 << 60)
            {
                offer(limit, format!("the cgroup limit in {file}"));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_of_reads_field_22_after_the_last_parenthesis() {
        let line = "103 (a (weird) name) S 1 103 103 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 5512 \
                    1000 10";
        assert_eq!(start_ticks_of(line), Some(5512));
        let zombie = line.replace(") S ", ") Z ");
        assert_eq!(start_ticks_of(&zombie), None);
        assert_eq!(start_ticks_of("garbage"), None);
    }

    #[test]
    fn epoch_ms_and_mtime_ms() {
        use std::time::Duration;
        assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1500)), 1500);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(
            mtime_ms(Path::new("/nonexistent/puzzletron-sys-test")),
            None
        );
        let dir = std::env::temp_dir().join(format!("puzzletron-sys-{}", std::process::id()));
        std::fs::write(&dir, b"x").unwrap();
        let (m, now) = (mtime_ms(&dir).unwrap(), now_ms());
        std::fs::remove_file(&dir).unwrap();
        assert!(
            m <= now + 1000 && m + 60_000 >= now,
            "mtime {m} vs now {now}"
        );
        let u = unix_now();
        assert!((u * 1000.0 - now_ms() as f64).abs() < 60_000.0, "{u}");
    }

    #[test]
    fn clock_text_is_the_utc_time_of_day() {
        assert_eq!(clock_text(0), "00:00:00 UTC");
        assert_eq!(clock_text(86_400_000 + 3_723_999), "01:02:03 UTC");
    }

    #[test]
    fn memory_available_is_at_most_what_meminfo_and_the_data_limit_say() {
        let (bytes, from) = memory_available().expect("Linux has /proc/meminfo");
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let avail_kb: u64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        // MemAvailable moves between the two reads: allow 10%.
        assert!(bytes <= avail_kb * 1024 / 10 * 11, "{bytes} from {from}");
        assert!(bytes > 0, "{from}");
    }
}
