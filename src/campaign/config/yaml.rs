//! YAML text -> [`Value`] tree with [`Origins`], on top of `saphyr-parser`'s event stream.
//!
//! Why our own composer over a parser instead of a serde YAML crate: we need the line/column of
//! every node (for errors after merging and interpolation), duplicate-key refusal with both
//! lines, YAML 1.1 `<<` merge keys (Hydra/OmegaConf configs use them), and a scalar schema we
//! control (see [`resolve_plain`]).
//!
//! Scalar schema: YAML 1.2 core (`true`/`false`, `null`/`~`/empty, decimal/`0x` integers,
//! floats including `1e-4`, `.inf`, `.nan`). Plain scalars that YAML 1.1 (PyYAML/OmegaConf,
//! which Hydra configs are written for) reads differently are refused with
//! [`ConfigError::AmbiguousScalar`]: `yes`/`no`/`on`/`off`, leading-zero numbers (`010`),
//! underscores (`1_000`), `0b`/`0o` prefixes, signed hex, sexagesimal (`1:30`), and `-.5`-style
//! floats. Quote them to get a string.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use saphyr_parser::{Event, Parser, ScalarStyle, ScanError, Span, Tag};

use super::error::ConfigError;
use super::origin::{Origin, Origins};
use super::path::KeyPath;
use super::value::{Mapping, Value};

/// Node limit for a document, aliases expanded: protects against "billion laughs" documents
/// (the largest real config is a few thousand nodes).
const MAX_NODES: usize = 250_000;

/// Nesting limit (lists and mappings): keeps recursion bounded on hostile input.
pub(crate) const MAX_DEPTH: usize = 128;

/// A parsed YAML document: its value tree, node origins, and the Hydra `# @package` header.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct YamlDocument {
    /// The value tree (an empty file is an empty mapping).
    pub value: Value,
    /// Origin of every node.
    pub origins: Origins,
    /// The `# @package <name>` directive from the file's leading comment lines, if any.
    pub package: Option<String>,
}

/// Parses YAML `text`; `file` is used in origins and error messages only.
///
/// # Errors
/// [`ConfigError::Yaml`] for syntax errors, several documents, unsupported tags, non-scalar
/// keys, bad `<<` merges and alias bombs; [`ConfigError::DuplicateKey`];
/// [`ConfigError::AmbiguousScalar`].
pub fn load_yaml_str(text: &str, file: &Path) -> Result<YamlDocument, ConfigError> {
    let file: Arc<Path> = Arc::from(file);
    let mut c = Composer {
        parser: Parser::new_from_str(text),
        file: file.clone(),
        anchors: HashMap::new(),
        origins: Origins::new(),
        nodes: 0,
    };
    let value = c.document()?;
    Ok(YamlDocument {
        value,
        origins: c.origins,
        package: package_header(text),
    })
}

/// Hydra's `# @package X` header: only comment lines before the first non-comment line count.
pub(crate) fn package_header(text: &str) -> Option<String> {
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        // The header must come before any content.
        let comment = t.strip_prefix('#')?;
        if let Some(rest) = comment.trim().strip_prefix("@package") {
            let name = rest.trim();
            if !name.is_empty() {
                return Some(name.to_string());
            }
        }
    }
    None
}

struct Anchor {
    value: Value,
    /// Where the anchored node was defined (its origins are copied for each alias).
    path: KeyPath,
    nodes: usize,
}

struct Composer<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    file: Arc<Path>,
    anchors: HashMap<usize, Anchor>,
    origins: Origins,
    nodes: usize,
}

