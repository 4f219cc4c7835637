//! Canonical parameter encoding: serde -> canonical JSON per RFC 8785 (JCS).
//!
//! The rules (each has its own test below):
//! - object keys sorted by their UTF-16 code units (RFC 8785 §3.2.3), whatever order serde emits
//!   them in, so a dependency turning on serde_json's `preserve_order` changes nothing;
//! - floating-point numbers in ECMAScript's shortest round-trip form (RFC 8785 §3.2.2.3, via
//!   `ryu-js`): `0.1`, `0.10` and `1e-1` are one value, `1.0` is `1`;
//!   `f32` values use their own shortest form first, so `0.1f32` encodes as `0.1`;
//! - `-0.0` is written `-0` (valid JSON, read back as `-0.0` by serde_json), not `0` as JCS
//!   would: a job can tell them apart (`1/x`, `atan2`, `copysign`), so they must not share a key.
//!   Every other value is written as JCS writes it, so no other key changed;
//! - integers are written with all their digits. For |n| <= 2^53 this is exactly JCS; beyond, JCS
//!   would round to a double and silently merge distinct seeds, so we keep the exact digits;
//! - NaN and ±infinity are refused with the parameter's path;
//! - `()`, unit structs and `None` are `null`; enums use serde's externally tagged form
//!   (`"Variant"`, `{"Variant": ...}`);
//! - map keys must be strings, chars, integers or booleans (written as strings, as serde_json does).

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::ser::{self, Impossible};

/// A parameter set that cannot be encoded canonically.
///
/// `path` is the parameter's location in the params value, like `optimizer.betas[1]`
/// (empty for the root). Retrying cannot help: the input must change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// A float that is NaN or infinite.
    #[error(
        "parameter `{path}` is {value}: parameters must be finite numbers (NaN and infinity have no canonical form)"
    )]
    NonFinite {
        /// Path of the parameter.
        path: String,
        /// `NaN`, `inf` or `-inf`.
        value: String,
    },
    /// A map key that is not a string, char, integer or bool.
    #[error(
        "parameter `{path}` has a map key of type {found}: expected string, char, integer or bool keys"
    )]
    BadMapKey {
        /// Path of the map.
        path: String,
        /// What was found.
        found: &'static str,
    },
    /// The same key twice in one object (e.g. through `#[serde(flatten)]`).
    #[error("parameter `{path}` appears twice: expected each key once per object")]
    DuplicateKey {
        /// Path of the duplicated key.
        path: String,
    },
    /// A top-level parameter name that the metric table owns.
    #[error(
        "parameter name `{name}` is reserved (the metric table has columns step, value, job_key): rename the field, e.g. with #[serde(rename = \"...\")]"
    )]
    Reserved {
        /// The reserved name.
        name: String,
    },
    /// A sequence whose element order differs between two serializations of equal values: a
    /// `HashSet` (or a map written as a list of pairs) iterates in an order its random hasher
    /// picks anew in every value, so its key would differ from process to process.
    #[error(
        "parameter `{path}` lists its elements in a different order each time it is built (a HashSet, or a HashMap written as a list, iterates in its random hasher's order), so its job key would change from process to process: use a BTreeSet or BTreeMap (or a Vec in a fixed order)"
    )]
    Unordered {
        /// Path of the sequence.
        path: String,
    },
    /// Parameters that do not come back from their canonical JSON as they went in: a job runs
    /// with the parameters its key covers, decoded from that text, so a value the text loses
    /// (a `#[serde(skip)]` field, a `Deserialize` that disagrees with `Serialize`) would run a
    /// job its key does not describe.
    #[error(
        "parameters of type {type_name} do not survive a round trip through their canonical JSON ({reason}): a run executes the parameters its key covers, decoded from that JSON; make Deserialize read back what Serialize writes (no #[serde(skip)] field)"
    )]
    NotRoundTrip {
        /// The parameters' Rust type.
        type_name: &'static str,
        /// What went wrong: the decoder's message, or the JSON that came back.
        reason: String,
    },
    /// The params type's `Serialize` impl failed.
    #[error("parameter `{path}` could not be serialized: {message}")]
    Custom {
        /// Path where it failed.
        path: String,
        /// The serializer's message.
        message: String,
    },
}

