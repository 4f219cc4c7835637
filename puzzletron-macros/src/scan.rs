//! One pass over an item's tokens: its canonical form (for the digest), the identifiers it
//! names, the `cfg` predicates it tests and the files it includes.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// What one item's tokens say.
#[derive(Default, Debug)]
pub struct Scan {
    /// Canonical token text: doc attributes dropped, one token per line with its kind, so
    /// comments, formatting and `///` docs never change it.
    pub canon: String,
    /// Every identifier named, including path segments written in string literals
    /// (`#[serde(with = "a::b")]`), except serde `default = "f"` (its value is in the params).
    pub idents: Vec<String>,
    /// `cfg` predicates (`#[cfg(..)]`, `#[cfg_attr(pred, ..)]`, `cfg!(..)`), as token text.
    pub cfgs: Vec<String>,
    /// Files included by a plain string literal (`include_str!`, `include_bytes!`, `include!`),
    /// as written (relative to the item's file).
    pub includes: Vec<String>,
    /// What else the item compiles in, known only at compile time (see [`Input`]), as text.
    pub inputs: Vec<String>,
}

/// One compile-time input of an item other than a literal include, as stored in
/// [`Scan::inputs`] (`kind\targ`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// `env!("NAME")` / `option_env!("NAME")`: the variable's value is compiled in.
    Env(String),
    /// `include!("path")`: the file is code of the item (its file is also in `includes`).
    Code(String),
    /// `include_str!`/`include_bytes!`/`include!` whose argument is not a plain literal (e.g.
    /// `concat!(env!("CARGO_MANIFEST_DIR"), "/data.txt")`): the argument's tokens, evaluated
    /// when the job's code is assembled.
    Path(String),
    /// `include!` whose argument is not a plain literal: as [`Input::Path`], and the file is code.
    CodePath(String),
    /// `env!`/`option_env!` whose name is not a plain literal: the argument's tokens.
    Unknown(String),
    /// A computed path the index evaluated (to this file, now in the item's includes); never
    /// stored.
    Evaluated(String),
}

impl Input {
    pub fn encode(&self) -> String {
        match self {
            Input::Env(s) => format!("env\t{s}"),
            Input::Code(s) => format!("code\t{s}"),
            Input::Path(s) => format!("path\t{s}"),
            Input::CodePath(s) => format!("codepath\t{s}"),
            Input::Unknown(s) | Input::Evaluated(s) => format!("unknown\t{s}"),
        }
    }

    pub fn decode(s: &str) -> Option<Input> {
        let (k, v) = s.split_once('\t')?;
        let v = v.to_string();
        Some(match k {
            "env" => Input::Env(v),
            "code" => Input::Code(v),
            "path" => Input::Path(v),
            "codepath" => Input::CodePath(v),
            "unknown" => Input::Unknown(v),
            _ => return None,
        })
    }
}

/// The plain string literal that is the whole of `args` (a trailing comma allowed).
fn sole_literal(args: &TokenStream) -> Option<String> {
    let toks: Vec<TokenTree> = args.clone().into_iter().collect();
    match toks.as_slice() {
        [TokenTree::Literal(l)] => plain_string(&l.to_string()),
        [TokenTree::Literal(l), TokenTree::Punct(p)] if p.as_char() == ',' => {
            plain_string(&l.to_string())
        }
        _ => None,
    }
}

/// Scans `ts` into `out`.
pub fn scan(ts: TokenStream, out: &mut Scan) {
    scan_in(ts, out, false)
}

