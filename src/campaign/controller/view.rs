//! The live view: one progress line per stage (done / running / queued / failed, elapsed),
//! drawn with indicatif on a terminal (feature `progress`), as plain log lines otherwise.

use std::io::IsTerminal;

use super::report::{CampaignReport, StageProgress};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewMode {
    /// Nothing.
    Off,
    /// A plain line per stage to stderr when something changed, at most every `every_s`
    /// seconds.
    Plain {
        /// Least seconds between two prints.
        every_s: u64,
    },
    /// Bars on a terminal (feature `progress`), else [`ViewMode::Plain`] every 10 s.
    Auto,
}

/// One stage as text: `score      running   3/4 done  1 running  0 queued  0 failed  12.3 s`.
#[cfg(feature = "progress")]
pub(super) fn progress_line(p: &StageProgress, now_ms: Option<u64>) -> String {
    progress_line_in(p, now_ms, 16, 8)
}

/// [`progress_line`] of every stage, the columns as wide as the longest stage id and state,
/// so long names (`post.runtime-075.quality_benchmarks`) keep the table aligned.
pub(super) fn progress_lines(ps: &[StageProgress], now_ms: Option<u64>) -> Vec<String> {
    let w = ps
        .iter()
        .map(|p| p.stage.chars().count())
        .max()
        .unwrap_or(0)
        .max(16);
    let sw = ps
        .iter()
        .map(|p| state_of(p).chars().count())
        .max()
        .unwrap_or(0)
        .max(8);
    ps.iter()
        .map(|p| progress_line_in(p, now_ms, w, sw))
        .collect()
}

fn state_of(p: &StageProgress) -> &str {
    if p.state.is_empty() {
        &p.status
    } else {
        &p.state
    }
}

fn progress_line_in(p: &StageProgress, now_ms: Option<u64>, w: usize, sw: usize) -> String {
    let elapsed = match (p.started_ms, p.ended_ms.or(now_ms)) {
        (Some(s), Some(e)) => format!("  {:.1} s", e.saturating_sub(s) as f64 / 1000.0),
        _ => String::new(),
    };
    format!(
        "{:<w$} {:<sw$} {}/{} done  {} running  {} queued  {} failed{}",
        p.stage,
        state_of(p),
        p.done,
        p.total,
        p.running,
        p.queued,
        p.failed,
        elapsed
    )
}

/// A line of the view on stderr: the view is output its caller asked for (a [`ViewMode`]
/// other than `Off`), not a diagnostic (those go through `tracing`).
fn show(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

pub(crate) struct LiveView {
    mode: ViewMode,
    last: Vec<StageProgress>,
    last_print_ms: u64,
    /// A problem shown beside the progress (the scheduler is unreachable), until cleared.
    alert: Option<String>,
    #[cfg(feature = "progress")]
    bars: Option<(indicatif::MultiProgress, Vec<indicatif::ProgressBar>)>,
    /// Draw the bars nowhere (tests read their state instead).
    #[cfg(feature = "progress")]
    hidden: bool,
}

impl LiveView {
    pub(super) fn new(mode: ViewMode) -> Self {
        let mode = match mode {
            ViewMode::Auto if !(cfg!(feature = "progress") && std::io::stderr().is_terminal()) => {
                ViewMode::Plain { every_s: 10 }
            }
            m => m,
        };
        Self {
            mode,
            last: Vec::new(),
            last_print_ms: 0,
            alert: None,
            #[cfg(feature = "progress")]
            bars: None,
            #[cfg(feature = "progress")]
            hidden: false,
        }
    }

    /// Bars drawn to a hidden target, whatever stderr is.
    #[cfg(all(test, feature = "progress"))]
    fn hidden_bars() -> Self {
        let mut v = Self::new(ViewMode::Off);
        v.mode = ViewMode::Auto;
        v.hidden = true;
        v
    }

    /// Shows (or with `None` clears) a problem beside the progress: printed at once in plain
    /// mode, appended to the first bar's line on a terminal.
    pub(super) fn scheduler_error(&mut self, alert: Option<String>) {
        if alert == self.alert {
            return;
        }
        if let ViewMode::Plain { .. } = self.mode {
            match &alert {
                Some(a) => show(&format!("[campaign] {a}")),
                None => show("[campaign] scheduler reachable again"),
            }
        }
        self.alert = alert;
    }

    /// The problem shown now, if any.
    #[cfg(all(test, feature = "progress"))]
    pub(crate) fn alert(&self) -> Option<&str> {
        self.alert.as_deref()
    }

    pub(super) fn update(&mut self, progress: &[StageProgress], now_ms: u64) {
        match self.mode {
            ViewMode::Off => {}
            ViewMode::Plain { every_s } => {
                let changed = progress != self.last.as_slice();
                if changed && now_ms.saturating_sub(self.last_print_ms) >= every_s * 1000 {
                    for line in progress_lines(progress, Some(now_ms)) {
                        show(&format!("[campaign] {line}"));
                    }
                    self.last_print_ms = now_ms;
                    self.last = progress.to_vec();
                }
            }
            ViewMode::Auto => self.draw(progress, now_ms),
        }
    }

    #[cfg(feature = "progress")]
    fn draw(&mut self, progress: &[StageProgress], now_ms: u64) {
        use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
        // One bar per stage; a plan with other stages (a new revision) gets new bars.
        let same_stages = self.bars.as_ref().is_some_and(|(_, b)| {
            b.len() == progress.len() && b.iter().zip(progress).all(|(b, p)| b.prefix() == p.stage)
        });
        if !same_stages && let Some((_, old)) = self.bars.take() {
            for b in old {
                b.finish_and_clear();
            }
        }
        let hidden = self.hidden;
        let (mp, bars) = self.bars.get_or_insert_with(|| {
            let mp = if hidden {
                MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
            } else {
                MultiProgress::new()
            };
            let style = ProgressStyle::with_template("{prefix:<16} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            let bars = progress
                .iter()
                .map(|p| {
                    let b = mp.add(ProgressBar::new(p.total as u64));
                    b.set_style(style.clone());
                    b.set_prefix(p.stage.clone());
                    b
                })
                .collect();
            (mp, bars)
        });
        let _ = mp;
        for (i, (b, p)) in bars.iter().zip(progress).enumerate() {
            b.set_length(p.total as u64);
            b.set_position(p.done as u64);
            let line = progress_line(p, Some(now_ms));
            let mut msg = line[p.stage.len().min(16)..].trim_start().to_string();
            if i == 0
                && let Some(a) = &self.alert
            {
                msg.push_str(&format!("  [{a}]"));
            }
            b.set_message(msg);
        }
    }

    #[cfg(not(feature = "progress"))]
    fn draw(&mut self, _progress: &[StageProgress], _now_ms: u64) {}

    /// Runs `f` (a prompt) with the progress bars hidden, then draws them again.
    pub(super) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(feature = "progress")]
        if let Some((mp, _)) = &self.bars {
            return mp.suspend(f);
        }
        f()
    }

    pub(super) fn finish(&mut self, report: &CampaignReport) {
        #[cfg(feature = "progress")]
        if let Some((_, bars)) = self.bars.take() {
            for b in bars {
                b.finish();
            }
        }
        if self.mode != ViewMode::Off {
            show(&report.to_string());
        }
    }
}

