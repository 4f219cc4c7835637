//! Captures a panicking job's message and backtrace (where it panicked, not where we caught it).

use std::backtrace::Backtrace;
use std::cell::RefCell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

thread_local! {
    static CAPTURE: RefCell<Option<Option<(String, String)>>> = const { RefCell::new(None) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let captured = CAPTURE.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
                            (*s).to_string()
                        } else if let Some(s) = info.payload().downcast_ref::<String>() {
                            s.clone()
                        } else {
                            "panic with a non-string payload".to_string()
                        };
                        let loc = info
                            .location()
                            .map(|l| format!(" at {l}"))
                            .unwrap_or_default();
                        *slot = Some((
                            format!("{msg}{loc}"),
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
    });
}

/// Runs `f`, turning a panic into `Err((message, backtrace))`.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, (String, String)> {
    install_hook();
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    r.map_err(|_| captured.unwrap_or_else(|| ("panic".to_string(), String::new())))
}
