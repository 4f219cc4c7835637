//! Batch-script rendering: every directive, every launcher, and quoting proven by running the
//! rendered script with bash (argv and environment arrive byte for byte).
#![cfg(feature = "slurm")]

use std::time::Duration;

use puzzletron::executor::slurm::script::{ArrayOpts, render};
use puzzletron::executor::*;

fn id(s: &str) -> AttemptId {
    AttemptId::new(s).unwrap()
}

#[test]
fn directives_for_every_option() {
    let spec = AttemptSpec::new(id("camp.t1.a1"), CommandSpec::new("python").arg("train.py"))
        .with_topology(TaskTopology {
            nodes: 2,
            ntasks_per_node: 4,
            cpus_per_task: Some(8),
            gpus: GpuRequest::PerTask(1),
            launcher: TaskLauncher::Srun {
                extra_args: vec!["--cpu-bind=cores".into()],
            },
        })
        .with_mem_mb(64_000)
        .with_walltime(Duration::from_secs(3601))
        .with_exclusive(true)
        .with_scheduler(SchedulerOptions {
            partition: Some("gpu".into()),
            account: Some("proj-x".into()),
            qos: Some("high".into()),
            extra_directives: vec!["--constraint=a100".into(), "--requeue".into()],
        });
    let s = render(&spec, "/logs/camp.t1.a1-%j.out", None).unwrap();
    for line in [
        "#!/bin/bash",
        "#SBATCH --job-name=camp.t1.a1",
        "#SBATCH --output=/logs/camp.t1.a1-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --mem=64000M",
        "#SBATCH --time=61", // 3601 s rounds up to 61 minutes
        "#SBATCH --partition=gpu",
        "#SBATCH --account=proj-x",
        "#SBATCH --qos=high",
        "#SBATCH --exclusive",
        "#SBATCH --constraint=a100",
        "#SBATCH --requeue",
        "export PUZZLETRON_ATTEMPT_ID=camp.t1.a1",
        "exec srun --cpu-bind=cores python train.py",
    ] {
        assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
    }
    // GPUs per node and arrays.
    let spec = AttemptSpec::new(id("arr"), CommandSpec::new("true")).with_topology(TaskTopology {
        gpus: GpuRequest::PerNode(4),
        ..TaskTopology::single()
    });
    let s = render(
        &spec,
        "/l/arr-%A_%a.out",
        Some(ArrayOpts {
            size: 8,
            max_concurrent: Some(2),
            chunk: 0,
            offset: 0,
        }),
    )
    .unwrap();
    assert!(s.contains("#SBATCH --gres=gpu:4\n"), "{s}");
    assert!(s.contains("#SBATCH --array=0-7%2\n"), "{s}");
    assert!(
        s.contains("export PUZZLETRON_ARRAY_INDEX=\"$SLURM_ARRAY_TASK_ID\"\n"),
        "{s}"
    );
}

#[test]
fn torchrun_launcher() {
    let spec = AttemptSpec::new(id("tr.a1"), CommandSpec::new("train.py").arg("--lr=0.1"))
        .with_topology(TaskTopology {
            nodes: 4,
            ntasks_per_node: 8,
            gpus: GpuRequest::PerNode(8),
            launcher: TaskLauncher::torchrun(8),
            ..TaskTopology::single()
        });
    let s = render(&spec, "/l/x-%j.out", None).unwrap();
    assert!(
        s.contains("#SBATCH --ntasks-per-node=1\n"),
        "one torchrun per node: {s}"
    );
    assert!(s.contains("head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"));
    assert!(
        s.contains(
            "exec srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" --nproc_per_node=8 \
             --rdzv_backend=c10d --rdzv_endpoint=\"$head_node:29500\" --rdzv_id=tr.a1 \
             --max-restarts=0 train.py --lr=0.1\n"
        ),
        "{s}"
    );
}

#[test]
fn values_that_cannot_be_quoted_are_refused() {
    let mut spec = AttemptSpec::new(id("q"), CommandSpec::new("true"));
    spec.scheduler.partition = Some("gpu\"; rm -rf /".into());
    let e = render(&spec, "/l/x", None).unwrap_err().to_string();
    assert!(
        e.contains("scheduler.partition") && e.contains("attempt q"),
        "{e}"
    );
    let mut spec = AttemptSpec::new(id("q"), CommandSpec::new("true"));
    spec.command.env.insert("BAD NAME".into(), "x".into());
    let e = render(&spec, "/l/x", None).unwrap_err().to_string();
    assert!(
        e.contains("command.env.BAD NAME") && e.contains("shell variable name"),
        "{e}"
    );
    let mut spec = AttemptSpec::new(id("q"), CommandSpec::new("true"));
    for bad in ["--x y", "--x=a\"b", "constraint=a100"] {
        spec.scheduler.extra_directives = vec![bad.into()];
        let e = render(&spec, "/l/x", None).unwrap_err().to_string();
        assert!(e.contains("scheduler.extra_directives[0]"), "{bad}: {e}");
    }
    // A value with spaces is quoted, so it stays one value of one option.
    spec.scheduler.extra_directives = vec!["--comment=two words".into()];
    let s = render(&spec, "/l/x", None).unwrap();
    assert!(s.contains("#SBATCH --comment=\"two words\"\n"), "{s}");
}

#[test]
fn quoting_survives_bash_byte_for_byte() {
    let tricky = [
        "plain",
        "with space",
        "it's",
        "$(touch /tmp/pwned)",
        "`id`",
        "a\"b",
        "*",
        "semi;colon && echo",
        "new\nline",
        "",
        "-n",
    ];
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut cmd = CommandSpec::new("sh")
        .arg("-c")
        .arg(r#"out="$1"; shift; for a in "$@"; do printf '%s\0' "$a"; done > "$out"; printf '%s\0' "$TRICKY" >> "$out"; pwd >> "$out""#)
        .arg("sh")
        .arg(out.to_string_lossy())
        .args(tricky)
        .env("TRICKY", "x'y $HOME \"z\"")
        .cwd(dir.path().join("a dir"));
    std::fs::create_dir(dir.path().join("a dir")).unwrap();
    cmd.shell = false;
    let spec = AttemptSpec::new(id("quote"), cmd);
    let script = render(&spec, "/l/x", None).unwrap();
    let path = dir.path().join("job.sh");
    std::fs::write(&path, &script).unwrap();
    let st = std::process::Command::new("bash")
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
    let got = std::fs::read(&out).unwrap();
    let text = String::from_utf8(got).unwrap();
    let mut parts: Vec<&str> = text.split('\0').collect();
    let cwd = parts.pop().unwrap();
    assert_eq!(cwd.trim_end(), dir.path().join("a dir").to_string_lossy());
    let env = parts.pop().unwrap();
    assert_eq!(env, "x'y $HOME \"z\"");
    assert_eq!(parts, tricky, "{script}");
    assert!(!std::path::Path::new("/tmp/pwned").exists());
}
