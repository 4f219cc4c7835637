//! SlurmExecutor against fake `sbatch`/`squeue`/`sacct`/`scancel` scripts with scripted output:
//! the submission and status cases of `docs/evidence.md` (C04, C14–C19) end to
//! end, deterministically and without a cluster.
#![cfg(feature = "slurm")]

use std::path::PathBuf;
use std::time::Duration;

use puzzletron::executor::*;

/// A folder of fake Slurm commands. Each command logs its argv to `calls.log`, then:
/// if `<cmd>.fail` holds a number N > 0, decrements it, prints `<cmd>.err` to stderr and exits
/// 1; otherwise prints `<cmd>.out`, prints `<cmd>.stderr` (if any) to stderr, and exits with
/// `<cmd>.rc` (default 0). With `squeue.byname` present, `squeue --name=X` prints
/// `squeue.name.X` (or nothing). `sbatch` with `sbatch.next` holding N prints N and stores N+1 (a
/// new job id per call). `sbatch` with `sbatch.ambiguous` present appends that file to
/// `squeue.out` (the job appears) and then fails like `.fail`.
struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for cmd in ["sbatch", "squeue", "sacct", "scancel", "scontrol"] {
            let d = dir.path().display();
            let script = format!(
                r#"#!/bin/sh
d='{d}'
echo "{cmd} $*" >> "$d/calls.log"
if [ "{cmd}" = sbatch ] && [ -f "$d/sbatch.ambiguous" ]; then
  cat "$d/sbatch.ambiguous" >> "$d/squeue.out"; rm -f "$d/sbatch.ambiguous"
  cat "$d/sbatch.err" >&2; exit 1
fi
if [ "{cmd}" = squeue ] && [ -f "$d/squeue.byname" ]; then
  for a in "$@"; do case "$a" in --name=*) f="$d/squeue.name.${{a#--name=}}"; [ -f "$f" ] && cat "$f"; exit 0;; esac; done
fi
if [ "{cmd}" = sbatch ] && [ -f "$d/sbatch.failafter" ]; then
  n=$(cat "$d/sbatch.failafter")
  if [ "$n" -le 0 ]; then cat "$d/sbatch.err" >&2; exit 1; fi
  echo $((n - 1)) > "$d/sbatch.failafter"
fi
if [ "{cmd}" = sbatch ] && [ -f "$d/sbatch.next" ]; then
  n=$(cat "$d/sbatch.next"); echo $((n + 1)) > "$d/sbatch.next"; echo "$n"; exit 0
fi
if [ -f "$d/{cmd}.fail" ]; then
  n=$(cat "$d/{cmd}.fail")
  if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$d/{cmd}.fail"; cat "$d/{cmd}.err" >&2; exit 1; fi
fi
[ -f "$d/{cmd}.out" ] && cat "$d/{cmd}.out"
[ -f "$d/{cmd}.stderr" ] && cat "$d/{cmd}.stderr" >&2
exit $(cat "$d/{cmd}.rc" 2>/dev/null || echo 0)
"#
            );
            let p = dir.path().join(cmd);
            std::fs::write(&p, script).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Fake { dir }
    }

    fn set(&self, file: &str, content: &str) {
        std::fs::write(self.dir.path().join(file), content).unwrap();
    }

    fn calls(&self, cmd: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(cmd))
            .map(String::from)
            .collect()
    }

    fn executor(&self) -> SlurmExecutor {
        SlurmExecutor::builder(self.dir.path().join("logs"))
            .bin_dir(self.dir.path())
            .poll_policy(
                PollPolicy::default()
                    .with_intervals(Duration::ZERO, Duration::ZERO)
                    .with_missing_grace(Duration::from_secs(300)),
            )
            .retry_policy(
                SchedulerRetry::default()
                    .with_max_tries(4)
                    .with_base_delay(Duration::from_millis(1))
                    .with_max_delay(Duration::from_millis(5)),
            )
            .build()
            .unwrap()
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

fn spec(name: &str) -> AttemptSpec {
    AttemptSpec::new(AttemptId::new(name).unwrap(), CommandSpec::new("true"))
}

/// Slurm's local time now (`Submit` of a job we just submitted).
fn slurm_now() -> String {
    let out = std::process::Command::new("date")
        .arg("+%Y-%m-%dT%H:%M:%S")
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// One allocation row and its batch step in the poll's sacct form
/// (`JobID|State|ExitCode|NodeList|Start|End|Submit|JobName`), submitted now, named `name`.
fn acct(id: &str, state: &str, code: &str, name: &str) -> String {
    let now = slurm_now();
    format!("{id}|{state}|{code}|n1|||{now}|{name}\n{id}.batch|{state}|{code}|||||batch\n")
}

async fn poll1(e: &SlurmExecutor, h: &JobHandle) -> JobStatus {
    e.poll(std::slice::from_ref(h)).await.unwrap().remove(0)
}

#[tokio::test]
async fn c01_c03_submit_forms_and_warnings() {
    let f = Fake::new();
    f.set(
        "sbatch.out",
        "INFO: jobs over 128 GB need a larger node\n4711;clusterA\n",
    );
    f.set(
        "sbatch.stderr",
        "sbatch: no partition specified, using default partition p1\n",
    );
    let e = f.executor();
    let h = e.submit(&spec("camp-7f3a.t12.a1")).await.unwrap();
    assert_eq!(
        (h.job_id.as_str(), h.cluster.as_deref()),
        ("4711", Some("clusterA"))
    );
    assert!(
        e.warnings()[0].contains("no partition specified"),
        "{:?}",
        e.warnings()
    );
    // C01: later calls for it pass -M clusterA.
    f.set("squeue.out", "4711|RUNNING|None|n1\n");
    assert_eq!(poll1(&e, &h).await.state, JobState::Running);
    let q = f.calls("squeue");
    assert!(
        q[0].contains("-M clusterA") && q[0].contains("-j 4711"),
        "{q:?}"
    );
    // The rendered script: job name = attempt id, quoted command.
    let script = std::fs::read_to_string(f.path().join("logs/camp-7f3a.t12.a1.sbatch")).unwrap();
    assert!(
        script.contains("#SBATCH --job-name=camp-7f3a.t12.a1\n"),
        "{script}"
    );
    assert!(script.contains("\nexec true\n"), "{script}");
}

#[tokio::test]
async fn c04_ambiguous_submit_is_adopted_not_duplicated() {
    let f = Fake::new();
    f.set("sbatch.ambiguous", "4711|PENDING\n");
    f.set(
        "sbatch.err",
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n",
    );
    f.set("sbatch.out", "9999\n"); // what a second (duplicate) submission would get
    let e = f.executor();
    let h = e.submit(&spec("camp-7f3a.t12.a1")).await.unwrap();
    assert_eq!(h.job_id, "4711", "adopted the job found by name");
    assert_eq!(f.calls("sbatch").len(), 1, "no second sbatch");
    let lookups = f.calls("squeue");
    assert!(
        lookups[0].contains("--name=camp-7f3a.t12.a1"),
        "{lookups:?}"
    );
    assert!(e.warnings().iter().any(|w| w.contains("adopted")));
}

#[tokio::test]
async fn c05_submit_error_classes() {
    let f = Fake::new();
    f.set("sbatch.rc", "1");
    let e = f.executor();
    f.set(
        "sbatch.stderr",
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n",
    );
    let err = e.submit(&spec("a1")).await.unwrap_err();
    assert!(
        matches!(err, ExecutorError::SubmitRejected { .. }) && !err.is_retryable(),
        "{err:?}"
    );
    assert!(err.to_string().contains("Invalid account"), "{err}");
    assert_eq!(f.calls("sbatch").len(), 1, "fatal: no retry");
    f.set(
        "sbatch.stderr",
        "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy\n",
    );
    let err = e.submit(&spec("a2")).await.unwrap_err();
    assert!(
        matches!(err, ExecutorError::SubmitThrottled { .. }) && err.is_retryable(),
        "{err:?}"
    );
    // Transient every time: looked up before each retry, then SubmitUnknown (retryable).
    f.set(
        "sbatch.stderr",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\n",
    );
    let before = f.calls("sbatch").len();
    let err = e.submit(&spec("a3")).await.unwrap_err();
    assert!(
        matches!(err, ExecutorError::SubmitUnknown { tries: 4, .. }),
        "{err:?}"
    );
    assert_eq!(f.calls("sbatch").len() - before, 4);
    let lookups = f
        .calls("squeue")
        .iter()
        .filter(|c| c.contains("--name=a3"))
        .count();
    assert_eq!(lookups, 4, "a lookup by name after every failed try");
}

#[tokio::test]
async fn c14_c15_c16_c17_status_lifecycle() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("job.a1")).await.unwrap();
    // C14: nothing in squeue or sacct yet -> still pending, not lost, no resubmit.
    f.set("squeue.out", "");
    f.set("sacct.out", "");
    let s = poll1(&e, &h).await;
    assert_eq!(s.state, JobState::Pending, "{s:?}");
    f.set("squeue.out", "4711|PENDING|Priority|\n");
    let s = poll1(&e, &h).await;
    assert_eq!(
        (s.state.clone(), s.reason.as_deref()),
        (JobState::Pending, Some("Priority"))
    );
    // C16: squeue times out twice; the executor retries, the state does not change.
    f.set("squeue.out", "4711|RUNNING|None|n1\n");
    f.set("squeue.fail", "2");
    f.set(
        "squeue.err",
        "slurm_load_jobs error: Socket timed out on send/recv operation\n",
    );
    let s = poll1(&e, &h).await;
    assert_eq!(
        (s.state.clone(), s.nodes.as_deref()),
        (JobState::Running, Some("n1"))
    );
    // ...and when it keeps failing, poll errs (retryable) without inventing a state.
    f.set("squeue.fail", "10");
    let err = e.poll(std::slice::from_ref(&h)).await.unwrap_err();
    assert!(matches!(err, ExecutorError::SchedulerUnavailable { .. }) && err.is_retryable());
    f.set("squeue.fail", "0");
    // C15: purged from squeue (exit 1, Invalid job id) -> resolved through sacct.
    f.set("squeue.out", "");
    f.set(
        "squeue.stderr",
        "slurm_load_jobs error: Invalid job id specified\n",
    );
    f.set("squeue.rc", "1");
    f.set("sacct.out", &acct("4711", "FAILED", "3:0", "job.a1"));
    let s = poll1(&e, &h).await;
    assert_eq!(
        (s.state.clone(), s.exit_code),
        (JobState::Failed, Some(3)),
        "{s:?}"
    );
    // C17: sacct is bounded by -S (submit time minus a margin) and -j.
    let sacct = f.calls("sacct");
    let last = sacct.last().unwrap();
    assert!(
        last.contains(" -S 20") && last.contains("-j 4711"),
        "{last}"
    );
    // Final: no more scheduler calls for it.
    let n = f.calls("squeue").len() + f.calls("sacct").len();
    assert_eq!(poll1(&e, &h).await.state, JobState::Failed);
    assert_eq!(f.calls("squeue").len() + f.calls("sacct").len(), n);
}

