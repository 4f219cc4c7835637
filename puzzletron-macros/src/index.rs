//! The item index of the owned crates and the conservative reachability closure of a job.
//!
//! Resolution is by name, never by type inference: an identifier reaches every owned item of that
//! name (a method call reaches every owned method of that name), a type or trait reaches every
//! owned trait impl that names it (so `dyn Trait`, generic bounds and operator impls are
//! covered). This over-includes, never under-includes, except for what no source shows: items
//! made by item-level macro invocations, which are therefore always included (and said once).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use quote::ToTokens;
use sha2::{Digest, Sha256};

use crate::cache::Cache;
use crate::depinfo::{BuildEnv, Lookup};
use crate::manifest::Package;
use crate::scan::{Input, Scan, scan};

/// One owned item, reduced to plain data.
#[derive(Debug, Clone)]
pub struct Item {
    /// Display path, e.g. `ccdemo::helpers::smooth`, `ccdemo::model::<Linear as Model>`.
    pub path: String,
    /// Index of its package.
    pub package: usize,
    /// Its file, absolute.
    pub file: PathBuf,
    /// SHA-256 of its canonical tokens (hex).
    pub digest: String,
    /// Identifiers it names.
    pub refs: Vec<String>,
    /// `cfg` predicates in it or on its enclosing modules.
    pub cfgs: Vec<String>,
    /// Files it includes, absolute (with those of the files it `include!`s).
    pub includes: Vec<PathBuf>,
    /// Its other compile-time inputs (`env!`, non-literal include paths, ...), each with the
    /// folder a relative path in it is resolved from (the file of the invocation).
    pub inputs: Vec<(PathBuf, Input)>,
    /// For trait impls: the self type's and the trait's last identifiers.
    pub impl_of: Option<(String, String)>,
    /// Always part of every closure (item-level macro invocations, unparsable files).
    pub always: bool,
}

/// All owned items, by name.
#[derive(Debug, Default)]
pub struct Index {
    pub packages: Vec<Package>,
    pub items: Vec<Item>,
    by_name: HashMap<String, Vec<usize>>,
    impls_by_type: HashMap<String, Vec<usize>>,
    impls_by_trait: HashMap<String, Vec<usize>>,
    /// `visible[a][b]`: code of package `a` can name items of package `b` (itself and its
    /// dependencies; a crate cannot name its dependents' items).
    visible: Vec<Vec<bool>>,
    aliases: HashMap<String, Vec<String>>,
    /// Every source file parsed (cargo must rebuild when one changes).
    pub files: BTreeSet<PathBuf>,
    /// What the analysis could not see, said once.
    pub notes: Vec<String>,
    /// SHA-256 (hex) of each file in `files` that could be read, as read for the index.
    pub file_digests: BTreeMap<PathBuf, String>,
    /// Paths of `items` (to number a repeated one).
    paths: HashSet<String>,
    cache: Option<Cache>,
    /// Cache hits and misses of this index's files.
    pub stats: CacheStats,
    /// Files read ahead of the replay (see `prefetch`).
    ahead: HashMap<FileCtx, Loaded>,
    /// What each package was compiled with (`env!` values, `OUT_DIR`).
    pub env: BuildEnv,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 hex of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn last_ident_of_type(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => last_ident_of_type(&r.elem),
        syn::Type::Paren(p) => last_ident_of_type(&p.elem),
        syn::Type::Group(g) => last_ident_of_type(&g.elem),
        syn::Type::Slice(s) => last_ident_of_type(&s.elem),
        syn::Type::Array(a) => last_ident_of_type(&a.elem),
        syn::Type::Ptr(p) => last_ident_of_type(&p.elem),
        syn::Type::TraitObject(t) => t.bounds.iter().find_map(|b| match b {
            syn::TypeParamBound::Trait(t) => t.path.segments.last().map(|s| s.ident.to_string()),
            _ => None,
        }),
        _ => None,
    }
}

/// Where a file sits in its crate: with the file's bytes, everything its [`Event`]s depend on
/// (so, with the bytes' digest and the macro's identity, the per-file cache key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileCtx {
    /// The file, absolute.
    pub file: PathBuf,
    /// Its module path, e.g. `ccdemo::helpers`.
    pub module: String,
    /// The folder its non-inline child modules' files are looked up in.
    pub mod_dir: PathBuf,
    /// `cfg` predicates on its enclosing modules.
    pub cfgs: Vec<String>,
    /// A file of puzzletron's own crates: its item-level macros are included without a note.
    pub ours: bool,
}

/// One owned item as its file shows it, before its path is made unique across the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawItem {
    pub path: String,
    /// Names it is found by.
    pub names: Vec<String>,
    pub digest: String,
    pub refs: Vec<String>,
    pub cfgs: Vec<String>,
    pub includes: Vec<PathBuf>,
    /// [`Scan::inputs`] (encoded [`Input`]s; paths relative to the item's file).
    pub inputs: Vec<String>,
    pub impl_of: Option<(String, String)>,
    pub always: bool,
}

/// A child module declared without a body (`mod m;`): its file is looked up when the index is
/// put together (whether a file exists is not a fact of the declaring file's bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModDecl {
    pub module: String,
    pub mod_dir: PathBuf,
    pub cfgs: Vec<String>,
    /// Files to try, in order.
    pub candidates: Vec<PathBuf>,
}

/// What one file contributes to the index, in walk order (the order fixes the `#n` suffixes of
/// items whose path repeats, so replaying the events rebuilds exactly the same index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Item(RawItem),
    Note(String),
    /// `use a as b`: (`b`, `a`).
    Alias(String, String),
    Mod(ModDecl),
}

