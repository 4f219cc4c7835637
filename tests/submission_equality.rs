//! One submission path (issue 25): for every triple of the shared `reference-plans.json` and
//! the local examples, under each runner kind, what the executors actually submit for every
//! attempt-1 job is, byte for byte, what the dry run shows for it.
//!
//! - Slurm: a recording `sbatch` (the executor's `bin_dir`) keeps each batch script it is given
//!   and its argv, and answers a job id.
//! - Bare metal: a recording `ssh` (the executor's `ssh_program`) keeps the argv of every
//!   submit exchange and answers the executor's preflight, submit and cancel scripts as a host
//!   would; each job is cancelled after its submit, so the next one is leased on idle hosts,
//!   as the dry run renders it.
//! - Local: the executor's own launch record (`launch.json` in the attempt folder) holds the
//!   rendering the job was started from.
//! - Ray (feature `ray`): a recording HTTP server in place of the dashboard keeps the body of
//!   every `POST /api/jobs/` (and answers the preflight with one 8-GPU node).
//!
//! The specs come from `attempt_specs` (the controller's `attempt_spec`), the dry run from
//! `dry_run` with the same executor. A change to either side alone (a directive added to the
//! script only when submitting, a word dropped from the dry run) fails the comparison. A job
//! an executor cannot take is refused the same way by `render` and by `submit`.
#![cfg(feature = "slurm")]

mod support;
use support::plan::fixtures;

use std::path::{Path, PathBuf};
use std::time::Duration;

use puzzletron::campaign::config::{ConfigLoader, Env};
use puzzletron::campaign::{
    CampaignPlan, DryRunOptions, ExecutionConfig, RunnerEnvironment, attempt_specs,
    compile_campaign_plan_with, dry_run, render_dry_run,
};
use puzzletron::executor::ExecutionContract;
use puzzletron::executor::{Executor, LocalExecutor, Rendering, SlurmExecutor};

fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("reference-plans.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn loader() -> ConfigLoader {
    let mut env = Env::new();
    for (k, v) in reference()["env"].as_object().unwrap() {
        env.set(k.clone(), v.as_str().unwrap());
    }
    ConfigLoader::new().env(env)
}

fn write_exe(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/bin/sh\n{body}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The recording `sbatch` and `ssh` in `bin/`, writing into `rec/`.
fn fakes(root: &Path) -> (PathBuf, PathBuf) {
    let bin = root.join("bin");
    let rec = root.join("rec");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&rec).unwrap();
    // sbatch --parsable SCRIPT: keep the script's bytes and the argv (NUL-separated).
    write_exe(
        &bin.join("sbatch"),
        &format!(
            "r='{rec}'\nfor a in \"$@\"; do s=$a; done\nn=$(basename \"$s\")\ncp \"$s\" \"$r/$n\"\n\
             {{ printf '%s\\0' \"$0\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }} > \"$r/$n.argv\"\n\
             echo 4242\n",
            rec = rec.display()
        ),
    );
    // ssh ... -- HOST LINE: answer as a host would; keep the argv of each submit.
    write_exe(
        &bin.join("ssh"),
        &format!(
            "r='{rec}'\nfor a in \"$@\"; do line=$a; done\ncase $line in\n\
             *\" ptron-submit \"*) f=$(mktemp \"$r/ssh.XXXXXXXX\"); \
             {{ printf '%s\\0' \"$0\"; for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }} > \"$f\"; \
             mv \"$f\" \"$f.submit\"; echo OK ;;\n\
             *\" ptron-preflight \"*) printf 'REPO ok\\nVENV ok\\nROOT ok /r\\nPROBE 0\\n'; \
             i=0; while [ $i -lt 64 ]; do echo \"GPU $i: fake\"; i=$((i+1)); done ;;\n\
             *\" ptron-cancel \"*) echo DONE ;;\n\
             *\" ptron-poll \"*) ;;\n\
             esac\n",
            rec = rec.display()
        ),
    );
    (bin, rec)
}

