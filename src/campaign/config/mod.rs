//! Experiment configs: YAML loading, Hydra-style `defaults` composition, overrides and
//! `${...}` interpolation, with every value traceable to its file and line.
//!
//! # Pipeline
//!
//! [`load_experiment`] (or [`ConfigLoader::load_experiment`]) does, in order:
//!
//! 1. **YAML** ([`load_yaml_str`]): one document per file; anchors, aliases and `<<` merge keys;
//!    duplicate keys refused with both lines; YAML 1.2 core scalars, refusing plain scalars that
//!    YAML 1.1 (OmegaConf, which these configs are written for) reads differently (`yes`, `010`,
//!    `1_000`, ...). `1e-4` is the float 0.0001.
//! 2. **Composition** of the top-level `defaults` list, as Hydra does: `/abs/path@_global_` from
//!    the config root (the nearest folder at or above the experiment file holding `base.yaml`),
//!    `relative/path` from the including file's folder, `_self_` placing the file's own content
//!    (last when absent), depth-first merge order. Mappings merge key by key; lists and scalars
//!    replace. Cycles are refused with the include chain; a `defaults` entry that resolves
//!    outside the config root (`..`, absolute paths, symlinks) is refused.
//! 3. **Overrides** ([`Override`], Hydra's grammar: `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b`).
//! 4. **Interpolation**: `${a.b}`, `${.rel}`, `${oc.env:NAME,default}`, nested `${a.${b}}`;
//!    a value that is exactly one interpolation keeps the referenced value's type. The
//!    environment is injected ([`Env`]) so loading is pure. Unknown keys, missing variables and
//!    cycles are errors naming the key and the file/line that wrote it.
//!
//! The result is a [`Config`]: a [`Value`] tree plus the [`Origin`] of every node, with
//! dotted-path lookups and typed conversion to serde structs whose errors name the key path and
//! the file position.
//!
//! ```
//! use puzzletron::campaign::config::{parse_overrides, ConfigLoader, Env};
//! # let dir = tempfile::tempdir().unwrap();
//! # std::fs::write(dir.path().join("base.yaml"), "lr: 1e-4\nrun_dir: ${oc.env:RUN,runs/x}\nmodel: {tp: 1}\n").unwrap();
//! # std::fs::write(dir.path().join("exp.yaml"), "defaults:\n  - /base@_global_\n  - _self_\nmodel: {tp: 2}\nout: ${run_dir}/ckpt\n").unwrap();
//! # let path = dir.path().join("exp.yaml");
//! let overrides = parse_overrides(["model.tp=4", "+model.pp=2"])?;
//! let cfg = ConfigLoader::new()
//!     .env(Env::new().with("RUN", "/scratch/run1"))
//!     .load_experiment(&path, &overrides)?;
//! assert_eq!(cfg.get("model.tp").and_then(|v| v.as_i64()), Some(4));
//! assert_eq!(cfg.get_as::<String>("out")?, "/scratch/run1/ckpt");
//! assert_eq!(cfg.get_as::<f64>("lr")?, 1e-4);
//! # Ok::<(), puzzletron::campaign::config::ConfigError>(())
//! ```

mod compose;
mod de;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod interpolate;
mod merge;
mod origin;
mod overrides;
mod path;
mod value;
mod yaml;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

pub(crate) use de::{DeError, DeErrorKind, deserialize_at, did_you_mean_in};
pub use error::ConfigError;
pub use interpolate::{Env, ResolverFn, Resolvers, resolve_string};
pub use origin::{Origin, Origins};
pub use overrides::{Override, OverrideKind, apply_overrides, parse_override, parse_overrides};
pub use path::{KeyPath, PathSegment};
pub use value::{Mapping, Value};
pub use yaml::{YamlDocument, load_yaml_str};

/// A loaded config: the value tree, where each node came from, and the files composed.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    value: Value,
    origins: Origins,
    files: Vec<PathBuf>,
    root: Option<PathBuf>,
}

impl Config {
    /// A config from a bare value (no origins, no files), e.g. built in code.
    pub fn from_value(value: Value) -> Self {
        Config {
            value,
            origins: Origins::new(),
            files: Vec::new(),
            root: None,
        }
    }

    /// The value tree.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The value tree, consuming the config.
    pub fn into_value(self) -> Value {
        self.value
    }

    /// The value tree and the origins, consuming the config (no copy of either).
    pub(crate) fn into_parts(self) -> (Value, Origins) {
        (self.value, self.origins)
    }

    /// Origins of every node.
    pub fn origins(&self) -> &Origins {
        &self.origins
    }

