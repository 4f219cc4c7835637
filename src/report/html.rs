//! [`render_campaign_report`]: a [`CampaignHistory`] as one self-contained HTML file.
//!
//! Inline CSS and SVG only: no script, no external resource, so it opens from a mail
//! attachment or an air-gapped cluster. Sections: summary, stage DAG (boxes coloured by status),
//! timeline (one bar per attempt on its node's GPU rows, from start to end, with its queue wait
//! from submit to start drawn thin before it, coloured by outcome, a line from each attempt to
//! its retry), GPU-hours per stage and per attempt, wasted GPU-hours by failure class, failures
//! with class, evidence and log path.
//!
//! Stable hooks for tools and tests: the timeline is `<svg id="timeline">` with one
//! `<rect class="bar" data-attempt=… data-outcome=… data-stage=…>` per attempt, `<rect
//! class="wait">` per queue wait and `<line class="retry" data-from=… data-to=…>` per retry;
//! the DAG is `<svg id="dag">` with `<g class="stage" data-stage=… data-status=…>`; the waste
//! table is `<table id="waste">` with `data-class`/`data-gpu-hours` on each row.
//!
//! Scale: from [`AGGREGATE_ATTEMPTS`] attempts on, the timeline is aggregated (`<svg
//! id="timeline" data-aggregated="true">`: one lane per stage, [`AGGREGATE_SLICES`] time
//! slices, a stacked `<rect class="agg" data-outcome=…>` per outcome and slice); above
//! [`INLINE_ATTEMPTS`] attempts the attempts table shows a selection and the full table is the
//! CSV of [`ReportFiles::attempts_csv`], written beside the report. The page ends with
//! `<footer id="report-end">`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use super::history::{AttemptHistory, AttemptOutcome, CampaignHistory};
use super::svg::{colour, duration, esc, gh, text, utc};

