//! MockExecutor: scripted timelines, submit errors, cancels, call records, conformance.

use std::time::Duration;

use puzzletron::executor::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn id(s: &str) -> AttemptId {
    AttemptId::new(s).expect("valid id")
}

fn spec(s: &str) -> AttemptSpec {
    AttemptSpec::new(id(s), CommandSpec::new("train"))
}

#[test]
fn timeline_follows_virtual_clock() {
    rt().block_on(async {
        let mock = MockExecutor::new();
        mock.script(
            &id("a"),
            MockScript::new()
                .at(Duration::from_secs(10), JobState::Running)
                .at(Duration::from_secs(20), JobState::OutOfMemory)
                .with_exit_code(0)
                .with_signal(9),
        );
        let h = mock.submit(&spec("a")).await.unwrap();
        let state = |m: &MockExecutor, h: &JobHandle| {
            let m = m.clone();
            let h = h.clone();
            async move { m.poll(&[h]).await.unwrap().remove(0) }
        };
        assert_eq!(state(&mock, &h).await.state, JobState::Pending);
        mock.clock().advance(Duration::from_secs(10));
        let s = state(&mock, &h).await;
        assert_eq!((s.state, s.exit_code), (JobState::Running, None));
        mock.clock().advance(Duration::from_secs(10));
        let s = state(&mock, &h).await;
        assert_eq!(
            (s.state, s.exit_code, s.signal),
            (JobState::OutOfMemory, Some(0), Some(9))
        );
    });
}

#[test]
fn submit_errors_in_order_then_success_and_ambiguous_creates_job() {
    rt().block_on(async {
        let mock = MockExecutor::new();
        mock.script(
            &id("b"),
            MockScript::completes()
                .with_submit_error(MockSubmitError::Unavailable("Socket timed out".into())),
        );
        let e = mock.submit(&spec("b")).await.unwrap_err();
        assert!(matches!(e, ExecutorError::SchedulerUnavailable { .. }));
        assert!(e.is_retryable());
        assert_eq!(mock.find(&id("b")).await.unwrap(), None);
        let h = mock.submit(&spec("b")).await.unwrap();
        assert_eq!(mock.submit_count(&id("b")), 2);
        assert_eq!(h.job_id, "mock-1");

        mock.script(
            &id("c"),
            MockScript::completes()
                .with_submit_error(MockSubmitError::Ambiguous("timed out".into())),
        );
        let e = mock.submit(&spec("c")).await.unwrap_err();
        assert!(matches!(e, ExecutorError::SubmitUnknown { .. }), "{e:?}");
        let found = mock.find(&id("c")).await.unwrap().expect("job exists");
        assert_eq!(found.job_id, "mock-2");
        // A second submit of the same attempt is refused: it would run twice.
        let dup = mock.submit(&spec("c")).await.unwrap_err();
        assert!(
            matches!(dup, ExecutorError::DuplicateAttempt { .. }),
            "{dup:?}"
        );
        assert!(!dup.is_retryable());
        assert_eq!(mock.job_count(), 2);

        mock.script(
            &id("d"),
            MockScript::completes().with_submit_error(MockSubmitError::Rejected(
                "Invalid account or account/partition combination".into(),
            )),
        );
        let e = mock.submit(&spec("d")).await.unwrap_err();
        assert!(matches!(e, ExecutorError::SubmitRejected { .. }) && !e.is_retryable());
        mock.script(
            &id("t"),
            MockScript::completes().with_submit_error(MockSubmitError::Throttled(
                "QOSMaxSubmitJobPerUserLimit".into(),
            )),
        );
        let e = mock.submit(&spec("t")).await.unwrap_err();
        assert!(matches!(e, ExecutorError::SubmitThrottled { .. }) && e.is_retryable());
    });
}

#[test]
fn cancel_records_and_respects_finished_jobs() {
    rt().block_on(async {
        let mock = MockExecutor::new();
        mock.script(&id("run"), MockScript::runs_forever());
        mock.script(&id("done"), MockScript::completes_after(Duration::from_secs(1)));
        let run = mock.submit(&spec("run")).await.unwrap();
        let done = mock.submit(&spec("done")).await.unwrap();
        mock.clock().advance(Duration::from_secs(2));
        mock.cancel(&run).await.unwrap();
        mock.cancel(&done).await.unwrap();
        let st = mock.poll(&[run, done]).await.unwrap();
        assert_eq!(st[0].state, JobState::Cancelled { by_uid: None });
        assert_eq!((st[1].state.clone(), st[1].exit_code), (JobState::Completed, Some(0)));
        assert_eq!(mock.cancelled(), vec![id("run"), id("done")]);
        let calls = mock.calls();
        assert!(matches!(&calls[0], MockCall::Submit { at, job_id: Some(j), .. } if *at == Duration::ZERO && j == "mock-1"));
        assert!(matches!(&calls[4], MockCall::Poll { at, handles: 2, failed: false } if *at == Duration::from_secs(2)));
    });
}

#[test]
fn poll_failures_and_foreign_and_lost_handles() {
    rt().block_on(async {
        let mock = MockExecutor::new();
        let h = mock.submit(&spec("x")).await.unwrap();
        mock.fail_polls(2, "slurm_load_jobs error: Socket timed out");
        for _ in 0..2 {
            let e = mock.poll(std::slice::from_ref(&h)).await.unwrap_err();
            assert!(e.is_retryable());
            assert!(e.to_string().contains("Socket timed out"), "{e}");
        }
        assert_eq!(
            mock.poll(std::slice::from_ref(&h)).await.unwrap()[0].state,
            JobState::Completed
        );
        let foreign = JobHandle::new("slurm", id("x"), "4711", 0);
        assert!(matches!(
            mock.poll(&[foreign]).await.unwrap_err(),
            ExecutorError::ForeignHandle { .. }
        ));
        let lost = JobHandle::new("mock", id("y"), "mock-99", 0);
        assert_eq!(mock.poll(&[lost]).await.unwrap()[0].state, JobState::Lost);
    });
}

