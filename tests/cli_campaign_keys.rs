//! Every key of an experiment is accounted for, through the `puzzletron` binary: each typo that
//! used to compile and change what runs (a misspelt stage section or switch, a filter's mode,
//! metric, direction or `top_k`, a flow's `source.run`, a mapping replaced by a scalar, paths
//! with `..`, an account with a newline) exits 1 naming `file:line:column`, the key path, the
//! value and the fix; a deliberately new key is accepted and listed as passed to the workers
//! unchecked.

mod support;
use support::cli;

use std::path::{Path, PathBuf};

use cli::{fixtures, puzzletron};

/// A copy of the fixture tree (so experiments with typos can sit next to the real ones and
/// compose them).
fn fixture_copy() -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dst = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_dir(&e.path(), &dst);
            } else {
                std::fs::copy(e.path(), &dst).unwrap();
            }
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixtures(), tmp.path());
    tmp
}

const RUNS: &str = "families/qwen3_5/qwen3p5_0p8b/runs";
const EXEC: &str = "orchestration/qwen3p5_0p8b/execution.campaign.yaml";

/// Writes `RUNS/typo.yaml`: the 23-stage campaign experiment, then `body` from line 5.
fn experiment(root: &Path, body: &str) -> PathBuf {
    let p = root.join(RUNS).join("typo.yaml");
    std::fs::write(
        &p,
        format!("# @package _global_\ndefaults:\n  - campaign\n  - _self_\n{body}"),
    )
    .unwrap();
    p
}

/// `campaign CMD EXP --runner RUNNER --execution EXEC EXTRA..` from `root`.
fn compile_in(
    root: &Path,
    cmd: &str,
    exp: &Path,
    runner: &str,
    extra: &[&str],
) -> (i32, String, String) {
    let mut c = puzzletron();
    c.current_dir(root).args([
        "campaign",
        cmd,
        exp.to_str().unwrap(),
        "--runner",
        runner,
        "--execution",
        EXEC,
    ]);
    c.args(extra);
    cli::out(c.output().unwrap())
}

