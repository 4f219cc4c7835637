//! A small Puzzle-style campaign on real data (the UCI digits of `examples/data/digits.csv`,
//! the MLP of `examples/common/digits.rs`), run by the durable [`CampaignController`]:
//!
//! ```text
//! prepare (single) -> score (sharded x4, 1 GPU each, + aggregate) -> search (single)
//!   -> realize (single, 1 GPU) -> evaluate (persistent pool of 2 workers over 8 items)
//! ```
//!
//! - `prepare` checks the data and writes a manifest;
//! - `score` trains 8 candidate variants (hidden width x learning rate), 2 per shard, and
//!   the aggregate step merges the shards' scores;
//! - `search` picks the best variant whose parameter count fits the budget;
//! - `realize` trains the chosen variant longer;
//! - `evaluate`: two long-lived workers claim validation chunks from the campaign's work queue
//!   and score the realized model on them.
//!
//! Run it (local executor, fake GPU ids; no GPU needed):
//! ```sh
//! cargo run --example campaign -- --dir /tmp/digits-campaign --gpus 0,1,2,3
//! ```
//! On the Slurm cluster of `../shared/slurm/start-local-cluster.sh`: add `--runner slurm`. On
//! SSH hosts (e.g. those of `scripts/ssh-hosts.sh start`): `--runner baremetal --hosts
//! h1:4,h2:4 --ssh-config /tmp/puzzletron-ssh-hosts/ssh_config`. On a Ray cluster (`ray start
//! --head --num-gpus=4`; build with `--features ray`): `--runner ray --ray-address
//! http://127.0.0.1:8265`.
//! `--help` lists every option (`--epochs N`, `--new-revision`, `--once`, `--quiet`, ...).
//! Kill it at any moment (even `kill -9`) and run the same command again: it re-attaches to
//! the jobs that are still running and adopts those submitted just before the kill. On a
//! terminal press `q` or Ctrl-C for the menu (cancel / continue / detach).
//!
//! The same binary is the payload: the controller starts `campaign worker` for every attempt,
//! which reads `PUZZLETRON_STAGE`, `PUZZLETRON_PHASE`, `PUZZLETRON_SHARD_INDEX`,
//! `PUZZLETRON_OUTPUT_DIR`, ... (see `puzzletron::campaign::controller::spec`). Results are
//! deterministic: the same on every run and every runner. The final figures are printed and
//! written to `<dir>/result.json`.

#[path = "common/digits.rs"]
#[allow(dead_code)]
mod digits;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use puzzletron::campaign::config::Value;
use puzzletron::campaign::controller::{
    CampaignController, ControllerError, ControllerEvent, PoolItem, PoolWorker, RunOptions,
    TerminalControls, ViewMode, open_campaign_dir,
};
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, RunnerEnvironment, StageCatalog, compile_resolved,
};
use puzzletron::executor::{Executor, LocalExecutor, SlurmExecutor};
use serde::{Deserialize, Serialize};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

const HIDDEN: [usize; 4] = [8, 16, 32, 64];
const LRS: [f64; 2] = [0.05, 0.2];
/// Largest parameter count `search` accepts (excludes width 64: 64*64+64+64*10+10 = 4874).
const BUDGET: usize = 2500;
const EVAL_CHUNKS: usize = 8;
const SEED: u64 = 7;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Score {
    hidden: usize,
    lr: f64,
    params: usize,
    val_accuracy: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Model {
    hidden: usize,
    lr: f64,
    epochs: u32,
    seed: u64,
    val_accuracy: f64,
}

fn data_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv")
}

fn params(hidden: usize) -> usize {
    digits::FEATURES * hidden + hidden + hidden * digits::CLASSES + digits::CLASSES
}

fn var(k: &str) -> Result<String, Error> {
    std::env::var(k)
        .map_err(|_| format!("{k} is not set: `campaign worker` runs under the controller").into())
}

