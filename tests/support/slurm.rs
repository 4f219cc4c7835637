//! Helpers shared by the Slurm test files: cluster detection and logging/failing PATH shims.

use std::path::{Path, PathBuf};

pub const REQUIRE_ENV: &str = "PUZZLETRON_SLURM_TESTS";

/// `true` when the cluster answers; panics when it is required and does not.
pub fn cluster_available(test: &str) -> bool {
    let ok = std::process::Command::new("sinfo")
        .args(["-h", "-o", "%N"])
        .output()
        .map(|o| o.status.success() && !o.stdout.is_empty())
        .unwrap_or(false)
        && std::process::Command::new("sacct")
            .args(["-n", "-X", "-S", "now"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
    if ok {
        return true;
    }
    if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
        panic!(
            "{test}: {REQUIRE_ENV}=1 but no Slurm cluster answers `sinfo`/`sacct`; start it with \
             `bash ../shared/slurm/start-local-cluster.sh </dev/null` (as root)"
        );
    }
    eprintln!("SKIP {test}: no Slurm cluster (set {REQUIRE_ENV}=1 to make this a failure)");
    false
}

/// Writes shims for sbatch/squeue/sacct/scancel that log each call to `calls.log` and then
/// run the real command; with `fail_pct > 0` they fail transiently that often (sbatch half the
/// time before submitting, half the time after, which is the ambiguous case).
pub fn write_shims(dir: &Path, fail_pct: u32) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let log = dir.join("calls.log");
    for cmd in ["sbatch", "squeue", "sacct", "scancel", "scontrol"] {
        let real = String::from_utf8(
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {cmd}")])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
        .trim()
        .to_string();
        assert!(!real.is_empty(), "{cmd} not in PATH");
        let fail = if fail_pct == 0 {
            String::new()
        } else if cmd == "sbatch" {
            format!(
                "r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')\n\
                 if [ $((r % 100)) -lt {half} ]; then echo \"sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)\" >&2; echo \"$(date +%s.%N) sbatch FAIL-BEFORE\" >> '{log}'; exit 1; fi\n\
                 if [ $((r % 100)) -lt {fail_pct} ]; then \"{real}\" \"$@\" >/dev/null 2>&1; echo \"sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\" >&2; echo \"$(date +%s.%N) sbatch FAIL-AFTER\" >> '{log}'; exit 1; fi\n",
                half = fail_pct / 2,
                log = log.display()
            )
        } else {
            format!(
                "r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')\n\
                 if [ $((r % 100)) -lt {fail_pct} ]; then echo \"{cmd}: error: slurm_load_jobs error: Socket timed out on send/recv operation\" >&2; echo \"$(date +%s.%N) {cmd} FAIL\" >> '{log}'; exit 1; fi\n",
                log = log.display()
            )
        };
        let script = format!(
            "#!/bin/sh\necho \"$(date +%s.%N) {cmd} $*\" >> '{log}'\n{fail}exec \"{real}\" \"$@\"\n",
            log = log.display()
        );
        let p = bin.join(cmd);
        std::fs::write(&p, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    bin
}

pub fn count_calls(dir: &Path, cmd: &str) -> usize {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some(cmd) && !l.contains("FAIL"))
        .count()
}
