//! Helpers for the `puzzletron` binary's tests: the fixtures, the binary, the stub worker.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use super::plan::fixtures;

/// The smoke experiment (10 single-GPU stages) and its execution config.
pub const SMOKE: &str = "families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml";
/// The smoke execution config.
pub const SMOKE_EXEC: &str = "orchestration/qwen3p5_0p8b/execution.smoke.yaml";

/// `PATH` with `tests/support/bin` first: its `torchrun` stands in for PyTorch's (distributed
/// stages are launched with torchrun; the test machines have no torch).
pub fn path_with_torchrun() -> String {
    format!(
        "{}/tests/support/bin:{}",
        env!("CARGO_MANIFEST_DIR"),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// `puzzletron` run from the fixtures folder with the environment the fixtures need (and the
/// torchrun stand-in first in `PATH`).
pub fn puzzletron() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_puzzletron"));
    c.current_dir(fixtures())
        .env("PATH", path_with_torchrun())
        .env("PUZZLETRON_RUN_ROOT", "runs/test")
        .env("PUZZLETRON_DATASET_PATH", "data/ds")
        .env("PUZZLETRON_DATASET_REVISION", "rev0")
        .env_remove("PUZZLETRON_COMMAND_PREFIX")
        .stdin(std::process::Stdio::null());
    c
}

/// Runs `args` to the end; returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    out(puzzletron()
        .args(args)
        .output()
        .expect("running puzzletron"))
}

/// `puzzletron campaign CMD SMOKE --runner RUNNER --execution EXEC EXTRA..` run to the end:
/// (exit code, stdout, stderr).
pub fn campaign(cmd: &str, runner: &str, exec: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "campaign",
        cmd,
        SMOKE,
        "--runner",
        runner,
        "--execution",
        exec,
    ];
    args.extend_from_slice(extra);
    run(&args)
}

/// (exit code, stdout, stderr) of an output.
pub fn out(o: Output) -> (i32, String, String) {
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The stub worker example (built by `cargo test`).
pub fn stub() -> PathBuf {
    super::examples::example_exe("campaign_stub_worker")
}

/// `--command-prefix` value for the stub with `opts`.
pub fn prefix(opts: &str) -> String {
    format!("{} {opts} --", stub().display())
}

/// Reads the journal as JSON values.
pub fn journal(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("controller/journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A headless Chromium, if installed (`chromium` is Debian's package; `.ci/run` installs it).
pub fn chromium() -> Option<PathBuf> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(c).output()
            && o.status.success()
        {
            return Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        }
    }
    None
}

/// Chromium with the flags that keep it off the network and out of the user's profile.
pub fn chromium_cmd(exe: &Path, profile: &Path) -> Command {
    let mut c = Command::new(exe);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}