#[tokio::test]
async fn c18_accounting_disabled_falls_back_to_squeue() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("job.a1")).await.unwrap();
    f.set("squeue.out", "4711|RUNNING|None|n1\n");
    assert_eq!(poll1(&e, &h).await.state, JobState::Running);
    f.set("squeue.out", "4711|COMPLETED|None|n1\n");
    f.set("sacct.rc", "1");
    f.set(
        "sacct.stderr",
        "sacct: error: Slurm accounting storage is disabled\n",
    );
    let s = poll1(&e, &h).await;
    assert_eq!(s.state, JobState::Completed, "{s:?}");
    assert!(s.reason.unwrap().contains("accounting disabled"));
    // Detected once: a second job never asks sacct again.
    f.set("sbatch.out", "4712\n");
    let h2 = e.submit(&spec("job.a2")).await.unwrap();
    f.set("squeue.out", "4712|RUNNING|None|n1\n");
    poll1(&e, &h2).await;
    let sacct_calls = f.calls("sacct").len();
    f.set("squeue.out", "");
    f.set("squeue.rc", "0");
    let s = poll1(&e, &h2).await;
    assert_eq!(
        s.state,
        JobState::Failed,
        "left squeue without accounting: {s:?}"
    );
    assert_eq!(f.calls("sacct").len(), sacct_calls);
}