/// Writes `bytes` to `path` so a crash leaves the old file or the new one: a temp file in the
/// same folder, fsync, rename over `path`, fsync of the folder.
fn atomic_write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> Result<(), Error> {
    atomic_write(path, &serde_json::to_vec_pretty(v)?)
        .map_err(|e| format!("writing {}: {e}", path.display()).into())
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, Error> {
    let b = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Ok(serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", path.display()))?)
}

/// Trains `hidden`/`lr` for `epochs` from `seed`; deterministic.
fn train(
    hidden: usize,
    lr: f64,
    epochs: u32,
    seed: u64,
) -> Result<(digits::Mlp, digits::Dataset), Error> {
    let (train, val) = digits::load(&data_path())?;
    let mut rng = digits::Rng::new(seed);
    let mut model = digits::Mlp::new(hidden, &mut rng);
    for _ in 0..epochs {
        model.train_epoch(&train, lr, 32, &mut rng);
    }
    Ok((model, val))
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

fn subset(d: &digits::Dataset, range: std::ops::Range<usize>) -> digits::Dataset {
    digits::Dataset {
        x: d.x[range.start * digits::FEATURES..range.end * digits::FEATURES].to_vec(),
        y: d.y[range].to_vec(),
    }
}

// ---------------------------------------------------------------- payload (`campaign worker`)

fn worker(args: &[String]) -> Result<(), Error> {
    let campaign = PathBuf::from(var("PUZZLETRON_CAMPAIGN_DIR")?);
    let stage = var("PUZZLETRON_STAGE")?;
    let phase = var("PUZZLETRON_PHASE")?;
    let out = PathBuf::from(var("PUZZLETRON_OUTPUT_DIR")?);
    let epochs: u32 = match args {
        [flag, n] if flag == "--epochs" => n
            .parse()
            .map_err(|_| format!("--epochs: {n:?} is not a positive integer"))?,
        _ => return Err(format!("worker arguments {args:?}: expected --epochs N").into()),
    };
    std::fs::create_dir_all(&out)?;
    // One line per start of a payload: the crash trials count them (a unit started twice
    // without a failure in between would be a duplicate job).
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out.join("starts.log"))?;
        writeln!(f, "{}", var(puzzletron::executor::ATTEMPT_ID_ENV)?)?;
        f.sync_all()?;
    }
    // Fault tests hold the payloads of one host while the file `DIR.hold.HOST` exists beside
    // the campaign folder DIR, so the host can be stopped while a task surely runs there (a
    // task of this example takes well under a second).
    let host = std::env::var("PUZZLETRON_HOST").unwrap_or_else(|_| "localhost".into());
    let mut hold = campaign.clone().into_os_string();
    hold.push(format!(".hold.{host}"));
    let hold = PathBuf::from(hold);
    let held_since = std::time::Instant::now();
    while hold.exists() && held_since.elapsed() < std::time::Duration::from_secs(300) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!(
        "stage {stage} ({phase}) unit {} attempt {} CUDA_VISIBLE_DEVICES={:?}",
        var("PUZZLETRON_UNIT")?,
        var("PUZZLETRON_ATTEMPT")?,
        std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default()
    );
    let started_ms = now_ms();
    let work = campaign.join("work");
    match (stage.as_str(), phase.as_str()) {
        ("prepare", _) => {
            let (train, val) = digits::load(&data_path())?;
            write_json(
                &out.join("manifest.json"),
                &json!({"train": train.len(), "val": val.len(), "seed": SEED}),
            )?;
        }
        ("score", "work") => {
            let shard: usize = var("PUZZLETRON_SHARD_INDEX")?.parse()?;
            let shards: usize = var("PUZZLETRON_SHARD_COUNT")?.parse()?;
            let mut scores = Vec::new();
            for (i, (h, lr)) in HIDDEN
                .iter()
                .flat_map(|h| LRS.iter().map(move |l| (*h, *l)))
                .enumerate()
            {
                if i % shards == shard {
                    let (m, val) = train(h, lr, epochs, SEED)?;
                    scores.push(Score {
                        hidden: h,
                        lr,
                        params: params(h),
                        val_accuracy: m.accuracy(&val),
                    });
                }
            }
            write_json(&out.join("scores.json"), &scores)?;
        }
        ("score", "aggregate") => {
            let mut all: Vec<Score> = Vec::new();
            for i in 0..4 {
                all.extend(read_json::<Vec<Score>>(
                    &work.join("score").join(i.to_string()).join("scores.json"),
                )?);
            }
            all.sort_by_key(|s| (s.hidden, s.lr.to_bits()));
            write_json(&out.join("scores.json"), &all)?;
        }
        ("search", _) => {
            let all: Vec<Score> = read_json(&work.join("score/agg/scores.json"))?;
            let best = all
                .iter()
                .filter(|s| s.params <= BUDGET)
                .max_by(|a, b| {
                    a.val_accuracy
                        .total_cmp(&b.val_accuracy)
                        .then(b.params.cmp(&a.params))
                })
                .ok_or("no variant fits the budget")?;
            write_json(&out.join("chosen.json"), best)?;
        }
        ("realize", _) => {
            let c: Score = read_json(&work.join("search/0/chosen.json"))?;
            let (m, val) = train(c.hidden, c.lr, epochs * 2, SEED + 4)?;
            let model = Model {
                hidden: c.hidden,
                lr: c.lr,
                epochs: epochs * 2,
                seed: SEED + 4,
                val_accuracy: m.accuracy(&val),
            };
            write_json(&out.join("model.json"), &model)?;
        }
        ("evaluate", "pool_worker") => {
            let spec: Model = read_json(&work.join("realize/0/model.json"))?;
            // The shared digits model has no serializer: rebuild it bit-identically.
            let (m, val) = train(spec.hidden, spec.lr, spec.epochs, spec.seed)?;
            let pool = PoolWorker::from_env()?;
            while let Some(item) = pool.claim()? {
                let (a, b) = (
                    item.item.payload["start"].as_u64().unwrap_or(0) as usize,
                    item.item.payload["end"].as_u64().unwrap_or(0) as usize,
                );
                let chunk = subset(&val, a.min(val.len())..b.min(val.len()));
                let correct = (m.accuracy(&chunk) * chunk.len() as f64).round() as u64;
                pool.complete(item, &json!({"correct": correct, "total": chunk.len()}))?;
            }
        }
        (s, p) => return Err(format!("unknown stage/phase {s}/{p}").into()),
    }
    // What this attempt ran on, for the tests of GPU slices: host, CUDA_VISIBLE_DEVICES and
    // when (ms), one line per successful attempt.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out.join("seen.log"))?;
        writeln!(
            f,
            "{} {} {} {started_ms} {}",
            var(puzzletron::executor::ATTEMPT_ID_ENV)?,
            std::env::var("PUZZLETRON_HOST").unwrap_or_else(|_| "localhost".into()),
            std::env::var("CUDA_VISIBLE_DEVICES")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "-".into()),
            now_ms()
        )?;
        f.sync_all()?;
    }
    atomic_write(&out.join("_SUCCESS"), b"")?;
    Ok(())
}