/// The events of one file: a pure function of its text and its [`FileCtx`].
pub fn file_events(fc: &FileCtx, text: &str) -> Vec<Event> {
    let mut w = Walker {
        fc,
        events: Vec::new(),
    };
    match syn::parse_file(text) {
        Ok(f) => w.walk(&fc.module, &fc.mod_dir, &fc.cfgs, &f.items),
        Err(e) => {
            // Not parsable by syn (e.g. newer syntax): the whole file counts, byte-wise.
            w.events.push(Event::Note(format!(
                "{} could not be parsed ({e}): the whole file is included",
                fc.file.display()
            )));
            w.events.push(Event::Item(RawItem {
                path: format!("{} ({})", fc.module, fc.file.display()),
                names: Vec::new(),
                digest: sha256_hex(text.as_bytes()),
                refs: Vec::new(),
                cfgs: fc.cfgs.clone(),
                includes: Vec::new(),
                inputs: Vec::new(),
                impl_of: None,
                always: true,
            }));
        }
    }
    w.events
}

struct Walker<'a> {
    fc: &'a FileCtx,
    events: Vec<Event>,
}

impl Walker<'_> {
    fn push(&mut self, cfgs: &[String], path: String, names: Vec<String>, tokens: impl ToTokens) {
        self.push_full(cfgs, path, names, tokens, None, false, Vec::new())
    }

    #[allow(clippy::too_many_arguments)]
    fn push_full(
        &mut self,
        ctx_cfgs: &[String],
        path: String,
        names: Vec<String>,
        tokens: impl ToTokens,
        impl_of: Option<(String, String)>,
        always: bool,
        extra_refs: Vec<String>,
    ) {
        let mut s = Scan::default();
        scan(tokens.to_token_stream(), &mut s);
        let dir = self.fc.file.parent().unwrap_or(Path::new("."));
        let includes = s.includes.iter().map(|p| dir.join(p)).collect();
        let mut cfgs = ctx_cfgs.to_vec();
        cfgs.extend(s.cfgs);
        let mut refs = s.idents;
        refs.extend(extra_refs);
        refs.sort();
        refs.dedup();
        self.events.push(Event::Item(RawItem {
            path,
            names,
            digest: sha256_hex(s.canon.as_bytes()),
            refs,
            cfgs,
            includes,
            inputs: s.inputs,
            impl_of,
            always,
        }));
    }

    fn note(&mut self, text: String) {
        self.events.push(Event::Note(text));
    }

    fn walk(&mut self, module: &str, mod_dir: &Path, cfgs: &[String], items: &[syn::Item]) {
        let file = self.fc.file.display().to_string();
        let mut macro_counts: HashMap<String, usize> = HashMap::new();
        for item in items {
            let at = |name: &str| format!("{module}::{name}");
            match item {
                syn::Item::Fn(f) => {
                    let n = f.sig.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], f);
                }
                syn::Item::Const(c) => {
                    let n = c.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], c);
                }
                syn::Item::Static(s) => {
                    let n = s.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], s);
                }
                syn::Item::Struct(s) => {
                    let n = s.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], s);
                }
                syn::Item::Enum(e) => {
                    let n = e.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], e);
                }
                syn::Item::Union(u) => {
                    let n = u.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], u);
                }
                syn::Item::Type(t) => {
                    let n = t.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], t);
                }
                syn::Item::TraitAlias(t) => {
                    let n = t.ident.to_string();
                    self.push(cfgs, at(&n), vec![n], t);
                }
                syn::Item::Trait(t) => {
                    // Found by its name and by its methods' names (default methods are code).
                    let n = t.ident.to_string();
                    let mut names = vec![n.clone()];
                    for ti in &t.items {
                        match ti {
                            syn::TraitItem::Fn(f) => names.push(f.sig.ident.to_string()),
                            syn::TraitItem::Const(c) => names.push(c.ident.to_string()),
                            _ => {}
                        }
                    }
                    self.push(cfgs, at(&n), names, t);
                }
                syn::Item::Impl(im) => self.walk_impl(module, cfgs, im),
                syn::Item::Macro(m) => {
                    let mac = m
                        .mac
                        .path
                        .segments
                        .last()
                        .map(|s| s.ident.to_string())
                        .unwrap_or_default();
                    if mac == "macro_rules"
                        && let Some(id) = &m.ident
                    {
                        let n = id.to_string();
                        self.push(cfgs, format!("{}!", at(&n)), vec![n], m);
                    } else {
                        // Items a macro makes are invisible here: always included.
                        let c = macro_counts.entry(mac.clone()).or_default();
                        *c += 1;
                        let path = format!("{}!#{c}", at(&mac));
                        // puzzletron's own internals (when it is a path dependency, as in its
                        // own examples) are included the same way, but are not the user's to
                        // act on: no note for them.
                        if mac == "include" && !self.fc.ours {
                            // Generated code (prost, tonic): the file counts by its content.
                            self.note(format!(
                                "item-level include! {path} ({file}): the included file's items \
                                 are not analysed one by one, so the whole file is in every job \
                                 of this crate (by its content)",
                            ));
                        } else if !self.fc.ours {
                            self.note(format!(
                                "item-level macro invocation {path} ({file}): the items it makes \
                                 cannot be seen, so it is included in every job of this crate",
                            ));
                        }
                        self.push_full(cfgs, path, Vec::new(), m, None, true, Vec::new());
                    }
                }
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut sub_cfgs = cfgs.to_vec();
                    let mut s = Scan::default();
                    for a in &m.attrs {
                        scan(a.to_token_stream(), &mut s);
                    }
                    sub_cfgs.extend(s.cfgs);
                    let sub = format!("{module}::{name}");
                    if let Some((_, inner)) = &m.content {
                        self.walk(&sub, &mod_dir.join(&name), &sub_cfgs, inner);
                    } else {
                        let explicit = m.attrs.iter().find_map(|a| {
                            if !a.path().is_ident("path") {
                                return None;
                            }
                            match &a.meta {
                                syn::Meta::NameValue(nv) => match &nv.value {
                                    syn::Expr::Lit(syn::ExprLit {
                                        lit: syn::Lit::Str(s),
                                        ..
                                    }) => Some(s.value()),
                                    _ => None,
                                },
                                _ => None,
                            }
                        });
                        let candidates = match explicit {
                            Some(p) => {
                                vec![self.fc.file.parent().unwrap_or(Path::new(".")).join(p)]
                            }
                            None => vec![
                                mod_dir.join(format!("{name}.rs")),
                                mod_dir.join(&name).join("mod.rs"),
                            ],
                        };
                        self.events.push(Event::Mod(ModDecl {
                            module: sub,
                            mod_dir: mod_dir.join(&name),
                            cfgs: sub_cfgs,
                            candidates,
                        }));
                    }
                }
                syn::Item::Use(u) => self.walk_use(&u.tree),
                syn::Item::Verbatim(v) => {
                    self.note(format!(
                        "unparsed item in {file}: included in every job of this crate"
                    ));
                    self.push_full(
                        cfgs,
                        at("<verbatim>"),
                        Vec::new(),
                        v,
                        None,
                        true,
                        Vec::new(),
                    );
                }
                _ => {}
            }
        }
    }

    fn walk_impl(&mut self, module: &str, cfgs: &[String], im: &syn::ItemImpl) {
        let ty = last_ident_of_type(&im.self_ty).unwrap_or_else(|| "_".into());
        match &im.trait_ {
            Some((_, tr, _)) => {
                // A trait impl is one item, reached by its self type, its trait, or any of its
                // members' names (dyn dispatch and generic bounds reach every impl).
                let trait_name = tr
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .unwrap_or_default();
                let names = im
                    .items
                    .iter()
                    .filter_map(|i| match i {
                        syn::ImplItem::Fn(f) => Some(f.sig.ident.to_string()),
                        syn::ImplItem::Const(c) => Some(c.ident.to_string()),
                        _ => None,
                    })
                    .collect();
                let path = format!("{module}::<{ty} as {trait_name}>");
                self.push_full(
                    cfgs,
                    path,
                    names,
                    im,
                    Some((ty, trait_name)),
                    false,
                    Vec::new(),
                );
            }
            None => {
                // Inherent impl: each member is an item; `Self` in it names the type. The
                // header (generics, where clause) goes with the type.
                let mut hs = proc_macro2::TokenStream::new();
                im.impl_token.to_tokens(&mut hs);
                im.generics.to_tokens(&mut hs);
                im.self_ty.to_tokens(&mut hs);
                im.generics.where_clause.to_tokens(&mut hs);
                self.push_full(
                    cfgs,
                    format!("{module}::{ty}::<impl>"),
                    vec![ty.clone()],
                    hs,
                    None,
                    false,
                    Vec::new(),
                );
                for ii in &im.items {
                    let name = match ii {
                        syn::ImplItem::Fn(f) => f.sig.ident.to_string(),
                        syn::ImplItem::Const(c) => c.ident.to_string(),
                        syn::ImplItem::Type(t) => t.ident.to_string(),
                        _ => {
                            self.note(format!(
                                "macro in impl {ty} ({}): included with the type",
                                self.fc.file.display()
                            ));
                            ty.clone()
                        }
                    };
                    let path = format!("{module}::{ty}::{name}");
                    self.push_full(cfgs, path, vec![name], ii, None, false, vec![ty.clone()]);
                }
            }
        }
    }

    fn walk_use(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => self.walk_use(&p.tree),
            syn::UseTree::Rename(r) => self
                .events
                .push(Event::Alias(r.rename.to_string(), r.ident.to_string())),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.walk_use(t)),
            _ => {}
        }
    }
}

