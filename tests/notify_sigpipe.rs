//! A notifier that exits without reading its stdin must not kill the process that notifies,
//! even with SIGPIPE at its default action, as the `puzzletron` binary sets it (a test of its
//! own: the signal disposition is process-wide).

use std::path::PathBuf;
use std::time::Duration;

use puzzletron::report::{Notifier, NotifyEvent};

#[test]
fn a_notifier_that_never_reads_its_stdin_does_not_kill_the_sender() {
    // SAFETY: set before this test starts any thread of its own, as the binary's `main` does.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // 4 MiB: more than any pipe buffer, so the write is still going when `true` exits, and
    // the rest of it meets a pipe with no reader (EPIPE, or SIGPIPE if it is not blocked).
    let event = NotifyEvent::new(
        "stage_done",
        PathBuf::from("/tmp/campaign"),
        "x".repeat(4 << 20),
    )
    .with_stage("convert")
    .with_at_ms(0);
    let n = Notifier::new(vec!["true".into()])
        .unwrap()
        .timeout(Duration::from_secs(20));
    for _ in 0..3 {
        n.send(&event);
    }
    n.flush();
    // Still alive, and `true` succeeded every time: its unread input is not its failure.
    assert_eq!(n.sent(), 3);
    assert_eq!(n.failures(), 0);
}
