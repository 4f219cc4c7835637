//! Records the toolchain puzzletron (and so the user's crate) is compiled with, as a witness.
use std::process::Command;

fn main() {
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
