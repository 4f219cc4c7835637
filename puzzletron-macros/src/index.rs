//! The item index of the owned crates and the conservative reachability closure of a job.
//!
//! Resolution is by name, never by type inference: an identifier reaches every owned item of that
//! name (a method call reaches every owned method of that name), a type or trait reaches every
//! owned trait impl that names it (so `dyn Trait`, generic bounds and operator impls are
//! covered). This over-includes, never under-includes, except for what no source shows: items
//! made by item-level macro invocations, which are therefore always included (and said once).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use quote::ToTokens;
use sha2::{Digest, Sha256};

use crate::manifest::Package;
use crate::scan::{Scan, scan};

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
    /// Files it includes, absolute.
    pub includes: Vec<PathBuf>,
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

struct Ctx<'a> {
    package: usize,
    file: &'a Path,
    module: String,
    cfgs: Vec<String>,
}

impl Index {
    /// Parses every package's module tree. The user's binary roots become crates of their own
    /// (appended after the packages) that depend on the user's library.
    pub fn build(mut packages: Vec<Package>) -> Self {
        let mut ix = Index::default();
        if let Some(user) = packages.first().cloned() {
            for bin in &user.bins {
                packages.push(Self::bin_crate(&user, bin));
            }
        }
        // Known while walking (notes depend on which package an item is in).
        ix.packages = packages.clone();
        for (pi, p) in packages.iter().enumerate() {
            for root in &p.roots {
                let module = match root.file_stem().and_then(|s| s.to_str()) {
                    Some(stem) if root.parent() == Some(&p.dir.join("src/bin")) => stem.to_string(),
                    _ => p.lib_name.clone(),
                };
                let dir = root.parent().unwrap_or(&p.dir).to_path_buf();
                ix.load_file(pi, root, module, dir, Vec::new());
            }
        }
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
        self.load_file(pi, file, module, dir, Vec::new());
    }

    fn load_file(
        &mut self,
        package: usize,
        file: &Path,
        module: String,
        mod_dir: PathBuf,
        cfgs: Vec<String>,
    ) {
        if !self.files.insert(file.to_path_buf()) {
            return;
        }
        let text = match std::fs::read_to_string(file) {
            Ok(t) => t,
            Err(e) => {
                self.notes
                    .push(format!("cannot read {}: {e}", file.display()));
                return;
            }
        };
        match syn::parse_file(&text) {
            Ok(f) => {
                let ctx = Ctx {
                    package,
                    file,
                    module,
                    cfgs,
                };
                self.walk(&ctx, &mod_dir, &f.items);
            }
            Err(e) => {
                // Not parsable by syn (e.g. newer syntax): the whole file counts, byte-wise.
                self.notes.push(format!(
                    "{} could not be parsed ({e}): the whole file is included",
                    file.display()
                ));
                self.items.push(Item {
                    path: format!("{module} ({})", file.display()),
                    package,
                    file: file.to_path_buf(),
                    digest: sha256_hex(text.as_bytes()),
                    refs: Vec::new(),
                    cfgs,
                    includes: Vec::new(),
                    impl_of: None,
                    always: true,
                });
            }
        }
    }

    fn push(
        &mut self,
        ctx: &Ctx,
        path: String,
        names: Vec<String>,
        tokens: impl ToTokens,
    ) -> usize {
        self.push_full(ctx, path, names, tokens, None, false, Vec::new())
    }

    #[allow(clippy::too_many_arguments)]
    fn push_full(
        &mut self,
        ctx: &Ctx,
        path: String,
        names: Vec<String>,
        tokens: impl ToTokens,
        impl_of: Option<(String, String)>,
        always: bool,
        extra_refs: Vec<String>,
    ) -> usize {
        let mut s = Scan::default();
        scan(tokens.to_token_stream(), &mut s);
        let dir = ctx.file.parent().unwrap_or(Path::new("."));
        let includes = s.includes.iter().map(|p| dir.join(p)).collect();
        let mut cfgs = ctx.cfgs.clone();
        cfgs.extend(s.cfgs);
        let mut refs = s.idents;
        refs.extend(extra_refs);
        refs.sort();
        refs.dedup();
        // Same path twice (e.g. `#[cfg]` variants of one function): keep both, numbered.
        let mut path = path;
        if self.items.iter().any(|i| i.path == path) {
            let n = self
                .items
                .iter()
                .filter(|i| i.path.starts_with(&path))
                .count()
                + 1;
            path = format!("{path}#{n}");
        }
        let idx = self.items.len();
        for n in &names {
            self.by_name.entry(n.clone()).or_default().push(idx);
        }
        if let Some((ty, tr)) = &impl_of {
            self.impls_by_type.entry(ty.clone()).or_default().push(idx);
            self.impls_by_trait.entry(tr.clone()).or_default().push(idx);
        }
        self.items.push(Item {
            path,
            package: ctx.package,
            file: ctx.file.to_path_buf(),
            digest: sha256_hex(s.canon.as_bytes()),
            refs,
            cfgs,
            includes,
            impl_of,
            always,
        });
        idx
    }

