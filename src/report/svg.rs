//! Small helpers shared by the HTML renderers: escaping, times, number formats, colours.

use std::fmt::Write;

/// Escapes text for HTML/SVG content and attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC` for ms since the Unix epoch (proleptic Gregorian calendar,
/// H. Hinnant's days-from-civil inverse).
pub(crate) fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A duration in ms as `1h02m`, `3m04s`, `5.2s`.
pub(crate) fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// GPU-hours with 3 decimals.
pub(crate) fn gh(v: f64) -> String {
    // Short test campaigns use fractions of a GPU-second: keep them visible.
    if v == 0.0 || v >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.6}")
    }
}

/// Fill colour of an outcome or status name.
pub(crate) fn colour(name: &str) -> &'static str {
    match name {
        "succeeded" | "done" => "#2e9d4f",
        "failed" => "#d64541",
        "cancelled" => "#8e8e8e",
        "superseded" => "#b48ede",
        "live" | "running" => "#3b7dd8",
        "intent" | "waiting" | "blocked" | "skipped" => "#d8d8d8",
        "backing_off" | "awaiting_decision" => "#e0b02c",
        "submit_failed" => "#e08a2c",
        _ => "#e0b02c",
    }
}

/// Writes an SVG `<text>`.
pub(crate) fn text(out: &mut String, x: f64, y: f64, class: &str, s: &str) {
    let _ = write!(
        out,
        r#"<text x="{x:.1}" y="{y:.1}" class="{class}">{}</text>"#,
        esc(s)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_798_761_599_000), "2026-12-31 23:59:59 UTC");
    }

    #[test]
    fn escaping_and_durations() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(duration(3_723_000), "1h02m");
        assert_eq!(duration(184_000), "3m04s");
        assert_eq!(duration(5_200), "5.2s");
    }
}
