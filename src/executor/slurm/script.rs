//! Rendering an [`AttemptSpec`] as an `sbatch` batch script.
//!
//! Every value is quoted: `#SBATCH` values are checked against a safe character set (and
//! double-quoted when they hold spaces; values with `"`, `\` or line breaks are refused), and
//! every word of the command line and every environment value is single-quoted for bash
//! (`'...'`, with `'` written as `'\''`). Nothing from the spec is ever interpreted by a shell.

use crate::executor::shell::{self, directive_value, is_var_name, quote as shell_quote};
use crate::executor::{
    ARRAY_INDEX_ENV, ATTEMPT_ID_ENV, AttemptId, AttemptSpec, ExecutorError, GpuRequest,
    START_FILE_ENV, TaskLauncher,
};

/// Escapes `%` for a Slurm filename pattern (`%%` is a literal `%`).
pub(crate) fn escape_filename_pattern(path: &str) -> String {
    path.replace('%', "%%")
}

/// Expands the filename patterns this executor uses (`%j`, `%A`, `%a`, `%%`) for one job.
pub(crate) fn expand_log_path(template: &str, job_id: u64, array_task: Option<u32>) -> String {
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
#[non_exhaustive]
pub(crate) struct ArrayOpts {
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

// Production code builds `ArrayOpts` field by field (`slurm/mod.rs`); the tests use these.
#[cfg(test)]
impl ArrayOpts {
    /// An array of tasks `0..size`, no `%N` limit, chunk 0 at offset 0.
    pub(crate) fn new(size: u32) -> Self {
        Self {
            size,
            max_concurrent: None,
            chunk: 0,
            offset: 0,
        }
    }

    /// Sets the `%N` limit (`None`: none).
    pub(crate) fn with_max_concurrent(mut self, max_concurrent: Option<u32>) -> Self {
        self.max_concurrent = max_concurrent;
        self
    }
}

/// The job name of chunk `chunk` of the array `base` (see [`ArrayOpts::chunk`]).
///
/// # Errors
/// [`ExecutorError::InvalidSpec`] when the name would be longer than an attempt id may be.
pub(crate) fn chunk_job_name(base: &AttemptId, chunk: u32) -> Result<AttemptId, ExecutorError> {
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
pub(crate) fn render(
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
        GpuRequest::PerNode(n) => opt("gpus-per-node", "topology.gpus", &n.to_string())?,
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
    if let Some(r) = &s.reservation {
        opt("reservation", "scheduler.reservation", r)?;
    }
    if let Some(c) = &s.constraint {
        opt("constraint", "scheduler.constraint", c)?;
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
        if !is_var_name(k) {
            return Err(ExecutorError::InvalidSpec {
                attempt_id: Some(id.clone()),
                field: format!("command.env.{k}"),
                value: k.clone(),
                expected: "a shell variable name [A-Za-z_][A-Za-z0-9_]*".into(),
            });
        }
        body.push_str(&format!("export {k}={}\n", shell_quote(v)));
    }
    let env = &spec.environment;
    // An empty value in the runner file means "none".
    let some = |v: &Option<String>| v.clone().filter(|x| !x.is_empty());
    let container = some(&env.container);
    let (setup_env, venv) = (some(&env.setup_env), some(&env.venv));
    let cwd = spec.command.cwd.as_ref().map(|c| c.to_string_lossy());
    // Without a container the batch shell enters the working directory and the environment,
    // and every step inherits them; with one they exist only inside the container, so the
    // step's payload enters them there (the batch shell still runs the site's commands).
    if container.is_none()
        && let Some(c) = &cwd
    {
        body.push_str(&format!("cd -- {} || exit 1\n", shell_quote(c)));
    }
    if container.is_none()
        && let Some(setup) = &setup_env
    {
        body.push_str(&format!(". {} || exit 1\n", shell_quote(setup)));
    }
    if !env.prerun_commands.is_empty() {
        body.push_str("# prerun_commands (execution contract, verbatim)\n");
        for c in &env.prerun_commands {
            body.push_str(c);
            body.push('\n');
        }
    }
    if container.is_none()
        && let Some(venv) = &venv
    {
        body.push_str(&format!(
            ". {} || exit 1\n",
            shell_quote(&format!("{venv}/bin/activate"))
        ));
    }
    // The command as shell text: the launcher's words (torchrun's endpoint names the first
    // node, known only in the job, so it is the one word with an expansion) and the argv.
    let mut command = shell::join(&spec.command.effective_argv());
    let mut step: Option<Vec<String>> = match &topo.launcher {
        TaskLauncher::Direct => None,
        TaskLauncher::Srun { extra_args } => Some(extra_args.clone()),
        TaskLauncher::Torchrun { rdzv_port, .. } => {
            // One torchrun per node spawns the node's workers. One node: `--standalone` (a
            // free local port, so instances packed on a node never collide); several: a c10d
            // rendezvous on the job's first node, known only in the job (the one word with an
            // expansion; HEAD stands for it among words we made ourselves).
            const HEAD: &str = "\u{1}head_node\u{1}";
            if topo.nodes > 1 {
                body.push_str(
                    "head_node=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n",
                );
            }
            let endpoint = format!("{HEAD}:{rdzv_port}");
            let words = topo
                .launcher
                .torchrun_args(topo.nodes, Some(&endpoint), id.as_str(), None)
                .unwrap_or_default();
            let prefix: Vec<String> = words
                .iter()
                .map(|w| match w.split_once(HEAD) {
                    Some((pre, post)) => format!("{pre}\"$head_node\"{}", shell_quote(post)),
                    None => shell_quote(w),
                })
                .collect();
            command = format!("{} {command}", prefix.join(" "));
            Some(vec!["--ntasks-per-node=1".to_string()])
        }
    };
    if let Some(image) = &container {
        // pyxis (the enroot container plugin) adds the `--container-*` options to srun: the
        // step runs in the image, the setup script and venv are sourced there.
        // A direct command becomes one task on the first node (a container needs a step).
        let mut s = step
            .take()
            .unwrap_or_else(|| vec!["--nodes=1".to_string(), "--ntasks=1".to_string()]);
        s.push(format!("--container-image={image}"));
        if let Some(m) = env.container_mounts.as_deref().filter(|m| !m.is_empty()) {
            s.push(format!("--container-mounts={m}"));
        }
        if let Some(c) = &cwd {
            s.push(format!("--container-workdir={c}"));
        }
        command = format!(
            "{} {command}",
            shell::join(&[
                "bash".to_string(),
                "-c".into(),
                CONTAINER_PAYLOAD.into(),
                "puzzletron-job".into(),
                setup_env.clone().unwrap_or_default(),
                venv.clone().unwrap_or_default(),
            ])
        );
        step = Some(s);
    }
    if spec.command.env.contains_key(START_FILE_ENV) {
        // The start mark (issue 27): the job's own setup succeeded, the payload starts now.
        // A job that ends without it failed on its node or site, not in its payload.
        body.push_str(&format!(
            "printf '%s\\n' \"${ATTEMPT_ID_ENV}\" > \"${START_FILE_ENV}\" || :\n"
        ));
    }
    let launch = match &step {
        None => command,
        Some(s) if s.is_empty() => format!("srun {command}"),
        Some(s) => format!("srun {} {command}", shell::join(s)),
    };
    let post = &env.postrun_commands;
    let postrun = || {
        let mut p = String::from("# postrun_commands (execution contract, verbatim)\n");
        for c in post {
            p.push_str(c);
            p.push('\n');
        }
        p
    };
    match (&spec.warning_signal, post.is_empty()) {
        (None, true) => body.push_str(&format!("exec {launch}\n")),
        (None, false) => {
            body.push_str(&format!("{launch}\nrc=$?\n"));
            body.push_str(&postrun());
            body.push_str("exit \"$rc\"\n");
        }
        (Some(w), _) => {
            let post = if post.is_empty() {
                String::new()
            } else {
                postrun()
            };
            body.push_str(&forwarding_launch(&launch, &w.signal, &post));
        }
    }
    Ok(format!(
        "#!/bin/bash\n{}\n# rendered by puzzletron for attempt {id}\n{body}",
        d.join("\n")
    ))
}

/// What a containerised step runs (`bash -c` inside the image): source the setup script
/// (`$1`, when not empty) and the venv (`$2/bin/activate`), then exec the command. The values
/// are positional arguments, never part of the script text.
pub(crate) const CONTAINER_PAYLOAD: &str = "if [ -n \"$1\" ]; then . \"$1\" || exit 126; fi; \
if [ -n \"$2\" ]; then . \"$2/bin/activate\" || exit 126; fi; shift 2; exec \"$@\"";

/// The step line of a script with a warning signal (N03): the step runs in the background
/// (`launch &`), the shell waits for it and forwards `signal` and `TERM` (Slurm's own signal
/// at the limit) to it, so the worker can checkpoint; the shell's exit code is the step's.
/// `signal` is one of [`WARNING_SIGNALS`](crate::executor::WARNING_SIGNALS) (no quoting
/// needed).
fn forwarding_launch(launch: &str, signal: &str, postrun: &str) -> String {
    let mut traps = format!("trap 'kill -s {signal} \"$step\" 2>/dev/null' {signal}\n");
    if signal != "TERM" {
        traps.push_str("trap 'kill -s TERM \"$step\" 2>/dev/null' TERM\n");
    }
    // A trapped signal interrupts `wait` (status > 128) while the step still runs: wait again
    // until it has exited, so the status is the step's own.
    format!(
        "{traps}{launch} &\nstep=$!\nwait \"$step\"; rc=$?\n\
         while kill -0 \"$step\" 2>/dev/null; do wait \"$step\"; rc=$?; done\n{postrun}exit \"$rc\"\n"
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
