//! [`Entry`]: where a job function is in this binary, so a worker process (a fresh process of
//! the same binary, see `sweep::worker`) can call it.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::job::JobResult;
use super::run::Run;

type Trampoline = fn(usize, &str, &mut Run) -> JobResult;

/// The job function and its parameter-decoding trampoline, as offsets from [`anchor`] in this
/// binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    trampoline: i64,
    func: i64,
}

#[inline(never)]
fn anchor() -> u64 {
    // A body of its own so the linker cannot fold it with another function.
    std::hint::black_box(0x7075_7a7a_6c65_7472)
}

fn anchor_addr() -> i64 {
    anchor as fn() -> u64 as usize as i64
}

fn call_json<P: DeserializeOwned>(func: usize, params: &str, run: &mut Run) -> JobResult {
    let p: P = serde_json::from_str(params)
        .map_err(|e| format!("the parameters do not decode from their canonical JSON: {e}"))?;
    // SAFETY: `func` is the address of a `fn(&P, &mut Run) -> JobResult` in this very binary
    // (Entry::of computed it for this P, in this process or, for a worker, in a process whose
    // binary identity the worker checked).
    let f = unsafe { std::mem::transmute::<usize, fn(&P, &mut Run) -> JobResult>(func) };
    f(&p, run)
}

impl Entry {
    /// The entry of job function `f` with parameters `P`.
    pub(crate) fn of<P: DeserializeOwned>(f: fn(&P, &mut Run) -> JobResult) -> Self {
        let base = anchor_addr();
        let t: Trampoline = call_json::<P>;
        Self {
            trampoline: t as usize as i64 - base,
            func: f as usize as i64 - base,
        }
    }

    /// Calls the job.
    ///
    /// # Safety
    /// The entry must have been made by [`Entry::of`] in a process of the same binary file.
    pub(super) unsafe fn call(&self, params: &str, run: &mut Run) -> JobResult {
        let base = anchor_addr();
        // SAFETY: per the contract, base + offset is the trampoline in this binary.
        let t =
            unsafe { std::mem::transmute::<usize, Trampoline>((base + self.trampoline) as usize) };
        t((base + self.func) as usize, params, run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn double(p: &u32, run: &mut Run) -> JobResult {
        let _ = run;
        if *p == 0 {
            return Err("zero".into());
        }
        Ok(())
    }

    #[test]
    fn entry_offsets_round_trip_in_process() {
        let e = Entry::of::<u32>(double);
        let json = serde_json::to_string(&e).unwrap();
        let back: Entry = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
    }
}
