//! Refuses parameters whose serialization is not deterministic across processes (a `HashSet`
//! at any depth), so a job key never varies silently.
//!
//! Canonical JSON sorts object keys, so maps (`HashMap<String, _>` included, whatever its
//! hasher) encode the same in every process: only *sequences* can vary. A `HashSet`'s order
//! depends on its `RandomState`, and every new set gets new keys, so deserializing the
//! canonical JSON into a fresh value and serializing it again reorders a multi-element set with
//! high probability while leaving a `Vec` alone. The check does that, and names the first
//! sequence whose order changed.
//!
//! Cost: a run whose canonical JSON has no `[` cannot vary and costs one byte scan. Otherwise
//! the check runs until every multi-element sequence path of the params type (indices
//! normalized, `layers[].ids`) has been seen stable [`STABLE_TRIALS`] times, then only looks
//! up the paths (a parse of the JSON). So a sweep pays the round trips on its first run(s) only.
//!
//! Limits: it is probabilistic. A set of n elements keeps its order in one trial with
//! probability about 1/n!, so a two-element set escapes all [`STABLE_TRIALS`] trials with
//! probability 2^-20 (about one in a million); three or more elements, far less. A type whose
//! JSON does not deserialize back into itself is not checked (isolated runs would fail on it
//! anyway). A `Serialize` impl that sorts its output (e.g. `serde_with`'s set-as-sorted-vec)
//! is deterministic and passes.

use std::any::TypeId;
use std::collections::HashMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::identity::{ParamError, canonical_json};

/// Trials a sequence path must pass (with 2+ elements) before it is trusted.
pub(super) const STABLE_TRIALS: u32 = 20;

/// What an orchestrator learned about its params types.
#[derive(Default)]
pub(super) struct ParamsCheck {
    /// Per params type: normalized sequence path -> stable trials so far.
    stable: HashMap<TypeId, HashMap<String, u32>>,
    /// The params types whose first run came back whole from its canonical JSON.
    round_trips: Vec<TypeId>,
}

impl ParamsCheck {
    /// Checks, on the first run of each params type, that `json` (the canonical JSON of a `P`)
    /// decodes into a `P` that encodes to the same text: runs execute the parameters decoded
    /// from the keyed text (in this process as in a worker), so a type that loses a value on
    /// the way would run a job its key does not describe. Later runs of the type are trusted
    /// (a value-dependent failure fails that run, naming the decoder's message).
    ///
    /// # Errors
    /// [`ParamError::NotRoundTrip`] with the decoder's message or the text that came back.
    pub(super) fn round_trip<P>(&mut self, json: &str) -> Result<(), ParamError>
    where
        P: Serialize + DeserializeOwned + 'static,
    {
        let ty = TypeId::of::<P>();
        if self.round_trips.contains(&ty) {
            return Ok(());
        }
        let lost = |reason: String| ParamError::NotRoundTrip {
            type_name: std::any::type_name::<P>(),
            reason,
        };
        let back: P = serde_json::from_str(json).map_err(|e| lost(format!("{e}, in {json}")))?;
        let again = canonical_json(&back)?;
        if again != json {
            return Err(lost(format!("{json} came back as {again}")));
        }
        self.round_trips.push(ty);
        Ok(())
    }

    /// Checks that `json` (the canonical JSON of a `P`) serializes the same in every process.
    ///
    /// # Errors
    /// [`ParamError::Unordered`] naming the first sequence whose order varies.
    pub(super) fn check<P>(&mut self, json: &str) -> Result<(), ParamError>
    where
        P: Serialize + DeserializeOwned + 'static,
    {
        if !json.contains('[') {
            return Ok(());
        }
        let Ok(tree) = serde_json::from_str::<Value>(json) else {
            return Ok(());
        };
        let mut paths = Vec::new();
        multi_sequences(&tree, &mut String::new(), &mut paths);
        let known = self.stable.entry(TypeId::of::<P>()).or_default();
        let mut pending: Vec<String> = paths
            .into_iter()
            .filter(|p| known.get(p).is_none_or(|&n| n < STABLE_TRIALS))
            .collect();
        pending.sort();
        pending.dedup();
        if pending.is_empty() {
            return Ok(());
        }
        let need = pending
            .iter()
            .map(|p| STABLE_TRIALS - known.get(p).copied().unwrap_or(0))
            .max()
            .unwrap_or(0);
        for _ in 0..need {
            // A fresh value: a HashSet in it gets a new RandomState, hence a new order.
            let Ok(fresh) = serde_json::from_str::<P>(json) else {
                return Ok(()); // not round-trippable: cannot check (see the module docs)
            };
            let Ok(again) = canonical_json(&fresh) else {
                return Ok(());
            };
            if again != json {
                let Ok(other) = serde_json::from_str::<Value>(&again) else {
                    return Ok(());
                };
                return match first_reordered(&tree, &other, &mut String::new()) {
                    Some(path) => Err(ParamError::Unordered { path }),
                    None => Ok(()), // a lossy round trip (e.g. skipped fields), not an order
                };
            }
        }
        for p in pending {
            let n = known.entry(p).or_insert(0);
            *n = (*n).max(STABLE_TRIALS);
        }
        Ok(())
    }
}

/// Normalized paths (`a.b[].c`) of the sequences with 2+ elements in `v`.
fn multi_sequences(v: &Value, path: &mut String, out: &mut Vec<String>) {
    match v {
        Value::Array(items) => {
            if items.len() >= 2 {
                out.push(path.clone());
            }
            let len = path.len();
            path.push_str("[]");
            for item in items {
                multi_sequences(item, path, out);
            }
            path.truncate(len);
        }
        Value::Object(m) => {
            for (k, item) in m {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                multi_sequences(item, path, out);
                path.truncate(len);
            }
        }
        _ => {}
    }
}

