//! Hydra's command-line override grammar: `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`, `~a.b=v`.
//!
//! Values follow Hydra's typing (<https://hydra.cc/docs/advanced/override_grammar/basic/>):
//! `null`, `true`/`false` (any case), integers (`10`, `-3`, `1_000`), floats (`0.5`, `1e-4`,
//! `inf`, `nan`), everything else a string (`abc`, `010`, `yes`, `a b`, `http://x`);
//! `'...'` / `"..."` quoted strings (backslash escapes the quote); lists `[1, 2]`; mappings
//! `{x: 1, y: [a]}`; `${...}` interpolations, kept as strings and resolved after all overrides.
//! `a=` sets the empty string. Sweeps (`a=1,2`) and functions (`choice(...)`) belong to Hydra's
//! multirun and are refused with a pointer to the offending character.

use std::fmt;

use super::error::ConfigError;
use super::origin::{Origin, Origins};
use super::path::{KeyPath, PathSegment};
use super::value::{Mapping, Value};

/// What an override does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OverrideKind {
    /// `a.b=v`: change an existing key (error if it does not exist).
    Set,
    /// `+a.b=v`: add a new key (error if it already exists).
    Add,
    /// `++a.b=v`: set the key whether or not it exists.
    Upsert,
    /// `~a.b` (any value) or `~a.b=v` (only if the current value is `v`): remove the key.
    Delete,
}

/// One parsed override, ready to apply with [`Override::apply`] or to pass to
/// [`load_experiment`](super::load_experiment).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Override {
    /// What to do.
    pub kind: OverrideKind,
    /// The addressed key.
    pub key: KeyPath,
    /// The value (`None` only for a [`OverrideKind::Delete`] without `=`).
    pub value: Option<Value>,
    /// The override as the user typed it (for error messages and provenance).
    pub text: String,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for Override {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_override(s)
    }
}

/// Serialized as the text the user typed (`"a.b=1"`), so a plan document stays readable.
impl serde::Serialize for Override {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Parsed back from its text with [`parse_override`]; a syntax error is a serde error.
impl<'de> serde::Deserialize<'de> for Override {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_override(&text).map_err(serde::de::Error::custom)
    }
}

/// Parses one override as typed on a command line.
///
/// # Errors
/// [`ConfigError::OverrideSyntax`] with the 0-based character position of the first bad
/// character; its message shows the override with a caret under that character.
pub fn parse_override(text: &str) -> Result<Override, ConfigError> {
    let mut p = P {
        text,
        chars: text.chars().collect(),
        pos: 0,
        depth: 0,
    };
    p.parse()
}

/// Parses several overrides (see [`parse_override`]), stopping at the first error.
///
/// # Errors
/// The first [`ConfigError::OverrideSyntax`].
pub fn parse_overrides<I, S>(texts: I) -> Result<Vec<Override>, ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    texts
        .into_iter()
        .map(|t| parse_override(t.as_ref()))
        .collect()
}

struct P<'a> {
    text: &'a str,
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

fn is_key_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

fn is_unquoted_char(c: char) -> bool {
    c.is_alphanumeric()
        || matches!(
            c,
            '_' | '/'
                | '-'
                | '\\'
                | '+'
                | '.'
                | '$'
                | '%'
                | '*'
                | '@'
                | '?'
                | '|'
                | ':'
                | ' '
                | '\t'
        )
}

