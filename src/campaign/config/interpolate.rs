//! `${...}` interpolation, OmegaConf-style, resolved once over the whole composed tree.
//!
//! Grammar of a string value: text with `${key}` (absolute dotted path, `a.b.0` or `a.b[0]`),
//! `${.key}` / `${..key}` (relative to the containing mapping / its parent), and
//! `${resolver:arg,arg}` (resolver names are dotted identifiers). Keys and arguments may
//! themselves contain interpolations (`${a.${b}}`, `${oc.env:X,${y}}`). Arguments may be quoted
//! (`'a,b'`, `"x"`); unquoted arguments are trimmed and typed like override values. `\${`
//! writes a literal `${`.
//!
//! Typing: a value that is exactly one interpolation takes the referenced value (a mapping
//! stays a mapping, an int stays an int); otherwise the parts are concatenated into a string
//! (scalars rendered as in [`Value`]'s `Display`, a list or mapping there is an error).
//!
//! Built-in resolvers: `oc.env:NAME[,default]` (from the injected [`Env`], never the process
//! environment unless you pass it; a default of `null` gives null, other defaults are strings),
//! `oc.decode:STRING` (parse a string as an override value: `"1"` -> 1, `"[1,2]"` -> list),
//! `oc.select:KEY[,default]` (a lookup that falls back instead of failing). Others come from
//! [`Resolvers`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use super::error::ConfigError;
use super::origin::Origins;
use super::overrides::hydra_primitive;
use super::path::KeyPath;
use super::value::{Mapping, Value};

/// Environment variables visible to `${oc.env:...}`. Injected explicitly so loading stays pure
/// and deterministic; use [`Env::from_process`] to opt into the real environment.
///
/// `Debug` redacts values whose name contains `TOKEN`, `KEY`, `SECRET` or `PASSWORD`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl Env {
    /// An empty environment.
    pub fn new() -> Self {
        Self::default()
    }

    /// A snapshot of the current process environment (variables that are valid UTF-8).
    pub fn from_process() -> Self {
        std::env::vars().collect()
    }

    /// Adds or replaces a variable (builder style).
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.vars.insert(name.into(), value.into());
        self
    }

    /// Adds or replaces a variable.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.insert(name.into(), value.into());
    }

    /// A variable's value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// All variables, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

pub(super) use crate::executor::shell::is_secret_name;

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.vars.iter().map(|(k, v)| {
                let shown = if is_secret_name(k) {
                    "<redacted>"
                } else {
                    v.as_str()
                };
                (k, shown)
            }))
            .finish()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Env {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Env {
            vars: iter
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }
}

impl From<BTreeMap<String, String>> for Env {
    fn from(vars: BTreeMap<String, String>) -> Self {
        Env { vars }
    }
}

/// A custom resolver: takes the evaluated arguments, returns a value or a message saying what
/// was wrong with them.
pub type ResolverFn = Arc<dyn Fn(&[Value]) -> Result<Value, String> + Send + Sync>;

/// Custom `${name:args}` resolvers, beyond the built-in `oc.env`, `oc.decode`, `oc.select`.
#[derive(Clone, Default)]
pub struct Resolvers {
    map: BTreeMap<String, ResolverFn>,
}

impl fmt::Debug for Resolvers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.map.keys()).finish()
    }
}

const BUILTIN: [&str; 3] = ["oc.decode", "oc.env", "oc.select"];

impl Resolvers {
    /// No custom resolvers (the built-ins remain available).
    pub fn none() -> Self {
        Self::default()
    }

    /// The resolvers Puzzletron's configs use, as pure string functions:
    /// `to_path:P` returns the path string `P` unchanged (Python turns it into a `Path`), and
    /// `get_object:a.b.C` returns the dotted import path `a.b.C` (Python imports it; a plan only
    /// needs its name).
    pub fn puzzletron() -> Self {
        fn one_string(name: &'static str) -> ResolverFn {
            Arc::new(move |args: &[Value]| match args {
                [v @ Value::String(_)] => Ok(v.clone()),
                [other] => Ok(Value::String(other.to_string())),
                _ => Err(format!(
                    "`{name}` takes exactly one argument, got {}",
                    args.len()
                )),
            })
        }
        Self::none()
            .with("to_path", one_string("to_path"))
            .with("get_object", one_string("get_object"))
    }