/// `in_attr`: inside `#[...]`, where string literals may name paths (`#[serde(with = "m")]`).
fn scan_in(ts: TokenStream, out: &mut Scan, in_attr: bool) {
    let toks: Vec<TokenTree> = ts.into_iter().collect();
    let mut i = 0;
    while i < toks.len() {
        // `#[doc = ..]` and `#![doc = ..]`: dropped (docs are not code).
        if let TokenTree::Punct(p) = &toks[i]
            && p.as_char() == '#'
        {
            let mut j = i + 1;
            if let Some(TokenTree::Punct(b)) = toks.get(j)
                && b.as_char() == '!'
            {
                j += 1;
            }
            if let Some(TokenTree::Group(g)) = toks.get(j)
                && g.delimiter() == Delimiter::Bracket
            {
                // Only the first two tokens matter (`doc`, `cfg(..)`, `cfg_attr(..)`).
                let mut inner = g.stream().into_iter();
                let (first, second) = (inner.next(), inner.next());
                match first {
                    Some(TokenTree::Ident(id)) if id == "doc" => {
                        i = j + 1;
                        continue;
                    }
                    Some(TokenTree::Ident(id)) if id == "cfg" => {
                        if let Some(TokenTree::Group(pred)) = second {
                            out.cfgs.push(pred.stream().to_string());
                        }
                    }
                    Some(TokenTree::Ident(id)) if id == "cfg_attr" => {
                        if let Some(TokenTree::Group(args)) = second {
                            let pred: TokenStream = args
                                .stream()
                                .into_iter()
                                .take_while(
                                    |t| !matches!(t, TokenTree::Punct(p) if p.as_char() == ','),
                                )
                                .collect();
                            out.cfgs.push(pred.to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        match &toks[i] {
            TokenTree::Ident(id) => {
                let name = id.to_string();
                let bang =
                    matches!(toks.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!');
                if bang && let Some(TokenTree::Group(g)) = toks.get(i + 2) {
                    let args = g.stream();
                    match name.as_str() {
                        "cfg" => out.cfgs.push(args.to_string()),
                        "include_str" | "include_bytes" | "include" => match sole_literal(&args) {
                            Some(s) => {
                                if name == "include" {
                                    out.inputs.push(Input::Code(s.clone()).encode());
                                }
                                out.includes.push(s);
                            }
                            None if name == "include" => {
                                out.inputs.push(Input::CodePath(args.to_string()).encode())
                            }
                            None => out.inputs.push(Input::Path(args.to_string()).encode()),
                        },
                        "env" | "option_env" => {
                            // `env!("NAME", "message")`: the name is the first argument.
                            let first: TokenStream = args
                                .clone()
                                .into_iter()
                                .take_while(
                                    |t| !matches!(t, TokenTree::Punct(p) if p.as_char() == ','),
                                )
                                .collect();
                            out.inputs.push(
                                match sole_literal(&first) {
                                    Some(s) => Input::Env(s),
                                    None => Input::Unknown(args.to_string()),
                                }
                                .encode(),
                            );
                        }
                        _ => {}
                    }
                }
                out.canon.push_str("i ");
                out.canon.push_str(&name);
                out.canon.push('\n');
                out.idents.push(match name.strip_prefix("r#") {
                    Some(raw) => raw.to_string(),
                    None => name,
                });
            }
            TokenTree::Punct(p) => {
                out.canon.push_str("p ");
                out.canon.push(p.as_char());
                out.canon.push_str(if p.spacing() == Spacing::Joint {
                    "j\n"
                } else {
                    "\n"
                });
            }
            TokenTree::Literal(l) => {
                let text = l.to_string();
                let serde_default = i >= 2
                    && matches!(&toks[i - 1], TokenTree::Punct(p) if p.as_char() == '=')
                    && matches!(&toks[i - 2], TokenTree::Ident(d) if d == "default");
                if in_attr
                    && !serde_default
                    && let Some(s) = plain_string(&text)
                {
                    push_path_idents(&s, &mut out.idents);
                }
                out.canon.push_str("l ");
                out.canon.push_str(&text);
                out.canon.push('\n');
            }
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("<", ">"),
                };
                out.canon.push_str(open);
                out.canon.push('\n');
                let attr = in_attr
                    || (g.delimiter() == Delimiter::Bracket && i >= 1 && is_attr_start(&toks[..i]));
                scan_in(g.stream(), out, attr);
                out.canon.push_str(close);
                out.canon.push('\n');
            }
        }
        i += 1;
    }
}

/// The content of a plain `"..."` literal without escapes, else `None`.
fn plain_string(lit: &str) -> Option<String> {
    let s = lit.strip_prefix('"')?.strip_suffix('"')?;
    (!s.contains('\\')).then(|| s.to_string())
}

/// `a::b::c` in a string literal names `a`, `b`, `c` (serde `with`/`deserialize_with`, ...).
fn push_path_idents(s: &str, out: &mut Vec<String>) {
    let is_ident = |seg: &str| {
        let mut c = seg.chars();
        c.next()
            .is_some_and(|f| f == '_' || f.is_ascii_alphabetic())
            && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
    };
    let segs: Vec<&str> = s.split("::").collect();
    if !segs.is_empty() && segs.iter().all(|seg| is_ident(seg)) {
        out.extend(segs.iter().map(|s| s.to_string()));
    }
}

/// Whether the tokens before a `[...]` group end with `#` or `#!` (an attribute).
fn is_attr_start(before: &[TokenTree]) -> bool {
    let punct =
        |t: Option<&TokenTree>, c: char| matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c);
    let n = before.len();
    punct(before.last(), '#')
        || (punct(before.last(), '!') && n >= 2 && punct(before.get(n - 2), '#'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(src: &str) -> Scan {
        let mut s = Scan::default();
        scan(src.parse().unwrap(), &mut s);
        s
    }

    #[test]
    fn docs_comments_and_formatting_do_not_count() {
        let a = scanned("/// Doc.\nfn f(x: u8) -> u8 { x + 1 } // c");
        let b = scanned("/** Other doc. */ fn f( x : u8 )->u8{\n  /* c */ x+1\n}");
        assert_eq!(a.canon, b.canon);
        assert_ne!(a.canon, scanned("fn f(x: u8) -> u8 { x + 2 }").canon);
        // `+=` is not `+ =`.
        assert_ne!(scanned("a += b").canon, scanned("a + = b").canon);
    }

    #[test]
    fn cfgs_includes_and_attribute_paths_are_collected() {
        let s = scanned(
            r#"#[cfg(feature = "wide")] #[cfg_attr(test, derive(Debug))]
            #[serde(with = "codec::hex", default = "dflt")]
            fn f() { if cfg!(debug_assertions) { include_str!("a.txt"); } let s = "main"; vec![1]; }"#,
        );
        assert_eq!(s.cfgs, ["feature = \"wide\"", "test", "debug_assertions"]);
        assert_eq!(s.includes, ["a.txt"]);
        assert!(s.inputs.is_empty(), "{:?}", s.inputs);
        assert!(s.idents.contains(&"codec".to_string()) && s.idents.contains(&"hex".to_string()));
        // serde defaults are params, and plain string values are not paths.
        assert!(!s.idents.contains(&"dflt".to_string()));
        assert!(!s.idents.contains(&"main".to_string()));
    }

    #[test]
    fn compile_time_inputs_are_collected() {
        let s = scanned(
            r#"fn f() {
                let v: f64 = include!("inc.rs");
                let s = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/d.txt"));
                let b = std::include_bytes!("b.bin",);
                let e = option_env!("NU_FACTOR").unwrap_or("1");
                let m = env!("MODE", "set MODE");
                let x = env!($name);
            }"#,
        );
        assert_eq!(s.includes, ["inc.rs", "b.bin"]);
        let inputs: Vec<Input> = s.inputs.iter().map(|i| Input::decode(i).unwrap()).collect();
        assert_eq!(
            inputs,
            [
                Input::Code("inc.rs".into()),
                Input::Path("concat ! (env ! (\"CARGO_MANIFEST_DIR\") , \"/d.txt\")".into()),
                Input::Env("CARGO_MANIFEST_DIR".into()),
                Input::Env("NU_FACTOR".into()),
                Input::Env("MODE".into()),
                Input::Unknown("$ name".into()),
            ]
        );
    }
}
