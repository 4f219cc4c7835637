//! Typed conversion: a serde `Deserializer` over `&Value` that remembers the key path, so a
//! type error says *where* (`execution.stages.convert.instances: invalid type: string "x",
//! expected u32`), and an unknown field suggests the closest valid name.

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, Visitor};

use super::path::KeyPath;
use super::value::Value;

/// A deserialization error with the key path where it happened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeError {
    pub path: Option<KeyPath>,
    /// serde's full message (`invalid type: string "x", expected u32`).
    pub message: String,
    /// What went wrong, structured, for the planner's typed errors.
    pub kind: DeErrorKind,
    /// A short rendering of the value at `path` (set with the path), for error messages.
    pub value: Option<String>,
}

/// The structured reason of a [`DeError`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeErrorKind {
    /// A key that a `deny_unknown_fields` struct does not have (the error's path ends with it).
    UnknownField {
        /// The keys valid there.
        valid: &'static [&'static str],
        /// The closest valid key, if close enough.
        suggestion: Option<&'static str>,
    },
    /// A required key is absent under the error's path.
    MissingField {
        /// The key.
        field: &'static str,
    },
    /// A value of the wrong type or out of range (also an unknown enum variant).
    Invalid {
        /// What would have been accepted.
        expected: String,
    },
    /// Any other message (`message`).
    Custom,
}

