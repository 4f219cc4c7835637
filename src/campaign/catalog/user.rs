//! User catalogs: a `stages:` list in the experiment config ([`StageCatalog::from_config`]).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::graph::{Enablement, MeshSource, Need, StageCatalog, StageDef};
use crate::campaign::config::Value;
use crate::campaign::execution::Strategy;
use crate::campaign::mesh::{ParallelMesh, ParallelMeshOverride, RawMesh};
use crate::campaign::plan_error::PlanError;
use crate::campaign::schema::{Argv, AtLeast, get, invalid, join, key_path, read};

impl StageCatalog {
    #[doc = include_str!("stages.md")]
    pub fn from_config(file: &str, config: &Value) -> Result<Self, PlanError> {
        match get(config, "stages") {
            None | Some(Value::Null) => Ok(Self::puzzle()),
            Some(Value::List(items)) => {
                let mut stages = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    stages.push(parse_user_stage(file, &format!("stages[{i}]"), item)?);
                }
                Ok(StageCatalog::new("config", stages))
            }
            Some(other) => Err(invalid(
                file,
                "stages",
                other,
                "a list of stages ({id, needs, strategy, command})",
            )),
        }
    }
}

fn parse_user_stage(file: &str, path: &str, node: &Value) -> Result<StageDef, PlanError> {
    let raw: RawUserStage = read(file, key_path(path), node)?;
    let Some(StageId(id)) = raw.id else {
        return Err(PlanError::MissingField {
            file: file.into(),
            path: join(path, "id"),
            expected: "the stage id".into(),
        });
    };
    let mut def = StageDef::new(&id);
    def.needs = raw
        .needs
        .map(|n| n.0)
        .unwrap_or_default()
        .iter()
        .map(|p| Need::on(p))
        .collect();
    if let Some(s) = raw.strategy {
        def.strategy = s;
    }
    if let Some(AtLeast(n)) = raw.instances {
        def.instances = n;
    }
    if let Some(Argv(c)) = raw.command {
        def.worker.command = c;
    }
    match raw.enabled {
        None => {}
        Some(RawEnabled::Bool(true)) => def.enabled = Enablement::Always,
        Some(RawEnabled::Bool(false)) => def.enabled = Enablement::Never,
        Some(RawEnabled::Key(key)) => {
            def.enabled = Enablement::Key {
                path: key,
                default: false,
            }
        }
    }
    if let Some(m) = raw.parallel {
        let mesh = ParallelMeshOverride::from(m).apply(ParallelMesh::SINGLE);
        mesh.validate(&join(path, "parallel"))?;
        def.mesh = MeshSource::Fixed(mesh);
    }
    if let Some(Outputs(o)) = raw.outputs {
        def.worker.outputs = o;
    }
    if let Some(Argv(v)) = raw.validate {
        def.worker.validate = v;
    }
    for (value, slot) in [
        (raw.distributed, &mut def.distributed),
        (raw.aggregate, &mut def.aggregate),
        (raw.resumable, &mut def.worker.resumable),
    ] {
        if let Some(b) = value {
            *slot = b;
        }
    }
    Ok(def)
}

/// A user stage as written in a `stages:` list. Every key is optional here (an explicit `null`
/// is the same as an absent key); `id` is required by [`parse_user_stage`].
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a stage mapping {id, needs, strategy, command, ...}"
)]
struct RawUserStage {
    id: Option<StageId>,
    needs: Option<Needs>,
    strategy: Option<Strategy>,
    instances: Option<AtLeast<1>>,
    command: Option<Argv>,
    enabled: Option<RawEnabled>,
    parallel: Option<RawMesh>,
    distributed: Option<bool>,
    aggregate: Option<bool>,
    resumable: Option<bool>,
    outputs: Option<Outputs>,
    validate: Option<Argv>,
}

/// Whether a stage id is valid: 1 to 200 letters, digits, `-`, `_` and `.`, not starting
/// with `.`.
fn is_stage_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !id.starts_with('.')
}

/// A checked stage id ([`is_stage_id`]).
struct StageId(String);

impl<'de> Deserialize<'de> for StageId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = StageId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stage id of letters, digits, '-', '_' and '.'")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<StageId, E> {
                if is_stage_id(s) {
                    Ok(StageId(s.to_string()))
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(s), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `needs`: one stage id or a list of them.
struct Needs(Vec<String>);

impl<'de> Deserialize<'de> for Needs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Needs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a stage id or a list of stage ids")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Needs, E> {
                Ok(Needs(vec![s.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Needs, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(Needs(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `enabled`: `true`, `false` or the dotted key of a boolean in the experiment.
enum RawEnabled {
    Bool(bool),
    Key(String),
}

impl<'de> Deserialize<'de> for RawEnabled {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawEnabled;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or the dotted key of a boolean")
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<RawEnabled, E> {
                Ok(RawEnabled::Bool(b))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawEnabled, E> {
                Ok(RawEnabled::Key(s.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One declared output: a path relative to the unit's output folder, without `..`.
struct OutputPath(String);

impl<'de> Deserialize<'de> for OutputPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = OutputPath;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a path relative to the unit's output folder, without `..`")
            }
            fn visit_str<E: de::Error>(self, o: &str) -> Result<OutputPath, E> {
                let rel = std::path::Path::new(o);
                let inside = !o.is_empty()
                    && rel.is_relative()
                    && rel
                        .components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)));
                if inside {
                    Ok(OutputPath(o.to_string()))
                } else {
                    Err(E::invalid_value(de::Unexpected::Str(o), &self))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `outputs`: a list of [`OutputPath`]s.
struct Outputs(Vec<String>);

impl<'de> Deserialize<'de> for Outputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Outputs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of paths relative to the unit's output folder")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Outputs, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(OutputPath(o)) = seq.next_element()? {
                    out.push(o);
                }
                Ok(Outputs(out))
            }
        }
        d.deserialize_any(V)
    }
}
