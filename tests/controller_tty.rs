//! The interactive menu on a real pseudo-terminal: the `campaign` example runs under
//! `script(1)` (util-linux), which gives it a PTY as stdin/stdout; keys are written to
//! `script`'s stdin. `q` then `d` detaches (jobs keep running, exit 3, the next run
//! re-attaches); `q` then Ctrl-C cancels every live job (exit 2). Skipped with a message when
//! `script` is not installed.

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn have_script() -> bool {
    Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn under_pty(dir: &Path, keys: &[&[u8]]) -> (Option<i32>, String) {
    let exe = support::campaign::campaign_exe();
    // `stty -a` after the exit shows whether the terminal mode was restored.
    let cmd = format!(
        "{} --dir {} --quiet --poll-ms 100 --epochs 30; rc=$?; stty -a; exit $rc",
        exe.display(),
        dir.display()
    );
    let mut child = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the controller runs (its journal has the score shards' intents).
    let t0 = Instant::now();
    loop {
        let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap_or_default();
        if j.contains("\"unit\":\"score/3\"") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the campaign did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let stdin = child.stdin.as_mut().unwrap();
    for k in keys {
        stdin.write_all(k).unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(400));
    }
    // Keep script's stdin open until the program exits (EOF there ends the session).
    let t1 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(
            t1.elapsed() < Duration::from_secs(120),
            "the campaign did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `stty -a` shows canonical mode, echo and signals on again.
fn restored(out: &str) -> bool {
    let words: Vec<&str> = out.split_whitespace().collect();
    ["icanon", "echo", "isig"].iter().all(|w| words.contains(w))
}

#[test]
fn menu_detach_then_reattach_and_menu_cancel() {
    if !have_script() {
        eprintln!("skipped: script(1) from util-linux is not installed");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    // Detach: q, d.
    let dir = root.path().join("detach");
    let (code, out) = under_pty(&dir, &[b"q", b"d"]);
    assert!(
        out.contains("c: cancel all jobs and quit"),
        "the menu was shown: {out:?}"
    );
    assert_eq!(code, Some(3), "detached: {out}");
    assert!(restored(&out), "terminal mode restored after exit: {out}");
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(j.contains("\"kind\":\"detached\""));
    assert!(!j.contains("cancel_requested"), "detach cancels nothing");
    // The next run re-attaches and completes without resubmitting the live shards.
    let st = support::campaign::spawn(&dir, &["--epochs", "30"])
        .wait()
        .unwrap();
    assert!(st.success());
    let a = support::campaign::audit(&dir);
    assert!(a.duplicates.is_empty() && a.missing.is_empty(), "{a:?}");

    // Cancel: q, then Ctrl-C (a second Ctrl-C while the menu is open cancels).
    let dir = root.path().join("cancel");
    let (code, out) = under_pty(&dir, &[b"q", b"\x03"]);
    assert_eq!(code, Some(2), "cancelled: {out}");
    assert!(
        restored(&out),
        "terminal mode restored after the cancel: {out}"
    );
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(
        j.contains("\"kind\":\"shut_down\""),
        "cancel went through shutdown"
    );
    // Every attempt that was live is finished in the journal (cancelled), none left running.
    let submitted = j.matches("\"t\":\"submitted\"").count();
    let finished = j.matches("\"t\":\"finished\"").count();
    assert_eq!(submitted, finished, "no attempt left live after the cancel");
}
