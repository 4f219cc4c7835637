//! Captures a panicking job's message and backtrace (where it panicked, not where we caught it),
//! through a process-wide panic hook: [`install_panic_hook`], [`remove_panic_hook`].

use std::backtrace::Backtrace;
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::{Arc, Mutex, MutexGuard};

thread_local! {
    static CAPTURE: RefCell<Option<Option<(String, String)>>> = const { RefCell::new(None) };
}

type Hook = Arc<dyn Fn(&PanicHookInfo<'_>) + Send + Sync + 'static>;

enum HookState {
    /// Not installed yet: the first job installs it.
    Unset,
    /// Installed; the hook that was there before, to which other panics go.
    Installed(Hook),
    /// Removed by [`remove_panic_hook`]: jobs do not install it again.
    Removed,
}

static STATE: Mutex<HookState> = Mutex::new(HookState::Unset);

fn state() -> MutexGuard<'static, HookState> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the panic hook that records where a job panicked: a job's panic is caught by the
/// drain and recorded as the run's failure (`kind: panic`, the message with its `file:line`,
/// and the backtrace of the panicking thread), and is not printed; every other panic (outside
/// jobs, or on threads a job started) goes to the hook that was installed before, as if this
/// one were not there.
///
/// The first run a drain executes in this process installs it, so a program needs this call
/// only to install it earlier (before a hook of its own that should see job panics too). It is
/// process-wide: `std::panic::set_hook` has no other scope. Idempotent; after
/// [`remove_panic_hook`], it installs the hook again.
pub fn install_panic_hook() {
    install(true);
}

/// Restores the panic hook that was installed before [`install_panic_hook`] (the first drain's
/// run), and keeps drains from installing theirs again. Job panics are still caught and
/// recorded as the run's failure, with the panic's message but without its location or
/// backtrace, and the restored hook prints them as it prints any panic. Call it when the
/// program installs a panic hook of its own after a drain ran (it would otherwise wrap this
/// one), or wants panics printed. A hook installed by someone else after this one is replaced
/// by the restored one.
pub fn remove_panic_hook() {
    let mut st = state();
    if let HookState::Installed(previous) = std::mem::replace(&mut *st, HookState::Removed) {
        panic::set_hook(Box::new(move |info| previous(info)));
    }
}

fn install(explicit: bool) {
    let mut st = state();
    match &*st {
        HookState::Installed(_) => return,
        HookState::Removed if !explicit => return,
        _ => {}
    }
    let previous: Hook = Arc::from(panic::take_hook());
    *st = HookState::Installed(previous.clone());
    panic::set_hook(Box::new(move |info| {
        let captured = CAPTURE.with(|c| {
            let mut c = c.borrow_mut();
            match c.as_mut() {
                Some(slot) => {
                    let loc = info
                        .location()
                        .map(|l| format!(" at {l}"))
                        .unwrap_or_default();
                    *slot = Some((
                        format!("{}{loc}", message(info.payload())),
                        Backtrace::force_capture().to_string(),
                    ));
                    true
                }
                None => false,
            }
        });
        // Panics outside jobs keep the previous behaviour; inside jobs the drain reports them.
        if !captured {
            previous(info);
        }
    }));
}

fn message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Runs `f`, turning a panic into `Err((message, backtrace))`.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, (String, String)> {
    install(false);
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    r.map_err(|payload| captured.unwrap_or_else(|| (message(&*payload), String::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for the whole life of the process-wide hook (tests run in parallel threads:
    /// another test installing or removing it meanwhile would race).
    #[test]
    fn the_hook_captures_job_panics_and_can_be_removed_and_installed_again() {
        let (msg, bt) = catch(|| panic!("boom {}", 1)).unwrap_err();
        assert!(msg.starts_with("boom 1 at src/sweep/panics.rs:"), "{msg}");
        assert!(!bt.is_empty(), "a backtrace of where it panicked");
        remove_panic_hook();
        let (msg, bt) = catch(|| panic!("after removal")).unwrap_err();
        assert_eq!(msg, "after removal", "the message, without location");
        assert!(bt.is_empty());
        assert!(matches!(*state(), HookState::Removed));
        install_panic_hook();
        let (msg, _) = catch(|| panic!("again")).unwrap_err();
        assert!(msg.starts_with("again at "), "{msg}");
        assert_eq!(catch(|| 7), Ok(7));
    }
}