#[test]
fn log_text_written_to_log_path() {
    rt().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mock = MockExecutor::new();
        mock.script(
            &id("oom"),
            MockScript::fails_after(Duration::ZERO, 1)
                .with_log("torch.OutOfMemoryError: CUDA out of memory\n"),
        );
        let path = dir.path().join("oom.log");
        let h = mock
            .submit(&spec("oom").with_log_path(&path))
            .await
            .unwrap();
        let s = mock.poll(&[h]).await.unwrap().remove(0);
        assert_eq!(s.log_path.as_deref(), Some(path.as_path()));
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .contains("CUDA out of memory")
        );
        assert_eq!(
            mock.log_text(&id("oom")).unwrap(),
            "torch.OutOfMemoryError: CUDA out of memory\n"
        );
    });
}

#[test]
fn boxed_and_arc_executors_work() {
    rt().block_on(async {
        let mock = MockExecutor::new();
        let boxed: Box<dyn Executor> = Box::new(mock.clone());
        let arc: std::sync::Arc<dyn Executor> = std::sync::Arc::new(mock.clone());
        let h = boxed.submit(&spec("boxed")).await.unwrap();
        let st = arc
            .wait_terminal(&[h], Duration::from_millis(1), Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(st[0].state, JobState::Completed);
        let handles = boxed
            .submit_array(&ArraySpec::new(spec("arr"), 3))
            .await
            .unwrap();
        let ids: Vec<_> = handles
            .iter()
            .map(|h| h.attempt_id.as_str().to_string())
            .collect();
        assert_eq!(ids, ["arr_0", "arr_1", "arr_2"]);
    });
}

#[test]
fn many_jobs_poll_is_cheap_enough_to_simulate() {
    // 20k jobs submitted and polled in one call: checks the mock has no per-call quadratic cost
    // (a 100k-item campaign simulation runs on it).
    rt().block_on(async {
        let mock = MockExecutor::new();
        let mut hs = Vec::new();
        for i in 0..20_000 {
            hs.push(mock.submit(&spec(&format!("j{i}"))).await.unwrap());
        }
        let st = mock.poll(&hs).await.unwrap();
        assert_eq!(st.len(), 20_000);
        assert!(st.iter().all(|s| s.state == JobState::Completed));
        assert_eq!(st[12_345].attempt_id, id("j12345"));
    });
}

#[test]
fn attempt_id_rules() {
    for ok in ["a", "camp-7f3a.t12.a1", "A_b-c.9"] {
        assert!(AttemptId::new(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        ".hidden",
        "-opt",
        "a b",
        "a/b",
        "..",
        "x|y",
        "é",
        &"a".repeat(65),
    ] {
        let e = AttemptId::new(bad).unwrap_err();
        assert!(matches!(e, ExecutorError::InvalidSpec { .. }), "{bad}");
        assert!(e.to_string().contains("attempt_id"), "{e}");
    }
    let s = AttemptId::sanitize("lr=0.1 (warmup)|seed:3");
    assert_eq!(s.as_str(), "lr_0.1__warmup__seed_3");
    let long = AttemptId::sanitize(&"x".repeat(100));
    assert_eq!(long.as_str().len(), 64);
    assert_ne!(long, AttemptId::sanitize(&"x".repeat(101)));
    assert_eq!(id("base_12").split_array_task(), Some((id("base"), 12)));
    assert_eq!(id("base").split_array_task(), None);
    let json = serde_json::to_string(&id("a.b")).unwrap();
    assert_eq!(json, "\"a.b\"");
    assert!(serde_json::from_str::<AttemptId>("\"../x\"").is_err());
}

#[test]
fn spec_validation_names_the_field() {
    let mut s = spec("v");
    s.command = CommandSpec::shell_script("echo a").arg("b");
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("command.argv") && e.contains("exactly one element"),
        "{e}"
    );
    let mut s = spec("v");
    s.topology.nodes = 0;
    assert!(
        s.validate()
            .unwrap_err()
            .to_string()
            .contains("topology.nodes")
    );
    let mut s = spec("v");
    s.scheduler.extra_directives.push("constraint=a100".into());
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("scheduler.extra_directives[0]") && e.contains("constraint=a100"),
        "{e}"
    );
    let s = spec("v").with_walltime(Duration::ZERO);
    assert!(s.validate().unwrap_err().to_string().contains("walltime"));
    let mut s = spec("v");
    s.command.env.insert("A=B".into(), "x".into());
    assert!(
        s.validate()
            .unwrap_err()
            .to_string()
            .contains("command.env")
    );
}

#[test]
fn handle_and_status_serde_roundtrip() {
    let h = JobHandle::new("slurm", id("a.1"), "4711", 1_700_000_000_000)
        .with_array_task(3)
        .with_cluster("clusterA")
        .with_data("k", "v");
    let back: JobHandle = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
    assert_eq!(back, h);
    assert_eq!(h.scheduler_ref(), "4711_3");
    let st = JobStatus::new(id("a.1"), JobState::Killed { signal: 9 }).with_exit_code(137);
    let back: JobStatus = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
    assert_eq!(back, st);
    assert_eq!(
        JobState::Killed { signal: 9 }.to_string(),
        "KILLED(signal 9)"
    );
    assert!(JobState::Requeued.is_active() && JobState::Deadline.is_terminal());
    assert!(!JobState::Unknown { raw: "FOO".into() }.is_terminal());
}
