//! The Ray executor against a real Ray cluster (`ray start --head --num-cpus=4 --num-gpus=4`,
//! started by `.ci/run`; the dashboard at `$PUZZLETRON_RAY_ADDRESS`, default
//! `http://127.0.0.1:8265`): the conformance suite, the GPUs Ray assigns (disjoint for
//! concurrent jobs), cancel by campaign tag, and the bad inputs (an address that does not
//! answer, a 401, more GPUs than any node has).
//!
//! Gated by `PUZZLETRON_RAY_TESTS=1` (cfg `puzzletron_ray_tests`, see build.rs).
#![cfg(feature = "ray")]

mod support;
use support::watchdog;

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use puzzletron::executor::{
    AttemptId, AttemptSpec, CommandSpec, Executor, ExecutorError, ExecutorExt, GpuRequest,
    JobState, RayExecutor, TaskTopology, conformance,
};

fn address() -> String {
    std::env::var("PUZZLETRON_RAY_ADDRESS").unwrap_or_else(|_| "http://127.0.0.1:8265".into())
}

fn executor() -> RayExecutor {
    RayExecutor::builder(address())
        .namespace("puzzletron-tests")
        .cancel_timeout(Duration::from_secs(30))
        .kill_grace(Duration::from_secs(2))
        .build()
        .expect("ray executor")
}

fn uniq(tag: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 100_000_000;
    format!("ray{}-{n}-{tag}", std::process::id())
}

#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ray_executor_conforms() {
    let _w = watchdog::Watchdog::start("ray_executor_conforms", Duration::from_secs(400));
    conformance::Conformance::new(|| Box::new(executor()))
        .with_poll_interval(Duration::from_millis(200))
        .with_timeout(Duration::from_secs(90))
        .run_all()
        .await;
}

/// Jobs of one GPU each, more than the cluster's 4 GPUs: every job sees exactly one GPU id
/// in `CUDA_VISIBLE_DEVICES` (set by Ray), and jobs that ran at the same time saw different
/// ones.
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_jobs_see_disjoint_gpus() {
    let _w = watchdog::Watchdog::start(
        "concurrent_jobs_see_disjoint_gpus",
        Duration::from_secs(300),
    );
    let dir = tempfile::tempdir().unwrap();
    let e = executor();
    let mut handles = Vec::new();
    for i in 0..6 {
        let out = dir.path().join(format!("job{i}"));
        let script =
            "s=$(date +%s%N); sleep 4; echo \"$CUDA_VISIBLE_DEVICES $s $(date +%s%N)\" > \"$OUT\"";
        let spec = AttemptSpec::new(
            AttemptId::new(uniq(&format!("gpu{i}"))).unwrap(),
            CommandSpec::new("sh")
                .arg("-c")
                .arg(script)
                .env("OUT", out.to_string_lossy()),
        )
        .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(1)));
        handles.push(e.submit(&spec).await.expect("submit"));
    }
    let st = e
        .wait_terminal(
            &handles,
            Duration::from_millis(200),
            Duration::from_secs(180),
        )
        .await
        .unwrap();
    let mut runs = Vec::new();
    for (i, s) in st.iter().enumerate() {
        assert_eq!(s.state, JobState::Completed, "{s:?}");
        let text = std::fs::read_to_string(dir.path().join(format!("job{i}"))).unwrap();
        let f: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(f.len(), 3, "job {i} wrote {text:?}");
        let gpu: u32 = f[0]
            .parse()
            .unwrap_or_else(|_| panic!("job {i}: one GPU id, got {text:?}"));
        assert!(gpu < 4, "job {i}: GPU {gpu} of a 4-GPU node");
        runs.push((
            gpu,
            f[1].parse::<u128>().unwrap(),
            f[2].parse::<u128>().unwrap(),
        ));
    }
    let mut overlapping = 0;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.1 < b.2 && b.1 < a.2 {
                overlapping += 1;
                assert_ne!(a.0, b.0, "two jobs ran at once on GPU {}: {runs:?}", a.0);
            }
        }
    }
    assert!(overlapping > 0, "no two jobs ran at once: {runs:?}");
}