// ---------------------------------------------------------------- controller

struct Args {
    dir: PathBuf,
    runner: String,
    gpus: Vec<String>,
    epochs: u32,
    new_revision: bool,
    once: bool,
    poll_ms: u64,
    view: bool,
    hosts: Vec<(String, u32)>,
    ssh_config: Option<PathBuf>,
    lost_after_s: u64,
    ray_address: Option<String>,
}

const USAGE: &str = "\
usage: campaign [OPTIONS]
       campaign worker --epochs N   (the payload; started by the controller)

Runs the digits campaign (prepare -> score -> search -> realize -> evaluate) durably: run the
same command again after a crash or a detach to resume.

options:
  --dir D           campaign folder: new, empty, or one this example created (default digits-campaign)
  --runner R        local, slurm, baremetal or ray (default local)
  --ray-address A   ray runner: the dashboard's Jobs API, e.g. http://127.0.0.1:8265 (the
                    example built with --features ray)
  --hosts H:G,...   baremetal runner: SSH hosts and their GPU counts, e.g. h1:4,h2:4
  --ssh-config F    baremetal runner: an OpenSSH client config (ssh -F), e.g. with Host aliases
  --lost-after S    baremetal runner: seconds a host may stay unreachable before its tasks
                    count as failed nodes and are resubmitted (default 120)
  --gpus IDS        local runner: comma-separated distinct GPU ids, e.g. 0,1,2,3 (default 0,1,2,3;
                    indices or GPU-/MIG- UUIDs, handed out through CUDA_VISIBLE_DEVICES)
  --epochs N        training epochs per candidate, a positive integer (default 3)
  --poll-ms MS      least milliseconds between two polls of the jobs (default 200)
  --new-revision    accept a changed configuration: cancel the old attempts and start over
  --once            one controller iteration, then detach (jobs keep running)
  --quiet           no live progress view
  -h, --help        this help

exit status: 0 done, 1 error, 2 bad arguments or campaign incomplete, 3 detached";

/// What the command line asks for.
enum Command {
    Run(Args),
    Help,
}

