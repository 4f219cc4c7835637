//! The error type of campaign planning: runner/execution schemas, the stage catalog, meshes,
//! GPU packing, compilation and the plan loader.

use std::path::PathBuf;

/// Everything that can go wrong while turning configs into a [`CampaignPlan`](super::CampaignPlan).
///
/// Every variant carries the context a user needs to fix the input: the file, the dotted key
/// path, the bad value and what was expected. None of them is retryable: planning is pure, so
/// the same input fails the same way ([`PlanError::is_retryable`] is `false`), except
/// [`PlanError::Io`] (and I/O inside [`PlanError::Config`]) for transient read failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A key that the schema does not know (usually a typo).
    #[error("{file}: unknown key `{path}`{}; valid keys here: {}", suggestion_text(.suggestion), .valid.join(", "))]
    UnknownField {
        /// The file the key came from (or `<overrides>` / `<memory>`).
        file: String,
        /// Dotted key path of the unknown key, e.g. `runner.slurm.partiton`.
        path: String,
        /// The closest valid key, if one is close enough to be a likely typo.
        suggestion: Option<String>,
        /// The keys valid at that position.
        valid: Vec<String>,
    },
    /// A key the compiler does not read, within a small edit distance of one it reads at the
    /// same place: most likely a typo that would silently change what runs (a misspelt stage
    /// switch leaves the stage on).
    #[error(
        "{file}: unknown key `{path}` = {value} is one typo away from `{known}`, which the compiler \
         reads: rename it to `{}` (did you mean `{}`?); a new key meant for the workers needs a \
         name that is not so close to one the compiler reads",
        .known.rsplit('.').next().unwrap_or(.known), .known.rsplit('.').next().unwrap_or(.known)
    )]
    NearKnownKey {
        /// The file the key came from (`file:line:column` once located).
        file: String,
        /// Dotted key path of the key, e.g. `replacement_scoring.enable`.
        path: String,
        /// Its value, rendered short.
        value: String,
        /// Dotted key path of the key the compiler reads, e.g. `replacement_scoring.enabled`.
        known: String,
    },
    /// A value of the wrong type or out of range.
    #[error("{file}: `{path}` = {value}: expected {expected}")]
    InvalidValue {
        /// The file the value came from.
        file: String,
        /// Dotted key path of the value.
        path: String,
        /// The offending value, rendered as YAML-ish text.
        value: String,
        /// What would have been accepted.
        expected: String,
    },
    /// A required key is absent.
    #[error("{file}: missing required key `{path}` ({expected})")]
    MissingField {
        /// The file that should contain the key.
        file: String,
        /// Dotted key path.
        path: String,
        /// What the key must hold.
        expected: String,
    },
    /// Loading or composing a YAML file failed (parse error, defaults, overrides, interpolation).
    #[error(transparent)]
    Config(Box<super::config::ConfigError>),
    /// The experiment holds nothing the stage catalog reads (an empty file, a wrong file, or
    /// keys all misspelled), so compiling it would plan the catalog's defaults for nothing.
    #[error("{file}: nothing in this experiment is read by the `{catalog}` stage catalog (top-level keys: {}); expected at least one of: {}, or a `stages:` list of your own", if .found.is_empty() { "none".to_string() } else { .found.join(", ") }, .expected.join(", "))]
    NothingToCompile {
        /// The experiment.
        file: String,
        /// The catalog's name.
        catalog: String,
        /// The top-level keys the experiment has.
        found: Vec<String>,
        /// The top-level keys the catalog reads.
        expected: Vec<String>,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A stage names a parent that is not in the catalog.
    #[error("stage `{stage}` needs `{parent}`, which is not a stage of this catalog{}", suggestion_text(.suggestion))]
    MissingParent {
        /// The stage with the dangling dependency.
        stage: String,
        /// The unknown parent id.
        parent: String,
        /// The closest stage id, if any.
        suggestion: Option<String>,
    },
    /// Two stages share one id.
    #[error("stage id `{stage}` is defined twice")]
    DuplicateStage {
        /// The repeated id.
        stage: String,
    },
    /// The stage graph has a cycle; `cycle` lists it, first stage repeated at the end.
    #[error("stage graph has a cycle: {}", .cycle.join(" -> "))]
    Cycle {
        /// The stages on the cycle, e.g. `["a", "b", "a"]`.
        cycle: Vec<String>,
    },
    /// A stage id (in a stage filter or an execution config) that the plan does not contain.
    #[error("{context}: unknown stage `{stage}`{}; stages: {}", suggestion_text(.suggestion), .valid.join(", "))]
    UnknownStage {
        /// Where the id came from (e.g. `stage filter`, `execution.stages`).
        context: String,
        /// The unknown id.
        stage: String,
        /// The closest stage id, if any.
        suggestion: Option<String>,
        /// The valid ids.
        valid: Vec<String>,
    },
    /// The stage filter selects a stage of the catalog that the experiment disables.
    #[error(
        "{file}: stage filter selects `{stage}`, which is disabled in the experiment: {detail}"
    )]
    DisabledStage {
        /// Where the switch is written (`file:line:column` once located), else the experiment.
        file: String,
        /// The selected stage.
        stage: String,
        /// The dotted key that disables it, if a key does.
        key: Option<String>,
        /// Why it is disabled (e.g. "`depth_importance.enabled` is false"), then how to
        /// enable it.
        detail: String,
    },
    /// The stage filter selects a stage whose parent is neither selected nor complete, so the
    /// stage could never start.
    #[error(
        "stage filter selects `{stage}` but its parent `{parent}` is neither selected nor complete; add `{parent}` to the filter or finish it first"
    )]
    StageFilterIncomplete {
        /// The selected stage.
        stage: String,
        /// The parent that blocks it.
        parent: String,
    },
    /// A parallel mesh that cannot be laid out (zero sizes, `ep` not dividing the world, ...).
    #[error("{context}: invalid mesh {mesh}: {reason}")]
    BadMesh {
        /// Where the mesh came from (stage id or key path).
        context: String,
        /// The mesh, as `tp=..,cp=..`.
        mesh: String,
        /// Why it is refused.
        reason: String,
    },
    /// GPU packing is impossible for this instance size and node size.
    #[error(
        "{context}: cannot pack {instances} instance(s) of {gpus_per_instance} GPU(s) on {gpus_per_node}-GPU nodes: {reason}"
    )]
    Packing {
        /// The stage (or caller) being packed.
        context: String,
        /// Number of instances requested.
        instances: u64,
        /// GPUs one instance needs.
        gpus_per_instance: u64,
        /// GPUs per node.
        gpus_per_node: u64,
        /// Why it is impossible.
        reason: String,
    },
    /// A stage's allocation exceeds a limit of the runner (max_nodes, interactive_max_nodes,
    /// the bare-metal inventory).
    #[error("stage `{stage}` needs {nodes} node(s) but {limit_name} is {limit}{}: {detail}", .limit_at.as_ref().map(|a| format!(" (set at {a})")).unwrap_or_default())]
    TooManyNodes {
        /// The stage.
        stage: String,
        /// Nodes it needs.
        nodes: u64,
        /// The runner key that limits it, e.g. `runner.slurm.max_nodes`.
        limit_name: String,
        /// The limit.
        limit: u64,
        /// Where the limit is written (`runner.yaml:11:16`), once known
        /// ([`PlanError::locate_runner`]).
        limit_at: Option<String>,
        /// Why the stage takes that many nodes (instances, GPUs per instance and its mesh,
        /// GPUs per node), then how to fix it.
        detail: String,
    },
    /// The work planner refuses a stage's shape (e.g. instances not divisible by the number of
    /// embedding widths it shards over).
    #[error("stage `{stage}`: {reason}")]
    WorkPlan {
        /// The stage.
        stage: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A runner value is still a placeholder of the shared runner files (`REPLACE_WITH_...`):
    /// shown by the dry run, refused before any job is submitted.
    #[error(
        "{file}: `{path}` = {value:?} is still a placeholder: replace it with your site's value \
         (the comment above it in the runner file says which) before `campaign run`{}; \
         `campaign dry-run` shows what would be submitted with it",
        if .more.is_empty() { String::new() } else { format!(" (also: {})", .more.join(", ")) }
    )]
    Placeholder {
        /// The runner file (`file:line:column` once located).
        file: String,
        /// Dotted key path of the value, e.g. `runner.slurm.account`.
        path: String,
        /// The value.
        value: String,
        /// The key paths of the runner's other placeholders.
        more: Vec<String>,
    },
    /// A serialized plan (from [`plan_to_dict`](super::plan_to_dict)) could not be loaded.
    #[error("invalid plan document at `{path}`: {reason}")]
    PlanDocument {
        /// JSON path inside the document.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

fn suggestion_text(s: &Option<String>) -> String {
    match s {
        Some(s) => format!(" (did you mean `{s}`?)"),
        None => String::new(),
    }
}

impl PlanError {
    /// Whether retrying the same call can help: only I/O errors; planning is deterministic.
    pub fn is_retryable(&self) -> bool {
        match self {
            PlanError::Io { .. } => true,
            PlanError::Config(e) => e.is_retryable(),
            _ => false,
        }
    }
}

impl PlanError {
    /// Replaces the file label `label` of a key-path error ([`PlanError::UnknownField`],
    /// [`PlanError::InvalidValue`], [`PlanError::MissingField`]) by where the value at fault
    /// was written: `file:line:column` of the YAML file that holds it (a `defaults` file, not
    /// necessarily the experiment) or the override that set it. Other errors, and paths
    /// without a recorded origin, are returned unchanged.
    pub fn locate(self, label: &str, origins: &super::config::Origins) -> PlanError {
        let at = |file: &str, path: &str| -> Option<String> {
            if file != label {
                return None;
            }
            let key = super::config::KeyPath::parse(path)?;
            origins.nearest(&key).map(ToString::to_string)
        };
        match self {
            PlanError::UnknownField {
                file,
                path,
                suggestion,
                valid,
            } => PlanError::UnknownField {
                file: at(&file, &path).unwrap_or(file),
                path,
                suggestion,
                valid,
            },
            PlanError::InvalidValue {
                file,
                path,
                value,
                expected,
            } => PlanError::InvalidValue {
                file: at(&file, &path).unwrap_or(file),
                path,
                value,
                expected,
            },
            PlanError::NearKnownKey {
                file,
                path,
                value,
                known,
            } => PlanError::NearKnownKey {
                file: at(&file, &path).unwrap_or(file),
                path,
                value,
                known,
            },
            PlanError::MissingField {
                file,
                path,
                expected,
            } => PlanError::MissingField {
                file: at(&file, &path).unwrap_or(file),
                path,
                expected,
            },
            PlanError::Placeholder {
                file,
                path,
                value,
                more,
            } => PlanError::Placeholder {
                file: at(&file, &path).unwrap_or(file),
                path,
                value,
                more,
            },
            PlanError::DisabledStage {
                file,
                stage,
                key,
                detail,
            } => PlanError::DisabledStage {
                file: key.as_deref().and_then(|k| at(&file, k)).unwrap_or(file),
                stage,
                key,
                detail,
            },
            other => other,
        }
    }
}

impl PlanError {
    /// Names where a runner limit of a [`PlanError::TooManyNodes`] is written: the
    /// `file:line:column` of its key in the runner file at `runner_file` (the file itself when
    /// the key is not in it). Other errors are returned unchanged.
    pub fn locate_runner(self, runner_file: &std::path::Path) -> PlanError {
        match self {
            PlanError::Placeholder {
                path, value, more, ..
            } => {
                let label = runner_file.display().to_string();
                let at = super::config::load_yaml_file(runner_file)
                    .ok()
                    .and_then(|cfg| {
                        let key = super::config::KeyPath::parse(&path)?;
                        cfg.origins().nearest(&key).map(ToString::to_string)
                    })
                    .unwrap_or(label);
                PlanError::Placeholder {
                    file: at,
                    path,
                    value,
                    more,
                }
            }
            PlanError::TooManyNodes {
                stage,
                nodes,
                limit_name,
                limit,
                limit_at: None,
                detail,
            } if limit_name.starts_with("runner.") => {
                let label = runner_file.display().to_string();
                let at = super::config::load_yaml_file(runner_file)
                    .ok()
                    .and_then(|cfg| {
                        let key = super::config::KeyPath::parse(&limit_name)?;
                        cfg.origins().nearest(&key).map(ToString::to_string)
                    })
                    .unwrap_or(label);
                PlanError::TooManyNodes {
                    stage,
                    nodes,
                    limit_name,
                    limit,
                    limit_at: Some(at),
                    detail,
                }
            }
            other => other,
        }
    }
}

impl From<super::config::ConfigError> for PlanError {
    fn from(e: super::config::ConfigError) -> Self {
        PlanError::Config(Box::new(e))
    }
}