impl ParamError {
    /// Always `false`: a bad parameter stays bad.
    pub fn is_retryable(&self) -> bool {
        false
    }

    fn prefix(mut self, seg: &Seg<'_>) -> Self {
        let p = match &mut self {
            ParamError::NonFinite { path, .. }
            | ParamError::Unordered { path, .. }
            | ParamError::BadMapKey { path, .. }
            | ParamError::DuplicateKey { path, .. }
            | ParamError::Custom { path, .. } => path,
            ParamError::Reserved { .. } | ParamError::NotRoundTrip { .. } => return self,
        };
        let mut new = String::with_capacity(p.len() + 16);
        match seg {
            Seg::Key(k) => new.push_str(k),
            Seg::Index(i) => {
                let _ = write!(new, "[{i}]");
            }
        }
        if !p.is_empty() && !p.starts_with('[') {
            new.push('.');
        }
        new.push_str(p);
        *p = new;
        self
    }
}

impl ser::Error for ParamError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        ParamError::Custom {
            path: String::new(),
            message: msg.to_string(),
        }
    }
}

enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// A canonicalized value: the tree that [`CanonicalParams`] writes.
#[derive(Debug, Clone, PartialEq)]
enum Canon {
    Null,
    Bool(bool),
    /// An integer, with the kind of Rust integer that serialized it (its column type).
    Int(i128, ParamType),
    Float(f64),
    Str(String),
    Arr(Vec<Canon>),
    Obj(Vec<(Cow<'static, str>, Canon)>),
}

/// Parameters in canonical form: the RFC 8785 JSON text plus the top-level field names in the
/// order the type declares them (used for metric-table column order) and their types.
///
/// The names borrow the `'static` field names of the parameters' struct (a map's keys are
/// owned), so computing this for a million runs of one struct allocates no name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CanonicalParams {
    /// Canonical JSON text (RFC 8785).
    pub json: String,
    /// Top-level field names in declaration order; empty when the params are not an object.
    pub fields: Vec<Cow<'static, str>>,
    /// The metric-table column type of each top-level parameter (the whole value, named
    /// `params`, when it is not an object), from the Rust type that serialized it, in
    /// declaration order. A `None` (an `Option` without a value) says nothing and is left out.
    pub types: Vec<(Cow<'static, str>, ParamType)>,
    /// Where each top-level value is in `json` (byte ranges, in canonical key order), when the
    /// params are an object: a sweep keeps only the values and shares the key texts.
    pub(crate) values: Vec<std::ops::Range<usize>>,
}

/// The type of a parameter's metric-table column, taken from the Rust type that serialized it
/// (not from the values: an `f64` that happens to be whole is still [`Float`](Self::Float), a
/// `u64` above `i64::MAX` is still [`UInt`](Self::UInt)), so a column keeps its Arrow type from
/// sweep to sweep. The whole table of Rust types and Arrow types is in
/// [`MetricTable`](crate::metrics::MetricTable)'s docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ParamType {
    /// Signed integers `i8`..`i64`: Arrow `Int64`.
    Int,
    /// Unsigned integers `u8`..`u64`: Arrow `UInt64`.
    #[serde(rename = "uint")]
    UInt,
    /// `i128`, `u128`: their decimal digits in a `Utf8` column (Arrow has no 128-bit integer,
    /// and `Decimal128` holds 38 digits, not the 39 of `i128::MAX`).
    WideInt,
    /// `f32`, `f64`: Arrow `Float64`.
    Float,
    /// `bool`: Arrow `Boolean`.
    Bool,
    /// Strings, chars, unit enum variants: Arrow `Utf8`.
    String,
    /// Sequences, maps, structs, enum variants with data: canonical JSON text in a `Utf8`
    /// column.
    Json,
}

impl ParamType {
    fn of(v: &Canon) -> Option<Self> {
        Some(match v {
            Canon::Null => return None,
            Canon::Bool(_) => ParamType::Bool,
            Canon::Int(_, t) => *t,
            Canon::Float(_) => ParamType::Float,
            Canon::Str(_) => ParamType::String,
            Canon::Arr(_) | Canon::Obj(_) => ParamType::Json,
        })
    }
}

/// Encodes `value` as canonical JSON (RFC 8785), refusing NaN/infinity with the parameter's path.
///
/// # Errors
/// [`ParamError`] naming the parameter path for non-finite floats, bad map keys, duplicate keys
/// and failures of the type's own `Serialize` impl.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, ParamError> {
    Ok(canonical_params(value)?.json)
}

