//! Batch-script rendering: every directive, every launcher, and quoting proven by running the
//! rendered script with bash (argv and environment arrive byte for byte).

use std::time::Duration;

use super::script::{ArrayOpts, render};
use crate::executor::*;

fn id(s: &str) -> AttemptId {
    AttemptId::new(s).unwrap()
}

#[test]
fn directives_for_every_option() {
    let spec = AttemptSpec::new(id("camp.t1.a1"), CommandSpec::new("python").arg("train.py"))
        .with_topology(
            TaskTopology::new(2, 4)
                .with_cpus_per_task(8)
                .with_gpus(GpuRequest::PerTask(1))
                .with_launcher(TaskLauncher::Srun {
                    extra_args: vec!["--cpu-bind=cores".into()],
                }),
        )
        .with_mem_mb(64_000)
        .with_walltime(Duration::from_secs(3601))
        .with_exclusive(true)
        .with_scheduler(
            SchedulerOptions::default()
                .with_partition("gpu")
                .with_account("proj-x")
                .with_qos("high")
                .with_reservation("maint-win")
                .with_constraint("a100&ib")
                .with_extra_directives(["--requeue"]),
        );
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
        "#SBATCH --reservation=maint-win",
        "#SBATCH --constraint=\"a100&ib\"",
        "#SBATCH --exclusive",
        "#SBATCH --requeue",
        "export PUZZLETRON_ATTEMPT_ID=camp.t1.a1",
        "exec srun --cpu-bind=cores python train.py",
    ] {
        assert!(s.lines().any(|l| l == line), "missing {line:?} in\n{s}");
    }
    // GPUs per node and arrays.
    let spec = AttemptSpec::new(id("arr"), CommandSpec::new("true"))
        .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(4)));
    let s = render(
        &spec,
        "/l/arr-%A_%a.out",
        Some(ArrayOpts::new(8).with_max_concurrent(Some(2))),
    )
    .unwrap();
    // The plan's form of the GPU request: per node.
    assert!(s.contains("#SBATCH --gpus-per-node=4\n"), "{s}");
    assert!(s.contains("#SBATCH --array=0-7%2\n"), "{s}");
    assert!(
        s.contains("export PUZZLETRON_ARRAY_INDEX=\"$SLURM_ARRAY_TASK_ID\"\n"),
        "{s}"
    );
}

#[test]
fn torchrun_launcher() {
    let spec = AttemptSpec::new(id("tr.a1"), CommandSpec::new("train.py").arg("--lr=0.1"))
        .with_topology(
            TaskTopology::new(4, 8)
                .with_gpus(GpuRequest::PerNode(8))
                .with_launcher(TaskLauncher::torchrun(8)),
        );
    let s = render(&spec, "/l/x-%j.out", None).unwrap();
    assert!(
        s.contains("#SBATCH --ntasks-per-node=1\n"),
        "one torchrun per node: {s}"
    );
    assert!(s.contains("head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"));
    assert!(
        s.contains(
            "exec srun --ntasks-per-node=1 torchrun --nnodes=4 --rdzv_backend=c10d \
             --rdzv_endpoint=\"$head_node\":29500 --rdzv_id=tr.a1 --nproc_per_node=8 \
             --max-restarts=0 train.py --lr=0.1\n"
        ),
        "{s}"
    );
    // One node: a standalone rendezvous on a free port (instances packed on a node never
    // share a port), no head node lookup.
    let one = AttemptSpec::new(id("tr1.a1"), CommandSpec::new("train.py")).with_topology(
        TaskTopology::single()
            .with_gpus(GpuRequest::PerNode(2))
            .with_launcher(TaskLauncher::torchrun(2)),
    );
    let s = render(&one, "/l/x-%j.out", None).unwrap();
    assert!(!s.contains("head_node"), "{s}");
    assert!(
        s.contains(
            "exec srun --ntasks-per-node=1 torchrun --standalone --nnodes=1 --nproc_per_node=2 \
             --max-restarts=0 train.py\n"
        ),
        "{s}"
    );
}