/// `cancel_matching` stops the live jobs of this campaign tag only.
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_matching_stops_only_the_campaigns_jobs() {
    let _w = watchdog::Watchdog::start("cancel_matching", Duration::from_secs(200));
    let tag = uniq("camp");
    let mine = RayExecutor::builder(address())
        .campaign_tag(&tag)
        .build()
        .unwrap();
    let other = RayExecutor::builder(address())
        .campaign_tag(format!("{tag}-other"))
        .build()
        .unwrap();
    let sleep = |id: String| {
        AttemptSpec::new(
            AttemptId::new(id).unwrap(),
            CommandSpec::new("sleep").arg("300"),
        )
    };
    let a = mine.submit(&sleep(format!("{tag}.a"))).await.unwrap();
    let b = other.submit(&sleep(format!("{tag}.b"))).await.unwrap();
    let prefix = tag.clone();
    let stopped = mine
        .cancel_matching(&move |id: &str| id.starts_with(&prefix))
        .await
        .unwrap();
    assert_eq!(stopped, vec![format!("{tag}.a")]);
    let st = mine
        .wait_terminal(
            std::slice::from_ref(&a),
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert!(matches!(st[0].state, JobState::Cancelled { .. }), "{st:?}");
    let st = other.poll(std::slice::from_ref(&b)).await.unwrap();
    assert!(
        st[0].state.is_active(),
        "the other campaign's job must run on: {st:?}"
    );
    other.cancel(&b).await.unwrap();
}

/// A dashboard address where nothing listens: a clear, transient error naming
/// `runner.ray.address` within seconds, at preflight and at submit; never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_not_answering_is_a_clear_transient_error() {
    // A port just freed: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = RayExecutor::builder(format!("http://127.0.0.1:{port}"))
        .build()
        .unwrap();
    let t = Instant::now();
    let err = e.preflight().await.unwrap_err();
    assert!(
        matches!(err, ExecutorError::SchedulerUnavailable { .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("runner.ray.address"), "{err}");
    let spec = AttemptSpec::new(
        AttemptId::new(uniq("noanswer")).unwrap(),
        CommandSpec::new("true"),
    );
    let err = e.submit(&spec).await.unwrap_err();
    assert!(err.to_string().contains("runner.ray.address"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    // A poll sees it within one call, and says so (jobs keep running on the cluster).
    let h = puzzletron::executor::JobHandle::new(
        "ray",
        spec.attempt_id.clone(),
        spec.attempt_id.as_str(),
        1,
    );
    let err = e.poll(&[h]).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
}

/// A cluster with token authentication that refuses ours (HTTP 401, as Ray's dashboard
/// answers with `RAY_AUTH_MODE=token`; here a one-file HTTP server): a configuration error
/// naming `runner.ray.token_env` and the variable, not retried, the token never shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_is_a_config_error_naming_the_token_variable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 8192];
            let n = c.read(&mut buf).unwrap_or(0);
            seen2
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let body = "Unauthorized: invalid or missing authentication token";
            let _ = write!(
                c,
                "HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let var = "PUZZLETRON_TEST_RAY_TOKEN_401";
    // SAFETY: set before any thread reads this variable (only this test uses it).
    unsafe { std::env::set_var(var, "tok-abc-123") };
    let e = RayExecutor::builder(format!("http://127.0.0.1:{port}"))
        .token_env(var)
        .build()
        .unwrap();
    let err = e.preflight().await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ExecutorError::Misconfigured { .. }),
        "{err:?}"
    );
    assert!(!err.is_retryable());
    assert!(
        text.contains("runner.ray.token_env") && text.contains(var) && text.contains("401"),
        "{text}"
    );
    assert!(!text.contains("tok-abc-123"), "the token leaked: {text}");
    assert!(
        !format!("{e:?}").contains("tok-abc-123"),
        "the token leaked in Debug"
    );
    let req = seen.lock().unwrap().join("\n");
    assert!(
        req.contains("Authorization: Bearer tok-abc-123")
            || req.contains("authorization: Bearer tok-abc-123"),
        "{req}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "a 401 is not retried");
    // Submit refuses the same way, before posting any job.
    let spec = AttemptSpec::new(
        AttemptId::new(uniq("unauth")).unwrap(),
        CommandSpec::new("true"),
    );
    let err = e.submit(&spec).await.unwrap_err();
    assert!(
        matches!(err, ExecutorError::Misconfigured { .. }),
        "{err:?}"
    );
}

/// More GPUs than any node has: refused at the first submit naming the GPUs and
/// `runner.ray.address` (the job would pend forever), and nothing is submitted.
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_gpus_than_any_node_is_refused_at_submit() {
    let e = executor();
    let cluster = e.preflight().await.unwrap();
    assert_eq!(cluster.max_per_node("GPU"), 4.0, "{cluster:?}");
    let spec = AttemptSpec::new(
        AttemptId::new(uniq("big")).unwrap(),
        CommandSpec::new("true"),
    )
    .with_topology(TaskTopology::single().with_gpus(GpuRequest::PerNode(8)));
    let t = Instant::now();
    let err = e.submit(&spec).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, ExecutorError::Unsatisfiable { .. }),
        "{err:?}"
    );
    assert!(
        text.contains("8 GPU")
            && text.contains("entrypoint_num_gpus")
            && text.contains("runner.ray.address")
            && text.contains("4 GPU"),
        "{text}"
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    assert!(
        e.find(&spec.attempt_id).await.unwrap().is_none(),
        "nothing may be submitted"
    );
    // An autoscaling cluster takes it: it pends until a node fits (here: never). Ray cannot
    // stop a job that waits for resources (it would start it later), so the cancel is
    // unconfirmed and retryable, never a false success.
    let auto = RayExecutor::builder(address())
        .autoscaler(true)
        .cancel_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let h = auto.submit(&spec).await.unwrap();
    let st = auto.poll(std::slice::from_ref(&h)).await.unwrap();
    assert_eq!(st[0].state, JobState::Pending, "{st:?}");
    assert!(
        st[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("waiting for resources")),
        "{st:?}"
    );
    match auto.cancel(&h).await {
        Err(e @ ExecutorError::CancelUnconfirmed { .. }) => assert!(e.is_retryable()),
        other => panic!("expected CancelUnconfirmed for a job Ray keeps pending: {other:?}"),
    }
}

/// The job's logs reach the spec's log file, and a job that ran past its walltime is a
/// `Timeout` from a fresh executor too (the walltime is in the job's metadata).
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walltime_and_logs_read_back_from_a_fresh_executor() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("logs/w.log");
    let spec = AttemptSpec::new(
        AttemptId::new(uniq("wall")).unwrap(),
        CommandSpec::new("sh")
            .arg("-c")
            .arg("echo started-$PUZZLETRON_ATTEMPT_ID; sleep 60"),
    )
    .with_walltime(Duration::from_secs(2))
    .with_log_path(&log);
    let h = executor().submit(&spec).await.unwrap();
    let fresh = executor();
    let found = fresh.find(&spec.attempt_id).await.unwrap().expect("found");
    let st = fresh
        .wait_terminal(
            &[found],
            Duration::from_millis(200),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::Timeout, "{st:?}");
    assert_eq!(st[0].log_path.as_deref(), Some(log.as_path()));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("started-{}", spec.attempt_id)),
        "{text}"
    );
    let _ = h;
    assert!(Path::new(&log).exists());
}

