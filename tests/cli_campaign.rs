//! The `puzzletron` binary end to end on the shared Puzzletron fixtures, with a stub worker in
//! place of the Python stage workers: help examples, usage and config errors, compile and dry
//! run, run / detach / status from a second process / cancel / re-attach / report on the
//! local executor, the report's wasted GPU-hours against a sum computed here from the raw
//! files, and the same flow on the local Slurm cluster (with `cancel --tag` for orphans).

mod support;
use support::plan::PlanBuilder;
use support::{cli, watchdog};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cli::{SMOKE, SMOKE_EXEC, campaign, fixtures, journal, prefix, puzzletron, run};
use watchdog::Watchdog;

/// The smoke experiment's Slurm runner (max_nodes 1, gpus_per_node 1).
const SLURM_RUNNER: &str = "orchestration/qwen3p5_0p8b/runner.slurm.yaml";

/// Every `$ puzzletron campaign compile|dry-run ...` example of the help texts runs on the
/// fixtures and succeeds; every help exits 0 and documents the exit codes.
#[test]
fn help_examples_run_on_the_fixtures() {
    let helps: &[&[&str]] = &[
        &["--help"],
        &["campaign", "--help"],
        &["campaign", "compile", "--help"],
        &["campaign", "dry-run", "--help"],
        &["campaign", "run", "--help"],
        &["campaign", "status", "--help"],
        &["campaign", "cancel", "--help"],
        &["campaign", "retry", "--help"],
        &["campaign", "report", "--help"],
        &["sweep", "status", "--help"],
        &["sweep", "gc", "--help"],
        &["sweep", "repair", "--help"],
    ];
    let mut ran = 0;
    for h in helps {
        let (code, text, err) = run(h);
        assert_eq!(code, 0, "{h:?}: {err}");
        if h.len() > 2 || h[0] == "--help" {
            assert!(
                text.contains("Exit status: 0 ") && text.contains("1 error, 2 usage error"),
                "{h:?}:\n{text}"
            );
            assert!(text.contains("Examples"), "{h:?}:\n{text}");
        }
        for line in text.lines() {
            let Some(cmd) = line.trim().strip_prefix("$ ") else {
                continue;
            };
            // `VAR=value ... puzzletron ARGS`: the example runs as written, with only the
            // variables it sets (none of the fixtures' from `cli::puzzletron`).
            let words: Vec<&str> = cmd.split_whitespace().collect();
            let Some(at) = words.iter().position(|w| *w == "puzzletron") else {
                continue;
            };
            let env: Vec<(&str, &str)> = words[..at]
                .iter()
                .filter_map(|w| w.split_once('='))
                .collect();
            if env.len() != at {
                continue;
            }
            let args: Vec<&str> = words[at + 1..].to_vec();
            if !matches!(args.get(1), Some(&"compile") | Some(&"dry-run")) {
                continue;
            }
            let mut c = puzzletron();
            for v in [
                "PUZZLETRON_RUN_ROOT",
                "PUZZLETRON_DATASET_PATH",
                "PUZZLETRON_DATASET_REVISION",
            ] {
                c.env_remove(v);
            }
            let (code, out, err) = cli::out(c.envs(env).args(&args).output().unwrap());
            assert_eq!(code, 0, "example `{cmd}` failed:\n{err}");
            if !args.contains(&"--json") {
                assert!(out.contains("stages,"), "example `{cmd}`:\n{out}");
            } else {
                let v: serde_json::Value = serde_json::from_str(&out).unwrap();
                assert!(v["stages"].as_array().is_some_and(|s| !s.is_empty()));
            }
            ran += 1;
        }
    }
    assert!(ran >= 5, "only {ran} examples ran");
}