/// A GPU id as `CUDA_VISIBLE_DEVICES` takes it: an index or a `GPU-`/`MIG-` UUID.
fn is_gpu_id(s: &str) -> bool {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        || ((s.starts_with("GPU-") || s.starts_with("MIG-"))
            && s.len() > 4
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
}

fn parse_gpus(v: &str) -> Result<Vec<String>, String> {
    let expected = "expected a comma-separated list of distinct GPU ids (indices or GPU-/MIG- \
                    UUIDs), e.g. 0,1,2,3";
    let mut ids: Vec<String> = Vec::new();
    for (i, id) in v.split(',').enumerate() {
        if !is_gpu_id(id) {
            return Err(format!(
                "--gpus {v:?}: item {} is {id:?}, not a GPU id; {expected}",
                i + 1
            ));
        }
        if ids.iter().any(|x| x == id) {
            return Err(format!(
                "--gpus {v:?}: GPU id {id:?} is given twice; {expected}"
            ));
        }
        ids.push(id.to_string());
    }
    Ok(ids)
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Command, Error> {
    let mut a = Args {
        dir: "digits-campaign".into(),
        runner: "local".into(),
        gpus: ["0", "1", "2", "3"].iter().map(|s| s.to_string()).collect(),
        epochs: 3,
        new_revision: false,
        once: false,
        poll_ms: 200,
        view: true,
        hosts: Vec::new(),
        ssh_config: None,
        lost_after_s: 120,
        ray_address: None,
    };
    let mut seen = std::collections::HashSet::new();
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(Command::Help);
        }
        if arg.starts_with("--") && !seen.insert(arg.clone()) {
            return Err(format!("{arg} is given twice").into());
        }
        let mut value = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match arg.as_str() {
            "--dir" => a.dir = value("--dir")?.into(),
            "--runner" => {
                a.runner = value("--runner")?;
                if !["local", "slurm", "baremetal", "ray"].contains(&a.runner.as_str()) {
                    return Err(format!(
                        "--runner {:?}: expected local, slurm, baremetal or ray",
                        a.runner
                    )
                    .into());
                }
            }
            "--gpus" => a.gpus = parse_gpus(&value("--gpus")?)?,
            "--epochs" => {
                let v = value("--epochs")?;
                a.epochs = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!("--epochs {v:?}: expected a positive integer (1, 2, ...)")
                })?;
            }
            "--poll-ms" => {
                let v = value("--poll-ms")?;
                a.poll_ms = v.parse().map_err(|_| {
                    format!("--poll-ms {v:?}: expected a whole number of milliseconds")
                })?;
            }
            "--hosts" => a.hosts = parse_hosts(&value("--hosts")?)?,
            "--ssh-config" => a.ssh_config = Some(value("--ssh-config")?.into()),
            "--ray-address" => a.ray_address = Some(value("--ray-address")?),
            "--lost-after" => {
                let v = value("--lost-after")?;
                a.lost_after_s = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!("--lost-after {v:?}: expected a positive number of seconds")
                })?;
            }
            "--new-revision" => a.new_revision = true,
            "--once" => a.once = true,
            "--quiet" => a.view = false,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    if a.runner == "baremetal" && a.hosts.is_empty() {
        return Err("--runner baremetal needs --hosts H:G,... (e.g. h1:4,h2:4)".into());
    }
    if a.runner != "baremetal" && (!a.hosts.is_empty() || a.ssh_config.is_some()) {
        return Err("--hosts and --ssh-config go with --runner baremetal".into());
    }
    if (a.runner == "ray") != a.ray_address.is_some() {
        return Err("--runner ray and --ray-address go together".into());
    }
    if a.runner == "ray" && !cfg!(feature = "ray") {
        return Err("--runner ray needs the example built with --features ray".into());
    }
    Ok(Command::Run(a))
}

fn parse_hosts(v: &str) -> Result<Vec<(String, u32)>, String> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for (i, item) in v.split(',').enumerate() {
        let (h, g) = item.split_once(':').ok_or_else(|| {
            format!(
                "--hosts {v:?}: item {} is {item:?}, expected HOST:GPUS",
                i + 1
            )
        })?;
        let g: u32 = g.parse().map_err(|_| {
            format!(
                "--hosts {v:?}: item {} has GPU count {g:?}, expected a whole number",
                i + 1
            )
        })?;
        if h.is_empty() || h.starts_with('-') || out.iter().any(|(x, _)| x == h) {
            return Err(format!(
                "--hosts {v:?}: item {} names host {h:?}: expected a distinct host name not starting with '-'",
                i + 1
            ));
        }
        out.push((h.to_string(), g));
    }
    Ok(out)
}

