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
//!
//! Manual decisions (post-MIP filters with `mode: manual`): on a terminal,
//! [`TerminalControls::prompter`] gives a [`DecisionPrompt`] that pauses the key reader,
//! shows the candidates numbered from 1 and reads a line ([`prompt_choice`], parsed by
//! [`choose_revisions`]); off a terminal there is no prompter and the controller waits for the
//! decision file instead.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::driver::{Control, ControlSender};

/// State of the key menu.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub(super) enum MenuState {
    /// No menu shown.
    #[default]
    Closed,
    /// The menu is shown, waiting for a choice.
    Open,
}

/// The menu's text.
pub(super) const MENU: &str = "\r\n[campaign] c: cancel all jobs and quit | o: continue | d: detach (leave jobs running) | Ctrl-C again: cancel\r\n";

/// One key press through the menu: the new state and the request it makes, if any.
pub(super) fn menu_step(state: MenuState, key: u8) -> (MenuState, Option<Control>) {
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
    /// Set while a prompt owns the terminal: the key reader stops reading.
    paused: Arc<AtomicBool>,
    /// Set by the key reader once it has seen `paused` (it reads nothing until cleared).
    parked: Arc<AtomicBool>,
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
        let paused = Arc::new(AtomicBool::new(false));
        let parked = Arc::new(AtomicBool::new(false));
        let mut me = TerminalControls {
            stop: stop.clone(),
            paused: paused.clone(),
            parked: parked.clone(),
            saved: None,
            thread: None,
            signals,
        };
        if interactive {
            me.saved = raw_mode()?;
            me.thread = Some(spawn_reader(tx, stop, paused, parked));
        }
        Ok((me, rx))
    }

    /// Whether keys are read (stdin is a terminal).
    pub fn is_interactive(&self) -> bool {
        self.saved.is_some()
    }

    /// On a terminal, the [`DecisionPrompt`] to give to
    /// [`CampaignControllerBuilder::decision_prompt`](super::CampaignControllerBuilder::decision_prompt):
    /// it pauses the key reader, restores the terminal's line mode, asks with
    /// `prompt_choice` on stderr, and goes back to single keys. `None` off a terminal (the
    /// controller then waits for the decision file).
    pub fn prompter(&self) -> Option<Arc<dyn DecisionPrompt>> {
        let saved = self.saved?;
        Some(Arc::new(TerminalPrompt {
            paused: self.paused.clone(),
            parked: self.parked.clone(),
            saved,
        }))
    }
}

/// Answers manual decisions (see
/// [`CampaignControllerBuilder::decision_prompt`](super::CampaignControllerBuilder::decision_prompt)).
pub trait DecisionPrompt: Send + Sync {
    /// Asks which of `candidates` the decision stage `stage` keeps. `file` is the decision
    /// file the controller also accepts (worth naming to the person). Returns the chosen
    /// candidates in candidate order (empty: none), or `None` when no answer can come (end of
    /// input): the controller then waits for the decision file and does not ask again.
    fn ask(&self, stage: &str, candidates: &[String], file: &Path) -> Option<Vec<String>>;
}

/// The numbered prompt of a manual decision, over any reader and writer (the terminal's are
/// stdin and stderr): lists `candidates` numbered from 1, then reads lines until one parses
/// with [`choose_revisions`], showing the error and asking again after a bad one. An empty
/// line asks again (type `none` to keep none).
///
/// # Errors
/// Read and write errors. `Ok(None)` at the end of input.
pub(super) fn prompt_choice<R: BufRead, W: Write>(
    input: &mut R,
    out: &mut W,
    stage: &str,
    candidates: &[String],
    file: &Path,
) -> std::io::Result<Option<Vec<String>>> {
    writeln!(
        out,
        "\r\n[campaign] stage {stage} needs a decision: which candidates go on?"
    )?;
    for (i, c) in candidates.iter().enumerate() {
        writeln!(out, "  {}. {c}", i + 1)?;
    }
    writeln!(
        out,
        "(or press Ctrl-D and write the decision file {} instead)",
        file.display()
    )?;
    loop {
        write!(
            out,
            "choose: numbers or ids (spaces or commas), `all` or `none`: "
        )?;
        out.flush()?;
        let mut line = String::new();
        if input.read_line(&mut line)? == 0 {
            writeln!(out)?;
            return Ok(None);
        }
        if line.trim().is_empty() {
            writeln!(out, "nothing chosen; type `none` to keep none")?;
            continue;
        }
        match choose_revisions(&line, candidates) {
            Ok(c) => return Ok(Some(c)),
            Err(e) => writeln!(out, "{e}")?,
        }
    }
}

