//! The config value tree: YAML's data model with ordered mappings.

use std::fmt;

use indexmap::IndexMap;

use super::path::{KeyPath, PathSegment};

/// An ordered mapping from string keys to values; iteration follows the order keys were first
/// written (YAML file order, then merge order).
pub type Mapping = IndexMap<String, Value>;

/// One node of a config tree, after YAML loading (and, in a [`Config`](super::Config), after
/// composition, overrides and interpolation).
///
/// Scalars follow the YAML 1.2 core schema (see [`load_yaml_str`](super::load_yaml_str)).
/// Mapping keys are strings: a scalar key such as `1:` or `true:` is kept as written (`"1"`,
/// `"true"`). Floats may be `inf`/`NaN` (`.inf`, `.nan` in YAML).
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum Value {
    /// YAML `null`, `~` or an empty value.
    #[default]
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A signed 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A string (quoted, or a plain scalar that is not null/bool/number).
    String(String),
    /// A sequence.
    List(Vec<Value>),
    /// An ordered mapping.
    Mapping(Mapping),
}

impl Value {
    /// A short name of the value's kind for error messages: `null`, `bool`, `int`, `float`,
    /// `string`, `list`, `mapping`.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::String(_) => "string",
            Value::List(_) => "list",
            Value::Mapping(_) => "mapping",
        }
    }

    /// Whether the value is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The string, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is an integer.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The number as `f64`, if this is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The boolean, if this is a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The mapping, if this is a mapping.
    pub fn as_mapping(&self) -> Option<&Mapping> {
        match self {
            Value::Mapping(m) => Some(m),
            _ => None,
        }
    }

    /// The mapping, mutably, if this is a mapping.
    pub fn as_mapping_mut(&mut self) -> Option<&mut Mapping> {
        match self {
            Value::Mapping(m) => Some(m),
            _ => None,
        }
    }

    /// The list, if this is a list.
    pub fn as_list(&self) -> Option<&[Value]> {
        match self {
            Value::List(l) => Some(l),
            _ => None,
        }
    }

    /// Looks up a dotted path (`"mip.runs"`, `"tokenize_data.caches.0.output"`,
    /// `"tokenize_data.caches[0].output"`). Returns `None` if the path is malformed or any step
    /// is missing. The empty string returns `self`.
    pub fn get(&self, dotted: &str) -> Option<&Value> {
        self.get_path(&KeyPath::parse(dotted)?)
    }

    /// Looks up a [`KeyPath`] (use this for keys that contain dots).
    pub fn get_path(&self, path: &KeyPath) -> Option<&Value> {
        let mut cur = self;
        for seg in path.segments() {
            cur = cur.child(seg)?;
        }
        Some(cur)
    }

    /// Mutable lookup of a [`KeyPath`].
    pub fn get_path_mut(&mut self, path: &KeyPath) -> Option<&mut Value> {
        let mut cur = self;
        for seg in path.segments() {
            cur = cur.child_mut(seg)?;
        }
        Some(cur)
    }

    /// One step down: a mapping key or a list index.
    pub fn child(&self, seg: &PathSegment) -> Option<&Value> {
        match self {
            Value::Mapping(m) => m.get(seg.as_key().as_ref()),
            Value::List(l) => l.get(seg.as_index()?),
            _ => None,
        }
    }

    /// One step down, mutably.
    pub fn child_mut(&mut self, seg: &PathSegment) -> Option<&mut Value> {
        match self {
            Value::Mapping(m) => m.get_mut(seg.as_key().as_ref()),
            Value::List(l) => l.get_mut(seg.as_index()?),
            _ => None,
        }
    }

    /// Converts a `serde_json::Value`, for configs built in code and tests. Object keys come
    /// out in `serde_json`'s order (sorted); integers beyond `i64` become floats.
    pub fn from_json(value: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match value {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Value::String(s.clone()),
            J::Array(items) => Value::List(items.iter().map(Value::from_json).collect()),
            J::Object(map) => Value::Mapping(
                map.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Visits every node depth-first (parents before children, mapping order), with its path.
    pub fn walk<'a>(&'a self, f: &mut dyn FnMut(&KeyPath, &'a Value)) {
        fn go<'a>(v: &'a Value, path: &mut KeyPath, f: &mut dyn FnMut(&KeyPath, &'a Value)) {
            f(path, v);
            match v {
                Value::Mapping(m) => {
                    for (k, c) in m {
                        path.0.push(PathSegment::Key(k.clone()));
                        go(c, path, f);
                        path.0.pop();
                    }
                }
                Value::List(l) => {
                    for (i, c) in l.iter().enumerate() {
                        path.0.push(PathSegment::Index(i));
                        go(c, path, f);
                        path.0.pop();
                    }
                }
                _ => {}
            }
        }
        go(self, &mut KeyPath::root(), f)
    }
}

/// Flow-style YAML-like rendering (`{a: 1, b: [x, y]}`), used in error messages and when a
/// scalar is inserted into a string by interpolation: `null`, `true`, `1`, `0.5`, strings
/// unquoted at the top level and quoted inside containers only when needed.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn inner(v: &Value, f: &mut fmt::Formatter<'_>, nested: bool) -> fmt::Result {
            match v {
                Value::Null => f.write_str("null"),
                Value::Bool(b) => write!(f, "{b}"),
                Value::Int(i) => write!(f, "{i}"),
                Value::Float(x) => fmt_float(*x, f),
                Value::String(s) => {
                    if nested && needs_quotes(s) {
                        write!(f, "{s:?}")
                    } else {
                        f.write_str(s)
                    }
                }
                Value::List(l) => {
                    f.write_str("[")?;
                    for (i, c) in l.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        inner(c, f, true)?;
                    }
                    f.write_str("]")
                }
                Value::Mapping(m) => {
                    f.write_str("{")?;
                    for (i, (k, c)) in m.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        if needs_quotes(k) {
                            write!(f, "{k:?}: ")?;
                        } else {
                            write!(f, "{k}: ")?;
                        }
                        inner(c, f, true)?;
                    }
                    f.write_str("}")
                }
            }
        }
        inner(self, f, false)
    }
}

