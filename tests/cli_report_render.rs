//! The campaign report rendered by a real browser: headless Chromium loads the HTML of a
//! real campaign (the smoke fixture with a stub worker: an OOM retry, a transient retry, a
//! stage that fails for good), and the test reads the rendered DOM
//! (`--dump-dom`: bar count, positions inside the plot, retries drawn after the attempt they
//! retry, no two bars of a row overlapping) and a screenshot (decoded: its size, many colours,
//! the outcome colours present).
//!
//! Needs Debian's `chromium` (`.ci/run` installs it) and `PUZZLETRON_CHROMIUM_TESTS=1`; without
//! the variable the test is reported as ignored, with it a missing chromium fails it. `PUZZLETRON_UPDATE_REPORT_PNG=1` copies the screenshot to
//! `docs/campaign-report.png` (the picture in the README).

mod support;
use support::{cli, watchdog};

use std::collections::HashMap;
use std::time::Duration;

use cli::{SMOKE, SMOKE_EXEC, chromium, chromium_cmd, prefix, run};

fn attr(tag: &str, name: &str) -> Option<String> {
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {name} in {tag}"))
}

/// The opening tags `<NAME ...>` in `html`.
fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name} ");
    html.match_indices(&open)
        .map(|(i, _)| &html[i..i + html[i..].find('>').unwrap()])
        .collect()
}

