//! Shared by the controller's process-level tests: find the `campaign` example, run it, kill
//! it, and audit a campaign folder for duplicate jobs and lost results.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `campaign` example binary that `cargo test` builds next to the test binaries.
pub fn campaign_exe() -> PathBuf {
    super::examples::example_exe("campaign")
}

pub fn spawn(dir: &Path, extra: &[&str]) -> Child {
    spawn_env(dir, extra, &[])
}

pub fn spawn_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(campaign_exe())
        .envs(env.iter().copied())
        .arg("--dir")
        .arg(dir)
        .args(["--quiet", "--poll-ms", "100"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the campaign example")
}

/// The result file of a finished campaign.
pub fn result(dir: &Path) -> Value {
    let p = dir.join("result.json");
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .expect("result.json")
}

/// What an audit found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Jobs started under an attempt id that started before, or unknown to the journal, or a
    /// unit with two successful attempts.
    pub duplicates: Vec<String>,
    /// Units without their success marker.
    pub missing: Vec<String>,
    /// Attempts submitted (journal).
    pub attempts: usize,
    /// Adopted through `find` after a crash.
    pub adopted: usize,
    /// Payload starts counted from `starts.log`.
    pub starts: usize,
}

/// Audits a campaign folder: every payload start (`work/*/*/starts.log`) is an attempt the
/// journal knows as submitted, no attempt id started twice, no unit has two successful
/// attempts, every unit left `_SUCCESS`, and (local) every attempt folder is known.
pub fn audit(dir: &Path) -> Audit {
    let journal = std::fs::read_to_string(dir.join("controller/journal.jsonl")).expect("journal");
    let mut submitted = HashSet::new();
    let mut ok_by_unit: HashMap<String, usize> = HashMap::new();
    let mut unit_of = HashMap::new();
    let mut a = Audit::default();
    for line in journal.lines() {
        let v: Value = serde_json::from_str(line).expect("journal line");
        let e = &v["entry"];
        match e["t"].as_str().unwrap_or("") {
            "intent" => {
                unit_of.insert(
                    e["attempt_id"].as_str().unwrap().to_string(),
                    e["unit"].as_str().unwrap().to_string(),
                );
            }
            "submitted" => {
                submitted.insert(e["attempt_id"].as_str().unwrap().to_string());
                a.attempts += 1;
                if e["adopted"].as_bool() == Some(true) {
                    a.adopted += 1;
                }
            }
            "finished" if e["class"].is_null() => {
                let unit = unit_of[e["attempt_id"].as_str().unwrap()].clone();
                *ok_by_unit.entry(unit).or_default() += 1;
            }
            _ => {}
        }
    }
    for (u, n) in &ok_by_unit {
        if *n > 1 {
            a.duplicates.push(format!("unit {u} succeeded {n} times"));
        }
    }
    let mut seen = HashSet::new();
    for stage in std::fs::read_dir(dir.join("work")).expect("work folder") {
        let stage = stage.unwrap().path();
        // A persistent-pool stage (it has a work queue) is done when its items are, whether or
        // not every worker ran: a worker whose folder was made just before a kill, and whose
        // peers then drained the queue, is never started, and needs no `_SUCCESS`. Its items
        // are checked through the campaign's result (`evaluate_items`, accuracy).
        let pool = dir
            .join("queues")
            .join(stage.file_name().expect("stage folder name"))
            .is_dir();
        for unit in std::fs::read_dir(&stage).unwrap() {
            let unit = unit.unwrap().path();
            let starts = std::fs::read_to_string(unit.join("starts.log")).unwrap_or_default();
            let exempt = pool && starts.trim().is_empty();
            if !exempt && !unit.join("_SUCCESS").exists() {
                a.missing.push(unit.display().to_string());
            }
            for id in starts.lines() {
                a.starts += 1;
                if !seen.insert(id.to_string()) {
                    a.duplicates.push(format!("attempt {id} started twice"));
                }
                if !submitted.contains(id) {
                    a.duplicates.push(format!(
                        "attempt {id} started but the journal never recorded its job"
                    ));
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir.join("attempts")) {
        for e in rd {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            // A folder without `attempt.json` is a submit killed between creating the folder
            // and recording the job: no job exists (the executor's `find` says so, and the
            // controller gives the intent up). Any folder with a job must be in the journal.
            let has_job = e.path().join("attempt.json").exists();
            if !name.starts_with('.') && has_job && !submitted.contains(&name) {
                a.duplicates
                    .push(format!("attempt folder {name} unknown to the journal"));
            }
        }
    }
    a
}

/// Tiny deterministic PRNG for kill times (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// Journal-only audit (simulations have no payload): attempts submitted and duplicates.
pub fn audit_journal(dir: &Path) -> Audit {
    let journal = std::fs::read_to_string(dir.join("controller/journal.jsonl")).expect("journal");
    let mut a = Audit::default();
    let mut seen = HashSet::new();
    for line in journal.lines() {
        let v: Value = serde_json::from_str(line).expect("journal line");
        if v["entry"]["t"] == "submitted" {
            a.attempts += 1;
            let id = v["entry"]["attempt_id"].as_str().unwrap().to_string();
            if !seen.insert(id.clone()) {
                a.duplicates.push(id);
            }
        }
    }
    a
}

/// What [`kill_9_trials`] counted.
#[derive(Debug, Default)]
pub struct Trials {
    /// `kill -9`s sent.
    pub kills: usize,
    /// Campaigns run to their end (each in a folder of its own).
    pub campaigns: usize,
    /// Jobs adopted through `find` after a crash, over every campaign.
    pub adopted: usize,
    /// Attempts submitted (journal), over every campaign.
    pub attempts: usize,
}

/// How many kills [`kill_9_trials`] sends, when, and how long they may take in all.
pub struct KillPlan {
    /// `kill -9`s to send.
    pub trials: usize,
    /// A kill comes 50 ms to `50 + window_ms` ms after a start.
    pub window_ms: u64,
    /// The trials fail once they take longer.
    pub limit: Duration,
}

/// Crash trials of a controller: runs `start(dir)` in fresh folders `root/cN`, killing it
/// (SIGKILL) at a random moment 50 ms to `50 + window_ms` ms after each start, until `trials`
/// kills were sent. Each campaign is started again until one run ends; it must end with
/// success, give `want` as its result and have no duplicate job and no lost result (its
/// [`audit`]); `check(n, dir)` then adds the test's own checks. Fails once the trials take
/// longer than `limit`.
pub fn kill_9_trials(
    root: &Path,
    KillPlan {
        trials,
        window_ms,
        limit,
    }: KillPlan,
    rng: &mut Rng,
    want: &Value,
    mut start: impl FnMut(&Path) -> Child,
    mut check: impl FnMut(usize, &Path),
) -> Trials {
    let started = Instant::now();
    let mut t = Trials::default();
    while t.kills < trials {
        t.campaigns += 1;
        let n = t.campaigns;
        let dir = root.join(format!("c{n}"));
        // Kill until a run survives to the end.
        loop {
            let mut child = start(&dir);
            let deadline = Instant::now() + Duration::from_millis(50 + rng.below(window_ms));
            let mut finished = None;
            while Instant::now() < deadline {
                if let Some(st) = child.try_wait().unwrap() {
                    finished = Some(st);
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            match finished {
                Some(st) => {
                    assert!(st.success(), "campaign {n} exited with {st}");
                    break;
                }
                None => {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                    t.kills += 1;
                }
            }
            assert!(
                started.elapsed() < limit,
                "crash trials take longer than {limit:?}"
            );
        }
        assert_eq!(
            &result(&dir),
            want,
            "campaign {n}: results differ from the uninterrupted run"
        );
        let a = audit(&dir);
        assert!(
            a.duplicates.is_empty(),
            "campaign {n}: duplicates {:?}",
            a.duplicates
        );
        assert!(
            a.missing.is_empty(),
            "campaign {n}: lost results {:?}",
            a.missing
        );
        t.adopted += a.adopted;
        t.attempts += a.attempts;
        check(n, &dir);
    }
    t
}
