//! The edit-scenario suite (issue 8): a real fixture workspace (`tests/fixtures/ccdemo`: the user
//! crate `ccdemo` with the grid in `main`, the job in `src/train.rs`, helpers with a const, a
//! `macro_rules!`, a `dyn` trait, an `include_str!` file, a serde default, a `wide` feature; and
//! the path dependency `ccdep` with a `fast` feature) is built by cargo inside the test after
//! each edit, and its binary drains a real `FsStore`. For each edit: which runs rerun, which
//! skip, and why. Keys are recomputed from the documented formula.
//!
//! Cost: the fixture builds against this repository by path into a persistent target folder
//! under this build's target dir, so after the first time only the two fixture crates compile
//! per edit.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ccdemo");

struct Ws {
    root: PathBuf,
    target: PathBuf,
    store: PathBuf,
    /// The fixture's user package (its binary prints the lines `Out` reads).
    package: &'static str,
}

#[derive(Debug)]
struct Out {
    code: serde_json::Value,
    keys: Vec<(String, String)>,
    /// (action, params, reasons)
    decisions: Vec<(String, String, String)>,
    ran: usize,
    skipped: usize,
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let dst = to.join(name.strip_suffix(".in").unwrap_or(&name));
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            let text = std::fs::read_to_string(e.path())
                .unwrap()
                .replace("@PUZZLETRON@", env!("CARGO_MANIFEST_DIR"));
            std::fs::write(dst, text).unwrap();
        }
    }
}

impl Ws {
    fn new() -> Self {
        Self::named("identity-edits")
    }

    /// A workspace of its own (tests run in parallel), under `name`.
    fn named(name: &str) -> Self {
        Self::of_fixture(FIXTURE, "ccdemo", name)
    }

    /// The fixture workspace `fixture` (user package `package`) copied under `name`.
    fn of_fixture(fixture: &str, package: &'static str, name: &str) -> Self {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        let root = base.join("ws");
        let _ = std::fs::remove_dir_all(&root);
        copy_dir(Path::new(fixture), &root);
        // The repository's lock: the fixture resolves to the versions already built.
        std::fs::copy(
            concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"),
            root.join("Cargo.lock"),
        )
        .unwrap();
        let store = base.join("store");
        let _ = std::fs::remove_dir_all(&store);
        Self {
            root,
            target: base.join("target"),
            store,
            package,
        }
    }

    fn build(&self, features: &[&str]) -> PathBuf {
        self.build_env(features, &[])
    }

    /// Builds with `env` set (`Some`) or removed (`None`) in cargo's environment.
    fn build_env(&self, features: &[&str], env: &[(&str, Option<&str>)]) -> PathBuf {
        self.build_in(&self.target, features, env)
    }

    /// Builds into the target folder `target` (the user package's binary is returned).
    fn build_in(&self, target: &Path, features: &[&str], env: &[(&str, Option<&str>)]) -> PathBuf {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--offline", "--quiet", "-p", self.package])
            .current_dir(&self.root)
            .env("CARGO_TARGET_DIR", target)
            .env_remove("RUSTFLAGS");
        if !features.is_empty() {
            cmd.arg("--features").arg(features.join(","));
        }
        for (k, v) in env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "fixture build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        target.join("debug").join(self.package)
    }

    fn write(&self, rel: &str, text: &str) {
        std::fs::write(self.root.join(rel), text).unwrap();
    }

    fn edit(&self, rel: &str, from: &str, to: &str) {
        let p = self.root.join(rel);
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(text.matches(from).count(), 1, "{rel}: `{from}` once");
        std::fs::write(&p, text.replace(from, to)).unwrap();
    }