fn needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s.contains([',', '[', ']', '{', '}', ':', '#', '"', '\'', '\n'])
        || s.starts_with(' ')
        || s.ends_with(' ')
        || super::yaml::plain_scalar_is_not_string(s)
}

/// Floats print as Python's `repr` does, so strings built by interpolation match what the
/// Python reference builds: `1.0`, `0.0003`, `1e-05`, `1e+16`, and `.inf` / `.nan` (YAML).
fn fmt_float(x: f64, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    if x.is_nan() {
        return f.write_str(".nan");
    }
    if x.is_infinite() {
        return f.write_str(if x > 0.0 { ".inf" } else { "-.inf" });
    }
    f.write_str(&python_float_repr(x))
}

/// Python's `repr(float)`: shortest round-trip digits; scientific when the decimal exponent is
/// below -4 or at least 16.
pub(crate) fn python_float_repr(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0.0".into()
        } else {
            "0.0".into()
        };
    }
    let sci = format!("{x:e}"); // e.g. "1.5e-5", "-3e16"
    let (mant, exp) = sci.split_once('e').expect("`{:e}` always has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    if (-4..16).contains(&exp) {
        let plain = format!("{x}");
        if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Value::Float(x)
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(s)
    }
}
impl From<Vec<Value>> for Value {
    fn from(l: Vec<Value>) -> Self {
        Value::List(l)
    }
}
impl From<Mapping> for Value {
    fn from(m: Mapping) -> Self {
        Value::Mapping(m)
    }
}

impl serde::Serialize for Value {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(x) => s.serialize_f64(*x),
            Value::String(v) => s.serialize_str(v),
            Value::List(l) => {
                let mut seq = s.serialize_seq(Some(l.len()))?;
                for v in l {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Mapping(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> serde::Deserialize<'de> for Value {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any config value")
            }
            fn visit_unit<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_none<E>(self) -> Result<Value, E> {
                Ok(Value::Null)
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
                serde::Deserialize::deserialize(d)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
                Ok(Value::Bool(b))
            }
            fn visit_i64<E>(self, i: i64) -> Result<Value, E> {
                Ok(Value::Int(i))
            }
            fn visit_u64<E: serde::de::Error>(self, u: u64) -> Result<Value, E> {
                i64::try_from(u)
                    .map(Value::Int)
                    .map_err(|_| E::custom(format!("integer {u} does not fit in i64")))
            }
            fn visit_f64<E>(self, x: f64) -> Result<Value, E> {
                Ok(Value::Float(x))
            }
            fn visit_str<E>(self, s: &str) -> Result<Value, E> {
                Ok(Value::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Value, E> {
                Ok(Value::String(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                let mut l = Vec::new();
                while let Some(v) = a.next_element()? {
                    l.push(v);
                }
                Ok(Value::List(l))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Value, A::Error> {
                let mut m = Mapping::new();
                while let Some((k, v)) = a.next_entry::<String, Value>()? {
                    m.insert(k, v);
                }
                Ok(Value::Mapping(m))
            }
        }
        d.deserialize_any(V)
    }
}
