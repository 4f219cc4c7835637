//! The stage catalog: a campaign's stage graph as data.
//!
//! A [`StageCatalog`] lists [`StageDef`]s (id, parents, whether and when it is enabled, default
//! strategy, where its mesh comes from, its command). [`StageCatalog::resolve`] reads an
//! experiment config and returns the enabled stages in a deterministic topological order, with
//! parents *contracted* through disabled stages (a disabled `tokenize_data` makes its children
//! depend on `convert`).
//!
//! Three ways to get a catalog:
//! - [`StageCatalog::puzzle`]: Puzzletron's pipeline (convert -> ... -> mip -> evaluation),
//!   including the expansion of `post_mip.flows.<flow>.nodes.<node>` into `post.<flow>.<node>`
//!   stages;
//! - [`StageCatalog::new`] with [`StageDef`]s built in Rust;
//! - a `stages:` list in the experiment YAML ([`StageCatalog::from_config`]):
//!   ```yaml
//!   stages:
//!     - {id: prepare, command: [python, prep.py]}
//!     - {id: train, needs: [prepare], strategy: sharded, command: [python, train.py]}
//!   ```
//!
//! The module has three parts: the generic stage graph (`graph`: [`StageDef`], resolution,
//! contraction, topological order), user catalogs (`user`: a `stages:` list in the experiment)
//! and the built-in Puzzle pipeline (`puzzle`: [`StageCatalog::puzzle`] and the post-MIP flow
//! expansion).

mod graph;
mod puzzle;
mod user;

