//! The example binaries that `cargo test` builds next to the test binaries.

use std::path::{Path, PathBuf};

/// `target/<profile>/examples/<name>`; panics with the command to build it when missing.
pub fn example_exe(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("test binary path");
    let dir = me
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>");
    let exe = dir.join("examples").join(name);
    assert!(
        exe.exists(),
        "{} is missing: `cargo test` builds examples; run `cargo build --all-features --examples` first",
        exe.display()
    );
    exe
}

/// Runs `cmd` to its end (stdin closed); returns its status and its stdout then stderr as text.
pub fn run_to_text(cmd: &mut std::process::Command) -> (std::process::ExitStatus, String) {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("the example starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status, text)
}
