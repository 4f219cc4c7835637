//! The metric-table column type of each top-level parameter, read from the parameters' Rust
//! type through its `Deserialize` impl: a deserializer that answers every request with a
//! placeholder value and notes what was asked (`deserialize_u64` is a `u64`, `deserialize_option`
//! an `Option` whose inner request follows). That is the one place where the type is known
//! whatever the values: `None` serializes as `null` whatever `T` is, so the serializer cannot
//! type an `Option` that is `None` in every run, nor say whether an enum has data variants when
//! the runs only use its unit variants.
//!
//! An enum is asked once per variant (the whole value is deserialized again, each pass picking
//! the next variant), so an enum field is text when all its variants are units and JSON when one
//! has data. A type whose `Deserialize` asks `deserialize_any` (`serde_json::Value`, untagged or
//! internally tagged enums, `flatten`), or refuses the placeholders, cannot be traced: `None`,
//! and the orchestrator types those parameters from the serializer's calls alone.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};

use crate::identity::ParamType;

/// Most passes over an enum's variants; an enum with more variants than this whose first ones
/// are units is taken as having data (JSON text: what every value can be written as).
const MAX_PASSES: usize = 64;

/// A top-level parameter's traced type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Traced {
    /// A scalar, sequence, map or struct (through `Option`s and newtypes).
    Type(ParamType),
    /// An enum (through `Option`s and newtypes), and whether a variant has data.
    Enum {
        /// A variant has data: the column is JSON text, unit variants included.
        data: bool,
    },
}

impl Traced {
    /// The column type.
    pub(super) fn column(self) -> ParamType {
        match self {
            Traced::Type(t) => t,
            Traced::Enum { data: true } => ParamType::Json,
            Traced::Enum { data: false } => ParamType::String,
        }
    }
}

/// The traced type of each top-level parameter of `P` (a parameter that is not a struct is one
/// named `params`); `None` when `P` cannot be traced (see the module docs). Parameters of a
/// type with no column (`()`, unit structs: always `null`) are left out.
pub(super) fn trace<P: DeserializeOwned>() -> Option<BTreeMap<String, Traced>> {
    let mut out: BTreeMap<String, Traced> = BTreeMap::new();
    let mut round = 0;
    loop {
        let mut pass = Pass {
            round,
            ..Pass::default()
        };
        P::deserialize(Root(&mut pass)).ok()?;
        for (name, t) in pass.fields {
            let Some(t) = t else { continue };
            let merged = match (out.get(&name), t) {
                (Some(Traced::Enum { data: a }), Traced::Enum { data: b }) => {
                    Traced::Enum { data: *a || b }
                }
                _ => t,
            };
            out.insert(name, merged);
        }
        round += 1;
        if round >= pass.max_variants.min(MAX_PASSES) {
            if pass.max_variants > MAX_PASSES {
                for t in out.values_mut() {
                    if let Traced::Enum { data } = t {
                        *data = true;
                    }
                }
            }
            return Some(out);
        }
    }
}

/// Why a type cannot be traced (any error ends the trace; the message is not shown).
#[derive(Debug)]
struct Untraceable(String);

impl fmt::Display for Untraceable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Untraceable {}

impl de::Error for Untraceable {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Untraceable(msg.to_string())
    }
}

type Result<T> = std::result::Result<T, Untraceable>;

/// What one pass over the type saw.
#[derive(Default)]
struct Pass {
    /// Each enum takes variant `round % its variant count` in this pass.
    round: usize,
    /// The most variants of an enum seen (how many passes are needed).
    max_variants: usize,
    /// Top-level parameters in order, with what was traced of each.
    fields: Vec<(String, Option<Traced>)>,
}

/// The top-level value: a struct's fields are the parameters; anything else is one parameter
/// named `params`.
struct Root<'p>(&'p mut Pass);

