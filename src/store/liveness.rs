//! Who may judge whom dead, and by what evidence (`docs/design.md`, "Store": Death is proved,
//! never assumed; P01 in `docs/evidence.md`).
//!
//! A pid means something only inside its PID namespace of one boot of one kernel. So an
//! [`Owner`](super::Owner) records its [`ProcessSpace`] (host name, kernel boot id, PID
//! namespace) with its pid and start time, and a judge may take "no such pid" or "another
//! start time" as proof of death only when that space is its own ([`Liveness::Dead`]). Every
//! other owner ([`Liveness::Unproven`], [`Liveness::Alive`]) is judged by its heartbeat, timed
//! on the judge's own monotonic clock by a [`HeartbeatWatch`]: stale once the judge has seen
//! it unchanged for the whole stale interval. The writer's wall clock is never compared with
//! the judge's (clocks of two hosts, or of a file server, disagree). A process never judges
//! its own claims stale ([`Liveness::Ours`]).

use std::collections::HashMap;
use std::hash::Hash as StdHash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a judge may conclude about an owner from where it stands (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// An owner made by this very process ([`Owner::current`](super::Owner::current) minted its
    /// nonce here): alive as long as the judge is, never stale.
    Ours,
    /// Another process of the judge's own process space whose pid and start time still match:
    /// alive now, but whether it still renews its claims is for its heartbeat to say.
    Alive,
    /// Proved dead: same host, boot and PID namespace as the judge, and no process has its pid
    /// with its start time (or it has the judge's own pid without a nonce the judge made).
    /// Its claims may be taken over at once.
    Dead,
    /// Nothing can be proved from here (another host, another boot, another PID namespace, or
    /// an owner that recorded too little): only its heartbeat decides.
    Unproven,
}

pub use crate::sys::ProcessSpace;
pub(super) use crate::sys::own_start_ticks;

/// The nonces [`Owner::current`](super::Owner::current) made in this process.
static MINTED: Mutex<Option<std::collections::HashSet<String>>> = Mutex::new(None);

/// Notes that this process made an owner with `nonce` (see [`Liveness::Ours`]).
pub(super) fn mint(nonce: &str) {
    let mut m = MINTED.lock().unwrap_or_else(|e| e.into_inner());
    m.get_or_insert_with(Default::default)
        .insert(nonce.to_string());
}

/// Whether this process made an owner with `nonce`.
pub(super) fn minted_here(nonce: &str) -> bool {
    let m = MINTED.lock().unwrap_or_else(|e| e.into_inner());
    m.as_ref().is_some_and(|s| s.contains(nonce))
}

/// A signature of what a heartbeat looks like now (a claim file's inode, mtime and content;
/// a folder's inode and mtime): any change means the holder is alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub(crate) struct Beat(pub [u64; 4]);

impl Beat {
    /// The signature of a file or folder from its metadata and (for a file) its bytes.
    pub(crate) fn of(meta: &std::fs::Metadata, bytes: &[u8]) -> Self {
        use std::os::unix::fs::MetadataExt;
        let content = crate::identity::Hash::of(bytes);
        let c = content.as_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&c[..8]);
        Beat([
            meta.ino(),
            meta.mtime() as u64,
            meta.mtime_nsec() as u64,
            u64::from_le_bytes(first) ^ meta.len(),
        ])
    }
}

/// Opens `path`, then reads its metadata and at most 64 KiB of its bytes: what its heartbeat
/// looks like and what it says. The metadata comes from the open file, so that on NFS the open's
/// revalidation (close-to-open consistency) makes it fresh.
pub(crate) fn read_beat(path: &std::path::Path) -> std::io::Result<(Beat, Vec<u8>)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    let mut bytes = Vec::with_capacity(512);
    (&mut f).take(64 * 1024).read_to_end(&mut bytes)?;
    Ok((Beat::of(&meta, &bytes), bytes))
}

/// Moves `path` aside to `tomb` (a name of the caller's own) and checks that what it moved
/// still looks like `judged` (same inode, mtime and bytes): `Ok(true)` when it does, the judged
/// file is out of the way. Otherwise (a heartbeat, or a new file made after the judgement) it
/// is put back, unless yet another was made at `path` meanwhile, and the answer is
/// `Ok(false)`; also when `path` is gone. Nothing is ever removed by name except `tomb`.
/// (P03 in `docs/evidence.md`: rename atomically, then check the renamed
/// object's identity; never unlink by name after a check.)
pub(crate) fn move_aside_if_unchanged(
    path: &std::path::Path,
    tomb: &std::path::Path,
    judged: Beat,
) -> std::io::Result<bool> {
    match std::fs::rename(path, tomb) {
        Ok(()) => {}
        Err(e) if is_gone(&e) => return Ok(false),
        Err(e) => return Err(e),
    }
    match read_beat(tomb) {
        Ok((b, _)) if b == judged => return Ok(true),
        Ok(_) => {}
        Err(e) if is_gone(&e) => return Ok(false),
        Err(e) => return Err(e),
    }
    if std::fs::hard_link(tomb, path).is_ok() {
        let _ = std::fs::remove_file(tomb);
    }
    Ok(false)
}

