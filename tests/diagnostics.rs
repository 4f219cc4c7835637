//! Diagnostics go through `tracing`: a drain opens a `drain` span and a `run` span per run,
//! and reports decisions, claims, takeovers and failures as events; the library itself prints
//! nothing (the command line may).

use std::fmt::Debug;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use puzzletron::{CancellationToken, JobResult, Run};
use puzzletron::{Orchestrator, job};
use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// What a subscriber saw: spans (name, fields) and events (level, message, fields).
#[derive(Default)]
struct Seen {
    spans: Mutex<Vec<(String, String)>>,
    events: Mutex<Vec<(Level, String, String)>>,
    next: AtomicU64,
}

#[derive(Clone, Default)]
struct Recorder(Arc<Seen>);

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push_str(&format!("{}={value:?} ", field.name()));
        }
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut f = Fields::default();
        attrs.record(&mut f);
        self.0
            .spans
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_string(), f.rest));
        Id::from_u64(self.0.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut f = Fields::default();
        e.record(&mut f);
        self.0
            .events
            .lock()
            .unwrap()
            .push((*e.metadata().level(), f.message, f.rest));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Recorder {
    fn spans(&self, name: &str) -> Vec<String> {
        let s = self.0.spans.lock().unwrap();
        s.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }
    fn events(&self, level: Level, message: &str) -> Vec<String> {
        let e = self.0.events.lock().unwrap();
        e.iter()
            .filter(|(l, m, _)| *l == level && m.contains(message))
            .map(|(_, m, f)| format!("{m} {f}"))
            .collect()
    }
}

#[derive(Serialize, Deserialize)]
struct P {
    x: u32,
}

fn job(p: &P, run: &mut Run) -> JobResult {
    if p.x == 3 {
        return Err("x = 3 is refused".into());
    }
    run.log("y", 0, f64::from(p.x))?;
    Ok(())
}

#[test]
fn a_drain_reports_spans_and_events_through_tracing() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Recorder::default();
    tracing::subscriber::with_default(rec.clone(), || {
        let mut o = Orchestrator::builder()
            .store_root(dir.path())
            .build()
            .unwrap();
        for x in [1, 2, 3] {
            o.run(&job!(job), P { x }).unwrap();
        }
        assert!(o.drain().is_err(), "run 3 fails");
    });
    let drains = rec.spans("drain");
    assert_eq!(drains.len(), 1, "{drains:?}");
    assert!(drains[0].contains("runs=3"), "{drains:?}");
    let runs = rec.spans("run");
    assert_eq!(runs.len(), 3, "a span per run: {runs:?}");
    assert!(runs.iter().all(|r| r.contains("attempt=1")), "{runs:?}");
    let decided = rec.events(Level::DEBUG, "decided");
    assert_eq!(decided.len(), 3, "{decided:?}");
    assert!(decided[0].contains("no record"), "{decided:?}");
    assert_eq!(rec.events(Level::DEBUG, "claimed").len(), 3);
    let failed = rec.events(Level::WARN, "run failed");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].contains("x = 3 is refused"), "{failed:?}");
}

/// A run interrupted by a cancelled drain is taken over by the next drain, which says so.
#[test]
fn a_takeover_is_an_event() {
    fn stops(_: &P, run: &mut Run) -> JobResult {
        // The first time: cancel this very drain, then wait to hear of it.
        let token = TOKEN.lock().unwrap().take();
        if let Some(t) = token {
            t.cancel();
            while !run.is_cancelled() {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        Ok(())
    }
    static TOKEN: Mutex<Option<CancellationToken>> = Mutex::new(None);
    let token = CancellationToken::new();
    *TOKEN.lock().unwrap() = Some(token.clone());
    let dir = tempfile::tempdir().unwrap();
    let sweep = |root: &Path, token: Option<CancellationToken>| {
        let mut b = Orchestrator::builder().store_root(root);
        if let Some(t) = token {
            b = b.cancellation_token(t);
        }
        let mut o = b.build().unwrap();
        o.run(&job!(stops), P { x: 1 }).unwrap();
        o
    };
    let rec = Recorder::default();
    tracing::subscriber::with_default(rec.clone(), || {
        let failed = sweep(dir.path(), Some(token)).drain().unwrap_err();
        assert_eq!(failed.summary.interrupted(), 1, "{failed}");
        let mut again = sweep(dir.path(), None);
        let s = again.drain().unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(s.ran(), 1);
    });
    assert_eq!(
        rec.events(Level::INFO, "interrupted by the cancelled drain")
            .len(),
        1
    );
    let took = rec.events(Level::INFO, "took over an interrupted run");
    assert_eq!(took.len(), 1, "{took:?}");
    assert!(took[0].contains("attempt=2"), "{took:?}");
}

/// The library prints nothing itself: no `print!`/`eprint!` outside the command line
/// (`src/cli`, `src/bin`). What a caller asks to see (events, the live view) it writes where it
/// was asked to; diagnostics are `tracing` events.
#[test]
fn the_library_prints_nothing_itself() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for entry in walkdir::WalkDir::new(&src) {
        let entry = entry.unwrap();
        let path = entry.path();
        let rel = path.strip_prefix(&src).unwrap();
        if rel.starts_with("cli")
            || rel.starts_with("bin")
            || path.extension() != Some("rs".as_ref())
        {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for mac in ["println!(", "print!(", "eprintln!(", "eprint!("] {
                if let Some(i) = code.find(mac) {
                    // Inside a string literal (a test's generated source): not a print.
                    let quotes = code[..i].matches('"').count() - code[..i].matches("\\\"").count();
                    let prefixed = i > 0 && code.as_bytes()[i - 1].is_ascii_alphanumeric();
                    if quotes % 2 == 0 && !prefixed {
                        found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the library must report through `tracing`, not print:\n{}",
        found.join("\n")
    );
}
