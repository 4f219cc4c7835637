//! The bare-metal executor against real OpenSSH hosts on loopback (`scripts/ssh-hosts.sh`):
//! the conformance suite, preflight errors, disjoint GPU slices, walltime, cancel leaving no
//! process behind (checked with `ps` per host), an unreachable host.

#[path = "support/ssh_hosts.rs"]
mod ssh_hosts;
#[path = "support/watchdog.rs"]
mod watchdog;

use std::path::Path;
use std::time::Duration;

use puzzletron::executor::{
    AttemptId, AttemptSpec, BareMetalExecutor, CommandSpec, Executor, ExecutorError, ExecutorExt,
    GpuRequest, JobState, TaskTopology, conformance,
};

fn executor(h: &ssh_hosts::SshHosts, state: &Path) -> BareMetalExecutor {
    let mut b = BareMetalExecutor::builder(state)
        .ssh_config(&h.config)
        .kill_grace(Duration::from_secs(1))
        .cancel_timeout(Duration::from_secs(5));
    for host in &h.hosts {
        b = b.host(host, 4);
    }
    b.build().expect("bare-metal executor")
}

fn uniq(tag: &str) -> String {
    format!("bm{}-{tag}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baremetal_executor_conforms() {
    let Some(h) = ssh_hosts::hosts() else { return };
    let _w = watchdog::Watchdog::start("baremetal_executor_conforms", Duration::from_secs(300));
    let state = tempfile::tempdir().unwrap();
    let path = state.path().to_path_buf();
    conformance::Conformance::new(move || Box::new(executor(&h, &path)))
        .with_poll_interval(Duration::from_millis(50))
        .with_timeout(Duration::from_secs(60))
        .run_all()
        .await;
}