#[test]
fn the_reference_campaign_compiles_and_lists_its_unchecked_keys() {
    let root = fixture_copy();
    let exp = experiment(root.path(), "my_new_section: {threshold: 3}\n");
    for cmd in ["compile", "dry-run"] {
        let (code, out, err) = compile_in(root.path(), cmd, &exp, "local", &[]);
        assert_eq!(code, 0, "{cmd}: {err}");
        let line = out
            .lines()
            .find(|l| l.starts_with("keys passed to the workers unchecked"))
            .unwrap_or_else(|| panic!("{cmd}: no unchecked-keys line:\n{out}"));
        assert!(
            line.contains("my_new_section") && line.contains("display_name"),
            "{line}"
        );
        // Keys the compiler reads are never listed.
        for read in [
            "pruning",
            "mip",
            "post_mip",
            "puzzle_dir",
            "replacement_scoring",
        ] {
            assert!(
                !line.split([' ', ',']).any(|w| w == read),
                "{cmd}: `{read}` listed: {line}"
            );
        }
        let (code, out, err) = compile_in(root.path(), cmd, &exp, "local", &["--json"]);
        assert_eq!(code, 0, "{cmd}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let keys: Vec<&str> = v["unchecked_keys"]
            .as_array()
            .expect("an unchecked_keys list")
            .iter()
            .map(|k| k.as_str().unwrap())
            .collect();
        assert!(keys.contains(&"my_new_section"), "{cmd}: {keys:?}");
        assert_eq!(v["warnings"], serde_json::json!([]), "{cmd}");
    }
}

/// Each typo of the issue: (experiment body from line 5, expected fragments of the error).
#[test]
fn typos_that_would_change_what_runs_are_refused_with_location_value_and_fix() {
    let root = fixture_copy();
    let flow = "post_mip:\n  flows:\n    runtime-075:\n";
    let node = |field: &str| format!("{flow}      nodes:\n        best_lm:\n          {field}\n");
    let nodes = "post_mip.flows.runtime-075.nodes";
    let cases: Vec<(String, Vec<String>)> = vec![
        (
            "pruningg: {seed: 1}\n".into(),
            vec![
                "typo.yaml:5:".into(),
                "unknown key `pruningg` = a mapping of 1 key(s)".into(),
                "did you mean `pruning`?".into(),
            ],
        ),
        (
            "replacement_scorin: {enabled: false}\n".into(),
            vec![
                "typo.yaml:5:".into(),
                "`replacement_scorin`".into(),
                "did you mean `replacement_scoring`?".into(),
            ],
        ),
        (
            "replacement_scoring:\n  enable: false\n".into(),
            vec![
                "typo.yaml:6:".into(),
                "unknown key `replacement_scoring.enable` = false".into(),
                "`replacement_scoring.enabled`".into(),
                "did you mean `enabled`?".into(),
            ],
        ),
        (
            node("mode: manul"),
            vec![
                "typo.yaml:10:".into(),
                format!("`{nodes}.best_lm.mode` = \"manul\""),
                "one of top_k, aggregate_rank, manual (did you mean `manual`?)".into(),
            ],
        ),
        (
            node("top_k: 0"),
            vec![
                "typo.yaml:10:".into(),
                format!("`{nodes}.best_lm.top_k` = 0"),
                "an integer >= 1".into(),
            ],
        ),
        (
            node("metric: online_evl.lm_loss"),
            vec![
                "typo.yaml:10:".into(),
                format!("`{nodes}.best_lm.metric` = \"online_evl.lm_loss\""),
                "did you mean `online_eval.lm_loss`?".into(),
            ],
        ),
        (
            node("direction: minimise"),
            vec![
                "typo.yaml:10:".into(),
                format!("`{nodes}.best_lm.direction` = \"minimise\""),
                "one of minimize, maximize (did you mean `minimize`?)".into(),
            ],
        ),
        (
            node("metrics: [{metric: serving.ttft, directon: minimize}]"),
            vec![
                "typo.yaml:10:".into(),
                format!("`{nodes}.best_lm.metrics[0].directon`"),
                "did you mean `direction`?".into(),
            ],
        ),
        (
            format!("{flow}      source: {{run: runtime-75}}\n"),
            vec![
                "typo.yaml:8:".into(),
                "`post_mip.flows.runtime-075.source.run` = \"runtime-75\"".into(),
                "a MIP run of the plan (a key of `mip.runs`)".into(),
                "did you mean `runtime-075`?".into(),
            ],
        ),
        (
            format!("{flow}      source: {{run: params-90}}\n"),
            vec![
                "typo.yaml:8:".into(),
                "`post_mip.flows.runtime-075.source.run` = \"params-90\"".into(),
                "`mip.runs.params-90` is switched off".into(),
            ],
        ),
        (
            format!("{flow}      source: {{runs: runtime-075}}\n"),
            vec![
                "unknown key `post_mip.flows.runtime-075.source.runs`".into(),
                "did you mean `run`?".into(),
            ],
        ),
        (
            "puzzle_dir: runs/../../elsewhere\n".into(),
            vec![
                "typo.yaml:5:".into(),
                "`puzzle_dir` = \"runs/../../elsewhere\"".into(),
                "without `..`".into(),
            ],
        ),
        (
            "pruning:\n  automodel: 3\n".into(),
            vec![
                "typo.yaml:6:".into(),
                "`pruning.automodel` = 3: expected a mapping".into(),
                "`pruning.automodel.parallel`".into(),
            ],
        ),
    ];
    for (body, expected) in &cases {
        let exp = experiment(root.path(), body);
        for cmd in ["compile", "dry-run"] {
            let (code, out, err) = compile_in(root.path(), cmd, &exp, "local", &[]);
            assert_eq!(code, 1, "{cmd} of\n{body}\nexited {code}:\n{out}{err}");
            for e in expected {
                assert!(
                    err.contains(e.as_str()),
                    "{cmd} of\n{body}: `{e}` not in\n{err}"
                );
            }
        }
    }
}

#[test]
fn an_override_replacing_a_read_mapping_by_a_scalar_is_refused() {
    let root = fixture_copy();
    let exp = experiment(root.path(), "");
    let (code, _, err) = compile_in(
        root.path(),
        "compile",
        &exp,
        "local",
        &["-o", "pruning.automodel=3"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("`pruning.automodel` = 3: expected a mapping")
            && err.contains("`pruning.automodel.parallel`")
            && err.contains("pruning.automodel=3"),
        "{err}"
    );
    let (code, _, err) = compile_in(
        root.path(),
        "compile",
        &exp,
        "local",
        &["-o", "+replacement_scoring.enable=false"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("did you mean `enabled`?"), "{err}");
}

/// Runner values: an account holding a newline (it would end the `#SBATCH` line), a log folder
/// or repository path with `..`: refused by compile at the runner file's line and column.
#[test]
fn runner_values_that_escape_their_line_or_folder_are_refused_at_the_runner_line() {
    let root = fixture_copy();
    let exp = experiment(root.path(), "");
    let cases: [(&str, &str, &[&str]); 4] = [
        (
            "runner:\n  kind: slurm\n  slurm:\n    partition: batch\n    account: \"acct\\n#SBATCH --qos=high\"\n",
            "runner.slurm.account",
            &["runner.yaml:5:", "a single line without control characters"],
        ),
        (
            "runner:\n  kind: slurm\n  slurm:\n    log_dir: ../logs\n",
            "runner.slurm.log_dir",
            &["runner.yaml:4:", "without `..`"],
        ),
        (
            "runner:\n  kind: local\n  local:\n    log_dir: a/../../b\n",
            "runner.local.log_dir",
            &["runner.yaml:4:", "without `..`"],
        ),
        (
            "runner:\n  kind: slurm\n  execution_contract:\n    repository: /opt/src/../../etc\n",
            "runner.execution_contract.repository",
            &["runner.yaml:4:", "without `..`"],
        ),
    ];
    for (runner, path, expected) in cases {
        let r = root.path().join("runner.yaml");
        std::fs::write(&r, runner).unwrap();
        let (code, out, err) = compile_in(root.path(), "compile", &exp, r.to_str().unwrap(), &[]);
        assert_eq!(code, 1, "{runner}: exited {code}\n{out}{err}");
        assert!(err.contains(&format!("`{path}`")), "{runner}: {err}");
        for e in expected {
            assert!(err.contains(e), "{runner}: `{e}` not in {err}");
        }
    }
}
