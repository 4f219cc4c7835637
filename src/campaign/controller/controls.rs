//! Interactive control of a running controller.
//!
//! On a terminal, [`TerminalControls`] reads single keys (no Enter): `q` or Ctrl-C opens a menu
//! — `c` cancel (cancel every live job and quit), `o`/Esc continue, `d` detach (quit, leave the
//! jobs running; the next `run` re-attaches) — and a second Ctrl-C while the menu is open
//! cancels. The terminal's previous mode is restored when the controls are dropped (normal
//! return, error, panic unwinding); only `kill -9` can skip that, as for every program.
//!
//! Off a terminal (CI, `nohup`, a pipe) the key reader is inert, and SIGINT/SIGTERM request a
//! clean cancel. On a terminal SIGTERM does the same (Ctrl-C arrives as a key there).

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::driver::{Control, ControlSender};

/// State of the key menu.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MenuState {
    /// No menu shown.
    #[default]
    Closed,
    /// The menu is shown, waiting for a choice.
    Open,
}

/// The menu's text.
pub const MENU: &str = "\r\n[campaign] c: cancel all jobs and quit | o: continue | d: detach (leave jobs running) | Ctrl-C again: cancel\r\n";

/// One key press through the menu: the new state and the request it makes, if any.
pub fn menu_step(state: MenuState, key: u8) -> (MenuState, Option<Control>) {
    const CTRL_C: u8 = 3;
    const ESC: u8 = 27;
    match (state, key) {
        (MenuState::Closed, b'q' | b'Q' | CTRL_C) => (MenuState::Open, None),
        (MenuState::Closed, _) => (MenuState::Closed, None),
        (MenuState::Open, b'c' | b'C' | CTRL_C) => (MenuState::Closed, Some(Control::Cancel)),
        (MenuState::Open, b'd' | b'D') => (MenuState::Closed, Some(Control::Detach)),
        (MenuState::Open, b'o' | b'O' | ESC | b'\r' | b'\n') => {
            (MenuState::Closed, Some(Control::Continue))
        }
        (MenuState::Open, _) => (MenuState::Open, None),
    }
}

/// Keys and signals feeding a controller's [`Control`] channel. Drop it to restore the
/// terminal.
pub struct TerminalControls {
    stop: Arc<AtomicBool>,
    saved: Option<libc::termios>,
    thread: Option<std::thread::JoinHandle<()>>,
    signals: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for TerminalControls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalControls")
            .field("interactive", &self.is_interactive())
            .finish()
    }
}

impl TerminalControls {
    /// Starts the controls: the key reader when stdin is a terminal, and the signal handlers
    /// (needs a tokio runtime). Returns the receiver to give to
    /// [`CampaignControllerBuilder::controls`](super::CampaignControllerBuilder::controls).
    ///
    /// # Errors
    /// The OS error when the signal handlers cannot be installed.
    pub fn start() -> std::io::Result<(Self, mpsc::UnboundedReceiver<Control>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let interactive = std::io::stdin().is_terminal();
        let signals = Some(spawn_signals(tx.clone(), !interactive)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut me = TerminalControls {
            stop: stop.clone(),
            saved: None,
            thread: None,
            signals,
        };
        if interactive {
            me.saved = raw_mode()?;
            me.thread = Some(spawn_reader(tx, stop));
        }
        Ok((me, rx))
    }

    /// Whether keys are read (stdin is a terminal).
    pub fn is_interactive(&self) -> bool {
        self.saved.is_some()
    }
}

impl Drop for TerminalControls {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(s) = self.signals.take() {
            s.abort();
        }
        if let Some(saved) = self.saved.take() {
            // SAFETY: restoring a termios previously read from the same fd.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &saved) };
        }
    }
}

fn raw_mode() -> std::io::Result<Option<libc::termios>> {
    // SAFETY: termios is plain data; tcgetattr fills it or fails.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let saved = t;
    // Single keys, no echo, and Ctrl-C as a key (ISIG off) so it opens the menu.
    t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
    t.c_cc[libc::VMIN] = 1;
    t.c_cc[libc::VTIME] = 0;
    // SAFETY: setting attributes of fd 0 with a termios derived from its own.
    if unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some(saved))
}

