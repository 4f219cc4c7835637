//! [`PendingRun`]: a run in a sweep's queue, its key computed when it was enqueued.
//!
//! A sweep may hold a million runs, so a run stores only what is its own: its key, its lineage
//! and its parameters' values. What the runs of one job and one parameter shape share (the job
//! name, the column names and types, the owned code, the entry point and the parameter names'
//! canonical text) is one [`RunShape`] they point to. The canonical JSON text is rebuilt from
//! the values and the shared names when it is read; it is byte for byte the text the key was
//! computed from (`params_text_round_trips` in the tests).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::entry::Entry;
#[cfg(test)]
use super::job::JobResult;
use crate::identity::{Hash, OwnedDigest, ParamType, Witnesses};
use crate::store::{BASE_FORMAT, JobRecord, Owner, Status};
use crate::sys::unix_now;

/// Separates the values of a run's stored parameters: canonical JSON escapes every control
/// character inside strings (RFC 8785 §3.2.2.2), so this byte never occurs in a value's text.
const SEP: char = '\u{1}';

/// A run in the queue: its key is computed when it is enqueued.
///
/// A handle: cloning it shares one allocation (a sweep holds each run in its enqueued list and,
/// until drained, in its queue and its plan; a run of ten parameters costs about 250 bytes, see
/// the `hot_paths` bench). Reached through `Deref`: [`RunSpec`]'s fields and methods
/// (`run.key`, `run.params()`).
#[derive(Clone)]
pub struct PendingRun(Arc<RunSpec>);

impl PendingRun {
    pub(super) fn new(spec: RunSpec) -> Self {
        Self(Arc::new(spec))
    }

    /// A run of a job `t` with no parameters whose key is `key` (unit tests of the queue).
    #[cfg(test)]
    pub(super) fn for_test(key: Hash) -> Self {
        fn t(_: &(), _: &mut super::run::Run) -> JobResult {
            Ok(())
        }
        let shape = RunShape::new(
            "t".into(),
            Arc::new([]),
            Arc::default(),
            Arc::new(OwnedDigest::default()),
            Entry::of::<()>(t),
        );
        Self::new(RunSpec::new(key, key, "null", &[], &Arc::new(shape)))
    }
}

impl std::ops::Deref for PendingRun {
    type Target = RunSpec;

    fn deref(&self) -> &RunSpec {
        &self.0
    }
}

/// Two handles are equal when they are the same run: the key covers the job, its parameters
/// and its code.
impl PartialEq for PendingRun {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for PendingRun {}

/// What the runs of one job and one parameter shape share.
pub(super) struct RunShape {
    job: Arc<str>,
    param_order: Arc<[String]>,
    param_types: Arc<BTreeMap<String, ParamType>>,
    owned: Arc<OwnedDigest>,
    entry: Entry,
    /// The canonical `"name":` text of each top-level parameter, in canonical order, once the
    /// first run of the shape set them; runs whose params are not an object keep their text.
    keys: std::sync::OnceLock<Box<[Box<str>]>>,
}

impl RunShape {
    pub(super) fn new(
        job: Arc<str>,
        param_order: Arc<[String]>,
        param_types: Arc<BTreeMap<String, ParamType>>,
        owned: Arc<OwnedDigest>,
        entry: Entry,
    ) -> Self {
        RunShape {
            job,
            param_order,
            param_types,
            owned,
            entry,
            keys: std::sync::OnceLock::new(),
        }
    }

