//! [`SweepHistory`]: the runs of a sweep store and their states, and
//! [`render_sweep_report`], the sweep's HTML report (runs table, a timeline of runs coloured by
//! state, and one SVG plot per metric).

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::ReportError;
use super::svg::{colour, duration, esc, text, utc};
use crate::store::{Status, Store};

/// One run of a sweep store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SweepRun {
    /// The run's key (hex).
    pub key: String,
    /// The job's Rust path.
    pub job: String,
    /// Its parameters (canonical JSON).
    pub params: serde_json::Value,
    /// `running`, `done`, `failed`, `interrupted` (running, its owner dead) or `corrupt`
    /// (its record cannot be read: `error` names the file, what is wrong and the fix; `job`
    /// is empty and `params` null).
    pub state: String,
    /// Attempt number.
    pub attempt: u32,
    /// Start (ms since the Unix epoch).
    pub started_ms: u64,
    /// End (ms), when finished.
    pub finished_ms: Option<u64>,
    /// The failure message, for a failed run; for a corrupt one, what cannot be read and the
    /// fix.
    pub error: Option<String>,
    /// Whether a newer run of the same job and parameters exists (code changed since).
    pub superseded: bool,
}

/// Every run in a store.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SweepHistory {
    /// The store's location.
    pub location: String,
    /// Runs, by start time.
    pub runs: Vec<SweepRun>,
    /// Metric names found in done runs.
    pub metrics: Vec<String>,
}

impl SweepHistory {
    /// Reads every record of `store` (read-only).
    ///
    /// A record that cannot be parsed is a run of state `corrupt` (its error names the file and
    /// the fix); the other runs load as usual.
    ///
    /// # Errors
    /// [`ReportError::Store`] when the store cannot be read (I/O).
    pub fn load(store: &dyn Store) -> Result<Self, ReportError> {
        let keys = store.keys()?;
        let mut recs = Vec::with_capacity(keys.len());
        let mut corrupt = Vec::new();
        for (k, r) in keys
            .iter()
            .zip(crate::store::records_per_key(store, &keys)?)
        {
            match r {
                Ok(Some(r)) => recs.push(r),
                Ok(None) => {}
                Err(e) => corrupt.push(SweepRun {
                    key: k.to_string(),
                    job: String::new(),
                    params: serde_json::Value::Null,
                    state: "corrupt".to_string(),
                    attempt: 0,
                    started_ms: 0,
                    finished_ms: None,
                    error: Some(corrupt_error(store, &e)),
                    superseded: false,
                }),
            }
        }
        let lineages: Vec<_> = recs.iter().map(|r| r.lineage).collect();
        let current = store.lineages(&lineages)?;
        let mut runs = Vec::with_capacity(recs.len());
        let mut metrics = std::collections::BTreeSet::new();
        for (r, cur) in recs.iter().zip(current) {
            let state = state_of(r);
            if r.status == Status::Done
                && let Some(m) = &r.metrics
            {
                metrics.extend(m.names.iter().cloned());
            }
            runs.push(SweepRun {
                key: r.key.to_string(),
                job: r.job.clone(),
                params: r.params.clone(),
                state: state.to_string(),
                attempt: r.attempt,
                started_ms: (r.started_at * 1000.0) as u64,
                finished_ms: r.finished_at.map(|f| (f * 1000.0) as u64),
                error: r.error.as_ref().map(|e| e.message.clone()),
                superseded: cur.is_some_and(|c| c != r.key),
            });
        }
        runs.extend(corrupt);
        runs.sort_by(|a, b| a.started_ms.cmp(&b.started_ms).then(a.key.cmp(&b.key)));
        Ok(SweepHistory {
            location: store.location(),
            runs,
            metrics: metrics.into_iter().collect(),
        })
    }

    /// Runs per state, in a fixed order (`done`, `failed`, `running`, `interrupted`,
    /// `corrupt`).
    pub fn counts(&self) -> Vec<(&'static str, usize)> {
        ["done", "failed", "running", "interrupted", "corrupt"]
            .into_iter()
            .map(|s| (s, self.runs.iter().filter(|r| r.state == s).count()))
            .collect()
    }
}

