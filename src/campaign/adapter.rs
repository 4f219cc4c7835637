//! Adapter from the YAML loader ([`super::config`]) to the planner's [`Node`] tree.

use std::path::Path;

use super::config::{ConfigLoader, Override, Value, load_yaml_file};
use super::plan_error::PlanError;
use super::tree::Node;

/// Converts a loaded config value into a [`Node`], keeping mapping order.
pub(crate) fn node_from_value(v: &Value) -> Node {
    match v {
        Value::Null => Node::Null,
        Value::Bool(b) => Node::Bool(*b),
        Value::Int(i) => Node::Int(*i),
        Value::Float(f) => Node::Float(*f),
        Value::String(s) => Node::Str(s.clone()),
        Value::List(items) => Node::Seq(items.iter().map(node_from_value).collect()),
        Value::Mapping(m) => Node::Map(
            m.iter()
                .map(|(k, v)| (k.clone(), node_from_value(v)))
                .collect(),
        ),
    }
}

impl From<&Value> for Node {
    /// The planner's view of a loaded config value (mapping order kept).
    fn from(v: &Value) -> Node {
        node_from_value(v)
    }
}

/// Loads, composes, overrides and resolves an experiment config.
pub(crate) fn load_experiment(
    loader: &ConfigLoader,
    path: &Path,
    overrides: &[Override],
) -> Result<Node, PlanError> {
    let cfg = loader.load_experiment(path, overrides)?;
    Ok(node_from_value(cfg.value()))
}

/// Loads a plain YAML file (runner / execution config).
pub(crate) fn load_plain(path: &Path) -> Result<Node, PlanError> {
    let cfg = load_yaml_file(path)?;
    Ok(node_from_value(cfg.value()))
}