    /// Registers (or replaces) a resolver (builder style).
    pub fn with(mut self, name: impl Into<String>, f: ResolverFn) -> Self {
        self.map.insert(name.into(), f);
        self
    }

    /// Registers (or replaces) a resolver.
    pub fn register(&mut self, name: impl Into<String>, f: ResolverFn) {
        self.map.insert(name.into(), f);
    }

    fn known(&self) -> Vec<String> {
        let mut k: Vec<String> = BUILTIN.iter().map(|s| s.to_string()).collect();
        k.extend(self.map.keys().cloned());
        k.sort();
        k
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// A parsed string value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    Text(String),
    Interp(Expr),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    /// `${key}`: leading dots (0 = absolute) and the key, possibly with nested interpolations.
    Node {
        dots: usize,
        key: Vec<Piece>,
        raw: String,
    },
    /// `${name:args}`.
    Resolver {
        name: String,
        args: Vec<Arg>,
        raw: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    Quoted(String),
    Pieces(Vec<Piece>),
}

/// A syntax error at a character position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub position: usize,
    pub message: String,
}

/// Whether a string contains an (unescaped) interpolation.
pub(crate) fn has_interpolation(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == b'\\' && b[i + 1] == b'$' {
            i += 2;
            continue;
        }
        if b[i] == b'$' && b[i + 1] == b'{' {
            return true;
        }
        i += 1;
    }
    false
}

/// Parses a string value into text and interpolations.
pub(crate) fn parse_string(s: &str) -> Result<Vec<Piece>, SyntaxError> {
    let chars: Vec<char> = s.chars().collect();
    let mut p = Parser {
        chars: &chars,
        pos: 0,
        depth: 0,
    };
    let pieces = p.text_until(&[])?;
    Ok(pieces)
}

struct Parser<'a> {
    chars: &'a [char],
    pos: usize,
    depth: usize,
}

/// Limit on `${` nesting inside one string and on chains of interpolations referring to each
/// other: keeps recursion bounded on hostile input.
const MAX_INTERPOLATION_DEPTH: usize = 64;
const MAX_RESOLVE_DEPTH: usize = 200;

/// How much interpolation may produce in total, counted as copied nodes plus concatenated
/// string bytes: `a: [${b}, ${b}]`, `b: [${c}, ${c}]`, ... (or `"${b}${b}"`) doubles at each
/// level, like a YAML alias bomb. Real configs use a few thousand.
const EXPANSION_BUDGET: usize = 1_000_000;

/// Number of nodes in `v`, stopping once it exceeds `limit`.
fn bounded_size(v: &Value, limit: usize) -> usize {
    let mut n = 0;
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        n += 1;
        if n > limit {
            break;
        }
        match x {
            Value::List(l) => stack.extend(l.iter()),
            Value::Mapping(m) => stack.extend(m.values()),
            _ => {}
        }
    }
    n
}