#[cfg_attr(
    not(puzzletron_chromium_tests),
    ignore = "needs headless Chromium (apt-get install -y chromium): set PUZZLETRON_CHROMIUM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn report_renders_in_headless_chromium() {
    let chrome = chromium().expect(
        "PUZZLETRON_CHROMIUM_TESTS=1 but no chromium on PATH: apt-get install -y chromium (.ci/run does)",
    );
    let _w = watchdog::Watchdog::start(
        "report_renders_in_headless_chromium",
        Duration::from_secs(240),
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("c").to_str().unwrap().to_string();
    let stub = prefix(
        "--sleep-ms 300 --slow replacement_scoring=900 --fail sort=oom --fail build_library=transient --fail slicing_sanity=app!",
    );
    let (code, _, err) = run(&[
        "campaign",
        "run",
        SMOKE,
        "--runner",
        "local",
        "--execution",
        SMOKE_EXEC,
        "--dir",
        &d,
        "--command-prefix",
        &stub,
        "--allow-oom-retry",
        "sort",
        "--retry-delay-ms",
        "200",
        "--poll-ms",
        "50",
        "--gpus",
        "0,1,2,3",
        "--quiet",
    ]);
    assert_eq!(code, 4, "slicing_sanity fails for good: {err}");
    let report = std::path::Path::new(&d).join("report.html");
    assert!(report.is_file(), "written at the end of the campaign");
    let url = format!("file://{}", report.display());

    // The DOM after the browser parsed and laid it out.
    let profile = tempfile::tempdir().unwrap();
    let o = chromium_cmd(&chrome, profile.path())
        .args(["--dump-dom", "--virtual-time-budget=2000"])
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "chromium --dump-dom: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        dom.contains("<svg id=\"timeline\""),
        "timeline rendered:\n{}",
        &dom[..dom.len().min(2000)]
    );
    let svg_tag = tags(&dom, "svg")
        .into_iter()
        .find(|t| t.contains("id=\"timeline\""))
        .unwrap();
    let (left, plot_w) = (num(svg_tag, "data-left"), num(svg_tag, "data-plot-width"));
    let bars = tags(&dom, "rect")
        .into_iter()
        .filter(|t| t.contains("class=\"bar\""))
        .collect::<Vec<_>>();
    // Attempts: every stage once (mip does not need slicing_sanity), plus the OOM and
    // transient retries.
    let journal = cli::journal(std::path::Path::new(&d));
    let submitted = journal
        .iter()
        .filter(|r| r["entry"]["t"] == "submitted")
        .count();
    assert_eq!(bars.len(), submitted);
    assert_eq!(submitted, 10 + 2, "10 stages ran, 2 retries");
    let mut by_id = HashMap::new();
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    for b in &bars {
        let (x, w, y, h) = (num(b, "x"), num(b, "width"), num(b, "y"), num(b, "height"));
        assert!(
            x >= left - 0.01 && x + w <= left + plot_w + 1.01,
            "bar inside the plot: {b}"
        );
        assert!(w >= 1.0 && h > 0.0);
        by_id.insert(attr(b, "data-attempt").unwrap(), (x, w, y, h));
        *outcomes
            .entry(attr(b, "data-outcome").unwrap())
            .or_insert(0) += 1;
    }
    assert_eq!(
        outcomes.get("failed"),
        Some(&3),
        "oom, transient, slicing_sanity: {outcomes:?}"
    );
    assert_eq!(outcomes.get("succeeded"), Some(&9), "{outcomes:?}");
    // Bars sharing a row never overlap.
    let v: Vec<_> = by_id.values().collect();
    for (i, a) in v.iter().enumerate() {
        for b in &v[i + 1..] {
            let rows_overlap = a.2 < b.2 + b.3 - 0.01 && b.2 < a.2 + a.3 - 0.01;
            let time_overlap = a.0 < b.0 + b.1 - 1.01 && b.0 < a.0 + a.1 - 1.01;
            assert!(!(rows_overlap && time_overlap), "bars overlap: {a:?} {b:?}");
        }
    }
    // Every retry is drawn from the end of the attempt it retries to its successor, later.
    let retries = tags(&dom, "line")
        .into_iter()
        .filter(|t| t.contains("class=\"retry\""))
        .collect::<Vec<_>>();
    assert!(retries.len() >= 2, "{retries:?}");
    for r in &retries {
        let from = &by_id[&attr(r, "data-from").unwrap()];
        let to = &by_id[&attr(r, "data-to").unwrap()];
        assert!(
            (num(r, "x1") - (from.0 + from.1)).abs() < 0.6,
            "starts at the failed bar's end: {r}"
        );
        assert!(
            num(r, "x2") >= num(r, "x1") - 0.01,
            "the retry comes later: {r}"
        );
        assert!(
            to.0 >= from.0 + from.1 - 0.01,
            "retry bar after the failed bar: {r}"
        );
    }
    let stages = tags(&dom, "g")
        .into_iter()
        .filter(|t| t.contains("class=\"stage\""))
        .collect::<Vec<_>>();
    assert_eq!(stages.len(), 10);
    let status = |s: &str| {
        stages
            .iter()
            .find(|t| attr(t, "data-stage").as_deref() == Some(s))
            .and_then(|t| attr(t, "data-status"))
    };
    assert_eq!(status("slicing_sanity").as_deref(), Some("failed"));
    assert_eq!(status("sort").as_deref(), Some("done"));
    assert_eq!(status("mip").as_deref(), Some("done"));

    // A screenshot: decoded, sized as asked, with the outcome colours in it.
    let png_path = tmp.path().join("report.png");
    let o = chromium_cmd(&chrome, profile.path())
        .arg(format!("--screenshot={}", png_path.display()))
        .args(["--window-size=1300,1500", "--virtual-time-budget=2000"])
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "chromium --screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&png_path).unwrap(),
    ));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1300, 1500));
    let bpp = info.color_type.samples();
    let mut colours = std::collections::HashSet::new();
    let near = |rgb: (u8, u8, u8)| {
        buf.chunks(bpp)
            .filter(|p| {
                (p[0] as i32 - rgb.0 as i32).abs() < 12
                    && (p[1] as i32 - rgb.1 as i32).abs() < 12
                    && (p[2] as i32 - rgb.2 as i32).abs() < 12
            })
            .count()
    };
    let red = near((0xd6, 0x45, 0x41));
    let green = near((0x2e, 0x9d, 0x4f));
    for p in buf.chunks(bpp) {
        colours.insert((p[0], p[1], p[2]));
    }
    assert!(
        colours.len() > 50,
        "a real page, not a blank one: {} colours",
        colours.len()
    );
    assert!(red > 100, "failed bars are red: {red} px");
    assert!(green > 100, "succeeded bars are green: {green} px");
    if std::env::var("PUZZLETRON_UPDATE_REPORT_PNG").is_ok_and(|v| v == "1") {
        let dst = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/campaign-report.png");
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(&png_path, &dst).unwrap();
    }
}