impl DeError {
    fn new(message: String, kind: DeErrorKind) -> Self {
        DeError {
            path: None,
            message,
            kind,
            value: None,
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{p}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError::new(msg.to_string(), DeErrorKind::Custom)
    }

    fn invalid_type(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        DeError::new(
            format!("invalid type: {unexp}, expected {exp}"),
            DeErrorKind::Invalid {
                expected: exp.to_string(),
            },
        )
    }

    fn invalid_value(unexp: de::Unexpected<'_>, exp: &dyn de::Expected) -> Self {
        DeError::new(
            format!("invalid value: {unexp}, expected {exp}"),
            DeErrorKind::Invalid {
                expected: exp.to_string(),
            },
        )
    }

    fn invalid_length(len: usize, exp: &dyn de::Expected) -> Self {
        DeError::new(
            format!("invalid length {len}, expected {exp}"),
            DeErrorKind::Invalid {
                expected: exp.to_string(),
            },
        )
    }

    fn missing_field(field: &'static str) -> Self {
        DeError::new(
            format!("missing field `{field}`"),
            DeErrorKind::MissingField { field },
        )
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        let mut message = if expected.is_empty() {
            format!("unknown field `{field}`, there are no fields")
        } else {
            format!(
                "unknown field `{field}`, expected one of {}",
                expected
                    .iter()
                    .map(|e| format!("`{e}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let suggestion = did_you_mean(field, expected);
        if let Some(s) = suggestion {
            message.push_str(&format!(" (did you mean `{s}`?)"));
        }
        DeError::new(
            message,
            DeErrorKind::UnknownField {
                valid: expected,
                suggestion,
            },
        )
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> Self {
        let mut message = format!(
            "unknown variant `{variant}`, expected one of {}",
            expected
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut wanted = format!("one of {}", expected.join(", "));
        if let Some(s) = did_you_mean(variant, expected) {
            message.push_str(&format!(" (did you mean `{s}`?)"));
            wanted.push_str(&format!(" (did you mean `{s}`?)"));
        }
        DeError::new(message, DeErrorKind::Invalid { expected: wanted })
    }
}

/// The closest candidate by edit distance, if it is close enough to be a likely typo: a
/// distance of at most a third of the longer word (at least 2), `word` being a candidate plus a
/// `_suffix` (`tp_size` -> `tp`), or a prefix of one (`instan` -> `instances`). Case is ignored.
pub(super) fn did_you_mean<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    did_you_mean_in(word, candidates.iter().copied())
}

/// [`did_you_mean`] over any iterator of candidates: the crate's one implementation.
pub(crate) fn did_you_mean_in<'a, I>(word: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
{
    let word_lower = word.to_ascii_lowercase();
    let mut best: Option<(usize, &'a str)> = None;
    for cand in candidates {
        let cand_lower = cand.to_ascii_lowercase();
        let d = levenshtein(&word_lower, &cand_lower);
        let limit = (word.chars().count().max(cand.chars().count()) / 3).max(2);
        // A suffix or prefix match ranks after every close spelling.
        let score = if d <= limit {
            d
        } else if word_lower.starts_with(&format!("{cand_lower}_"))
            || word_lower.starts_with(&format!("{cand_lower}-"))
            || (word.len() >= 2 && cand_lower.starts_with(&word_lower))
        {
            limit + 1
        } else {
            continue;
        };
        if best.is_none_or(|(s, _)| score < s) {
            best = Some((score, cand));
        }
    }
    best.map(|(_, c)| c)
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Sets the error's path (and the rendering of the value there) if no inner node set it.
fn at<T>(r: Result<T, DeError>, path: &KeyPath, value: &Value) -> Result<T, DeError> {
    r.map_err(|mut e| {
        if e.path.is_none() {
            e.path = Some(path.clone());
            e.value = Some(crate::campaign::schema::describe(value));
        }
        e
    })
}

/// Converts `value`, found at `path` of its tree, to `T` without copying it; error paths are
/// full paths from the root.
pub(crate) fn deserialize_at<T: de::DeserializeOwned>(
    value: &Value,
    path: KeyPath,
) -> Result<T, DeError> {
    T::deserialize(ValueDe { value, path })
}

/// Deserializer over one node.
pub(crate) struct ValueDe<'a> {
    pub value: &'a Value,
    pub path: KeyPath,
}

impl<'de> de::Deserializer<'de> for ValueDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let path = self.path.clone();
        let r = match self.value {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Int(i) => visitor.visit_i64(*i),
            Value::Float(x) => visitor.visit_f64(*x),
            Value::String(s) => visitor.visit_str(s),
            Value::List(l) => visitor.visit_seq(SeqDe {
                iter: l.iter().enumerate(),
                path: self.path,
            }),
            Value::Mapping(m) => visitor.visit_map(MapDe {
                iter: m.iter(),
                pending: None,
                path: self.path,
            }),
        };
        at(r, &path, self.value)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let path = self.path.clone();
        match self.value {
            Value::Null => at(visitor.visit_none(), &path, self.value),
            _ => {
                let value = self.value;
                at(visitor.visit_some(self), &path, value)
            }
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let path = self.path.clone();
        let value = self.value;
        at(visitor.visit_newtype_struct(self), &path, value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let path = self.path.clone();
        let r = match self.value {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            Value::Mapping(m) if m.len() == 1 => {
                let (k, v) = m.iter().next().expect("one entry");
                visitor.visit_enum(EnumDe {
                    variant: k,
                    value: v,
                    path: self.path.child_key(k),
                })
            }
            other => Err(de::Error::invalid_type(
                unexpected(other),
                &format!("one of {}", variants.join(", ")).as_str(),
            )),
        };
        at(r, &path, self.value)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

fn unexpected(v: &Value) -> de::Unexpected<'_> {
    match v {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Int(i) => de::Unexpected::Signed(*i),
        Value::Float(x) => de::Unexpected::Float(*x),
        Value::String(s) => de::Unexpected::Str(s),
        Value::List(_) => de::Unexpected::Seq,
        Value::Mapping(_) => de::Unexpected::Map,
    }
}

struct SeqDe<'a> {
    iter: std::iter::Enumerate<std::slice::Iter<'a, Value>>,
    path: KeyPath,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.iter.next() {
            None => Ok(None),
            Some((i, v)) => {
                let path = self.path.child_index(i);
                seed.deserialize(ValueDe { value: v, path }).map(Some)
            }
        }
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct MapDe<'a> {
    iter: indexmap::map::Iter<'a, String, Value>,
    pending: Option<(&'a String, &'a Value)>,
    path: KeyPath,
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.iter.next() {
            None => Ok(None),
            Some((k, v)) => {
                self.pending = Some((k, v));
                let path = self.path.child_key(k);
                let kd: de::value::StrDeserializer<'_, DeError> = k.as_str().into_deserializer();
                at(seed.deserialize(kd), &path, v).map(Some)
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let (k, v) = self
            .pending
            .take()
            .ok_or_else(|| <DeError as de::Error>::custom("value requested before key"))?;
        seed.deserialize(ValueDe {
            value: v,
            path: self.path.child_key(k),
        })
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct EnumDe<'a> {
    variant: &'a str,
    value: &'a Value,
    path: KeyPath,
}

impl<'de, 'a> de::EnumAccess<'de> for EnumDe<'a> {
    type Error = DeError;
    type Variant = ValueDe<'a>;
    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, ValueDe<'a>), DeError> {
        let kd: de::value::StrDeserializer<'_, DeError> = self.variant.into_deserializer();
        let v = seed.deserialize(kd)?;
        Ok((
            v,
            ValueDe {
                value: self.value,
                path: self.path,
            },
        ))
    }
}

impl<'de> de::VariantAccess<'de> for ValueDe<'_> {
    type Error = DeError;
    fn unit_variant(self) -> Result<(), DeError> {
        match self.value {
            Value::Null => Ok(()),
            other => Err(de::Error::invalid_type(
                unexpected(other),
                &"a unit variant",
            )),
        }
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_map(self, visitor)
    }
}