/// N02: slurmdbd down while squeue works. A job that left squeue is "finished, accounting
/// pending" (never Failed or Lost, even past the missing grace), the running one is Running
/// from squeue, the outage is warned once, a lookup by name is a retryable error (never "not
/// found", which would resubmit), and the job settles from sacct when slurmdbd is back.
#[tokio::test]
async fn n02_slurmdbd_down_leaves_finished_jobs_accounting_pending() {
    let f = Fake::new();
    let e = SlurmExecutor::builder(f.path().join("logs"))
        .bin_dir(f.path())
        .poll_policy(
            PollPolicy::default()
                .with_intervals(Duration::ZERO, Duration::ZERO)
                .with_missing_grace(Duration::ZERO),
        )
        .retry_policy(
            SchedulerRetry::default()
                .with_max_tries(4)
                .with_base_delay(Duration::from_millis(1))
                .with_max_delay(Duration::from_millis(5)),
        )
        .build()
        .unwrap();
    f.set("sbatch.out", "4711\n");
    let h1 = e.submit(&spec("job.a1")).await.unwrap();
    f.set("sbatch.out", "4712\n");
    let h2 = e.submit(&spec("job.a2")).await.unwrap();
    let both = [h1.clone(), h2.clone()];
    f.set("squeue.out", "4711|RUNNING|None|n1\n4712|RUNNING|None|n2\n");
    let s = e.poll(&both).await.unwrap();
    assert_eq!(
        (&s[0].state, &s[1].state),
        (&JobState::Running, &JobState::Running)
    );
    // 4711 leaves squeue; slurmdbd refuses.
    f.set("squeue.out", "4712|RUNNING|None|n2\n");
    f.set("sacct.rc", "1");
    f.set(
        "sacct.stderr",
        "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:dbhost:6819: Connection refused\nsacct: error: Problem talking to the database: Connection refused\n",
    );
    for _ in 0..3 {
        let s = e.poll(&both).await.unwrap();
        assert_eq!(
            s[0].state,
            JobState::Running,
            "last known state kept: {:?}",
            s[0]
        );
        let why = s[0].reason.as_deref().unwrap_or("");
        assert!(
            why.contains("accounting pending") && why.contains("Connection refused"),
            "{why}"
        );
        assert_eq!(s[1].state, JobState::Running, "{:?}", s[1]);
        std::thread::sleep(Duration::from_millis(5));
    }
    let warned: Vec<_> = e
        .warnings()
        .into_iter()
        .filter(|w| w.contains("slurmdbd unreachable"))
        .collect();
    assert_eq!(warned.len(), 1, "warned once: {warned:?}");
    // Terminal in squeue (COMPLETING leaves as COMPLETED) but no accounting: still pending.
    f.set("squeue.out", "4712|COMPLETED|None|n2\n");
    let s = e.poll(&both).await.unwrap();
    assert!(!s[1].state.is_terminal(), "{:?}", s[1]);
    assert!(
        s[1].reason
            .as_deref()
            .unwrap_or("")
            .contains("accounting pending")
    );
    // A lookup by name cannot say "not found" while slurmdbd is down.
    f.set("squeue.out", "");
    let err = e
        .find(&AttemptId::new("job.a3").unwrap())
        .await
        .unwrap_err();
    assert!(err.is_retryable(), "{err}");
    // slurmdbd is back: both settle from sacct, with their exit codes.
    f.set("sacct.rc", "0");
    f.set("sacct.stderr", "");
    f.set(
        "sacct.out",
        &format!(
            "{}{}",
            acct("4711", "COMPLETED", "0:0", "job.a1"),
            acct("4712", "FAILED", "2:0", "job.a2")
        ),
    );
    let s = e.poll(&both).await.unwrap();
    assert_eq!(
        (&s[0].state, s[0].exit_code, &s[1].state, s[1].exit_code),
        (&JobState::Completed, Some(0), &JobState::Failed, Some(2)),
        "{s:?}"
    );
    assert!(
        e.warnings()
            .iter()
            .any(|w| w.contains("slurmdbd answers again"))
    );
    assert_eq!(f.calls("sbatch").len(), 2, "nothing resubmitted");
}

