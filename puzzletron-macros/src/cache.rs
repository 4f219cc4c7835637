//! The per-file index cache: each source file's [`Event`]s, kept between rustc runs so that a
//! rebuild re-parses only the files whose bytes changed.
//!
//! An entry is found by a key that is the SHA-256 of everything the events are a function of:
//! the file's exact bytes (their SHA-256), its [`FileCtx`] (path, module path, module folder,
//! enclosing `cfg`s, whether it is puzzletron's own), and the macro's identity (this format's
//! version, the crate's version, the digest of its own sources, the path, size and modification
//! time of the loaded macro library (from `/proc/self/maps`; where that cannot be read, nothing
//! is cached), and the calling workspace's Cargo.lock,
//! which pins the `syn`/`proc-macro2` the macro was built with). So an entry can only be found by
//! a lookup whose inputs are the ones it was computed from: an edited file, a moved module or a
//! rebuilt macro looks up another key and misses.
//!
//! An entry repeats its key and ends with the SHA-256 of its content; anything that does not read
//! back exactly (missing, truncated, corrupted, other format, unknown event) is a miss, never an
//! error. Entries are written to a temporary file in the same folder and renamed into place, so
//! a concurrent rustc sees a whole entry or none; they are not fsynced (a torn entry after a crash
//! fails its checksum and is a miss, which only costs a re-parse).
//!
//! The folder is `<profile dir>/puzzletron-macros-cache`, the profile dir being the parent of
//! rustc's `--out-dir` (e.g. `target/debug`), so `cargo clean` empties it. Without an
//! `--out-dir` (rustc not run by cargo) nothing is cached: a shared temporary folder could be
//! written by another user, and an entry planted there could lie.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::index::{Event, FileCtx, ModDecl, RawItem, sha256_hex};

/// Bump when the entry format or the meaning of events changes.
const FORMAT: &str = "puzzletron-macros file index 2";

/// The macro's own sources: a change to the analysis in a checkout (where the crate version does
/// not move) changes every key.
const OWN_SOURCES: &[&str] = &[
    include_str!("lib.rs"),
    include_str!("index.rs"),
    include_str!("scan.rs"),
    include_str!("manifest.rs"),
    include_str!("cache.rs"),
    include_str!("depinfo.rs"),
    include_str!("../Cargo.toml"),
];

/// Where entries are kept, and the macro's identity that salts every key.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
    salt: String,
}

impl Cache {
    /// The cache of this rustc run (see the module doc for the folder), or `None` when rustc's
    /// arguments name no `--out-dir` or the loaded macro library cannot be identified. `lock_digest`: SHA-256 of the calling workspace's
    /// Cargo.lock, if there is one.
    pub fn for_rustc(args: &[String], lock_digest: Option<&str>) -> Option<Cache> {
        Cache::for_rustc_with(args, lock_digest, macro_library())
    }

    fn for_rustc_with(
        args: &[String],
        lock_digest: Option<&str>,
        library: Option<String>,
    ) -> Option<Cache> {
        let out_dir = arg_value(args, "--out-dir")?;
        let profile_dir = Path::new(&out_dir).parent()?;
        // Without the library's identity a rebuilt macro (e.g. against a patched `syn`) could
        // not be told from the old one: no cache.
        Some(Cache::at(
            profile_dir.join("puzzletron-macros-cache"),
            lock_digest,
            &library?,
        ))
    }

    /// A cache in `dir` (created when the first entry is written); `library` identifies the
    /// macro's build (see `macro_library`).
    pub fn at(dir: PathBuf, lock_digest: Option<&str>, library: &str) -> Cache {
        let mut own = String::new();
        for s in OWN_SOURCES {
            own.push_str(&sha256_hex(s.as_bytes()));
        }
        let salt = sha256_hex(
            format!(
                "{FORMAT}\n{}\n{}\n{}\n{}\n",
                env!("CARGO_PKG_VERSION"),
                sha256_hex(own.as_bytes()),
                library,
                lock_digest.unwrap_or("no Cargo.lock"),
            )
            .as_bytes(),
        );
        Cache { dir, salt }
    }