/// A driver that died of Ray's memory monitor (its task was killed and `ray.get` raised
/// `OutOfMemoryError`, which Ray's message carries with the job's last logs) is an OOM, not a
/// plain failure; the same exit without that text is `Failed` with its exit code.
#[cfg_attr(
    not(puzzletron_ray_tests),
    ignore = "needs a Ray cluster (`ray start --head`, see CONTRIBUTING.md): set PUZZLETRON_RAY_TESTS=1"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_monitor_kill_is_an_oom() {
    let e = executor();
    let oom = AttemptSpec::new(
        AttemptId::new(uniq("oom")).unwrap(),
        CommandSpec::new("sh").arg("-c").arg(
            "echo 'ray.exceptions.OutOfMemoryError: Task was killed due to the node running low \
             on memory.' >&2; exit 1",
        ),
    );
    let plain = AttemptSpec::new(
        AttemptId::new(uniq("plain1")).unwrap(),
        CommandSpec::new("sh")
            .arg("-c")
            .arg("echo boom >&2; exit 1"),
    );
    let hs = vec![
        e.submit(&oom).await.unwrap(),
        e.submit(&plain).await.unwrap(),
    ];
    let st = e
        .wait_terminal(&hs, Duration::from_millis(200), Duration::from_secs(90))
        .await
        .unwrap();
    assert_eq!(st[0].state, JobState::OutOfMemory, "{:?}", st[0]);
    assert_eq!(
        (&st[1].state, st[1].exit_code),
        (&JobState::Failed, Some(1)),
        "{:?}",
        st[1]
    );
}
