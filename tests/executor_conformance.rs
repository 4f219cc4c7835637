//! The conformance suite against the built-in executors (feature `test-util`).

use std::time::Duration;

use puzzletron::executor::{MockExecutor, conformance};

#[tokio::test]
async fn mock_executor_conforms() {
    let mock = MockExecutor::new()
        .with_default_script(conformance::mock_script)
        .with_auto_advance(Duration::from_secs(1));
    conformance::Conformance::new(move || Box::new(mock.clone()))
        .with_poll_interval(Duration::from_millis(1))
        .run_all()
        .await;
}

/// An executor that reports every job `Completed` without running it: the suite must catch it.
struct LiesCompleted;

#[async_trait::async_trait]
impl puzzletron::executor::Executor for LiesCompleted {
    fn kind(&self) -> &str {
        "lies"
    }
    async fn submit(
        &self,
        spec: &puzzletron::executor::AttemptSpec,
    ) -> Result<puzzletron::executor::JobHandle, puzzletron::executor::ExecutorError> {
        spec.validate()?;
        Ok(puzzletron::executor::JobHandle::new(
            "lies",
            spec.attempt_id.clone(),
            "1",
            0,
        ))
    }
    async fn poll(
        &self,
        handles: &[puzzletron::executor::JobHandle],
    ) -> Result<Vec<puzzletron::executor::JobStatus>, puzzletron::executor::ExecutorError> {
        Ok(handles
            .iter()
            .map(|h| {
                puzzletron::executor::JobStatus::new(
                    h.attempt_id.clone(),
                    puzzletron::executor::JobState::Completed,
                )
                .with_exit_code(0)
            })
            .collect())
    }
    async fn cancel(
        &self,
        _: &puzzletron::executor::JobHandle,
    ) -> Result<(), puzzletron::executor::ExecutorError> {
        Ok(())
    }
    async fn find(
        &self,
        _: &puzzletron::executor::AttemptId,
    ) -> Result<Option<puzzletron::executor::JobHandle>, puzzletron::executor::ExecutorError> {
        Ok(None)
    }
}

#[tokio::test]
#[should_panic(expected = "conformance `fails_with_exit_code`")]
async fn suite_catches_an_executor_that_never_runs_anything() {
    conformance::run_all(|| Box::new(LiesCompleted)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_executor_conforms() {
    let root = tempfile::tempdir().expect("tempdir");
    let path = root.path().to_path_buf();
    conformance::Conformance::new(move || {
        Box::new(
            puzzletron::executor::LocalExecutor::builder(&path)
                .max_concurrent(4)
                .kill_grace(Duration::from_secs(2))
                .build()
                .expect("local executor"),
        )
    })
    .with_poll_interval(Duration::from_millis(20))
    .with_timeout(Duration::from_secs(30))
    .run_all()
    .await;
}