impl P<'_> {
    fn err(&self, pos: usize, message: impl Into<String>) -> ConfigError {
        ConfigError::OverrideSyntax {
            text: self.text.to_string(),
            position: pos,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn peek_at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.pos += 1;
        }
    }

    fn parse(&mut self) -> Result<Override, ConfigError> {
        let kind = match (self.peek(), self.peek_at(1)) {
            (Some('~'), _) => {
                self.pos = 1;
                OverrideKind::Delete
            }
            (Some('+'), Some('+')) => {
                self.pos = 2;
                OverrideKind::Upsert
            }
            (Some('+'), _) => {
                self.pos = 1;
                OverrideKind::Add
            }
            _ => OverrideKind::Set,
        };
        let key = self.key()?;
        let value = match self.peek() {
            None if kind == OverrideKind::Delete => None,
            None => {
                return Err(self.err(
                    self.pos,
                    "expected `=` and a value after the key (`key=value`)",
                ));
            }
            Some('=') => {
                self.pos += 1;
                Some(self.value()?)
            }
            Some(c) => return Err(self.key_char_error(c)),
        };
        Ok(Override {
            kind,
            key,
            value,
            text: self.text.to_string(),
        })
    }

    fn key_char_error(&self, c: char) -> ConfigError {
        let msg = match c {
            '@' => "`key@package` selects a config group package; only config values can be overridden here".to_string(),
            '/' => "`group/option` overrides select config groups; only dotted config keys (`a.b.c`) can be overridden here".to_string(),
            '[' => "list elements are addressed as `key.0`, not `key[0]`".to_string(),
            ' ' | '\t' => "whitespace is not allowed in a key".to_string(),
            c => format!(
                "unexpected character `{c}` in the key; keys are letters, digits, `_` and `-`, separated by `.`"
            ),
        };
        self.err(self.pos, msg)
    }

    fn key(&mut self) -> Result<KeyPath, ConfigError> {
        let mut segs = Vec::new();
        loop {
            let start = self.pos;
            while self.peek().is_some_and(is_key_char) {
                self.pos += 1;
            }
            if self.pos == start {
                return Err(match self.peek() {
                    None => self.err(self.pos, "expected a key"),
                    Some(c) if segs.is_empty() && c != '.' => self.key_char_error(c),
                    Some(_) => self.err(self.pos, "expected a key segment (empty segment)"),
                });
            }
            segs.push(PathSegment::Key(
                self.chars[start..self.pos].iter().collect(),
            ));
            if self.peek() == Some('.') {
                self.pos += 1;
            } else {
                break;
            }
        }
        Ok(KeyPath(segs))
    }

    fn value(&mut self) -> Result<Value, ConfigError> {
        self.skip_ws();
        if self.peek().is_none() {
            return Ok(Value::String(String::new()));
        }
        let v = self.element(false)?;
        self.skip_ws();
        match self.peek() {
            None => Ok(v),
            Some(',') => Err(self.err(
                self.pos,
                "`a=x,y` is a Hydra multirun sweep; for a list write `a=[x,y]`, for a string with a comma quote it: `a='x,y'`",
            )),
            Some(c) => Err(self.err(self.pos, format!("unexpected `{c}` after the value"))),
        }
    }

    /// One element: list, mapping, quoted string or primitive. `nested` is true inside a list or
    /// mapping, where `,`, `]` and `}` end a primitive.
    fn element(&mut self, nested: bool) -> Result<Value, ConfigError> {
        self.skip_ws();
        if matches!(self.peek(), Some('[' | '{')) {
            if self.depth >= super::yaml::MAX_DEPTH {
                return Err(self.err(
                    self.pos,
                    format!("nesting deeper than {} levels", super::yaml::MAX_DEPTH),
                ));
            }
            self.depth += 1;
            let r = if self.peek() == Some('[') {
                self.list()
            } else {
                self.mapping()
            };
            self.depth -= 1;
            return r;
        }
        match self.peek() {
            Some(q @ ('\'' | '"')) => {
                let s = self.quoted(q)?;
                self.skip_ws();
                match self.peek() {
                    None | Some(',' | ']' | '}') => Ok(Value::String(s)),
                    Some(c) => {
                        Err(self.err(self.pos, format!("unexpected `{c}` after a quoted string")))
                    }
                }
            }
            _ => self.primitive(nested),
        }
    }

    fn list(&mut self) -> Result<Value, ConfigError> {
        let open = self.pos;
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(']') {
            self.pos += 1;
            return Ok(Value::List(items));
        }
        loop {
            items.push(self.element(true)?);
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(']') => {
                    self.pos += 1;
                    return Ok(Value::List(items));
                }
                None => return Err(self.err(open, "unclosed `[`")),
                Some(c) => {
                    return Err(self.err(self.pos, format!("expected `,` or `]`, found `{c}`")));
                }
            }
        }
    }

    fn mapping(&mut self) -> Result<Value, ConfigError> {
        let open = self.pos;
        self.pos += 1;
        let mut m = Mapping::new();
        self.skip_ws();
        if self.peek() == Some('}') {
            self.pos += 1;
            return Ok(Value::Mapping(m));
        }
        loop {
            self.skip_ws();
            let key_pos = self.pos;
            let key = match self.peek() {
                Some(q @ ('\'' | '"')) => self.quoted(q)?,
                _ => {
                    let start = self.pos;
                    while self
                        .peek()
                        .is_some_and(|c| is_unquoted_char(c) && c != ':' && c != '$')
                    {
                        self.pos += 1;
                    }
                    let k: String = self.chars[start..self.pos].iter().collect();
                    let k = k.trim().to_string();
                    if k.is_empty() {
                        return Err(match self.peek() {
                            None => self.err(open, "unclosed `{`"),
                            Some(c) => self.err(self.pos, format!("expected a key, found `{c}`")),
                        });
                    }
                    k
                }
            };
            self.skip_ws();
            if self.peek() != Some(':') {
                return Err(match self.peek() {
                    None => self.err(open, "unclosed `{`"),
                    Some(c) => {
                        self.err(self.pos, format!("expected `:` after the key, found `{c}`"))
                    }
                });
            }
            self.pos += 1;
            if m.contains_key(&key) {
                return Err(self.err(key_pos, format!("duplicate key `{key}`")));
            }
            let v = self.element(true)?;
            m.insert(key, v);
            self.skip_ws();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some('}') => {
                    self.pos += 1;
                    return Ok(Value::Mapping(m));
                }
                None => return Err(self.err(open, "unclosed `{`")),
                Some(c) => {
                    return Err(self.err(self.pos, format!("expected `,` or `}}`, found `{c}`")));
                }
            }
        }
    }

    fn quoted(&mut self, q: char) -> Result<String, ConfigError> {
        let open = self.pos;
        self.pos += 1;
        let mut s = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(
                        self.err(open, format!("unterminated quoted string (missing `{q}`)"))
                    );
                }
                Some('\\') if matches!(self.peek_at(self.pos + 1), Some(c) if c == q || c == '\\') =>
                {
                    s.push(self.chars[self.pos + 1]);
                    self.pos += 2;
                }
                Some(c) if c == q => {
                    self.pos += 1;
                    return Ok(s);
                }
                Some(c) => {
                    s.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    fn primitive(&mut self, nested: bool) -> Result<Value, ConfigError> {
        let start = self.pos;
        let mut has_interp = false;
        while let Some(c) = self.peek() {
            if c == '$' && self.peek_at(self.pos + 1) == Some('{') {
                self.interpolation()?;
                has_interp = true;
                continue;
            }
            if c == '\\' {
                // Hydra escapes: `\,` `\ ` `\[` ... keep the escaped character literally.
                if let Some(n) = self.peek_at(self.pos + 1)
                    && !n.is_alphanumeric()
                {
                    self.pos += 2;
                    continue;
                }
            }
            if is_unquoted_char(c) {
                self.pos += 1;
                continue;
            }
            if nested && matches!(c, ',' | ']' | '}') {
                break;
            }
            if !nested && c == ',' {
                break;
            }
            let msg = match c {
                '(' | ')' => "functions such as `choice(...)` or `range(...)` are Hydra sweep syntax and are not supported; quote the value if `(` is part of a string".to_string(),
                '[' | '{' => format!("`{c}` can only start a list or mapping value; quote the value if it is part of a string"),
                ']' | '}' => format!("unmatched `{c}`"),
                '\'' | '"' => "a quote inside an unquoted value; quote the whole value".to_string(),
                '=' => "`=` is not allowed in an unquoted value; quote the value".to_string(),
                c => format!("character `{c}` is not allowed in an unquoted value; quote the value"),
            };
            return Err(self.err(self.pos, msg));
        }
        let raw: String = self.chars[start..self.pos].iter().collect();
        let raw = unescape(raw.trim());
        if raw.is_empty() {
            return Err(match self.peek() {
                Some(c) => self.err(self.pos, format!("expected a value, found `{c}`")),
                None => self.err(self.pos, "expected a value"),
            });
        }
        if has_interp {
            return Ok(Value::String(raw));
        }
        Ok(hydra_primitive(&raw))
    }

    /// Skips over a balanced `${...}`.
    fn interpolation(&mut self) -> Result<(), ConfigError> {
        let open = self.pos;
        self.pos += 2;
        let mut depth = 1;
        while let Some(c) = self.peek() {
            self.pos += 1;
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(self.err(open, "unclosed interpolation `${`"))
    }
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\\'
            && let Some(&n) = it.peek()
            && !n.is_alphanumeric()
            && n != '$'
        {
            out.push(n);
            it.next();
            continue;
        }
        out.push(c);
    }
    out
}

