//! SVG line plots of a [`MetricTable`]: one polyline per job, `step` on x, `value` on y.
//! Plain SVG 1.1 text, no dependencies; viewable in any browser.

use std::fmt::Write as _;

use super::MetricTable;

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 240.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;
/// Tableau 10, a palette designed for distinguishable categorical lines.
const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl MetricTable {
    /// The table as an SVG line plot titled `title`: one line per job (in table order, colours
    /// cycling through 10), labelled with the job's parameters; non-finite values are skipped.
    /// An empty table gives an empty plot with its title.
    pub fn to_svg(&self, title: &str) -> String {
        let steps = self.steps();
        let values = self.values();
        let keys = self.job_keys();
        // Group rows by job, keeping first-seen order.
        let mut jobs: Vec<(usize, Vec<(f64, f64)>)> = Vec::new();
        for r in 0..self.num_rows() {
            if !values[r].is_finite() {
                continue;
            }
            let pt = (steps[r] as f64, values[r]);
            match jobs.iter_mut().find(|(first, _)| keys[*first] == keys[r]) {
                Some((_, pts)) => pts.push(pt),
                None => jobs.push((r, vec![pt])),
            }
        }
        let all = jobs.iter().flat_map(|(_, p)| p.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in all {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= y0 {
            y1 = y0 + 1.0;
        }
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - (y - y0) / (y1 - y0) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">"#
        );
        let _ = write!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = write!(
            s,
            r#"<text x="{LEFT}" y="22" font-size="14">{}</text>"#,
            esc(title)
        );
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
        );
        for (v, x, y, anchor) in [
            (y1, LEFT - 6.0, TOP + 4.0, "end"),
            (y0, LEFT - 6.0, TOP + ph, "end"),
            (x0, LEFT, TOP + ph + 16.0, "start"),
            (x1, LEFT + pw, TOP + ph + 16.0, "end"),
        ] {
            let _ = write!(
                s,
                r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}">{}</text>"#,
                fmt_num(v)
            );
        }
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">step</text>"#,
            LEFT + pw / 2.0,
            H - 10.0
        );
        let params: Vec<String> = self
            .column_names()
            .into_iter()
            .enumerate()
            .filter(|(_, n)| !matches!(n.as_str(), "step" | "value" | "job_key" | "metric"))
            // Label with the parameters that vary between the plotted jobs only.
            .filter(|(i, _)| {
                let mut vals = jobs.iter().map(|(first, _)| self.cell(*i, *first));
                let v0 = vals.next();
                vals.any(|v| Some(v) != v0)
            })
            .map(|(i, n)| format!("{i}:{n}"))
            .collect();
        for (j, (first, pts)) in jobs.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let mut path = String::new();
            for (i, &(x, y)) in pts.iter().enumerate() {
                let _ = write!(
                    path,
                    "{}{:.2},{:.2}",
                    if i == 0 { "M" } else { " L" },
                    sx(x),
                    sy(y)
                );
            }
            let _ = write!(
                s,
                r#"<path d="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>"#
            );
            let label: Vec<String> = params
                .iter()
                .filter_map(|p| p.split_once(':'))
                .map(|(i, n)| format!("{n}={}", self.cell(i.parse().unwrap_or(0), *first)))
                .collect();
            let label = if label.is_empty() {
                keys[*first].short()
            } else {
                label.join(" ")
            };
            let ly = TOP + 8.0 + j as f64 * 15.0;
            let lx = LEFT + pw + 12.0;
            let _ = write!(
                s,
                r#"<line x1="{lx}" y1="{ly}" x2="{:.1}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 16.0,
                lx + 20.0,
                ly + 4.0,
                esc(&label)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    /// Writes [`to_svg`](Self::to_svg) to `path`, atomically.
    ///
    /// # Errors
    /// [`MetricsError::Io`](super::MetricsError::Io).
    pub fn write_svg(
        &self,
        path: impl AsRef<std::path::Path>,
        title: &str,
    ) -> Result<(), super::MetricsError> {
        let path = path.as_ref();
        crate::fsutil::atomic_write(path, self.to_svg(title).as_bytes()).map_err(|e| {
            super::MetricsError::Io {
                path: path.to_path_buf(),
                source: e,
            }
        })
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e4 || (v != 0.0 && v.abs() < 1e-3) {
        format!("{v:.2e}")
    } else {
        format!("{}", (v * 1e4).round() / 1e4)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{JobMeta, JobRows, build_table};
    use crate::identity::Hash;
    use crate::store::Series;
    use serde_json::json;

    #[test]
    fn one_line_per_job_with_parameter_labels() {
        let mut s1 = Series::default();
        let mut s2 = Series::default();
        for st in 0..4 {
            s1.push("loss", st, 1.0 / (st as f64 + 1.0));
            s2.push("loss", st, 2.0 - st as f64 * 0.1);
        }
        s2.push("loss", 4, f64::NAN);
        let (p1, p2) = (json!({"lr": 0.1}), json!({"lr": 0.5}));
        let jobs = [
            JobRows {
                meta: JobMeta {
                    key: Hash::of("a"),
                    params: &p1,
                    param_order: &[],
                    param_types: &crate::metrics::table::NO_TYPES,
                },
                series: s1,
            },
            JobRows {
                meta: JobMeta {
                    key: Hash::of("b"),
                    params: &p2,
                    param_order: &[],
                    param_types: &crate::metrics::table::NO_TYPES,
                },
                series: s2,
            },
        ];
        let t = build_table(&jobs, false).unwrap();
        let svg = t.to_svg("loss <by lr>");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert_eq!(svg.matches("<path ").count(), 2);
        assert!(
            svg.contains(">lr=0.1<") && svg.contains(">lr=0.5<"),
            "{svg}"
        );
        assert!(svg.contains("loss &lt;by lr&gt;"));
        // The first job's first point is at the left edge, its value 1.0 is the top (y max 2.0 is
        // the second job's first point).
        assert!(svg.contains("M64.00,"), "{svg}");
        assert!(!svg.contains("NaN"));
    }
}