impl<'a> Composer<'a> {
    fn origin(&self, span: &Span) -> Origin {
        Origin::File {
            file: self.file.clone(),
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }

    fn err(&self, span: &Span, message: impl Into<String>) -> ConfigError {
        ConfigError::Yaml {
            file: self.file.to_path_buf(),
            line: span.start.line(),
            column: span.start.col() + 1,
            message: message.into(),
        }
    }

    fn scan_err(&self, e: ScanError) -> ConfigError {
        ConfigError::Yaml {
            file: self.file.to_path_buf(),
            line: e.marker().line(),
            column: e.marker().col() + 1,
            message: e.info().to_string(),
        }
    }

    fn next(&mut self) -> Result<(Event<'a>, Span), ConfigError> {
        match self.parser.next_event() {
            Some(Ok(ev)) => Ok(ev),
            Some(Err(e)) => Err(self.scan_err(e)),
            None => Err(ConfigError::Yaml {
                file: self.file.to_path_buf(),
                line: 0,
                column: 0,
                message: "unexpected end of input".into(),
            }),
        }
    }

    fn document(&mut self) -> Result<Value, ConfigError> {
        let (ev, span) = self.next()?;
        if !matches!(ev, Event::StreamStart) {
            return Err(self.err(&span, "expected the start of the stream"));
        }
        let (ev, span) = self.next()?;
        let value = match ev {
            Event::StreamEnd => return Ok(Value::Mapping(Mapping::new())),
            Event::DocumentStart(_) => {
                let (ev, span) = self.next()?;
                let v = self.node(ev, span, &KeyPath::root())?;
                let (ev, span) = self.next()?;
                if !matches!(ev, Event::DocumentEnd) {
                    return Err(self.err(&span, "expected the end of the document"));
                }
                v
            }
            _ => return Err(self.err(&span, "expected a document")),
        };
        let (ev, span) = self.next()?;
        match ev {
            Event::StreamEnd => {}
            Event::DocumentStart(_) => {
                return Err(self.err(
                    &span,
                    "a config file must hold exactly one YAML document (found a second `---`)",
                ));
            }
            _ => return Err(self.err(&span, "unexpected content after the document")),
        }
        // An empty document (only comments, or `---` alone) is an empty config.
        Ok(if value.is_null() {
            Value::Mapping(Mapping::new())
        } else {
            value
        })
    }

    fn count(&mut self, n: usize, span: &Span) -> Result<(), ConfigError> {
        self.nodes += n;
        if self.nodes > MAX_NODES {
            return Err(self.err(
                span,
                format!("document expands to more than {MAX_NODES} nodes through aliases"),
            ));
        }
        Ok(())
    }

    fn node(&mut self, ev: Event<'a>, span: Span, path: &KeyPath) -> Result<Value, ConfigError> {
        if path.segments().len() > MAX_DEPTH {
            return Err(self.err(&span, format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        let start_nodes = self.nodes;
        let (value, anchor) = match ev {
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, &span)?;
                let v = self.scalar(&text, style, tag.as_deref(), &span)?;
                self.origins.insert(path.clone(), self.origin(&span));
                (v, anchor)
            }
            Event::Alias(id) => {
                let Some(a) = self.anchors.get(&id) else {
                    return Err(self.err(
                        &span,
                        "alias refers to an anchor that is not complete yet (recursive alias)",
                    ));
                };
                let nodes = a.nodes;
                // Count before cloning so an alias bomb fails fast.
                self.count(nodes, &span)?;
                let a = &self.anchors[&id];
                let (value, from) = (a.value.clone(), a.path.clone());
                let items = self.origins.subtree(&from);
                self.origins.remove_subtree(path);
                self.origins.insert_subtree(path, items);
                return Ok(value);
            }
            Event::SequenceStart(anchor, tag) => {
                self.count(1, &span)?;
                self.check_container_tag(tag.as_deref(), "seq", &span)?;
                self.origins.insert(path.clone(), self.origin(&span));
                let mut items = Vec::new();
                loop {
                    let (ev, sp) = self.next()?;
                    if matches!(ev, Event::SequenceEnd) {
                        break;
                    }
                    let child = path.child_index(items.len());
                    items.push(self.node(ev, sp, &child)?);
                }
                (Value::List(items), anchor)
            }
            Event::MappingStart(anchor, tag) => {
                self.count(1, &span)?;
                self.check_container_tag(tag.as_deref(), "map", &span)?;
                self.origins.insert(path.clone(), self.origin(&span));
                (Value::Mapping(self.mapping(path)?), anchor)
            }
            Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart(_)
            | Event::DocumentEnd
            | Event::SequenceEnd
            | Event::MappingEnd
            | Event::Nothing => return Err(self.err(&span, "expected a value")),
        };
        if anchor > 0 {
            let nodes = self.nodes - start_nodes;
            self.anchors.insert(
                anchor,
                Anchor {
                    value: value.clone(),
                    path: path.clone(),
                    nodes,
                },
            );
        }
        Ok(value)
    }

    fn mapping(&mut self, path: &KeyPath) -> Result<Mapping, ConfigError> {
        let mut explicit = Mapping::new();
        let mut key_lines: HashMap<String, usize> = HashMap::new();
        // Entries pulled in by `<<`, with the path their origins are recorded under.
        let mut merged = Mapping::new();
        let mut merged_origins = Origins::new();
        loop {
            let (kev, kspan) = self.next()?;
            let key = match kev {
                Event::MappingEnd => break,
                Event::Scalar(text, style, _, _) => {
                    if style == ScalarStyle::Plain && text == "<<" {
                        let (vev, vspan) = self.next()?;
                        let tmp = path.child_key("<<");
                        let v = self.node(vev, vspan, &tmp)?;
                        self.merge_key(v, &tmp, &vspan, &mut merged, &mut merged_origins)?;
                        self.origins.remove_subtree(&tmp);
                        continue;
                    }
                    text.into_owned()
                }
                Event::Alias(_) => {
                    return Err(self.err(&kspan, "an alias cannot be used as a mapping key"));
                }
                _ => {
                    return Err(self.err(
                        &kspan,
                        "mapping keys must be scalars (a list or mapping as a key is not supported)",
                    ));
                }
            };
            if let Some(first) = key_lines.get(&key) {
                return Err(ConfigError::DuplicateKey {
                    file: self.file.to_path_buf(),
                    key,
                    line: kspan.start.line(),
                    column: kspan.start.col() + 1,
                    first_line: *first,
                });
            }
            key_lines.insert(key.clone(), kspan.start.line());
            let (vev, vspan) = self.next()?;
            let child = path.child_key(&key);
            let v = self.node(vev, vspan, &child)?;
            explicit.insert(key, v);
        }
        if merged.is_empty() {
            return Ok(explicit);
        }
        // Merged keys first (in merge order), explicit keys override them in place.
        for k in merged.keys() {
            if !explicit.contains_key(k) {
                let items = merged_origins.subtree(&KeyPath::root().child_key(k));
                self.origins.insert_subtree(&path.child_key(k), items);
            }
        }
        let mut out = merged;
        for (k, v) in explicit {
            out.insert(k, v);
        }
        Ok(out)
    }

    /// Handles one `<<: value`: a mapping, or a list of mappings where earlier ones win.
    fn merge_key(
        &self,
        v: Value,
        tmp: &KeyPath,
        span: &Span,
        merged: &mut Mapping,
        merged_origins: &mut Origins,
    ) -> Result<(), ConfigError> {
        let sources: Vec<(Mapping, KeyPath)> = match v {
            Value::Mapping(m) => vec![(m, tmp.clone())],
            Value::List(items) => {
                let mut out = Vec::new();
                for (i, item) in items.into_iter().enumerate() {
                    match item {
                        Value::Mapping(m) => out.push((m, tmp.child_index(i))),
                        other => {
                            return Err(self.err(
                                span,
                                format!(
                                    "`<<` merge list items must be mappings, item {i} is a {}",
                                    other.kind()
                                ),
                            ));
                        }
                    }
                }
                out
            }
            other => {
                return Err(self.err(
                    span,
                    format!(
                        "`<<` merge value must be a mapping or a list of mappings, found a {}",
                        other.kind()
                    ),
                ));
            }
        };
        for (m, src_path) in sources {
            for (k, val) in m {
                if !merged.contains_key(&k) {
                    let items = self.origins.subtree(&src_path.child_key(&k));
                    merged_origins.insert_subtree(&KeyPath::root().child_key(&k), items);
                    merged.insert(k, val);
                }
            }
        }
        Ok(())
    }

    fn check_container_tag(
        &self,
        tag: Option<&Tag>,
        expected: &str,
        span: &Span,
    ) -> Result<(), ConfigError> {
        match tag {
            None => Ok(()),
            Some(t) if t.is_yaml_core_schema() && t.suffix == expected => Ok(()),
            Some(t) if t.handle == "!" && t.suffix.is_empty() => Ok(()),
            Some(t) => Err(self.err(span, format!("unsupported tag `{t}`"))),
        }
    }

    fn scalar(
        &self,
        text: &str,
        style: ScalarStyle,
        tag: Option<&Tag>,
        span: &Span,
    ) -> Result<Value, ConfigError> {
        if let Some(t) = tag {
            if t.handle == "!" && t.suffix.is_empty() {
                return Ok(Value::String(text.to_string()));
            }
            if !t.is_yaml_core_schema() {
                return Err(self.err(span, format!("unsupported tag `{t}`")));
            }
            let bad = |what: &str| self.err(span, format!("`{text}` is not a valid {what}"));
            return match t.suffix.as_str() {
                "str" => Ok(Value::String(text.to_string())),
                "null" => match core_scalar(text) {
                    Value::Null => Ok(Value::Null),
                    _ => Err(bad("null")),
                },
                "bool" => match core_scalar(text) {
                    v @ Value::Bool(_) => Ok(v),
                    _ => Err(bad("bool")),
                },
                "int" => match core_scalar(text) {
                    v @ Value::Int(_) => Ok(v),
                    _ => Err(bad("int")),
                },
                "float" => match core_scalar(text) {
                    v @ Value::Float(_) => Ok(v),
                    Value::Int(i) => Ok(Value::Float(i as f64)),
                    _ => Err(bad("float")),
                },
                _ => Err(self.err(span, format!("unsupported tag `{t}`"))),
            };
        }
        if style != ScalarStyle::Plain {
            return Ok(Value::String(text.to_string()));
        }
        resolve_plain(text).map_err(|a| ConfigError::AmbiguousScalar {
            file: self.file.to_path_buf(),
            line: span.start.line(),
            column: span.start.col() + 1,
            text: text.to_string(),
            yaml11: a.yaml11,
            yaml12: a.yaml12,
        })
    }
}

/// Why a plain scalar is refused: the two readings and what to write instead.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ambiguity {
    pub yaml11: String,
    pub yaml12: String,
}

/// Types a plain scalar by the YAML 1.2 core schema, refusing texts that YAML 1.1
/// (PyYAML/OmegaConf) reads as a different value.
pub(crate) fn resolve_plain(text: &str) -> Result<Value, Ambiguity> {
    let v12 = core_scalar(text);
    let v11 = yaml11_scalar(text);
    let same = match (&v11, &v12) {
        (Some(Value::Float(a)), Value::Float(b)) => a == b || (a.is_nan() && b.is_nan()),
        (Some(a), b) => a == b,
        (None, Value::String(_)) => true,
        (None, _) => false,
    };
    if same {
        return Ok(v12);
    }
    let describe = |v: &Value| match v {
        Value::String(_) => "a string".to_string(),
        other => format!("{} {other}", other.kind()),
    };
    let yaml11 = v11
        .as_ref()
        .map(describe)
        .unwrap_or_else(|| "a string".to_string());
    let yaml12 = describe(&v12);
    Err(Ambiguity { yaml11, yaml12 })
}

/// Whether a plain scalar with this text would not load as the same string (used to decide when
/// a rendered string needs quotes).
pub(crate) fn plain_scalar_is_not_string(text: &str) -> bool {
    !matches!(resolve_plain(text), Ok(Value::String(_)))
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn split_sign(s: &str) -> (i64, &str) {
    if let Some(r) = s.strip_prefix('-') {
        (-1, r)
    } else if let Some(r) = s.strip_prefix('+') {
        (1, r)
    } else {
        (1, s)
    }
}

/// The YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
pub(crate) fn core_scalar(text: &str) -> Value {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        ".nan" | ".NaN" | ".NAN" => return Value::Float(f64::NAN),
        _ => {}
    }
    let (sign, body) = split_sign(text);
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return Value::Float(sign as f64 * f64::INFINITY);
    }
    if is_digits(body) {
        // `[-+]?[0-9]+`; out-of-range integers stay strings rather than losing precision.
        return text
            .parse::<i64>()
            .map(Value::Int)
            .unwrap_or_else(|_| Value::String(text.to_string()));
    }
    if sign == 1 && !text.starts_with('+') {
        if let Some(h) = body.strip_prefix("0x")
            && !h.is_empty()
            && h.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return i64::from_str_radix(h, 16)
                .map(Value::Int)
                .unwrap_or_else(|_| Value::String(text.to_string()));
        }
        if let Some(o) = body.strip_prefix("0o")
            && !o.is_empty()
            && o.bytes().all(|b| (b'0'..=b'7').contains(&b))
        {
            return i64::from_str_radix(o, 8)
                .map(Value::Int)
                .unwrap_or_else(|_| Value::String(text.to_string()));
        }
    }
    if is_core_float(body)
        && let Ok(x) = text.parse::<f64>()
    {
        return Value::Float(x);
    }
    Value::String(text.to_string())
}