pub use graph::{
    Enablement, IfDisabled, MeshSource, Need, ResolvedStage, ShardAxis, StageCatalog, StageDef,
    StageWorker,
};
pub use puzzle::PostMipExpansion;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::config::Value;
    use crate::campaign::execution::Strategy;
    use crate::campaign::plan_error::PlanError;
    use serde_json::json;

    fn cfg(v: serde_json::Value) -> Value {
        Value::from_json(&v)
    }

    fn ids(stages: &[ResolvedStage]) -> Vec<&str> {
        stages.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn contraction_through_disabled_stages() {
        let c = cfg(json!({"tokenize_data": {"enabled": false}, "vllm_stats": {"enabled": false}}));
        let r = StageCatalog::puzzle().resolve("x", &c).unwrap();
        assert_eq!(
            ids(&r),
            [
                "convert",
                "width_importance",
                "sort",
                "build_library",
                "replacement_scoring",
                "mip"
            ]
        );
        let mip = r.iter().find(|s| s.id == "mip").unwrap();
        assert_eq!(mip.parents, ["convert", "replacement_scoring"]);
        let bl = r.iter().find(|s| s.id == "build_library").unwrap();
        assert_eq!(bl.parents, ["sort"]);
    }

    #[test]
    fn user_catalog_cycle_and_missing_parent() {
        let c = cfg(json!({"stages": [{"id": "a", "needs": ["b"]}, {"id": "b", "needs": ["a"]}]}));
        let e = StageCatalog::from_config("x", &c)
            .unwrap()
            .resolve("x", &c)
            .unwrap_err();
        match e {
            PlanError::Cycle { cycle } => assert_eq!(cycle.len(), 3),
            other => panic!("{other}"),
        }
        let c = cfg(json!({"stages": [{"id": "prep"}, {"id": "train", "needs": ["prepp"]}]}));
        let e = StageCatalog::from_config("x", &c)
            .unwrap()
            .resolve("x", &c)
            .unwrap_err();
        assert!(e.to_string().contains("did you mean `prep`"), "{e}");
        let c = cfg(json!({"stages": [{"id": "a", "command": "rm -rf /"}]}));
        assert!(StageCatalog::from_config("x", &c).is_err());
    }

    /// The grammar page's example (rustdoc of `StageCatalog::from_config`) parses as it says.
    #[test]
    fn the_documented_stages_example_parses_as_documented() {
        let page = include_str!("stages.md");
        let yaml = page
            .split("```yaml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("the page has a yaml example");
        let doc =
            crate::campaign::config::load_yaml_str(yaml, std::path::Path::new("exp.yaml")).unwrap();
        let cat = StageCatalog::from_config("exp.yaml", &doc.value).unwrap();
        // `enabled: train.enabled` with the key absent: only `prepare` runs.
        let r = cat.resolve("exp.yaml", &doc.value).unwrap();
        assert_eq!(ids(&r), ["prepare"]);
        let on = format!("{yaml}train: {{enabled: true}}\n");
        let on = crate::campaign::config::load_yaml_str(&on, std::path::Path::new("exp.yaml"))
            .unwrap()
            .value;
        let r = cat.resolve("exp.yaml", &on).unwrap();
        assert_eq!(ids(&r), ["prepare", "train"]);
        let t = &r[1];
        assert_eq!(t.parents, ["prepare"]);
        assert_eq!(t.strategy, Strategy::Sharded);
        assert_eq!(t.instances, 4);
    }

    #[test]
    fn user_stages_are_read_typed_with_paths() {
        let err = |v: serde_json::Value| {
            StageCatalog::from_config("exp.yaml", &cfg(v))
                .unwrap_err()
                .to_string()
        };
        let m =
            err(json!({"stages": [{"id": "a", "command": ["x"]}, {"id": "b", "comand": ["x"]}]}));
        assert!(
            m.starts_with("exp.yaml: unknown key `stages[1].comand` (did you mean `command`?); valid keys here: id, needs, strategy"),
            "{m}"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "a", "command": "rm -rf /"}]})),
            "exp.yaml: `stages[0].command` = \"rm -rf /\": expected a list of arguments (argv), e.g. [python, train.py]; commands never go through a shell"
        );
        assert_eq!(
            err(json!({"stages": [{"command": ["x"]}]})),
            "exp.yaml: missing required key `stages[0].id` (the stage id)"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "bad id"}]})),
            "exp.yaml: `stages[0].id` = \"bad id\": expected a stage id of letters, digits, '-', '_' and '.'"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "a", "outputs": ["ok", "/abs"]}]})),
            "exp.yaml: `stages[0].outputs[1]` = \"/abs\": expected a path relative to the unit's output folder, without `..`"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "a", "strategy": "shardd"}]})),
            "exp.yaml: `stages[0].strategy` = \"shardd\": expected one of single, sharded, persistent_pool (did you mean `sharded`?)"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "a", "resumable": "yes"}]})),
            "exp.yaml: `stages[0].resumable` = \"yes\": expected a boolean"
        );
        assert_eq!(
            err(json!({"stages": [{"id": "a", "enabled": 1}]})),
            "exp.yaml: `stages[0].enabled` = 1: expected true, false or the dotted key of a boolean"
        );
        assert!(
            err(json!({"stages": [{"id": "a", "parallel": {"tp_size": 2}}]}))
                .contains("unknown key `stages[0].parallel.tp_size` (did you mean `tp`?)")
        );

        let c = cfg(json!({"stages": [
            {"id": "prep", "command": ["python", "prep.py"], "outputs": ["data/x"]},
            {"id": "train", "needs": "prep", "strategy": "sharded", "instances": 4,
             "enabled": "train.enabled", "parallel": {"tp": 2, "pp": 2}, "distributed": true,
             "resumable": true, "validate": ["python", "check.py"], "aggregate": null}
        ]}));
        let cat = StageCatalog::from_config("exp.yaml", &c).unwrap();
        let r = cat
            .resolve("exp.yaml", &cfg(json!({"train": {"enabled": true}})))
            .unwrap();
        let train = r.iter().find(|s| s.id == "train").unwrap();
        assert_eq!(train.parents, ["prep"]);
        assert_eq!(train.strategy, Strategy::Sharded);
        assert_eq!((train.mesh.tp, train.mesh.pp), (2, 2));
        assert_eq!(train.instances, 4);
        assert!(train.distributed && train.worker.resumable && !train.aggregate);
        assert_eq!(train.worker.validate, ["python", "check.py"]);
        let prep = r.iter().find(|s| s.id == "prep").unwrap();
        assert_eq!(prep.worker.command, ["python", "prep.py"]);
        assert_eq!(prep.worker.outputs, ["data/x"]);
    }

    #[test]
    fn post_mip_flow_expansion() {
        let c = cfg(json!({"post_mip": {"flows": {"f": {"nodes": {
            "best_mip": {"type": "filter", "metric": "mip.score"},
            "mat": {"type": "materialize", "input": "best_mip"},
            "ev": {"type": "evaluation", "input": "mat", "config": {"automodel": {"parallel": {"tp": 2}}}},
            "best": {"type": "filter", "input": "ev", "metric": "ev.lm_loss"}
        }}}}}));
        let r = StageCatalog::puzzle().resolve("x", &c).unwrap();
        let post: Vec<&ResolvedStage> = r.iter().filter(|s| s.id.starts_with("post.")).collect();
        assert_eq!(post.len(), 4);
        assert_eq!(post[0].parents, ["mip"]);
        assert_eq!(post[2].mesh.tp, 2);
        assert_eq!(post[2].strategy, Strategy::Sharded);
        let bad = cfg(json!({"post_mip": {"flows": {"f": {"nodes": {"a": {"type": "filtr"}}}}}}));
        assert!(
            StageCatalog::puzzle()
                .resolve("x", &bad)
                .unwrap_err()
                .to_string()
                .contains("did you mean `filter`")
        );
    }
}
