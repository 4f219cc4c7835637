//! The sweep example as a user runs it: the README's `--executor local` on a new store, then
//! the same sweep in process on that store (all cached), and arguments refused up front.

mod support;
use support::examples;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

fn sweep_exe() -> PathBuf {
    examples::example_exe("sweep")
}

fn run(args: &[&str], cwd: &Path) -> (ExitStatus, String) {
    examples::run_to_text(Command::new(sweep_exe()).args(args).current_dir(cwd))
}

#[test]
fn local_executor_on_a_new_store_then_cached_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (status, text) = run(
        &["--store", "new", "--executor", "local", "--epochs", "1"],
        d,
    );
    assert!(status.success(), "{text}");
    assert!(text.contains("9 ran, 0 skipped, 0 failed"), "{text}");
    assert!(d.join("metrics.parquet").is_file() && d.join("metrics.svg").is_file());
    // The same sweep in this process: the keys do not depend on the executor.
    let (status, text) = run(&["--store", "new", "--epochs", "1"], d);
    assert!(status.success(), "{text}");
    assert!(text.contains("0 ran, 9 skipped, 0 failed"), "{text}");
    // The example depends on puzzletron by path (a workspace member): the job's closure is
    // its own code (the MLP, the digits data), never puzzletron's items nor its build id (its
    // version is in Cargo.lock, its compiler the toolchain witness), nor a compiled artifact.
    let jobs = d.join("new/jobs");
    let first = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap();
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(first.path().join("record.json")).unwrap()).unwrap();
    let items = rec["owned"]["items"].as_object().expect("owned items");
    assert!(items.len() > 10, "{}", items.len());
    let foreign: Vec<&String> = items
        .keys()
        .filter(|k| {
            let k = k.strip_prefix("file ").unwrap_or(k);
            k.starts_with("compiled ")
                || ["puzzletron::", "puzzletron:", "puzzletron_macros"]
                    .iter()
                    .any(|p| k.starts_with(p))
        })
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");
    assert!(rec["owned"].get("builds").is_none(), "{rec:#}");
}

#[test]
fn bad_arguments_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Usage errors exit 2, as the `puzzletron` command line's do (1 is a failed sweep).
    let (status, text) = run(&["--out", "nodir/m.parquet", "--store", "s"], d);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(
        text.contains("\"nodir\", which is not an existing folder"),
        "{text}"
    );
    let (status, text) = run(&["--epochs", "1", "--epochs", "2", "--store", "s"], d);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(text.contains("--epochs is given twice"), "{text}");
    // `--name=value` is `--name value`: the twice-given check sees through it.
    let (status, text) = run(&["--epochs=1", "--epochs", "2", "--store", "s"], d);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(text.contains("--epochs is given twice"), "{text}");
    let (status, text) = run(&["--epochs=0", "--store", "s"], d);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(text.contains("--epochs: 0 trains nothing"), "{text}");
    let (status, text) = run(&["--force=yes", "--store", "s"], d);
    assert_eq!(status.code(), Some(2), "{text}");
    assert!(text.contains("--force takes no value"), "{text}");
    assert!(
        !d.join("s").exists(),
        "nothing may be written for refused arguments"
    );
}