/// The execution contract in the batch script, run by bash: the working folder, the setup
/// script, the site's prerun commands (verbatim), the venv, the command, then the postrun
/// commands, with the command's exit status.
#[test]
fn execution_contract_runs_in_order_and_keeps_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir_all(d.join("repo")).unwrap();
    std::fs::write(d.join("setup.sh"), "echo setup >> ../order\n").unwrap();
    std::fs::create_dir_all(d.join("venv/bin")).unwrap();
    std::fs::write(d.join("venv/bin/activate"), "echo venv >> ../order\n").unwrap();
    let env = ExecutionContract::default()
        .with_repository(d.join("repo").display().to_string())
        .with_venv(d.join("venv").display().to_string())
        .with_setup_env(d.join("setup.sh").display().to_string())
        .with_prerun_commands(["export SITE=1; echo \"pre $SITE\" >> ../order"])
        .with_postrun_commands(["echo post >> ../order"]);
    let spec = AttemptSpec::new(
        id("env.a1"),
        CommandSpec::new("sh")
            .arg("-c")
            .arg("echo \"cmd $SITE $(basename \"$PWD\")\" >> ../order; exit 7")
            .cwd(d.join("repo")),
    )
    .with_environment(env);
    let script = render(&spec, "/l/x", None).unwrap();
    assert!(
        !script.contains("exec "),
        "postrun needs the shell after the step: {script}"
    );
    let path = d.join("job.sh");
    std::fs::write(&path, &script).unwrap();
    let st = std::process::Command::new("bash")
        .arg(&path)
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(7), "{script}");
    assert_eq!(
        std::fs::read_to_string(d.join("order")).unwrap(),
        "setup\npre 1\nvenv\ncmd 1 repo\npost\n",
        "{script}"
    );
}

/// A container (pyxis): the step carries `--container-image`, `--container-mounts` and
/// `--container-workdir`; the setup script and venv are sourced inside it, the batch shell
/// neither enters the working folder nor the venv (they exist in the image).
#[test]
fn a_container_runs_the_step_under_pyxis() {
    let env = ExecutionContract::default()
        .with_repository("/opt/src")
        .with_venv("/venv")
        .with_container("nvcr.io/nvidia/pytorch:25.01-py3")
        .with_container_mounts("/data:/data,/models:/models")
        .with_prerun_commands(["module load cuda"]);
    let spec = AttemptSpec::new(
        id("ctr.a1"),
        CommandSpec::new("python").args(["-m", "x"]).cwd("/opt/src"),
    )
    .with_topology(
        TaskTopology::single()
            .with_gpus(GpuRequest::PerNode(1))
            .with_launcher(TaskLauncher::Srun { extra_args: vec![] }),
    )
    .with_environment(env);
    let s = render(&spec, "/l/x", None).unwrap();
    assert!(
        !s.contains("cd -- ") && !s.contains("/venv/bin/activate || exit"),
        "{s}"
    );
    assert!(s.contains("\nmodule load cuda\n"), "{s}");
    let last = s.lines().last().unwrap();
    assert_eq!(
        last,
        format!(
            "exec srun --container-image=nvcr.io/nvidia/pytorch:25.01-py3 \
             --container-mounts=/data:/data,/models:/models --container-workdir=/opt/src \
             bash -c {} puzzletron-job '' /venv python -m x",
            crate::executor::shell::quote(super::script::CONTAINER_PAYLOAD)
        )
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

/// N03: every form of a warning signal, rendered: the `--signal=B:SIG@lead` directive, the
/// step in the background (`&`, never `exec`) with the signal and `TERM` forwarded.
#[test]
fn n03_warning_signal_forms_render_directive_and_forwarding() {
    let direct = TaskTopology::single();
    let srun = TaskTopology::new(2, 1).with_launcher(TaskLauncher::Srun { extra_args: vec![] });
    let torch = TaskTopology::single()
        .with_gpus(GpuRequest::PerNode(8))
        .with_launcher(TaskLauncher::torchrun(8));
    // (label, topology, signal, directive, step line, traps)
    type Case<'a> = (
        &'a str,
        TaskTopology,
        Option<&'a str>,
        Option<&'a str>,
        &'a str,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "default USR2, direct",
            direct.clone(),
            Some("180"),
            Some("#SBATCH --signal=B:USR2@180"),
            "python train.py &",
            vec!["USR2", "TERM"],
        ),
        (
            "USR2 with srun",
            srun,
            Some("USR2@180"),
            Some("#SBATCH --signal=B:USR2@180"),
            "srun python train.py &",
            vec!["USR2", "TERM"],
        ),
        (
            "SIG prefix, torchrun",
            torch,
            Some("SIGUSR2@240"),
            Some("#SBATCH --signal=B:USR2@240"),
            "srun --ntasks-per-node=1 torchrun --standalone --nnodes=1",
            vec!["USR2", "TERM"],
        ),
        (
            "TERM itself: one trap",
            direct.clone(),
            Some("TERM@120"),
            Some("#SBATCH --signal=B:TERM@120"),
            "python train.py &",
            vec!["TERM"],
        ),
        (
            "no warning signal: exec, no directive",
            direct,
            None,
            None,
            "exec python train.py",
            vec![],
        ),
    ];
    for (label, topo, sig, directive, step, traps) in cases {
        let mut spec = AttemptSpec::new(id("n03.a1"), CommandSpec::new("python").arg("train.py"))
            .with_topology(topo)
            .with_walltime(Duration::from_secs(7200));
        if let Some(s) = sig {
            spec = spec.with_warning_signal(WarningSignal::parse(s).unwrap());
        }
        spec.validate().unwrap();
        let s = render(&spec, "/l/x-%j.out", None).unwrap();
        match directive {
            Some(d) => assert!(s.lines().any(|l| l == d), "{label}: {d} in\n{s}"),
            None => assert!(!s.contains("--signal"), "{label}: {s}"),
        }
        assert!(
            s.lines().any(|l| l.starts_with(step)),
            "{label}: {step:?} in\n{s}"
        );
        let trap_lines: Vec<&str> = s.lines().filter(|l| l.starts_with("trap ")).collect();
        assert_eq!(trap_lines.len(), traps.len(), "{label}: {s}");
        for (line, t) in trap_lines.iter().zip(&traps) {
            assert_eq!(
                *line,
                format!("trap 'kill -s {t} \"$step\" 2>/dev/null' {t}"),
                "{label}"
            );
        }
        if sig.is_some() {
            assert!(!s.contains("exec "), "{label}: never exec: {s}");
            assert!(s.ends_with("exit \"$rc\"\n"), "{label}: {s}");
        }
    }
}

