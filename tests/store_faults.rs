//! Shared-filesystem faults (P03, P04 in `docs/evidence.md`) injected into two
//! drains of one store through `FsStore::with_fault_hook` (feature `test-util`): NFS's `ESTALE`
//! where a scan finds a file gone (and once for every file it reads, as a stale handle would
//! answer), Lustre's `EACCES` instead of `EEXIST` on a contended `mkdir`. Every run executes
//! exactly once, and no error reaches the user.

mod support;
use support::watchdog;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use puzzletron::store::{FaultHook, FaultOp};
use puzzletron::{JobResult, Run};
use puzzletron::{Orchestrator, identity::Hash, store::FsStore};
use support::sweep::{FakeCrate, P};

/// Executions per key, across both drains.
static RUNS: Mutex<Option<HashMap<Hash, usize>>> = Mutex::new(None);

fn counted(p: &P, run: &mut Run) -> JobResult {
    *RUNS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(run.key())
        .or_default() += 1;
    std::thread::sleep(Duration::from_millis(2));
    run.log("loss", 0, p.lr)?;
    Ok(())
}

/// See the module docs; counts what it injected.
fn faults(injected: Arc<Mutex<HashMap<&'static str, usize>>>) -> FaultHook {
    let seen = Arc::new(Mutex::new(HashSet::<PathBuf>::new()));
    Arc::new(move |op, path, err| {
        let (what, e) = match (op, err) {
            (FaultOp::MakeJobFolder, Some(e)) if e.kind() == io::ErrorKind::AlreadyExists => (
                "EACCES on mkdir",
                io::Error::from_raw_os_error(libc::EACCES),
            ),
            (FaultOp::MakeJobFolder, _) => return None,
            (_, Some(e)) if e.kind() == io::ErrorKind::NotFound => (
                "ESTALE for a file gone",
                io::Error::from_raw_os_error(libc::ESTALE),
            ),
            (_, None) if seen.lock().unwrap().insert(path.to_path_buf()) => (
                "ESTALE once for a file there",
                io::Error::from_raw_os_error(libc::ESTALE),
            ),
            _ => return None,
        };
        *injected.lock().unwrap().entry(what).or_default() += 1;
        Some(e)
    })
}

#[test]
fn estale_scans_and_eacces_mkdirs_never_run_a_job_twice_nor_reach_the_user() {
    let _w = watchdog::Watchdog::start(
        "estale_scans_and_eacces_mkdirs_never_run_a_job_twice_nor_reach_the_user",
        Duration::from_secs(300),
    );
    let krate = FakeCrate::new();
    let job = krate.job(counted);
    let dir = tempfile::tempdir().unwrap();
    let injected = Arc::new(Mutex::new(HashMap::new()));
    let hook = faults(injected.clone());
    let runs = 60;
    let drains: Vec<_> = (0..2)
        .map(|_| {
            let (job, hook, root) = (job.clone(), hook.clone(), dir.path().join("store"));
            let lock = krate.lock();
            std::thread::spawn(move || {
                let store = FsStore::create(root).unwrap().with_fault_hook(hook);
                let mut o = Orchestrator::builder()
                    .store(store)
                    .lock(lock)
                    .wait_poll(Duration::from_millis(5))
                    .build()
                    .unwrap();
                for i in 0..runs {
                    o.run(
                        &job,
                        P {
                            lr: f64::from(i),
                            hidden: 1,
                        },
                    )
                    .unwrap();
                }
                o.drain().map(|s| s.ran()).map_err(|f| f.to_string())
            })
        })
        .collect();
    let ran: Vec<usize> = drains
        .into_iter()
        .map(|d| d.join().unwrap().expect("no error reaches the user"))
        .collect();
    let counts = RUNS.lock().unwrap().take().unwrap_or_default();
    assert_eq!(counts.len(), runs as usize, "every run executed");
    assert!(
        counts.values().all(|&n| n == 1),
        "each exactly once: {counts:?}"
    );
    assert_eq!(ran.iter().sum::<usize>(), runs as usize, "{ran:?}");
    let injected = injected.lock().unwrap().clone();
    for what in ["EACCES on mkdir", "ESTALE once for a file there"] {
        assert!(
            injected.get(what).copied().unwrap_or(0) > 0,
            "{what}: {injected:?}"
        );
    }
    eprintln!("faults injected: {injected:?}; runs per drain: {ran:?}");
}