    fn run_in(&self, bin: &Path, cwd: &Path, trace: bool) -> Out {
        let mut cmd = Command::new(bin);
        cmd.arg(&self.store).current_dir(cwd);
        if trace {
            cmd.arg("trace");
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "fixture run failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut o = Out {
            code: serde_json::Value::Null,
            keys: Vec::new(),
            decisions: Vec::new(),
            ran: 0,
            skipped: 0,
        };
        for line in stdout.lines() {
            if let Some(c) = line.strip_prefix("CODE ") {
                o.code = serde_json::from_str(c).unwrap();
            } else if let Some(k) = line.strip_prefix("KEY ") {
                let (p, k) = k.rsplit_once(' ').unwrap();
                o.keys.push((p.to_string(), k.to_string()));
            } else if let Some(d) = line.strip_prefix("DECISION ") {
                let (action, rest) = d.split_once(' ').unwrap();
                let (params, reasons) = rest.split_once(' ').unwrap_or((rest, ""));
                o.decisions
                    .push((action.into(), params.into(), reasons.into()));
            } else if let Some(r) = line.strip_prefix("RAN ") {
                let (ran, skipped) = r.split_once(" SKIPPED ").unwrap();
                o.ran = ran.parse().unwrap();
                o.skipped = skipped.parse().unwrap();
            }
        }
        o
    }

    fn run(&self, bin: &Path) -> Out {
        self.run_in(bin, &self.root, false)
    }
}

impl Out {
    /// Params of the runs that ran.
    fn ran_params(&self) -> Vec<&str> {
        self.decisions
            .iter()
            .filter(|d| d.0 == "run")
            .map(|d| d.1.as_str())
            .collect()
    }

    fn all_skip(&self) -> bool {
        self.decisions
            .iter()
            .all(|d| d.0 == "skip" && d.2.starts_with("up to date"))
    }

    fn all_run_because(&self, reason: &str) {
        assert!(
            self.decisions.iter().all(|d| d.0 == "run" && d.2 == reason),
            "expected every run to run with `{reason}`: {:#?}",
            self.decisions
        );
        assert_eq!(self.ran, self.decisions.len());
    }
}

fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The key of each run of `ccdemo`'s job recomputed from the formula in `identity::compiled`
/// and `job_key`.
fn check_keys(o: &Out) {
    check_job_keys(o, "ccdemo::train::train")
}