/// A file read for the index: its bytes' digest and its events, or why it could not be read.
type Loaded = Result<(String, Vec<Event>), String>;

/// Reads `fc.file` and computes its events, from the cache when it holds them.
fn load(fc: &FileCtx, cache: Option<&Cache>, stats: &CacheStats) -> Loaded {
    let bytes = std::fs::read(&fc.file).map_err(|e| e.to_string())?;
    let digest = sha256_hex(&bytes);
    let key = cache.and_then(|c| c.key(fc, &digest));
    if let (Some(c), Some(k)) = (cache, &key)
        && let Some(events) = c.load(k)
    {
        stats.hits.fetch_add(1, Ordering::Relaxed);
        return Ok((digest, events));
    }
    // As `read_to_string` says it.
    let text = String::from_utf8(bytes)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData).to_string())?;
    let events = file_events(fc, &text);
    if let (Some(c), Some(k)) = (cache, &key) {
        stats.misses.fetch_add(1, Ordering::Relaxed);
        c.store(k, &events);
    }
    Ok((digest, events))
}

/// Cache lookups of one index build.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicUsize,
    pub misses: AtomicUsize,
}

/// Files of the module trees from `roots`, read and walked ahead of the replay, a wave (one
/// module depth) at a time on two threads (see `run_parallel`).
fn prefetch(
    roots: Vec<FileCtx>,
    cache: Option<&Cache>,
    stats: &CacheStats,
) -> HashMap<FileCtx, Loaded> {
    let mut done: HashMap<FileCtx, Loaded> = HashMap::new();
    let mut wave = roots;
    while !wave.is_empty() {
        let results = run_parallel(&wave, cache, stats);
        let mut next = Vec::new();
        for (fc, r) in wave.into_iter().zip(results) {
            if let Ok((_, events)) = &r {
                for e in events {
                    if let Event::Mod(m) = e
                        && let Some(p) = m.candidates.iter().find(|p| p.is_file())
                    {
                        let child = FileCtx {
                            file: p.clone(),
                            module: m.module.clone(),
                            mod_dir: m.mod_dir.clone(),
                            cfgs: m.cfgs.clone(),
                            ours: fc.ours,
                        };
                        if !done.contains_key(&child) && !next.contains(&child) {
                            next.push(child);
                        }
                    }
                }
            }
            done.insert(fc, r);
        }
        wave = next;
    }
    done
}