fn spawn_reader(tx: ControlSender, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut state = MenuState::Closed;
        while !stop.load(Ordering::Relaxed) {
            let mut pfd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; 100 ms timeout so the stop flag is seen.
            let n = unsafe { libc::poll(&mut pfd, 1, 100) };
            if n <= 0 {
                continue;
            }
            let mut b = [0u8; 1];
            // SAFETY: reading one byte into a valid buffer.
            if unsafe { libc::read(0, b.as_mut_ptr().cast(), 1) } != 1 {
                return;
            }
            let (next, req) = menu_step(state, b[0]);
            if state == MenuState::Closed && next == MenuState::Open {
                let _ = std::io::stderr().write_all(MENU.as_bytes());
            }
            state = next;
            if let Some(r) = req {
                let _ = tx.send(r);
            }
        }
    })
}

fn spawn_signals(tx: ControlSender, sigint: bool) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = if sigint {
        Some(signal(SignalKind::interrupt())?)
    } else {
        None
    };
    Ok(tokio::spawn(async move {
        loop {
            let got = match &mut int {
                Some(i) => tokio::select! { x = term.recv() => x, x = i.recv() => x },
                None => term.recv().await,
            };
            if got.is_none() || tx.send(Control::Cancel).is_err() {
                return;
            }
        }
    }))
}

/// Parses a choice among `available` revisions (or any ids): `all`, `none` (or empty), a
/// comma/space separated list of 1-based numbers and exact ids. Returns the chosen ids in the
/// order of `available`, without duplicates.
///
/// # Errors
/// A message naming the bad token and the valid range/ids.
pub fn choose_revisions(input: &str, available: &[String]) -> Result<Vec<String>, String> {
    let t = input.trim();
    if t.eq_ignore_ascii_case("all") {
        return Ok(available.to_vec());
    }
    if t.is_empty() || t.eq_ignore_ascii_case("none") {
        return Ok(Vec::new());
    }
    let mut chosen = vec![false; available.len()];
    for tok in t
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        if let Some(i) = available.iter().position(|a| a == tok) {
            chosen[i] = true;
        } else if let Ok(n) = tok.parse::<usize>() {
            if n == 0 || n > available.len() {
                return Err(format!(
                    "{tok}: no revision number {n}; choose 1 to {}",
                    available.len()
                ));
            }
            chosen[n - 1] = true;
        } else {
            return Err(format!(
                "{tok:?} is neither a number (1 to {}), an id ({}), `all` nor `none`",
                available.len(),
                available.join(", ")
            ));
        }
    }
    Ok(available
        .iter()
        .zip(chosen)
        .filter(|(_, c)| *c)
        .map(|(a, _)| a.clone())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn menu_keys() {
        use MenuState::*;
        assert_eq!(menu_step(Closed, b'x'), (Closed, None));
        assert_eq!(menu_step(Closed, b'q'), (Open, None));
        assert_eq!(menu_step(Closed, 3), (Open, None));
        assert_eq!(
            menu_step(Open, 3),
            (Closed, Some(Control::Cancel)),
            "second Ctrl-C cancels"
        );
        assert_eq!(menu_step(Open, b'c'), (Closed, Some(Control::Cancel)));
        assert_eq!(menu_step(Open, b'd'), (Closed, Some(Control::Detach)));
        assert_eq!(menu_step(Open, b'o'), (Closed, Some(Control::Continue)));
        assert_eq!(menu_step(Open, 27), (Closed, Some(Control::Continue)));
        assert_eq!(menu_step(Open, b'z'), (Open, None));
    }

    #[test]
    fn revisions() {
        let av: Vec<String> = ["r0-ab12", "r1-cd34", "r2-ef56"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(choose_revisions("all", &av).unwrap(), av);
        assert!(choose_revisions("none", &av).unwrap().is_empty());
        assert!(choose_revisions("  ", &av).unwrap().is_empty());
        assert_eq!(
            choose_revisions("3, 1", &av).unwrap(),
            ["r0-ab12", "r2-ef56"]
        );
        assert_eq!(choose_revisions("r1-cd34 2", &av).unwrap(), ["r1-cd34"]);
        let e = choose_revisions("4", &av).unwrap_err();
        assert!(e.contains("choose 1 to 3"), "{e}");
        let e = choose_revisions("zz", &av).unwrap_err();
        assert!(e.contains("\"zz\"") && e.contains("r2-ef56"), "{e}");
    }

    #[tokio::test]
    async fn off_a_terminal_the_reader_is_inert_and_sigterm_cancels() {
        // Under `cargo test` stdin is not a terminal.
        if std::io::stdin().is_terminal() {
            return;
        }
        let (c, mut rx) = TerminalControls::start().unwrap();
        assert!(!c.is_interactive());
        // SAFETY: sending SIGTERM to ourselves; the handler installed above catches it.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await;
        assert_eq!(got.unwrap(), Some(Control::Cancel));
        drop(c);
    }
}
