//! Records the toolchain puzzletron (and so the user's crate) is compiled with, as a witness;
//! turns on the tests that need outside services when asked (see `test_cfgs`).
use std::process::Command;

/// `PUZZLETRON_SLURM_TESTS=1` (the local Slurm cluster), `PUZZLETRON_PYARROW_TESTS=1` (python3
/// with pyarrow), `PUZZLETRON_SSH_TESTS=1` (the sshd hosts of `scripts/ssh-hosts.sh`) and
/// `PUZZLETRON_CHROMIUM_TESTS=1` (headless Chromium) and `PUZZLETRON_NS_TESTS=1` (root, for
/// `unshare --pid`: drains and controllers in other PID namespaces) and
/// `PUZZLETRON_RAY_TESTS=1` (a Ray cluster, `ray start --head`, dashboard on
/// `$PUZZLETRON_RAY_ADDRESS` or 127.0.0.1:8265) set the cfgs `puzzletron_<what>_tests`: the
/// tests that need the service run (and fail when it is missing); without them those tests
/// are reported as ignored, with the reason. `.ci/run` exports all six.
fn test_cfgs() {
    for (var, cfg) in [
        ("PUZZLETRON_SLURM_TESTS", "puzzletron_slurm_tests"),
        ("PUZZLETRON_PYARROW_TESTS", "puzzletron_pyarrow_tests"),
        ("PUZZLETRON_SSH_TESTS", "puzzletron_ssh_tests"),
        ("PUZZLETRON_CHROMIUM_TESTS", "puzzletron_chromium_tests"),
        ("PUZZLETRON_NS_TESTS", "puzzletron_ns_tests"),
        ("PUZZLETRON_RAY_TESTS", "puzzletron_ray_tests"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo:rerun-if-env-changed={var}");
        if std::env::var(var).as_deref() == Ok("1") {
            println!("cargo:rustc-cfg={cfg}");
        }
    }
}

fn main() {
    test_cfgs();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc).arg("-vV").output().ok();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            .unwrap_or_else(|| "unknown".into())
    };
    let version = text
        .lines()
        .next()
        .unwrap_or("rustc unknown")
        .trim()
        .to_string();
    println!("cargo:rustc-env=PUZZLETRON_RUSTC_VERSION={version}");
    println!("cargo:rustc-env=PUZZLETRON_RUSTC_HOST={}", field("host:"));
    println!(
        "cargo:rustc-env=PUZZLETRON_TARGET={}",
        std::env::var("TARGET").unwrap_or_else(|_| "unknown".into())
    );
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=build.rs");
}