fn argv_of(bytes: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|w| String::from_utf8(w.to_vec()).unwrap())
        .collect();
    assert_eq!(v.pop().as_deref(), Some(""), "NUL-terminated words");
    v
}

/// The runner of kind `kind` for a triple whose own runner is `own`: the triple's own when it
/// is of that kind, else one of that kind with the same execution contract (less the container
/// on local and bare metal, which have no container runtime).
fn runner_of_kind(own: &RunnerEnvironment, kind: &str) -> RunnerEnvironment {
    if own.kind.as_str() == kind {
        return own.clone();
    }
    let mut contract: ExecutionContract = own.execution_contract.clone();
    if kind != "slurm" {
        contract.container = None;
        contract.container_mounts = None;
    }
    let yaml = match kind {
        "local" => "runner: {kind: local}\n".to_string(),
        "slurm" => "runner:\n  kind: slurm\n  slurm: {account: vision, partition: batch, \
                    partition_interactive: interactive, qos: long, time_limit: \"2:00:00\"}\n"
            .to_string(),
        "ray" => "runner:\n  kind: ray\n  ray: {address: \"http://127.0.0.1:1\", namespace: ns, \
                  resources_per_gpu: {CPU: 2}}\n"
            .to_string(),
        _ => format!(
            "runner:\n  kind: baremetal\n  inventory:\n    rendezvous_host: gpu-a\n    hosts: [{}]\n",
            ["a", "b", "c", "d", "e", "f", "g", "h"]
                .map(|h| format!("{{hostname: gpu-{h}, gpus: 8}}"))
                .join(", ")
        ),
    };
    let cfg = puzzletron::campaign::config::load_yaml_str(&yaml, Path::new("runner.yaml")).unwrap();
    let mut r = RunnerEnvironment::from_value("runner.yaml", &cfg.value).unwrap();
    r.execution_contract = contract;
    r
}

struct Tally {
    jobs: usize,
    refused: usize,
}