/// Shared page style.
pub(crate) const STYLE: &str = r#"
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;font-size:13px}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:120px}.card b{display:block;font-size:20px}
.card span{font-size:12px;color:#666}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.n{text-align:right;font-variant-numeric:tabular-nums}.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
svg text{font-family:system-ui,sans-serif;font-size:11px;fill:#222}svg text.small{font-size:10px;fill:#555}
svg text.lbl{font-size:12px;font-weight:600}svg text.barlbl{font-size:10px;fill:#fff;pointer-events:none}.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px;border-radius:2px}
rect.wait{opacity:.45}line.retry{stroke:#444;stroke-width:1;stroke-dasharray:3 2}
.scroll{overflow-x:auto;max-width:100%}
"#;

const OUTCOMES: [AttemptOutcome; 7] = [
    AttemptOutcome::Succeeded,
    AttemptOutcome::Failed,
    AttemptOutcome::Cancelled,
    AttemptOutcome::Superseded,
    AttemptOutcome::Live,
    AttemptOutcome::SubmitFailed,
    AttemptOutcome::Intent,
];

/// From this many attempts on, the timeline is aggregated: one lane per stage cut into
/// [`AGGREGATE_SLICES`] time slices, instead of one bar per attempt (a 100k-bar SVG is tens of
/// MB and takes a browser many seconds to lay out).
pub const AGGREGATE_ATTEMPTS: usize = 10_000;

/// Time slices of an aggregated timeline (3 px each on the 900 px plot).
pub const AGGREGATE_SLICES: usize = 300;

/// Up to this many attempts the attempts table is in the report in full. Above, the report
/// shows the first and last `TABLE_ENDS`, up to `TABLE_FAILED` failed attempts between
/// them, and links to the full table, [`ReportFiles::attempts_csv`].
pub const INLINE_ATTEMPTS: usize = 2_000;

/// Attempts shown from each end of a table of more than [`INLINE_ATTEMPTS`] attempts.
pub(super) const TABLE_ENDS: usize = 50;

/// Failed attempts shown, at most, between the two ends of a table of more than
/// [`INLINE_ATTEMPTS`] attempts.
pub(super) const TABLE_FAILED: usize = 200;

/// A rendered campaign report: the HTML and, when the campaign has more than
/// [`INLINE_ATTEMPTS`] attempts, its full attempts table as CSV.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReportFiles {
    /// The report page.
    pub html: String,
    /// The full attempts table (RFC 4180 CSV with a header row, one row per attempt), to be
    /// written beside the report as [`attempts_csv_name`] of its file name: the page links to
    /// that name. `None` when the page holds every attempt.
    pub attempts_csv: Option<String>,
}

/// The file name of the attempts CSV beside a report named `report_file_name`:
/// `report.html` gives `report.html.attempts.csv`.
pub fn attempts_csv_name(report_file_name: &str) -> String {
    format!("{report_file_name}.attempts.csv")
}

/// Renders the report page alone, as if written to `report.html`. Pure: the same history gives
/// the same bytes. Above [`INLINE_ATTEMPTS`] attempts the page links to
/// `report.html.attempts.csv`: use [`render_campaign_report_files`] to get that file too.
pub fn render_campaign_report(h: &CampaignHistory) -> String {
    render_html(h, "report.html")
}

/// Renders the report to be written as a file named `report_file_name` (e.g. `report.html`),
/// and, above [`INLINE_ATTEMPTS`] attempts, the full attempts table the page links to, to be
/// written beside it as [`attempts_csv_name`]`(report_file_name)`. Pure.
pub fn render_campaign_report_files(h: &CampaignHistory, report_file_name: &str) -> ReportFiles {
    ReportFiles {
        html: render_html(h, report_file_name),
        attempts_csv: (h.attempts.len() > INLINE_ATTEMPTS).then(|| attempts_csv(h)),
    }
}

fn render_html(h: &CampaignHistory, report_file_name: &str) -> String {
    // Bytes per drawn attempt (bar, table row) below the thresholds; bounded above them.
    let mut o = String::with_capacity(16_384 + h.attempts.len().min(AGGREGATE_ATTEMPTS) * 400);
    let title = format!("Campaign report: {}", h.dir.display());
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        esc(&title)
    );
    let _ = write!(o, "<h1>{}</h1>", esc(&title));
    let _ = write!(
        o,
        "<div class=\"meta\">experiment {} · runner {} · revision {} · nonce (cancel tag) <span class=\"mono\">{}</span> · {} journal records · as of {}<br>lease: {}</div>",
        esc(h.experiment.as_deref().unwrap_or("?")),
        esc(h.runner.as_deref().unwrap_or("?")),
        h.revision,
        esc(h.nonce.as_deref().unwrap_or("?")),
        h.records,
        utc(h.as_of_ms),
        esc(&h.lease.describe()),
    );
    for p in &h.problems {
        let _ = write!(
            o,
            "<div class=\"meta problem\" style=\"color:#b00\"><b>not read fully:</b> {}</div>",
            esc(p)
        );
    }
    if let Some(c) = &h.cancelled {
        let _ = write!(
            o,
            "<div class=\"meta\" id=\"cancelled\"><b>cancelled</b> by {} at {}; {} attempt(s) cancelled{}</div>",
            esc(&c.by),
            utc(c.at_ms),
            c.attempts.len(),
            if c.attempts.is_empty() {
                String::new()
            } else {
                format!(
                    ": <span class=\"mono\">{}</span>",
                    esc(&c.attempts.join(", "))
                )
            }
        );
    }
    summary(&mut o, h);
    o.push_str("<h2>Stages</h2>");
    dag(&mut o, h);
    stage_table(&mut o, h);
    o.push_str("<h2>Timeline</h2>");
    if h.attempts.len() >= AGGREGATE_ATTEMPTS {
        timeline_aggregated(&mut o, h, report_file_name);
    } else {
        timeline(&mut o, h);
    }
    o.push_str("<h2>Wasted GPU-hours by failure class</h2>");
    waste_table(&mut o, h);
    o.push_str("<h2>Failures</h2>");
    failures(&mut o, h);
    if !h.excluded_nodes.is_empty() {
        o.push_str(
            "<h2>Excluded nodes</h2><table><tr><th>node</th><th>since</th><th>why</th></tr>",
        );
        for (at, node, why) in &h.excluded_nodes {
            let _ = write!(
                o,
                "<tr data-node=\"{}\"><td class=\"mono\">{}</td><td>{}</td><td>{}</td></tr>",
                esc(node),
                esc(node),
                utc(*at),
                esc(why)
            );
        }
        o.push_str("</table>");
    }
    o.push_str("<h2>Attempts</h2>");
    attempts_table(&mut o, h, report_file_name);
    let _ = write!(
        o,
        "<footer class=\"meta\" id=\"report-end\" style=\"margin-top:24px\">end of the report · {} attempts · {} journal records</footer>",
        h.attempts.len(),
        h.records
    );
    o.push_str("</body></html>\n");
    o
}

fn summary(o: &mut String, h: &CampaignHistory) {
    let done = h
        .stages
        .iter()
        .filter(|s| s.status == super::StageStatus::Done)
        .count();
    let failed = h
        .stages
        .iter()
        .filter(|s| s.status == super::StageStatus::Failed)
        .count();
    let span = match (h.first_ms, h.last_ms) {
        (Some(a), Some(b)) => duration(b.saturating_sub(a)),
        _ => "-".into(),
    };
    let cards = [
        (format!("{done}/{}", h.stages.len()), "stages done"),
        (failed.to_string(), "stages failed"),
        (h.attempts.len().to_string(), "attempts"),
        (h.live().count().to_string(), "live now"),
        (gh(h.gpu_hours()), "GPU-hours"),
        (gh(h.wasted_gpu_hours()), "wasted GPU-hours"),
        (span, "journal span"),
    ];
    o.push_str("<div class=\"cards\">");
    for (v, l) in cards {
        let _ = write!(
            o,
            "<div class=\"card\"><b>{}</b><span>{l}</span></div>",
            esc(&v)
        );
    }
    o.push_str("</div>");
}

fn dag(o: &mut String, h: &CampaignHistory) {
    // Level = longest path from a root; stages are in topological order in the plan.
    let idx: HashMap<&str, usize> = h
        .stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let mut level = vec![0usize; h.stages.len()];
    for (i, s) in h.stages.iter().enumerate() {
        for p in &s.parents {
            if let Some(&j) = idx.get(p.as_str())
                && j < i
            {
                level[i] = level[i].max(level[j] + 1);
            }
        }
    }
    let mut row_in_level: BTreeMap<usize, usize> = BTreeMap::new();
    let mut pos = Vec::with_capacity(h.stages.len());
    for &l in &level {
        let r = row_in_level.entry(l).or_insert(0);
        pos.push((l, *r));
        *r += 1;
    }
    // Boxes as wide as the longest full label (12 px bold) or state line (10 px): never
    // truncated, never shrunk (the graph scrolls sideways instead).
    let longest = h
        .stages
        .iter()
        .map(|s| {
            let label = s.id.chars().count() as f64 * 7.6;
            let state = (s.state.chars().count() + 12) as f64 * 6.0;
            label.max(state)
        })
        .fold(0.0f64, f64::max);
    let (bw, bh, gx, gy) = ((longest + 16.0).max(150.0).ceil(), 40.0, 40.0, 14.0);
    let cols = level.iter().max().map_or(0, |m| m + 1);
    let rows = row_in_level.values().max().copied().unwrap_or(0);
    let w = 20.0 + cols as f64 * (bw + gx);
    let ht = 20.0 + rows as f64 * (bh + gy);
    let xy = |(l, r): (usize, usize)| (10.0 + l as f64 * (bw + gx), 10.0 + r as f64 * (bh + gy));
    let _ = write!(
        o,
        r#"<div class="scroll"><svg id="dag" xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{ht:.0}" viewBox="0 0 {w:.0} {ht:.0}">"#
    );
    for (i, s) in h.stages.iter().enumerate() {
        let (x2, y2) = xy(pos[i]);
        for p in &s.parents {
            if let Some(&j) = idx.get(p.as_str()) {
                let (x1, y1) = xy(pos[j]);
                let (ys, yt) = (y1 + bh / 2.0, y2 + bh / 2.0);
                if pos[i].0 == pos[j].0 + 1 {
                    // Next column: a curve across the gap between the two columns.
                    let _ = write!(
                        o,
                        r##"<path class="edge" d="M{:.1} {ys:.1} C{:.1} {ys:.1} {:.1} {yt:.1} {x2:.1} {yt:.1}" fill="none" stroke="#999" stroke-width="1.2"/>"##,
                        x1 + bw,
                        x1 + bw + gx / 2.0,
                        x2 - gx / 2.0,
                    );
                } else {
                    // Across columns: down the gap after the source's column, along the gap
                    // between rows above the target's row (no box sits on either), down the
                    // gap before the target's column: never through a box.
                    let (ga, gb) = (x1 + bw + gx / 2.0, x2 - gx / 2.0);
                    let yc = y2 - gy / 2.0;
                    let _ = write!(
                        o,
                        r##"<path class="edge" d="M{:.1} {ys:.1} H{ga:.1} V{yc:.1} H{gb:.1} V{yt:.1} H{x2:.1}" fill="none" stroke="#999" stroke-width="1.2"/>"##,
                        x1 + bw,
                    );
                }
            }
        }
    }
    for (i, s) in h.stages.iter().enumerate() {
        let (x, y) = xy(pos[i]);
        let st = s.status.as_str();
        let _ = write!(
            o,
            r##"<g class="stage" data-stage="{}" data-status="{st}" data-state="{}"><title>{}: {}, {}/{} units done, {} GPU-h</title><rect x="{x:.1}" y="{y:.1}" width="{bw}" height="{bh}" rx="5" fill="{}" fill-opacity="0.25" stroke="{}" stroke-width="1.5"/>"##,
            esc(&s.id),
            esc(&s.state),
            esc(&s.id),
            esc(&s.state),
            s.done_units,
            s.units,
            gh(s.gpu_hours),
            colour(st),
            colour(st)
        );
        text(o, x + 6.0, y + 16.0, "lbl", &s.id);
        text(
            o,
            x + 6.0,
            y + 32.0,
            "small",
            &format!("{} · {}/{}", s.state, s.done_units, s.units),
        );
        o.push_str("</g>");
    }
    o.push_str("</svg></div>");
}

fn stage_table(o: &mut String, h: &CampaignHistory) {
    o.push_str("<table id=\"stages\"><tr><th>stage</th><th>status</th><th>units done</th><th>live</th><th>failed</th><th>attempts</th><th>GPU-hours</th><th>wasted GPU-hours</th><th>reason</th></tr>");
    let mut attempts: HashMap<&str, usize> = HashMap::new();
    for a in &h.attempts {
        *attempts.entry(a.stage.as_str()).or_insert(0) += 1;
    }
    for s in &h.stages {
        let _ = write!(
            o,
            "<tr data-stage=\"{}\" data-gpu-hours=\"{}\"><td>{}</td><td class=\"state\" data-status=\"{}\" style=\"color:{}\">{}</td><td class=\"n\">{}/{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
            esc(&s.id),
            s.gpu_hours,
            esc(&s.id),
            s.status.as_str(),
            colour(s.status.as_str()),
            esc(&s.state),
            s.done_units,
            s.units,
            s.live_units,
            s.failed_units,
            attempts.get(s.id.as_str()).copied().unwrap_or(0),
            gh(s.gpu_hours),
            gh(s.wasted_gpu_hours),
            esc(s.reason.as_deref().unwrap_or("")),
        );
    }
    o.push_str("</table>");
}

/// Row layout of the timeline: per node, GPU lanes handed out first-fit by start time.
struct Layout {
    /// (node, lanes) in order.
    groups: Vec<(String, usize)>,
    /// Per attempt: (first row overall, rows spanned), or None when not drawn.
    place: Vec<Option<(usize, usize)>>,
}

fn layout(h: &CampaignHistory) -> Layout {
    let mut by_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, a) in h.attempts.iter().enumerate() {
        if matches!(
            a.outcome,
            AttemptOutcome::Intent | AttemptOutcome::SubmitFailed
        ) {
            continue;
        }
        let node = a.nodes.clone().unwrap_or_else(|| "node unknown".into());
        by_node.entry(node).or_default().push(i);
    }
    let mut place = vec![None; h.attempts.len()];
    let mut groups = Vec::new();
    let mut base = 0;
    for (node, mut ids) in by_node {
        ids.sort_by_key(|&i| (h.attempts[i].run_start_ms(), i));
        let mut free_at: Vec<u64> = Vec::new();
        for i in ids {
            let a = &h.attempts[i];
            let need = a.gpus.max(1) as usize;
            // Lanes hold the whole bar, queue wait included, so bars never overlap.
            let (s, e) = (a.submitted_ms.min(a.run_start_ms()), end_of(a, h.as_of_ms));
            let mut lane = None;
            let mut k = 0;
            while k + need <= free_at.len() {
                if free_at[k..k + need].iter().all(|&f| f <= s) {
                    lane = Some(k);
                    break;
                }
                k += 1;
            }
            let lane = lane.unwrap_or_else(|| {
                // Reuse the free lanes at the end, then add lanes.
                let mut start = free_at.len();
                while start > 0 && free_at[start - 1] <= s {
                    start -= 1;
                }
                start
            });
            if free_at.len() < lane + need {
                free_at.resize(lane + need, 0);
            }
            for f in &mut free_at[lane..lane + need] {
                *f = e;
            }
            place[i] = Some((base + lane, need));
        }
        groups.push((node, free_at.len()));
        base += free_at.len();
    }
    Layout { groups, place }
}

fn end_of(a: &AttemptHistory, as_of_ms: u64) -> u64 {
    a.ended_ms.unwrap_or(as_of_ms).max(a.run_start_ms())
}

fn timeline(o: &mut String, h: &CampaignHistory) {
    let lay = layout(h);
    let rows: usize = lay.groups.iter().map(|g| g.1).sum();
    if rows == 0 {
        o.push_str("<p>No attempt was submitted yet.</p>");
        return;
    }
    let t0 = h
        .attempts
        .iter()
        .zip(&lay.place)
        .filter(|(_, p)| p.is_some())
        .map(|(a, _)| a.submitted_ms.min(a.run_start_ms()))
        .min()
        .unwrap_or(0);
    let t1 = h
        .attempts
        .iter()
        .zip(&lay.place)
        .filter(|(_, p)| p.is_some())
        .map(|(a, _)| end_of(a, h.as_of_ms))
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let (left, plot_w, row_h, top) = (170.0, 900.0, 14.0, 24.0);
    let gap = 6.0;
    let height = top + rows as f64 * row_h + lay.groups.len() as f64 * gap + 10.0;
    // Room on the right for the last axis label (`+12h 34m`), so it is never clipped.
    let width = left + plot_w + 80.0;
    let x = |t: u64| left + (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * plot_w;
    // Row y, with a gap between node groups.
    let mut group_of_row = Vec::with_capacity(rows);
    for (g, (_, n)) in lay.groups.iter().enumerate() {
        group_of_row.extend(std::iter::repeat_n(g, *n));
    }
    let y = |row: usize| top + row as f64 * row_h + group_of_row[row] as f64 * gap;
    legend(
        o,
        &OUTCOMES,
        "<span>thin bar before an attempt: queue wait (submit to start); dashed line: retry</span>",
    );
    let _ = write!(
        o,
        r#"<div class="scroll"><svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" data-t0="{t0}" data-t1="{t1}" data-left="{left}" data-plot-width="{plot_w}">"#
    );
    // Axis: 6 ticks.
    axis_ticks(o, t0, t1, &x, top, height);
    // Row labels.
    let mut row = 0;
    for (node, n) in &lay.groups {
        for lane in 0..*n {
            text(
                o,
                4.0,
                y(row) + row_h - 4.0,
                "small",
                &format!("{node} · GPU {lane}"),
            );
            row += 1;
        }
    }
    // Bars.
    for (i, a) in h.attempts.iter().enumerate() {
        let Some((r, span)) = lay.place[i] else {
            continue;
        };
        let (yy, hh) = (y(r) + 1.0, span as f64 * row_h - 2.0);
        let start = a.run_start_ms();
        if a.started_ms.is_some() && start > a.submitted_ms {
            let _ = write!(
                o,
                r#"<rect class="wait" data-attempt="{}" x="{:.2}" y="{:.2}" width="{:.2}" height="{:.2}" fill="{}"/>"#,
                esc(&a.attempt_id),
                x(a.submitted_ms),
                yy + hh * 0.35,
                (x(start) - x(a.submitted_ms)).max(0.5),
                hh * 0.3,
                colour(a.outcome.as_str())
            );
        }
        let end = end_of(a, h.as_of_ms);
        let oc = a.outcome.as_str();
        let _ = write!(
            o,
            r##"<rect class="bar" data-attempt="{id}" data-stage="{st}" data-outcome="{oc}" data-gpus="{g}" x="{:.2}" y="{yy:.2}" width="{:.2}" height="{hh:.2}" rx="2" fill="{}" stroke="#fff" stroke-width="0.5"><title>{id} ({unit}, attempt {n}): {oc}{cls}; {g} GPUs, queued {q}, ran {run}</title></rect>"##,
            x(start),
            (x(end) - x(start)).max(1.0),
            colour(oc),
            id = esc(&a.attempt_id),
            st = esc(&a.stage),
            unit = esc(&a.unit),
            n = a.attempt,
            g = a.gpus,
            cls = a.class.map(|c| format!(" ({c})")).unwrap_or_default(),
            q = duration(start.saturating_sub(a.submitted_ms)),
            run = duration(end.saturating_sub(start)),
        );
        // The stage's name on the bar where it fits (10 px, about 6 px a character).
        let bw = x(end) - x(start);
        if hh >= 10.0 && bw >= a.stage.chars().count() as f64 * 6.2 + 6.0 {
            let _ = write!(
                o,
                r##"<text class="barlbl" x="{:.2}" y="{:.2}">{}</text>"##,
                x(start) + 3.0,
                yy + hh / 2.0 + 3.5,
                esc(&a.stage)
            );
        }
    }
    // Retry links: from the end of an attempt to the start of the next attempt of its unit.
    for (i, a) in h.attempts.iter().enumerate() {
        let (Some(p), Some((r, span))) = (a.retry_of, lay.place[i]) else {
            continue;
        };
        let Some((pr, pspan)) = lay.place[p] else {
            continue;
        };
        let prev = &h.attempts[p];
        let _ = write!(
            o,
            r#"<line class="retry" data-from="{}" data-to="{}" x1="{:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}"/>"#,
            esc(&prev.attempt_id),
            esc(&a.attempt_id),
            x(end_of(prev, h.as_of_ms)),
            y(pr) + pspan as f64 * row_h / 2.0,
            x(a.submitted_ms.min(a.run_start_ms())),
            y(r) + span as f64 * row_h / 2.0,
        );
    }
    o.push_str("</svg></div>");
    if h.attempts
        .iter()
        .any(|a| a.start_estimated && a.run_ms(h.as_of_ms) > 0)
    {
        o.push_str("<p class=\"meta\">Some attempts have no recorded start: their bars start at the submit time and their GPU-hours include the queue wait.</p>");
    }
}

fn waste_table(o: &mut String, h: &CampaignHistory) {
    let w = h.waste_by_class();
    if w.is_empty() {
        o.push_str("<p>No GPU time was wasted.</p>");
    }
    o.push_str(
        "<table id=\"waste\"><tr><th>class</th><th>wasted GPU-hours</th><th>attempts</th></tr>",
    );
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for a in &h.attempts {
        for (k, _) in a.waste(h.as_of_ms) {
            *counts.entry(k).or_insert(0) += 1;
        }
    }
    for (k, v) in &w {
        let _ = write!(
            o,
            "<tr data-class=\"{}\" data-gpu-hours=\"{v}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(k),
            esc(k),
            gh(*v),
            counts.get(k).copied().unwrap_or(0)
        );
    }
    let total = h.wasted_gpu_hours();
    let _ = write!(
        o,
        "<tr data-class=\"total\" data-gpu-hours=\"{total}\"><th>total</th><th class=\"n\">{}</th><th>of {} GPU-hours</th></tr></table>",
        gh(total),
        gh(h.gpu_hours())
    );
}

fn failures(o: &mut String, h: &CampaignHistory) {
    let mut any = false;
    for s in h.stages.iter().filter(|s| s.reason.is_some()) {
        any = true;
        let _ = write!(
            o,
            "<p><b>stage {} failed</b>: {}</p>",
            esc(&s.id),
            esc(s.reason.as_deref().unwrap_or(""))
        );
    }
    let mut rows = String::new();
    // At most 500 rows: a campaign with 100k failures needs the table of classes, not a list.
    for a in h.failures().take(500) {
        any = true;
        let _ = write!(
            rows,
            "<tr data-attempt=\"{}\"><td class=\"mono\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td></tr>",
            esc(&a.attempt_id),
            esc(&a.attempt_id),
            esc(&a.unit),
            a.outcome.as_str(),
            a.class.map_or("-", |c| c.as_str()),
            esc(&a.detail),
            esc(&a
                .log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()),
        );
    }
    if !rows.is_empty() {
        let _ = write!(
            o,
            "<table id=\"failures\"><tr><th>attempt</th><th>unit</th><th>outcome</th><th>class</th><th>evidence</th><th>log</th></tr>{rows}</table>"
        );
    }
    if !any {
        o.push_str("<p>No failure.</p>");
    }
}

/// Indices (ascending) of the attempts the page's table shows: all up to [`INLINE_ATTEMPTS`];
/// above, the first and last [`TABLE_ENDS`] and the first [`TABLE_FAILED`] failed attempts
/// between them.
fn table_selection(h: &CampaignHistory) -> Vec<usize> {
    let n = h.attempts.len();
    if n <= INLINE_ATTEMPTS {
        return (0..n).collect();
    }
    let (head, tail) = (TABLE_ENDS, n - TABLE_ENDS);
    let mut v: Vec<usize> = (0..head).collect();
    v.extend(
        (head..tail)
            .filter(|&i| {
                matches!(
                    h.attempts[i].outcome,
                    AttemptOutcome::Failed | AttemptOutcome::SubmitFailed
                )
            })
            .take(TABLE_FAILED),
    );
    v.extend(tail..n);
    v
}

/// Percent-encodes a file name for a relative `href` (all but unreserved URI characters).
fn href(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn attempts_table(o: &mut String, h: &CampaignHistory, report_file_name: &str) {
    let rows = table_selection(h);
    if rows.len() < h.attempts.len() {
        let failed = h
            .attempts
            .iter()
            .filter(|a| {
                matches!(
                    a.outcome,
                    AttemptOutcome::Failed | AttemptOutcome::SubmitFailed
                )
            })
            .count();
        let csv = attempts_csv_name(report_file_name);
        let _ = write!(
            o,
            "<p class=\"meta\" id=\"attempts-notice\" data-total=\"{total}\" data-shown=\"{shown}\">{total} attempts ({failed} failed) are too many for this page: it shows {shown}, the first {ends}, the last {ends} and up to {cap} failed attempts between them. The full table is <a href=\"{}\">{}</a>, a CSV file beside this report.</p>",
            href(&csv),
            esc(&csv),
            total = h.attempts.len(),
            shown = rows.len(),
            ends = TABLE_ENDS,
            cap = TABLE_FAILED,
        );
    }
    o.push_str("<table id=\"attempts\"><tr><th>attempt</th><th>unit</th><th>outcome</th><th>job</th><th>nodes</th><th>GPUs</th><th>queued</th><th>ran</th><th>GPU-hours</th></tr>");
    let mut next = 0;
    for i in rows {
        if i > next {
            // A gap in the selection: say how many rows are left out there.
            let _ = write!(
                o,
                "<tr class=\"gap\"><td colspan=\"9\" class=\"meta\">… {} attempts not shown …</td></tr>",
                i - next
            );
        }
        next = i + 1;
        let a = &h.attempts[i];
        let start = a.run_start_ms();
        let _ = write!(
            o,
            "<tr data-attempt=\"{}\"><td class=\"mono\">{}</td><td>{}</td><td style=\"color:{}\">{}</td><td class=\"mono\">{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&a.attempt_id),
            esc(&a.attempt_id),
            esc(&a.unit),
            colour(a.outcome.as_str()),
            a.outcome.as_str(),
            esc(a.job_id.as_deref().unwrap_or("")),
            esc(a.nodes.as_deref().unwrap_or("")),
            a.gpus,
            if a.started_ms.is_some() {
                duration(start.saturating_sub(a.submitted_ms))
            } else {
                "-".into()
            },
            duration(a.run_ms(h.as_of_ms)),
            gh(a.gpu_hours(h.as_of_ms)),
        );
    }
    o.push_str("</table>");
}

/// The full attempts table as RFC 4180 CSV (header row, CRLF line ends, fields quoted where
/// needed). Times are ms since the Unix epoch; empty where unknown.
fn attempts_csv(h: &CampaignHistory) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::CRLF)
        .from_writer(Vec::with_capacity(h.attempts.len() * 160));
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let header = [
        "attempt_id",
        "stage",
        "unit",
        "attempt",
        "revision",
        "outcome",
        "class",
        "state",
        "exit_code",
        "job_id",
        "nodes",
        "gpus",
        "submitted_ms",
        "started_ms",
        "ended_ms",
        "ran_s",
        "gpu_hours",
        "detail",
        "log_path",
    ];
    // Writing to memory cannot fail and every record has the header's length.
    w.write_record(header).expect("CSV into memory");
    for a in &h.attempts {
        let rec: [String; 19] = [
            a.attempt_id.clone(),
            a.stage.clone(),
            a.unit.clone(),
            a.attempt.to_string(),
            a.revision.to_string(),
            a.outcome.as_str().to_string(),
            a.class.map(|c| c.as_str().to_string()).unwrap_or_default(),
            a.state.clone().unwrap_or_default(),
            a.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            a.job_id.clone().unwrap_or_default(),
            a.nodes.clone().unwrap_or_default(),
            a.gpus.to_string(),
            a.submitted_ms.to_string(),
            opt(a.started_ms),
            opt(a.ended_ms),
            format!("{:.3}", a.run_ms(h.as_of_ms) as f64 / 1000.0),
            format!("{:.6}", a.gpu_hours(h.as_of_ms)),
            a.detail.clone(),
            a.log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ];
        w.write_record(&rec).expect("CSV into memory");
    }
    let bytes = w.into_inner().expect("CSV into memory");
    // Every field is a Rust string, so the bytes are UTF-8; lossy only as a formality.
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Outcomes drawn in the aggregated timeline, bottom to top of a stacked bar.
/// The time axis: 6 ticks from `t0` to `t1` (ms), each a grid line from `top` down to the
/// plot's foot and its offset from `t0`; `x` maps a time to its abscissa.
fn axis_ticks(o: &mut String, t0: u64, t1: u64, x: &dyn Fn(u64) -> f64, top: f64, height: f64) {
    for k in 0..=5u64 {
        let t = t0 + (t1 - t0) * k / 5;
        let xx = x(t);
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/>"##,
            top - 4.0,
            height - 6.0
        );
        text(
            o,
            xx - 12.0,
            12.0,
            "small",
            &format!("+{}", duration(t - t0)),
        );
    }
}

/// The timeline's legend: a swatch per outcome, then `extra` (HTML).
fn legend(o: &mut String, outcomes: &[AttemptOutcome], extra: &str) {
    o.push_str(r#"<div class="legend">"#);
    for oc in outcomes {
        let _ = write!(
            o,
            r#"<span><i style="background:{}"></i>{}</span>"#,
            colour(oc.as_str()),
            oc.as_str()
        );
    }
    o.push_str(extra);
    o.push_str("</div>");
}

const AGG_OUTCOMES: [AttemptOutcome; 5] = [
    AttemptOutcome::Succeeded,
    AttemptOutcome::Superseded,
    AttemptOutcome::Cancelled,
    AttemptOutcome::Failed,
    AttemptOutcome::Live,
];

/// Per stage lane and slice, the attempts running in the slice by outcome
/// (`[lane][slice][AGG_OUTCOMES index]`), with the lanes' stage names and the time span.
struct Aggregate {
    stages: Vec<String>,
    counts: Vec<Vec<[u32; AGG_OUTCOMES.len()]>>,
    t0: u64,
    t1: u64,
}

fn aggregate(h: &CampaignHistory, slices: usize) -> Aggregate {
    let mut stages: Vec<String> = h.stages.iter().map(|s| s.id.clone()).collect();
    let mut lane: HashMap<String, usize> = stages
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), i))
        .collect();
    let drawn = |a: &&AttemptHistory| AGG_OUTCOMES.contains(&a.outcome);
    let t0 = h
        .attempts
        .iter()
        .filter(drawn)
        .map(|a| a.run_start_ms())
        .min()
        .unwrap_or(0);
    let t1 = h
        .attempts
        .iter()
        .filter(drawn)
        .map(|a| end_of(a, h.as_of_ms))
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let span = (t1 - t0) as f64;
    let slice_of =
        |t: u64| (((t.saturating_sub(t0)) as f64 / span * slices as f64) as usize).min(slices - 1);
    // Difference arrays: +1 at an attempt's first slice, -1 after its last; one pass over
    // the attempts, one over the slices.
    let mut diff: Vec<Vec<[i64; AGG_OUTCOMES.len()]>> =
        vec![vec![[0; 5]; slices + 1]; stages.len()];
    for a in h.attempts.iter().filter(drawn) {
        let l = *lane.entry(a.stage.clone()).or_insert_with(|| {
            // A stage the plan does not list (no plan): a lane of its own after the others.
            stages.push(a.stage.clone());
            diff.push(vec![[0; 5]; slices + 1]);
            stages.len() - 1
        });
        let k = AGG_OUTCOMES
            .iter()
            .position(|o| *o == a.outcome)
            .unwrap_or(0);
        diff[l][slice_of(a.run_start_ms())][k] += 1;
        diff[l][slice_of(end_of(a, h.as_of_ms)) + 1][k] -= 1;
    }
    let counts = diff
        .into_iter()
        .map(|d| {
            let mut run = [0i64; AGG_OUTCOMES.len()];
            d[..slices]
                .iter()
                .map(|step| {
                    let mut c = [0u32; AGG_OUTCOMES.len()];
                    for k in 0..run.len() {
                        run[k] += step[k];
                        c[k] = run[k].max(0) as u32;
                    }
                    c
                })
                .collect()
        })
        .collect();
    Aggregate {
        stages,
        counts,
        t0,
        t1,
    }
}