/// [`TerminalControls::prompter`]'s prompt.
struct TerminalPrompt {
    paused: Arc<AtomicBool>,
    parked: Arc<AtomicBool>,
    saved: libc::termios,
}

impl DecisionPrompt for TerminalPrompt {
    fn ask(&self, stage: &str, candidates: &[String], file: &Path) -> Option<Vec<String>> {
        self.parked.store(false, Ordering::SeqCst);
        self.paused.store(true, Ordering::SeqCst);
        // The key reader checks the flag at least every 100 ms.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while !self.parked.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // SAFETY: reading and setting attributes of fd 0 with termios values read from it.
        let mut raw: libc::termios = unsafe { std::mem::zeroed() };
        let have_raw = unsafe { libc::tcgetattr(0, &mut raw) } == 0;
        unsafe { libc::tcsetattr(0, libc::TCSANOW, &self.saved) };
        let answer = prompt_choice(
            &mut std::io::stdin().lock(),
            &mut std::io::stderr(),
            stage,
            candidates,
            file,
        );
        if have_raw {
            // SAFETY: as above.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &raw) };
        }
        self.paused.store(false, Ordering::SeqCst);
        answer.ok().flatten()
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

fn spawn_reader(
    tx: ControlSender,
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    parked: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut state = MenuState::Closed;
        while !stop.load(Ordering::Relaxed) {
            if paused.load(Ordering::SeqCst) {
                // A prompt owns the terminal: read nothing until it is done.
                parked.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(20));
                continue;
            }
            let mut pfd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; 100 ms timeout so the stop flag is seen.
            let n = unsafe { libc::poll(&mut pfd, 1, 100) };
            if n <= 0 || paused.load(Ordering::SeqCst) {
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
pub(crate) fn choose_revisions(input: &str, available: &[String]) -> Result<Vec<String>, String> {
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
                    "{tok}: no candidate number {n}; choose 1 to {}",
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

    #[test]
    fn the_prompt_asks_again_after_a_bad_answer_and_returns_the_choice() {
        let cands: Vec<String> = ["post.f.eval:0", "post.f.eval:1", "post.f.eval:2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let file = Path::new("/c/decisions/post.f.pick.txt");
        let mut input = std::io::Cursor::new(&b"7\n\n3, post.f.eval:0\n"[..]);
        let mut out = Vec::new();
        let got = prompt_choice(&mut input, &mut out, "post.f.pick", &cands, file).unwrap();
        assert_eq!(
            got,
            Some(vec![
                "post.f.eval:0".to_string(),
                "post.f.eval:2".to_string()
            ])
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("stage post.f.pick needs a decision"),
            "{text}"
        );
        assert!(text.contains("  1. post.f.eval:0\n  2. post.f.eval:1\n  3. post.f.eval:2\n"));
        assert!(text.contains("/c/decisions/post.f.pick.txt"), "{text}");
        // The bad token's message, then the empty line's, then the prompt a third time.
        assert!(
            text.contains("7: no candidate number 7; choose 1 to 3"),
            "{text}"
        );
        assert!(text.contains("type `none` to keep none"), "{text}");
        assert_eq!(text.matches("choose: numbers or ids").count(), 3, "{text}");

        // `none` is an answer; the end of input is not.
        let mut input = std::io::Cursor::new(&b"none\n"[..]);
        let got = prompt_choice(&mut input, &mut Vec::new(), "s", &cands, file).unwrap();
        assert_eq!(got, Some(vec![]));
        let mut input = std::io::Cursor::new(&b"zz\n"[..]);
        let got = prompt_choice(&mut input, &mut Vec::new(), "s", &cands, file).unwrap();
        assert_eq!(got, None);
    }

    #[tokio::test]
    async fn off_a_terminal_the_reader_is_inert_and_sigterm_cancels() {
        // Under `cargo test` stdin is not a terminal.
        if std::io::stdin().is_terminal() {
            return;
        }
        let (c, mut rx) = TerminalControls::start().unwrap();
        assert!(!c.is_interactive());
        assert!(c.prompter().is_none(), "no prompt off a terminal");
        // SAFETY: sending SIGTERM to ourselves; the handler installed above catches it.
        unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv()).await;
        assert_eq!(got.unwrap(), Some(Control::Cancel));
        drop(c);
    }
}