    /// The same shape for a run that keeps its whole text.
    fn unkeyed(&self) -> Self {
        RunShape::new(
            self.job.clone(),
            self.param_order.clone(),
            self.param_types.clone(),
            self.owned.clone(),
            self.entry,
        )
    }
}

/// What a [`PendingRun`] is: its key, what the key covers and how to execute it.
#[non_exhaustive]
pub struct RunSpec {
    /// The job key.
    pub key: Hash,
    /// Job name + parameters, without code.
    pub lineage: Hash,
    /// The parameters: the values only (separated by [`SEP`]) when the shape has the names
    /// (`shape.keys`), else the whole canonical text.
    params: Box<str>,
    shape: Arc<RunShape>,
}

impl RunSpec {
    /// The spec of a run of `shape` whose canonical parameters are `json`, with `values` the
    /// byte ranges of its top-level values (empty when the params are not an object). The
    /// values alone are stored when the key texts between them are the shape's (always, for
    /// runs of one struct type; a map whose keys vary keeps its whole text).
    pub(super) fn new(
        key: Hash,
        lineage: Hash,
        json: &str,
        values: &[Range<usize>],
        shape: &Arc<RunShape>,
    ) -> Self {
        let compact = !values.is_empty() && {
            let keys = shape.keys.get_or_init(|| key_texts(json, values));
            same_keys(json, values, keys)
        };
        // A run whose names are not its shape's (never for a struct: the names are its
        // fields') keeps its text under a shape without names.
        let shape = if compact || (values.is_empty() && shape.keys.get().is_none()) {
            shape.clone()
        } else {
            Arc::new(shape.unkeyed())
        };
        let params = if compact {
            let mut v = String::with_capacity(values.iter().map(|r| r.len() + 1).sum());
            for (i, r) in values.iter().enumerate() {
                if i > 0 {
                    v.push(SEP);
                }
                v.push_str(&json[r.clone()]);
            }
            v.into_boxed_str()
        } else {
            json.into()
        };
        RunSpec {
            key,
            lineage,
            params,
            shape,
        }
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.shape.job
    }

    /// The parameters as canonical JSON (RFC 8785): the text the key covers, byte for byte.
    /// Borrowed when the run keeps its whole text, else rebuilt from the values and the
    /// shape's names (one allocation).
    pub fn params(&self) -> Cow<'_, str> {
        let Some(keys) = self.shape.keys.get() else {
            return Cow::Borrowed(&self.params);
        };
        let mut out = String::with_capacity(
            self.params.len() + keys.iter().map(|k| k.len() + 1).sum::<usize>() + 2,
        );
        out.push('{');
        for (i, (k, v)) in keys.iter().zip(self.params.split(SEP)).enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(k);
            out.push_str(v);
        }
        out.push('}');
        Cow::Owned(out)
    }

    /// Top-level parameter names in declaration order.
    pub fn param_order(&self) -> &[String] {
        &self.shape.param_order
    }

    /// The metric-table column type of each top-level parameter, from its Rust type.
    pub fn param_types(&self) -> &BTreeMap<String, ParamType> {
        &self.shape.param_types
    }

    /// The owned code the key covers.
    pub fn owned(&self) -> &OwnedDigest {
        &self.shape.owned
    }

    /// The owned code, shared by the runs of the job.
    pub(super) fn owned_shared(&self) -> &Arc<OwnedDigest> {
        &self.shape.owned
    }

    /// The job function and its parameter decoder: a run executes the parameters decoded from
    /// [`params`](Self::params), the text its key covers, in this process as in a worker
    /// (`sweep::worker`).
    pub(super) fn entry(&self) -> Entry {
        self.shape.entry
    }

    /// The parameters as a JSON value, parsed from their canonical text (`Null` if it is not
    /// JSON, which canonical text always is).
    pub(super) fn params_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.params()).unwrap_or(serde_json::Value::Null)
    }

    /// The record of attempt `attempt` of this run, started now by `owner` in the environment
    /// `witnesses`: the one place a running record is built, in this process (`execute`) or in
    /// a worker's parent for a worker that died (`worker`). The parameters are the canonical
    /// text computed at enqueue, parsed here once per attempt.
    pub(super) fn running_record(
        &self,
        witnesses: &Witnesses,
        owner: &Owner,
        attempt: u32,
    ) -> JobRecord {
        JobRecord {
            format: BASE_FORMAT,
            key: self.key,
            job: self.job().to_string(),
            params: self.params_value(),
            param_order: self.param_order().to_vec(),
            param_types: self.param_types().clone(),
            lineage: self.lineage,
            owned: self.owned().clone(),
            witnesses: witnesses.clone(),
            status: Status::Running,
            attempt,
            owner: Some(owner.clone()),
            started_at: unix_now(),
            finished_at: None,
            error: None,
            metrics: None,
        }
    }
}