/// Like [`canonical_json`], also returning the top-level field names in declaration order.
///
/// # Errors
/// As [`canonical_json`].
pub fn canonical_params<T: Serialize + ?Sized>(value: &T) -> Result<CanonicalParams, ParamError> {
    let mut tree = value.serialize(CanonSer)?;
    let (fields, types) = match &tree {
        Canon::Obj(entries) => (
            entries.iter().map(|(k, _)| k.clone()).collect(),
            entries
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), ParamType::of(v)?)))
                .collect(),
        ),
        Canon::Null => (Vec::new(), Vec::new()),
        other => (
            Vec::new(),
            ParamType::of(other)
                .map(|t| (Cow::Borrowed("params"), t))
                .into_iter()
                .collect(),
        ),
    };
    sort_tree(&mut tree)?;
    let mut json = String::with_capacity(128);
    let mut values = Vec::new();
    match &tree {
        Canon::Obj(entries) => {
            values.reserve_exact(entries.len());
            write_obj(entries, &mut json, |r| values.push(r));
        }
        other => write_canon(other, &mut json),
    }
    Ok(CanonicalParams {
        json,
        fields,
        types,
        values,
    })
}

/// Sorts object keys by UTF-16 code units (RFC 8785 §3.2.3) and refuses duplicate keys.
fn sort_tree(v: &mut Canon) -> Result<(), ParamError> {
    match v {
        Canon::Arr(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                sort_tree(item).map_err(|e| e.prefix(&Seg::Index(i)))?;
            }
        }
        Canon::Obj(entries) => {
            // ASCII keys (the usual case) sort the same by bytes and by UTF-16 units.
            if entries.iter().all(|(k, _)| k.is_ascii()) {
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            } else {
                entries.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            }
            for w in entries.windows(2) {
                if w[0].0 == w[1].0 {
                    return Err(ParamError::DuplicateKey {
                        path: w[0].0.to_string(),
                    });
                }
            }
            for (k, item) in entries.iter_mut() {
                sort_tree(item).map_err(|e| e.prefix(&Seg::Key(k)))?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn write_canon(v: &Canon, out: &mut String) {
    match v {
        Canon::Null => out.push_str("null"),
        Canon::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Canon::Int(i, _) => {
            let _ = write!(out, "{i}");
        }
        Canon::Float(f) => write_f64(*f, out),
        Canon::Str(s) => write_str(s, out),
        Canon::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canon(item, out);
            }
            out.push(']');
        }
        Canon::Obj(entries) => write_obj(entries, out, |_| {}),
    }
}

/// Writes an object, telling `value_at` where each value's text is in `out`.
fn write_obj(
    entries: &[(Cow<'static, str>, Canon)],
    out: &mut String,
    mut value_at: impl FnMut(std::ops::Range<usize>),
) {
    out.push('{');
    for (i, (k, item)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(k, out);
        out.push(':');
        let start = out.len();
        write_canon(item, out);
        value_at(start..out.len());
    }
    out.push('}');
}

/// ECMAScript Number::toString (RFC 8785 §3.2.2.3); callers guarantee `f` is finite.
fn write_f64(f: f64, out: &mut String) {
    if f == 0.0 {
        // Not JCS for -0.0 (JCS writes `0`): see the module docs.
        out.push_str(if f.is_sign_negative() { "-0" } else { "0" });
        return;
    }
    let mut buf = ryu_js::Buffer::new();
    out.push_str(buf.format_finite(f));
}

/// JSON string escaping of RFC 8785 §3.2.2.2: only `"`, `\` and control characters are escaped.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: Option<&str> = match b {
            b'"' => Some("\\\""),
            b'\\' => Some("\\\\"),
            0x08 => Some("\\b"),
            0x09 => Some("\\t"),
            0x0a => Some("\\n"),
            0x0c => Some("\\f"),
            0x0d => Some("\\r"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.push_str(&s[start..i]);
        match esc {
            Some(e) => out.push_str(e),
            None => {
                let _ = write!(out, "\\u{:04x}", b);
            }
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

fn finite(f: f64) -> Result<Canon, ParamError> {
    if f.is_finite() {
        Ok(Canon::Float(f))
    } else {
        let value = if f.is_nan() {
            "NaN"
        } else if f > 0.0 {
            "inf"
        } else {
            "-inf"
        };
        Err(ParamError::NonFinite {
            path: String::new(),
            value: value.into(),
        })
    }
}

struct CanonSer;

impl ser::Serializer for CanonSer {
    type Ok = Canon;
    type Error = ParamError;
    type SerializeSeq = SeqSer;
    type SerializeTuple = SeqSer;
    type SerializeTupleStruct = SeqSer;
    type SerializeTupleVariant = VariantSer<SeqSer>;
    type SerializeMap = MapSer;
    type SerializeStruct = MapSer;
    type SerializeStructVariant = VariantSer<MapSer>;

    fn serialize_bool(self, v: bool) -> Result<Canon, ParamError> {
        Ok(Canon::Bool(v))
    }
    fn serialize_i8(self, v: i8) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::Int))
    }
    fn serialize_i16(self, v: i16) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::Int))
    }
    fn serialize_i32(self, v: i32) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::Int))
    }
    fn serialize_i64(self, v: i64) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::Int))
    }
    fn serialize_i128(self, v: i128) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v, ParamType::WideInt))
    }
    fn serialize_u8(self, v: u8) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::UInt))
    }
    fn serialize_u16(self, v: u16) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::UInt))
    }
    fn serialize_u32(self, v: u32) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::UInt))
    }
    fn serialize_u64(self, v: u64) -> Result<Canon, ParamError> {
        Ok(Canon::Int(v.into(), ParamType::UInt))
    }
    fn serialize_u128(self, v: u128) -> Result<Canon, ParamError> {
        // Beyond i128 there is no exact representation here: refuse rather than round.
        i128::try_from(v)
            .map(|v| Canon::Int(v, ParamType::WideInt))
            .map_err(|_| ParamError::Custom {
                path: String::new(),
                message: format!("integer {v} exceeds i128; expected a smaller integer"),
            })
    }
    fn serialize_f32(self, v: f32) -> Result<Canon, ParamError> {
        if !v.is_finite() || v == 0.0 {
            // (Zeros keep their sign: the shortest form of -0.0f32 is `0`.)
            return finite(v.into());
        }
        // The f32's own shortest form, read as f64: 0.1f32 -> 0.1, not 0.10000000149011612.
        let mut buf = ryu_js::Buffer::new();
        let f: f64 = buf.format_finite(v).parse().unwrap_or(f64::from(v));
        finite(f)
    }
    fn serialize_f64(self, v: f64) -> Result<Canon, ParamError> {
        finite(v)
    }
    fn serialize_char(self, v: char) -> Result<Canon, ParamError> {
        Ok(Canon::Str(v.to_string()))
    }
    fn serialize_str(self, v: &str) -> Result<Canon, ParamError> {
        Ok(Canon::Str(v.to_owned()))
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Canon, ParamError> {
        Ok(Canon::Arr(
            v.iter()
                .map(|&b| Canon::Int(b.into(), ParamType::UInt))
                .collect(),
        ))
    }
    fn serialize_none(self) -> Result<Canon, ParamError> {
        Ok(Canon::Null)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Canon, ParamError> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Canon, ParamError> {
        Ok(Canon::Null)
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Canon, ParamError> {
        Ok(Canon::Null)
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<Canon, ParamError> {
        Ok(Canon::Str(variant.to_owned()))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Canon, ParamError> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<Canon, ParamError> {
        let inner = value
            .serialize(CanonSer)
            .map_err(|e| e.prefix(&Seg::Key(variant)))?;
        Ok(Canon::Obj(vec![(Cow::Borrowed(variant), inner)]))
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<SeqSer, ParamError> {
        Ok(SeqSer(Vec::with_capacity(len.unwrap_or(0))))
    }
    fn serialize_tuple(self, len: usize) -> Result<SeqSer, ParamError> {
        Ok(SeqSer(Vec::with_capacity(len)))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<SeqSer, ParamError> {
        Ok(SeqSer(Vec::with_capacity(len)))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantSer<SeqSer>, ParamError> {
        Ok(VariantSer {
            variant,
            inner: SeqSer(Vec::with_capacity(len)),
        })
    }
    fn serialize_map(self, len: Option<usize>) -> Result<MapSer, ParamError> {
        Ok(MapSer {
            entries: Vec::with_capacity(len.unwrap_or(0)),
            next_key: None,
        })
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> Result<MapSer, ParamError> {
        Ok(MapSer {
            entries: Vec::with_capacity(len),
            next_key: None,
        })
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<VariantSer<MapSer>, ParamError> {
        Ok(VariantSer {
            variant,
            inner: MapSer {
                entries: Vec::with_capacity(len),
                next_key: None,
            },
        })
    }
}

struct SeqSer(Vec<Canon>);

impl SeqSer {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        let i = self.0.len();
        self.0.push(
            value
                .serialize(CanonSer)
                .map_err(|e| e.prefix(&Seg::Index(i)))?,
        );
        Ok(())
    }
}

impl ser::SerializeSeq for SeqSer {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        self.push(value)
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Arr(self.0))
    }
}

impl ser::SerializeTuple for SeqSer {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        self.push(value)
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Arr(self.0))
    }
}

impl ser::SerializeTupleStruct for SeqSer {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        self.push(value)
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Arr(self.0))
    }
}

struct MapSer {
    entries: Vec<(Cow<'static, str>, Canon)>,
    next_key: Option<String>,
}

impl MapSer {
    fn put<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), ParamError> {
        let v = value
            .serialize(CanonSer)
            .map_err(|e| e.prefix(&Seg::Key(&key)))?;
        self.entries.push((key, v));
        Ok(())
    }
}

impl ser::SerializeMap for MapSer {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), ParamError> {
        self.next_key = Some(key.serialize(KeySer)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        let key = self.next_key.take().ok_or_else(|| ParamError::Custom {
            path: String::new(),
            message: "map value without a key".into(),
        })?;
        self.put(Cow::Owned(key), value)
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Obj(self.entries))
    }
}

impl ser::SerializeStruct for MapSer {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ParamError> {
        self.put(Cow::Borrowed(key), value)
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Obj(self.entries))
    }
}