/// `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?` (sign already stripped).
fn is_core_float(body: &str) -> bool {
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mant_ok = match mant.split_once('.') {
        Some(("", frac)) => is_digits(frac),
        Some((int, frac)) => is_digits(int) && (frac.is_empty() || is_digits(frac)),
        None => is_digits(mant),
    };
    let exp_ok = match exp {
        None => true,
        Some(e) => is_digits(split_sign(e).1),
    };
    mant_ok && exp_ok
}

/// How OmegaConf's YAML loader (PyYAML SafeLoader, YAML 1.1, with OmegaConf's extended float
/// pattern and without timestamps) types a plain scalar. `None` means "a string".
/// Only used to detect disagreements with [`core_scalar`].
fn yaml11_scalar(text: &str) -> Option<Value> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Some(Value::Null),
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Some(Value::Bool(true));
        }
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Some(Value::Bool(false));
        }
        ".nan" | ".NaN" | ".NAN" => return Some(Value::Float(f64::NAN)),
        _ => {}
    }
    let (sign, body) = split_sign(text);
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return Some(Value::Float(sign as f64 * f64::INFINITY));
    }
    let digits_us = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    // Floats are tried before ints by PyYAML.
    if let Some(x) = yaml11_float(text, sign, body) {
        return Some(x);
    }
    let strip = |s: &str| s.replace('_', "");
    let sexagesimal = |s: &str| -> Option<i64> {
        let mut parts = s.split(':');
        let first = parts.next()?;
        if !digits_us(first) || first.starts_with('0') || first.starts_with('_') {
            return None;
        }
        let mut acc: i64 = strip(first).parse().ok()?;
        let mut any = false;
        for p in parts {
            any = true;
            if p.is_empty() || p.len() > 2 || !is_digits(p) || p.parse::<u32>().ok()? > 59 {
                return None;
            }
            acc = acc.checked_mul(60)?.checked_add(p.parse().ok()?)?;
        }
        any.then_some(acc)
    };
    let int = if let Some(b) = body.strip_prefix("0b") {
        (!b.is_empty() && b.bytes().all(|c| c == b'0' || c == b'1' || c == b'_'))
            .then(|| i64::from_str_radix(&strip(b), 2).ok())
            .flatten()
    } else if let Some(h) = body.strip_prefix("0x") {
        (!h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit() || c == b'_'))
            .then(|| i64::from_str_radix(&strip(h), 16).ok())
            .flatten()
    } else if body.len() > 1
        && body.starts_with('0')
        && body[1..]
            .bytes()
            .all(|c| (b'0'..=b'7').contains(&c) || c == b'_')
    {
        i64::from_str_radix(&strip(&body[1..]), 8).ok()
    } else if body == "0" || (digits_us(body) && !body.starts_with('0') && !body.starts_with('_')) {
        strip(body).parse::<i64>().ok()
    } else if body.contains(':') {
        sexagesimal(body)
    } else {
        None
    };
    int.map(|i| Value::Int(sign * i))
}