/// The report's stage graph measured by Chromium: a copy of the report with a measuring script
/// appended (the report itself has none) writes each stage label's and box's bounding box and
/// the smallest rendered font size into the DOM that `--dump-dom` prints.
fn measure_dag(chrome: &std::path::Path, report: &std::path::Path) -> serde_json::Value {
    const SCRIPT: &str = r#"<script>
const labels = [];
document.querySelectorAll('#dag g.stage').forEach(g => {
  const t = g.querySelector('text.lbl').getBoundingClientRect();
  const b = g.querySelector('rect').getBoundingClientRect();
  labels.push({id: g.dataset.stage, text: g.querySelector('text.lbl').textContent,
    l: t.left, t: t.top, r: t.right, b: t.bottom, bl: b.left, bt: b.top, br: b.right, bb: b.bottom});
});
let minFont = 1e9;
document.querySelectorAll('#dag text').forEach(t => {
  const scale = t.getScreenCTM() ? t.getScreenCTM().a : 1;
  minFont = Math.min(minFont, parseFloat(getComputedStyle(t).fontSize) * scale);
});
// Edges: points along each edge that fall inside a box (2 px in from its border).
const boxes = [...document.querySelectorAll('#dag g.stage rect')].map(r =>
  [r.x.baseVal.value, r.y.baseVal.value, r.x.baseVal.value + r.width.baseVal.value,
   r.y.baseVal.value + r.height.baseVal.value]);
const edgeHits = [];
document.querySelectorAll('#dag path.edge').forEach(p => {
  const n = p.getTotalLength();
  for (let k = 0; k <= 200; k++) {
    const q = p.getPointAtLength(n * k / 200);
    if (boxes.some(b => q.x > b[0] + 2 && q.x < b[2] - 2 && q.y > b[1] + 2 && q.y < b[3] - 2)) {
      edgeHits.push([p.getAttribute('d'), q.x, q.y]);
      break;
    }
  }
});
const tl = document.querySelector('#timeline');
const tlRight = tl ? tl.getBoundingClientRect().right : 0;
let axisRight = 0;
const barLabels = [];
if (tl) {
  tl.querySelectorAll('text').forEach(t => { axisRight = Math.max(axisRight, t.getBoundingClientRect().right); });
  tl.querySelectorAll('text.barlbl').forEach(t => barLabels.push(t.textContent));
}
const pre = document.createElement('pre');
pre.id = 'measure';
pre.textContent = JSON.stringify({labels, minFont, tlRight, axisRight, barLabels, edgeHits});
document.body.appendChild(pre);
</script>"#;
    let html = std::fs::read_to_string(report).unwrap();
    let copy = report.with_file_name("measure.html");
    std::fs::write(&copy, html.replace("</body>", &format!("{SCRIPT}</body>"))).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let o = chromium_cmd(chrome, profile.path())
        .args([
            "--dump-dom",
            "--virtual-time-budget=2000",
            "--window-size=1300,1500",
        ])
        .arg(format!("file://{}", copy.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    let start = dom
        .find("<pre id=\"measure\">")
        .unwrap_or_else(|| panic!("no measurement: {}", String::from_utf8_lossy(&o.stderr)))
        + "<pre id=\"measure\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap()
}

/// Every stage label is whole (the stage id), inside its box, apart from every other label, and
/// no text of the graph is smaller than 10 px.
fn check_dag(m: &serde_json::Value, stages: usize) {
    let labels = m["labels"].as_array().unwrap();
    assert_eq!(labels.len(), stages, "{m}");
    let f = |l: &serde_json::Value, k: &str| l[k].as_f64().unwrap();
    for l in labels {
        assert_eq!(l["text"], l["id"], "a full label: {l}");
        assert!(
            f(l, "l") >= f(l, "bl") && f(l, "r") <= f(l, "br") && f(l, "b") <= f(l, "bb"),
            "label inside its box: {l}"
        );
    }
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            let apart = f(a, "r") <= f(b, "l")
                || f(b, "r") <= f(a, "l")
                || f(a, "b") <= f(b, "t")
                || f(b, "b") <= f(a, "t");
            assert!(apart, "labels overlap: {a} {b}");
        }
    }
    let min = m["minFont"].as_f64().unwrap();
    assert!(min >= 10.0, "text of {min} px");
    assert_eq!(
        m["edgeHits"],
        serde_json::json!([]),
        "edges run through boxes"
    );
    // The timeline: no text past its right edge (the last axis label), bars labelled.
    assert!(
        m["axisRight"].as_f64().unwrap() <= m["tlRight"].as_f64().unwrap(),
        "a timeline label is clipped: {m}"
    );
    assert!(
        !m["barLabels"].as_array().unwrap().is_empty(),
        "no bar carries its stage: {m}"
    );
}

