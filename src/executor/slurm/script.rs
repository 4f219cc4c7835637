//! Rendering an [`AttemptSpec`] as an `sbatch` batch script.
//!
//! Every value is quoted: `#SBATCH` values are checked against a safe character set (and
//! double-quoted when they hold spaces; values with `"`, `\` or line breaks are refused), and
//! every word of the command line and every environment value is single-quoted for bash
//! (`'...'`, with `'` written as `'\''`). Nothing from the spec is ever interpreted by a shell.

use crate::executor::shell::{directive_value, quote as shell_quote};
use crate::executor::{
    ARRAY_INDEX_ENV, ATTEMPT_ID_ENV, AttemptId, AttemptSpec, ExecutorError, GpuRequest,
    TaskLauncher,
};

/// Escapes `%` for a Slurm filename pattern (`%%` is a literal `%`).
pub fn escape_filename_pattern(path: &str) -> String {
    path.replace('%', "%%")
}

/// Expands the filename patterns this executor uses (`%j`, `%A`, `%a`, `%%`) for one job.
pub fn expand_log_path(template: &str, job_id: u64, array_task: Option<u32>) -> String {
    let mut out = String::with_capacity(template.len() + 8);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('j') => match array_task {
                // For an array task %j is the task's own job id, which we do not know; the
                // executor uses %A_%a for arrays, so this branch is for plain jobs.
                Some(_) => out.push_str("%j"),
                None => out.push_str(&job_id.to_string()),
            },
            Some('A') => out.push_str(&job_id.to_string()),
            Some('a') => match array_task {
                Some(t) => out.push_str(&t.to_string()),
                None => out.push_str("4294967294"), // Slurm's NO_VAL for non-array jobs
            },
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Array settings for [`render`].
#[derive(Debug, Clone, Copy)]
pub struct ArrayOpts {
    /// Tasks `0..size`.
    pub size: u32,
    /// `%N` limit.
    pub max_concurrent: Option<u32>,
    /// This submission is chunk `chunk` of a larger array (N01): its task `i` is the array's
    /// task `offset + i`. Chunk 0 (offset 0) is named like the attempt; chunk `c > 0` is
    /// named `<attempt id>.c<c>` so that each chunk's job can be found by name.
    pub chunk: u32,
    /// Index of this chunk's first task in the whole array.
    pub offset: u32,
}

/// The job name of chunk `chunk` of the array `base` (see [`ArrayOpts::chunk`]).
///
/// # Errors
/// [`ExecutorError::InvalidSpec`] when the name would be longer than an attempt id may be.
pub fn chunk_job_name(base: &AttemptId, chunk: u32) -> Result<AttemptId, ExecutorError> {
    if chunk == 0 {
        return Ok(base.clone());
    }
    AttemptId::new(format!("{base}.c{chunk}")).map_err(|_| ExecutorError::InvalidSpec {
        attempt_id: Some(base.clone()),
        field: "attempt_id".into(),
        value: base.to_string(),
        expected: format!(
            "an id short enough to name array chunk {chunk} as `<id>.c{chunk}` (64 characters at most)"
        ),
    })
}

/// Renders the batch script of `spec` writing its output to `log_template` (a Slurm filename
/// pattern, already escaped), as an array when `array` is given.
///
/// # Errors
/// [`ExecutorError::InvalidSpec`] naming the field for an environment variable name that is
/// not a shell identifier, or a directive value that cannot be quoted.
pub fn render(
    spec: &AttemptSpec,
    log_template: &str,
    array: Option<ArrayOpts>,
) -> Result<String, ExecutorError> {
    let id = &spec.attempt_id;
    let with_id = |mut e: ExecutorError| {
        if let ExecutorError::InvalidSpec { attempt_id, .. } = &mut e {
            *attempt_id = Some(id.clone());
        }
        e
    };
    let mut d: Vec<String> = Vec::new();
    let mut opt = |name: &str, field: &str, value: &str| -> Result<(), ExecutorError> {
        d.push(format!(
            "#SBATCH --{name}={}",
            directive_value(field, value).map_err(with_id)?
        ));
        Ok(())
    };
    // The job name is the attempt id, which is already [A-Za-z0-9._-]{1,64} (C06).
    let name = match array {
        Some(a) => chunk_job_name(id, a.chunk)?,
        None => id.clone(),
    };
    opt("job-name", "attempt_id", name.as_str())?;
    opt("output", "log_path", log_template)?;
    opt("open-mode", "open_mode", "append")?;
    let topo = &spec.topology;
    opt("nodes", "topology.nodes", &topo.nodes.to_string())?;
    let tasks_per_node = match topo.launcher {
        TaskLauncher::Torchrun { .. } => 1, // one torchrun per node spawns the workers
        _ => topo.ntasks_per_node,
    };
    opt(
        "ntasks-per-node",
        "topology.ntasks_per_node",
        &tasks_per_node.to_string(),
    )?;
    if let Some(c) = topo.cpus_per_task {
        opt("cpus-per-task", "topology.cpus_per_task", &c.to_string())?;
    }
    match topo.gpus {
        GpuRequest::None => {}
        GpuRequest::PerNode(n) => opt("gres", "topology.gpus", &format!("gpu:{n}"))?,
        GpuRequest::PerTask(n) => opt("gpus-per-task", "topology.gpus", &n.to_string())?,
    }
    if let Some(m) = spec.mem_mb {
        opt("mem", "mem_mb", &format!("{m}M"))?;
    }
    if let Some(w) = spec.walltime {
        // Slurm's --time has minute resolution; round up so the job is never cut short.
        let minutes = w.as_secs().div_ceil(60).max(1);
        opt("time", "walltime", &minutes.to_string())?;
    }
    if let Some(w) = &spec.warning_signal {
        // `B:` signals the batch shell, which forwards it to the step (`forwarding_launch`):
        // without `B:` Slurm signals the steps but not the shell, so a `Direct` command
        // (running in the batch step's shell) would never see it. Validated here because the
        // name is written unquoted into the trap.
        w.validate(Some(id))?;
        opt("signal", "warning_signal", &format!("B:{w}"))?;
    }
    let s = &spec.scheduler;
    if let Some(p) = &s.partition {
        opt("partition", "scheduler.partition", p)?;
    }
    if let Some(a) = &s.account {
        opt("account", "scheduler.account", a)?;
    }
    if let Some(q) = &s.qos {
        opt("qos", "scheduler.qos", q)?;
    }
    if let Some(a) = array {
        let range = match a.max_concurrent {
            Some(m) => format!("0-{}%{m}", a.size - 1),
            None => format!("0-{}", a.size - 1),
        };
        opt("array", "array.size", &range)?;
    }
    if spec.exclusive {
        d.push("#SBATCH --exclusive".into());
    }
    for (i, extra) in s.extra_directives.iter().enumerate() {
        let field = format!("scheduler.extra_directives[{i}]");
        let (name, value) = match extra.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (extra.as_str(), None),
        };
        if !name.starts_with('-')
            || !name[1..]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(with_id(ExecutorError::InvalidSpec {
                attempt_id: None,
                field,
                value: extra.clone(),
                expected: "an option like `--constraint=a100` or `--requeue`".into(),
            }));
        }
        match value {
            Some(v) => d.push(format!(
                "#SBATCH {name}={}",
                directive_value(&field, v).map_err(with_id)?
            )),
            None => d.push(format!("#SBATCH {name}")),
        }
    }

    let mut body = String::new();
    body.push_str(&format!(
        "export {ATTEMPT_ID_ENV}={}\n",
        shell_quote(id.as_str())
    ));
    match array {
        Some(a) if a.offset > 0 => body.push_str(&format!(
            "export {ARRAY_INDEX_ENV}=\"$((SLURM_ARRAY_TASK_ID + {}))\"\n",
            a.offset
        )),
        Some(_) => body.push_str(&format!(
            "export {ARRAY_INDEX_ENV}=\"$SLURM_ARRAY_TASK_ID\"\n"
        )),
        None => {}
    }
    for (k, v) in &spec.command.env {
        let ok = k
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !ok {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: Some(id.clone()),
                field: format!("command.env.{k}"),
                value: k.clone(),
                expected: "a shell variable name [A-Za-z_][A-Za-z0-9_]*".into(),
            });
        }
        body.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    if let Some(cwd) = &spec.command.cwd {
        body.push_str(&format!(
            "cd -- {} || exit 1\n",
            shell_quote(&cwd.to_string_lossy())
        ));
    }
    let argv: Vec<String> = spec
        .command
        .effective_argv()
        .iter()
        .map(|a| shell_quote(a))
        .collect();
    let argv = argv.join(" ");
    let launch = match &topo.launcher {
        TaskLauncher::Direct => argv,
        TaskLauncher::Srun { extra_args } => {
            let extra: Vec<String> = extra_args.iter().map(|a| shell_quote(a)).collect();
            let sep = if extra.is_empty() { "" } else { " " };
            format!("srun{sep}{} {argv}", extra.join(" "))
        }
        TaskLauncher::Torchrun {
            nproc_per_node,
            rdzv_backend,
            rdzv_port,
            max_restarts,
        } => {
            body.push_str(
                "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n",
            );
            format!(
                "srun --ntasks-per-node=1 torchrun --nnodes=\"$SLURM_NNODES\" \
                 --nproc_per_node={nproc_per_node} --rdzv_backend={} \
                 --rdzv_endpoint=\"$head_node:{rdzv_port}\" --rdzv_id={} \
                 --max-restarts={max_restarts} {argv}",
                shell_quote(rdzv_backend),
                shell_quote(id.as_str()),
            )
        }
    };
    match &spec.warning_signal {
        None => body.push_str(&format!("exec {launch}\n")),
        Some(w) => body.push_str(&forwarding_launch(&launch, &w.signal)),
    }
    Ok(format!(
        "#!/bin/bash\n{}\n# rendered by puzzletron for attempt {id}\n{body}",
        d.join("\n")
    ))
}