/// Submits every attempt-1 job of `plan` to an executor of its runner's kind (with the
/// recording fakes) and compares what was submitted with the dry run's rendering.
async fn check_plan(label: &str, plan: &CampaignPlan, root: &Path) -> Tally {
    let (bin, rec) = fakes(root);
    let dir = root.join("campaign");
    let opts = DryRunOptions::default()
        .with_campaign_dir(dir.clone())
        .with_tag("T0")
        .with_redact_secrets(false);
    #[cfg(feature = "ray")]
    let recorder = ray_recorder::Recorder::start();
    let exec: Box<dyn Executor> = match plan.runner.kind.as_str() {
        #[cfg(feature = "ray")]
        "ray" => {
            // The executor `campaign run` builds (default_executor), on the recorder.
            let mut at_recorder = plan.clone();
            at_recorder.runner.ray.as_mut().unwrap().address = recorder.address();
            puzzletron::campaign::default_executor(&at_recorder, &dir, &[], None).unwrap()
        }
        "slurm" => Box::new(
            SlurmExecutor::builder(dir.join("slurm-logs"))
                .bin_dir(&bin)
                .build()
                .unwrap(),
        ),
        "local" => Box::new(
            LocalExecutor::builder(dir.join("attempts"))
                .gpu_ids((0..8).map(|i| i.to_string()))
                .max_concurrent(1)
                .build()
                .unwrap(),
        ),
        _ => Box::new(
            plan.runner
                .baremetal_executor(dir.join("baremetal"))
                .unwrap()
                .ssh_program(bin.join("ssh").display().to_string())
                .kill_grace(Duration::from_secs(1))
                .cancel_timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        ),
    };
    let dr = dry_run(plan, &opts, exec.as_ref());
    let text = render_dry_run(plan, &opts, exec.as_ref());
    let mut tally = Tally {
        jobs: 0,
        refused: 0,
    };
    let mut dry_jobs = dr
        .as_ref()
        .ok()
        .map(|d| d.submissions.iter().flat_map(|s| s.jobs.iter()));
    for stage in attempt_specs(plan, &opts).unwrap() {
        for (unit, _, spec) in &stage.units {
            let what = format!("{label}: {unit} ({})", spec.attempt_id);
            let rendered = exec.render(spec);
            if let Some(jobs) = dry_jobs.as_mut() {
                // The dry run shows exactly this rendering, in the controller's order.
                let job = jobs
                    .next()
                    .unwrap_or_else(|| panic!("{what}: not in the dry run"));
                assert_eq!(job.attempt_id, spec.attempt_id, "{what}");
                match &rendered {
                    Ok(r) => assert_eq!(&job.rendering, r, "{what}"),
                    Err(e) => panic!("{what}: in the dry run, yet not renderable: {e}"),
                }
                let shown = text.as_ref().unwrap();
                assert!(
                    shown.contains(&job.rendering.to_text()),
                    "{what}: the printed dry run holds the rendering"
                );
            }
            tally.jobs += 1;
            match rendered {
                Err(e) => {
                    // What cannot be rendered cannot be submitted, for the same reason.
                    let s = exec.submit(spec).await.expect_err(&what);
                    assert_eq!(s.to_string(), e.to_string(), "{what}");
                    tally.refused += 1;
                }
                #[cfg(feature = "ray")]
                Ok(r) if exec.kind() == "ray" => {
                    exec.submit(spec)
                        .await
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let bodies = recorder.take_bodies();
                    assert_eq!(bodies.len(), 1, "{what}: one POST /api/jobs/");
                    assert_eq!(r.files.len(), 1, "{what}");
                    assert_eq!(
                        bodies[0], r.files[0].content,
                        "{what}: the job request body"
                    );
                }
                Ok(r) => compare_submission(&what, exec.as_ref(), spec, &r, &rec, &dir).await,
            }
        }
    }
    if let Err(e) = &dr {
        assert!(
            tally.refused > 0,
            "{label}: dry run failed ({e}) but every job rendered"
        );
    }
    tally
}