/// What `puzzletron sweep status` shows of a store: runs per state, superseded runs, metric
/// names and the corrupt runs, read in chunks of [`SweepStatus::CHUNK`] records so that
/// memory stays bounded however many runs the store holds (the list of keys aside: 32 bytes
/// a run). [`SweepHistory`] keeps every run instead, for the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SweepStatus {
    /// The store's location.
    pub location: String,
    /// Runs in the store.
    pub runs: usize,
    /// Runs per state, in the order of [`SweepHistory::counts`].
    pub counts: Vec<(String, usize)>,
    /// Runs a newer run of the same job and parameters superseded.
    pub superseded: usize,
    /// Metric names found in done runs.
    pub metrics: Vec<String>,
    /// The corrupt runs: their key (hex) and what cannot be read, with the fix.
    pub corrupt: Vec<(String, String)>,
}

impl SweepStatus {
    /// Records read at a time.
    pub const CHUNK: usize = 8192;

    /// Reads every record of `store` (read-only), a chunk at a time.
    ///
    /// # Errors
    /// [`ReportError::Store`] when the store cannot be read (I/O).
    pub fn scan(store: &dyn Store) -> Result<Self, ReportError> {
        let keys = store.keys()?;
        let states = ["done", "failed", "running", "interrupted", "corrupt"];
        let mut counts = [0usize; 5];
        let mut st = SweepStatus {
            location: store.location(),
            ..SweepStatus::default()
        };
        let mut metrics = std::collections::BTreeSet::new();
        for chunk in keys.chunks(Self::CHUNK) {
            let recs = crate::store::records_in_parallel(store, chunk)?;
            let mut done = Vec::with_capacity(chunk.len());
            for (k, r) in chunk.iter().zip(recs) {
                match r {
                    Ok(Some(r)) => done.push(r),
                    Ok(None) => {}
                    Err(e) => {
                        counts[4] += 1;
                        st.corrupt.push((k.to_string(), corrupt_error(store, &e)));
                    }
                }
            }
            let lineages: Vec<_> = done.iter().map(|r| r.lineage).collect();
            let current = store.lineages(&lineages)?;
            for (r, cur) in done.iter().zip(current) {
                counts[match state_of(r) {
                    "done" => 0,
                    "failed" => 1,
                    "running" => 2,
                    _ => 3,
                }] += 1;
                if r.status == Status::Done
                    && let Some(m) = &r.metrics
                {
                    metrics.extend(m.names.iter().cloned());
                }
                st.superseded += usize::from(cur.is_some_and(|c| c != r.key));
            }
            st.runs += done.len();
        }
        st.runs += counts[4];
        st.counts = states
            .iter()
            .zip(counts)
            .map(|(s, n)| (s.to_string(), n))
            .collect();
        st.metrics = metrics.into_iter().collect();
        Ok(st)
    }
}

/// A run's state as the status and report show it.
fn state_of(r: &crate::store::JobRecord) -> &'static str {
    match r.status {
        Status::Done => "done",
        Status::Failed => "failed",
        // Proved dead from here; others (another host or PID namespace) may run.
        Status::Running => match r.owner.as_ref().map(|o| o.liveness()) {
            Some(crate::store::Liveness::Dead) => "interrupted",
            _ => "running",
        },
    }
}

/// What a corrupt run's line says: the error, and the fix.
fn corrupt_error(store: &dyn Store, e: &crate::store::StoreError) -> String {
    format!(
        "{e}; the run is left alone by drains: `puzzletron sweep repair {}` (or repair(true) on \
         the sweep) moves it aside, never deleting it, and the next drain runs it again",
        store.location()
    )
}