#[cfg(all(test, feature = "progress"))]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_stay_aligned_with_long_stage_names_and_states() {
        let mut long = stage("post.runtime-075.quality_benchmarks", 4, 1, 0);
        long.state = "backing off until 13:00:05 UTC (attempt 2, oom)".into();
        let lines = progress_lines(
            &[stage("convert", 1, 1, 0), long, stage("mip", 2, 0, 1)],
            None,
        );
        // The counts column starts at the same offset on every line.
        let starts: Vec<usize> = lines
            .iter()
            .map(|l| l.match_indices('/').next().unwrap().0 - 1)
            .collect();
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{lines:#?}");
        assert!(lines[1].contains("backing off until 13:00:05 UTC (attempt 2, oom)"));
    }

    fn stage(id: &str, total: usize, done: usize, running: usize) -> StageProgress {
        StageProgress {
            stage: id.into(),
            status: if done == total { "done" } else { "running" }.into(),
            state: String::new(),
            total,
            done,
            running,
            queued: total - done - running,
            failed: 0,
            started_ms: Some(1_000),
            ended_ms: None,
        }
    }

    #[test]
    fn bars_follow_each_stage_and_are_rebuilt_for_new_stages() {
        let mut v = LiveView::hidden_bars();
        v.update(&[stage("prepare", 1, 0, 1), stage("score", 5, 0, 0)], 2_000);
        v.update(&[stage("prepare", 1, 1, 0), stage("score", 5, 2, 3)], 3_500);
        let (_, bars) = v.bars.as_ref().expect("bars drawn");
        let state: Vec<_> = bars
            .iter()
            .map(|b| (b.prefix(), b.position(), b.length()))
            .collect();
        assert_eq!(
            state,
            vec![
                ("prepare".to_string(), 1, Some(1)),
                ("score".to_string(), 2, Some(5))
            ]
        );
        assert_eq!(
            bars[1].message(),
            "running  2/5 done  3 running  0 queued  0 failed  2.5 s"
        );
        // A new revision with another stage list: one bar per new stage.
        v.update(&[stage("evaluate", 2, 0, 2)], 4_000);
        let (_, bars) = v.bars.as_ref().expect("bars drawn");
        assert_eq!(bars.len(), 1);
        assert_eq!(
            (bars[0].prefix(), bars[0].length()),
            ("evaluate".into(), Some(2))
        );
        // An unreachable scheduler is shown on the first bar until it answers again.
        v.scheduler_error(Some("scheduler unreachable (1 in a row): timed out".into()));
        v.update(&[stage("evaluate", 2, 0, 2)], 4_500);
        let (_, bars) = v.bars.as_ref().expect("bars drawn");
        assert!(
            bars[0]
                .message()
                .ends_with("  [scheduler unreachable (1 in a row): timed out]"),
            "{}",
            bars[0].message()
        );
        v.scheduler_error(None);
        v.update(&[stage("evaluate", 2, 0, 2)], 5_000);
        let (_, bars) = v.bars.as_ref().expect("bars drawn");
        assert!(!bars[0].message().contains("unreachable"));
        assert_eq!(v.alert(), None);
        v.finish(&CampaignReport::default());
        assert!(v.bars.is_none());
    }
}
