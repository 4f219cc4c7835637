//! Compile-time, item-level code identity for puzzletron jobs.
//!
//! Use it through `puzzletron::job!`; this crate's macro is an implementation detail whose
//! input and output may change between versions.
//!
//! At expansion, [`job_code!`] reads the sources of the calling package and of its path and
//! workspace dependencies (found from the manifests, starting at `CARGO_MANIFEST_DIR`), parses
//! them with `syn` (a file whose bytes, place and macro build are unchanged since an earlier
//! build is not parsed again: its part of the index comes from the per-file cache, see
//! `cache.rs`), computes the job's conservative reachability closure (see `index.rs`), hashes
//! each item token-wise (comments, formatting and `///` docs do not count) and expands to a
//! `&'static puzzletron::identity::CompiledCode` holding the per-item digests, the `cfg`
//! predicates of the closure (evaluated with `cfg!` in the calling crate), the build ids of
//! dependencies whose `cfg`s the calling crate cannot evaluate, the Cargo.lock digest and the
//! profile. Every file read is named in a `const _: &[u8] = include_bytes!(..)`, so rustc's
//! dep-info makes cargo rebuild the calling crate when any of them changes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use proc_macro::TokenStream;
use quote::quote;

mod cache;
mod depinfo;
mod index;
mod manifest;
mod scan;

use cache::Cache;
use depinfo::{BuildEnv, Lookup};
use index::{Index, included_files, sha256_hex};

thread_local! {
    // One parse per package per rustc process: a crate with many jobs parses its sources once.
    static CACHE: RefCell<HashMap<PathBuf, Rc<RefCell<Index>>>> = RefCell::new(HashMap::new());
    // File digests, once per rustc process (hashing is slow in an unoptimised proc macro).
    static FILE_DIGESTS: RefCell<HashMap<PathBuf, Option<String>>> = RefCell::new(HashMap::new());
    // Files already tracked by an `include_bytes!` in this crate: one is enough for cargo's
    // dep-info, so later `job!`s of the crate do not embed them again.
    static TRACKED: RefCell<BTreeSet<PathBuf>> = const { RefCell::new(BTreeSet::new()) };
}

/// Runs `f` with proc-macro2's own token types instead of the compiler's: parsing through the
/// compiler's proc-macro bridge costs a round trip per token, and the fallback types also work on
/// other threads. Nothing made inside may escape as tokens (the index holds only strings):
/// mixing the two kinds of token panics.
fn with_fallback_tokens<T>(f: impl FnOnce() -> T) -> T {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            proc_macro2::fallback::unforce();
        }
    }
    proc_macro2::fallback::force();
    let _restore = Restore;
    f()
}

/// The sha256 of a file's bytes, computed once per process; `None` if it cannot be read.
fn file_digest(p: &Path) -> Option<String> {
    FILE_DIGESTS.with(|c| {
        c.borrow_mut()
            .entry(p.to_path_buf())
            .or_insert_with(|| std::fs::read(p).ok().map(|b| sha256_hex(&b)))
            .clone()
    })
}

/// The index read each file once, as it parsed it: those are the files' digests.
fn remember_digests(ix: &Index) {
    FILE_DIGESTS.with(|c| {
        let mut c = c.borrow_mut();
        for (p, d) in &ix.file_digests {
            c.entry(p.clone()).or_insert_with(|| Some(d.clone()));
        }
    });
}