/// Renders a sweep report: `plots` are `(metric, svg)` pairs (e.g. from
/// [`MetricTable::to_svg`](crate::metrics::MetricTable::to_svg)), inlined as they are.
pub fn render_sweep_report(h: &SweepHistory, plots: &[(String, String)]) -> String {
    let mut o = String::new();
    let title = format!("Sweep report: {}", h.location);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{}</style></head><body><h1>{}</h1>",
        esc(&title),
        super::html::STYLE,
        esc(&title)
    );
    o.push_str("<div class=\"cards\">");
    for (s, n) in h.counts() {
        let _ = write!(o, "<div class=\"card\"><b>{n}</b><span>{s}</span></div>");
    }
    let total_ms: u64 = h
        .runs
        .iter()
        .filter_map(|r| r.finished_ms.map(|f| f.saturating_sub(r.started_ms)))
        .sum();
    let _ = write!(
        o,
        "<div class=\"card\"><b>{}</b><span>run time, all runs</span></div></div>",
        duration(total_ms)
    );
    // Timeline: one row per run.
    if !h.runs.is_empty() {
        o.push_str("<h2>Timeline</h2>");
        let t0 = h.runs.iter().map(|r| r.started_ms).min().unwrap_or(0);
        let t1 = h
            .runs
            .iter()
            .map(|r| r.finished_ms.unwrap_or(r.started_ms))
            .max()
            .unwrap_or(t0)
            .max(t0 + 1);
        let (left, pw, rh) = (260.0, 700.0, 14.0);
        let height = 24.0 + h.runs.len() as f64 * rh;
        let x = |t: u64| left + t.saturating_sub(t0) as f64 / (t1 - t0) as f64 * pw;
        let _ = write!(
            o,
            r#"<div class="scroll"><svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{height:.0}">"#,
            left + pw + 20.0
        );
        text(&mut o, left, 12.0, "small", &format!("from {}", utc(t0)));
        for (i, r) in h.runs.iter().enumerate() {
            let y = 20.0 + i as f64 * rh;
            let label = format!("{} {}", &r.key[..12.min(r.key.len())], r.params);
            let label: String = label.chars().take(44).collect();
            text(&mut o, 4.0, y + rh - 4.0, "small", &label);
            let end = r.finished_ms.unwrap_or(t1);
            let fill = colour(match r.state.as_str() {
                "done" => "succeeded",
                "running" => "live",
                s => s,
            });
            let _ = write!(
                o,
                r#"<rect class="bar" data-key="{}" data-state="{}" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{fill}"><title>{} {}: {}, {}</title></rect>"#,
                esc(&r.key),
                esc(&r.state),
                x(r.started_ms),
                y + 1.0,
                (x(end) - x(r.started_ms)).max(1.0),
                rh - 2.0,
                esc(&r.job),
                esc(&r.params.to_string()),
                esc(&r.state),
                duration(end.saturating_sub(r.started_ms)),
            );
        }
        o.push_str("</svg></div>");
    }
    o.push_str("<h2>Runs</h2><table id=\"runs\"><tr><th>key</th><th>job</th><th>params</th><th>state</th><th>attempt</th><th>started</th><th>duration</th><th>error</th></tr>");
    for r in &h.runs {
        let _ = write!(
            o,
            "<tr><td class=\"mono\">{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&r.key[..16.min(r.key.len())]),
            esc(&r.job),
            esc(&r.params.to_string()),
            esc(&r.state),
            if r.superseded { " (superseded)" } else { "" },
            r.attempt,
            utc(r.started_ms),
            r.finished_ms
                .map(|f| duration(f.saturating_sub(r.started_ms)))
                .unwrap_or_else(|| "-".into()),
            esc(r.error.as_deref().unwrap_or("")),
        );
    }
    o.push_str("</table>");
    if !plots.is_empty() {
        o.push_str("<h2>Metrics</h2>");
        for (name, svg) in plots {
            let _ = write!(o, "<h3>{}</h3><div class=\"scroll\">", esc(name));
            // The SVG comes from our own plotter; strip an XML declaration if any.
            let body = svg
                .strip_prefix("<?xml")
                .and_then(|s| s.split_once("?>").map(|x| x.1))
                .unwrap_or(svg);
            o.push_str(body);
            o.push_str("</div>");
        }
    }
    o.push_str("</body></html>\n");
    o
}