macro_rules! root_as_leaf {
    ($($m:ident $(($($a:ident: $t:ty),*))?),* $(,)?) => {$(
        fn $m<V: Visitor<'de>>(self, $($($a: $t,)*)? visitor: V) -> Result<V::Value> {
            let pass = self.0;
            pass.fields.push(("params".into(), None));
            let slot = Some(pass.fields.len() - 1);
            Leaf { pass, slot }.$m($($($a,)*)? visitor)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Root<'_> {
    type Error = Untraceable;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_map(Fields {
            pass: self.0,
            names: fields,
            next: 0,
            top: true,
        })
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        // Serialized as its inner value: a newtype of a struct has the struct's parameters.
        visitor.visit_newtype_struct(self)
    }

    root_as_leaf!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_unit_struct(name: &'static str),
        deserialize_seq,
        deserialize_tuple(len: usize),
        deserialize_tuple_struct(name: &'static str, len: usize),
        deserialize_map,
        deserialize_enum(name: &'static str, variants: &'static [&'static str]),
        deserialize_identifier,
        deserialize_ignored_any,
    );
}

/// One value: records its type in `pass.fields[slot]`, if any (a value inside a sequence, map
/// or struct parameter records nothing: that parameter is JSON text). Placeholders are 1, 1.0,
/// `"x"`, `'x'`: nonzero, so `NonZero*` and most validating `TryFrom`s accept them.
struct Leaf<'p> {
    pass: &'p mut Pass,
    slot: Option<usize>,
}

impl Leaf<'_> {
    fn set(&mut self, t: Traced) {
        if let Some(i) = self.slot {
            self.pass.fields[i].1 = Some(t);
        }
    }

    fn set_type(&mut self, t: ParamType) {
        self.set(Traced::Type(t));
    }

    fn quiet(&mut self) -> Leaf<'_> {
        Leaf {
            pass: self.pass,
            slot: None,
        }
    }
}

macro_rules! scalar {
    ($($m:ident => $t:ident, $visit:ident($v:expr)),* $(,)?) => {$(
        fn $m<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value> {
            self.set_type(ParamType::$t);
            visitor.$visit($v)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for Leaf<'_> {
    type Error = Untraceable;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Untraceable(
            "deserialize_any: the type is known only from its data".into(),
        ))
    }

    scalar!(
        deserialize_bool => Bool, visit_bool(true),
        deserialize_i8 => Int, visit_i8(1),
        deserialize_i16 => Int, visit_i16(1),
        deserialize_i32 => Int, visit_i32(1),
        deserialize_i64 => Int, visit_i64(1),
        deserialize_i128 => WideInt, visit_i128(1),
        deserialize_u8 => UInt, visit_u8(1),
        deserialize_u16 => UInt, visit_u16(1),
        deserialize_u32 => UInt, visit_u32(1),
        deserialize_u64 => UInt, visit_u64(1),
        deserialize_u128 => WideInt, visit_u128(1),
        deserialize_f32 => Float, visit_f32(1.0),
        deserialize_f64 => Float, visit_f64(1.0),
        deserialize_char => String, visit_char('x'),
        deserialize_str => String, visit_str("x"),
        deserialize_string => String, visit_string("x".to_string()),
        deserialize_bytes => Json, visit_bytes(&[]),
        deserialize_byte_buf => Json, visit_byte_buf(Vec::new()),
    );

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        // Some(T): what T asks for is the column's type.
        visitor.visit_some(self)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value> {
        self.set_type(ParamType::Json);
        visitor.visit_seq(Elements {
            leaf: self.quiet(),
            left: 0,
        })
    }

    fn deserialize_tuple<V: Visitor<'de>>(mut self, len: usize, visitor: V) -> Result<V::Value> {
        self.set_type(ParamType::Json);
        visitor.visit_seq(Elements {
            leaf: self.quiet(),
            left: len,
        })
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value> {
        self.set_type(ParamType::Json);
        visitor.visit_map(Fields {
            pass: self.pass,
            names: &[],
            next: 0,
            top: false,
        })
    }

    fn deserialize_struct<V: Visitor<'de>>(
        mut self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.set_type(ParamType::Json);
        visitor.visit_map(Fields {
            pass: self.pass,
            names: fields,
            next: 0,
            top: false,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        if variants.is_empty() {
            return Err(Untraceable("an enum without variants has no value".into()));
        }
        self.pass.max_variants = self.pass.max_variants.max(variants.len());
        let pick = variants[self.pass.round % variants.len()];
        visitor.visit_enum(Variant { leaf: self, pick })
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value> {
        Err(Untraceable("an identifier outside a struct or enum".into()))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_unit()
    }
}

/// `left` placeholder elements (none for a sequence: an empty `Vec` is a `Vec`; a tuple or array
/// needs all of its).
struct Elements<'p> {
    leaf: Leaf<'p>,
    left: usize,
}

impl<'de> SeqAccess<'de> for Elements<'_> {
    type Error = Untraceable;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(self.leaf.quiet()).map(Some)
    }
}

/// The fields of a struct (`names`), each with a placeholder value; at the top level each is
/// a parameter, recorded in `pass.fields`.
struct Fields<'p> {
    pass: &'p mut Pass,
    names: &'static [&'static str],
    next: usize,
    top: bool,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Untraceable;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let Some(name) = self.names.get(self.next) else {
            return Ok(None);
        };
        if self.top {
            self.pass.fields.push(((*name).to_string(), None));
        }
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        self.next += 1;
        let slot = self.top.then(|| self.pass.fields.len() - 1);
        seed.deserialize(Leaf {
            pass: self.pass,
            slot,
        })
    }
}