/// Whether an error means the file is gone: `ENOENT`, or `ESTALE` (an NFS handle whose file was
/// unlinked or replaced by another client). Either way: look again.
pub(crate) fn is_gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESTALE)
}

/// A name no other process or thread makes (for a tomb or a temp file): a digest of this
/// process's space, pid, a counter and the time.
pub(crate) fn unique_token() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let here = ProcessSpace::here();
    crate::identity::Hash::of(format!(
        "{}/{:?}/{:?}/{}/{n}/{nanos}",
        here.host,
        here.boot_id,
        here.pidns,
        std::process::id()
    ))
    .short()
}

/// Times heartbeats on the judge's own monotonic clock: how long each watched thing has been
/// seen unchanged, from the first time this watch saw it as it is now. A first sight is
/// "unchanged for 0 s": nothing is stale at first sight, whatever its timestamps say.
#[derive(Debug)]
pub(crate) struct HeartbeatWatch<K> {
    seen: Mutex<HashMap<K, (Beat, Instant)>>,
}

impl<K> Default for HeartbeatWatch<K> {
    fn default() -> Self {
        Self {
            seen: Mutex::new(HashMap::new()),
        }
    }
}

/// Beyond this many watched things, the watch starts over (timers restart: takeovers wait
/// longer, never shorter).
const WATCH_LIMIT: usize = 100_000;

impl<K: StdHash + Eq + Clone> HeartbeatWatch<K> {
    /// How long `what` has looked like `beat`, on this process's monotonic clock.
    pub(crate) fn unchanged_for(&self, what: &K, beat: Beat) -> Duration {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match seen.get_mut(what) {
            Some((b, since)) if *b == beat => now.duration_since(*since),
            Some(slot) => {
                *slot = (beat, now);
                Duration::ZERO
            }
            None => {
                if seen.len() >= WATCH_LIMIT {
                    seen.clear();
                }
                seen.insert(what.clone(), (beat, now));
                Duration::ZERO
            }
        }
    }

    /// Forgets `what` (it is gone, or was taken over).
    pub(crate) fn forget(&self, what: &K) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(what);
    }
}

/// `now`/`stale` as a phrase: "seen unchanged for 12 s of 60 s".
pub(crate) fn unchanged_phrase(unchanged: Duration, stale: Duration) -> String {
    format!(
        "heartbeat seen unchanged for {:.0} s of the {:.0} s stale interval",
        unchanged.as_secs_f64().floor(),
        stale.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_times_only_what_it_saw_unchanged() {
        let w: HeartbeatWatch<u32> = HeartbeatWatch::default();
        let a = Beat([1, 2, 3, 4]);
        assert_eq!(w.unchanged_for(&7, a), Duration::ZERO, "first sight");
        std::thread::sleep(Duration::from_millis(20));
        assert!(w.unchanged_for(&7, a) >= Duration::from_millis(20));
        // A change restarts the timer.
        assert_eq!(w.unchanged_for(&7, Beat([1, 2, 3, 5])), Duration::ZERO);
        w.forget(&7);
        assert_eq!(w.unchanged_for(&7, Beat([1, 2, 3, 5])), Duration::ZERO);
    }

    #[test]
    fn this_process_space_is_known_on_linux() {
        let here = ProcessSpace::here();
        assert!(here.boot_id.is_some(), "{here:?}");
        let ns = here.pidns.as_deref().unwrap_or_default();
        assert!(ns.starts_with("pid:["), "{here:?}");
        assert!(here.own_proc, "the test runs with its own /proc: {here:?}");
        assert!(here.can_look_up(&here.host, here.boot_id.as_deref(), ns.into()));
        assert!(!here.can_look_up(&here.host, Some("another-boot"), Some(ns)));
        assert!(!here.can_look_up(&here.host, here.boot_id.as_deref(), Some("pid:[1]")));
        assert!(!here.can_look_up("elsewhere", here.boot_id.as_deref(), Some(ns)));
        assert!(!here.can_look_up(&here.host, None, Some(ns)));
    }
}