fn push_text(out: &mut Vec<Piece>, c: char) {
    if let Some(Piece::Text(t)) = out.last_mut() {
        t.push(c);
    } else {
        out.push(Piece::Text(c.to_string()));
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }
    fn at_interp(&self) -> bool {
        self.peek() == Some('$') && self.chars.get(self.pos + 1) == Some(&'{')
    }
    fn err(&self, position: usize, message: impl Into<String>) -> SyntaxError {
        SyntaxError {
            position,
            message: message.into(),
        }
    }

    /// Top-level text: everything up to the end (stop chars are only used inside `${}`).
    fn text_until(&mut self, stop: &[char]) -> Result<Vec<Piece>, SyntaxError> {
        let mut out = Vec::new();
        while let Some(c) = self.peek() {
            if stop.contains(&c) {
                break;
            }
            if c == '\\'
                && self.chars.get(self.pos + 1) == Some(&'$')
                && self.chars.get(self.pos + 2) == Some(&'{')
            {
                push_text(&mut out, '$');
                push_text(&mut out, '{');
                self.pos += 3;
                continue;
            }
            if self.at_interp() {
                out.push(Piece::Interp(self.interp()?));
                continue;
            }
            push_text(&mut out, c);
            self.pos += 1;
        }
        Ok(out)
    }

    fn interp(&mut self) -> Result<Expr, SyntaxError> {
        if self.depth >= MAX_INTERPOLATION_DEPTH {
            return Err(self.err(
                self.pos,
                format!("interpolations nested deeper than {MAX_INTERPOLATION_DEPTH} levels"),
            ));
        }
        self.depth += 1;
        let r = self.interp_inner();
        self.depth -= 1;
        r
    }

    fn interp_inner(&mut self) -> Result<Expr, SyntaxError> {
        let open = self.pos;
        self.pos += 2;
        // Resolver name?
        let name_start = self.pos;
        while self
            .peek()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
        {
            self.pos += 1;
        }
        if self.peek() == Some(':') && self.pos > name_start {
            let name: String = self.chars[name_start..self.pos].iter().collect();
            if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
                return Err(self.err(name_start, format!("invalid resolver name `{name}`")));
            }
            self.pos += 1;
            let args = self.args(open)?;
            let raw: String = self.chars[open..self.pos].iter().collect();
            return Ok(Expr::Resolver { name, args, raw });
        }
        self.pos = name_start;
        let mut dots = 0;
        while self.peek() == Some('.') {
            dots += 1;
            self.pos += 1;
        }
        let mut key = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.err(open, "unclosed interpolation `${`")),
                Some('}') => {
                    self.pos += 1;
                    break;
                }
                Some(_) if self.at_interp() => key.push(Piece::Interp(self.interp()?)),
                Some(c)
                    if c.is_alphanumeric()
                        || matches!(
                            c,
                            '_' | '-'
                                | '.'
                                | '['
                                | ']'
                                | '/'
                                | '@'
                                | '+'
                                | '*'
                                | '%'
                                | '?'
                                | '|'
                                | ' '
                        ) =>
                {
                    push_text(&mut key, c);
                    self.pos += 1;
                }
                Some(c) => {
                    return Err(self.err(
                        self.pos,
                        format!("unexpected `{c}` in an interpolation key"),
                    ));
                }
            }
        }
        if key.is_empty() && dots == 0 {
            return Err(self.err(open, "empty interpolation `${}`"));
        }
        // Keys are trimmed of surrounding spaces.
        if let Some(Piece::Text(t)) = key.first_mut() {
            *t = t.trim_start().to_string();
        }
        if let Some(Piece::Text(t)) = key.last_mut() {
            *t = t.trim_end().to_string();
        }
        let raw: String = self.chars[open..self.pos].iter().collect();
        Ok(Expr::Node { dots, key, raw })
    }

    fn args(&mut self, open: usize) -> Result<Vec<Arg>, SyntaxError> {
        let mut args = Vec::new();
        // `${name:}` has no arguments.
        if self.peek() == Some('}') {
            self.pos += 1;
            return Ok(args);
        }
        loop {
            while matches!(self.peek(), Some(' ' | '\t')) {
                self.pos += 1;
            }
            let arg = match self.peek() {
                Some(q @ ('\'' | '"')) => {
                    let qpos = self.pos;
                    self.pos += 1;
                    let mut s = String::new();
                    loop {
                        match self.peek() {
                            None => {
                                return Err(self.err(qpos, "unterminated quoted argument"));
                            }
                            Some('\\') if matches!(self.chars.get(self.pos + 1), Some(&c) if c == q || c == '\\') =>
                            {
                                s.push(self.chars[self.pos + 1]);
                                self.pos += 2;
                            }
                            Some(c) if c == q => {
                                self.pos += 1;
                                break;
                            }
                            Some(c) => {
                                s.push(c);
                                self.pos += 1;
                            }
                        }
                    }
                    while matches!(self.peek(), Some(' ' | '\t')) {
                        self.pos += 1;
                    }
                    Arg::Quoted(s)
                }
                _ => {
                    let mut pieces = Vec::new();
                    loop {
                        match self.peek() {
                            None => return Err(self.err(open, "unclosed interpolation `${`")),
                            Some(',' | '}') => break,
                            Some('\\') if self.chars.get(self.pos + 1).is_some() => {
                                let n = self.chars[self.pos + 1];
                                if n == '$' && self.chars.get(self.pos + 2) == Some(&'{') {
                                    push_text(&mut pieces, '$');
                                    push_text(&mut pieces, '{');
                                    self.pos += 3;
                                } else {
                                    push_text(&mut pieces, n);
                                    self.pos += 2;
                                }
                            }
                            Some(_) if self.at_interp() => {
                                pieces.push(Piece::Interp(self.interp()?));
                            }
                            Some(c @ ('{' | '[' | ']' | '\'' | '"')) => {
                                return Err(self.err(
                                    self.pos,
                                    format!(
                                        "`{c}` in an unquoted resolver argument; quote the argument"
                                    ),
                                ));
                            }
                            Some(c) => {
                                push_text(&mut pieces, c);
                                self.pos += 1;
                            }
                        }
                    }
                    Arg::Pieces(pieces)
                }
            };
            args.push(arg);
            match self.peek() {
                Some(',') => self.pos += 1,
                Some('}') => {
                    self.pos += 1;
                    return Ok(args);
                }
                None => return Err(self.err(open, "unclosed interpolation `${`")),
                Some(c) => {
                    return Err(self.err(self.pos, format!("expected `,` or `}}`, found `{c}`")));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Resolution

/// Resolves every interpolation in `root`, returning the resolved tree. `origins` is updated
/// for subtrees copied by whole-value interpolations.
pub(crate) fn resolve_tree(
    root: &Value,
    origins: &mut Origins,
    env: &Env,
    resolvers: &Resolvers,
) -> Result<Value, ConfigError> {
    let mut r = Resolver {
        root,
        origins,
        env,
        resolvers,
        memo: HashMap::new(),
        stack: Vec::new(),
        copies: Vec::new(),
        budget: EXPANSION_BUDGET,
    };
    let v = r.resolve_at(&KeyPath::root())?;
    let copies = std::mem::take(&mut r.copies);
    for (to, from) in copies {
        let items = origins.subtree(&from);
        // Keep the origin of the interpolating value itself; children come from the source.
        for (rel, o) in items {
            if !rel.is_root() {
                origins.insert(to.join(&rel), o);
            }
        }
    }
    Ok(v)
}

/// Resolves the interpolations of one string against `root` (absolute keys look up `root`;
/// relative keys start from the root). Used by the fuzz target and by callers that want to
/// evaluate one expression, e.g. a templated path.
///
/// # Errors
/// The interpolation errors of [`ConfigError`]; the key path they name is `<expression>`.
pub fn resolve_string(
    text: &str,
    root: &Value,
    env: &Env,
    resolvers: &Resolvers,
) -> Result<Value, ConfigError> {
    let origins = Origins::new();
    let mut r = Resolver {
        root,
        origins: &origins,
        env,
        resolvers,
        memo: HashMap::new(),
        stack: Vec::new(),
        copies: Vec::new(),
        budget: EXPANSION_BUDGET,
    };
    r.eval_string(text, &KeyPath::root().child_key("<expression>"))
}

struct Resolver<'a> {
    root: &'a Value,
    origins: &'a Origins,
    env: &'a Env,
    resolvers: &'a Resolvers,
    memo: HashMap<KeyPath, Value>,
    stack: Vec<KeyPath>,
    /// (destination, source) of whole-value interpolations of containers.
    copies: Vec<(KeyPath, KeyPath)>,
    /// Remaining nodes + string bytes interpolation may still produce (see
    /// [`EXPANSION_BUDGET`]).
    budget: usize,
}

enum Found<'a> {
    Raw(&'a Value),
    Resolved(Value),
}

impl<'a> Resolver<'a> {
    fn origin(&self, at: &KeyPath) -> Option<super::Origin> {
        self.origins.nearest(at).cloned()
    }

    /// Finds the node at `path`, resolving interpolated intermediate nodes on the way.
    fn locate(&mut self, path: &KeyPath) -> Result<Option<Found<'a>>, ConfigError> {
        let mut cur: &'a Value = self.root;
        for (i, seg) in path.segments().iter().enumerate() {
            if let Value::String(s) = cur
                && has_interpolation(s)
            {
                let prefix = KeyPath(path.0[..i].to_vec());
                let resolved = self.resolve_at(&prefix)?;
                let rest = KeyPath(path.0[i..].to_vec());
                return Ok(resolved.get_path(&rest).cloned().map(Found::Resolved));
            }
            match cur.child(seg) {
                Some(c) => cur = c,
                None => return Ok(None),
            }
        }
        Ok(Some(Found::Raw(cur)))
    }

    fn resolve_at(&mut self, path: &KeyPath) -> Result<Value, ConfigError> {
        if let Some(v) = self.memo.get(path) {
            return Ok(v.clone());
        }
        if let Some(i) = self.stack.iter().position(|p| p == path) {
            let mut chain = self.stack[i..].to_vec();
            chain.push(path.clone());
            let origin = self.origin(&chain[0]);
            return Err(ConfigError::InterpolationCycle { chain, origin });
        }
        let node = match self.locate(path)? {
            Some(Found::Raw(v)) => v,
            Some(Found::Resolved(v)) => return Ok(v),
            None => {
                return Err(ConfigError::MissingKey { key: path.clone() });
            }
        };
        if self.stack.len() >= MAX_RESOLVE_DEPTH {
            return Err(ConfigError::InterpolationValue {
                key: path.clone(),
                origin: self.origin(path),
                message: format!(
                    "interpolations refer to each other more than {MAX_RESOLVE_DEPTH} levels deep"
                ),
            });
        }
        self.stack.push(path.clone());
        let out = match node {
            // Also strings with only escaped `\${` (they need unescaping).
            Value::String(s) if s.contains("${") => {
                let v = self.eval_string(s, path)?;
                self.memo.insert(path.clone(), v.clone());
                v
            }
            Value::Mapping(m) => {
                let mut out = Mapping::with_capacity(m.len());
                for k in m.keys() {
                    let v = self.resolve_at(&path.child_key(k))?;
                    out.insert(k.clone(), v);
                }
                Value::Mapping(out)
            }
            Value::List(l) => {
                let mut out = Vec::with_capacity(l.len());
                for i in 0..l.len() {
                    out.push(self.resolve_at(&path.child_index(i))?);
                }
                Value::List(out)
            }
            other => other.clone(),
        };
        self.stack.pop();
        Ok(out)
    }

    fn eval_string(&mut self, s: &str, at: &KeyPath) -> Result<Value, ConfigError> {
        let pieces = parse_string(s).map_err(|e| ConfigError::InterpolationSyntax {
            key: at.clone(),
            origin: self.origin(at),
            text: s.to_string(),
            position: e.position,
            message: e.message,
        })?;
        self.eval_pieces(&pieces, at, true)
    }

    /// Evaluates pieces: one interpolation alone keeps its type (when `typed`), else a string.
    fn eval_pieces(
        &mut self,
        pieces: &[Piece],
        at: &KeyPath,
        typed: bool,
    ) -> Result<Value, ConfigError> {
        if let [Piece::Interp(e)] = pieces
            && typed
        {
            return self.eval_expr(e, at);
        }
        let mut out = String::new();
        for p in pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Interp(e) => {
                    let v = self.eval_expr(e, at)?;
                    match v {
                        Value::String(s) => out.push_str(&s),
                        Value::List(_) | Value::Mapping(_) => {
                            return Err(ConfigError::InterpolationValue {
                                key: at.clone(),
                                origin: self.origin(at),
                                message: format!(
                                    "`{}` is a {}; it can only be used as the whole value, not inside a string",
                                    expr_raw(e),
                                    v.kind()
                                ),
                            });
                        }
                        scalar => out.push_str(&scalar.to_string()),
                    }
                }
            }
        }
        self.spend(out.len(), at)?;
        Ok(Value::String(out))
    }

    fn spend(&mut self, amount: usize, at: &KeyPath) -> Result<(), ConfigError> {
        match self.budget.checked_sub(amount) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => Err(ConfigError::InterpolationValue {
                key: at.clone(),
                origin: self.origin(at),
                message: format!(
                    "interpolations expand the config beyond {EXPANSION_BUDGET} nodes and bytes (values that repeat each other, level after level)"
                ),
            }),
        }
    }

    fn eval_expr(&mut self, e: &Expr, at: &KeyPath) -> Result<Value, ConfigError> {
        match e {
            Expr::Node { dots, key, raw } => {
                let key_text = match self.eval_pieces(key, at, false)? {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                let target = self.target_path(*dots, &key_text, at, raw)?;
                self.lookup(&target, at, raw, &key_text)
            }
            Expr::Resolver { name, args, raw } => self.call(name, args, at, raw),
        }
    }

    fn target_path(
        &self,
        dots: usize,
        key: &str,
        at: &KeyPath,
        raw: &str,
    ) -> Result<KeyPath, ConfigError> {
        let rel = KeyPath::parse(key).ok_or_else(|| ConfigError::InterpolationValue {
            key: at.clone(),
            origin: self.origin(at),
            message: format!("`{raw}`: `{key}` is not a valid key path"),
        })?;
        if dots == 0 {
            return Ok(rel);
        }
        // `.x` is a sibling of `at`; each extra dot goes one level up.
        let mut base = at.clone();
        for _ in 0..dots {
            base = base
                .parent()
                .ok_or_else(|| ConfigError::InterpolationValue {
                    key: at.clone(),
                    origin: self.origin(at),
                    message: format!("`{raw}` goes above the root of the config"),
                })?;
        }
        Ok(base.join(&rel))
    }

    fn lookup(
        &mut self,
        target: &KeyPath,
        at: &KeyPath,
        raw: &str,
        key_text: &str,
    ) -> Result<Value, ConfigError> {
        match self.resolve_at(target) {
            Ok(v) => {
                if matches!(v, Value::Mapping(_) | Value::List(_)) {
                    self.spend(bounded_size(&v, self.budget), at)?;
                    self.copies.push((at.clone(), target.clone()));
                }
                Ok(v)
            }
            Err(ConfigError::MissingKey { .. }) => Err(ConfigError::UnknownKey {
                key: at.clone(),
                origin: self.origin(at),
                expression: raw.to_string(),
                missing: if key_text.is_empty() {
                    target.to_string()
                } else {
                    key_text.to_string()
                },
            }),
            Err(e) => Err(e),
        }
    }

    fn eval_args(&mut self, args: &[Arg], at: &KeyPath) -> Result<Vec<Value>, ConfigError> {
        args.iter()
            .map(|a| match a {
                Arg::Quoted(s) => Ok(Value::String(s.clone())),
                Arg::Pieces(p) => {
                    let trimmed = trim_pieces(p);
                    if let [Piece::Interp(_)] = trimmed.as_slice() {
                        return self.eval_pieces(&trimmed, at, true);
                    }
                    let has_interp = trimmed.iter().any(|p| matches!(p, Piece::Interp(_)));
                    let v = self.eval_pieces(&trimmed, at, false)?;
                    Ok(match v {
                        Value::String(s) if !has_interp => hydra_primitive(&s),
                        other => other,
                    })
                }
            })
            .collect()
    }

    fn call(
        &mut self,
        name: &str,
        args: &[Arg],
        at: &KeyPath,
        raw: &str,
    ) -> Result<Value, ConfigError> {
        let bad = |this: &Self, message: String| ConfigError::InterpolationValue {
            key: at.clone(),
            origin: this.origin(at),
            message: format!("`{raw}`: {message}"),
        };
        match name {
            "oc.env" => {
                let vals = self.eval_args(args, at)?;
                let (var, default) = match vals.as_slice() {
                    [Value::String(v)] => (v.clone(), None),
                    [Value::String(v), d] => (v.clone(), Some(d.clone())),
                    _ => {
                        return Err(bad(
                            self,
                            "`oc.env` takes a variable name and an optional default".into(),
                        ));
                    }
                };
                match (self.env.get(&var), default) {
                    (Some(v), _) => Ok(Value::String(v.to_string())),
                    (None, Some(Value::Null)) => Ok(Value::Null),
                    (None, Some(Value::String(d))) => Ok(Value::String(d)),
                    (None, Some(d)) => Ok(Value::String(d.to_string())),
                    (None, None) => Err(ConfigError::MissingEnv {
                        key: at.clone(),
                        origin: self.origin(at),
                        name: var,
                    }),
                }
            }
            "oc.decode" => {
                let vals = self.eval_args(args, at)?;
                match vals.as_slice() {
                    [Value::String(s)] => {
                        let o = super::overrides::parse_override(&format!("x={s}"))
                            .map_err(|e| bad(self, format!("cannot decode `{s}`: {e}")))?;
                        Ok(o.value.unwrap_or_default())
                    }
                    [Value::Null] => Ok(Value::Null),
                    [other] => Ok(other.clone()),
                    _ => Err(bad(self, "`oc.decode` takes exactly one argument".into())),
                }
            }
            "oc.select" => {
                let vals = self.eval_args(args, at)?;
                let (key, default) = match vals.as_slice() {
                    [Value::String(k)] => (k.clone(), None),
                    [Value::String(k), d] => (k.clone(), Some(d.clone())),
                    _ => {
                        return Err(bad(
                            self,
                            "`oc.select` takes a key and an optional default".into(),
                        ));
                    }
                };
                let dots = key.chars().take_while(|c| *c == '.').count();
                let target = self.target_path(dots, &key[dots..], at, raw)?;
                match self.resolve_at(&target) {
                    Ok(v) => Ok(v),
                    Err(ConfigError::MissingKey { .. }) => Ok(default.unwrap_or(Value::Null)),
                    Err(e) => Err(e),
                }
            }
            _ => {
                let Some(f) = self.resolvers.map.get(name).cloned() else {
                    return Err(ConfigError::UnknownResolver {
                        key: at.clone(),
                        origin: self.origin(at),
                        name: name.to_string(),
                        known: self.resolvers.known(),
                    });
                };
                let vals = self.eval_args(args, at)?;
                f(&vals).map_err(|m| bad(self, m))
            }
        }
    }
}

fn trim_pieces(p: &[Piece]) -> Vec<Piece> {
    let mut v = p.to_vec();
    if let Some(Piece::Text(t)) = v.first_mut() {
        *t = t.trim_start().to_string();
    }
    if let Some(Piece::Text(t)) = v.last_mut() {
        *t = t.trim_end().to_string();
    }
    v.retain(|p| !matches!(p, Piece::Text(t) if t.is_empty()));
    v
}

fn expr_raw(e: &Expr) -> &str {
    match e {
        Expr::Node { raw, .. } | Expr::Resolver { raw, .. } => raw,
    }
}