/// N01: 2500 tasks with `%40` on a cluster whose `MaxArraySize` is 1001 (from `scontrol show
/// config`): three arrays `0-1000`, `0-1000`, `0-497`, no index at or above the cap, the
/// throttle split so at most 40 run overall, task `i` of chunk `c` exports index
/// `1001*c + i`, every chunk named so it can be found again, and statuses mapped back from
/// each chunk's `JobID_task` rows.
#[tokio::test]
async fn n01_array_above_max_array_size_is_split_into_chunks() {
    let f = Fake::new();
    f.set(
        "scontrol.out",
        "Configuration data as of 2026-12-01T10:00:00\nMaxArraySize            = 1001\nMaxJobCount             = 10000\n",
    );
    f.set("sbatch.next", "4801");
    let e = f.executor();
    let arr = ArraySpec::new(spec("sweep.a1"), 2500).with_max_concurrent(Some(40));
    let hs = e.submit_array(&arr).await.unwrap();
    assert_eq!(hs.len(), 2500);
    let logs = f.path().join("logs");
    let mut ranges = Vec::new();
    for (name, offset) in [
        ("sweep.a1", 0),
        ("sweep.a1.c1", 1001),
        ("sweep.a1.c2", 2002),
    ] {
        let script = std::fs::read_to_string(logs.join(format!("{name}.sbatch"))).unwrap();
        let array = script
            .lines()
            .find_map(|l| l.strip_prefix("#SBATCH --array="))
            .unwrap()
            .to_string();
        assert!(
            script.contains(&format!("#SBATCH --job-name={name}\n")),
            "{script}"
        );
        let index = if offset == 0 {
            "export PUZZLETRON_ARRAY_INDEX=\"$SLURM_ARRAY_TASK_ID\"".to_string()
        } else {
            format!("export PUZZLETRON_ARRAY_INDEX=\"$((SLURM_ARRAY_TASK_ID + {offset}))\"")
        };
        assert!(script.contains(&index), "{script}");
        ranges.push(array);
    }
    assert_eq!(ranges, ["0-1000%13", "0-1000%13", "0-497%13"]);
    assert_eq!(f.calls("sbatch").len(), 3);
    // Handles: global attempt ids, chunk job ids, chunk-local task indices.
    let h = |i: usize| {
        (
            hs[i].attempt_id.to_string(),
            hs[i].job_id.clone(),
            hs[i].array_task,
        )
    };
    assert_eq!(h(0), ("sweep.a1_0".into(), "4801".into(), Some(0)));
    assert_eq!(h(1000), ("sweep.a1_1000".into(), "4801".into(), Some(1000)));
    assert_eq!(h(1001), ("sweep.a1_1001".into(), "4802".into(), Some(0)));
    assert_eq!(h(2499), ("sweep.a1_2499".into(), "4803".into(), Some(497)));
    assert!(hs.iter().all(|h| h.array_task.unwrap() < 1001));
    // Status of global task 1092 = task 91 of the second chunk (`4802_91`).
    let now = slurm_now();
    f.set("squeue.out", "");
    f.set(
        "sacct.out",
        &format!(
            "4802_91|COMPLETED|0:0|n1|||{now}|sweep.a1.c1\n4802_91.batch|COMPLETED|0:0|||||batch\n4801_91|FAILED|1:0|n1|||{now}|sweep.a1\n4801_91.batch|FAILED|1:0|||||batch\n"
        ),
    );
    let s = e.poll(&[hs[1092].clone(), hs[91].clone()]).await.unwrap();
    assert_eq!(
        (&s[0].state, s[0].exit_code),
        (&JobState::Completed, Some(0)),
        "{s:?}"
    );
    assert_eq!(
        (&s[1].state, s[1].exit_code),
        (&JobState::Failed, Some(1)),
        "{s:?}"
    );
    // find() of a task in the third chunk looks for that chunk's job by its name.
    f.set("sacct.out", "");
    f.set("squeue.byname", "");
    f.set("squeue.name.sweep.a1.c2", "4803|RUNNING\n");
    let found = e
        .find(&AttemptId::new("sweep.a1_2100").unwrap())
        .await
        .unwrap()
        .expect("found");
    assert_eq!(
        (found.job_id.as_str(), found.array_task),
        ("4803", Some(98))
    );
    assert!(
        f.calls("squeue")
            .last()
            .unwrap()
            .contains("--name=sweep.a1.c2"),
        "{:?}",
        f.calls("squeue")
    );
    assert!(e.warnings().iter().any(|w| w.contains("MaxArraySize=1001")));
    // An array within the cap is one submission, unchanged.
    let one = e
        .submit_array(&ArraySpec::new(spec("small.a1"), 1001).with_max_concurrent(Some(40)))
        .await
        .unwrap();
    assert_eq!(one.len(), 1001);
    let script = std::fs::read_to_string(logs.join("small.a1.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-1000%40\n"), "{script}");
}