fn plan(args: &Args) -> Result<CampaignPlan, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("finding this program (for the payload command): {e}"))?
        .display()
        .to_string();
    let cmd = json!([exe, "worker", "--epochs", args.epochs.to_string()]);
    let config = json!({
        "stages": [
            {"id": "prepare", "command": cmd},
            {"id": "score", "needs": ["prepare"], "strategy": "sharded", "instances": 4, "aggregate": true, "command": cmd},
            {"id": "search", "needs": ["score"], "command": cmd},
            {"id": "realize", "needs": ["search"], "command": cmd},
            {"id": "evaluate", "needs": ["realize"], "strategy": "persistent_pool", "instances": 2, "command": cmd},
        ],
        "digits": {"budget": BUDGET},
    });
    let node = Value::from_json(&config);
    let catalog = StageCatalog::from_config("digits-campaign", &node)?;
    let execution = ExecutionConfig::from_value(
        "digits-execution",
        &Value::from_json(&json!({"execution": {
            // `resume` retries unknown failures (e.g. a job lost in a crash) up to 3 attempts.
            "defaults": {"failure_policy": "resume", "halt_policy": "drain", "max_attempts": 3, "gpus_per_node": 4},
            "stages": {
                "prepare": {"resource": "cpu"},
                "search": {"resource": "cpu"},
                "evaluate": {"resource": "cpu"},
            }
        }})),
    )?;
    let runner = match args.runner.as_str() {
        "slurm" => RunnerEnvironment::from_value(
            "digits-runner",
            &Value::from_json(&json!({"runner": {"kind": "slurm", "slurm": {"partition": "gpu"}}})),
        )?,
        "baremetal" => RunnerEnvironment::from_value(
            "digits-runner",
            &Value::from_json(&json!({"runner": {
                "kind": "baremetal",
                "inventory": {
                    "rendezvous_host": args.hosts[0].0,
                    "hosts": args.hosts.iter().map(|(h, g)| json!({"hostname": h, "gpus": g})).collect::<Vec<_>>(),
                },
                // The hosts see this checkout (same machine or a shared filesystem).
                "execution_contract": {"repository": env!("CARGO_MANIFEST_DIR")},
            }})),
        )?,
        "ray" => RunnerEnvironment::from_value(
            "digits-runner",
            &Value::from_json(&json!({"runner": {
                "kind": "ray",
                "ray": {
                    "address": args.ray_address.clone().unwrap_or_default(),
                    "namespace": "digits",
                    "gpus_per_node": 4,
                },
                // The Ray nodes see this checkout and the campaign folder (same machine or a
                // shared filesystem).
                "execution_contract": {"repository": env!("CARGO_MANIFEST_DIR")},
            }})),
        )?,
        _ => RunnerEnvironment::local(),
    };
    Ok(compile_resolved(
        "digits-campaign",
        node,
        &[],
        &catalog,
        &runner,
        &execution,
        None,
    )?)
}

fn eval_items(_campaign: &Path) -> Result<Vec<PoolItem>, String> {
    let (_, val) = digits::load(&data_path()).map_err(|e| e.to_string())?;
    let n = val.len();
    let step = n.div_ceil(EVAL_CHUNKS);
    Ok((0..EVAL_CHUNKS)
        .map(|i| {
            PoolItem::new(
                format!("chunk{i}"),
                json!({"start": i * step, "end": ((i + 1) * step).min(n)}),
            )
        })
        .collect())
}