fn yaml11_float(text: &str, sign: i64, body: &str) -> Option<Value> {
    let digits_us = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    let exp_ok = |e: &str, need_sign: bool| {
        let (has_sign, rest) = match e.as_bytes().first() {
            Some(b'-') | Some(b'+') => (true, &e[1..]),
            _ => (false, e),
        };
        is_digits(rest) && (has_sign || !need_sign)
    };
    let parse = |s: &str| -> Option<Value> {
        s.replace('_', "")
            .parse::<f64>()
            .ok()
            .map(|x| Value::Float(x * sign as f64))
    };
    let (mant, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    // [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+]?[0-9]+)?  and  [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    let first_digit = mant.as_bytes().first().is_some_and(|b| b.is_ascii_digit());
    if first_digit {
        let ok = match mant.split_once('.') {
            Some((int, frac)) => {
                digits_us(int) && (frac.is_empty() || digits_us(frac)) && !int.contains(':')
            }
            None => digits_us(mant) && exp.is_some(),
        };
        if ok && exp.is_none_or(|e| exp_ok(e, false)) {
            return parse(body);
        }
        // Sexagesimal float: [-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*
        if exp.is_none() && body.contains(':') && body.contains('.') {
            let (hms, frac) = body.rsplit_once('.')?;
            if frac.is_empty() || digits_us(frac) {
                let mut parts = hms.split(':');
                let first = parts.next()?;
                if digits_us(first) && parts.all(|p| !p.is_empty() && p.len() <= 2 && is_digits(p))
                {
                    // Value irrelevant: 1.2 reads a string, so it is refused either way.
                    return Some(Value::Float(f64::NAN));
                }
            }
        }
        return None;
    }
    // \.[0-9_]+([eE][-+][0-9]+)?  (no sign allowed before the dot in PyYAML's pattern)
    if text.starts_with('.') {
        let frac = &mant[1..];
        if digits_us(frac) && exp.is_none_or(|e| exp_ok(e, true)) {
            return parse(body);
        }
    }
    None
}