/// N01: a chunk that Slurm refuses is a configuration error naming the chunk and the ones
/// already submitted, which are cancelled (half an array is no array).
#[tokio::test]
async fn n01_refused_chunk_cancels_the_submitted_ones() {
    let f = Fake::new();
    f.set("scontrol.out", "MaxArraySize = 4\n");
    f.set("sbatch.next", "4901");
    // The first sbatch (chunk 0) is accepted, every later one refused.
    f.set("sbatch.failafter", "1");
    f.set(
        "sbatch.err",
        "sbatch: error: Batch job submission failed: Invalid job array specification\n",
    );
    let e = f.executor();
    let err = e
        .submit_array(&ArraySpec::new(spec("big.a1"), 6))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("chunk 1 (tasks 4-5) was refused")
            && msg.contains("Invalid job array specification")
            && msg.contains("now cancelled: 4901"),
        "{msg}"
    );
    assert!(!err.is_retryable());
    assert!(
        f.calls("scancel").iter().any(|c| c == "scancel 4901"),
        "{:?}",
        f.calls("scancel")
    );
}

#[tokio::test]
async fn c19_500_array_tasks_one_squeue_one_sacct_per_tick() {
    let f = Fake::new();
    f.set("sbatch.out", "5000\n");
    let e = f.executor();
    let hs = e
        .submit_array(&ArraySpec::new(spec("big"), 500).with_max_concurrent(Some(50)))
        .await
        .unwrap();
    assert_eq!(hs.len(), 500);
    let script = std::fs::read_to_string(f.path().join("logs/big.sbatch")).unwrap();
    assert!(script.contains("#SBATCH --array=0-499%50\n"), "{script}");
    // Tick 1: 50 running, the rest pending in one range row (C11).
    let mut out = String::new();
    for t in 0..50 {
        out.push_str(&format!("5000_{t}|RUNNING|None|n1\n"));
    }
    out.push_str("5000_[50-499%50]|PENDING|JobArrayTaskLimit|\n");
    f.set("squeue.out", &out);
    let st = e.poll(&hs).await.unwrap();
    assert_eq!(
        st.iter().filter(|s| s.state == JobState::Running).count(),
        50
    );
    assert_eq!(st[499].state, JobState::Pending);
    assert!(
        st[499]
            .reason
            .as_deref()
            .unwrap()
            .contains("JobArrayTaskLimit")
    );
    assert_eq!((f.calls("squeue").len(), f.calls("sacct").len()), (1, 0));
    // Tick 2: all gone from squeue; sacct has 499 COMPLETED and one FAILED.
    f.set("squeue.out", "");
    let mut acct = String::new();
    for t in 0..500 {
        let (state, code) = if t == 7 {
            ("FAILED", "2:0")
        } else {
            ("COMPLETED", "0:0")
        };
        acct.push_str(&self::acct(&format!("5000_{t}"), state, code, "big"));
    }
    f.set("sacct.out", &acct);
    let st = e.poll(&hs).await.unwrap();
    assert_eq!((f.calls("squeue").len(), f.calls("sacct").len()), (2, 1));
    assert_eq!(
        st.iter().filter(|s| s.state == JobState::Completed).count(),
        499
    );
    assert_eq!(
        (st[7].state.clone(), st[7].exit_code),
        (JobState::Failed, Some(2))
    );
    assert_eq!(st[7].attempt_id.as_str(), "big_7");
    // One id on the command line for 500 tasks.
    assert!(
        f.calls("sacct")[0].contains("-j 5000"),
        "{:?}",
        f.calls("sacct")
    );
    let s = e.stats();
    assert_eq!((s.poll_cycles, s.squeue_calls, s.sacct_calls), (2, 2, 1));
}