/// The helper thread's stack: syn recurses once per nesting level, and deeply in unoptimised
/// builds (rustc's own thread, which parses the other files, has 8 MiB by default). Reserved,
/// not committed, until used.
const HELPER_STACK: usize = 64 << 20;

/// Loads `jobs` on this thread and one helper thread (the proc macro's own: rustc's jobserver
/// does not count it, so one), each taking every other file.
fn run_parallel(jobs: &[FileCtx], cache: Option<&Cache>, stats: &CacheStats) -> Vec<Loaded> {
    if jobs.len() <= 1 {
        return jobs.iter().map(|fc| load(fc, cache, stats)).collect();
    }
    let mut out: Vec<Option<Loaded>> = (0..jobs.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let helper = std::thread::Builder::new()
            .stack_size(HELPER_STACK)
            .spawn_scoped(s, move || {
                (1..jobs.len())
                    .step_by(2)
                    .map(|i| (i, load(&jobs[i], cache, stats)))
                    .collect::<Vec<_>>()
            })
            .ok();
        // Without a helper (it could not start), this thread loads every file.
        let step = if helper.is_some() { 2 } else { 1 };
        for i in (0..jobs.len()).step_by(step) {
            out[i] = Some(load(&jobs[i], cache, stats));
        }
        if let Some(h) = helper {
            // A panic in the helper (a bug) is the macro's panic, as it was on one thread.
            let done = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            for (i, r) in done {
                out[i] = Some(r);
            }
        }
    });
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err("not read".into())))
        .collect()
}

impl Index {
    /// Parses every package's module tree. The user's binary roots become crates of their own
    /// (appended after the packages) that depend on the user's library. `cache`: where each
    /// file's events are kept between builds (see `cache.rs`); `None` reads every file afresh.
    #[cfg(test)]
    pub fn build(packages: Vec<Package>, cache: Option<Cache>) -> Self {
        Self::build_in(packages, cache, BuildEnv::default())
    }

    /// [`Index::build`], evaluating computed include paths with what each package was compiled
    /// with (`env`).
    pub fn build_in(mut packages: Vec<Package>, cache: Option<Cache>, env: BuildEnv) -> Self {
        let mut ix = Index {
            cache,
            env,
            ..Index::default()
        };
        if let Some(user) = packages.first().cloned() {
            for bin in &user.bins {
                packages.push(Self::bin_crate(&user, bin));
            }
        }
        // Known while walking (notes depend on which package an item is in).
        ix.packages = packages.clone();
        let mut roots = Vec::new();
        for (pi, p) in packages.iter().enumerate() {
            for root in &p.roots {
                let module = match root.file_stem().and_then(|s| s.to_str()) {
                    Some(stem) if root.parent() == Some(&p.dir.join("src/bin")) => stem.to_string(),
                    _ => p.lib_name.clone(),
                };
                let dir = root.parent().unwrap_or(&p.dir).to_path_buf();
                roots.push((pi, ix.file_ctx(pi, root, module, dir, Vec::new())));
            }
        }
        ix.ahead = prefetch(
            roots.iter().map(|(_, fc)| fc.clone()).collect(),
            ix.cache.as_ref(),
            &ix.stats,
        );
        for (pi, fc) in roots {
            ix.load_file(pi, fc);
        }
        // Files read ahead that the replay did not take (a second declaration of a file).
        ix.ahead.clear();
        ix.visible = crate::manifest::visibility(&packages);
        ix.packages = packages;
        ix
    }

    fn bin_crate(user: &Package, root: &Path) -> Package {
        let mut dep_dirs = user.dep_dirs.clone();
        dep_dirs.push(user.dir.clone());
        Package {
            lib_name: user.lib_name.clone(),
            dir: user.dir.clone(),
            roots: vec![root.to_path_buf()],
            bins: Vec::new(),
            user: true,
            manifest: user.manifest.clone(),
            dep_dirs,
            proc_macro: false,
        }
    }

    fn file_ctx(
        &self,
        package: usize,
        file: &Path,
        module: String,
        mod_dir: PathBuf,
        cfgs: Vec<String>,
    ) -> FileCtx {
        FileCtx {
            file: file.to_path_buf(),
            module,
            mod_dir,
            cfgs,
            ours: self
                .packages
                .get(package)
                .is_some_and(|p| matches!(p.lib_name.as_str(), "puzzletron" | "puzzletron_macros")),
        }
    }