    /// Where the value at a dotted path (or its nearest ancestor) was written.
    pub fn origin(&self, dotted: &str) -> Option<&Origin> {
        self.origins.nearest(&KeyPath::parse(dotted)?)
    }

    /// The YAML files composed, in the order they were first loaded (canonical paths).
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The config root `defaults` were resolved against (canonical), for composed configs.
    pub fn config_root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The value at a dotted path (`"a.b"`, `"a.list.0"`, `"a.list[0]"`), if present.
    pub fn get(&self, dotted: &str) -> Option<&Value> {
        self.value.get(dotted)
    }

    /// The value at a [`KeyPath`], if present.
    pub fn get_path(&self, path: &KeyPath) -> Option<&Value> {
        self.value.get_path(path)
    }

    /// The value at a dotted path.
    ///
    /// # Errors
    /// [`ConfigError::MissingKey`] when absent (or the path is malformed).
    pub fn require(&self, dotted: &str) -> Result<&Value, ConfigError> {
        let key = KeyPath::parse(dotted)
            .unwrap_or_else(|| KeyPath(vec![PathSegment::Key(dotted.to_string())]));
        self.value
            .get_path(&key)
            .ok_or(ConfigError::MissingKey { key })
    }

    /// Converts the whole tree to `T`.
    ///
    /// # Errors
    /// [`ConfigError::Type`] naming the key path, the file position and serde's message (with a
    /// "did you mean" hint for unknown fields of `#[serde(deny_unknown_fields)]` structs).
    pub fn deserialize<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        self.convert(&self.value, KeyPath::root())
    }

    /// Converts the value at a dotted path to `T`; error paths are full paths from the root.
    ///
    /// # Errors
    /// [`ConfigError::MissingKey`] when absent, [`ConfigError::Type`] when it does not convert.
    pub fn get_as<T: DeserializeOwned>(&self, dotted: &str) -> Result<T, ConfigError> {
        let key = KeyPath::parse(dotted)
            .unwrap_or_else(|| KeyPath(vec![PathSegment::Key(dotted.to_string())]));
        let v = self
            .value
            .get_path(&key)
            .ok_or_else(|| ConfigError::MissingKey { key: key.clone() })?;
        self.convert(v, key)
    }

    /// Like [`Config::get_as`], but `Ok(None)` when the key is absent.
    ///
    /// # Errors
    /// [`ConfigError::Type`] when present but not convertible.
    pub fn get_opt_as<T: DeserializeOwned>(&self, dotted: &str) -> Result<Option<T>, ConfigError> {
        match self.get_as(dotted) {
            Ok(v) => Ok(Some(v)),
            Err(ConfigError::MissingKey { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn convert<T: DeserializeOwned>(&self, v: &Value, path: KeyPath) -> Result<T, ConfigError> {
        T::deserialize(de::ValueDe {
            value: v,
            path: path.clone(),
        })
        .map_err(|e| {
            let key = e.path.unwrap_or(path);
            ConfigError::Type {
                origin: self.origins.nearest(&key).cloned(),
                key,
                message: e.message,
            }
        })
    }
}

/// Converts a bare [`Value`] to `T` (no file positions in errors; see [`Config::deserialize`]).
///
/// # Errors
/// [`ConfigError::Type`] naming the key path.
pub fn from_value<T: DeserializeOwned>(value: &Value) -> Result<T, ConfigError> {
    Config::from_value(value.clone()).deserialize()
}

/// Loads experiment configs: holds the environment, resolvers and (optionally) a fixed config
/// root. Cheap to clone; loading is pure given the files and these settings.
#[derive(Debug, Clone)]
pub struct ConfigLoader {
    env: Env,
    resolvers: Resolvers,
    config_root: Option<PathBuf>,
}

impl Default for ConfigLoader {
    fn default() -> Self {
        Self::new()
    }
}

impl ConfigLoader {
    /// An empty environment, [`Resolvers::puzzletron`], config root found from the file.
    pub fn new() -> Self {
        ConfigLoader {
            env: Env::new(),
            resolvers: Resolvers::puzzletron(),
            config_root: None,
        }
    }

    /// The environment `${oc.env:...}` reads.
    pub fn env(mut self, env: Env) -> Self {
        self.env = env;
        self
    }

    /// Custom resolvers (replacing the default [`Resolvers::puzzletron`]).
    pub fn resolvers(mut self, resolvers: Resolvers) -> Self {
        self.resolvers = resolvers;
        self
    }

    /// A fixed config root instead of "nearest folder holding `base.yaml`". The experiment
    /// file and every `defaults` entry must lie inside it.
    pub fn config_root(mut self, root: impl Into<PathBuf>) -> Self {
        self.config_root = Some(root.into());
        self
    }

    /// Composes, overrides and interpolates an experiment config (see the [module
    /// docs](self)).
    ///
    /// # Errors
    /// Any [`ConfigError`]: I/O, YAML, `defaults`, override and interpolation errors.
    pub fn load_experiment(
        &self,
        path: impl AsRef<Path>,
        overrides: &[Override],
    ) -> Result<Config, ConfigError> {
        Ok(self.load_experiment_and_base(path, overrides, false)?.0)
    }

    /// [`ConfigLoader::load_experiment`], also returning (when `keep_base` and there are
    /// overrides) the composed value before the overrides, so a caller comparing the two
    /// composes the experiment once.
    pub(crate) fn load_experiment_and_base(
        &self,
        path: impl AsRef<Path>,
        overrides: &[Override],
        keep_base: bool,
    ) -> Result<(Config, Option<Value>), ConfigError> {
        let mut cfg = self.compose(path, &[])?;
        let base = (keep_base && !overrides.is_empty()).then(|| cfg.value.clone());
        overrides::apply_overrides_tracked(&mut cfg.value, &mut cfg.origins, overrides)?;
        cfg.value =
            interpolate::resolve_tree(&cfg.value, &mut cfg.origins, &self.env, &self.resolvers)?;
        Ok((cfg, base))
    }

    /// Composition and overrides only, without interpolation: `${...}` strings are left as
    /// written (useful to show or hash what the user wrote).
    ///
    /// # Errors
    /// As [`ConfigLoader::load_experiment`], minus interpolation errors.
    pub fn compose(
        &self,
        path: impl AsRef<Path>,
        overrides: &[Override],
    ) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let io = |p: &Path, source| ConfigError::Io {
            path: p.to_path_buf(),
            source,
        };
        let file = path.canonicalize().map_err(|e| io(path, e))?;
        let root = match &self.config_root {
            Some(r) => r.canonicalize().map_err(|e| io(r, e))?,
            None => compose::find_config_root(&file),
        };
        if !file.starts_with(&root) {
            return Err(ConfigError::PathEscape {
                file: path.to_path_buf(),
                line: 0,
                entry: path.display().to_string(),
                resolved: file,
                root,
            });
        }
        let mut c = compose::Composer::new(root.clone());
        c.compose_primary(&file)?;
        let (mut value, mut origins, files) = (c.value, c.origins, c.files);
        overrides::apply_overrides_tracked(&mut value, &mut origins, overrides)?;
        Ok(Config {
            value,
            origins,
            files,
            root: Some(root),
        })
    }

    /// One YAML document given as text, with overrides and interpolation but no composition
    /// (a `defaults` key is kept as data). `file` names the text in origins and errors.
    ///
    /// # Errors
    /// YAML, override and interpolation errors.
    pub fn load_str(
        &self,
        text: &str,
        file: impl AsRef<Path>,
        overrides: &[Override],
    ) -> Result<Config, ConfigError> {
        let file = file.as_ref();
        let doc = load_yaml_str(text, file)?;
        let (mut value, mut origins) = (doc.value, doc.origins);
        overrides::apply_overrides_tracked(&mut value, &mut origins, overrides)?;
        let value = interpolate::resolve_tree(&value, &mut origins, &self.env, &self.resolvers)?;
        Ok(Config {
            value,
            origins,
            files: vec![file.to_path_buf()],
            root: None,
        })
    }

    /// Loads a plain YAML file (runner / execution configs): no `defaults`, no overrides, no
    /// interpolation; a `defaults` key is kept as data.
    ///
    /// # Errors
    /// [`ConfigError::Io`] and the YAML errors of [`load_yaml_str`].
    pub fn load_yaml_file(&self, path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        load_yaml_file(path)
    }
}

/// [`ConfigLoader::load_experiment`] with `env` and the default resolvers.
///
/// # Errors
/// Any [`ConfigError`].
pub fn load_experiment(
    path: impl AsRef<Path>,
    overrides: &[Override],
    env: &Env,
) -> Result<Config, ConfigError> {
    ConfigLoader::new()
        .env(env.clone())
        .load_experiment(path, overrides)
}

/// Loads a plain YAML file (runner / execution configs) with origins; no composition, no
/// interpolation.
///
/// # Errors
/// [`ConfigError::Io`] and the YAML errors of [`load_yaml_str`].
pub fn load_yaml_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
    let path = path.as_ref();
    let doc = compose::read_yaml(path)?;
    Ok(Config {
        value: doc.value,
        origins: doc.origins,
        files: vec![path.to_path_buf()],
        root: None,
    })
}