/// `campaign run --once` (the first jobs submitted, then detached) writes the plan; the report
/// of that campaign draws every stage; then the campaign is cancelled.
fn report_of_started_campaign(
    root: &std::path::Path,
    exp: &str,
    exec: Option<&str>,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let d = dir.to_str().unwrap();
    let stub = prefix("--sleep-ms 20000");
    let mut args = vec![
        "campaign",
        "run",
        exp,
        "--runner",
        "local",
        "--dir",
        d,
        "--command-prefix",
        &stub,
        "--gpus",
        "0,1,2,3,4,5,6,7",
        "--once",
        "--quiet",
    ];
    if let Some(e) = exec {
        args.extend(["--execution", e]);
    }
    let (code, _, err) = cli::out(
        cli::puzzletron()
            .current_dir(root)
            .args(&args)
            .output()
            .unwrap(),
    );
    assert_eq!(code, 3, "--once detaches: {err}");
    let report = dir.join("r.html");
    let (code, _, err) = run(&["campaign", "report", d, "--out", report.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = run(&["campaign", "cancel", d]);
    assert_eq!(code, 0, "{err}");
    report
}

/// The 23-stage reference campaign and a generated 60-stage plan: stage labels whole, inside
/// their boxes, never overlapping, no text under 10 px.
#[cfg_attr(
    not(puzzletron_chromium_tests),
    ignore = "needs headless Chromium (apt-get install -y chromium): set PUZZLETRON_CHROMIUM_TESTS=1 (CONTRIBUTING.md)"
)]
#[test]
fn stage_graph_labels_are_readable_at_23_and_60_stages() {
    let chrome = chromium().expect("PUZZLETRON_CHROMIUM_TESTS=1 but no chromium on PATH");
    let _w = watchdog::Watchdog::start(
        "stage_graph_labels_are_readable_at_23_and_60_stages",
        Duration::from_secs(240),
    );
    let tmp = tempfile::tempdir().unwrap();
    let report = report_of_started_campaign(
        &cli::fixtures(),
        "families/qwen3_5/qwen3p5_0p8b/runs/campaign.yaml",
        Some("orchestration/qwen3p5_0p8b/execution.campaign.yaml"),
        &tmp.path().join("c23"),
    );
    check_dag(&measure_dag(&chrome, &report), 23);

    // 60 stages: 6 chains of 10 with long ids, each stage also needing the first of the chain
    // before (edges across levels and chains).
    let generated = tmp.path().join("gen");
    std::fs::create_dir_all(&generated).unwrap();
    std::fs::write(generated.join("base.yaml"), "{}\n").unwrap();
    let mut y = String::from("stages:\n");
    for c in 0..6 {
        for i in 0..10 {
            let mut needs: Vec<String> = Vec::new();
            if i > 0 {
                needs.push(format!(
                    "chain{c}.step{:02}_evaluation_of_candidates",
                    i - 1
                ));
            }
            if c > 0 && i > 1 {
                needs.push(format!("chain{}.step00_evaluation_of_candidates", c - 1));
            }
            y.push_str(&format!(
                "  - {{id: chain{c}.step{i:02}_evaluation_of_candidates, needs: [{}], command: [\"true\"]}}\n",
                needs.join(", ")
            ));
        }
    }
    std::fs::write(generated.join("exp.yaml"), y).unwrap();
    let report = report_of_started_campaign(
        &generated,
        generated.join("exp.yaml").to_str().unwrap(),
        None,
        &tmp.path().join("c60"),
    );
    check_dag(&measure_dag(&chrome, &report), 60);
}
