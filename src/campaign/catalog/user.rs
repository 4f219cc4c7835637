//! User catalogs: a `stages:` list in the experiment config ([`StageCatalog::from_config`]).

use super::graph::{Enablement, MeshSource, Need, StageCatalog, StageDef};
use crate::campaign::config::Value;
use crate::campaign::execution::Strategy;
use crate::campaign::mesh::ParallelMesh;
use crate::campaign::plan_error::PlanError;
use crate::campaign::schema::{
    check_keys, expect_map, expect_str_list, expect_u32, get, invalid, join,
};

impl StageCatalog {
    /// the module docs), else [`StageCatalog::puzzle`].
    ///
    /// # Errors
    /// [`PlanError::UnknownField`] / [`PlanError::InvalidValue`] for a malformed `stages:` list.
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

const USER_STAGE_KEYS: [&str; 12] = [
    "id",
    "needs",
    "strategy",
    "instances",
    "command",
    "enabled",
    "parallel",
    "distributed",
    "aggregate",
    "resumable",
    "outputs",
    "validate",
];

fn parse_user_stage(file: &str, path: &str, node: &Value) -> Result<StageDef, PlanError> {
    let m = expect_map(file, path, node)?;
    check_keys(file, path, m, &USER_STAGE_KEYS)?;
    let id = match get(node, "id") {
        Some(Value::String(s)) => {
            check_stage_id(file, &join(path, "id"), s)?;
            s.clone()
        }
        Some(other) => return Err(invalid(file, &join(path, "id"), other, "a stage id")),
        None => {
            return Err(PlanError::MissingField {
                file: file.into(),
                path: join(path, "id"),
                expected: "the stage id".into(),
            });
        }
    };
    let mut def = StageDef::new(&id);
    let needs = match get(node, "needs") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(n) => expect_str_list(file, &join(path, "needs"), n)?,
    };
    def.needs = needs.iter().map(|p| Need::on(p)).collect();
    if let Some(v) = get(node, "strategy").filter(|v| !v.is_null()) {
        def.strategy = Strategy::from_value(file, &join(path, "strategy"), v)?;
    }
    if let Some(v) = get(node, "instances").filter(|v| !v.is_null()) {
        def.instances = expect_u32(file, &join(path, "instances"), v, 1)?;
    }
    match get(node, "command") {
        None | Some(Value::Null) => {}
        Some(Value::List(_)) => {
            def.command = expect_str_list(
                file,
                &join(path, "command"),
                get(node, "command").unwrap_or(&Value::Null),
            )?
        }
        Some(other) => {
            return Err(invalid(
                file,
                &join(path, "command"),
                other,
                "a list of arguments (argv), e.g. [python, train.py]; commands never go through a shell",
            ));
        }
    }
    match get(node, "enabled") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(true)) => def.enabled = Enablement::Always,
        Some(Value::Bool(false)) => def.enabled = Enablement::Never,
        Some(Value::String(key)) => {
            def.enabled = Enablement::Key {
                path: key.clone(),
                default: false,
            }
        }
        Some(other) => {
            return Err(invalid(
                file,
                &join(path, "enabled"),
                other,
                "true, false or the dotted key of a boolean",
            ));
        }
    }
    if let Some(v) = get(node, "parallel").filter(|v| !v.is_null()) {
        def.mesh = MeshSource::Fixed(ParallelMesh::from_mapping(
            file,
            &join(path, "parallel"),
            v,
        )?);
    }
    if let Some(n) = get(node, "outputs").filter(|v| !v.is_null()) {
        let p = join(path, "outputs");
        def.outputs = expect_str_list(file, &p, n)?;
        for (i, o) in def.outputs.iter().enumerate() {
            let rel = std::path::Path::new(o);
            let inside = !o.is_empty()
                && rel.is_relative()
                && rel
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(invalid(
                    file,
                    &format!("{p}[{i}]"),
                    &Value::String(o.clone()),
                    "a path relative to the unit's output folder, without `..`",
                ));
            }
        }
    }
    if let Some(n) = get(node, "validate").filter(|v| !v.is_null()) {
        let p = join(path, "validate");
        match n {
            Value::List(_) => def.validate = expect_str_list(file, &p, n)?,
            other => {
                return Err(invalid(
                    file,
                    &p,
                    other,
                    "a list of arguments (argv), e.g. [python, check.py]; commands never go through a shell",
                ));
            }
        }
    }
    for (key, slot) in [
        ("distributed", &mut def.distributed),
        ("aggregate", &mut def.aggregate),
        ("resumable", &mut def.resumable),
    ] {
        match get(node, key) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => *slot = *b,
            Some(other) => return Err(invalid(file, &join(path, key), other, "true or false")),
        }
    }
    Ok(def)
}

fn check_stage_id(file: &str, path: &str, id: &str) -> Result<(), PlanError> {
    if !id.is_empty()
        && id.len() <= 200
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !id.starts_with('.')
    {
        Ok(())
    } else {
        Err(PlanError::InvalidValue {
            file: file.into(),
            path: path.into(),
            value: format!("{id:?}"),
            expected: "a stage id of letters, digits, '-', '_' and '.'".into(),
        })
    }
}
