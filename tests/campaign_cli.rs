//! The command lines of the `campaign` and `campaign_dry_run` examples: help, bad arguments
//! (exit 2, naming the flag, the value and what is expected), errors that name their path
//! (exit 1), the contract-change hint, and a SIGINT off a terminal (one summary, no retry).
//! The example binaries are built by `cargo test` (or `cargo build --examples`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn dry_run_exe() -> PathBuf {
    support::examples::example_exe("campaign_dry_run")
}

fn run(exe: &Path, args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the example");
    (
        status.code().expect("exit code, not a signal"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn campaign(args: &[&str]) -> (i32, String, String) {
    run(&support::campaign::campaign_exe(), args)
}

const OPTIONS: [&str; 10] = [
    "--dir",
    "--runner",
    "--ray-address",
    "--gpus",
    "--epochs",
    "--poll-ms",
    "--new-revision",
    "--once",
    "--quiet",
    "--help",
];

#[test]
fn campaign_help_lists_every_option_and_exits_0() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("c");
    for flag in ["--help", "-h"] {
        let (code, out, err) = campaign(&["--dir", dir.to_str().unwrap(), flag]);
        assert_eq!(code, 0, "{flag}: {err}");
        assert!(out.starts_with("usage: campaign"), "{out}");
        for o in OPTIONS {
            assert!(out.contains(o), "{flag}: {o} missing from\n{out}");
        }
        assert!(!dir.exists(), "{flag}: the campaign ran");
    }
}

#[test]
fn campaign_rejects_bad_values_naming_the_flag_value_and_expectation() {
    let cases: [(&[&str], &[&str]); 9] = [
        (&["--epochs", "0"], &["--epochs \"0\"", "positive integer"]),
        (&["--epochs", "x"], &["--epochs \"x\"", "positive integer"]),
        (
            &["--gpus", "abc"],
            &[
                "--gpus \"abc\"",
                "\"abc\", not a GPU id",
                "distinct GPU ids",
            ],
        ),
        (
            &["--gpus", "0,0,,"],
            &[
                "--gpus \"0,0,,\"",
                "\"0\" is given twice",
                "distinct GPU ids",
            ],
        ),
        (
            &["--gpus", "0,,1"],
            &["--gpus \"0,,1\"", "item 2 is \"\"", "distinct GPU ids"],
        ),
        (
            &["--epochs", "1", "--epochs", "2"],
            &["--epochs is given twice"],
        ),
        (
            &["--runner", "k8s"],
            &[
                "--runner \"k8s\"",
                "expected local, slurm, baremetal or ray",
            ],
        ),
        (
            &["--runner", "ray"],
            &["--runner ray and --ray-address go together"],
        ),
        (&["--bogus"], &["unknown argument \"--bogus\""]),
    ];
    // A folder of its own, in case a case were accepted (it would run the campaign there).
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("c");
    for (args, want) in cases {
        let mut all = vec!["--dir", dir.to_str().unwrap(), "--quiet"];
        all.extend_from_slice(args);
        let (code, out, err) = campaign(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{args:?}: {w:?} missing from {err}");
        }
        assert!(err.contains("usage: campaign"), "{args:?}: {err}");
        assert!(!dir.exists(), "{args:?}: the campaign ran");
    }
}

#[test]
fn campaign_dir_errors_name_the_path() {
    let root = tempfile::tempdir().unwrap();
    // A regular file.
    let file = root.path().join("f");
    std::fs::write(&file, b"x").unwrap();
    let (code, _, err) = campaign(&["--dir", file.to_str().unwrap(), "--quiet"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("campaign folder {}: it is a file", file.display())),
        "{err}"
    );
    // A non-empty unrelated folder: refused, left as it was.
    let other = root.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), b"mine").unwrap();
    let (code, _, err) = campaign(&["--dir", other.to_str().unwrap(), "--quiet"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&other.display().to_string()), "{err}");
    assert!(err.contains("not empty"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&other)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["notes.txt"]);
}

#[test]
fn campaign_contract_change_hints_at_the_new_revision_flag() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("c");
    let d = dir.to_str().unwrap();
    // One iteration: the journal gets the contract, `prepare` is submitted, then detach.
    let (code, _, err) = campaign(&["--dir", d, "--quiet", "--once", "--epochs", "1"]);
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = campaign(&["--dir", d, "--quiet", "--epochs", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("new_revision(true)"), "library message: {err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("hint: ") && l.contains("--new-revision")),
        "{err}"
    );
    // Let the detached `prepare` job finish before the folder is removed.
    let done = dir.join("work/prepare/0/_SUCCESS");
    let t0 = Instant::now();
    while !done.exists() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
}

