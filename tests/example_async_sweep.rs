//! The `async_sweep` example as a user runs it: an isolated sweep on a user executor, drained
//! from a tokio task; the second run finds every result done.

mod support;
use support::examples;

use std::process::Command;

#[test]
fn the_async_sweep_example_runs_then_skips() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let run = || {
        examples::run_to_text(
            Command::new(examples::example_exe("async_sweep"))
                .arg("--store")
                .arg(&store),
        )
    };
    let (status, text) = run();
    assert!(status.success(), "{text}");
    assert!(
        text.contains("4 ran, 0 skipped, 0 failed, 0 pending"),
        "{text}"
    );
    // The Collatz sequences from 6, 7, 27 and 97 reach 1 in 8, 16, 111 and 118 steps.
    for line in [
        "collatz 6: 8 steps",
        "collatz 7: 16 steps",
        "collatz 27: 111 steps",
        "collatz 97: 118 steps",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    let (status, text) = run();
    assert!(status.success(), "{text}");
    assert!(
        text.contains("0 ran, 4 skipped, 0 failed, 0 pending"),
        "{text}"
    );
    assert!(text.contains("collatz 27: 111 steps"), "{text}");
}