async fn compare_submission(
    what: &str,
    exec: &dyn Executor,
    spec: &puzzletron::executor::AttemptSpec,
    r: &Rendering,
    rec: &Path,
    dir: &Path,
) {
    let id = spec.attempt_id.as_str();
    match exec.kind() {
        "slurm" => {
            exec.submit(spec)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let name = format!("{id}.sbatch");
            let script = std::fs::read_to_string(rec.join(&name)).unwrap();
            let argv = argv_of(&std::fs::read(rec.join(format!("{name}.argv"))).unwrap());
            assert_eq!(r.files.len(), 1, "{what}");
            assert_eq!(script, r.files[0].content, "{what}: the batch script");
            assert_eq!(argv, r.commands[0].argv, "{what}: the sbatch command");
            assert_eq!(Path::new(argv.last().unwrap()), r.files[0].path, "{what}");
        }
        "baremetal" => {
            let h = exec
                .submit(spec)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut sent: Vec<(std::time::SystemTime, Vec<String>)> = std::fs::read_dir(rec)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".submit"))
                .map(|e| {
                    let t = e.metadata().unwrap().modified().unwrap();
                    let argv = argv_of(&std::fs::read(e.path()).unwrap());
                    std::fs::remove_file(e.path()).unwrap();
                    (t, argv)
                })
                .collect();
            sent.sort();
            let mut sent: Vec<Vec<String>> = sent.into_iter().map(|(_, a)| a).collect();
            let mut want: Vec<Vec<String>> = r.commands.iter().map(|c| c.argv.clone()).collect();
            // One ssh per host, in rank order (mtime order can tie; compare as sets too).
            sent.sort();
            want.sort();
            assert_eq!(sent, want, "{what}: the ssh commands");
            // Free the lease: the next job is leased on idle hosts, as rendered.
            exec.cancel(&h)
                .await
                .unwrap_or_else(|e| panic!("{what}: cancel: {e}"));
        }
        _ => {
            let h = exec
                .submit(spec)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let local = LocalExecutor::builder(dir.join("attempts"))
                .build()
                .unwrap();
            let t = std::time::Instant::now();
            let record = loop {
                if let Some(rec) = local.launch_record(&spec.attempt_id).unwrap() {
                    break rec;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "{what}: never launched"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            assert_eq!(
                serde_json::to_string_pretty(&record.rendering).unwrap(),
                serde_json::to_string_pretty(r).unwrap(),
                "{what}: the launch record"
            );
            assert_eq!(
                record.gpus.len() as u32,
                spec.topology.gpus_per_node(),
                "{what}"
            );
            // It ran (and failed: the fixture's checkout is not here); wait for its end so
            // jobs never overlap.
            let _ = puzzletron::executor::ExecutorExt::wait_terminal(
                exec,
                &[h],
                Duration::from_millis(20),
                Duration::from_secs(60),
            )
            .await
            .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reference_triple_submits_what_its_dry_run_shows_for_each_runner_kind() {
    let root = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for (i, c) in reference()["cases"].as_array().unwrap().iter().enumerate() {
        let own = RunnerEnvironment::load(fixtures().join(c["runner"].as_str().unwrap())).unwrap();
        let execution =
            ExecutionConfig::load(fixtures().join(c["execution"].as_str().unwrap())).unwrap();
        let overrides: Vec<_> = c["overrides"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_str().unwrap().parse().unwrap())
            .collect();
        for kind in ["slurm", "local", "baremetal", "ray"] {
            if kind == "ray" && !cfg!(feature = "ray") {
                continue;
            }
            let runner = runner_of_kind(&own, kind);
            let label = format!("{} with a {kind} runner", c["experiment"].as_str().unwrap());
            let plan = match compile_campaign_plan_with(
                &loader(),
                fixtures().join(c["experiment"].as_str().unwrap()),
                &runner,
                &execution,
                &overrides,
                None,
            ) {
                Ok(p) => p,
                Err(e) => {
                    seen.push(format!("{label}: refused at compile: {e}"));
                    continue;
                }
            };
            let t = check_plan(&label, &plan, &root.path().join(format!("{i}-{kind}"))).await;
            assert!(t.jobs > 0, "{label}");
            seen.push(format!("{label}: {} jobs, {} refused", t.jobs, t.refused));
        }
    }
    eprintln!("{}", seen.join("\n"));
    // Every triple compiles under its own runner and every job of it is submittable, except
    // the one the reference also fails to plan (with the same reason).
    let mut compared = 0;
    for c in reference()["cases"].as_array().unwrap() {
        let own = RunnerEnvironment::load(fixtures().join(c["runner"].as_str().unwrap())).unwrap();
        let prefix = format!(
            "{} with a {} runner: ",
            c["experiment"].as_str().unwrap(),
            own.kind.as_str()
        );
        let line = seen.iter().find(|l| l.starts_with(&prefix)).unwrap();
        match c["plan"]["dry_run_error"].as_str() {
            Some(reason) => assert!(
                line.contains("refused at compile")
                    && line.contains(reason.trim_start_matches("ValueError: ")),
                "{line}"
            ),
            None => {
                assert!(line.ends_with(" 0 refused"), "{line}");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 8, "{seen:#?}");
    // Each runner kind compared a real number of plans (the others are refused at compile
    // with the reason: a local runner has one machine, a stage needs more hosts).
    for kind in ["slurm", "local", "baremetal"] {
        let n = seen
            .iter()
            .filter(|l| l.contains(&format!("with a {kind} runner: ")) && l.ends_with(" 0 refused"))
            .count();
        assert!(n >= 5, "{kind}: {n} plans compared\n{seen:#?}");
    }
    // Ray: one node per instance, so plans with multi-node instances are refused at compile,
    // naming the reason; the others are compared.
    if cfg!(feature = "ray") {
        let ray: Vec<&String> = seen
            .iter()
            .filter(|l| l.contains("with a ray runner: "))
            .collect();
        let compared = ray.iter().filter(|l| l.ends_with(" 0 refused")).count();
        assert!(compared >= 3, "ray: {compared} plans compared\n{ray:#?}");
        // A multi-node instance is refused by name (others, as under the local and
        // bare-metal runners: a partition, the reference's own planning error).
        assert!(
            ray.iter()
                .any(|l| l.contains("the nodes of one instance on a ray runner")),
            "{ray:#?}"
        );
    }
}

/// A stand-in for the Ray dashboard: answers the preflight (`/api/version`, one live node
/// with 8 GPUs) and keeps the body of every `POST /api/jobs/`.
#[cfg(feature = "ray")]
mod ray_recorder {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::{Arc, Mutex};

    pub struct Recorder {
        port: u16,
        bodies: Arc<Mutex<Vec<String>>>,
    }

    impl Recorder {
        pub fn start() -> Self {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let bodies = Arc::new(Mutex::new(Vec::new()));
            let b = bodies.clone();
            std::thread::spawn(move || {
                for c in l.incoming() {
                    let Ok(c) = c else { return };
                    let mut r = BufReader::new(c);
                    let mut line = String::new();
                    if r.read_line(&mut line).is_err() {
                        continue;
                    }
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                        let lower = h.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; len];
                    let _ = r.read_exact(&mut body);
                    let answer = if line.starts_with("POST /api/jobs/ ") {
                        b.lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&body).into_owned());
                        r#"{"job_id": "x", "submission_id": "x"}"#.to_string()
                    } else if line.starts_with("GET /api/version ") {
                        r#"{"ray_version": "2.60.0"}"#.to_string()
                    } else {
                        r#"{"data": {"result": {"result": [{"state": "ALIVE", "resources_total": {"GPU": 8.0, "CPU": 128.0, "memory": 1e13}}]}}}"#.to_string()
                    };
                    let mut c = r.into_inner();
                    let _ = write!(
                        c,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                        answer.len()
                    );
                }
            });
            Self { port, bodies }
        }

        pub fn address(&self) -> String {
            format!("http://127.0.0.1:{}", self.port)
        }

        pub fn take_bodies(&self) -> Vec<String> {
            std::mem::take(&mut *self.bodies.lock().unwrap())
        }
    }
}

/// The local examples: the smoke run with `--runner local` (README) and the single-GPU memory
/// run (the dry-run help), with the built-in local runner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_examples_launch_what_their_dry_run_shows() {
    let root = tempfile::tempdir().unwrap();
    for (i, (experiment, execution, overrides)) in [
        (
            "families/qwen3_5/qwen3p5_0p8b/runs/mip_smoke.yaml",
            "orchestration/qwen3p5_0p8b/execution.smoke.yaml",
            vec!["pruning.eval_samples=4"],
        ),
        (
            "families/llama/llama3p1_8b/runs/pruneffn_memory.yaml",
            "orchestration/execution.single_gpu.yaml",
            vec![],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let plan = compile_campaign_plan_with(
            &loader(),
            fixtures().join(experiment),
            &RunnerEnvironment::local(),
            &ExecutionConfig::load(fixtures().join(execution)).unwrap(),
            &overrides
                .iter()
                .map(|o| o.parse().unwrap())
                .collect::<Vec<_>>(),
            None,
        )
        .unwrap();
        let t = check_plan(experiment, &plan, &root.path().join(i.to_string())).await;
        assert!(
            t.jobs >= plan.stages.len() - 1,
            "{experiment}: {} jobs",
            t.jobs
        );
        assert_eq!(t.refused, 0, "{experiment}");
    }
}
