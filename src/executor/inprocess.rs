//! [`InProcess`]: the executor type of a sweep that runs its jobs in the drain's own process.

use async_trait::async_trait;

use super::{ArraySpec, AttemptId, AttemptSpec, Executor, ExecutorError, JobHandle, JobStatus};

/// The default executor of an [`Orchestrator`](crate::Orchestrator): jobs run in the process
/// that drains (no executor is involved). A marker with no state: it starts no attempts, so
/// every submit fails with [`ExecutorError::Other`] (not retryable), polls of handles it never
/// made fail with [`ExecutorError::ForeignHandle`], and `find` finds nothing. Isolated runs
/// ([`isolate(true)`](crate::OrchestratorBuilder::isolate)) need a real executor and are
/// refused with it when the sweep is built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InProcess;

impl InProcess {
    /// Its [`kind`](Executor::kind).
    pub const KIND: &'static str = "in-process";

    fn refuse() -> ExecutorError {
        ExecutorError::Other {
            message: "the InProcess executor runs jobs in the draining process and starts no \
                      attempts: use LocalExecutor or SlurmExecutor to start processes"
                .into(),
            retryable: false,
        }
    }
}

#[async_trait]
impl Executor for InProcess {
    fn kind(&self) -> &str {
        Self::KIND
    }

    async fn submit(&self, _spec: &AttemptSpec) -> Result<JobHandle, ExecutorError> {
        Err(Self::refuse())
    }

    async fn submit_array(&self, _array: &ArraySpec) -> Result<Vec<JobHandle>, ExecutorError> {
        Err(Self::refuse())
    }

    async fn poll(&self, handles: &[JobHandle]) -> Result<Vec<JobStatus>, ExecutorError> {
        match handles.first() {
            None => Ok(Vec::new()),
            Some(h) => super::check_kind(Self::KIND, h).map(|()| Vec::new()),
        }
    }

    async fn cancel(&self, handle: &JobHandle) -> Result<(), ExecutorError> {
        super::check_kind(Self::KIND, handle)
    }

    async fn find(&self, _attempt_id: &AttemptId) -> Result<Option<JobHandle>, ExecutorError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::CommandSpec;

    #[test]
    fn starts_nothing_and_says_so() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let spec = AttemptSpec::new(AttemptId::new("a1").unwrap(), CommandSpec::new("true"));
            let e = InProcess.submit(&spec).await.unwrap_err();
            assert!(!e.is_retryable());
            assert!(e.to_string().contains("starts no attempts"), "{e}");
            assert_eq!(InProcess.find(&spec.attempt_id).await.unwrap(), None);
            assert!(InProcess.poll(&[]).await.unwrap().is_empty());
        });
    }
}