#[tokio::test]
async fn backoff_and_minimum_interval_limit_calls() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    f.set("squeue.out", "4711|RUNNING|None|n1\n");
    let e = SlurmExecutor::builder(f.path().join("logs"))
        .bin_dir(f.path())
        .poll_policy(
            PollPolicy::default()
                .with_intervals(Duration::from_millis(200), Duration::from_secs(10))
                .with_missing_grace(Duration::from_secs(300)),
        )
        .build()
        .unwrap();
    let h = e.submit(&spec("job.a1")).await.unwrap();
    // 40 polls in ~0.8 s: the interval starts at 200 ms and doubles while nothing changes.
    for _ in 0..40 {
        assert!(poll1(&e, &h).await.state.is_active());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let n = f.calls("squeue").len();
    // 0, 0.2, 0.6, 1.4, 3.0 s: at most 5 even when a loaded machine stretches the loop.
    assert!((2..=5).contains(&n), "{n} squeue calls for 40 polls");
}

/// The executor of the interval tests: 1 s .. 60 s, so that a loaded machine's late wake-up
/// (under 0.8 s) does not reach the next doubled interval.
fn slow_poller(f: &Fake) -> SlurmExecutor {
    SlurmExecutor::builder(f.path().join("logs"))
        .bin_dir(f.path())
        .poll_policy(
            PollPolicy::default()
                .with_intervals(Duration::from_secs(1), Duration::from_secs(60))
                .with_missing_grace(Duration::from_secs(300)),
        )
        .build()
        .unwrap()
}