async fn controller_main(args: Args) -> Result<i32, Error> {
    // Checks and claims the folder first (refusing an unrelated non-empty one), before the
    // executor puts its own folder (`attempts/`, `slurm-logs/`) into it.
    let dir = open_campaign_dir(&args.dir)?;
    let plan = plan(&args)?;
    let executor: Arc<dyn Executor> = match args.runner.as_str() {
        "slurm" => Arc::new(SlurmExecutor::builder(dir.join("slurm-logs")).build()?),
        "baremetal" => {
            // `runner.kind: baremetal`: hosts and contract from the plan's runner; the lease
            // file lives in the campaign folder.
            let mut b = plan
                .runner
                .baremetal_executor(dir.join("baremetal"))?
                .kill_grace(Duration::from_secs(2))
                .lost_after(Duration::from_secs(args.lost_after_s))
                .backoff_max(Duration::from_secs(2));
            if let Some(c) = &args.ssh_config {
                b = b.ssh_config(c);
            }
            Arc::new(b.build()?)
        }
        // `runner.kind: ray`: the cluster, namespace and contract from the plan's runner;
        // every job's metadata names this campaign folder.
        #[cfg(feature = "ray")]
        "ray" => Arc::new(
            plan.runner
                .ray_executor(&dir.display().to_string())?
                .kill_grace(Duration::from_secs(2))
                .build()?,
        ),
        _ => Arc::new(
            LocalExecutor::builder(dir.join("attempts"))
                .gpu_ids(args.gpus.clone())
                .max_concurrent(4)
                .build()?,
        ),
    };
    let (controls, rx) = TerminalControls::start()
        .map_err(|e| format!("installing the key reader and signal handlers: {e}"))?;
    let poll = Duration::from_millis(args.poll_ms.max(10));
    let mut builder = CampaignController::builder();
    // Crash tests: `CAMPAIGN_ABORT_AFTER_SUBMITS=n` aborts right after the n-th submit.
    if let Some(n) = std::env::var("CAMPAIGN_ABORT_AFTER_SUBMITS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.abort_after_submits(n);
    }
    let mut ctl = builder
        .plan(plan)
        .executor(executor)
        .campaign_dir(&dir)
        .poll_interval(poll, poll * 10)
        .adopt_grace(Duration::from_secs(if args.runner == "slurm" {
            30
        } else {
            5
        }))
        .new_revision(args.new_revision)
        .pool_items("evaluate", eval_items)
        .controls(rx)
        .view(if args.view {
            ViewMode::Auto
        } else {
            ViewMode::Off
        })
        .on_event(|ev| {
            // Successes are in the view and the report; everything else is logged.
            if !matches!(ev, ControllerEvent::AttemptFinished { class: None, .. }) {
                eprintln!("[{}] {ev}", ev.kind());
            }
        })
        .build()?;
    let report = ctl.run(RunOptions::default().with_once(args.once)).await?;
    drop(controls);
    if !report.is_complete() {
        // The live view prints the report when it finishes; print it only without the view.
        if !args.view {
            eprintln!("{report}");
        }
        return Ok(if report.detached { 3 } else { 2 });
    }
    // Final figures from the pool's results.
    let results = ctl.queue("evaluate").results()?;
    let (mut correct, mut total) = (0u64, 0u64);
    for r in &results {
        correct += r.result["correct"].as_u64().unwrap_or(0);
        total += r.result["total"].as_u64().unwrap_or(0);
    }
    let model: Model = read_json(&dir.join("work/realize/0/model.json"))?;
    let scores: Vec<Score> = read_json(&dir.join("work/score/agg/scores.json"))?;
    let result = json!({
        "variants_scored": scores.len(),
        "chosen": {"hidden": model.hidden, "lr": model.lr},
        "realize_val_accuracy": model.val_accuracy,
        "evaluate_items": results.len(),
        "evaluate_accuracy": correct as f64 / total.max(1) as f64,
        "scores": scores.iter().map(|s| ((format!("h{}_lr{}", s.hidden, s.lr)), s.val_accuracy)).collect::<BTreeMap<_, _>>(),
    });
    write_json(&dir.join("result.json"), &result)?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(0)
}

fn main() {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("worker") {
        let rest: Vec<String> = argv.skip(1).collect();
        if let Err(e) = worker(&rest) {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        return;
    }
    let code = match parse_args(argv) {
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            2
        }
        Ok(Command::Help) => {
            println!("{USAGE}");
            0
        }
        Ok(Command::Run(args)) => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the runtime: {e}");
                    std::process::exit(1);
                }
            };
            match rt.block_on(controller_main(args)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    if let Some(ControllerError::ContractChanged { .. }) =
                        e.downcast_ref::<ControllerError>()
                    {
                        eprintln!(
                            "hint: run again with --new-revision to cancel the old attempts and \
                             start over with the new settings, or use the old settings"
                        );
                    }
                    1
                }
            }
        }
    };
    std::process::exit(code);
}
