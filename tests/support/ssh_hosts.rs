//! The fake SSH hosts of `scripts/ssh-hosts.sh` (sshd instances on 127.0.10.N:2222, 4 fake GPUs
//! each). `hosts()` starts them (idempotent) and returns their ssh config and names. The tests
//! that use them are ignored unless `PUZZLETRON_SSH_TESTS=1` (build.rs: cfg
//! `puzzletron_ssh_tests`); when they run, a missing sshd fails them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The started hosts.
pub struct SshHosts {
    /// The ssh config with one `Host hN` alias per host.
    pub config: PathBuf,
    /// Host names, `h1`..`hN`.
    pub hosts: Vec<String>,
    /// The script's folder.
    pub dir: PathBuf,
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ssh-hosts.sh")
}

/// Starts the hosts (always `Some`; a missing sshd panics with the fix).
pub fn hosts() -> Option<SshHosts> {
    assert!(
        Path::new("/usr/sbin/sshd").exists(),
        "/usr/sbin/sshd missing: apt-get install -y openssh-server (.ci/run does)"
    );
    let out = Command::new("bash")
        .arg(script())
        .arg("start")
        .output()
        .expect("running scripts/ssh-hosts.sh");
    assert!(
        out.status.success(),
        "scripts/ssh-hosts.sh start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("export {k}=")))
            .map(|v| v.trim_matches('"').to_string())
            .unwrap_or_else(|| panic!("ssh-hosts.sh printed no {k}: {text}"))
    };
    Some(SshHosts {
        config: get("PUZZLETRON_SSH_CONFIG").into(),
        hosts: get("PUZZLETRON_SSH_HOSTS_LIST")
            .split(' ')
            .map(str::to_string)
            .collect(),
        dir: get("PUZZLETRON_SSH_HOSTS_DIR").into(),
    })
}

/// Runs `scripts/ssh-hosts.sh <args>` and returns stdout.
pub fn ctl(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .expect("running scripts/ssh-hosts.sh");
    assert!(
        out.status.success(),
        "ssh-hosts.sh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The processes host `h` runs that belong to attempts whose id starts with `prefix`
/// (`ps` lines), i.e. what a cancel must leave empty.
pub fn processes_of(h: &str, prefix: &str) -> Vec<String> {
    ctl(&["ps", h])
        .lines()
        .filter(|l| l.contains(prefix))
        .map(str::to_string)
        .collect()
}