/// The step line of a script with a warning signal (N03): the step runs in the background
/// (`launch &`), the shell waits for it and forwards `signal` and `TERM` (Slurm's own signal
/// at the limit) to it, so the worker can checkpoint; the shell's exit code is the step's.
/// `signal` is one of [`WARNING_SIGNALS`](crate::executor::WARNING_SIGNALS) (no quoting
/// needed).
fn forwarding_launch(launch: &str, signal: &str) -> String {
    let mut traps = format!("trap 'kill -s {signal} \"$step\" 2>/dev/null' {signal}\n");
    if signal != "TERM" {
        traps.push_str("trap 'kill -s TERM \"$step\" 2>/dev/null' TERM\n");
    }
    // A trapped signal interrupts `wait` (status > 128) while the step still runs: wait again
    // until it has exited, so the status is the step's own.
    format!(
        "{traps}{launch} &\nstep=$!\nwait \"$step\"; rc=$?\n\
         while kill -0 \"$step\" 2>/dev/null; do wait \"$step\"; rc=$?; done\nexit \"$rc\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_path_patterns() {
        assert_eq!(expand_log_path("/l/x-%j.out", 12, None), "/l/x-12.out");
        assert_eq!(
            expand_log_path("/l/x-%A_%a.out", 12, Some(3)),
            "/l/x-12_3.out"
        );
        assert_eq!(expand_log_path("/l/100%%-%j", 5, None), "/l/100%-5");
    }
}