/// Hydra's typing of an unquoted primitive.
pub(crate) fn hydra_primitive(s: &str) -> Value {
    let lower = s.to_ascii_lowercase();
    match lower.as_str() {
        "null" => return Value::Null,
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        "inf" | "+inf" => return Value::Float(f64::INFINITY),
        "-inf" => return Value::Float(f64::NEG_INFINITY),
        "nan" | "+nan" | "-nan" => return Value::Float(f64::NAN),
        _ => {}
    }
    let (sign, body) = match s.strip_prefix(['+', '-']) {
        Some(b) => (&s[..1], b),
        None => ("", s),
    };
    // INT: '0' | [1-9] (_? [0-9])*
    let digits_us = |t: &str| {
        !t.is_empty()
            && t.as_bytes()[0].is_ascii_digit()
            && !t.ends_with('_')
            && !t.contains("__")
            && t.bytes().all(|b| b.is_ascii_digit() || b == b'_')
    };
    if body == "0" || (digits_us(body) && !body.starts_with('0')) {
        if let Ok(i) = format!("{sign}{}", body.replace('_', "")).parse::<i64>() {
            return Value::Int(i);
        }
        return Value::String(s.to_string());
    }
    // FLOAT: (digits? '.' digits | digits '.') exponent? | digits exponent
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mant_ok = match mant.split_once('.') {
        Some(("", f)) => digits_us(f),
        Some((i, "")) => digits_us(i),
        Some((i, f)) => digits_us(i) && digits_us(f),
        None => digits_us(mant) && exp.is_some(),
    };
    let exp_ok = exp.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    if mant_ok
        && exp_ok
        && let Ok(x) = format!("{sign}{}", body.replace('_', "")).parse::<f64>()
    {
        return Value::Float(x);
    }
    Value::String(s.to_string())
}