    fn walk(&mut self, ctx: &Ctx, mod_dir: &Path, items: &[syn::Item]) {
        let mut macro_counts: HashMap<String, usize> = HashMap::new();
        for item in items {
            let at = |name: &str| format!("{}::{name}", ctx.module);
            match item {
                syn::Item::Fn(f) => {
                    let n = f.sig.ident.to_string();
                    self.push(ctx, at(&n), vec![n], f);
                }
                syn::Item::Const(c) => {
                    let n = c.ident.to_string();
                    self.push(ctx, at(&n), vec![n], c);
                }
                syn::Item::Static(s) => {
                    let n = s.ident.to_string();
                    self.push(ctx, at(&n), vec![n], s);
                }
                syn::Item::Struct(s) => {
                    let n = s.ident.to_string();
                    self.push(ctx, at(&n), vec![n], s);
                }
                syn::Item::Enum(e) => {
                    let n = e.ident.to_string();
                    self.push(ctx, at(&n), vec![n], e);
                }
                syn::Item::Union(u) => {
                    let n = u.ident.to_string();
                    self.push(ctx, at(&n), vec![n], u);
                }
                syn::Item::Type(t) => {
                    let n = t.ident.to_string();
                    self.push(ctx, at(&n), vec![n], t);
                }
                syn::Item::TraitAlias(t) => {
                    let n = t.ident.to_string();
                    self.push(ctx, at(&n), vec![n], t);
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
                    self.push(ctx, at(&n), names, t);
                }
                syn::Item::Impl(im) => self.walk_impl(ctx, im),
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
                        self.push(ctx, format!("{}!", at(&n)), vec![n], m);
                    } else {
                        // Items a macro makes are invisible here: always included.
                        let c = macro_counts.entry(mac.clone()).or_default();
                        *c += 1;
                        let path = format!("{}!#{c}", at(&mac));
                        // puzzletron's own internals (when it is a path dependency, as in its
                        // own examples) are included the same way, but are not the user's to
                        // act on: no note for them.
                        let ours = self.packages.get(ctx.package).is_some_and(|p| {
                            matches!(p.lib_name.as_str(), "puzzletron" | "puzzletron_macros")
                        });
                        if !ours {
                            self.notes.push(format!(
                                "item-level macro invocation {path} ({}): the items it makes \
                                 cannot be seen, so it is included in every job of this crate",
                                ctx.file.display()
                            ));
                        }
                        self.push_full(ctx, path, Vec::new(), m, None, true, Vec::new());
                    }
                }
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let mut cfgs = ctx.cfgs.clone();
                    let mut s = Scan::default();
                    for a in &m.attrs {
                        scan(a.to_token_stream(), &mut s);
                    }
                    cfgs.extend(s.cfgs);
                    let module = format!("{}::{name}", ctx.module);
                    if let Some((_, inner)) = &m.content {
                        let sub = Ctx {
                            package: ctx.package,
                            file: ctx.file,
                            module,
                            cfgs,
                        };
                        self.walk(&sub, &mod_dir.join(&name), inner);
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
                                vec![ctx.file.parent().unwrap_or(Path::new(".")).join(p)]
                            }
                            None => vec![
                                mod_dir.join(format!("{name}.rs")),
                                mod_dir.join(&name).join("mod.rs"),
                            ],
                        };
                        match candidates.iter().find(|p| p.is_file()) {
                            Some(p) => {
                                self.load_file(ctx.package, p, module, mod_dir.join(&name), cfgs)
                            }
                            None => self.notes.push(format!(
                                "module {module} declared in {} has no file",
                                ctx.file.display()
                            )),
                        }
                    }
                }
                syn::Item::Use(u) => self.walk_use(&u.tree),
                syn::Item::Verbatim(v) => {
                    self.notes.push(format!(
                        "unparsed item in {}: included in every job of this crate",
                        ctx.file.display()
                    ));
                    self.push_full(ctx, at("<verbatim>"), Vec::new(), v, None, true, Vec::new());
                }
                _ => {}
            }
        }
    }

    fn walk_impl(&mut self, ctx: &Ctx, im: &syn::ItemImpl) {
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
                let path = format!("{}::<{ty} as {trait_name}>", ctx.module);
                self.push_full(
                    ctx,
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
                let header = (
                    &im.impl_token,
                    &im.generics,
                    &im.self_ty,
                    &im.generics.where_clause,
                );
                let (a, b, c, d) = header;
                let mut hs = proc_macro2::TokenStream::new();
                a.to_tokens(&mut hs);
                b.to_tokens(&mut hs);
                c.to_tokens(&mut hs);
                d.to_tokens(&mut hs);
                self.push_full(
                    ctx,
                    format!("{}::{ty}::<impl>", ctx.module),
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
                            self.notes.push(format!(
                                "macro in impl {ty} ({}): included with the type",
                                ctx.file.display()
                            ));
                            ty.clone()
                        }
                    };
                    let path = format!("{}::{ty}::{name}", ctx.module);
                    self.push_full(ctx, path, vec![name], ii, None, false, vec![ty.clone()]);
                }
            }
        }
    }

    fn walk_use(&mut self, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => self.walk_use(&p.tree),
            syn::UseTree::Rename(r) => {
                self.aliases
                    .entry(r.rename.to_string())
                    .or_default()
                    .push(r.ident.to_string());
            }
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.walk_use(t)),
            _ => {}
        }
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

    /// Per-package relative file name of `file`, `/`-separated.
    pub fn rel(&self, package: usize, file: &Path) -> String {
        let p = &self.packages[package];
        let rel = file.strip_prefix(&p.dir).unwrap_or(file);
        let s = rel
            .iter()
            .map(|c| c.to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        if p.user {
            s
        } else {
            format!("{}: {s}", p.lib_name)
        }
    }
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

    fn paths(ix: &Index, set: &BTreeSet<usize>) -> Vec<String> {
        set.iter().map(|&i| ix.items[i].path.clone()).collect()
    }

    #[test]
    fn closure_follows_names_impls_and_dependencies_but_not_dependents() {
        let d = std::env::temp_dir().join(format!("ptm-index-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        write(
            &d,
            "app/Cargo.toml",
            "[package]\nname = \"app\"\n[dependencies]\ndep = { path = \"../dep\" }\n",
        );
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
        let ix = Index::build(crate::manifest::packages(&d.join("app"), &mut notes));
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
}