    /// The folder entries are kept in.
    #[cfg(test)]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The key of the events of a file whose bytes have SHA-256 `bytes_digest`, at `fc`.
    /// `None` if a path is not UTF-8 (such a file is not cached).
    pub fn key(&self, fc: &FileCtx, bytes_digest: &str) -> Option<String> {
        let mut k = Line::default();
        k.field(&self.salt);
        k.field(bytes_digest);
        k.path(&fc.file)?;
        k.field(&fc.module);
        k.path(&fc.mod_dir)?;
        k.list(&fc.cfgs);
        k.field(if fc.ours { "1" } else { "0" });
        Some(sha256_hex(k.0.as_bytes()))
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// The events stored under `key`, or `None` (a miss) for anything but a whole, intact entry
    /// of this format written under this key.
    pub fn load(&self, key: &str) -> Option<Vec<Event>> {
        let text = std::fs::read_to_string(self.entry(key)).ok()?;
        decode(&text, key)
    }

    /// Stores `events` under `key`, atomically (temporary file + rename); failures are ignored
    /// (the next build misses and parses again).
    pub fn store(&self, key: &str, events: &[Event]) {
        let Some(text) = encode(events, key) else {
            return;
        };
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let tmp = self.dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let written = std::fs::create_dir_all(&self.dir)
            .and_then(|_| std::fs::File::create(&tmp))
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .and_then(|_| std::fs::rename(&tmp, self.entry(key)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

/// `--flag value` or `--flag=value` in rustc's arguments.
fn arg_value(args: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix(&eq) {
            return Some(v.to_string());
        }
    }
    None
}

/// The loaded macro library's path, size and modification time (Linux: from
/// `/proc/self/maps`): any rebuild of the macro, whatever its dependencies did, changes it.
fn macro_library() -> Option<String> {
    let here = macro_library as *const () as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (lo, hi) = f.next()?.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        if !(lo..hi).contains(&here) {
            continue;
        }
        // perms, offset, dev, inode, then the path (which may hold spaces).
        let path = f.skip(4).collect::<Vec<_>>().join(" ");
        let m = std::fs::metadata(&path).ok()?;
        let mtime = m
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        return Some(format!("{path} {} {}", m.len(), mtime.as_nanos()));
    }
    None
}

/// One line of tab-separated, escaped fields.
#[derive(Default)]
struct Line(String);

impl Line {
    fn field(&mut self, s: &str) {
        if !self.0.is_empty() {
            self.0.push('\t');
        }
        for c in s.chars() {
            match c {
                '\\' => self.0.push_str("\\\\"),
                '\t' => self.0.push_str("\\t"),
                '\n' => self.0.push_str("\\n"),
                '\r' => self.0.push_str("\\r"),
                c => self.0.push(c),
            }
        }
    }

    fn path(&mut self, p: &Path) -> Option<()> {
        self.field(p.to_str()?);
        Some(())
    }

    fn list(&mut self, v: &[String]) {
        self.field(&v.len().to_string());
        for s in v {
            self.field(s);
        }
    }

    fn paths(&mut self, v: &[PathBuf]) -> Option<()> {
        self.field(&v.len().to_string());
        for p in v {
            self.path(p)?;
        }
        Some(())
    }
}

fn encode(events: &[Event], key: &str) -> Option<String> {
    let mut out = format!("{FORMAT}\n{key}\n");
    for e in events {
        let mut l = Line::default();
        match e {
            Event::Item(it) => {
                l.field("I");
                l.field(&it.path);
                l.field(&it.digest);
                l.field(if it.always { "1" } else { "0" });
                match &it.impl_of {
                    Some((ty, tr)) => l.list(&[ty.clone(), tr.clone()]),
                    None => l.list(&[]),
                }
                l.list(&it.names);
                l.list(&it.refs);
                l.list(&it.cfgs);
                l.paths(&it.includes)?;
                l.list(&it.inputs);
            }
            Event::Note(n) => {
                l.field("N");
                l.field(n);
            }
            Event::Alias(b, a) => {
                l.field("A");
                l.field(b);
                l.field(a);
            }
            Event::Mod(m) => {
                l.field("M");
                l.field(&m.module);
                l.path(&m.mod_dir)?;
                l.list(&m.cfgs);
                l.paths(&m.candidates)?;
            }
        }
        out.push_str(&l.0);
        out.push('\n');
    }
    let sum = sha256_hex(out.as_bytes());
    out.push_str("sum ");
    out.push_str(&sum);
    out.push('\n');
    Some(out)
}

fn unescape(s: &str) -> Option<String> {
    if !s.contains('\\') {
        return Some(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match it.next()? {
            '\\' => '\\',
            't' => '\t',
            'n' => '\n',
            'r' => '\r',
            _ => return None,
        });
    }
    Some(out)
}

/// The fields of one line, read in order; every read fails (a miss) past the end.
struct Fields<'a>(std::str::Split<'a, char>);

impl Fields<'_> {
    fn str(&mut self) -> Option<String> {
        unescape(self.0.next()?)
    }

    fn list(&mut self) -> Option<Vec<String>> {
        let n: usize = self.0.next()?.parse().ok()?;
        (0..n).map(|_| self.str()).collect()
    }

    fn paths(&mut self) -> Option<Vec<PathBuf>> {
        Some(self.list()?.into_iter().map(PathBuf::from).collect())
    }

    fn flag(&mut self) -> Option<bool> {
        match self.0.next()? {
            "0" => Some(false),
            "1" => Some(true),
            _ => None,
        }
    }

    fn end(mut self) -> Option<()> {
        self.0.next().is_none().then_some(())
    }
}

fn decode(text: &str, key: &str) -> Option<Vec<Event>> {
    let body_len = text.strip_suffix('\n')?.rfind('\n')? + 1;
    let (body, last) = text.split_at(body_len);
    let sum = last.strip_prefix("sum ")?.strip_suffix('\n')?;
    if sha256_hex(body.as_bytes()) != sum {
        return None;
    }
    let mut lines = body.strip_suffix('\n')?.split('\n');
    if lines.next()? != FORMAT || lines.next()? != key {
        return None;
    }
    let mut events = Vec::new();
    for line in lines {
        let mut f = Fields(line.split('\t'));
        let e = match f.0.next()? {
            "I" => {
                let path = f.str()?;
                let digest = f.str()?;
                let always = f.flag()?;
                let impl_of = match f.list()?.as_slice() {
                    [] => None,
                    [ty, tr] => Some((ty.clone(), tr.clone())),
                    _ => return None,
                };
                let names = f.list()?;
                let refs = f.list()?;
                let cfgs = f.list()?;
                let includes = f.paths()?;
                let inputs = f.list()?;
                f.end()?;
                Event::Item(RawItem {
                    path,
                    names,
                    digest,
                    refs,
                    cfgs,
                    includes,
                    inputs,
                    impl_of,
                    always,
                })
            }
            "N" => {
                let n = f.str()?;
                f.end()?;
                Event::Note(n)
            }
            "A" => {
                let (b, a) = (f.str()?, f.str()?);
                f.end()?;
                Event::Alias(b, a)
            }
            "M" => {
                let module = f.str()?;
                let mod_dir = PathBuf::from(f.str()?);
                let cfgs = f.list()?;
                let candidates = f.paths()?;
                f.end()?;
                Event::Mod(ModDecl {
                    module,
                    mod_dir,
                    cfgs,
                    candidates,
                })
            }
            _ => return None,
        };
        events.push(e);
    }
    Some(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Event> {
        vec![
            Event::Note("a note\twith a tab\nand a line \\ break".into()),
            Event::Alias("b".into(), "a".into()),
            Event::Item(RawItem {
                path: "app::m::f".into(),
                names: vec!["f".into()],
                digest: "00ff".into(),
                refs: vec!["g".into(), "h".into()],
                cfgs: vec!["feature = \"wide\"".into()],
                includes: vec![PathBuf::from("/x/a b.txt")],
                inputs: vec!["env\tNU_FACTOR".into(), "path\tconcat ! (\"a\tb\")".into()],
                impl_of: None,
                always: false,
            }),
            Event::Item(RawItem {
                path: "app::<S as T>".into(),
                names: Vec::new(),
                digest: "11".into(),
                refs: Vec::new(),
                cfgs: Vec::new(),
                includes: Vec::new(),
                inputs: Vec::new(),
                impl_of: Some(("S".into(), "T".into())),
                always: true,
            }),
            Event::Mod(ModDecl {
                module: "app::m".into(),
                mod_dir: PathBuf::from("/x/src/m"),
                cfgs: Vec::new(),
                candidates: vec![
                    PathBuf::from("/x/src/m.rs"),
                    PathBuf::from("/x/src/m/mod.rs"),
                ],
            }),
        ]
    }

    #[test]
    fn entries_read_back_exactly_and_anything_else_is_a_miss() {
        let text = encode(&sample(), "k1").unwrap();
        assert_eq!(decode(&text, "k1"), Some(sample()));
        // Another key's entry (a renamed file) is not this key's.
        assert_eq!(decode(&text, "k2"), None);
        // Every truncation, and every one-byte change, is a miss.
        for n in 0..text.len() {
            assert_eq!(decode(&text[..n], "k1"), None, "truncated at {n}");
        }
        let bytes = text.as_bytes();
        for i in (0..bytes.len()).step_by(7) {
            let mut b = bytes.to_vec();
            b[i] = if b[i] == b'x' { b'y' } else { b'x' };
            if let Ok(t) = String::from_utf8(b) {
                assert_eq!(decode(&t, "k1"), None, "byte {i} changed");
            }
        }
    }

    #[test]
    fn the_key_covers_bytes_and_context_and_the_macro() {
        let c = Cache::at(PathBuf::from("/nowhere"), Some("lock1"), "lib 1 1");
        let fc = FileCtx {
            file: PathBuf::from("/x/src/m.rs"),
            module: "app::m".into(),
            mod_dir: PathBuf::from("/x/src/m"),
            cfgs: Vec::new(),
            ours: false,
        };
        let k = c.key(&fc, "d1").unwrap();
        assert_eq!(c.key(&fc, "d1").unwrap(), k);
        assert_ne!(c.key(&fc, "d2").unwrap(), k);
        let other = [
            FileCtx {
                file: PathBuf::from("/x/src/n.rs"),
                ..fc.clone()
            },
            FileCtx {
                module: "app::n".into(),
                ..fc.clone()
            },
            FileCtx {
                mod_dir: PathBuf::from("/x/src/n"),
                ..fc.clone()
            },
            FileCtx {
                cfgs: vec!["test".into()],
                ..fc.clone()
            },
            FileCtx {
                ours: true,
                ..fc.clone()
            },
        ];
        for o in &other {
            assert_ne!(c.key(o, "d1").unwrap(), k, "{o:?}");
        }
        // Another Cargo.lock (another syn, ...) is another macro.
        let c2 = Cache::at(PathBuf::from("/nowhere"), Some("lock2"), "lib 1 1");
        assert_ne!(c2.key(&fc, "d1").unwrap(), k);
        // A rebuilt macro library is another macro.
        let c3 = Cache::at(PathBuf::from("/nowhere"), Some("lock1"), "lib 1 2");
        assert_ne!(c3.key(&fc, "d1").unwrap(), k);
    }

    #[test]
    fn the_folder_is_beside_rustcs_out_dir() {
        let args: Vec<String> = ["rustc", "--out-dir", "/t/debug/deps", "src/main.rs"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let lib = || Some("lib 1 1".to_string());
        let c = Cache::for_rustc_with(&args, None, lib()).unwrap();
        assert_eq!(c.dir(), Path::new("/t/debug/puzzletron-macros-cache"));
        let eq = vec!["rustc".to_string(), "--out-dir=/u/release/deps".to_string()];
        assert_eq!(
            Cache::for_rustc_with(&eq, None, lib()).unwrap().dir(),
            Path::new("/u/release/puzzletron-macros-cache")
        );
        assert!(Cache::for_rustc_with(&["rustc".to_string()], None, lib()).is_none());
        // A macro library that cannot be identified: no cache.
        assert!(Cache::for_rustc_with(&args, None, None).is_none());
        // On Linux this test binary is found in /proc/self/maps.
        #[cfg(target_os = "linux")]
        assert!(macro_library().is_some_and(|l| l.contains("puzzletron_macros")));
    }
}