    /// Adds a file that is not under any package root (the job's file, e.g. an example or an
    /// integration test): a crate of its own that depends on the user's library.
    pub fn add_root(&mut self, file: &Path) {
        if self.files.contains(file) || self.packages.is_empty() {
            return;
        }
        let module = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let pkg = Self::bin_crate(&self.packages[0], file);
        self.packages.push(pkg);
        self.visible = crate::manifest::visibility(&self.packages);
        let pi = self.packages.len() - 1;
        let fc = self.file_ctx(pi, file, module, dir, Vec::new());
        self.ahead = prefetch(vec![fc.clone()], self.cache.as_ref(), &self.stats);
        self.load_file(pi, fc);
        self.ahead.clear();
    }

    /// Replays the events of `fc.file` (read ahead, or read now) into the index, loading the
    /// files of its child modules where they are declared.
    fn load_file(&mut self, package: usize, fc: FileCtx) {
        if !self.files.insert(fc.file.clone()) {
            return;
        }
        let loaded = match self.ahead.remove(&fc) {
            Some(l) => l,
            None => load(&fc, self.cache.as_ref(), &self.stats),
        };
        let events = match loaded {
            Ok((digest, events)) => {
                self.file_digests.insert(fc.file.clone(), digest);
                events
            }
            Err(e) => {
                self.notes
                    .push(format!("cannot read {}: {e}", fc.file.display()));
                return;
            }
        };
        for e in events {
            match e {
                Event::Item(it) => self.push_item(package, &fc.file, it),
                Event::Note(n) => self.notes.push(n),
                Event::Alias(b, a) => self.aliases.entry(b).or_default().push(a),
                Event::Mod(m) => match m.candidates.iter().find(|p| p.is_file()) {
                    Some(p) => {
                        let child = self.file_ctx(package, p, m.module, m.mod_dir, m.cfgs);
                        self.load_file(package, child);
                    }
                    None => self.notes.push(format!(
                        "module {} declared in {} has no file",
                        m.module,
                        fc.file.display()
                    )),
                },
            }
        }
    }

