//! [`Reasons`]: why a run gets its action, stored without a heap allocation in the common
//! cases (a plan of a million runs holds a million of them).

use std::fmt;
use std::ops::Index;

/// Why a run gets its [`Action`](super::Action): one or more short texts (`no record`,
/// `up to date, attempt 1`, `code changed: src/lib.rs`, ...), shown joined by `"; "`.
///
/// Reads like a `[String]`: [`len`](Self::len), indexing (`reasons[0]` is a `str`),
/// [`iter`](Self::iter), [`join`](Self::join), and comparison with an array or slice of
/// strings (`reasons == ["no record"]`). Serialized as a list of strings.
///
/// The texts every plan repeats (`no record`, `up to date, attempt 1`, `forced`, `code
/// changed`) are static; any other single text costs one allocation of its length.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Reasons(Repr);

#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Static(&'static str),
    One(Box<str>),
    Many(Box<[String]>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Many(Box::default())
    }
}

/// The texts a plan repeats for many runs.
const COMMON: [&str; 5] = [
    "no record",
    "up to date, attempt 1",
    "forced",
    "code changed",
    "up to date",
];

impl Reasons {
    /// One reason.
    pub fn one(text: impl Into<String>) -> Self {
        let text = text.into();
        match COMMON.iter().find(|c| **c == text) {
            Some(c) => Reasons(Repr::Static(c)),
            None => Reasons(Repr::One(text.into_boxed_str())),
        }
    }

    /// `up to date, attempt {attempt}`: a skip's reason.
    pub(super) fn up_to_date(attempt: u32) -> Self {
        if attempt == 1 {
            Reasons(Repr::Static(COMMON[1]))
        } else {
            Reasons(Repr::One(
                format!("up to date, attempt {attempt}").into_boxed_str(),
            ))
        }
    }

    /// How many texts.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Static(_) | Repr::One(_) => 1,
            Repr::Many(v) => v.len(),
        }
    }

    /// No text at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The texts, in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        let (single, many): (Option<&str>, &[String]) = match &self.0 {
            Repr::Static(s) => (Some(s), &[]),
            Repr::One(s) => (Some(s), &[]),
            Repr::Many(v) => (None, v),
        };
        single.into_iter().chain(many.iter().map(String::as_str))
    }

    /// The texts joined by `sep` (`"; "` is how a plan shows them).
    pub fn join(&self, sep: &str) -> String {
        match &self.0 {
            Repr::Static(s) => (*s).to_string(),
            Repr::One(s) => s.to_string(),
            Repr::Many(v) => v.join(sep),
        }
    }

    /// The texts as owned strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

impl From<Vec<String>> for Reasons {
    fn from(mut v: Vec<String>) -> Self {
        if v.len() == 1 {
            return Reasons::one(v.pop().unwrap_or_default());
        }
        Reasons(Repr::Many(v.into_boxed_slice()))
    }
}

impl From<String> for Reasons {
    fn from(text: String) -> Self {
        Reasons::one(text)
    }
}

impl Index<usize> for Reasons {
    type Output = str;

    /// The `i`th text.
    ///
    /// # Panics
    /// When `i >= len()`, as a slice does.
    fn index(&self, i: usize) -> &str {
        match &self.0 {
            Repr::Static(s) if i == 0 => s,
            Repr::One(s) if i == 0 => s,
            Repr::Many(v) => &v[i],
            _ => panic!("reason {i} of 1"),
        }
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for Reasons {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for Reasons {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for Reasons {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The texts joined by `"; "`.
impl fmt::Display for Reasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(r)?;
        }
        Ok(())
    }
}

impl serde::Serialize for Reasons {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Reasons {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d).map(Reasons::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_like_a_list_of_strings_in_every_representation() {
        let cases: [(Reasons, &[&str]); 5] = [
            (Reasons::one("no record"), &["no record"]),
            (Reasons::up_to_date(1), &["up to date, attempt 1"]),
            (Reasons::up_to_date(7), &["up to date, attempt 7"]),
            (
                Reasons::one("last attempt failed: boom"),
                &["last attempt failed: boom"],
            ),
            (
                Reasons::from(vec!["a".to_string(), "b".to_string()]),
                &["a", "b"],
            ),
        ];
        for (r, want) in cases {
            assert_eq!(r, *want);
            assert_eq!(r.len(), want.len());
            assert_eq!(r[0], *want[0]);
            assert_eq!(r.join("; "), want.join("; "));
            assert_eq!(r.to_string(), want.join("; "));
            assert_eq!(format!("{r:?}"), format!("{want:?}"));
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, serde_json::to_string(want).unwrap());
            let back: Reasons = serde_json::from_str(&json).unwrap();
            assert_eq!(back, r);
        }
        assert!(Reasons::default().is_empty());
        assert_eq!(Reasons::default().join("; "), "");
    }

    #[test]
    fn common_texts_are_static() {
        assert!(matches!(Reasons::one("no record").0, Repr::Static(_)));
        assert!(matches!(Reasons::up_to_date(1).0, Repr::Static(_)));
        assert!(matches!(
            Reasons::from("forced".to_string()).0,
            Repr::Static(_)
        ));
        assert!(matches!(Reasons::up_to_date(2).0, Repr::One(_)));
    }

    #[test]
    #[should_panic(expected = "reason 1 of 1")]
    fn index_past_the_end_panics_as_a_slice_does() {
        let _ = &Reasons::one("x")[1];
    }
}