#[test]
fn campaign_sigint_off_a_terminal_cancels_once_without_retry_and_one_summary() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("sigint");
    let log = root.path().join("stderr.log");
    // With the live view (plain lines off a terminal): it prints the summary when it ends.
    let mut child = Command::new(support::campaign::campaign_exe())
        .args(["--dir", dir.to_str().unwrap(), "--poll-ms", "100"])
        .args(["--epochs", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap_or_default();
        if j.contains("\"unit\":\"score/3\"") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t1.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("no exit after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        !err.contains("retry in"),
        "a cancel logged as a retry:\n{err}"
    );
    // (The example shows only attempt events with a decision, `... -> ...`: a cancel by the
    // shutdown has none; the shutdown line counts them.)
    assert_eq!(
        err.matches("stages complete;").count(),
        1,
        "the summary must be printed once:\n{err}"
    );
    assert!(err.contains("cancelled by the user"), "{err}");
}

#[test]
fn dry_run_help_and_bad_arguments() {
    let exe = dry_run_exe();
    for flag in ["--help", "-h"] {
        let (code, out, err) = run(&exe, &[flag]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("usage: campaign_dry_run"), "{out}");
    }
    for args in [&["nonexist.yaml"][..], &["a.yaml", "b.yaml"]] {
        let (code, out, err) = run(&exe, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed a plan: {out}");
        assert!(
            err.starts_with(&format!(
                "error: expected no arguments or at least 3 (EXPERIMENT.yaml RUNNER.yaml \
                 EXECUTION.yaml), got {}",
                args.len()
            )),
            "{err}"
        );
        assert!(err.contains("usage: campaign_dry_run"), "{err}");
    }
    let (code, out, err) = run(&exe, &["a", "b", "c", "--bogus"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.starts_with("error: unknown option \"--bogus\""),
        "{err}"
    );
}

#[test]
fn dry_run_missing_file_is_a_display_error_naming_the_path() {
    let exe = dry_run_exe();
    let fixtures = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ));
    let exp = fixtures.join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml");
    let runner = fixtures.join("orchestration/qwen_moe/runner.slurm.yaml");
    let missing = tempfile::tempdir().unwrap().path().join("nope.yaml");
    let (code, out, err) = run(
        &exe,
        &[
            exp.to_str().unwrap(),
            runner.to_str().unwrap(),
            missing.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    assert!(!err.contains("Io {"), "a debug dump: {err}");
    // The same triple with the right file prints the plan.
    let exec = fixtures.join("orchestration/qwen_moe/execution.production.yaml");
    let (code, out, err) = run(
        &exe,
        &[
            exp.to_str().unwrap(),
            runner.to_str().unwrap(),
            exec.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("=== stage "), "{out}");
}

/// The overrides the dry run's `--help` gives as examples (`e.g. A or B`) compile on the fixture
/// the help names (the Qwen MoE production triple), each alone and all together, and a bad
/// override is a usage error (exit 2) naming it.
#[test]
fn dry_run_help_examples_work_on_the_fixture_they_name() {
    let exe = dry_run_exe();
    let (code, help, err) = run(&exe, &["--help"]);
    assert_eq!(code, 0, "{err}");
    let line = help
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("OVERRIDE..."))
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    assert!(line.contains("Qwen MoE production run"), "{help}");
    let after = line.split("e.g.").nth(1).expect("an example in the help");
    let examples: Vec<&str> = after
        .split_whitespace()
        .filter(|w| w.contains('='))
        .collect();
    assert_eq!(examples.len(), 2, "{line}");
    let fixtures = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ));
    let files = [
        fixtures.join("families/qwen3_5/qwen3p6_35b_a3b/runs/production.yaml"),
        fixtures.join("orchestration/qwen_moe/runner.slurm.yaml"),
        fixtures.join("orchestration/qwen_moe/execution.production.yaml"),
    ];
    let mut args: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let (code, plain, err) = run(&exe, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    for ex in &examples {
        let mut one = args.clone();
        one.push(ex.to_string());
        let (code, out, err) = run(&exe, &one.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "help example {ex}: {err}");
        assert!(out.contains("=== stage "), "{ex}: {out}");
    }
    args.extend(examples.iter().map(|s| s.to_string()));
    let (code, out, err) = run(&exe, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    // `pruning.eval_samples=4` reaches the plan (the contract hash changes).
    assert_ne!(
        plain.lines().find(|l| l.contains("contract")),
        out.lines().find(|l| l.contains("contract")),
        "{out}"
    );
    let mut bad = args[..3].to_vec();
    bad.push("a.b=[1".to_string());
    let (code, out, err) = run(&exe, &bad.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(err.contains("override \"a.b=[1\""), "{err}");
}