/// `job_code!($crate; path::to::job_fn)`: the compiled code identity of a job function, as a
/// `&'static $crate::identity::CompiledCode`.
#[proc_macro]
pub fn job_code(input: TokenStream) -> TokenStream {
    match expand(input) {
        Ok(ts) => ts.into(),
        Err(msg) => quote!(compile_error!(#msg)).into(),
    }
}

fn first_span(ts: TokenStream) -> Option<proc_macro::Span> {
    let t = ts.into_iter().next()?;
    match &t {
        proc_macro::TokenTree::Group(g) if g.delimiter() == proc_macro::Delimiter::None => {
            first_span(g.stream()).or(Some(t.span()))
        }
        _ => Some(t.span()),
    }
}

fn expand(input: TokenStream) -> Result<proc_macro2::TokenStream, String> {
    let mut krate = proc_macro2::TokenStream::new();
    let mut rest = TokenStream::new();
    let mut after = false;
    for t in input {
        if !after {
            if let proc_macro::TokenTree::Punct(p) = &t
                && p.as_char() == ';'
            {
                after = true;
                continue;
            }
            krate.extend(proc_macro2::TokenStream::from(TokenStream::from(t)));
        } else {
            rest.extend([t]);
        }
    }
    // `$f:path` from `job!` arrives as one invisible group.
    let mut toks: Vec<proc_macro::TokenTree> = rest.clone().into_iter().collect();
    if let [proc_macro::TokenTree::Group(g)] = toks.as_slice()
        && g.delimiter() == proc_macro::Delimiter::None
    {
        toks = g.stream().into_iter().collect();
    }
    let job_path: syn::Path =
        syn::parse(toks.into_iter().collect::<TokenStream>()).map_err(|e| format!("job!: {e}"))?;
    let call_file = first_span(rest).and_then(|s| s.local_file());

    let manifest_dir = PathBuf::from(
        std::env::var("CARGO_MANIFEST_DIR")
            .map_err(|_| "job!: CARGO_MANIFEST_DIR is not set (build with cargo)".to_string())?,
    );
    let manifest_dir = std::fs::canonicalize(&manifest_dir).unwrap_or(manifest_dir);
    let args: Vec<String> = std::env::args().collect();
    let lock = manifest_dir
        .ancestors()
        .map(|d| d.join("Cargo.lock"))
        .find(|p| p.is_file());
    // The workspace root (cargo hashes path packages under it by their relative path).
    let ws_root = manifest::workspace_manifest(&manifest_dir)
        .and_then(|(m, _)| m.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| manifest_dir.clone());
    let ix = CACHE.with(|c| {
        c.borrow_mut()
            .entry(manifest_dir.clone())
            .or_insert_with(|| {
                let mut notes = Vec::new();
                let pkgs = manifest::packages(&manifest_dir, &mut notes);
                let lock_digest = lock.as_deref().and_then(file_digest);
                let cache = Cache::for_rustc(&args, lock_digest.as_deref());
                let env = BuildEnv::for_rustc(&args, Some(&ws_root));
                let mut ix = with_fallback_tokens(|| Index::build_in(pkgs, cache, env));
                ix.notes.extend(notes);
                remember_digests(&ix);
                Rc::new(RefCell::new(ix))
            })
            .clone()
    });
    let mut ix = ix.borrow_mut();
    let mut notes: Vec<String> = Vec::new();
    if let Some(f) = &call_file {
        let abs = if f.is_absolute() {
            f.clone()
        } else {
            std::env::current_dir()
                .map(|d| d.join(f))
                .unwrap_or(f.clone())
        };
        let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
        with_fallback_tokens(|| ix.add_root(&abs));
        remember_digests(&ix);
    } else {
        notes.push(
            "the job's file is unknown to the macro: only the package's targets are analysed"
                .into(),
        );
    }

    // The job's function: the functions of that name whose path ends like the one written.
    let segs: Vec<String> = job_path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .filter(|s| s != "crate" && s != "self" && s != "super")
        .collect();
    let last = segs.last().cloned().unwrap_or_default();
    let candidates = ix.functions_named(&last);
    let suffix = format!("::{}", segs.join("::"));
    let exact: Vec<usize> = candidates
        .iter()
        .copied()
        .filter(|&i| {
            let p = &ix.items[i].path;
            p.ends_with(&suffix) || p.split('#').next().is_some_and(|b| b.ends_with(&suffix))
        })
        .collect();
    let start: Vec<usize> = if !exact.is_empty() {
        exact
    } else if !candidates.is_empty() {
        candidates
    } else {
        notes.push(format!(
            "function `{last}` not found in the sources: every item of the package is included"
        ));
        (0..ix.items.len())
            .filter(|&i| ix.packages[ix.items[i].package].user)
            .collect()
    };
    let closure = ix.closure(&start);
    notes.extend(ix.notes.iter().cloned());
    let includes = included_files(&ix, &closure, &mut notes);
    let inputs = with_fallback_tokens(|| compiled_inputs(&ix, &closure, &mut notes));

    // Items, by path.
    let mut items: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut user_cfgs: BTreeSet<String> = BTreeSet::new();
    let mut dep_cfg: BTreeSet<usize> = BTreeSet::new();
    for &i in &closure {
        let it = &ix.items[i];
        items.insert(
            it.path.clone(),
            (ix.rel(it.package, &it.file), it.digest.clone()),
        );
        if ix.packages[it.package].user {
            user_cfgs.extend(it.cfgs.iter().cloned());
        } else if !it.cfgs.is_empty() && !ix.packages[it.package].proc_macro {
            // A proc-macro crate's cfgs are the host's at compile time; its items count, its
            // build does not run in the job.
            dep_cfg.insert(it.package);
        }
    }
    for (f, (pkg, digest)) in &includes {
        let rel = ix.rel(*pkg, f);
        items.insert(format!("file {rel}"), (rel, digest.clone()));
    }
    items.extend(inputs.items.clone());

    // A dependency's features are not the calling crate's: its `cfg`s are witnessed by the
    // build id cargo gave it (its `-C extra-filename` hash covers its features, target and
    // profile), read from this rustc's `--extern` arguments.
    let mut builds: BTreeMap<String, String> = BTreeMap::new();
    for pkg in dep_cfg {
        let name = ix.packages[pkg].lib_name.clone();
        match extern_build_id(&args, &name) {
            Some(id) => {
                builds.insert(name, id);
            }
            None => {
                // Not a direct dependency (no `--extern`): the build ids of the direct owned
                // dependencies stand for it (cargo's hash of a crate covers its dependencies'),
                // and the manifests in case it is not below any of them.
                notes.push(format!(
                    "no --extern build id for `{name}` (not a direct dependency): its cfg \
                     predicates are covered by the direct dependencies' build ids and the manifests"
                ));
                for p in ix.packages.iter().filter(|p| !p.user) {
                    if let Some(id) = extern_build_id(&args, &p.lib_name) {
                        builds.insert(p.lib_name.clone(), id);
                    }
                }
                let mut all = String::new();
                for p in &ix.packages {
                    if let Ok(t) = std::fs::read(&p.manifest) {
                        all.push_str(&sha256_hex(&t));
                    }
                }
                builds.insert(name, format!("manifests:{}", sha256_hex(all.as_bytes())));
            }
        }
    }
    // Cargo's build id hashes the absolute path of a path package outside the workspace root:
    // then the key depends on where that package is, which the user can only fix by moving it.
    for name in builds.keys() {
        let Some(pkg) = ix
            .packages
            .iter()
            .position(|p| !p.user && &p.lib_name == name)
        else {
            continue;
        };
        let outside = manifest::outside_root(&ix.packages, pkg, &ws_root);
        if !outside.is_empty() {
            let list: Vec<String> = outside.iter().map(|d| d.display().to_string()).collect();
            notes.push(format!(
                "the build id of `{name}` (which stands for the values of its cfg predicates) is \
                 cargo's hash, which includes the absolute path of {} (outside the workspace \
                 root {}): this job's keys change if it moves; a path dependency under the \
                 workspace root is hashed by its relative path",
                list.join(", "),
                ws_root.display()
            ));
        }
    }
    let opt_level = opt_level(&args);

    let lock_tokens = match &lock {
        Some(p) => {
            let d = file_digest(p).ok_or_else(|| format!("job!: cannot read {}", p.display()))?;
            let path = p.to_string_lossy().into_owned();
            quote!(::core::option::Option::Some((#path, #d)))
        }
        None => quote!(::core::option::Option::None),
    };

    // Files whose change must rebuild the calling crate.
    let mut tracked: BTreeSet<PathBuf> = ix.files.clone();
    tracked.extend(includes.keys().cloned());
    tracked.extend(ix.packages.iter().map(|p| p.manifest.clone()));
    if let Some(l) = &lock {
        tracked.insert(l.clone());
    }
    if let Some((m, _)) = manifest::workspace_manifest(&manifest_dir) {
        tracked.insert(m);
    }
    let fresh: Vec<PathBuf> = TRACKED.with(|t| {
        let mut t = t.borrow_mut();
        tracked
            .iter()
            .filter(|p| p.is_file() && t.insert((*p).clone()))
            .cloned()
            .collect()
    });
    let track = fresh.iter().map(|p| {
        let s = p.to_string_lossy().into_owned();
        quote!(
            const _: &[u8] = include_bytes!(#s);
        )
    });
    // Environment variables whose values are in the key: named here too, so rustc's dep-info
    // makes cargo rebuild this crate when one changes (the macro reads them at expansion).
    let track_env = inputs.env.iter().map(|n| {
        quote!(
            const _: ::core::option::Option<&str> = option_env!(#n);
        )
    });
    let files: Vec<proc_macro2::TokenStream> = ix
        .files
        .iter()
        .chain(includes.keys())
        .filter_map(|p| {
            let d = file_digest(p)?;
            let s = p.to_string_lossy().into_owned();
            Some(quote!((#s, #d)))
        })
        .collect();

    let item_tokens = items.iter().map(|(path, (file, digest))| {
        quote!(#krate::identity::CompiledItem::__new(#path, #file, #digest))
    });
    let cfg_tokens = user_cfgs
        .iter()
        .map(|pred| -> Result<proc_macro2::TokenStream, String> {
            let toks: proc_macro2::TokenStream = pred
                .parse()
                .map_err(|e| format!("job!: cfg predicate `{pred}`: {e}"))?;
            Ok(quote!((#pred, cfg!(#toks))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let build_tokens = builds.iter().map(|(n, id)| quote!((#n, #id)));
    notes.sort();
    notes.dedup();
    let package = ix
        .packages
        .first()
        .map(|p| p.lib_name.clone())
        .unwrap_or_default();
    Ok(quote! {{
        #(#track)*
        #(#track_env)*
        // A `const fn` call, not a struct literal: `CompiledCode` is `#[non_exhaustive]` and
        // this expands in the user's crate.
        static CODE: #krate::identity::CompiledCode = #krate::identity::CompiledCode::__new(
            #package,
            &[#(#item_tokens),*],
            &[#(#cfg_tokens),*],
            &[#(#build_tokens),*],
            &[#(#files),*],
            #lock_tokens,
            #opt_level,
            cfg!(debug_assertions),
            &[#(#notes),*],
        );
        &CODE
    }})
}

/// The hash cargo put in the file name of `--extern name=.../libname-HASH.rlib`.
fn extern_build_id(args: &[String], name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let spec = if a == "--extern" {
            it.next()?.as_str()
        } else if let Some(s) = a.strip_prefix("--extern=") {
            s
        } else {
            continue;
        };
        if let Some(path) = spec.strip_prefix(&prefix) {
            let stem = Path::new(path).file_stem()?.to_string_lossy().into_owned();
            return Some(
                stem.rsplit_once('-')
                    .map(|(_, h)| h.to_string())
                    .unwrap_or(stem),
            );
        }
    }
    None
}

/// `-C opt-level=N` of this rustc (`0` when not given).
fn opt_level(args: &[String]) -> String {
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        let v = if a == "-C" {
            it.peek().map(|s| s.as_str())
        } else {
            a.strip_prefix("-C")
        };
        if let Some(v) = v.and_then(|v| v.strip_prefix("opt-level=")) {
            return v.to_string();
        }
    }
    "0".into()
}

/// The compile-time inputs of a closure other than literal include files, made key material.
#[derive(Default)]
struct Inputs {
    /// Items to add: path -> (file, digest).
    items: BTreeMap<String, (String, String)>,
    /// Variables read here whose values are in the key (to be named in the expansion).
    env: BTreeSet<String>,
}

/// Variables cargo sets from a package's `Cargo.toml` besides `CARGO_PKG_*` (see "Environment
/// variables Cargo sets for crates" in the Cargo book).
const MANIFEST_VARS: &[&str] = &["CARGO_CRATE_NAME"];

/// The digest of a variable's value as keyed: SHA-256 of `"set\n" ++ value` (the build's places
/// in it replaced by placeholders, see `BuildEnv::normalize`), or of `"unset"`.
fn value_digest(value: Option<&str>) -> String {
    match value {
        Some(v) => {
            let mut b = b"set\n".to_vec();
            b.extend_from_slice(v.as_bytes());
            sha256_hex(&b)
        }
        None => sha256_hex(b"unset"),
    }
}

/// The closure's `env!`/`option_env!` values and the computed include paths the index could
/// not evaluate (those it could are literal includes by now, see `Index::push_item`). What is
/// keyed is what the build reproduces, never where it is nor the compiled bytes:
///
/// - a variable that says where the build is (`OUT_DIR`, `CARGO_MANIFEST_DIR`, ...: see
///   `depinfo::is_location`) is not keyed (what is read through it is, by content);
/// - in the calling package (its library and targets, which rustc compiles with this
///   process's environment), a variable's value is read here and is an item `env NAME` (the
///   digest of the value with the build's places replaced by placeholders, or of "unset");
///   so is one read by a dependency's `macro_rules!` (it expands in the crate that invokes it);
/// - in a dependency, a variable cargo sets from its `Cargo.toml` (`CARGO_PKG_*`,
///   `CARGO_CRATE_NAME`) is an item `manifest DEP`, the digest of that file; any other (its
///   build script's `cargo:rustc-env`, the environment) is an item `env DEP: NAME`, its value
///   as rustc's dep-info of that dependency records it (nothing when rustc did not read it:
///   the code reading it is not compiled); nothing from a proc-macro crate (its code runs in
///   the compiler);
/// - in a dependency, a variable or include path that cannot be evaluated (no dep-info,
///   candidate builds that disagree, another macro's output) makes the item `inputs DEP`: every
///   variable and every file other than its parsed sources that its dep-info records;
/// - an argument that cannot be evaluated in the calling package gets a note: its value is not
///   in the key.
fn compiled_inputs(ix: &Index, closure: &BTreeSet<usize>, notes: &mut Vec<String>) -> Inputs {
    let mut out = Inputs::default();
    let mut fallback: BTreeSet<usize> = BTreeSet::new();
    let user_pkg = &ix.packages[0];
    let user_out_dir = ix.env.out_dir(user_pkg);
    let user_value = |name: &str| -> String {
        match std::env::var_os(name) {
            Some(v) => match v.to_str() {
                Some(s) => value_digest(Some(&ix.env.normalize(
                    user_pkg,
                    user_out_dir.as_deref(),
                    s,
                ))),
                None => {
                    let mut b = b"set\n".to_vec();
                    b.extend_from_slice(v.as_encoded_bytes());
                    sha256_hex(&b)
                }
            },
            None => value_digest(None),
        }
    };
    for &i in closure {
        let it = &ix.items[i];
        let pkg = &ix.packages[it.package];
        let file = ix.rel(it.package, &it.file);
        // A proc-macro crate's code runs in the compiler, never in the job.
        if pkg.proc_macro {
            continue;
        }
        // `name!` (not `name!#n`, an item-level invocation): a `macro_rules!`.
        let expands_here = !pkg.user && it.path.ends_with('!');
        for (_, input) in &it.inputs {
            match input {
                scan::Input::Code(_) | scan::Input::Evaluated(_) => {}
                scan::Input::Env(name) => {
                    if depinfo::is_location(name) {
                        continue;
                    }
                    if pkg.user || expands_here {
                        out.items
                            .insert(format!("env {name}"), (file.clone(), user_value(name)));
                        out.env.insert(name.clone());
                    }
                    if pkg.user {
                        continue;
                    }
                    if MANIFEST_VARS.contains(&name.as_str()) || name.starts_with("CARGO_PKG_") {
                        // Fixed by the dependency's `Cargo.toml`: its bytes stand for the value.
                        let digest = std::fs::read(&pkg.manifest)
                            .map(|b| sha256_hex(&b))
                            .unwrap_or_else(|_| sha256_hex(b"unreadable manifest"));
                        out.items.insert(
                            format!("manifest {}", pkg.lib_name),
                            (ix.rel(it.package, &pkg.manifest), digest),
                        );
                        continue;
                    }
                    match ix.env.var(pkg, name) {
                        Lookup::Value(v) => {
                            let od = ix.env.out_dir(pkg);
                            let v = v.map(|v| ix.env.normalize(pkg, od.as_deref(), &v));
                            out.items.insert(
                                format!("env {}: {name}", pkg.lib_name),
                                (file.clone(), value_digest(v.as_deref())),
                            );
                        }
                        Lookup::NotRead => {}
                        Lookup::Unknown => {
                            fallback.insert(it.package);
                        }
                    }
                }
                // Not evaluable by the index (see `Index::push_item`).
                scan::Input::Path(argtext) | scan::Input::CodePath(argtext) => {
                    if pkg.user {
                        notes.push(format!(
                            "include path `{argtext}` in {} ({file}) cannot be evaluated by \
                             the macro: the included file is NOT in the key (write a string \
                             literal, or concat!/env! of literals)",
                            it.path
                        ));
                    } else {
                        fallback.insert(it.package);
                    }
                }
                scan::Input::Unknown(argtext) => {
                    if pkg.user {
                        notes.push(format!(
                            "`env!({argtext})` in {} ({file}): the variable is not known to the \
                             macro, its value is NOT in the key",
                            it.path
                        ));
                    } else {
                        fallback.insert(it.package);
                    }
                }
            }
        }
    }
    for pkg in fallback {
        let p = &ix.packages[pkg];
        match dep_inputs_digest(ix, p) {
            Some(d) => {
                notes.push(format!(
                    "`{0}` compiles in values the macro cannot evaluate (an include path or \
                     variable made by another macro, or several builds of it that disagree): \
                     every variable and non-source file its build read is in the key (item \
                     `inputs {0}`)",
                    p.lib_name
                ));
                out.items.insert(
                    format!("inputs {}", p.lib_name),
                    (format!("{}: (dep-info)", p.lib_name), d),
                );
            }
            // Not built by cargo (no dep-info beside the `--extern` file): rather a rerun
            // after every rebuild than a skip of changed code.
            None => match depinfo::artifact_digest(ix.env.args(), &p.lib_name) {
                Some(d) => {
                    notes.push(format!(
                        "`{}` compiles in environment variables or computed include paths that \
                         the macro cannot evaluate, and rustc's dep-info of its build was not \
                         found: its compiled artifact stands for them (runs rerun after each \
                         rebuild of it)",
                        p.lib_name
                    ));
                    out.items.insert(
                        format!("compiled {}", p.lib_name),
                        (format!("{}: (artifact)", p.lib_name), d),
                    );
                }
                None => notes.push(format!(
                    "`{}` compiles in environment variables or computed include paths that the \
                     macro cannot evaluate, and neither rustc's dep-info of its build nor its \
                     compiled artifact was found: they are NOT in the key",
                    p.lib_name
                )),
            },
        }
    }
    out
}

/// Everything the dep-info of dependency `p`'s builds records besides its parsed sources: each
/// variable (location variables left out, places in values replaced) and each other file read
/// (by its label relative to that build's `OUT_DIR` or the package, and its bytes). `None` when
/// no dep-info was found.
fn dep_inputs_digest(ix: &Index, p: &manifest::Package) -> Option<String> {
    let infos = ix.env.dep_infos(&p.lib_name);
    if infos.is_empty() {
        return None;
    }
    let mut lines: BTreeSet<String> = BTreeSet::new();
    for info in infos.iter() {
        let od = info
            .env
            .get("OUT_DIR")
            .cloned()
            .flatten()
            .map(PathBuf::from);
        for (n, v) in &info.env {
            if depinfo::is_location(n) {
                continue;
            }
            lines.insert(match v {
                Some(v) => format!("env {n}={}", ix.env.normalize(p, od.as_deref(), v)),
                None => format!("env {n} unset"),
            });
        }
        for f in info.files.iter().filter(|f| !ix.files.contains(*f)) {
            let digest = std::fs::read(f)
                .map(|b| sha256_hex(&b))
                .unwrap_or_else(|_| "unreadable".into());
            lines.insert(format!(
                "file {} {digest}",
                index::file_label(f, &p.dir, od.as_deref())
            ));
        }
    }
    let joined: Vec<String> = lines.into_iter().collect();
    Some(sha256_hex(joined.join("\n").as_bytes()))
}

/// The compile-time value of a string-producing macro argument: string and char literals,
/// unsuffixed integers and booleans, `concat!`, `env!` (through `env`, which answers `None` for a
/// variable it cannot know and `Some(None)` for an unset one: then `env!` fails to compile, and
/// so does the include). `None`: not evaluable here.
pub(crate) fn eval_str(
    ts: proc_macro2::TokenStream,
    env: &dyn Fn(&str) -> Option<Option<String>>,
) -> Option<String> {
    use proc_macro2::TokenTree as T;
    let mut toks: Vec<T> = ts.into_iter().collect();
    if matches!(toks.last(), Some(T::Punct(p)) if p.as_char() == ',') {
        toks.pop();
    }
    match toks.as_slice() {
        [T::Literal(l)] => match syn::parse2::<syn::Lit>(T::Literal(l.clone()).into()).ok()? {
            syn::Lit::Str(s) => Some(s.value()),
            syn::Lit::Char(c) => Some(c.value().to_string()),
            syn::Lit::Int(i) if i.suffix().is_empty() => Some(i.base10_digits().to_string()),
            _ => None,
        },
        [T::Ident(b)] if b == "true" || b == "false" => Some(b.to_string()),
        [prefix @ .., T::Ident(m), T::Punct(bang), T::Group(g)] if bang.as_char() == '!' => {
            // `std::concat!`, `::core::env!`: the standard macros only.
            let std_path = prefix.iter().all(|t| match t {
                T::Punct(p) => p.as_char() == ':',
                T::Ident(i) => i == "std" || i == "core",
                _ => false,
            });
            if !std_path {
                return None;
            }
            let parts = split_commas(g.stream());
            match m.to_string().as_str() {
                "concat" => {
                    let mut s = String::new();
                    for p in parts {
                        s.push_str(&eval_str(p, env)?);
                    }
                    Some(s)
                }
                "env" => {
                    let name = eval_str(parts.into_iter().next()?, env)?;
                    env(&name)?
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The comma-separated parts of a macro's arguments (a trailing comma makes no part).
fn split_commas(ts: proc_macro2::TokenStream) -> Vec<proc_macro2::TokenStream> {
    let mut parts = vec![proc_macro2::TokenStream::new()];
    for t in ts {
        match &t {
            proc_macro2::TokenTree::Punct(p) if p.as_char() == ',' => {
                parts.push(proc_macro2::TokenStream::new())
            }
            _ => parts.last_mut().expect("one part").extend([t]),
        }
    }
    if parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(src: &str, user: bool) -> Option<String> {
        let env = |n: &str| -> Option<Option<String>> {
            match n {
                "CARGO_MANIFEST_DIR" => Some(Some("/pkg".into())),
                "SET" => user.then(|| Some("v".into())),
                _ => user.then_some(None),
            }
        };
        eval_str(src.parse().unwrap(), &env)
    }

    #[test]
    fn include_paths_are_evaluated_where_the_macro_can() {
        assert_eq!(eval(r#""a.txt""#, true).as_deref(), Some("a.txt"));
        assert_eq!(
            eval(
                r#"concat!(env!("CARGO_MANIFEST_DIR"), "/d/", 1, '.', "txt")"#,
                false
            )
            .as_deref(),
            Some("/pkg/d/1.txt")
        );
        assert_eq!(
            eval(r#"std::concat!(::core::env!("SET"), "/x",)"#, true).as_deref(),
            Some("v/x")
        );
        // A dependency's variables, unset variables, other macros and fragments: not known.
        assert_eq!(eval(r#"concat!(env!("SET"), "/x")"#, false), None);
        assert_eq!(eval(r#"env!("UNSET")"#, true), None);
        assert_eq!(eval(r#"my_path!()"#, true), None);
        assert_eq!(eval(r#"$p"#, true), None);
    }
}