    fn push_item(&mut self, package: usize, file: &Path, it: RawItem) {
        // Same path twice (e.g. `#[cfg]` variants of one function): keep both, numbered.
        let mut path = it.path;
        if self.paths.contains(&path) {
            let n = self
                .items
                .iter()
                .filter(|i| i.path.starts_with(&path))
                .count()
                + 1;
            path = format!("{path}#{n}");
        }
        let idx = self.items.len();
        for n in it.names {
            self.by_name.entry(n).or_default().push(idx);
        }
        if let Some((ty, tr)) = &it.impl_of {
            self.impls_by_type.entry(ty.clone()).or_default().push(idx);
            self.impls_by_trait.entry(tr.clone()).or_default().push(idx);
        }
        self.paths.insert(path.clone());
        let mut refs = it.refs;
        let mut cfgs = it.cfgs;
        let mut includes = it.includes;
        let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut inputs: Vec<(PathBuf, Input)> = it
            .inputs
            .iter()
            .filter_map(|i| Some((dir.clone(), Input::decode(i)?)))
            .collect();
        // `include!("f")`: the file's tokens are the item's code. Its bytes are in `includes`;
        // what it names, tests and includes is the item's too (read at every build: whether and
        // what the file is is not a fact of the including file's bytes).
        // A computed include path (`concat!(env!("CARGO_MANIFEST_DIR"), "/f")`) is evaluated
        // here when it can be (see `crate::eval_str`): then it is a literal include.
        let pkg = self.packages.get(package);
        let pkg_dir = pkg.map(|p| p.dir.to_string_lossy().into_owned());
        let build_env = &self.env;
        // The calling package's variables are this process's; a dependency's are those its
        // dep-info records (see `depinfo.rs`): `OUT_DIR` there is its build script's output.
        let env = |name: &str| -> Option<Option<String>> {
            if name == "CARGO_MANIFEST_DIR" {
                return pkg_dir.clone().map(Some);
            }
            match build_env.var(pkg?, name) {
                Lookup::Value(v) => Some(v),
                Lookup::NotRead | Lookup::Unknown => None,
            }
        };
        let mut notes = Vec::new();
        let mut k = 0;
        let mut seen: HashSet<PathBuf> = HashSet::new();
        while k < inputs.len() {
            let (base, input) = inputs[k].clone();
            k += 1;
            let (args, code) = match &input {
                Input::Path(a) => (a, false),
                Input::CodePath(a) => (a, true),
                _ => (&String::new(), false),
            };
            if !args.is_empty()
                && let Some(p) = args
                    .parse::<proc_macro2::TokenStream>()
                    .ok()
                    .and_then(|ts| crate::eval_str(ts, &env))
            {
                let f = base.join(p);
                includes.push(f.clone());
                inputs[k - 1].1 = Input::Evaluated(f.to_string_lossy().into_owned());
                if code {
                    inputs.push((base.clone(), Input::Code(f.to_string_lossy().into_owned())));
                }
                continue;
            }
            let Input::Code(rel) = input else { continue };
            let f = base.join(&rel);
            if !seen.insert(f.clone()) {
                continue;
            }
            let toks = std::fs::read_to_string(&f)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    t.parse::<proc_macro2::TokenStream>()
                        .map_err(|e| e.to_string())
                });
            match toks {
                Ok(ts) => {
                    let mut s = Scan::default();
                    scan(ts, &mut s);
                    let fdir = f.parent().unwrap_or(Path::new(".")).to_path_buf();
                    refs.extend(s.idents);
                    cfgs.extend(s.cfgs);
                    includes.extend(s.includes.iter().map(|p| fdir.join(p)));
                    inputs.extend(
                        s.inputs
                            .iter()
                            .filter_map(|i| Some((fdir.clone(), Input::decode(i)?))),
                    );
                }
                // Its bytes still count (or the missing file is said), through `includes`.
                Err(e) => notes.push(format!(
                    "included file {} could not be read as tokens ({e}): only its bytes count",
                    f.display()
                )),
            }
        }
        self.notes.extend(notes);
        inputs.retain(|(_, i)| !matches!(i, Input::Evaluated(_)));
        refs.sort();
        refs.dedup();
        self.items.push(Item {
            path,
            package,
            file: file.to_path_buf(),
            digest: it.digest,
            refs,
            cfgs,
            includes,
            inputs,
            impl_of: it.impl_of,
            always: it.always,
        });
    }

    /// Items whose name is `name` and that are functions (the job's candidates).
    pub fn functions_named(&self, name: &str) -> Vec<usize> {
        self.by_name
            .get(name)
            .map(|v| {
                v.iter()
                    .copied()
                    .filter(|&i| self.items[i].impl_of.is_none())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The closure of `start`: every item reachable by name, plus the always-included ones.
    ///
    /// A name used in package `a` reaches items of that name in `a` and its dependencies, trait
    /// impls of a type of that name there, and trait impls of a trait of that name in any
    /// package (a dependency's generic code calls its dependents' impls of its traits).
    pub fn closure(&self, start: &[usize]) -> BTreeSet<usize> {
        let mut reached: BTreeSet<usize> = BTreeSet::new();
        let mut seen: HashSet<(&str, usize)> = HashSet::new();
        let mut work: Vec<usize> = start.to_vec();
        work.extend(
            self.items
                .iter()
                .enumerate()
                .filter(|(_, i)| i.always)
                .map(|(n, _)| n),
        );
        while let Some(i) = work.pop() {
            if !reached.insert(i) {
                continue;
            }
            let pkg = self.items[i].package;
            let vis = &self.visible[pkg];
            let mut names: Vec<&str> = self.items[i].refs.iter().map(String::as_str).collect();
            let mut k = 0;
            while k < names.len() {
                let n = names[k];
                k += 1;
                if !seen.insert((n, pkg)) {
                    continue;
                }
                if let Some(a) = self.aliases.get(n) {
                    names.extend(a.iter().map(String::as_str));
                }
                for map in [&self.by_name, &self.impls_by_type] {
                    if let Some(v) = map.get(n) {
                        work.extend(
                            v.iter()
                                .copied()
                                .filter(|&j| vis[self.items[j].package] && !reached.contains(&j)),
                        );
                    }
                }
                if let Some(v) = self.impls_by_trait.get(n) {
                    work.extend(v.iter().copied().filter(|j| !reached.contains(j)));
                }
            }
        }
        reached
    }

    /// Per-package name of `file`, `/`-separated and without the build's location: relative to
    /// its package's `OUT_DIR` (`$OUT_DIR/gen.rs`), else to its package (`src/prompt.txt`),
    /// else (a file outside the package) relative to the package through their nearest common
    /// folder (`../shared/data.txt`), or absolute when that is the root; a dependency's is
    /// prefixed with its name (`ccdep: src/lib.rs`).
    pub fn rel(&self, package: usize, file: &Path) -> String {
        let p = &self.packages[package];
        let s = file_label(file, &p.dir, self.env.out_dir(p).as_deref());
        if p.user {
            s
        } else {
            format!("{}: {s}", p.lib_name)
        }
    }
}

/// `/`-joined components of a relative path.
fn slashed(rel: &Path) -> String {
    rel.iter()
        .map(|c| c.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// `file`'s name relative to `out_dir` (`$OUT_DIR/...`) or the package folder `dir` (see
/// [`Index::rel`]).
pub fn file_label(file: &Path, dir: &Path, out_dir: Option<&Path>) -> String {
    // OUT_DIR first: the target folder is often inside the package.
    if let Some(rel) = out_dir.and_then(|o| file.strip_prefix(o).ok()) {
        return format!("$OUT_DIR/{}", slashed(rel));
    }
    if let Ok(rel) = file.strip_prefix(dir) {
        return slashed(rel);
    }
    // Elsewhere: `..` as far as the nearest common folder, if it is not the root.
    let file = lexical(file);
    let common = dir
        .ancestors()
        .find(|a| file.starts_with(a))
        .filter(|a| a.parent().is_some());
    match common {
        Some(c) => {
            let ups = dir.strip_prefix(c).map_or(0, |r| r.iter().count());
            let down = file.strip_prefix(c).map(slashed).unwrap_or_default();
            let mut parts = vec![".."; ups];
            parts.push(&down);
            parts.join("/")
        }
        None => file.to_string_lossy().into_owned(),
    }
}

/// `p` with `.` and `..` components resolved by name (no file system access).
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Sorted (path, digest) of the included files of `items`, `notes` gets missing files.
pub fn included_files(
    ix: &Index,
    items: &BTreeSet<usize>,
    notes: &mut Vec<String>,
) -> BTreeMap<PathBuf, (usize, String)> {
    let mut out = BTreeMap::new();
    for &i in items {
        for f in &ix.items[i].includes {
            match std::fs::read(f) {
                Ok(b) => {
                    out.insert(f.clone(), (ix.items[i].package, sha256_hex(&b)));
                }
                Err(e) => notes.push(format!("cannot read included {}: {e}", f.display())),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// A fresh temp folder (named by `tag` and this process) with `app/Cargo.toml` depending
    /// on the path package `dep`.
    fn app_with_dep(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ptm-index{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        write(
            &d,
            "app/Cargo.toml",
            "[package]\nname = \"app\"\n[dependencies]\ndep = { path = \"../dep\" }\n",
        );
        d
    }

    fn paths(ix: &Index, set: &BTreeSet<usize>) -> Vec<String> {
        set.iter().map(|&i| ix.items[i].path.clone()).collect()
    }

    #[test]
    fn closure_follows_names_impls_and_dependencies_but_not_dependents() {
        let d = app_with_dep("-closure");
        write(
            &d,
            "app/src/main.rs",
            "mod m;\nfn job() { m::go(); }\nfn main() { grid(); }\nfn grid() {}\n\
             impl dep::Shape for Sq { fn area(&self) -> f64 { 1.0 } }\nstruct Sq;\n",
        );
        write(
            &d,
            "app/src/m.rs",
            "pub fn go() { let s: &dyn dep::Shape = todo(); s.area(); }\npub fn todo() {}\nfn other() {}\n",
        );
        write(&d, "dep/Cargo.toml", "[package]\nname = \"dep\"\n");
        write(
            &d,
            "dep/src/lib.rs",
            "pub trait Shape { fn area(&self) -> f64; }\npub fn main() {}\npub fn grid() {}\n\
             thread_local! { static X: u8 = 0; }\n",
        );
        let mut notes = Vec::new();
        let ix = Index::build(crate::manifest::packages(&d.join("app"), &mut notes), None);
        let start = ix.functions_named("job");
        let c = ix.closure(&start);
        let got = paths(&ix, &c);
        for want in [
            "app::job",
            "app::m::go",
            "app::m::todo",
            "dep::Shape",
            "app::<Sq as Shape>",
            "dep::thread_local!#1",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} missing: {got:?}");
        }
        for not in [
            "app::main",
            "app::grid",
            "app::m::other",
            "dep::main",
            "dep::grid",
        ] {
            assert!(!got.iter().any(|g| g == not), "{not} included: {got:?}");
        }
        assert!(
            ix.notes.iter().any(|n| n.contains("thread_local!#1")),
            "{:?}",
            ix.notes
        );
        let _ = std::fs::remove_dir_all(&d);
    }
    #[test]
    fn included_code_is_the_items_code_and_computed_paths_are_evaluated() {
        let d = app_with_dep("-inc");
        write(
            &d,
            "app/src/main.rs",
            "mod m;\nfn job() -> f64 { include!(\"inc/e.rs\") }\nfn main() {}\n\
             fn named_by_include() -> f64 { 1.0 }\nfn other() {}\n",
        );
        // Relative to the included file, as rustc resolves it.
        write(
            &d,
            "app/src/inc/e.rs",
            "named_by_include() + m::g(include_str!(\"t.txt\"))",
        );
        write(&d, "app/src/inc/t.txt", "x");
        write(
            &d,
            "app/src/m.rs",
            "pub fn g(_: &str) -> f64 { dep::h() + include!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/c.rs\")) }\n",
        );
        write(&d, "app/c.rs", "option_env!(\"X\").map_or(0.0, |_| 1.0)");
        write(&d, "dep/Cargo.toml", "[package]\nname = \"dep\"\n");
        write(
            &d,
            "dep/src/lib.rs",
            "pub fn h() -> f64 { include_bytes!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/d.bin\")).len() as f64 \
             + include_bytes!(concat!(env!(\"OUT_DIR\"), \"/o.bin\")).len() as f64 }\n",
        );
        let mut notes = Vec::new();
        let ix = Index::build(crate::manifest::packages(&d.join("app"), &mut notes), None);
        let c = ix.closure(&ix.functions_named("job"));
        let got = paths(&ix, &c);
        assert!(got.iter().any(|g| g == "app::named_by_include"), "{got:?}");
        assert!(!got.iter().any(|g| g == "app::other"), "{got:?}");
        let item = |p: &str| ix.items.iter().find(|i| i.path == p).unwrap();
        let job = item("app::job");
        assert_eq!(
            job.includes,
            [d.join("app/src/inc/e.rs"), d.join("app/src/inc/t.txt")]
        );
        let g = item("app::m::g");
        assert_eq!(g.includes, [d.join("app/c.rs")]);
        // The computed `include!`'s code is scanned too.
        assert!(
            g.inputs.iter().any(|(_, i)| *i == Input::Env("X".into())),
            "{:?}",
            g.inputs
        );
        // Without its dep-info, a dependency's own OUT_DIR is unknown here: left for the
        // expansion's fallback.
        let h = item("dep::h");
        assert_eq!(h.includes, [d.join("dep/d.bin")]);
        assert!(
            h.inputs
                .iter()
                .any(|(_, i)| matches!(i, Input::Path(a) if a.contains("OUT_DIR"))),
            "{:?}",
            h.inputs
        );

        // With it (rustc's `--extern` names the dependency's build), its OUT_DIR is the one
        // recorded there: the generated file is an include, named relative to that OUT_DIR.
        let deps = d.join("target/debug/deps");
        let out = d.join("target/debug/build/dep-0123/out");
        write(&out, "o.bin", "generated");
        write(&deps, "libdep-4567.rmeta", "");
        write(
            &deps,
            "dep-4567.d",
            &format!("# env-dep:OUT_DIR={}\n", out.display()),
        );
        let args: Vec<String> = vec![
            "rustc".into(),
            "--extern".into(),
            format!("dep={}", deps.join("libdep-4567.rmeta").display()),
        ];
        let mut notes = Vec::new();
        let ix = Index::build_in(
            crate::manifest::packages(&d.join("app"), &mut notes),
            None,
            BuildEnv::for_rustc(&args, None),
        );
        let h = ix.items.iter().find(|i| i.path == "dep::h").unwrap();
        assert_eq!(h.includes, [d.join("dep/d.bin"), out.join("o.bin")]);
        assert!(
            !h.inputs.iter().any(|(_, i)| matches!(i, Input::Path(_))),
            "{:?}",
            h.inputs
        );
        assert_eq!(ix.rel(h.package, &out.join("o.bin")), "dep: $OUT_DIR/o.bin");
        assert_eq!(ix.rel(h.package, &d.join("dep/d.bin")), "dep: d.bin");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn file_labels_never_name_the_builds_location() {
        let pkg = Path::new("/w/app");
        let out = Path::new("/w/app/target/debug/build/app-1/out");
        assert_eq!(
            file_label(&out.join("gen.rs"), pkg, Some(out)),
            "$OUT_DIR/gen.rs"
        );
        assert_eq!(
            file_label(Path::new("/w/app/src/../p.txt"), pkg, Some(out)),
            "src/../p.txt"
        );
        assert_eq!(
            file_label(Path::new("/w/shared/x/../d.txt"), pkg, None),
            "../shared/d.txt"
        );
        assert_eq!(file_label(Path::new("/etc/hosts"), pkg, None), "/etc/hosts");
    }

    /// Everything the index says, as text.
    fn dump(ix: &Index) -> String {
        let mut s = String::new();
        for it in &ix.items {
            s.push_str(&format!("{it:?}\n"));
        }
        s.push_str(&format!(
            "{:?}\n{:?}\n{:?}\n{:?}\n",
            ix.notes, ix.files, ix.aliases, ix.file_digests
        ));
        s
    }

    #[test]
    fn the_file_cache_gives_a_cold_builds_index_and_misses_on_any_change() {
        let d = std::env::temp_dir().join(format!("ptm-index-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        write(&d, "app/Cargo.toml", "[package]\nname = \"app\"\n");
        write(
            &d,
            "app/src/main.rs",
            "mod m;\nmod k;\n#[cfg(feature = \"x\")]\nmod n { pub fn f() {} }\nuse m::go as run;\n\
             fn job() { run(); }\nfn main() {}\nthread_local! { static X: u8 = 0; }\n",
        );
        // A second file at m's depth: the files of a wave are read on two threads.
        write(&d, "app/src/k.rs", "pub fn go() {}\n");
        write(
            &d,
            "app/src/m.rs",
            "pub fn go() { let s = include_str!(\"t.txt\"); }\nimpl S { fn a(&self) {} }\n\
             impl T for S {}\npub struct S;\nmod broken;\n",
        );
        write(&d, "app/src/m/broken.rs", "fn (");
        let build = |cache: Option<Cache>| {
            let mut notes = Vec::new();
            Index::build(crate::manifest::packages(&d.join("app"), &mut notes), cache)
        };
        let cache = || Some(Cache::at(d.join("cache"), Some("lock"), "lib 1 1"));
        let hits = |ix: &Index| {
            (
                ix.stats.hits.load(Ordering::Relaxed),
                ix.stats.misses.load(Ordering::Relaxed),
            )
        };
        let cold = build(None);
        assert_eq!(cold.files.len(), 4);
        // Items in declaration order, whichever thread read their file.
        let at = |p: &str| cold.items.iter().position(|i| i.path == p).unwrap();
        assert!(at("app::m::go") < at("app::k::go"));
        assert!(cold.items.iter().any(|i| i.path == "app::m::S::a"));
        let first = build(cache());
        assert_eq!(hits(&first), (0, 4));
        assert_eq!(dump(&first), dump(&cold));
        let warm = build(cache());
        assert_eq!(hits(&warm), (4, 0));
        assert_eq!(dump(&warm), dump(&cold));

        // Truncated, corrupted or emptied entries are misses (and are written again).
        let entries: Vec<PathBuf> = std::fs::read_dir(d.join("cache"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 4, "{entries:?}");
        let e0 = std::fs::read(&entries[0]).unwrap();
        std::fs::write(&entries[0], &e0[..e0.len() / 2]).unwrap();
        let mut e1 = std::fs::read(&entries[1]).unwrap();
        let mid = e1.len() / 2;
        e1[mid] = if e1[mid] == b'0' { b'1' } else { b'0' };
        std::fs::write(&entries[1], &e1).unwrap();
        std::fs::write(&entries[2], b"").unwrap();
        let repaired = build(cache());
        assert_eq!(hits(&repaired), (1, 3));
        assert_eq!(dump(&repaired), dump(&cold));
        assert_eq!(hits(&build(cache())), (4, 0));

        // An edited file misses, and only it; the result is the edited tree's cold index.
        write(
            &d,
            "app/src/m.rs",
            "pub fn go() { let s = include_str!(\"t.txt\"); 1; }\nimpl S { fn a(&self) {} }\n\
             impl T for S {}\npub struct S;\nmod broken;\n",
        );
        let edited = build(cache());
        assert_eq!(hits(&edited), (3, 1));
        let edited_cold = build(None);
        assert_eq!(dump(&edited), dump(&edited_cold));
        let go = |ix: &Index| {
            ix.items
                .iter()
                .find(|i| i.path == "app::m::go")
                .unwrap()
                .digest
                .clone()
        };
        assert_ne!(go(&edited), go(&cold));
        let _ = std::fs::remove_dir_all(&d);
    }
}
