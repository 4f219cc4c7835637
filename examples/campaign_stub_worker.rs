//! A stand-in for Puzzletron's stage workers, for testing the `puzzletron` CLI on the real
//! configs without GPUs or Python: `puzzletron campaign run ... --command-prefix
//! "<this> [OPTIONS] --"` puts it before every catalog command.
//!
//! ```text
//! campaign_stub_worker [--sleep-ms N] [--slow STAGE=MS]... [--fail STAGE=KIND]... -- ARGV...
//! ```
//!
//! It records its argv and environment contract in `$PUZZLETRON_OUTPUT_DIR/stub.json`, sleeps,
//! and either writes the success marker `_SUCCESS` or fails its first attempt as KIND says:
//! `oom` (a CUDA out-of-memory trace, exit 1), `transient` (Slurm's node-failure line, exit
//! 1), `app` (exit 1), `config` (exit 2). `KIND!` fails every attempt. Persistent-pool workers
//! (`PUZZLETRON_PHASE=pool_worker`) drain their queue first.

use std::collections::HashMap;
use std::time::Duration;

use puzzletron::campaign::controller::PoolWorker;

fn main() {
    if let Err(e) = run() {
        eprintln!("stub worker: {e}");
        std::process::exit(1);
    }
}

fn env(k: &str) -> Result<String, String> {
    std::env::var(k).map_err(|_| format!("{k} is not set (run under the campaign controller)"))
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut sleep_ms = 200u64;
    let mut slow: HashMap<String, u64> = HashMap::new();
    let mut fail: HashMap<String, String> = HashMap::new();
    let mut i = 0;
    while i < args.len() && args[i] != "--" {
        let v = args
            .get(i + 1)
            .ok_or_else(|| format!("{} needs a value", args[i]))?;
        match args[i].as_str() {
            "--sleep-ms" => sleep_ms = v.parse().map_err(|_| format!("--sleep-ms {v:?}"))?,
            "--slow" => {
                let (s, ms) = v.split_once('=').ok_or(format!("--slow {v:?}: STAGE=MS"))?;
                slow.insert(s.into(), ms.parse().map_err(|_| format!("--slow {v:?}"))?);
            }
            "--fail" => {
                let (s, k) = v
                    .split_once('=')
                    .ok_or(format!("--fail {v:?}: STAGE=KIND"))?;
                fail.insert(s.into(), k.into());
            }
            other => return Err(format!("unknown option {other:?}")),
        }
        i += 2;
    }
    let argv: Vec<String> = args.get(i + 1..).unwrap_or_default().to_vec();
    let stage = env("PUZZLETRON_STAGE")?;
    let attempt: u32 = env("PUZZLETRON_ATTEMPT")?.parse().unwrap_or(1);
    let out = std::path::PathBuf::from(env("PUZZLETRON_OUTPUT_DIR")?);
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let record = serde_json::json!({
        "argv": argv,
        "stage": stage,
        "unit": env("PUZZLETRON_UNIT")?,
        "attempt": attempt,
        "phase": env("PUZZLETRON_PHASE")?,
        "cuda_visible_devices": std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    });
    std::fs::write(out.join(format!("stub.{attempt}.json")), record.to_string())
        .map_err(|e| format!("writing stub.json: {e}"))?;
    eprintln!(
        "stub worker: stage {stage} attempt {attempt}: {}",
        argv.join(" ")
    );
    std::thread::sleep(Duration::from_millis(
        *slow.get(&stage).unwrap_or(&sleep_ms),
    ));
    if let Some(kind) = fail.get(&stage) {
        let always = kind.ends_with('!');
        if always || attempt == 1 {
            match kind.trim_end_matches('!') {
                "oom" => {
                    eprintln!(
                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
                    );
                    std::process::exit(1);
                }
                "transient" => {
                    eprintln!(
                        "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO NODE FAILURE ***"
                    );
                    std::process::exit(1);
                }
                "config" => {
                    eprintln!("error: unrecognized arguments: --bogus");
                    std::process::exit(2);
                }
                _ => {
                    eprintln!("stub worker: failing as asked");
                    std::process::exit(1);
                }
            }
        }
    }
    if env("PUZZLETRON_PHASE")? == "pool_worker" {
        let pool = PoolWorker::from_env().map_err(|e| e.to_string())?;
        while let Some(item) = pool.claim().map_err(|e| e.to_string())? {
            pool.complete(item, &serde_json::json!({"ok": true}))
                .map_err(|e| e.to_string())?;
        }
    }
    std::fs::write(out.join("_SUCCESS"), b"").map_err(|e| format!("writing _SUCCESS: {e}"))?;
    Ok(())
}