struct VariantSer<I> {
    variant: &'static str,
    inner: I,
}

impl ser::SerializeTupleVariant for VariantSer<SeqSer> {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), ParamError> {
        let v = self.variant;
        self.inner.push(value).map_err(|e| e.prefix(&Seg::Key(v)))
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Obj(vec![(
            Cow::Borrowed(self.variant),
            Canon::Arr(self.inner.0),
        )]))
    }
}

impl ser::SerializeStructVariant for VariantSer<MapSer> {
    type Ok = Canon;
    type Error = ParamError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), ParamError> {
        let v = self.variant;
        self.inner
            .put(Cow::Borrowed(key), value)
            .map_err(|e| e.prefix(&Seg::Key(v)))
    }
    fn end(self) -> Result<Canon, ParamError> {
        Ok(Canon::Obj(vec![(
            Cow::Borrowed(self.variant),
            Canon::Obj(self.inner.entries),
        )]))
    }
}

/// Serializes map keys: strings as is; chars, integers and bools as their text.
struct KeySer;

fn bad_key(found: &'static str) -> ParamError {
    ParamError::BadMapKey {
        path: String::new(),
        found,
    }
}

impl ser::Serializer for KeySer {
    type Ok = String;
    type Error = ParamError;
    type SerializeSeq = Impossible<String, ParamError>;
    type SerializeTuple = Impossible<String, ParamError>;
    type SerializeTupleStruct = Impossible<String, ParamError>;
    type SerializeTupleVariant = Impossible<String, ParamError>;
    type SerializeMap = Impossible<String, ParamError>;
    type SerializeStruct = Impossible<String, ParamError>;
    type SerializeStructVariant = Impossible<String, ParamError>;