/// N03: the accepted and refused spellings of a warning signal, and spec validation.
#[test]
fn n03_warning_signal_parse_table() {
    let ok = [
        ("USR2@180", "USR2", 180),
        ("SIGUSR2@180", "USR2", 180),
        ("180", "USR2", 180),
        (" USR1@90 ", "USR1", 90),
        ("TERM@1", "TERM", 1),
    ];
    for (text, sig, lead) in ok {
        let w = WarningSignal::parse(text).unwrap();
        assert_eq!((w.signal.as_str(), w.lead_secs()), (sig, lead), "{text}");
        assert_eq!(w.to_string(), format!("{sig}@{lead}"));
    }
    for bad in [
        "KILL@10", "USR2@", "USR2@0", "USR2@-1", "abc", "USR2@1m", "@180", "USR2;x@1",
    ] {
        let e = WarningSignal::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("warning_signal") && e.contains(bad.trim()),
            "{bad}: {e}"
        );
    }
    // A hand-built spec with a bad name is refused before anything is rendered unquoted.
    let mut spec = AttemptSpec::new(id("n03.bad"), CommandSpec::new("true"));
    spec.warning_signal = Some(WarningSignal::new(
        "USR2' $(touch /tmp/x) '",
        Duration::from_secs(10),
    ));
    let e = spec.validate().unwrap_err().to_string();
    assert!(e.contains("warning_signal.signal"), "{e}");
    let e = render(&spec, "/l/x", None).unwrap_err().to_string();
    assert!(e.contains("warning_signal.signal"), "{e}");
}

/// N03, run by bash: the warning signal reaches the worker (which checkpoints), the script
/// keeps waiting (the interrupted `wait` is resumed), and its exit code is the worker's own
/// after `TERM`, not the 128+n of the interrupted wait.
#[test]
fn n03_forwarded_signal_reaches_the_worker_and_the_exit_code_is_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_string_lossy().into_owned();
    let worker = r#"d="$1"; trap 'echo step_1200 > "$d/ckpt"' USR2; trap 'exit 3' TERM; touch "$d/ready"; while :; do sleep 0.05; done"#;
    let spec = AttemptSpec::new(
        id("n03.run"),
        CommandSpec::new("sh")
            .arg("-c")
            .arg(worker)
            .arg("sh")
            .arg(&d),
    )
    .with_walltime(Duration::from_secs(120))
    .with_warning_signal(WarningSignal::usr2(Duration::from_secs(60)));
    let script = render(&spec, "/l/x", None).unwrap();
    let path = dir.path().join("job.sh");
    std::fs::write(&path, &script).unwrap();
    let mut child = std::process::Command::new("bash")
        .arg(&path)
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let wait_for = |p: &std::path::Path| {
        let t = std::time::Instant::now();
        while !p.exists() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} never appeared",
                p.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&dir.path().join("ready"));
    let kill = |sig: &str| {
        assert!(
            std::process::Command::new("kill")
                .args(["-s", sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    kill("USR2");
    wait_for(&dir.path().join("ckpt"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ckpt"))
            .unwrap()
            .trim(),
        "step_1200"
    );
    // Still running after the warning: the script did not exit with the interrupted wait.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none(), "{script}");
    kill("TERM");
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(3), "{script}");
}
