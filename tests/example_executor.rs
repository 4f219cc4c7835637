//! The user executor of the `async_sweep` example passes the executor conformance suite, run
//! exactly as its docs show it (`conformance::run_all` with the factory alone: the
//! restarted-process checks re-execute this test; the attempt folders are under
//! `conformance::scratch_dir()`, the one folder of the suite and its child).

#[path = "../examples/common/shell_executor.rs"]
mod shell_executor;

use puzzletron::executor::conformance;
use shell_executor::ShellExecutor;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_executor_conforms() {
    conformance::run_all(|| {
        Box::new(ShellExecutor::new(
            conformance::scratch_dir().join("attempts"),
        ))
    })
    .await;
}