fn timeline_aggregated(o: &mut String, h: &CampaignHistory, report_file_name: &str) {
    let agg = aggregate(h, AGGREGATE_SLICES);
    let (t0, t1) = (agg.t0, agg.t1);
    let (left, plot_w, lane_h, gap, top) = (170.0, 900.0, 48.0, 10.0, 24.0);
    let slice_w = plot_w / AGGREGATE_SLICES as f64;
    let slice_ms = (t1 - t0) / AGGREGATE_SLICES as u64;
    let _ = write!(
        o,
        "<p class=\"meta\" id=\"timeline-aggregated\">This timeline is aggregated: {} attempts, {} or more, are too many to draw one bar each. Each stage is one lane cut into {} time slices of about {}; a slice's bar is the number of attempts running in it, stacked by how they ended, scaled to the lane's peak. Each attempt is in the attempts table{}.</p>",
        h.attempts.len(),
        AGGREGATE_ATTEMPTS,
        AGGREGATE_SLICES,
        duration(slice_ms.max(1)),
        if h.attempts.len() > INLINE_ATTEMPTS {
            format!(" and in {}", esc(&attempts_csv_name(report_file_name)))
        } else {
            String::new()
        }
    );
    legend(o, &AGG_OUTCOMES, "");
    let lanes = agg.stages.len();
    let height = top + lanes as f64 * (lane_h + gap) + 10.0;
    let width = left + plot_w + 80.0;
    let _ = write!(
        o,
        r#"<div class="scroll"><svg id="timeline" data-aggregated="true" data-slices="{AGGREGATE_SLICES}" xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" data-t0="{t0}" data-t1="{t1}" data-left="{left}" data-plot-width="{plot_w}">"#
    );
    let x = |t: u64| left + (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * plot_w;
    axis_ticks(o, t0, t1, &x, top, height);
    for (l, stage) in agg.stages.iter().enumerate() {
        let y0 = top + l as f64 * (lane_h + gap);
        let peak = agg.counts[l]
            .iter()
            .map(|c| c.iter().sum::<u32>())
            .max()
            .unwrap_or(0);
        let _ = write!(
            o,
            r##"<g class="lane" data-stage="{}" data-peak="{peak}"><rect x="{left}" y="{y0:.1}" width="{plot_w}" height="{lane_h}" fill="#f7f7f7"/>"##,
            esc(stage)
        );
        text(o, 4.0, y0 + 18.0, "lbl", stage);
        text(o, 4.0, y0 + 34.0, "small", &format!("peak {peak} at once"));
        if peak > 0 {
            let scale = (lane_h - 2.0) / peak as f64;
            for (k, c) in agg.counts[l].iter().enumerate() {
                let total: u32 = c.iter().sum();
                if total == 0 {
                    continue;
                }
                let xs = left + k as f64 * slice_w;
                let from = t0 + (t1 - t0) * k as u64 / AGGREGATE_SLICES as u64;
                let parts: Vec<String> = AGG_OUTCOMES
                    .iter()
                    .zip(c)
                    .filter(|(_, n)| **n > 0)
                    .map(|(oc, n)| format!("{n} {}", oc.as_str()))
                    .collect();
                let _ = write!(
                    o,
                    "<g data-slice=\"{k}\"><title>{}, from +{}: {}</title>",
                    esc(stage),
                    duration(from - t0),
                    parts.join(", ")
                );
                let mut yb = y0 + lane_h;
                for (oc, n) in AGG_OUTCOMES.iter().zip(c) {
                    if *n == 0 {
                        continue;
                    }
                    let hh = *n as f64 * scale;
                    yb -= hh;
                    let _ = write!(
                        o,
                        r#"<rect class="agg" data-outcome="{}" data-count="{n}" x="{xs:.1}" y="{yb:.2}" width="{slice_w:.1}" height="{hh:.2}" fill="{}"/>"#,
                        oc.as_str(),
                        colour(oc.as_str())
                    );
                }
                o.push_str("</g>");
            }
        }
        o.push_str("</g>");
    }
    o.push_str("</svg></div>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{LeaseStatus, StageHistory};
    use std::path::PathBuf;

    fn attempt(
        i: usize,
        stage: &str,
        outcome: AttemptOutcome,
        start: u64,
        end: u64,
    ) -> AttemptHistory {
        AttemptHistory {
            attempt_id: format!("n.{stage}.{i}.a1"),
            unit: format!("{stage}/{i}"),
            stage: stage.into(),
            attempt: 1,
            revision: 1,
            resume: false,
            more_resources: false,
            job_id: Some(i.to_string()),
            submitted_ms: start,
            started_ms: Some(start),
            ended_ms: Some(end),
            start_estimated: false,
            outcome,
            state: None,
            exit_code: None,
            class: None,
            detail: String::new(),
            log_path: None,
            nodes: Some("n1".into()),
            gpus: 1,
            last_heartbeat_ms: None,
            retry_of: None,
        }
    }

    fn history(attempts: Vec<AttemptHistory>) -> CampaignHistory {
        let as_of_ms = attempts
            .iter()
            .filter_map(|a| a.ended_ms)
            .max()
            .unwrap_or(0);
        CampaignHistory {
            dir: PathBuf::from("/c"),
            nonce: Some("n".into()),
            contract_hash: None,
            revision: 1,
            runner: Some("local".into()),
            experiment: None,
            records: 0,
            first_ms: Some(0),
            last_ms: Some(as_of_ms),
            as_of_ms,
            stages: vec![
                StageHistory::new("a", vec![], 1),
                StageHistory::new("b", vec!["a".into()], 1),
            ],
            attempts,
            finished: true,
            cancelled: None,
            problems: vec![],
            events: vec![],
            excluded_nodes: vec![],
            lease: LeaseStatus::default(),
        }
    }

    /// `n` attempts of 2 s each, 1 s apart, alternating stages; every 7th failed.
    fn many(n: usize) -> CampaignHistory {
        history(
            (0..n)
                .map(|i| {
                    let oc = if i % 7 == 3 {
                        AttemptOutcome::Failed
                    } else {
                        AttemptOutcome::Succeeded
                    };
                    let s = i as u64 * 1000;
                    attempt(i, ["a", "b"][i % 2], oc, s, s + 2000)
                })
                .collect(),
        )
    }

    #[test]
    fn the_timeline_aggregates_from_the_threshold_on() {
        let below = render_campaign_report(&many(AGGREGATE_ATTEMPTS - 1));
        assert_eq!(
            below.matches("<rect class=\"bar\"").count(),
            AGGREGATE_ATTEMPTS - 1,
            "one bar per attempt below the threshold"
        );
        assert!(!below.contains("data-aggregated") && !below.contains("timeline-aggregated"));

        let at = render_campaign_report(&many(AGGREGATE_ATTEMPTS));
        assert_eq!(at.matches("<rect class=\"bar\"").count(), 0);
        assert!(at.contains("<svg id=\"timeline\" data-aggregated=\"true\" data-slices=\"300\""));
        assert!(
            at.contains("id=\"timeline-aggregated\">This timeline is aggregated: 10000 attempts")
        );
        assert_eq!(
            at.matches("<g class=\"lane\"").count(),
            2,
            "one lane per stage"
        );
        // Every slice has attempts of both stages: at most 300 slice groups per lane.
        let slices = at.matches("<g data-slice=").count();
        assert!(slices > 500 && slices <= 2 * AGGREGATE_SLICES, "{slices}");
        assert!(
            at.contains("data-outcome=\"failed\"") && at.contains("data-outcome=\"succeeded\"")
        );
        assert!(
            at.len() < 1_000_000,
            "aggregated page is small: {}",
            at.len()
        );
        assert!(at.contains("<footer class=\"meta\" id=\"report-end\""));
    }

    #[test]
    fn aggregate_counts_attempts_running_per_slice_by_outcome() {
        let mut h = history(vec![
            attempt(0, "a", AttemptOutcome::Succeeded, 0, 50),
            attempt(1, "a", AttemptOutcome::Failed, 50, 100),
            attempt(2, "b", AttemptOutcome::Live, 20, 20),
            // Not drawn: never ran.
            attempt(3, "b", AttemptOutcome::SubmitFailed, 0, 100),
            // A stage the plan does not list gets a lane of its own.
            attempt(4, "x", AttemptOutcome::Cancelled, 90, 100),
        ]);
        h.attempts[2].ended_ms = None;
        h.as_of_ms = 20;
        let g = aggregate(&h, 10);
        assert_eq!(g.stages, ["a", "b", "x"]);
        assert_eq!((g.t0, g.t1), (0, 100));
        let (s, f, live, c) = (0, 3, 4, 2);
        let col =
            |lane: usize, k: usize| -> Vec<u32> { g.counts[lane].iter().map(|c| c[k]).collect() };
        assert_eq!(col(0, s), [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(col(0, f), [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]);
        assert_eq!(col(1, live), [0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            col(1, s).iter().sum::<u32>(),
            0,
            "the submit failure is not drawn"
        );
        assert_eq!(col(2, c), [0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn the_table_is_whole_up_to_the_inline_limit_then_a_selection_with_a_csv() {
        let h = many(INLINE_ATTEMPTS);
        let f = render_campaign_report_files(&h, "report.html");
        assert!(f.attempts_csv.is_none());
        let table = &f.html[f.html.find("<table id=\"attempts\"").unwrap()..];
        assert_eq!(table.matches("<tr data-attempt=").count(), INLINE_ATTEMPTS);
        assert!(!f.html.contains("attempts-notice"));

        // 2001 attempts, 286 failed (i % 7 == 3), 7 of them in the first or last 50.
        let h = many(INLINE_ATTEMPTS + 1);
        let failed_between = (TABLE_ENDS..INLINE_ATTEMPTS + 1 - TABLE_ENDS)
            .filter(|i| i % 7 == 3)
            .count();
        assert!(failed_between > TABLE_FAILED);
        let sel = table_selection(&h);
        assert_eq!(sel.len(), 2 * TABLE_ENDS + TABLE_FAILED);
        assert_eq!(&sel[..3], &[0, 1, 2]);
        assert_eq!(*sel.last().unwrap(), INLINE_ATTEMPTS);
        assert!(
            sel[TABLE_ENDS..TABLE_ENDS + TABLE_FAILED]
                .iter()
                .all(|&i| h.attempts[i].outcome == AttemptOutcome::Failed)
        );
        let f = render_campaign_report_files(&h, "my report.html");
        let table = &f.html[f.html.find("<table id=\"attempts\"").unwrap()..];
        assert_eq!(table.matches("<tr data-attempt=").count(), 300);
        assert!(table.matches("<tr class=\"gap\">").count() >= 2);
        assert!(f.html.contains("data-total=\"2001\" data-shown=\"300\""));
        assert!(
            f.html.contains(
                "<a href=\"my%20report.html.attempts.csv\">my report.html.attempts.csv</a>"
            )
        );
        let csv = f.attempts_csv.expect("a CSV above the inline limit");
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        assert_eq!(
            r.records().count(),
            INLINE_ATTEMPTS + 1,
            "one row per attempt"
        );
        // The plain render links to the default name.
        assert!(render_campaign_report(&h).contains("href=\"report.html.attempts.csv\""));
    }

    #[test]
    fn csv_fields_are_quoted_by_rfc_4180() {
        let mut a = attempt(0, "a", AttemptOutcome::Failed, 0, 3_600_000);
        a.detail = "OOM, \"killed\"\nat step 3".into();
        a.log_path = Some(PathBuf::from("/logs/a b.log"));
        let h = history(vec![a]);
        let csv = attempts_csv(&h);
        let mut lines = csv.split("\r\n");
        assert_eq!(
            lines.next().unwrap(),
            "attempt_id,stage,unit,attempt,revision,outcome,class,state,exit_code,job_id,nodes,gpus,submitted_ms,started_ms,ended_ms,ran_s,gpu_hours,detail,log_path"
        );
        assert_eq!(
            lines.next().unwrap(),
            "n.a.0.a1,a,a/0,1,1,failed,,,,0,n1,1,0,0,3600000,3600.000,1.000000,\"OOM, \"\"killed\"\"\nat step 3\",/logs/a b.log"
        );
        assert_eq!(lines.next(), Some(""), "CRLF after the last record");
        let mut r = csv::Reader::from_reader(csv.as_bytes());
        let rec = r.records().next().unwrap().unwrap();
        assert_eq!(
            &rec[17], "OOM, \"killed\"\nat step 3",
            "reads back unchanged"
        );
    }
}