/// The variant an enum takes in this pass.
struct Variant<'p> {
    leaf: Leaf<'p>,
    pick: &'static str,
}

impl<'de, 'p> EnumAccess<'de> for Variant<'p> {
    type Error = Untraceable;
    type Variant = Leaf<'p>;

    fn variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<(T::Value, Leaf<'p>)> {
        let v = seed.deserialize(self.pick.into_deserializer())?;
        Ok((v, self.leaf))
    }
}

impl<'de> VariantAccess<'de> for Leaf<'_> {
    type Error = Untraceable;

    fn unit_variant(mut self) -> Result<()> {
        self.set(Traced::Enum { data: false });
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(mut self, seed: T) -> Result<T::Value> {
        self.set(Traced::Enum { data: true });
        seed.deserialize(self.quiet())
    }

    fn tuple_variant<V: Visitor<'de>>(mut self, len: usize, visitor: V) -> Result<V::Value> {
        self.set(Traced::Enum { data: true });
        visitor.visit_seq(Elements {
            leaf: self.quiet(),
            left: len,
        })
    }

    fn struct_variant<V: Visitor<'de>>(
        mut self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.set(Traced::Enum { data: true });
        visitor.visit_map(Fields {
            pass: self.pass,
            names: fields,
            next: 0,
            top: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    #[allow(dead_code)]
    #[derive(Deserialize)]
    enum Units {
        A,
        B,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    enum Mixed {
        Plain,
        Scaled(f64),
        Pair { a: u8, b: String },
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Wrap(u16);

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Inner {
        x: Option<u8>,
        e: Mixed,
    }

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Params {
        seed: u64,
        delta: i32,
        wide: i128,
        lr: f32,
        on: bool,
        name: String,
        c: char,
        maybe_seed: Option<u64>,
        maybe_lr: Option<Option<f64>>,
        units: Units,
        maybe_units: Option<Units>,
        mixed: Mixed,
        wrap: Wrap,
        list: Vec<u32>,
        set: BTreeSet<String>,
        map: HashMap<String, f64>,
        tuple: (u8, String),
        array: [f64; 3],
        inner: Inner,
        nonzero: std::num::NonZeroU32,
        unit: (),
        #[serde(rename = "renamed")]
        original: usize,
        #[serde(default)]
        defaulted: u8,
    }

    #[test]
    fn every_field_takes_the_type_its_rust_type_says() {
        let t = trace::<Params>().expect("traceable");
        let col = |n: &str| t.get(n).map(|t| t.column());
        use ParamType::*;
        for (name, want) in [
            ("seed", UInt),
            ("delta", Int),
            ("wide", WideInt),
            ("lr", Float),
            ("on", Bool),
            ("name", String),
            ("c", String),
            ("maybe_seed", UInt),
            ("maybe_lr", Float),
            ("units", String),
            ("maybe_units", String),
            ("mixed", Json),
            ("wrap", UInt),
            ("list", Json),
            ("set", Json),
            ("map", Json),
            ("tuple", Json),
            ("array", Json),
            ("inner", Json),
            ("nonzero", UInt),
            ("renamed", UInt),
            ("defaulted", UInt),
        ] {
            assert_eq!(col(name), Some(want), "{name}");
        }
        assert_eq!(col("unit"), None, "() is always null: no column type");
        assert_eq!(
            col("original"),
            None,
            "the field is named as serde names it"
        );
    }

    #[test]
    fn a_parameter_that_is_not_a_struct_is_named_params() {
        assert_eq!(
            trace::<Option<u32>>().unwrap()["params"].column(),
            ParamType::UInt
        );
        assert_eq!(
            trace::<Vec<i8>>().unwrap()["params"].column(),
            ParamType::Json
        );
        // A newtype of a struct has the struct's parameters.
        #[allow(dead_code)]
        #[derive(Deserialize)]
        struct Outer(Inner);
        let t = trace::<Outer>().unwrap();
        assert_eq!(t["x"].column(), ParamType::UInt);
        assert_eq!(t["e"].column(), ParamType::Json);
    }

    #[test]
    fn types_known_only_from_their_data_are_not_traced() {
        #[allow(dead_code)]
        #[derive(Deserialize)]
        struct WithValue {
            a: u8,
            v: serde_json::Value,
        }
        assert_eq!(trace::<WithValue>(), None);
        #[allow(dead_code)]
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            N(f64),
            S(String),
        }
        #[allow(dead_code)]
        #[derive(Deserialize)]
        struct WithUntagged {
            e: Either,
        }
        assert_eq!(trace::<WithUntagged>(), None);
        // A map at the top level: its keys are data, not parameters the type names.
        assert_eq!(
            trace::<BTreeMap<String, u8>>().unwrap()["params"].column(),
            ParamType::Json
        );
    }
}
