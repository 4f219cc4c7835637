//! Identity rules seen from outside the crate: keys are recomputable from their documented
//! formula, stable under serde_json's `preserve_order`, and witnesses read real git state.

use puzzletron::identity::{self, Hash};
use serde::Serialize;
use sha2::{Digest, Sha256};

#[test]
fn preserve_order_is_on_in_this_test_build_and_keys_do_not_care() {
    // Dev-dependencies turn on serde_json/preserve_order: check it really is on.
    let v: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap();
    let order: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        order,
        ["b", "a"],
        "preserve_order must be enabled for this test to mean anything"
    );
    let w: serde_json::Value = serde_json::from_str(r#"{"a":2,"b":1}"#).unwrap();
    assert_eq!(identity::canonical_json(&v).unwrap(), r#"{"a":2,"b":1}"#);
    assert_eq!(
        identity::canonical_json(&v).unwrap(),
        identity::canonical_json(&w).unwrap()
    );
    #[derive(Serialize)]
    struct S {
        b: u8,
        a: u8,
    }
    assert_eq!(
        identity::canonical_json(&S { b: 1, a: 2 }).unwrap(),
        r#"{"a":2,"b":1}"#
    );
}

fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

#[test]
fn job_key_is_recomputable_from_its_documented_formula() {
    let owned = Hash::of("some code");
    let params = r#"{"hidden":32,"lr":0.1}"#;
    let mut h = Sha256::new();
    frame(&mut h, b"puzzletron/job-key/v1");
    frame(&mut h, b"my_crate::train::fit");
    frame(&mut h, params.as_bytes());
    frame(&mut h, owned.as_bytes());
    let expected: [u8; 32] = h.finalize().into();
    assert_eq!(
        identity::job_key("my_crate::train::fit", params, &owned),
        Hash::from_bytes(expected)
    );
}

#[test]
fn source_witness_reads_commit_and_dirty_flag_from_git() {
    let d = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(d.path())
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .expect("git");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    std::fs::write(d.path().join("model.py"), "x = 1\n").unwrap();
    git(&["add", "model.py"]);
    git(&["commit", "-q", "-m", "one"]);
    let head = git(&["rev-parse", "HEAD"]);
    let w = identity::source_witness(d.path());
    assert_eq!(w.commit.as_deref(), Some(head.as_str()));
    assert!(!w.dirty);
    std::fs::write(d.path().join("model.py"), "x = 2\n").unwrap();
    let w2 = identity::source_witness(d.path());
    assert!(w2.dirty, "a modified tracked file makes the tree dirty");
    // Untracked files do not.
    std::fs::write(d.path().join("model.py"), "x = 1\n").unwrap();
    std::fs::write(d.path().join("notes.txt"), "scratch\n").unwrap();
    assert!(!identity::source_witness(d.path()).dirty);
}
