//! [`ConfigError`]: everything that can go wrong loading, composing, overriding, interpolating or
//! converting a config.

use std::path::PathBuf;

use super::origin::Origin;
use super::path::KeyPath;

/// Renders `text` with a caret under character `pos` (0-based, in characters), indented by two
/// spaces, e.g. for an override or an interpolation with a syntax error.
pub(crate) fn caret(text: &str, pos: usize) -> String {
    let width = text.chars().take(pos).count();
    format!("  {text}\n  {}^", " ".repeat(width))
}

fn ambiguity_hint(text: &str, yaml11: &str) -> String {
    if yaml11.starts_with("bool") {
        format!("write true/false for a boolean, or quote it ('{text}') for a string")
    } else {
        format!("write the number in plain decimal, or quote it ('{text}') for a string")
    }
}

fn at(origin: &Option<Origin>) -> String {
    match origin {
        Some(o) => format!(" ({o})"),
        None => String::new(),
    }
}

/// An error from [`campaign::config`](super): loading YAML, composing `defaults`, overrides,
/// interpolation or typed conversion. Every variant names where the problem is (file and
/// line/column, key path, or the override text).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// The YAML text is not valid YAML, or uses a construct this loader refuses (unknown tag,
    /// non-scalar key, a `<<` merge of something that is not a mapping, several documents).
    #[error("{}:{line}:{column}: invalid YAML: {message}", file.display())]
    Yaml {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },

    /// The same key appears twice in one mapping.
    #[error(
        "{}:{line}:{column}: duplicate key `{key}` (first defined at line {first_line})",
        file.display()
    )]
    DuplicateKey {
        /// The file.
        file: PathBuf,
        /// The key.
        key: String,
        /// 1-based line of the second occurrence.
        line: usize,
        /// 1-based column of the second occurrence.
        column: usize,
        /// 1-based line of the first occurrence.
        first_line: usize,
    },

    /// A plain (unquoted) scalar that YAML 1.1 (PyYAML/OmegaConf, what Hydra configs are
    /// written for) and YAML 1.2 read as different values, such as `yes`, `010` or `1_000`.
    /// Refused instead of silently picking one reading.
    #[error(
        "{}:{line}:{column}: ambiguous plain scalar `{text}`: YAML 1.1 reads {yaml11}, YAML 1.2 reads {yaml12}; {}",
        file.display(),
        ambiguity_hint(text, yaml11)
    )]
    AmbiguousScalar {
        /// The file.
        file: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The scalar as written.
        text: String,
        /// How YAML 1.1 reads it.
        yaml11: String,
        /// How YAML 1.2 reads it.
        yaml12: String,
    },

    /// A `defaults` list or one of its entries is malformed.
    #[error("{}:{line}: bad `defaults` entry: {message}", file.display())]
    BadDefaults {
        /// The file holding the `defaults` list.
        file: PathBuf,
        /// 1-based line of the entry (or of the list).
        line: usize,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A `defaults` entry names a config file that does not exist.
    #[error(
        "{}:{line}: defaults entry `{entry}` not found: no file {}",
        file.display(),
        resolved.display()
    )]
    DefaultsNotFound {
        /// The including file.
        file: PathBuf,
        /// 1-based line of the entry.
        line: usize,
        /// The entry as written.
        entry: String,
        /// The path it resolved to.
        resolved: PathBuf,
    },

    /// A `defaults` entry (or the experiment file itself) resolves outside the config root.
    #[error(
        "{}:{line}: defaults entry `{entry}` resolves to {}, outside the config root {}",
        file.display(),
        resolved.display(),
        root.display()
    )]
    PathEscape {
        /// The including file.
        file: PathBuf,
        /// 1-based line of the entry (0 for the experiment file itself).
        line: usize,
        /// The entry as written.
        entry: String,
        /// Where it resolved to.
        resolved: PathBuf,
        /// The config root.
        root: PathBuf,
    },

    /// The `defaults` lists include each other in a cycle.
    #[error("defaults cycle: {}", chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> "))]
    DefaultsCycle {
        /// The include chain, ending with the file that closes the cycle.
        chain: Vec<PathBuf>,
    },

    /// An override does not follow Hydra's override grammar.
    #[error("invalid override `{text}`: {message}\n{}", caret(text, *position))]
    OverrideSyntax {
        /// The override as typed.
        text: String,
        /// 0-based character position of the problem.
        position: usize,
        /// What is wrong and what was expected.
        message: String,
    },

    /// An override cannot be applied to the config (missing key for `a=v` / `~a`, existing key
    /// for `+a=v`, a parent that is not a mapping, or a `~a=v` whose value does not match).
    #[error("cannot apply override `{text}` at `{key}`: {message}")]
    OverrideApply {
        /// The override as typed.
        text: String,
        /// The key path it addresses.
        key: KeyPath,
        /// What is wrong and how to fix it.
        message: String,
    },

    /// A `${...}` expression is malformed.
    #[error("invalid interpolation at `{key}`{}: {message}\n{}", at(origin), caret(text, *position))]
    InterpolationSyntax {
        /// The key whose value holds the expression.
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// The whole string value.
        text: String,
        /// 0-based character position of the problem.
        position: usize,
        /// What is wrong.
        message: String,
    },

    /// `${a.b}` names a key that does not exist.
    #[error(
        "interpolation `{expression}` at `{key}`{}: key `{missing}` not found in the config",
        at(origin)
    )]
    UnknownKey {
        /// The key whose value holds the interpolation.
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// The interpolation as written.
        expression: String,
        /// The referenced key that does not exist.
        missing: String,
    },

    /// `${oc.env:NAME}` without a default, and `NAME` is not in the environment given to the
    /// loader.
    #[error(
        "interpolation at `{key}`{}: environment variable `{name}` is not set and has no default",
        at(origin)
    )]
    MissingEnv {
        /// The key whose value holds the interpolation.
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// The variable.
        name: String,
    },

    /// `${name:...}` names a resolver that is not registered.
    #[error("interpolation at `{key}`{}: unknown resolver `{name}` (known: {})", at(origin), known.join(", "))]
    UnknownResolver {
        /// The key whose value holds the interpolation.
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// The resolver name.
        name: String,
        /// The registered resolvers.
        known: Vec<String>,
    },

    /// A resolver refused its arguments, or an interpolated value cannot be used where it is
    /// (a mapping inside a string, a non-string key).
    #[error("interpolation at `{key}`{}: {message}", at(origin))]
    InterpolationValue {
        /// The key whose value holds the interpolation.
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// What is wrong.
        message: String,
    },

    /// Interpolations refer to each other in a cycle.
    #[error("interpolation cycle: {}{}", chain.iter().map(|k| k.to_string()).collect::<Vec<_>>().join(" -> "), at(origin))]
    InterpolationCycle {
        /// The keys in the cycle, ending with the key that closes it.
        chain: Vec<KeyPath>,
        /// Where the first key of the cycle was written.
        origin: Option<Origin>,
    },

    /// A key needed by a typed lookup is absent.
    #[error("missing config key `{key}`")]
    MissingKey {
        /// The key path.
        key: KeyPath,
    },

    /// A value does not have the shape a typed conversion expects (wrong type, unknown field,
    /// missing field, bad enum variant).
    #[error("config key `{key}`{}: {message}", at(origin))]
    Type {
        /// The key path of the offending value (`<root>` for the whole tree).
        key: KeyPath,
        /// Where that value was written.
        origin: Option<Origin>,
        /// Serde's message: what was found and what was expected.
        message: String,
    },
}

impl ConfigError {
    /// Whether retrying the same operation can help: only for transient I/O errors
    /// (interrupted, timed out, would block). Every other error needs the input to change.
    pub fn is_retryable(&self) -> bool {
        match self {
            ConfigError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }
}