/// Issue 32: the cycle right after a submit sees the job still pending, which is no sign that
/// nothing will change: the next cycle comes after the shortest interval, not a doubled one
/// (trivial jobs were seen done 2 s late). Later unchanged cycles back off as before.
#[tokio::test]
async fn no_backoff_right_after_a_submit() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    f.set("squeue.out", "4711|PENDING|Priority|\n");
    let e = slow_poller(&f);
    let h = e.submit(&spec("job.a1")).await.unwrap();
    assert_eq!(poll1(&e, &h).await.state, JobState::Pending);
    assert_eq!(f.calls("squeue").len(), 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    poll1(&e, &h).await;
    assert_eq!(
        f.calls("squeue").len(),
        2,
        "the interval doubled after a submit"
    );
    // Nothing changed in a cycle that was not the first: 2 s now.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    poll1(&e, &h).await;
    assert_eq!(
        f.calls("squeue").len(),
        2,
        "no backoff while nothing changes"
    );
}

/// Issue 32: a job that squeue shows finished (terminal there, or gone from it after it was
/// seen) while sacct has no record yet is about to settle: the poll keeps its shortest
/// interval until the record comes, then reports it.
#[tokio::test]
async fn no_backoff_while_a_finished_job_waits_for_accounting() {
    for finished in ["4711|COMPLETED|None|n1\n", ""] {
        let f = Fake::new();
        f.set("sbatch.out", "4711\n");
        f.set("squeue.out", "4711|RUNNING|None|n1\n");
        let e = slow_poller(&f);
        let h = e.submit(&spec("job.a1")).await.unwrap();
        assert_eq!(poll1(&e, &h).await.state, JobState::Running);
        // Finished by squeue; slurmdbd behind: no record yet, twice.
        f.set("squeue.out", finished);
        for cycle in 2..=3 {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            assert_eq!(poll1(&e, &h).await.state, JobState::Running);
            assert_eq!(
                (f.calls("squeue").len(), f.calls("sacct").len()),
                (cycle, cycle - 1),
                "squeue shows {finished:?}: the poll backed off while the job settles"
            );
        }
        f.set("sacct.out", &acct("4711", "COMPLETED", "0:0", "job.a1"));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let s = poll1(&e, &h).await;
        assert_eq!((s.state, s.exit_code), (JobState::Completed, Some(0)));
        assert_eq!(f.calls("squeue").len(), 4);
    }
}

#[tokio::test]
async fn scancel_is_confirmed() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("job.a1")).await.unwrap();
    f.set("squeue.out", "");
    f.set(
        "sacct.out",
        &acct("4711", "CANCELLED by 0", "0:15", "job.a1"),
    );
    e.cancel(&h).await.unwrap();
    assert_eq!(f.calls("scancel"), vec!["scancel 4711".to_string()]);
    assert_eq!(
        poll1(&e, &h).await.state,
        JobState::Cancelled { by_uid: Some(0) }
    );
    // Already terminal: no second scancel.
    e.cancel(&h).await.unwrap();
    assert_eq!(f.calls("scancel").len(), 1);
}

