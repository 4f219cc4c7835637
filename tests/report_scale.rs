//! The campaign report at scale: a simulated campaign of 10k work items (10.4k attempts, the
//! mock executor of `controller_sim`) through `puzzletron campaign report`. The page aggregates
//! its timeline and shows part of the attempts table, so it stays small; the full table is the
//! CSV written beside it, one row per attempt. With `PUZZLETRON_CHROMIUM_TESTS=1` (cfg
//! `puzzletron_chromium_tests`) headless Chromium must load the page to its end within 5 s.
//! The 100k-item figures are `cargo bench --features cli --bench campaign_status`.

mod support;
use support::{cli, sim, watchdog};

use std::time::Duration;

use puzzletron::report::{AGGREGATE_ATTEMPTS, AGGREGATE_SLICES, INLINE_ATTEMPTS};

#[test]
fn a_ten_thousand_attempt_report_is_small_with_its_attempts_beside_it() {
    let _w = watchdog::Watchdog::start(
        "a_ten_thousand_attempt_report_is_small_with_its_attempts_beside_it",
        Duration::from_secs(600),
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let r = sim::run(10_000, &dir);
    assert!(r.report.is_complete(), "{}", r.report);
    assert!(r.jobs >= AGGREGATE_ATTEMPTS, "{} attempts", r.jobs);

    let out = tmp.path().join("big report.html");
    let (code, stdout, err) = cli::run(&[
        "campaign",
        "report",
        dir.to_str().unwrap(),
        "--no-sacct",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    let csv_path = tmp.path().join("big report.html.attempts.csv");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [out.to_str().unwrap(), csv_path.to_str().unwrap()],
        "the report, then the CSV"
    );
    assert!(err.contains("the full attempts table is"), "{err}");

    let html = std::fs::read_to_string(&out).unwrap();
    assert!(
        html.len() < 5_000_000,
        "HTML {} bytes for {} attempts",
        html.len(),
        r.jobs
    );
    assert!(!html.contains("<script"), "no script");
    assert!(html.contains(&format!(
        "<svg id=\"timeline\" data-aggregated=\"true\" data-slices=\"{AGGREGATE_SLICES}\""
    )));
    assert_eq!(html.matches("<rect class=\"bar\"").count(), 0);
    assert_eq!(
        html.matches("<g class=\"lane\"").count(),
        3,
        "prep, big, post"
    );
    // The table: 50 + 50 + up to 200 failed attempts, and the link to the CSV.
    assert!(r.jobs > INLINE_ATTEMPTS);
    assert!(
        html.contains(&format!("data-total=\"{}\" data-shown=\"300\"", r.jobs)),
        "{}",
        &html[html.find("attempts-notice").unwrap_or(0)..][..300]
    );
    assert!(html.contains("<a href=\"big%20report.html.attempts.csv\">"));
    assert!(html.contains("id=\"report-end\""));

    // The CSV: a header, then one row per attempt, each attempt once.
    let mut rd = csv::Reader::from_path(&csv_path).unwrap();
    let header = rd.headers().unwrap().clone();
    assert_eq!(&header[0], "attempt_id");
    assert_eq!(&header[5], "outcome");
    let mut ids = std::collections::HashSet::new();
    let mut failed = 0;
    for rec in rd.records() {
        let rec = rec.unwrap();
        assert_eq!(rec.len(), header.len());
        assert!(ids.insert(rec[0].to_string()), "{} twice", &rec[0]);
        failed += usize::from(&rec[5] == "failed");
    }
    assert_eq!(ids.len(), r.jobs, "one row per attempt");
    assert!(failed > 300, "the simulation's injected failures: {failed}");
    eprintln!(
        "{} attempts: HTML {} bytes, CSV {} bytes",
        r.jobs,
        html.len(),
        std::fs::metadata(&csv_path).unwrap().len()
    );
    assert!(
        !std::fs::read_dir(tmp.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".tmp.")),
        "no temp file left"
    );

    #[cfg(puzzletron_chromium_tests)]
    {
        let chrome = cli::chromium().expect("PUZZLETRON_CHROMIUM_TESTS=1 but no chromium on PATH");
        let profile = tempfile::tempdir().unwrap();
        let t = std::time::Instant::now();
        let o = cli::chromium_cmd(&chrome, profile.path())
            .arg("--dump-dom")
            .arg(format!("file://{}", out.display()))
            .output()
            .unwrap();
        let took = t.elapsed();
        let dom = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(dom.contains("id=\"report-end\""), "rendered to its end");
        assert!(dom.contains("data-aggregated=\"true\""));
        assert!(took < Duration::from_secs(5), "Chromium took {took:?}");
        eprintln!("chromium rendered the report in {took:?}");
    }
}

/// `--out` never destroys a file that is not a report (a journal, say), a missing folder is
/// named as such, and a small campaign's report to the same `--out` removes the table a
/// larger one left beside it (it would look current).
#[test]
fn report_out_guards_and_no_stale_attempts_table() {
    let _w = watchdog::Watchdog::start(
        "report_out_guards_and_no_stale_attempts_table",
        Duration::from_secs(600),
    );
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big");
    assert!(sim::run(3_000, &big).report.is_complete());
    let small = tmp.path().join("small");
    assert!(sim::run(20, &small).report.is_complete());
    let report = |dir: &std::path::Path, out: &std::path::Path| {
        cli::run(&[
            "campaign",
            "report",
            dir.to_str().unwrap(),
            "--no-sacct",
            "--out",
            out.to_str().unwrap(),
        ])
    };

    // A journal as --out: refused, the journal intact.
    let journal = big.join("controller/journal.jsonl");
    let before = std::fs::read(&journal).unwrap();
    let (code, _, err) = report(&big, &journal);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("is an existing file that is not a report"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "journal untouched"
    );

    // A missing folder is named.
    let nope = tmp.path().join("nope/deeper/r.html");
    let (code, _, err) = report(&big, &nope);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "the folder {} does not exist",
            nope.parent().unwrap().display()
        )),
        "{err}"
    );

    // Large then small to one --out: the large one's table does not stay behind.
    let out = tmp.path().join("r.html");
    let csv = tmp.path().join("r.html.attempts.csv");
    let (code, _, err) = report(&big, &out);
    assert_eq!(code, 0, "{err}");
    assert!(csv.is_file());
    let (code, stdout, err) = report(&small, &out);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        stdout.lines().count(),
        1,
        "no CSV for a small campaign: {stdout}"
    );
    assert!(
        !csv.exists(),
        "the earlier campaign's table was left beside the report"
    );
    // And a report replaces a report.
    let (code, _, err) = report(&big, &out);
    assert_eq!(code, 0, "{err}");
}