/// The path (`a.b[2].c`) of the first sequence whose elements are the same in `a` and `b` but
/// in another order; `None` when the values differ otherwise.
fn first_reordered(a: &Value, b: &Value, path: &mut String) -> Option<String> {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            if x != y && is_permutation(x, y) {
                return Some(path.clone());
            }
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                if let Some(p) = first_reordered(u, v, path) {
                    return Some(p);
                }
                path.truncate(len);
            }
            None
        }
        (Value::Object(x), Value::Object(y)) => {
            for (k, u) in x {
                let Some(v) = y.get(k) else { continue };
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
                if let Some(p) = first_reordered(u, v, path) {
                    return Some(p);
                }
                path.truncate(len);
            }
            None
        }
        _ => None,
    }
}

fn is_permutation(x: &[Value], y: &[Value]) -> bool {
    let key = |v: &Value| v.to_string();
    let mut a: Vec<String> = x.iter().map(key).collect();
    let mut b: Vec<String> = y.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::{BTreeSet, HashMap, HashSet};
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};

    #[derive(Serialize, Deserialize)]
    struct Inner {
        ids: HashSet<u32>,
    }

    #[derive(Serialize, Deserialize)]
    struct Nested {
        lr: f64,
        layers: Vec<Inner>,
    }

    #[derive(Serialize, Deserialize)]
    struct Ordered {
        tags: BTreeSet<String>,
        sizes: Vec<u32>,
        by_name: HashMap<String, f64>,
        by_id: HashMap<u32, f64>,
    }

    fn canon<T: Serialize>(v: &T) -> String {
        canonical_json(v).unwrap()
    }

    #[test]
    fn a_nested_hash_set_is_refused_with_its_path() {
        let v = Nested {
            lr: 0.1,
            layers: vec![
                Inner {
                    ids: [1].into_iter().collect(),
                },
                Inner {
                    ids: (0..8).collect(),
                },
            ],
        };
        let e = ParamsCheck::default()
            .check::<Nested>(&canon(&v))
            .unwrap_err();
        assert_eq!(
            e,
            ParamError::Unordered {
                path: "layers[1].ids".into()
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("BTreeSet") && msg.contains("`layers[1].ids`"),
            "{msg}"
        );
    }

    /// A `BuildHasher` whose every new instance hashes with the next seed, flipping a
    /// two-element set's order from one set to the next: what a `RandomState` does with
    /// probability 1/2 per set, made deterministic (a test on `RandomState` fails at random).
    #[derive(Clone)]
    struct Alternating(u64);

    impl Default for Alternating {
        fn default() -> Self {
            static SEED: AtomicU64 = AtomicU64::new(0);
            Alternating(SEED.fetch_add(1, Ordering::Relaxed))
        }
    }

    impl BuildHasher for Alternating {
        type Hasher = AlternatingHasher;
        fn build_hasher(&self) -> AlternatingHasher {
            AlternatingHasher {
                flip: self.0 % 2 == 1,
                v: 0,
            }
        }
    }

    struct AlternatingHasher {
        flip: bool,
        v: u64,
    }

    impl Hasher for AlternatingHasher {
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.v = self.v.wrapping_mul(31).wrapping_add(u64::from(*b));
            }
        }
        fn finish(&self) -> u64 {
            // Every bit inverted: the two elements' buckets swap order.
            if self.flip { !self.v } else { self.v }
        }
    }

    #[derive(Serialize, Deserialize)]
    struct TwoIds {
        ids: HashSet<u32, Alternating>,
    }

    #[test]
    fn a_two_element_set_is_caught() {
        // The weakest case: a set whose order changes between some fresh values only.
        let fresh = || serde_json::from_str::<TwoIds>(r#"{"ids":[3,4]}"#).unwrap();
        let (a, b) = (canon(&fresh()), canon(&fresh()));
        assert_ne!(
            a, b,
            "the test's hasher no longer flips the order of consecutive sets (std's HashSet \
             layout changed?): this test would not test anything"
        );
        for json in [a, b] {
            let e = ParamsCheck::default().check::<TwoIds>(&json).unwrap_err();
            assert_eq!(e, ParamError::Unordered { path: "ids".into() });
            assert!(e.to_string().contains("`ids`"), "{e}");
        }
    }

    #[test]
    fn ordered_collections_and_string_or_integer_keyed_hash_maps_pass() {
        let v = Ordered {
            tags: ["b", "a", "c"].into_iter().map(String::from).collect(),
            sizes: vec![3, 1, 2],
            by_name: (0..10).map(|i| (format!("k{i}"), i as f64)).collect(),
            by_id: (0..10).map(|i| (i, i as f64)).collect(),
        };
        let mut c = ParamsCheck::default();
        for _ in 0..3 {
            c.check::<Ordered>(&canon(&v)).unwrap();
        }
        // Once proven, the paths are trusted: the map records them.
        let known = &c.stable[&TypeId::of::<Ordered>()];
        assert_eq!(known["sizes"], STABLE_TRIALS);
        assert_eq!(known["tags"], STABLE_TRIALS);
        assert_eq!(
            known.len(),
            2,
            "maps are objects, never sequences: {known:?}"
        );
    }

    #[test]
    fn sets_with_fewer_than_two_elements_cannot_vary_and_later_ones_are_still_checked() {
        let mut c = ParamsCheck::default();
        let one = Inner {
            ids: [1].into_iter().collect(),
        };
        c.check::<Inner>(&canon(&one)).unwrap();
        let many = Inner {
            ids: (0..5).collect(),
        };
        assert!(c.check::<Inner>(&canon(&many)).is_err());
    }
}