impl Override {
    /// Applies this override to `root` (before interpolation).
    ///
    /// A mapping value set onto an existing mapping is merged into it, as Hydra does
    /// (`OmegaConf.update(..., merge=True)`); any other value replaces the node.
    ///
    /// # Errors
    /// [`ConfigError::OverrideApply`] when `a=v` or `~a` addresses a missing key, `+a=v` an
    /// existing one, a parent is not a mapping (or a list, for an index), or `~a=v` finds a
    /// different value.
    pub fn apply(&self, root: &mut Value) -> Result<(), ConfigError> {
        self.apply_tracked(root, &mut Origins::new(), 0)
    }

    fn fail(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::OverrideApply {
            text: self.text.clone(),
            key: self.key.clone(),
            message: message.into(),
        }
    }

    /// [`Override::apply`], keeping `origins` in step (`index` is the override's position).
    pub(crate) fn apply_tracked(
        &self,
        root: &mut Value,
        origins: &mut Origins,
        index: usize,
    ) -> Result<(), ConfigError> {
        let segs = self.key.segments();
        let (last, parents) = segs.split_last().ok_or_else(|| self.fail("empty key"))?;
        let create = matches!(self.kind, OverrideKind::Add | OverrideKind::Upsert);
        let mut node = root;
        let mut walked = KeyPath::root();
        for seg in parents {
            walked = KeyPath([walked.0.as_slice(), std::slice::from_ref(seg)].concat());
            let kind = node.kind();
            node = match node {
                Value::Mapping(m) => {
                    let k = seg.as_key().into_owned();
                    if !m.contains_key(&k) {
                        if !create {
                            return Err(self.fail(if self.kind == OverrideKind::Delete {
                                format!("`{walked}` is not in the config")
                            } else {
                                format!(
                                    "`{walked}` is not in the config; to add it, write `+{}`",
                                    self.text
                                )
                            }));
                        }
                        m.insert(k.clone(), Value::Mapping(Mapping::new()));
                    }
                    let child = m.get_mut(&k).expect("present");
                    if create && child.is_null() {
                        *child = Value::Mapping(Mapping::new());
                    }
                    child
                }
                Value::List(l) => {
                    let len = l.len();
                    let i = seg.as_index().filter(|i| *i < len).ok_or_else(|| {
                        self.fail(format!(
                            "`{}` is a list of {len} items; `{seg:?}` is not a valid index",
                            walked.parent().unwrap_or_default()
                        ))
                    })?;
                    &mut l[i]
                }
                _ => {
                    return Err(self.fail(format!(
                        "`{}` is a {kind}, not a mapping",
                        walked.parent().unwrap_or_default()
                    )));
                }
            };
        }
        let parent_path = walked;
        let record = |origins: &mut Origins, v: &Value| {
            origins.remove_subtree(&self.key);
            let o = Origin::Override {
                index,
                text: self.text.clone(),
            };
            v.walk(&mut |p, _| origins.insert(self.key.join(p), o.clone()));
        };
        match node {
            Value::Mapping(m) => {
                let k = last.as_key().into_owned();
                let exists = m.contains_key(&k);
                match self.kind {
                    OverrideKind::Set | OverrideKind::Upsert => {
                        if !exists && self.kind == OverrideKind::Set {
                            return Err(self.fail(format!(
                                "`{}` is not in the config; to add it, write `+{}`",
                                self.key, self.text
                            )));
                        }
                        let v = self.value.clone().unwrap_or_default();
                        match (m.get_mut(&k), v) {
                            (Some(existing @ Value::Mapping(_)), Value::Mapping(new)) => {
                                let o = Origin::Override {
                                    index,
                                    text: self.text.clone(),
                                };
                                let mut src = Origins::new();
                                Value::Mapping(new.clone())
                                    .walk(&mut |p, _| src.insert(p.clone(), o.clone()));
                                // Merge with origins relative to the merged node, then
                                // re-home them under the key.
                                let mut local = Origins::new();
                                super::merge::merge_at(
                                    existing,
                                    &mut local,
                                    &KeyPath::root(),
                                    Value::Mapping(new),
                                    &src,
                                );
                                origins.insert_subtree(&self.key, local.subtree(&KeyPath::root()));
                            }
                            (_, v) => {
                                record(origins, &v);
                                m.insert(k, v);
                            }
                        }
                    }
                    OverrideKind::Add => {
                        if let Some(existing) = m.get(&k) {
                            return Err(self.fail(format!(
                                "`{}` already exists (value: {existing}); to change it write `{}`, or `+{}` to set it either way",
                                self.key,
                                self.text.trim_start_matches('+'),
                                self.text
                            )));
                        }
                        let v = self.value.clone().unwrap_or_default();
                        record(origins, &v);
                        m.insert(k, v);
                    }
                    OverrideKind::Delete => {
                        let Some(existing) = m.get(&k) else {
                            return Err(self.fail(format!("`{}` is not in the config", self.key)));
                        };
                        self.check_delete_value(existing)?;
                        m.shift_remove(&k);
                        origins.remove_subtree(&self.key);
                    }
                }
            }
            Value::List(l) => {
                let len = l.len();
                let i = last.as_index().filter(|i| *i < len).ok_or_else(|| {
                    self.fail(format!(
                        "`{parent_path}` is a list of {len} items; `{}` is not a valid index (lists cannot grow through overrides)",
                        last.as_key()
                    ))
                })?;
                match self.kind {
                    OverrideKind::Add => {
                        return Err(self.fail(format!(
                            "list item `{}` already exists; write `{}` to change it",
                            self.key,
                            self.text.trim_start_matches('+')
                        )));
                    }
                    OverrideKind::Set | OverrideKind::Upsert => {
                        let v = self.value.clone().unwrap_or_default();
                        record(origins, &v);
                        l[i] = v;
                    }
                    OverrideKind::Delete => {
                        self.check_delete_value(&l[i])?;
                        l.remove(i);
                        // Later items shift down; their old origins no longer line up.
                        origins.remove_subtree(&parent_path);
                    }
                }
            }
            other => {
                return Err(self.fail(format!(
                    "`{parent_path}` is a {}, not a mapping",
                    other.kind()
                )));
            }
        }
        Ok(())
    }

    fn check_delete_value(&self, existing: &Value) -> Result<(), ConfigError> {
        if let Some(expected) = &self.value {
            let same = existing == expected
                || matches!((existing, expected), (Value::String(a), b) if *a == b.to_string());
            if !same {
                return Err(self.fail(format!(
                    "the value is `{existing}`, not `{expected}`; nothing deleted"
                )));
            }
        }
        Ok(())
    }
}

/// Applies `overrides` in order (see [`Override::apply`]).
///
/// # Errors
/// The first [`ConfigError::OverrideApply`].
pub fn apply_overrides(root: &mut Value, overrides: &[Override]) -> Result<(), ConfigError> {
    apply_overrides_tracked(root, &mut Origins::new(), overrides)
}

pub(crate) fn apply_overrides_tracked(
    root: &mut Value,
    origins: &mut Origins,
    overrides: &[Override],
) -> Result<(), ConfigError> {
    for (i, o) in overrides.iter().enumerate() {
        o.apply_tracked(root, origins, i)?;
    }
    Ok(())
}