#[test]
fn usage_errors_exit_2_and_config_errors_exit_1_naming_the_problem() {
    let (code, _, err) = run(&["campaign", "frobnicate"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(&["campaign", "compile", SMOKE]);
    assert_eq!(code, 2, "missing --runner: {err}");
    assert!(err.contains("--runner"), "{err}");
    let (code, _, err) = run(&["campaign", "status", "/nonexistent/campaign"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent/campaign is not a campaign folder"),
        "{err}"
    );
    let (code, _, err) = campaign(
        "compile",
        "local",
        SMOKE_EXEC,
        &["--override", "pruning.no_such_key.x=1"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pruning"), "the error names the key: {err}");
    let (code, _, err) = run(&["campaign", "compile", "nope.yaml", "--runner", "local"]);
    assert_eq!(code, 1);
    assert!(err.contains("nope.yaml"), "{err}");
    let (code, _, err) = run(&["sweep", "status", "/nonexistent/store"]);
    assert_eq!(code, 1);
    assert!(err.contains("not a sweep store"), "{err}");
    let (code, _, err) = run(&["campaign", "cancel", "--tag", "a b"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn compile_and_dry_run_print_the_plan() {
    let (code, out, err) = campaign("compile", "local", SMOKE_EXEC, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("10 stages, 10 work items"), "{out}");
    for s in ["convert", "tokenize_data", "replacement_scoring", "mip"] {
        assert!(out.lines().any(|l| l.starts_with(s)), "{s} missing:\n{out}");
    }
    let (code, out, err) = campaign(
        "dry-run",
        "local",
        SMOKE_EXEC,
        &["--stage", "convert", "--json"],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(out.contains("convert"), "{v}");
    assert!(
        !out.contains("tokenize_data"),
        "only the selected stage: {out}"
    );
}

/// The table's partition column is the partition each sbatch script gets (the runner's when the
/// stage sets none), not the stage's override.
#[test]
fn the_plan_table_shows_the_resolved_partition() {
    for cmd in ["compile", "dry-run"] {
        let (code, out, err) = campaign(cmd, SLURM_RUNNER, SMOKE_EXEC, &[]);
        assert_eq!(code, 0, "{cmd}: {err}");
        let header = out.lines().find(|l| l.starts_with("stage ")).unwrap();
        let col = header.find("partition").unwrap();
        for s in ["convert", "tokenize_data", "mip"] {
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{s} ")))
                .unwrap_or_else(|| panic!("{s} missing:\n{out}"));
            assert!(
                line[col..].starts_with("REPLACE_WITH_SLURM_PARTITION"),
                "{cmd}: {s}: {line}\n{out}"
            );
        }
        if cmd == "dry-run" {
            assert!(
                out.contains("#SBATCH --partition=REPLACE_WITH_SLURM_PARTITION\n"),
                "{out}"
            );
        }
    }
    // Not Slurm: no partition.
    let (code, out, err) = campaign("compile", "local", SMOKE_EXEC, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("REPLACE_WITH_SLURM_PARTITION"), "{out}");
}

/// `--stage` of a catalog stage the experiment disables names the switch (file, line, key)
/// and the override that enables it, instead of calling the stage unknown.
#[test]
fn a_disabled_stage_in_the_filter_names_its_switch() {
    let (code, _, err) = campaign(
        "compile",
        "local",
        SMOKE_EXEC,
        &["--stage", "depth_importance"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(!err.contains("unknown stage"), "{err}");
    assert!(
        err.contains(&format!("{SMOKE}:131:"))
            && err.contains("stage filter selects `depth_importance`, which is disabled")
            && err.contains("`depth_importance.enabled` is false")
            && err.contains("-o depth_importance.enabled=true"),
        "{err}"
    );
    // With the override the stage is in the plan.
    let (code, out, err) = campaign(
        "compile",
        "local",
        SMOKE_EXEC,
        &["-o", "depth_importance.enabled=true"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.starts_with("depth_importance ")),
        "{out}"
    );
    // A real typo still gets the suggestion.
    let (code, _, err) = campaign(
        "compile",
        "local",
        SMOKE_EXEC,
        &["--stage", "depth_importanc"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown stage `depth_importanc`"), "{err}");
}

/// A stage over `runner.slurm.max_nodes` names the runner file's line, why the stage takes
/// that many nodes, and the fixes.
#[test]
fn too_many_nodes_names_the_runner_file_the_reason_and_the_fix() {
    let (code, _, err) = campaign(
        "compile",
        SLURM_RUNNER,
        SMOKE_EXEC,
        &["-o", "pruning.automodel.parallel.tp=2"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("needs 2 node(s) but runner.slurm.max_nodes is 1")
            && err.contains(&format!("(set at {SLURM_RUNNER}:11:"))
            && err.contains("one instance needs 2 GPU(s) (mesh tp=2) but gpus_per_node is 1")
            && err.contains("raise `runner.slurm.max_nodes` to 2")
            && err.contains("raise gpus_per_node")
            && err.contains("lower tp"),
        "{err}"
    );
    let tmp = tempfile::tempdir().unwrap();
    let exec = tmp.path().join("execution.yaml");
    std::fs::write(
        &exec,
        "execution:\n  defaults: {gpus_per_node: 1}\n  stages:\n    convert: {strategy: sharded, instances: 4}\n",
    )
    .unwrap();
    let (code, _, err) = campaign("compile", SLURM_RUNNER, exec.to_str().unwrap(), &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("stage `convert` needs 4 node(s) but runner.slurm.max_nodes is 1")
            && err.contains(&format!("(set at {SLURM_RUNNER}:11:"))
            && err.contains("4 instance(s) of 1 GPU(s) at gpus_per_node=1")
            && err.contains("raise `runner.slurm.max_nodes` to 4")
            && err.contains("execution.stages.convert.instances"),
        "{err}"
    );
}

/// `--json` of compile and dry-run carries the warnings the text output prints.
#[test]
fn json_output_carries_the_unchecked_override_warning() {
    for cmd in ["compile", "dry-run"] {
        let args = [
            "campaign",
            cmd,
            SMOKE,
            "--runner",
            "local",
            "--execution",
            SMOKE_EXEC,
            "-o",
            "pruning.eval_samples=abc",
        ];
        let (code, out, err) = run(&args);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(
            out.contains("pruning.eval_samples=abc (was int, now string)"),
            "{cmd}: {out}"
        );
        let mut json = args.to_vec();
        json.push("--json");
        let (code, out, err) = run(&json);
        assert_eq!(code, 0, "{cmd}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let w = v["warnings"].as_array().expect("a warnings list");
        assert_eq!(w.len(), 1, "{cmd}: {v}");
        let w = w[0].as_str().unwrap();
        assert!(
            w.contains("unchecked") && w.contains("pruning.eval_samples=abc (was int, now string)"),
            "{cmd}: {w}"
        );
        // No warning: an empty list.
        let mut plain = args[..7].to_vec();
        plain.push("--json");
        let (code, out, err) = run(&plain);
        assert_eq!(code, 0, "{cmd}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["warnings"], serde_json::json!([]), "{cmd}");
    }
}

/// A path that does not exist, a file where a folder is expected, and `--out` naming a folder
/// are each said as such.
#[test]
fn paths_errors_say_what_the_path_is() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let file = file.to_str().unwrap();
    let missing = tmp.path().join("missing");
    let missing = missing.to_str().unwrap();
    let (code, _, err) = run(&["sweep", "status", file]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!(
            "{file} is not a sweep store: it is a file, not a folder"
        )),
        "{err}"
    );
    for cmd in ["status", "report", "cancel"] {
        let (code, _, err) = run(&["campaign", cmd, missing]);
        assert_eq!(code, 1, "{cmd}: {err}");
        assert!(
            err.contains(&format!(
                "{missing} is not a campaign folder: the path does not exist"
            )),
            "{cmd}: {err}"
        );
        let (code, _, err) = run(&["campaign", cmd, file]);
        assert_eq!(code, 1, "{cmd}: {err}");
        assert!(
            err.contains(&format!(
                "{file} is not a campaign folder: it is a file, not a folder"
            )),
            "{cmd}: {err}"
        );
    }
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (code, _, err) = run(&["campaign", "status", empty.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("it has no controller/journal.jsonl"), "{err}");
    // --out: an existing folder gets report.html; a missing one ending in `/` is refused.
    let c = tmp.path().join("c");
    std::fs::create_dir_all(c.join("controller")).unwrap();
    std::fs::write(c.join("controller/journal.jsonl"), "").unwrap();
    let c = c.to_str().unwrap();
    let outdir = tmp.path().join("out");
    std::fs::create_dir(&outdir).unwrap();
    let slash = format!("{}/", outdir.display());
    let (code, out, err) = run(&["campaign", "report", c, "--no-sacct", "--out", &slash]);
    assert_eq!(code, 0, "{err}");
    assert!(outdir.join("report.html").is_file(), "{out}");
    assert!(out.trim_end().ends_with("report.html"), "{out}");
    let nodir = format!("{}/nodir/", tmp.path().display());
    let (code, _, err) = run(&["campaign", "report", c, "--no-sacct", "--out", &nodir]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("--out {nodir} names a folder that does not exist"))
            && err.contains("give a file name"),
        "{err}"
    );
}

fn run_args<'a>(dir: &'a str, stub: &'a str) -> Vec<&'a str> {
    vec![
        "campaign",
        "run",
        SMOKE,
        "--runner",
        "local",
        "--execution",
        SMOKE_EXEC,
        "--dir",
        dir,
        "--command-prefix",
        stub,
        "--allow-oom-retry",
        "sort",
        "--retry-delay-ms",
        "50",
        "--poll-ms",
        "50",
        "--gpus",
        "0,1",
        "--quiet",
    ]
}

fn status_json(dir: &str) -> (i32, serde_json::Value, Duration) {
    let t = Instant::now();
    let (code, out, err) = run(&["campaign", "status", dir, "--json"]);
    let took = t.elapsed();
    assert!(code == 0 || code == 3 || code == 4, "status failed: {err}");
    (code, serde_json::from_str(&out).unwrap(), took)
}

/// The wasted GPU-hours by class, computed from the journal and the local executor's `exit`
/// records without the report code: every attempt that finished with a failure class, GPUs
/// (1 per unit in the smoke plan) x (end - start).
fn independent_waste(dir: &Path) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for r in journal(dir) {
        let e = &r["entry"];
        if e["t"] != "finished" || e["class"].is_null() {
            continue;
        }
        let id = e["attempt_id"].as_str().unwrap();
        let exit = std::fs::read_to_string(dir.join("attempts").join(id).join("exit")).unwrap();
        let field = |k: &str| -> u64 {
            exit.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{id}: no {k} in {exit}"))
                .parse()
                .unwrap()
        };
        let hours = (field("end_ms") - field("start_ms")) as f64 / 3_600_000.0;
        *m.entry(e["class"].as_str().unwrap().to_string())
            .or_insert(0.0) += hours;
    }
    m
}

/// The `data-gpu-hours` of the waste table's rows, by class.
fn report_waste(html: &str) -> BTreeMap<String, f64> {
    let table = &html[html.find("<table id=\"waste\">").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    let mut m = BTreeMap::new();
    for row in table.split("<tr data-class=\"").skip(1) {
        let class = &row[..row.find('"').unwrap()];
        let v = row.split("data-gpu-hours=\"").nth(1).unwrap();
        let v: f64 = v[..v.find('"').unwrap()].parse().unwrap();
        m.insert(class.to_string(), v);
    }
    m
}

/// Run detached with an OOM on `sort` and a transient failure on `build_library`, `status`
/// from other processes while it runs (lease held by the controller's pid; the controller is
/// never blocked), cancel through the lease holder while `sort_sanity` runs (a cancelled
/// stage), re-run to completion, `--once` then re-attach, and the report's waste equals the
/// independent sum.
#[test]
fn local_run_detach_status_cancel_reattach_report() {
    let _w = Watchdog::start(
        "local_run_detach_status_cancel_reattach_report",
        Duration::from_secs(240),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let d = dir.to_str().unwrap().to_string();
    let stub = prefix(
        "--sleep-ms 150 --slow sort_sanity=60000 --fail sort=oom --fail build_library=transient",
    );
    let mut args = run_args(&d, &stub);
    args.push("--detach");
    let (code, out, err) = run(&args);
    assert_eq!(code, 3, "--detach returns 3 (detached):\n{out}\n{err}");
    let pid: i32 = out
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {out}"));

    // Status from other processes while it runs: the lease is held by the controller.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut polls = 0;
    let st = loop {
        let (code, v, took) = status_json(&d);
        polls += 1;
        assert_eq!(code, 3, "not finished while running: {v}");
        assert!(took < Duration::from_secs(5), "status took {took:?}");
        assert_eq!(v["lease"]["held"], true, "{v}");
        assert_eq!(v["lease"]["lock_pid"], pid, "{v}");
        assert!(v["lease_text"].as_str().unwrap().contains("held by"), "{v}");
        let sanity_live = v["live"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["stage"] == "sort_sanity" && a["outcome"] == "live");
        // Wait for build_library's transient failure and retry too, so the cancel only
        // catches sort_sanity.
        let library_done = v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == "build_library" && s["status"] == "done");
        if sanity_live && library_done {
            break v;
        }
        assert!(Instant::now() < deadline, "sort_sanity never ran: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(polls >= 1);
    let stages = st["stages"].as_array().unwrap();
    let sort = stages.iter().find(|s| s["id"] == "sort").unwrap();
    assert_eq!(sort["status"], "done", "sort retried after its OOM: {st}");
    let (code, text, _) = run(&["campaign", "status", &d]);
    assert_eq!(code, 3);
    assert!(
        text.contains(&format!("pid {pid}"))
            || text.contains(&format!(":{pid}"))
            || text.contains(&pid.to_string()),
        "{text}"
    );
    assert!(text.contains("since"), "says since when: {text}");

    // Cancel through the lease holder.
    let (code, out, err) = run(&["campaign", "cancel", &d, "--wait", "60"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, v, _) = status_json(&d);
    assert_eq!(code, 3, "cancelled, not finished: {v}");
    assert_eq!(v["lease"]["held"], false, "{v}");
    assert_eq!(v["live"].as_array().unwrap().len(), 0, "{v}");
    // Shown as cancelled, by whom and which jobs; never `running` with nothing live.
    let by = v["cancelled"]["by"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"));
    assert!(
        by.starts_with("`puzzletron campaign cancel` (user ") && by.contains(", pid "),
        "{by}"
    );
    let cancelled: Vec<&str> = v["cancelled"]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        cancelled.iter().any(|a| a.contains(".sort_sanity.")),
        "{cancelled:?}"
    );
    for s in v["stages"].as_array().unwrap() {
        assert_ne!(s["status"], "running", "{s}");
        if s["status"] != "done" {
            assert_eq!(s["state"], "cancelled", "{s}");
        }
    }
    let (_, text, _) = run(&["campaign", "status", &d]);
    assert!(
        text.contains("cancelled by `puzzletron campaign cancel` (user ")
            && text.contains("attempt(s) cancelled:"),
        "{text}"
    );
    let early = tmp.path().join("cancelled.html");
    let (code, _, err) = run(&["campaign", "report", &d, "--out", early.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&early).unwrap();
    assert!(
        html.contains("id=\"cancelled\"") && html.contains("data-state=\"cancelled\""),
        "the report says cancelled"
    );
    // SAFETY: signal 0 only checks the pid exists.
    assert!(
        unsafe { libc::kill(pid, 0) } != 0 || {
            std::thread::sleep(Duration::from_secs(2));
            unsafe { libc::kill(pid, 0) != 0 }
        },
        "the controller exited"
    );

    // Run again: `--once` leaves the slow-free rerun's first job running, then re-attach.
    let stub2 = prefix("--sleep-ms 150 --slow sort_sanity=1500");
    let mut once = run_args(&d, &stub2);
    once.push("--once");
    let (code, _, err) = run(&once);
    assert_eq!(code, 3, "--once detaches: {err}");
    assert!(err.contains("detached with"), "{err}");
    let (code, _, err) = run(&run_args(&d, &stub2));
    assert_eq!(code, 0, "the rerun completes: {err}");
    assert!(
        err.contains("1 re-attached") || err.contains("2 re-attached"),
        "the rerun re-attaches to the job --once left running: {err}"
    );
    let (code, v, _) = status_json(&d);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["finished"], true);
    assert!(
        v.get("cancelled").is_none(),
        "run again: no longer cancelled: {v}"
    );

    // The report, written at the end, and on demand.
    assert!(dir.join("report.html").is_file());
    let out_file = tmp.path().join("r.html");
    let (code, _, err) = run(&[
        "campaign",
        "report",
        &d,
        "--out",
        out_file.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(&out_file).unwrap();
    assert!(!html.contains("<script"), "no script");
    assert!(
        !html.contains("http://")
            || !html
                .replace("http://www.w3.org/2000/svg", "")
                .contains("http://"),
        "no network"
    );
    let got = report_waste(&html);
    let want = independent_waste(&dir);
    for class in ["oom", "transient", "cancelled"] {
        assert!(
            want.contains_key(class),
            "the campaign has a {class} failure: {want:?}"
        );
    }
    let total: f64 = want.values().sum();
    assert!(
        (got["total"] - total).abs() < 1e-9,
        "report {got:?} vs independent {want:?}"
    );
    for (k, v) in &want {
        assert!(
            (got[k] - v).abs() < 1e-9,
            "{k}: report {got:?} vs independent {want:?}"
        );
    }
    // Every submitted attempt has one bar; each retry is linked.
    let attempts = journal(&dir)
        .iter()
        .filter(|r| r["entry"]["t"] == "submitted")
        .count();
    assert_eq!(html.matches("<rect class=\"bar\"").count(), attempts);
    assert!(
        html.matches("<line class=\"retry\"").count() >= 3,
        "oom, transient and cancel retries"
    );
}

/// A unit waiting for its retry is `backing off until HH:MM:SS UTC (attempt n, class)`, not
/// `running` with nothing live; after a cancel and a rerun in which `sort` fails for good, the
/// stages below it are `blocked by sort`: in `status`, `status --json` and the report.
#[test]
fn backing_off_and_blocked_stages_are_shown_as_themselves() {
    let _w = Watchdog::start(
        "backing_off_and_blocked_stages_are_shown_as_themselves",
        Duration::from_secs(240),
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let stub = prefix("--sleep-ms 100 --fail width_importance=transient --fail sort=config!");
    let mut args = run_args(&d, &stub);
    // A back-off of 15-20 s: the retry waits while we look (and the rerun waits out the rest).
    let delay = args.iter().position(|a| *a == "--retry-delay-ms").unwrap() + 1;
    args[delay] = "20000";
    args.push("--detach");
    let (code, out, err) = run(&args);
    assert_eq!(code, 3, "{out}\n{err}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let stage = |v: &serde_json::Value, id: &str| -> serde_json::Value {
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no stage {id}: {v}"))
    };
    let wi = loop {
        let (_, v, _) = status_json(&d);
        let wi = stage(&v, "width_importance");
        if wi["status"] == "backing_off" {
            break wi;
        }
        assert_ne!(wi["status"], "done", "never backed off: {v}");
        assert!(Instant::now() < deadline, "no back-off seen: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(wi["live_units"], 0, "{wi}");
    let state = wi["state"].as_str().unwrap();
    assert!(
        state.starts_with("backing off until ")
            && state.contains(" UTC (attempt 2, ")
            && state.ends_with(')'),
        "{state}"
    );
    let (_, text, _) = run(&["campaign", "status", &d]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("width_importance") && l.contains(state)),
        "{text}"
    );
    let html = tmp.path().join("r.html");
    let (code, _, err) = run(&["campaign", "report", &d, "--out", html.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(std::fs::read_to_string(&html).unwrap().contains(state));
    let (code, out, err) = run(&["campaign", "cancel", &d, "--wait", "60"]);
    assert_eq!(code, 0, "{out}\n{err}");

    // Run again with short delays: width_importance's retry passes, sort fails for good.
    let (code, _, err) = run(&run_args(&d, &stub));
    assert_eq!(code, 4, "sort failed (exit 4): {err}");
    let (_, v, _) = status_json(&d);
    assert!(v.get("cancelled").is_none(), "{v}");
    assert_eq!(stage(&v, "sort")["status"], "failed", "{v}");
    for id in ["sort_sanity", "width_sanity", "build_library", "mip"] {
        let s = stage(&v, id);
        assert_eq!(
            (s["status"].as_str(), s["state"].as_str()),
            (Some("blocked"), Some("blocked by sort")),
            "{id}: {s}"
        );
    }
    let (_, text, _) = run(&["campaign", "status", &d]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("width_sanity") && l.contains("blocked by sort")),
        "{text}"
    );
    let (code, _, err) = run(&["campaign", "report", &d, "--out", html.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read_to_string(&html)
            .unwrap()
            .contains("data-state=\"blocked by sort\"")
    );
}

/// The stub's invocation log: (stage, attempt) of every `stub.<attempt>.json` it wrote under
/// `dir/work`, sorted.
fn stub_runs(dir: &Path) -> Vec<(String, u64)> {
    fn walk(d: &Path, out: &mut Vec<(String, u64)>) {
        let Ok(entries) = std::fs::read_dir(d) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                walk(&p, out);
            } else if name.starts_with("stub.") && name.ends_with(".json") {
                let v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                out.push((
                    v["stage"].as_str().unwrap().to_string(),
                    v["attempt"].as_u64().unwrap(),
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("work"), &mut out);
    out.sort();
    out
}

/// `campaign retry D`: a stage failed out of memory (no OOM retry allowed), the stages below
/// it blocked; the failure names the command; retried in place with more resources, the
/// campaign completes, and the finished stages ran once (the stub's invocation log).
#[test]
fn campaign_retry_reopens_a_failed_stage_in_place() {
    let _w = Watchdog::start(
        "campaign_retry_reopens_a_failed_stage_in_place",
        Duration::from_secs(240),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let d = dir.to_str().unwrap().to_string();
    let stub = prefix("--sleep-ms 50 --fail sort=oom");
    let mut args: Vec<&str> = run_args(&d, &stub);
    // No OOM retry for sort in the first run.
    let at = args.iter().position(|a| *a == "--allow-oom-retry").unwrap();
    args.drain(at..at + 2);
    let (code, _, err) = run(&args);
    assert_eq!(code, 4, "sort failed: {err}");
    assert!(
        err.contains("puzzletron campaign retry DIR --allow-oom-retry STAGE"),
        "the OOM failure names the command: {err}"
    );
    let (_, v, _) = status_json(&d);
    let status = |v: &serde_json::Value, id: &str| {
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .map(|s| s["status"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(status(&v, "sort"), "failed", "{v}");
    assert_eq!(status(&v, "mip"), "blocked", "{v}");
    let before = stub_runs(&dir);
    let finished: Vec<String> = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "done")
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    assert!(finished.len() >= 3, "{v}");

    // An unknown stage is a usage error, nothing runs.
    let (code, _, err) = run(&["campaign", "retry", &d, "--allow-oom-retry", "srot"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a stage of the campaign"), "{err}");

    let (code, _, err) = run(&[
        "campaign",
        "retry",
        &d,
        "--allow-oom-retry",
        "sort",
        "--gpus",
        "0,1",
        "--poll-ms",
        "50",
        "--quiet",
    ]);
    assert_eq!(code, 0, "the retried campaign completes: {err}");
    assert!(err.contains("retrying in place: sort"), "{err}");
    let (code, v, _) = status_json(&d);
    assert_eq!(code, 0, "{v}");
    assert!(
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "done"),
        "{v}"
    );

    // One run per stage finished before the retry; sort twice; the rest once.
    let after = stub_runs(&dir);
    for s in &finished {
        let runs: Vec<_> = after.iter().filter(|(st, _)| st == s).collect();
        assert_eq!(runs.len(), 1, "{s} ran again: {after:?}");
        assert!(before.contains(runs[0]), "{s}");
    }
    let sort: Vec<u64> = after
        .iter()
        .filter(|(s, _)| s == "sort")
        .map(|r| r.1)
        .collect();
    assert_eq!(sort, [1, 2], "{after:?}");
    // The journal: who retried, then sort's second attempt with more resources.
    let j = journal(&dir);
    let retried = j
        .iter()
        .find(|r| r["entry"]["kind"] == "retry_failed")
        .unwrap_or_else(|| panic!("no retry_failed event"));
    let msg = retried["entry"]["message"].as_str().unwrap();
    assert!(
        msg.contains("asked by `puzzletron campaign retry` (user ")
            && msg.contains("sort/0")
            && msg.contains("with more resources: sort/0"),
        "{msg}"
    );
    let intent = j
        .iter()
        .find(|r| {
            r["entry"]["t"] == "intent"
                && r["entry"]["unit"] == "sort/0"
                && r["entry"]["attempt"] == 2
        })
        .unwrap_or_else(|| panic!("no second sort attempt"));
    assert_eq!(intent["entry"]["more_resources"], true, "{intent}");
}

/// A journal line or a `plan.json` that cannot be read: `status` and the report show what was
/// read, naming the file, the line and the last good record, and what is missing.
#[test]
fn an_unreadable_journal_line_or_plan_is_named_and_the_rest_shown() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let ctl = dir.join("controller");
    std::fs::create_dir_all(&ctl).unwrap();
    let rec = |seq: u64, at: u64, e: serde_json::Value| {
        serde_json::json!({"seq": seq, "at_ms": at, "entry": e}).to_string()
    };
    let lines = [
        rec(
            1,
            1000,
            serde_json::json!({"t":"header","format":1,"nonce":"n1","contract_hash":"h"}),
        ),
        rec(
            2,
            2000,
            serde_json::json!({"t":"intent","unit":"a/0","attempt":1,"attempt_id":"n1.a.0.a1","resume":false,"more_resources":false}),
        ),
        "{\"seq\": 3, garbage".to_string(),
        rec(
            4,
            4000,
            serde_json::json!({"t":"intent","unit":"b/0","attempt":1,"attempt_id":"n1.b.0.a1","resume":false,"more_resources":false}),
        ),
    ];
    std::fs::write(ctl.join("journal.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(ctl.join("plan.json"), "{\"stages\": [}").unwrap();
    let d = dir.to_str().unwrap();
    let (code, v, _) = status_json(d);
    assert_eq!(code, 3, "{v}");
    let problems: Vec<&str> = v["problems"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("plan.json: line 1: not a campaign plan"),
        "{problems:?}"
    );
    assert!(
        problems[1].contains("journal.jsonl: line 3: not a journal record")
            && problems[1].contains("the 2 records before it")
            && problems[1].contains("missing: everything after it"),
        "{problems:?}"
    );
    assert_eq!(v["attempts"], 1, "what was read is shown: {v}");
    let (_, text, _) = run(&["campaign", "status", d]);
    assert!(
        text.contains("warning: ") && text.contains("journal.jsonl: line 3"),
        "{text}"
    );
    let out = tmp.path().join("r.html");
    let (code, _, err) = run(&["campaign", "report", d, "--out", out.to_str().unwrap()]);
    assert_eq!(code, 0, "the report renders what it has: {err}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(
        html.contains("not read fully") && html.contains("journal.jsonl: line 3"),
        "the report says what is missing"
    );
    assert!(html.contains("n1.a.0.a1"), "and shows what was read");
}

/// `status --json` lists the nodes the controller excluded (when, which, why), as the text
/// status and the report do.
#[test]
fn status_json_lists_the_excluded_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let ctl = dir.join("controller");
    std::fs::create_dir_all(&ctl).unwrap();
    let lines = [
        serde_json::json!({"seq": 1, "at_ms": 1000, "entry": {"t":"header","format":1,"nonce":"n1","contract_hash":"h"}}),
        serde_json::json!({"seq": 2, "at_ms": 2000, "entry": {"t":"node_excluded","node":"h6","reason":"its SSH host key was refused"}}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(ctl.join("journal.jsonl"), text.join("\n") + "\n").unwrap();
    let (_, v, _) = status_json(dir.to_str().unwrap());
    assert_eq!(
        v["excluded_nodes"],
        serde_json::json!([{"at_ms": 2000, "node": "h6", "reason": "its SSH host key was refused"}]),
        "{v}"
    );
    let (_, text, _) = run(&["campaign", "status", dir.to_str().unwrap()]);
    assert!(text.contains("h6"), "{text}");
}

/// Items of the stub's record: the catalog's own command comes after the prefix.
#[test]
fn the_stub_gets_the_catalog_command_after_the_prefix() {
    let _w = Watchdog::start(
        "the_stub_gets_the_catalog_command_after_the_prefix",
        Duration::from_secs(120),
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let stub = prefix("--sleep-ms 10");
    let mut args = run_args(&d, &stub);
    args.extend(["--stage", "convert"]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let rec: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(&d).join("work/convert/0/stub.1.json")).unwrap(),
    )
    .unwrap();
    let argv: Vec<&str> = rec["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(!argv.is_empty(), "{rec}");
    assert!(
        argv.iter().any(|a| a.contains("convert")),
        "the catalog's convert command: {argv:?}"
    );
    assert_eq!(
        rec["cuda_visible_devices"]
            .as_str()
            .map(|s| s.split(',').count()),
        Some(1),
        "{rec}"
    );
}

/// `--notify`: a command gets every stage completion and the campaign's end as JSON on
/// stdin; a notifier that fails does not stop the campaign.
#[test]
fn notify_runs_a_command_per_event_and_a_failing_one_is_harmless() {
    let _w = Watchdog::start("notify_runs_a_command_per_event", Duration::from_secs(120));
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let log = tmp.path().join("events.jsonl");
    let script = tmp.path().join("notify.sh");
    std::fs::write(&script, format!("#!/bin/sh\ncat >> {}\n", log.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let stub = prefix("--sleep-ms 10 --fail tokenize_data=config");
    let notify = script.display().to_string();
    let mut args = run_args(&d, &stub);
    args.extend([
        "--stage",
        "convert",
        "--stage",
        "tokenize_data",
        "--notify",
        &notify,
    ]);
    let (code, _, err) = run(&args);
    assert_eq!(code, 4, "tokenize_data fails for good (config): {err}");
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<(&str, Option<&str>)> = events
        .iter()
        .map(|e| (e["event"].as_str().unwrap(), e["stage"].as_str()))
        .collect();
    assert!(
        kinds.contains(&("stage_done", Some("convert"))),
        "{kinds:?}"
    );
    assert!(
        kinds.contains(&("stage_failed", Some("tokenize_data"))),
        "{kinds:?}"
    );
    assert_eq!(kinds.last().unwrap().0, "campaign_end", "{kinds:?}");
    assert_eq!(events.last().unwrap()["detail"]["complete"], false);

    // A notifier that exits non-zero: warned about, the campaign completes.
    let d2 = tmp.path().join("c2").to_str().unwrap().to_string();
    let mut args = run_args(&d2, &stub);
    args.truncate(args.len());
    let ok_stub = prefix("--sleep-ms 10");
    let mut args2 = run_args(&d2, &ok_stub);
    args2.extend(["--stage", "convert", "--notify", "false"]);
    let (code, _, err) = run(&args2);
    assert_eq!(code, 0, "{err}");
    // The notifier's failure is a `tracing` warning, which the CLI prints on stderr.
    assert!(
        err.contains("WARN") && err.contains("notify command failed (the campaign goes on)"),
        "{err}"
    );
    assert!(err.contains("command=\"false\""), "{err}");
}

fn slurm_up(test: &str) -> bool {
    let wanted = std::env::var("PUZZLETRON_SLURM_TESTS").is_ok_and(|v| v == "1");
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    match (wanted, up) {
        (true, true) => true,
        (true, false) => {
            panic!("{test}: PUZZLETRON_SLURM_TESTS=1 but no Slurm cluster answers `sinfo`")
        }
        (false, _) => {
            eprintln!(
                "{test}: skipped (set PUZZLETRON_SLURM_TESTS=1 to run it on the local Slurm cluster)"
            );
            false
        }
    }
}

fn squeue_names() -> Vec<String> {
    squeue_names_in(&[])
}

/// Names of the jobs in squeue, only those in `states` when it is not empty.
fn squeue_names_in(states: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("squeue");
    cmd.args(["-h", "-o", "%j"]);
    if !states.is_empty() {
        cmd.args(["-t", &states.join(",")]);
    }
    let o = cmd.output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// On the local Slurm cluster: run detached, status while it runs, to completion, report with
/// nodes from sacct; then a campaign whose controller is killed leaves orphans that `cancel
/// --tag` removes.
#[cfg_attr(
    not(puzzletron_slurm_tests),
    ignore = "needs the local Slurm cluster: start it and set PUZZLETRON_SLURM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn slurm_run_status_report_and_cancel_by_tag() {
    if !slurm_up("slurm_run_status_report_and_cancel_by_tag") {
        return;
    }
    let _w = Watchdog::start(
        "slurm_run_status_report_and_cancel_by_tag",
        Duration::from_secs(420),
    );
    let tmp = tempfile::Builder::new()
        .prefix("cli-slurm-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let runner = tmp.path().join("runner.local-cluster.yaml");
    std::fs::write(
        &runner,
        "runner:\n  kind: slurm\n  slurm:\n    partition: gpu\n    max_nodes: 1\n    time_limit: \"0:10:00\"\n",
    )
    .unwrap();
    let r = runner.to_str().unwrap().to_string();
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let stub = prefix("--sleep-ms 1500");
    let base = |d: &str, stub: &str| -> Vec<String> {
        [
            "campaign",
            "run",
            SMOKE,
            "--runner",
            &r,
            "--execution",
            SMOKE_EXEC,
            "--dir",
            d,
            "--command-prefix",
            stub,
            "--poll-ms",
            "500",
            "--quiet",
            "--stage",
            "convert",
            "--stage",
            "tokenize_data",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut a = base(&d, &stub);
    a.push("--detach".into());
    let (code, out, err) = cli::out(puzzletron().args(&a).output().unwrap());
    assert_eq!(code, 3, "{out}\n{err}");
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut saw_live_with_lease = false;
    loop {
        let (code, v, took) = status_json(&d);
        assert!(took < Duration::from_secs(5));
        if v["lease"]["held"] == true && !v["live"].as_array().unwrap().is_empty() {
            saw_live_with_lease = true;
        }
        if code == 0 {
            break;
        }
        assert_eq!(code, 3, "{v}");
        assert!(
            Instant::now() < deadline,
            "the Slurm campaign did not finish: {v}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        saw_live_with_lease,
        "status saw the running controller and its jobs"
    );
    // A rerun of a finished campaign re-attaches to nothing and is done.
    let (code, _, err) = cli::out(puzzletron().args(base(&d, &stub)).output().unwrap());
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["campaign", "report", &d]);
    assert_eq!(code, 0, "{err}");
    let html = std::fs::read_to_string(Path::new(&d).join("report.html")).unwrap();
    assert_eq!(
        html.matches("<rect class=\"bar\"").count(),
        2,
        "two attempts"
    );
    assert!(
        html.contains("n1 · GPU")
            || html.contains("n2 · GPU")
            || html.contains("n3 · GPU")
            || html.contains("n4 · GPU"),
        "rows name the Slurm nodes (sacct)"
    );

    // Orphans: kill -9 the controller while a long job runs, then cancel by tag.
    let d2 = tmp.path().join("c2").to_str().unwrap().to_string();
    let mut a = base(&d2, &prefix("--sleep-ms 300000"));
    a.push("--detach".into());
    let (code, out, _) = cli::out(puzzletron().args(&a).output().unwrap());
    assert_eq!(code, 3);
    let pid: i32 = out
        .split("pid ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (_, v, _) = status_json(&d2);
    let nonce = v["nonce"].as_str().unwrap().to_string();
    // RUNNING, not only queued: a job still pending when its campaign folder is removed below
    // fails at once when it starts (its output file cannot be created) and leaves the queue
    // before `cancel` looks (a flaky failure seen in CI).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !squeue_names_in(&["RUNNING"])
        .iter()
        .any(|n| n.starts_with(&nonce))
    {
        assert!(
            Instant::now() < deadline,
            "no running job of {nonce} in squeue"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // SAFETY: the controller this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::fs::remove_dir_all(&d2).unwrap();
    let (code, out, err) = run(&["campaign", "cancel", "--tag", &nonce]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancelled 1 jobs"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while squeue_names().iter().any(|n| n.starts_with(&nonce)) {
        assert!(Instant::now() < deadline, "the orphan is still queued");
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = fixtures();
}

/// N04 end to end: a GPU stage (tp=2: 2 GPUs per node) whose worker runs
/// `puzzletron campaign gpu-preflight` on the local executor (2 GPU ids). With the GPUs the
/// lease gives, it passes and the stage completes; when the worker's own environment shows
/// fewer — (a) `CUDA_VISIBLE_DEVICES=0` under `SLURM_JOB_GPUS=4,5`, (b) `NoDevFiles` — the
/// preflight exits 2 naming both numbers and the controller records a Config failure, never
/// retried (one attempt under the resume policy with 3 allowed).
#[test]
fn n04_gpu_preflight_mismatch_is_a_config_failure_never_retried() {
    use puzzletron::campaign::controller::{
        CampaignController, ControllerEvent, FailureClass, RunOptions,
    };
    use serde_json::json;
    use std::sync::{Arc, Mutex};
    let bin = env!("CARGO_BIN_EXE_puzzletron");
    let ok_then_mark = format!(
        "d=$(\"{bin}\" campaign gpu-preflight) || exit $?; echo \"device $d\"; touch \"$PUZZLETRON_OUTPUT_DIR/_SUCCESS\""
    );
    // (label, worker env override, Some(detail parts) = Config failure)
    let cases: [(&str, &str, Option<&[&str]>); 3] = [
        ("the lease's 2 GPUs", "", None),
        (
            "(a) one GPU per rank",
            "CUDA_VISIBLE_DEVICES=0 SLURM_JOB_GPUS=4,5",
            Some(&["1 GPU(s) visible", "needs 2 per node"]),
        ),
        (
            "(b) NoDevFiles",
            "CUDA_VISIBLE_DEVICES=NoDevFiles",
            Some(&["0 GPU(s) visible", "needs 2 per node"]),
        ),
    ];
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for (label, env, fails) in cases {
        let dir = tempfile::tempdir().unwrap();
        let script = if env.is_empty() {
            ok_then_mark.clone()
        } else {
            format!("export {env}; {ok_then_mark}")
        };
        let plan = PlanBuilder::stages(json!([
            {"id": "train", "parallel": {"tp": 2}, "command": ["sh", "-c", script]}
        ]))
        .execution(json!({"defaults": {"failure_policy": "resume", "max_attempts": 3}}))
        .build();
        let events: Arc<Mutex<Vec<ControllerEvent>>> = Arc::default();
        let ev = events.clone();
        let mut ctl = CampaignController::builder()
            .plan(plan)
            .local(["0", "1"])
            .campaign_dir(dir.path())
            .poll_interval(Duration::from_millis(50), Duration::from_millis(200))
            .on_event(move |e| ev.lock().unwrap().push(e.clone()))
            .build()
            .unwrap();
        let report = rt.block_on(ctl.run(RunOptions::default())).unwrap();
        let finished: Vec<(Option<FailureClass>, String)> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ControllerEvent::AttemptFinished { class, detail, .. } => {
                    Some((*class, detail.clone()))
                }
                _ => None,
            })
            .collect();
        let log = std::fs::read_dir(dir.path().join("logs"))
            .unwrap()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect::<String>();
        assert_eq!(finished.len(), 1, "{label}: never retried: {finished:?}");
        match fails {
            None => {
                assert!(report.is_complete(), "{label}: {finished:?}\n{log}");
                assert!(log.contains("device 0"), "{label}: {log}");
            }
            Some(parts) => {
                assert!(!report.is_complete(), "{label}");
                assert_eq!(
                    finished[0].0,
                    Some(FailureClass::Config),
                    "{label}: {finished:?}"
                );
                for p in parts {
                    assert!(log.contains(p), "{label}: {p:?} in the log {log}");
                    assert!(finished[0].1.contains(p), "{label}: {p:?} in {finished:?}");
                }
            }
        }
    }
}

/// A small experiment whose post-MIP flow has a manual filter: eval (3 shards) -> pick
/// (manual) -> mat. Returns (experiment, execution) paths.
fn manual_filter_experiment(dir: &Path) -> (String, String) {
    std::fs::write(dir.join("base.yaml"), "{}\n").unwrap();
    std::fs::write(
        dir.join("exp.yaml"),
        "replacement_scoring: {enabled: false}\n\
         build_library: {enabled: false}\n\
         post_mip:\n  flows:\n    f:\n      nodes:\n\
         \x20       eval: {type: evaluation}\n\
         \x20       pick: {type: filter, input: eval, mode: manual}\n\
         \x20       mat: {type: materialize, input: pick}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("exec.yaml"),
        "execution:\n  defaults: {gpus_per_node: 4}\n  stages:\n    post.f.eval: {instances: 3}\n",
    )
    .unwrap();
    (
        dir.join("exp.yaml").display().to_string(),
        dir.join("exec.yaml").display().to_string(),
    )
}

fn manual_run_args<'a>(exp: &'a str, exec: &'a str, dir: &'a str, stub: &'a str) -> Vec<&'a str> {
    vec![
        "campaign",
        "run",
        exp,
        "--runner",
        "local",
        "--execution",
        exec,
        "--dir",
        dir,
        "--command-prefix",
        stub,
        "--poll-ms",
        "50",
        "--gpus",
        "0,1,2,3",
        "--quiet",
    ]
}

/// A child process killed (and reaped) when the test ends, even by a failed assertion.
struct Reap(std::process::Child);

impl std::ops::Deref for Reap {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for Reap {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Waits until the journal of `dir` holds `needle` (a controller in another process).
fn wait_for_journal(dir: &Path, needle: &str, child: &mut Reap) {
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap_or_default();
        if j.contains(needle) {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the controller exited ({st}) before {needle:?} was journaled:\n{j}");
        }
        assert!(Instant::now() < end, "{needle:?} never journaled:\n{j}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Off a terminal a manual filter waits for its decision file: `status` (another process)
/// names the file, a bad file is reported and the controller keeps waiting, a good one lets
/// the running controller go on; the choice lands in `selected.json`, `--notify` hears
/// `decision_needed`, and a rerun does not ask again. A second campaign: stopped while
/// waiting, `--once` exits 3 naming the file, and `none` skips the stage below.
#[test]
fn a_manual_filter_waits_for_its_decision_file_off_a_terminal() {
    let _w = Watchdog::start(
        "a_manual_filter_waits_for_its_decision_file_off_a_terminal",
        Duration::from_secs(300),
    );
    let tmp = tempfile::tempdir().unwrap();
    let (exp, exec) = manual_filter_experiment(tmp.path());
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let stub = prefix("--sleep-ms 10");

    // The plan table and the dry run show the decision and its file.
    let (code, out, err) = run(&[
        "campaign",
        "compile",
        &exp,
        "--runner",
        "local",
        "--execution",
        &exec,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("manual decision")
            && out.contains("chooses among 3 work item(s) of post.f.eval")
            && out.contains("decisions/post.f.pick.txt"),
        "{out}"
    );
    let (code, out, err) = run(&[
        "campaign",
        "dry-run",
        &exp,
        "--runner",
        "local",
        "--execution",
        &exec,
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("=== stage post.f.pick (manual decision, no job) ==="),
        "{out}"
    );

    let log = tmp.path().join("events.jsonl");
    let script = tmp.path().join("notify.sh");
    std::fs::write(&script, format!("#!/bin/sh\ncat >> {}\n", log.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let notify = script.display().to_string();
    let mut args = manual_run_args(&exp, &exec, &d, &stub);
    args.extend(["--notify", &notify]);
    let stderr_path = tmp.path().join("run1.err");
    let mut child = Reap(
        puzzletron()
            .args(&args)
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let dir = Path::new(&d);
    wait_for_journal(dir, "\"decision_needed\"", &mut child);
    let file = dir
        .canonicalize()
        .unwrap()
        .join("decisions/post.f.pick.txt");

    // status, from another process, names the file; the campaign is not finished.
    let (code, out, err) = run(&["campaign", "status", &d]);
    assert_eq!(code, 3, "{err}");
    assert!(
        out.contains(&format!("waiting for a decision: write {}", file.display())),
        "{out}"
    );
    // The same words in --json: the stage is not `waiting`, it waits for a person.
    let (_, v, _) = status_json(&d);
    let pick = v["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "post.f.pick")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(pick["status"], "awaiting_decision", "{v}");
    assert_eq!(pick["state"], "waiting for a decision", "{v}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("post.f.pick") && l.contains("waiting for a decision")),
        "{out}"
    );

    // A bad file: reported, the controller keeps waiting.
    std::fs::write(&file, "9\n").unwrap();
    wait_for_journal(dir, "decision_invalid", &mut child);
    assert!(child.try_wait().unwrap().is_none(), "still waiting");
    // A good one: the running controller picks it up and completes.
    std::fs::write(&file, "3 post.f.eval:0\n").unwrap();
    let st = child.wait().unwrap();
    let err = std::fs::read_to_string(&stderr_path).unwrap();
    assert_eq!(st.code(), Some(0), "{err}");
    assert!(
        err.contains("[decision_needed] stage post.f.pick needs a decision")
            && err.contains(&file.display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("[decision_invalid]")
            && err.contains("9: no candidate number 9; choose 1 to 3"),
        "{err}"
    );
    let sel: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.join("work/post.f.pick/0/selected.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        sel["chosen"],
        serde_json::json!(["post.f.eval:0", "post.f.eval:2"])
    );
    assert!(
        dir.join("work/post.f.mat/0/_SUCCESS").exists(),
        "mat ran after the decision"
    );
    assert!(
        !dir.join("work/post.f.pick/0/_SUCCESS").exists(),
        "pick ran no job"
    );
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let needed: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "decision_needed")
        .collect();
    assert_eq!(needed.len(), 1, "{events:?}");
    assert_eq!(needed[0]["stage"], "post.f.pick");
    assert_eq!(needed[0]["detail"]["file"], file.display().to_string());
    let (code, out, _) = run(&["campaign", "status", &d]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("decided: post.f.eval:0, post.f.eval:2"),
        "{out}"
    );
    // A rerun: the journal has the decision; nothing is asked again.
    let (code, _, err) = run(&manual_run_args(&exp, &exec, &d, &stub));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        journal(dir)
            .iter()
            .filter(|r| r["entry"]["t"] == "decision_needed")
            .count(),
        1
    );

    // Second campaign: stop the controller while it waits (SIGTERM), then --once.
    let d2 = tmp.path().join("c2").to_str().unwrap().to_string();
    let dir2 = Path::new(&d2);
    let stderr2 = tmp.path().join("run2.err");
    let mut child = Reap(
        puzzletron()
            .args(manual_run_args(&exp, &exec, &d2, &stub))
            .stderr(std::fs::File::create(&stderr2).unwrap())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_journal(dir2, "\"decision_needed\"", &mut child);
    let file2 = dir2
        .canonicalize()
        .unwrap()
        .join("decisions/post.f.pick.txt");
    // SAFETY: signalling the child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    let err = std::fs::read_to_string(&stderr2).unwrap();
    assert_eq!(st.code(), Some(3), "{err}");
    let named = format!(
        "decision needed: stage post.f.pick waits; write {}",
        file2.display()
    );
    assert!(err.contains(&named), "{err}");
    let mut once = manual_run_args(&exp, &exec, &d2, &stub);
    once.push("--once");
    let (code, _, err) = run(&once);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains(&named), "{err}");
    // `none`: the decision is made, the stage below is skipped, the campaign completes.
    std::fs::write(&file2, "none").unwrap();
    let (code, _, err) = run(&manual_run_args(&exp, &exec, &d2, &stub));
    assert_eq!(code, 0, "{err}");
    assert!(
        !dir2.join("work/post.f.mat/0/_SUCCESS").exists(),
        "mat skipped"
    );
    let (code, out, _) = run(&["campaign", "status", &d2]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("skipped: the manual decision post.f.pick chose none")
            && out.contains("decided: none"),
        "{out}"
    );
}

/// On a terminal (a PTY through `script(1)`) the manual filter is a numbered prompt: a bad
/// answer shows the error and asks again, a good one lets the campaign finish, nothing waits
/// for a decision file, and the terminal is back in line mode at the end. Skipped with a
/// message when `script` is not installed.
#[test]
fn a_manual_filter_asks_on_a_terminal() {
    if !Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        eprintln!("skipped: script(1) (util-linux) is not installed");
        return;
    }
    let _w = Watchdog::start(
        "a_manual_filter_asks_on_a_terminal",
        Duration::from_secs(240),
    );
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let (exp, exec) = manual_filter_experiment(tmp.path());
    let d = tmp.path().join("c");
    let stub = prefix("--sleep-ms 10");
    let q = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    // With the live view (no --quiet): the bars are hidden while the prompt asks.
    let args: Vec<String> = manual_run_args(&exp, &exec, d.to_str().unwrap(), &stub)
        .into_iter()
        .filter(|a| *a != "--quiet")
        .map(q)
        .collect();
    let cmd = format!(
        "cd {} && {} {}; rc=$?; stty -a; exit $rc",
        q(fixtures().to_str().unwrap()),
        q(env!("CARGO_BIN_EXE_puzzletron")),
        args.join(" ")
    );
    let mut child = Reap(
        Command::new("script")
            .args(["-qfec", &cmd, "/dev/null"])
            .env("PATH", cli::path_with_torchrun())
            .env("PUZZLETRON_RUN_ROOT", "runs/test")
            .env_remove("PUZZLETRON_COMMAND_PREFIX")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Drain the terminal's output as it comes (the live view writes a lot; a full pipe would
    // block the program).
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stdout, &mut buf);
        buf
    });
    // The prompt comes right after the input stage's end is journaled.
    let t0 = Instant::now();
    loop {
        let j = std::fs::read_to_string(d.join("controller/journal.jsonl")).unwrap_or_default();
        if j.contains("\"t\":\"stage_done\",\"stage\":\"post.f.eval\"") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "eval never finished:\n{j}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(800));
    let stdin = child.stdin.as_mut().unwrap();
    for line in [&b"7\n"[..], b"3,1\n"] {
        stdin.write_all(line).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let t1 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t1.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("did not finish");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    let text = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(
        text.contains("stage post.f.pick needs a decision")
            && text.contains("1. post.f.eval:0")
            && text.contains("3. post.f.eval:2"),
        "{text}"
    );
    assert!(
        text.contains("7: no candidate number 7; choose 1 to 3"),
        "{text}"
    );
    let sel: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("work/post.f.pick/0/selected.json")).unwrap())
            .unwrap();
    assert_eq!(
        sel["chosen"],
        serde_json::json!(["post.f.eval:0", "post.f.eval:2"])
    );
    assert!(
        journal(&d)
            .iter()
            .all(|r| r["entry"]["t"] != "decision_needed"),
        "answered at the prompt: no decision file awaited"
    );
    // The terminal's line mode is restored after the run (echo and canonical input on).
    let stty = text.rsplit("speed").next().unwrap_or("");
    assert!(
        stty.contains(" icanon") && stty.contains(" echo") && !stty.contains("-icanon"),
        "{stty}"
    );
}

/// A reader that stops early (`puzzletron ... | head`) ends the output quietly, as for any Unix
/// tool: the process dies of SIGPIPE at its next write, with no panic message.
#[test]
fn a_closed_stdout_ends_the_output_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let mut child = puzzletron()
        .args([
            "campaign",
            "dry-run",
            SMOKE,
            "--runner",
            "local",
            "--execution",
            SMOKE_EXEC,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running puzzletron");
    // Closed before the first write: that write is the one a stopped `head` gets.
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("waiting for puzzletron");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        o.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {err}",
        o.status
    );
}

/// Issue 25: `campaign dry-run` shows a runner's `REPLACE_WITH_...` placeholders (and renders
/// the jobs with them); `campaign run` refuses them before anything is created or submitted,
/// naming file:line:column, the key and the fix.
#[test]
fn placeholders_are_shown_by_dry_run_and_refused_by_run_before_any_job() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("c");
    let (code, out, err) = campaign("dry-run", SLURM_RUNNER, SMOKE_EXEC, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "WARNING: runner value `runner.slurm.account` = \"REPLACE_WITH_SLURM_ACCOUNT\" is a placeholder: `campaign run` refuses it"
        ),
        "{out}"
    );
    assert!(
        out.contains("#SBATCH --account=REPLACE_WITH_SLURM_ACCOUNT\n"),
        "{out}"
    );
    let (code, out, err) = campaign(
        "run",
        SLURM_RUNNER,
        SMOKE_EXEC,
        &["--dir", d.to_str().unwrap()],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        err.contains(&format!(
            "{SLURM_RUNNER}:16:16: `runner.execution_contract.container` = \"REPLACE_WITH_PUZZLETRON_IMAGE\" is still a placeholder: replace it with your site's value"
        )) && err.contains("`runner.slurm.account`"),
        "{err}"
    );
    assert!(!d.exists(), "nothing created, nothing submitted");
}

/// `campaign dry-run` with a ray runner prints the exact body of each job request (sending
/// nothing: no cluster, no token needed), the token variable's value never.
#[test]
fn dry_run_with_a_ray_runner_prints_the_job_request_bodies() {
    let root = tempfile::tempdir().unwrap();
    let runner = root.path().join("runner.ray.yaml");
    std::fs::write(
        &runner,
        "runner:\n  kind: ray\n  ray:\n    address: http://127.0.0.1:1\n    token_env: \
         PUZZLETRON_TEST_RAY_TOKEN_UNSET\n    namespace: team\n    resources_per_gpu: {CPU: 4}\n    \
         gpus_per_node: 8\n",
    )
    .unwrap();
    let (code, out, err) = campaign("dry-run", runner.to_str().unwrap(), SMOKE_EXEC, &[]);
    assert_eq!(code, 0, "{err}");
    for want in [
        "file http://127.0.0.1:1/api/jobs/:",
        "\"submission_id\":",
        "\"entrypoint\": \"cd -- ",
        "\"entrypoint_num_gpus\": ",
        "\"RAY_NAMESPACE\": \"team\"",
        "\"puzzletron_namespace\": \"team\"",
    ] {
        assert!(out.contains(want), "{want} missing:\n{out}");
    }
}