/// Issue 9, "our job, not a namesake": a recycled job id's month-old row with another job
/// name is never taken as our job's completion; our own row wins over it; the namesake is
/// logged once.
#[tokio::test]
async fn recycled_job_id_row_is_not_our_job() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("camp.s.0.a1")).await.unwrap();
    // Gone from squeue; sacct only has last month's job 4711 of someone else.
    f.set("squeue.out", "");
    f.set(
        "sacct.out",
        "4711|COMPLETED|0:0|n1|||2026-01-01T00:00:00|other.job\n4711.batch|COMPLETED|0:0|||||batch\n",
    );
    let s = poll1(&e, &h).await;
    assert_eq!(
        s.state,
        JobState::Pending,
        "a namesake was taken as ours: {s:?}"
    );
    // Same name but submitted a month before us: still not ours.
    f.set(
        "sacct.out",
        "4711|COMPLETED|0:0|n1|||2026-01-01T00:00:00|camp.s.0.a1\n",
    );
    assert_eq!(poll1(&e, &h).await.state, JobState::Pending);
    // Our row (now, our name) after the old one: ours, with our steps only.
    let mut out = String::from(
        "4711|COMPLETED|0:0|n1|||2026-01-01T00:00:00|other.job\n4711.0|CANCELLED|0:10|||||x\n",
    );
    out.push_str(&acct("4711", "FAILED", "3:0", "camp.s.0.a1"));
    f.set("sacct.out", &out);
    let s = poll1(&e, &h).await;
    assert_eq!(
        (s.state.clone(), s.exit_code),
        (JobState::Failed, Some(3)),
        "{s:?}"
    );
    assert_eq!(
        s.steps.iter().map(|x| x.name.as_str()).collect::<Vec<_>>(),
        ["batch"],
        "the namesake's step 0 leaked into our status"
    );
    let ignored: Vec<String> = e
        .warnings()
        .into_iter()
        .filter(|w| w.contains("not our job"))
        .collect();
    assert_eq!(
        ignored.len(),
        2,
        "each namesake row logged once: {ignored:?}"
    );
    // The poll asks sacct for the submit time and the job name, the name last.
    let call = f.calls("sacct").last().unwrap().clone();
    assert!(
        call.contains("JobID,State,ExitCode,NodeList,Start,End,Submit,JobName"),
        "{call}"
    );
}

/// Issue 9, "success needs proof" at the executor: steps come with the status, so a failed
/// `srun` step under a COMPLETED allocation is visible to the controller.
#[tokio::test]
async fn steps_are_reported_with_the_allocation() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("camp.s.0.a1")).await.unwrap();
    f.set("squeue.out", "");
    let now = slurm_now();
    f.set(
        "sacct.out",
        &format!(
            "4711|COMPLETED|0:0|n1|||{now}|camp.s.0.a1\n4711.batch|COMPLETED|0:0|||||batch\n4711.extern|COMPLETED|0:0|||||extern\n4711.0|CANCELLED|0:10|||||python\n"
        ),
    );
    let s = poll1(&e, &h).await;
    assert_eq!(s.state, JobState::Completed);
    let step0 = s.steps.iter().find(|x| x.name == "0").expect("step 0");
    assert_eq!(
        (step0.state.clone(), step0.signal, step0.is_clean()),
        (JobState::Cancelled { by_uid: None }, Some(10), false)
    );
    assert_eq!(step0.to_string(), "step 0 CANCELLED by signal 10");
}

/// Bad input: a truncated sacct line is an error naming the command, the line and what was
/// expected, never a guess at success.
#[tokio::test]
async fn truncated_sacct_line_is_an_error_naming_it() {
    let f = Fake::new();
    f.set("sbatch.out", "4711\n");
    let e = f.executor();
    let h = e.submit(&spec("camp.s.0.a1")).await.unwrap();
    f.set("squeue.out", "");
    f.set("sacct.out", "4711|COMPLETED|0:0|n1\n");
    let err = e.poll(std::slice::from_ref(&h)).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ExecutorError::Parse { .. }), "{err:?}");
    for want in [
        "sacct",
        "line 1",
        "4 fields, expected at least 8",
        "4711|COMPLETED|0:0|n1",
    ] {
        assert!(msg.contains(want), "`{want}` missing in: {msg}");
    }
}
