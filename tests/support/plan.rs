//! One way for the tests to compile a campaign plan from a config written inline, so that the
//! seven arguments of `compile_resolved` are spelled once.

use std::path::{Path, PathBuf};

use puzzletron::campaign::config::ConfigLoader;
use puzzletron::campaign::config::Value as ConfigValue;
use puzzletron::campaign::{
    CampaignPlan, ExecutionConfig, PlanError, RunnerEnvironment, StageCatalog,
    compile_campaign_plan_with,
};
use serde_json::{Value, json};

/// A plan to compile: label `exp`, the stages' own catalog, the local runner and the default
/// execution config unless told otherwise.
pub struct PlanBuilder {
    label: String,
    config: ConfigValue,
    catalog: Option<StageCatalog>,
    runner: RunnerEnvironment,
    execution: ExecutionConfig,
}

impl PlanBuilder {
    /// A config `{"stages": stages}`.
    pub fn stages(stages: Value) -> Self {
        Self::config(ConfigValue::from_json(&json!({ "stages": stages })))
    }

    /// A whole experiment config.
    pub fn config(config: ConfigValue) -> Self {
        Self {
            label: "exp".into(),
            config,
            catalog: None,
            runner: RunnerEnvironment::local(),
            execution: ExecutionConfig::default(),
        }
    }

    /// The experiment's label (also the name of the catalog read from its stages).
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.into();
        self
    }

    /// A catalog of its own instead of the config's stages.
    pub fn catalog(mut self, catalog: StageCatalog) -> Self {
        self.catalog = Some(catalog);
        self
    }

    /// The runner environment.
    pub fn runner(mut self, runner: RunnerEnvironment) -> Self {
        self.runner = runner;
        self
    }

    /// The execution config's `execution:` section.
    pub fn execution(self, execution: Value) -> Self {
        let execution = ExecutionConfig::from_value(
            "execution.yaml",
            &ConfigValue::from_json(&json!({ "execution": execution })),
        )
        .unwrap();
        self.execution_config(execution)
    }

    /// An execution config read elsewhere.
    pub fn execution_config(mut self, execution: ExecutionConfig) -> Self {
        self.execution = execution;
        self
    }

    /// Compiles the plan; panics on a plan error.
    pub fn build(self) -> CampaignPlan {
        let catalog = match self.catalog {
            Some(c) => c,
            None => StageCatalog::from_config(&self.label, &self.config).unwrap(),
        };
        puzzletron::campaign::compile_resolved(
            &self.label,
            self.config,
            &[],
            &catalog,
            &self.runner,
            &self.execution,
            None,
        )
        .unwrap()
    }
}

/// `../shared/fixtures/puzzletron-configs`: the experiment, runner and execution configs of
/// the fixture campaigns.
pub fn fixtures() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/fixtures/puzzletron-configs"
    ))
}

/// Writes `text` to `dir/name` (making its folders); returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// Compiles the experiment file `exp` as written (no environment, no overrides) for the local
/// runner.
pub fn compile_file(exp: &Path, execution: &ExecutionConfig) -> Result<CampaignPlan, PlanError> {
    compile_campaign_plan_with(
        &ConfigLoader::new(),
        exp,
        &RunnerEnvironment::local(),
        execution,
        &[],
        None,
    )
}
