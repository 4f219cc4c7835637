//! Issue 27, item 3, "not visible is not missing", through the real code paths: the
//! `puzzletron` binary runs a local campaign under an `LD_PRELOAD` shim
//! (`tests/support/preload/hide_marker.c`, built here with `cc`) that hides every `_SUCCESS`
//! younger than a few seconds from `statx`/`stat`, `open` and `readdir`, as a network
//! filesystem's attribute and negative caches do. No test hook is involved: the controller's
//! own `stat`, `readdir` of the folder and `open` are what the shim fools.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cli::{SMOKE, SMOKE_EXEC, journal, out, prefix, puzzletron};

/// Builds the shim into `dir` and returns its path.
fn shim(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/preload/hide_marker.c");
    let so = dir.join("hide_marker.so");
    let o = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("running cc (a C compiler: gcc, which Rust's linker needs anyway)");
    assert!(
        o.status.success(),
        "cc {src:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    so
}

/// The `finished` journal entries of a campaign folder.
fn finished(dir: &Path) -> Vec<Value> {
    journal(dir)
        .into_iter()
        .map(|r| r["entry"].clone())
        .filter(|e| e["t"] == "finished")
        .collect()
}

/// Runs the smoke experiment's first stage (`convert`, one unit) with the local runner and the
/// stub worker, under the shim hiding young markers for `hide_s` (`stat_only`: from `stat`
/// alone) and a visibility bound of `wait_s`: (exit code, stderr, elapsed, finished entries).
fn run(hide_s: u32, stat_only: bool, wait_s: u32) -> (i32, String, Duration, Vec<Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let so = shim(tmp.path());
    let dir = tmp.path().join("c");
    let mut c = puzzletron();
    c.args([
        "campaign",
        "run",
        SMOKE,
        "--runner",
        "local",
        "--execution",
        SMOKE_EXEC,
    ])
    .args(["--stage", "convert", "--dir"])
    .arg(&dir)
    .args(["--command-prefix", &prefix("")])
    .args(["--retry-delay-ms", "50", "--poll-ms", "100", "--gpus", "0"])
    .args(["--output-visibility-wait", &wait_s.to_string(), "--quiet"])
    .env("LD_PRELOAD", &so)
    .env("PZ_HIDE_SECS", hide_s.to_string());
    if stat_only {
        c.env("PZ_HIDE_STAT_ONLY", "1");
    }
    let t = Instant::now();
    let (code, _, err) = out(c.output().expect("running puzzletron"));
    let took = t.elapsed();
    let entries = finished(&dir);
    (code, err, took, entries)
}

/// Hidden from `stat` only: the `readdir` of its folder and the `open` find it at once.
#[test]
fn a_marker_hidden_from_stat_only_is_found_by_readdir_and_open() {
    let (code, err, took, fin) = run(3600, true, 30);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fin.len(), 1, "{fin:?}");
    assert!(fin[0]["class"].is_null(), "{fin:?}");
    let detail = fin[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("not visible to stat at first, then found by readdir/open"),
        "{detail}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// Hidden from every probe for 4 s, bound 60 s: looked for again on later polls, then done;
/// one attempt, the detail says when it became visible.
#[test]
fn a_marker_hidden_for_a_while_is_waited_for_and_the_attempt_succeeds() {
    let (code, err, took, fin) = run(4, false, 60);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fin.len(), 1, "one attempt, not rerun: {fin:?}");
    assert!(fin[0]["class"].is_null(), "{fin:?}");
    let detail = fin[0]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("visible after"), "{detail}");
    assert!(
        took >= Duration::from_secs(3),
        "it waited for the marker: {took:?}"
    );
}

/// Hidden past the bound (2 s): `output_not_visible`, naming the marker's path.
#[test]
fn a_marker_hidden_past_the_bound_is_output_not_visible_naming_the_path() {
    let (code, err, _, fin) = run(3600, false, 2);
    assert_eq!(code, 4, "the stage failed: {err}");
    assert!(!fin.is_empty());
    for f in &fin {
        assert_eq!(f["class"], "output_not_visible", "{fin:?}");
        let detail = f["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("not visible after 2 s") && detail.contains("/_SUCCESS"),
            "{detail}"
        );
    }
}