/// The key of each run of the job named `job`, recomputed from the formula.
fn check_job_keys(o: &Out, job: &str) {
    let mut items: Vec<(String, String)> = o.code["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect();
    items.sort();
    let mut cfgs: Vec<(String, bool)> = o.code["cfgs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_bool().unwrap()))
        .collect();
    cfgs.sort();
    let mut builds: Vec<(String, String)> = o.code["builds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().into(), p[1].as_str().unwrap().into()))
        .collect();
    builds.sort();
    let mut h = Sha256::new();
    frame(&mut h, b"puzzletron/owned-items/v2");
    for (path, digest) in &items {
        frame(&mut h, path.as_bytes());
        frame(&mut h, &hex::decode(digest).unwrap());
    }
    frame(&mut h, b"cfg");
    for (p, v) in &cfgs {
        frame(&mut h, p.as_bytes());
        frame(&mut h, &[*v as u8]);
    }
    frame(&mut h, b"builds");
    for (n, b) in &builds {
        frame(&mut h, n.as_bytes());
        frame(&mut h, b.as_bytes());
    }
    let owned = h.finalize();
    assert!(!o.keys.is_empty());
    for (params, key) in &o.keys {
        let mut h = Sha256::new();
        frame(&mut h, b"puzzletron/job-key/v1");
        frame(&mut h, job.as_bytes());
        frame(&mut h, params.as_bytes());
        frame(&mut h, &owned);
        assert_eq!(&hex::encode(h.finalize()), key, "key of {params}");
    }
}

/// Every record of `store` is under 8 KB (issue 26: with puzzletron's own 2,218 items in the
/// closure a record of this fixture's job held ~490 KB).
fn assert_records_small(store: &Path) {
    let mut n = 0;
    for e in std::fs::read_dir(store.join("jobs")).unwrap() {
        let rec = e.unwrap().path().join("record.json");
        let len = std::fs::metadata(&rec).unwrap().len();
        assert!(len < 8 * 1024, "{}: {len} bytes", rec.display());
        n += 1;
    }
    assert!(n > 0, "no record in {}", store.display());
}

fn item_paths(o: &Out) -> Vec<String> {
    o.code["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn edit_scenarios() {
    let ws = Ws::new();
    let t0 = std::time::Instant::now();
    let bin = ws.build(&[]);
    let first = ws.run(&bin);
    eprintln!("first build + run: {:?}", t0.elapsed());
    assert_eq!(first.ran, 4, "{first:#?}");
    assert!(
        first.decisions.iter().all(|d| d.2 == "no record"),
        "{first:#?}"
    );
    check_keys(&first);
    // The closure: what the job reaches, and not what it does not.
    let items = item_paths(&first);
    for reached in [
        "ccdemo::train::train",
        "ccdemo::train::Params",
        "ccdemo::train::PROMPT",
        "ccdemo::helpers::smooth",
        "ccdemo::helpers::SCALE",
        "ccdemo::helpers::square!",
        "ccdemo::helpers::Model",
        "ccdemo::helpers::<Linear as Model>",
        "ccdep::blur",
        "file src/prompt.txt",
    ] {
        assert!(
            items.iter().any(|i| i == reached),
            "{reached} not in {items:#?}"
        );
    }
    for unreached in [
        "ccdemo::main",
        "ccdemo::grid",
        "ccdemo::helpers::unused",
        "ccdep::unrelated",
        "ccdemo::train::default_dropout",
    ] {
        assert!(
            !items.iter().any(|i| i == unreached),
            "{unreached} in the closure"
        );
    }
    assert_eq!(first.code["cfgs"][0][0], "feature = \"wide\"");
    assert_eq!(first.code["cfgs"][0][1], false);
    assert_eq!(first.code["builds"][0][0], "ccdep");
    // puzzletron is a path dependency here (as the README suggests before the first release):
    // its own items never enter the closure, nor its build id (its version is in Cargo.lock,
    // its compiler in the toolchain witness), so a record stays small.
    assert_eq!(
        first.code["builds"].as_array().unwrap().len(),
        1,
        "{first:#?}"
    );
    assert!(
        !items.iter().any(|i| {
            let i = i.strip_prefix("file ").unwrap_or(i);
            i.starts_with("puzzletron")
        }),
        "{items:#?}"
    );
    assert_records_small(&ws.store);

    // Comment, reformat and `///` doc edits: nothing runs.
    ws.edit(
        "ccdemo/src/helpers.rs",
        "//! Helpers of the job.",
        "//! Helpers of the job (edited).\n// a comment",
    );
    ws.edit(
        "ccdemo/src/train.rs",
        "    for step in 0..3 {",
        "    for step   in 0..3\n    {",
    );
    ws.edit(
        "ccdemo/src/helpers.rs",
        "/// Smooths a value.",
        "/// Smooths a value, gently.",
    );
    ws.edit(
        "ccdep/src/lib.rs",
        "/// Blurs a value.",
        "/// Blurs a value (doc edit).",
    );
    let o = ws.run(&ws.build(&[]));
    assert!(o.all_skip(), "{o:#?}");
    assert_eq!(o.keys, first.keys);

    // Each code edit reruns every run; the reason names the item.
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "ccdemo/src/train.rs",
            "p.lr * 0.5",
            "p.lr * 0.6",
            "code changed: ccdemo::train::train (src/train.rs)",
        ),
        (
            "ccdemo/src/helpers.rs",
            "square!(x) / SCALE",
            "square!(x) / SCALE + 1.0",
            "code changed: ccdemo::helpers::smooth (src/helpers.rs)",
        ),
        (
            "ccdep/src/lib.rs",
            "x * 0.25 + 1.0",
            "x * 0.25 + 2.0",
            "code changed: ccdep::blur (ccdep: src/lib.rs)",
        ),
        (
            "ccdemo/src/helpers.rs",
            "SCALE: f64 = 2.0",
            "SCALE: f64 = 3.0",
            "code changed: ccdemo::helpers::SCALE (src/helpers.rs)",
        ),
        (
            "ccdemo/src/helpers.rs",
            "$x * $x",
            "$x * $x * 1.0",
            "code changed: ccdemo::helpers::square! (src/helpers.rs)",
        ),
        (
            "ccdemo/src/helpers.rs",
            "self.w * x",
            "self.w * x + 0.5",
            "code changed: ccdemo::helpers::<Linear as Model> (src/helpers.rs)",
        ),
        (
            "ccdemo/src/prompt.txt",
            "hello prompt",
            "hello prompt!",
            "code changed: file src/prompt.txt",
        ),
    ];
    let mut prev = first;
    for (file, from, to, reason) in cases {
        let t = std::time::Instant::now();
        ws.edit(file, from, to);
        let o = ws.run(&ws.build(&[]));
        eprintln!("{reason}: {:?}", t.elapsed());
        o.all_run_because(reason);
        check_keys(&o);
        assert!(o.keys.iter().zip(&prev.keys).all(|(a, b)| a.1 != b.1));
        prev = o;
    }

    // An unreached function and the grid's code in `main`: nothing runs.
    ws.edit("ccdemo/src/helpers.rs", "    1.0\n}", "    2.0\n}");
    ws.edit("ccdep/src/lib.rs", "    7\n", "    8\n");
    ws.edit(
        "ccdemo/src/main.rs",
        "println!(\"RAN {} SKIPPED {}\", s.ran(), s.skipped());",
        "let (ran, skipped) = (s.ran(), s.skipped());\n    println!(\"RAN {ran} SKIPPED {skipped}\");",
    );
    let o = ws.run(&ws.build(&[]));
    assert!(o.all_skip(), "{o:#?}");

    // One grid point added: only it runs, saying which parameters differ from a stored run.
    ws.edit(
        "ccdemo/src/main.rs",
        "        r#\"{\"lr\": 0.2, \"dropout\": 0.3}\"#,\n",
        "        r#\"{\"lr\": 0.2, \"dropout\": 0.3}\"#,\n        r#\"{\"lr\": 0.4, \"dropout\": 0.3}\"#,\n",
    );
    let o = ws.run(&ws.build(&[]));
    assert_eq!(o.ran_params(), [r#"{"dropout":0.3,"lr":0.4}"#], "{o:#?}");
    let new = o.decisions.iter().find(|d| d.0 == "run").unwrap();
    // The closest stored run differs in `lr` only (0.1 or 0.2: equally close).
    assert!(
        new.2
            .starts_with("no record (nearest: params changed: lr 0.")
            && new.2.ends_with(" -> 0.4)"),
        "{new:?}"
    );
    assert_eq!(o.skipped, 4);

    // `0.1` written `0.10` in the grid: nothing runs.
    ws.edit("ccdemo/src/main.rs", "{\"lr\": 0.1}", "{\"lr\": 0.10}");
    let o = ws.run(&ws.build(&[]));
    assert!(o.all_skip(), "{o:#?}");

    // A changed serde default: only the runs that used it.
    ws.edit("ccdemo/src/train.rs", "    0.5\n}", "    0.25\n}");
    let o = ws.run(&ws.build(&[]));
    assert_eq!(
        o.ran_params(),
        [
            r#"{"dropout":0.25,"lr":0.1}"#,
            r#"{"dropout":0.25,"lr":0.2}"#
        ],
        "{o:#?}"
    );
    assert!(
        o.decisions.iter().filter(|d| d.0 == "run").all(|d| d
            .2
            .starts_with("no record (nearest: params changed: dropout 0.")
            && d.2.ends_with(" -> 0.25)")),
        "{o:#?}"
    );

    let bin = ws.build(&[]);
    // The same binary from another cwd, and copied to another folder: nothing runs.
    let elsewhere = ws.root.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let copied = elsewhere.join("ccdemo-copy");
    std::fs::copy(&bin, &copied).unwrap();
    let o = ws.run_in(&bin, Path::new("/"), false);
    assert!(o.all_skip(), "{o:#?}");
    let o = ws.run_in(&copied, &elsewhere, false);
    assert!(o.all_skip(), "{o:#?}");

    // A stale binary (built before an edit) keeps its own key: it cannot run under the new
    // code's key, and trace(true) says it is stale.
    ws.edit(
        "ccdemo/src/helpers.rs",
        "self.w * x + 0.5",
        "self.w * x + 0.75",
    );
    let stale = ws.run_in(&copied, &elsewhere, true);
    assert_eq!(stale.keys, o.keys);
    assert!(
        stale
            .decisions
            .iter()
            .all(|d| d.0 == "skip" && d.2.contains("stale binary: ") && d.2.contains("helpers.rs")),
        "{stale:#?}"
    );
    let fresh = ws.run(&ws.build(&[]));
    fresh.all_run_because("code changed: ccdemo::helpers::<Linear as Model> (src/helpers.rs)");
    assert!(fresh.keys.iter().zip(&stale.keys).all(|(a, b)| a.1 != b.1));

    // A feature build: everything reruns, naming the feature; back to the default build, the
    // earlier results are current again.
    let wide = ws.run(&ws.build(&["wide"]));
    wide.all_run_because("build configuration changed: feature \"wide\"");
    check_keys(&wide);
    // The path dependency's feature (its cfg is not the user crate's): reruns too.
    let fast = ws.run(&ws.build(&["wide", "ccdep/fast"]));
    assert!(
        fast.decisions
            .iter()
            .all(|d| d.0 == "run" && d.2.starts_with("build configuration changed: ccdep build")),
        "{fast:#?}"
    );
    let o = ws.run(&ws.build(&[]));
    assert!(o.all_skip(), "{o:#?}");

    // A Cargo.lock change (a new dependency of the user crate): rerun in place.
    ws.edit(
        "ccdemo/Cargo.toml",
        "serde_json = \"1\"\n",
        "serde_json = \"1\"\nhex = \"0.4\"\n",
    );
    let o = ws.run(&ws.build(&[]));
    o.all_run_because("environment changed: Cargo.lock");
    assert_eq!(o.keys, fresh.keys);

    // `cargo update -p itoa` (a registry crate puzzletron reaches through serde_json and csv;
    // offline here: itoa patched to a copy of its source with the next version): Cargo.lock
    // changes and puzzletron is rebuilt with a new build id. puzzletron is not owned, so the
    // keys stay and every run reruns in place naming the lock (issue 26: it said `build
    // configuration changed: puzzletron build (features, target or profile)`).
    patch_itoa_to_next_version(&ws);
    let o = ws.run(&ws.build(&[]));
    o.all_run_because("environment changed: Cargo.lock");
    assert_eq!(o.keys, fresh.keys);
    let lock = std::fs::read_to_string(ws.root.join("Cargo.lock")).unwrap();
    assert!(lock.contains("name = \"itoa\"\nversion = \"1.0."), "{lock}");
    eprintln!("whole scenario: {:?}", t0.elapsed());
}

/// Copies a folder as it is (bytes).
fn copy_raw(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_raw(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

/// What `cargo update -p itoa` does to `ws`, offline: the locked itoa's source, unpacked by
/// cargo in its registry folder, is copied beside the workspace with the next patch version and
/// patched in (`[patch.crates-io]`), so the next build rewrites Cargo.lock and rebuilds what
/// depends on itoa.
fn patch_itoa_to_next_version(ws: &Ws) {
    let lock = std::fs::read_to_string(ws.root.join("Cargo.lock")).unwrap();
    let head = "name = \"itoa\"\nversion = \"";
    let at = lock.find(head).expect("itoa in Cargo.lock") + head.len();
    let version = &lock[at..at + lock[at..].find('"').unwrap()];
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let src = std::fs::read_dir(home.join("registry/src"))
        .unwrap()
        .map(|e| e.unwrap().path().join(format!("itoa-{version}")))
        .find(|p| p.join("Cargo.toml").is_file())
        .unwrap_or_else(|| panic!("itoa {version} is not unpacked under {}", home.display()));
    let (major_minor, patch) = version.rsplit_once('.').unwrap();
    let next = format!("{major_minor}.{}", patch.parse::<u32>().unwrap() + 1);
    // Outside the workspace folder: a path package inside it would become a member.
    let vendored = ws.root.parent().unwrap().join("vendor/itoa");
    let _ = std::fs::remove_dir_all(&vendored);
    copy_raw(&src, &vendored);
    let manifest = vendored.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let from = format!("version = \"{version}\"");
    assert!(text.contains(&from), "{text}");
    std::fs::write(
        &manifest,
        text.replacen(&from, &format!("version = \"{next}\""), 1),
    )
    .unwrap();
    let mut root = std::fs::read_to_string(ws.root.join("Cargo.toml")).unwrap();
    root.push_str(&format!(
        "\n[patch.crates-io]\nitoa = {{ path = \"{}\" }}\n",
        vendored.display()
    ));
    std::fs::write(ws.root.join("Cargo.toml"), root).unwrap();
}

/// What a job compiles in besides its items' tokens (bug: none of these were in the key, so a
/// rebuilt binary reused results computed from the old values): an `include!`d file (its bytes,
/// and the items its code names), an `include_str!` whose path is computed with
/// `concat!(env!("CARGO_MANIFEST_DIR"), ..)`, an `option_env!` value of the job's crate, and an
/// `env!`/`option_env!` of a path dependency (its value as rustc's dep-info of that dependency
/// records it). Every build here is an ordinary `cargo build` (incremental, cargo's default):
/// keying the dependency's compiled artifact instead made the rebuild with the earlier values
/// rerun everything (issue 26, item 7).
#[test]
fn compiled_in_inputs_change_the_key() {
    const VARS: [&str; 2] = ["CC_FACTOR", "CCDEP_FLAG"];
    let ws = Ws::named("identity-inputs");
    ws.edit(
        "ccdemo/src/train.rs",
        "    for step in 0..3 {",
        "    x += include!(\"inc_expr.rs\");\n    \
         x += include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/src/data.txt\")).len() as f64;\n    \
         x += option_env!(\"CC_FACTOR\").unwrap_or(\"1\").parse::<f64>().unwrap();\n    \
         x += ccdep::tag() as f64;\n    \
         for step in 0..3 {",
    );
    ws.write("ccdemo/src/inc_expr.rs", "helpers::from_include() * 2.0\n");
    ws.write("ccdemo/src/data.txt", "some data\n");
    ws.edit(
        "ccdemo/src/helpers.rs",
        "/// Not reached by the job.",
        "pub fn from_include() -> f64 {\n    0.5\n}\n\n/// Not reached by the job.",
    );
    ws.edit(
        "ccdep/src/lib.rs",
        "/// Not reached by the job.",
        "pub fn tag() -> usize {\n    option_env!(\"CCDEP_FLAG\").map_or(0, str::len)\n}\n\n\
         /// Not reached by the job.",
    );
    let unset: Vec<(&str, Option<&str>)> = VARS.iter().map(|v| (*v, None)).collect();
    let build = |set: &[(&str, &str)]| {
        let mut env = unset.clone();
        for (k, v) in set {
            env.retain(|e| e.0 != *k);
            env.push((k, Some(v)));
        }
        ws.build_env(&[], &env)
    };
    let first = ws.run(&build(&[]));
    assert_eq!(first.ran, 4, "{first:#?}");
    check_keys(&first);
    let items = item_paths(&first);
    for want in [
        "file src/inc_expr.rs",
        "file src/data.txt",
        "env CC_FACTOR",
        "ccdemo::helpers::from_include",
        "env ccdep: CCDEP_FLAG",
    ] {
        assert!(items.iter().any(|i| i == want), "{want} not in {items:#?}");
    }
    // Nothing stands for a dependency's compiled bytes (they differ between two builds of the
    // same sources with incremental compilation, cargo's default for dev builds).
    assert!(
        !items.iter().any(|i| i.starts_with("compiled ")),
        "{items:#?}"
    );
    // Unchanged inputs, rebuilt: every run skips, same keys.
    ws.edit("ccdemo/src/main.rs", "fn grid()", "// touched\nfn grid()");
    let o = ws.run(&build(&[]));
    assert!(o.all_skip(), "{o:#?}");
    assert_eq!(o.keys, first.keys);

    let mut prev = o;
    fn step(prev: &mut Out, o: Out, reason: &str) {
        o.all_run_because(reason);
        check_keys(&o);
        assert!(o.keys.iter().zip(&prev.keys).all(|(a, b)| a.1 != b.1));
        *prev = o;
    }
    let p = &mut prev;
    ws.write("ccdemo/src/inc_expr.rs", "helpers::from_include() * 3.0\n");
    step(p, ws.run(&build(&[])), "code changed: file src/inc_expr.rs");
    ws.edit("ccdemo/src/helpers.rs", "    0.5\n", "    0.75\n");
    step(
        p,
        ws.run(&build(&[])),
        "code changed: ccdemo::helpers::from_include (src/helpers.rs)",
    );
    ws.write("ccdemo/src/data.txt", "some other data\n");
    step(p, ws.run(&build(&[])), "code changed: file src/data.txt");
    let unset_keys = p.keys.clone();
    step(
        p,
        ws.run(&build(&[("CC_FACTOR", "2")])),
        "code changed: env CC_FACTOR (src/train.rs)",
    );
    // The same value again: up to date.
    let o = ws.run(&build(&[("CC_FACTOR", "2")]));
    assert!(o.all_skip(), "{o:#?}");
    assert_eq!(o.keys, p.keys);
    step(
        p,
        ws.run(&build(&[("CC_FACTOR", "2"), ("CCDEP_FLAG", "on")])),
        "code changed: env ccdep: CCDEP_FLAG (ccdep: src/lib.rs)",
    );
    // Back to the earlier values: their results are current again.
    let o = ws.run(&build(&[]));
    assert!(o.all_skip(), "{o:#?}");
    assert_eq!(o.keys, unset_keys);
}

const GEN_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ccgen");

/// Issue 26, item 6: a job that compiles in build-script output (`tests/fixtures/ccgen`: the
/// user crate `include!`s `$OUT_DIR/gen.rs` as a module's items, as prost/tonic code does, and
/// `$OUT_DIR/factor.rs` as an expression; its path dependency `ccgendep` `include!`s its own
/// `$OUT_DIR/table.rs`, reads two variables its build script sets, one of them an absolute
/// path under its `OUT_DIR`, and includes `$OUT_DIR/note.txt` through a `macro_rules!` whose
/// path the macro cannot evaluate) gets the same keys when the same sources are built in
/// another target folder (another machine, CI, a login node): files under `OUT_DIR` count by
/// their path relative to it and their bytes, and no absolute build path enters a key. A change
/// of the generated content still changes the keys, naming the file relative to `OUT_DIR` (or
/// `inputs ccgendep`, everything that dependency's build read, where nothing narrower is known).
///
/// The two target folders are those of `edit_scenarios` and `compiled_in_inputs_change_the_key`
/// (puzzletron's build there is the same, so it is built at most once for all three tests; the
/// fixture's packages have names of their own, so nothing overwrites another test's binary).
#[test]
fn build_script_output_has_the_same_key_in_any_target_folder() {
    let ws = Ws::of_fixture(GEN_FIXTURE, "ccgen", "identity-outdir");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let (a, b) = (
        tmp.join("identity-edits/target"),
        tmp.join("identity-inputs/target"),
    );
    const JOB: &str = "ccgen::train::train";
    let first = ws.run(&ws.build_in(&a, &[], &[]));
    assert_eq!(first.ran, 3, "{first:#?}");
    check_job_keys(&first, JOB);
    let items = item_paths(&first);
    for want in [
        "file $OUT_DIR/gen.rs",
        "file $OUT_DIR/factor.rs",
        "file ccgendep: $OUT_DIR/table.rs",
        "env ccgendep: CCGENDEP_MODE",
        "env ccgendep: CCGENDEP_TABLE",
        "ccgendep::scaled",
        "ccgendep::generated!",
        // What `generated!` includes cannot be evaluated (its `$name`): everything the
        // dependency's build read counts, by label and content.
        "inputs ccgendep",
    ] {
        assert!(items.iter().any(|i| i == want), "{want} not in {items:#?}");
    }
    // No location: not OUT_DIR's value, not an absolute path, not the target folder.
    let files: Vec<&str> = first.code["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    for label in items.iter().map(String::as_str).chain(files) {
        let located = label.contains("//")
            || label.contains(&*tmp.to_string_lossy())
            || label.starts_with('/')
            || label.contains(": /")
            || label.matches("OUT_DIR").count() != label.matches("$OUT_DIR/").count();
        assert!(!located, "{label:?} names a location: {items:#?}");
    }

    // The same sources in another target folder: every run is up to date, same keys.
    let other = ws.run(&ws.build_in(&b, &[], &[]));
    assert!(other.all_skip(), "{other:#?}");
    assert_eq!(other.keys, first.keys);

    // Each generated input changed: every run reruns, naming it; the other target folder,
    // rebuilt from the same sources, agrees.
    let mut prev = other;
    for (file, from, to, reason) in [
        (
            "ccgen/gen.txt",
            "0.25",
            "0.5",
            "code changed: file $OUT_DIR/gen.rs",
        ),
        (
            "ccgendep/table.txt",
            "2.0",
            "3.0",
            "code changed: file ccgendep: $OUT_DIR/table.rs, inputs ccgendep",
        ),
        (
            "ccgendep/mode.txt",
            "plain",
            "fancy",
            "code changed: env ccgendep: CCGENDEP_MODE (ccgendep: src/lib.rs), inputs ccgendep",
        ),
        (
            "ccgendep/note.src",
            "a note",
            "another note",
            "code changed: inputs ccgendep",
        ),
    ] {
        ws.edit(file, from, to);
        let o = ws.run(&ws.build_in(&b, &[], &[]));
        o.all_run_because(reason);
        check_job_keys(&o, JOB);
        assert!(o.keys.iter().zip(&prev.keys).all(|(x, y)| x.1 != y.1));
        let again = ws.run(&ws.build_in(&a, &[], &[]));
        assert!(again.all_skip(), "{again:#?}");
        assert_eq!(again.keys, o.keys);
        prev = o;
    }
}

/// Issue 26, item 7: the README's example, with puzzletron as a path dependency (as the README
/// suggests until the first release), writes records under 8 KB: puzzletron's own items (its
/// `Run::log` and everything it reaches) never enter the job's closure. Before, each record held
/// ~490 KB (2,218 of puzzletron's items). The program is the README's `src/main.rs` as written
/// there, built in `edit_scenarios`'s target folder (puzzletron's build is shared), with its
/// Parquet output written as CSV (the fixture builds puzzletron without default features).
#[test]
fn readme_example_records_are_small_with_puzzletron_as_a_path_dependency() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let start = readme.find("```rust,no_run\n").expect("README's example") + 15;
    let main = &readme[start..start + readme[start..].find("```").unwrap()];
    assert!(
        main.contains("fn train(") && main.contains("job!(train)"),
        "{main}"
    );
    let parquet = "loss.write_parquet(\"loss.parquet\")?;";
    assert_eq!(main.matches(parquet).count(), 1, "{main}");
    let main = main.replace(parquet, "loss.write_csv(\"loss.csv\")?;");

    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("identity-readme");
    let root = base.join("ws");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("Cargo.toml"),
        format!(
            "[package]\nname = \"readme_example\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
             publish = false\n\n[dependencies]\npuzzletron = {{ path = \"{}\", default-features = false }}\n\
             serde = {{ version = \"1\", features = [\"derive\"] }}\nserde_json = \"1\"\n\n[workspace]\n",
            env!("CARGO_MANIFEST_DIR")
        ),
    )
    .unwrap();
    std::fs::write(root.join("src/main.rs"), main).unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"),
        root.join("Cargo.lock"),
    )
    .unwrap();
    let ws = Ws {
        root: root.clone(),
        target: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("identity-edits/target"),
        store: root.join(".puzzletron"),
        package: "readme_example",
    };
    let bin = ws.build(&[]);
    let run = || {
        let out = Command::new(&bin).current_dir(&root).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let text = run();
    assert!(text.contains("4 ran, 0 skipped"), "{text}");
    assert_records_small(&ws.store);
    for e in std::fs::read_dir(ws.store.join("jobs")).unwrap() {
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e.unwrap().path().join("record.json")).unwrap())
                .unwrap();
        let items: Vec<&String> = rec["owned"]["items"].as_object().unwrap().keys().collect();
        assert_eq!(
            items,
            ["readme_example::Params", "readme_example::train"],
            "{rec:#}"
        );
        assert!(rec["owned"].get("builds").is_none(), "{rec:#}");
    }
    let again = run();
    assert!(again.contains("0 ran, 4 skipped"), "{again}");
}