/// The text before each value of `json`: `"name":` (the `{` or `,` before it left out).
fn key_texts(json: &str, values: &[Range<usize>]) -> Box<[Box<str>]> {
    let mut prev = 0;
    values
        .iter()
        .map(|r| {
            let k: Box<str> = json[prev + 1..r.start].into();
            prev = r.end;
            k
        })
        .collect()
}

/// Whether the texts before the values of `json` are `keys`.
fn same_keys(json: &str, values: &[Range<usize>], keys: &[Box<str>]) -> bool {
    let mut prev = 0;
    values.len() == keys.len()
        && values.iter().zip(keys).all(|(r, k)| {
            let same = json.get(prev + 1..r.start) == Some(&**k);
            prev = r.end;
            same
        })
}

impl std::fmt::Debug for PendingRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingRun")
            .field("key", &self.key)
            .field("job", &self.job())
            .field("params", &self.params())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::canonical_params;

    fn shape() -> Arc<RunShape> {
        fn t(_: &(), _: &mut super::super::run::Run) -> JobResult {
            Ok(())
        }
        Arc::new(RunShape::new(
            "t".into(),
            Arc::new([]),
            Arc::default(),
            Arc::new(OwnedDigest::default()),
            Entry::of::<()>(t),
        ))
    }

    fn spec(json: &str, values: &[Range<usize>], shape: &Arc<RunShape>) -> RunSpec {
        RunSpec::new(Hash::of(b"k"), Hash::of(b"l"), json, values, shape)
    }

    #[test]
    fn params_text_round_trips() {
        #[derive(serde::Serialize)]
        struct P {
            lr: f64,
            name: String,
            tags: Vec<String>,
            nested: std::collections::BTreeMap<String, Option<u8>>,
        }
        let sh = shape();
        // Values with commas, quotes, colons, escapes and control characters, and nesting.
        let values = [
            P {
                lr: 0.001,
                name: "a,b:\"c\"\u{1}\n".into(),
                tags: vec!["x".into(), "y,z".into()],
                nested: [("k".to_string(), Some(1)), ("n".into(), None)].into(),
            },
            P {
                lr: -2.5e-300,
                name: String::new(),
                tags: vec![],
                nested: Default::default(),
            },
        ];
        for p in &values {
            let c = canonical_params(p).unwrap();
            let s = spec(&c.json, &c.values, &sh);
            assert!(s.shape.keys.get().is_some(), "{}", c.json);
            assert_eq!(s.params(), c.json);
            assert!(s.params.len() < c.json.len() / 2 + 20);
        }
    }

    #[test]
    fn params_that_are_not_an_object_or_have_other_keys_keep_their_text() {
        let sh = shape();
        for v in [
            serde_json::json!(7),
            serde_json::json!([1, 2]),
            serde_json::json!(null),
            serde_json::json!({}),
        ] {
            let c = canonical_params(&v).unwrap();
            let s = spec(&c.json, &c.values, &sh);
            assert!(s.shape.keys.get().is_none());
            assert_eq!(s.params(), c.json);
        }
        // A map: the first run sets the shape's names; a run with other keys keeps its text.
        let a = canonical_params(&serde_json::json!({"a": 1, "b": 2})).unwrap();
        let b = canonical_params(&serde_json::json!({"a": 1, "c": 2})).unwrap();
        let c = canonical_params(&serde_json::json!({"a": 1})).unwrap();
        let (sa, sb, sc) = (
            spec(&a.json, &a.values, &sh),
            spec(&b.json, &b.values, &sh),
            spec(&c.json, &c.values, &sh),
        );
        let named = |s: &RunSpec| s.shape.keys.get().is_some();
        assert!(named(&sa) && !named(&sb) && !named(&sc));
        assert_eq!(
            (sa.params(), sb.params(), sc.params()),
            (a.json.into(), b.json.into(), c.json.into())
        );
    }
}