    fn serialize_bool(self, v: bool) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_i8(self, v: i8) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_i16(self, v: i16) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_i32(self, v: i32) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_i64(self, v: i64) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_i128(self, v: i128) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_u8(self, v: u8) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_u16(self, v: u16) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_u32(self, v: u32) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_u64(self, v: u64) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_u128(self, v: u128) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_f32(self, _: f32) -> Result<String, ParamError> {
        Err(bad_key("float"))
    }
    fn serialize_f64(self, _: f64) -> Result<String, ParamError> {
        Err(bad_key("float"))
    }
    fn serialize_char(self, v: char) -> Result<String, ParamError> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, ParamError> {
        Ok(v.to_owned())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, ParamError> {
        Err(bad_key("bytes"))
    }
    fn serialize_none(self) -> Result<String, ParamError> {
        Err(bad_key("none"))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<String, ParamError> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, ParamError> {
        Err(bad_key("unit"))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, ParamError> {
        Err(bad_key("unit struct"))
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
    ) -> Result<String, ParamError> {
        Ok(variant.to_owned())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        v: &T,
    ) -> Result<String, ParamError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<String, ParamError> {
        Err(bad_key("enum variant with data"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, ParamError> {
        Err(bad_key("sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, ParamError> {
        Err(bad_key("tuple"))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, ParamError> {
        Err(bad_key("tuple struct"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, ParamError> {
        Err(bad_key("tuple variant"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, ParamError> {
        Err(bad_key("map"))
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, ParamError> {
        Err(bad_key("struct"))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, ParamError> {
        Err(bad_key("struct variant"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::{BTreeMap, HashMap};

    fn cj<T: Serialize + ?Sized>(v: &T) -> String {
        canonical_json(v).unwrap()
    }

    #[test]
    fn keys_are_sorted_whatever_the_declaration_order() {
        #[derive(Serialize)]
        struct P {
            zeta: u8,
            alpha: u8,
            mid: u8,
        }
        assert_eq!(
            cj(&P {
                zeta: 1,
                alpha: 2,
                mid: 3
            }),
            r#"{"alpha":2,"mid":3,"zeta":1}"#
        );
        let cp = canonical_params(&P {
            zeta: 1,
            alpha: 2,
            mid: 3,
        })
        .unwrap();
        assert_eq!(cp.fields, ["zeta", "alpha", "mid"]);
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // RFC 8785 §3.2.3 example order: "\u{20ac}" (U+20AC) sorts before "\u{1f600}" (a surrogate pair
        // 0xD83D...) in UTF-16, although its UTF-8 bytes sort after.
        let mut m = HashMap::new();
        m.insert("\u{1f600}".to_string(), 1);
        m.insert("\u{20ac}".to_string(), 2);
        m.insert("a".to_string(), 3);
        assert_eq!(cj(&m), "{\"a\":3,\"\u{20ac}\":2,\"\u{1f600}\":1}");
    }

    #[test]
    fn map_insertion_order_does_not_matter() {
        // Stands for serde_json's `preserve_order`: an order-preserving map serialized in two
        // different orders must give one encoding.
        let a: Vec<(&str, i32)> = vec![("b", 1), ("a", 2)];
        let b: Vec<(&str, i32)> = vec![("a", 2), ("b", 1)];
        struct Ordered(Vec<(&'static str, i32)>);
        impl Serialize for Ordered {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut m = s.serialize_map(Some(self.0.len()))?;
                for (k, v) in &self.0 {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
        assert_eq!(cj(&Ordered(a)), cj(&Ordered(b)));
        assert_eq!(cj(&Ordered(vec![("b", 1), ("a", 2)])), r#"{"a":2,"b":1}"#);
        // And a serde_json::Value parsed from text in either order.
        let v1: serde_json::Value = serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":3}}"#).unwrap();
        let v2: serde_json::Value = serde_json::from_str(r#"{"a":{"x":3,"y":2},"b":1}"#).unwrap();
        assert_eq!(cj(&v1), cj(&v2));
    }

    #[test]
    fn one_number_one_form() {
        for text in ["0.1", "0.10", "1e-1", "1.0E-1"] {
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(cj(&v), "0.1", "{text}");
        }
        assert_eq!(cj(&1.0f64), "1");
        assert_eq!(cj(&1u8), "1");
        assert_eq!(cj(&1e21), "1e+21");
        assert_eq!(cj(&1e-7), "1e-7");
        assert_eq!(cj(&123456789012.5), "123456789012.5");
        assert_eq!(cj(&0.1f32), "0.1");
        assert_eq!(cj(&u64::MAX), "18446744073709551615");
        assert_eq!(cj(&(i64::MIN)), "-9223372036854775808");
    }

    #[test]
    fn negative_zero_has_its_own_encoding() {
        // A job can tell -0.0 from 0.0 (`1/x`, `atan2`, `copysign`): distinct keys.
        assert_eq!(cj(&0.0f64), "0");
        assert_eq!(cj(&-0.0f64), "-0");
        assert_eq!(cj(&0.0f32), "0");
        assert_eq!(cj(&-0.0f32), "-0");
        assert_eq!(cj(&[0.0f64, -0.0]), "[0,-0]");
        // Zeros of other types are unchanged, and so is every nonzero float near zero.
        assert_eq!(cj(&0i64), "0");
        assert_eq!(cj(&-5e-324f64), "-5e-324");
        assert_eq!(cj(&-1.0f64), "-1");
        // Read back by serde_json, the sign survives (a worker gets the value it was given).
        let back: f64 = serde_json::from_str(&cj(&-0.0f64)).unwrap();
        assert!(back == 0.0 && back.is_sign_negative());
        let back: f32 = serde_json::from_str(&cj(&-0.0f32)).unwrap();
        assert!(back == 0.0 && back.is_sign_negative());
        // And re-encoding what was read back gives the same text (a stable key).
        let v: serde_json::Value = serde_json::from_str("{\"x\":-0,\"y\":0}").unwrap();
        assert_eq!(cj(&v), "{\"x\":-0,\"y\":0}");
    }

    #[test]
    fn non_finite_refused_with_path() {
        #[derive(Serialize)]
        struct Opt {
            betas: Vec<f64>,
        }
        #[derive(Serialize)]
        struct P {
            optimizer: Opt,
        }
        let e = canonical_json(&P {
            optimizer: Opt {
                betas: vec![0.9, f64::NAN],
            },
        })
        .unwrap_err();
        assert_eq!(
            e,
            ParamError::NonFinite {
                path: "optimizer.betas[1]".into(),
                value: "NaN".into()
            }
        );
        assert!(e.to_string().contains("`optimizer.betas[1]` is NaN"), "{e}");
        let e = canonical_json(&f64::INFINITY).unwrap_err();
        assert_eq!(
            e,
            ParamError::NonFinite {
                path: String::new(),
                value: "inf".into()
            }
        );
        let mut m = BTreeMap::new();
        m.insert("lr", f32::NEG_INFINITY);
        let e = canonical_json(&m).unwrap_err();
        assert_eq!(
            e,
            ParamError::NonFinite {
                path: "lr".into(),
                value: "-inf".into()
            }
        );
    }

    #[test]
    fn unit_and_none_are_null() {
        #[derive(Serialize)]
        struct U;
        #[derive(Serialize)]
        struct P {
            a: Option<u8>,
            b: (),
            c: U,
            d: Option<u8>,
        }
        assert_eq!(
            cj(&P {
                a: None,
                b: (),
                c: U,
                d: Some(4)
            }),
            r#"{"a":null,"b":null,"c":null,"d":4}"#
        );
        assert_eq!(cj(&()), "null");
    }

    #[test]
    fn nested_structs_maps_vecs() {
        #[derive(Serialize)]
        struct Inner {
            y: Vec<u8>,
            x: BTreeMap<String, bool>,
        }
        #[derive(Serialize)]
        struct P {
            name: String,
            inner: Inner,
            grid: Vec<Vec<i32>>,
            t: (u8, &'static str),
        }
        let mut x = BTreeMap::new();
        x.insert("k".to_string(), true);
        let p = P {
            name: "q\"\n\u{1}é".into(),
            inner: Inner { y: vec![3, 2], x },
            grid: vec![vec![1], vec![]],
            t: (7, "s"),
        };
        assert_eq!(
            cj(&p),
            r#"{"grid":[[1],[]],"inner":{"x":{"k":true},"y":[3,2]},"name":"q\"\n\u0001é","t":[7,"s"]}"#
        );
    }

    #[test]
    fn enums_are_externally_tagged() {
        #[derive(Serialize)]
        enum Sched {
            Constant,
            Step(u32),
            Pair(u8, u8),
            Cosine { warmup: u32, min_lr: f64 },
        }
        assert_eq!(cj(&Sched::Constant), r#""Constant""#);
        assert_eq!(cj(&Sched::Step(10)), r#"{"Step":10}"#);
        assert_eq!(cj(&Sched::Pair(1, 2)), r#"{"Pair":[1,2]}"#);
        assert_eq!(
            cj(&Sched::Cosine {
                warmup: 5,
                min_lr: 0.0
            }),
            r#"{"Cosine":{"min_lr":0,"warmup":5}}"#
        );
        let e = canonical_json(&vec![Sched::Cosine {
            warmup: 1,
            min_lr: f64::NAN,
        }])
        .unwrap_err();
        assert_eq!(
            e,
            ParamError::NonFinite {
                path: "[0].Cosine.min_lr".into(),
                value: "NaN".into()
            }
        );
    }

    #[test]
    fn map_keys_must_be_scalar() {
        let mut m = BTreeMap::new();
        m.insert(3u32, "x");
        assert_eq!(cj(&m), r#"{"3":"x"}"#);
        let mut bad = BTreeMap::new();
        bad.insert(vec![1u8], 1);
        let e = canonical_json(&bad).unwrap_err();
        assert!(
            matches!(
                e,
                ParamError::BadMapKey {
                    found: "sequence",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn duplicate_keys_are_refused() {
        #[derive(Serialize)]
        struct Inner {
            a: u8,
        }
        #[derive(Serialize)]
        struct P {
            a: u8,
            #[serde(flatten)]
            inner: Inner,
        }
        let e = canonical_json(&P {
            a: 1,
            inner: Inner { a: 2 },
        })
        .unwrap_err();
        assert_eq!(e, ParamError::DuplicateKey { path: "a".into() });
    }

    #[test]
    fn matches_serde_json_on_plain_values() {
        // RFC 8785 text is valid JSON that parses back to the same value.
        let v: serde_json::Value =
            serde_json::from_str(r#"{"b":[1,2.5,"x",null,true],"a":{"c":-3}}"#).unwrap();
        let back: serde_json::Value = serde_json::from_str(&cj(&v)).unwrap();
        assert_eq!(back, v);
    }
}
