//! [`Job`]: a plain Rust function wrapped with its identity (name, crate, file).

use std::marker::PhantomData;
use std::path::PathBuf;

use crate::identity::Modules;

use super::Run;

/// What a job returns: `Ok(())` or any error (`?` works on every `std::error::Error`, and on
/// `anyhow::Error`).
pub type JobResult = Result<(), Box<dyn std::error::Error + Send + Sync + 'static>>;

/// A job: a function `fn(&P, &mut Run) -> JobResult` with the identity that goes into its key.
///
/// Make one with the [`job!`](crate::job) macro, which captures the function's path, its crate
/// folder (`CARGO_MANIFEST_DIR`) and the file it is named in (`file!()`):
///
/// ```
/// use puzzletron::{job, sweep::{Run, JobResult}};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Params { lr: f64 }
/// fn train(p: &Params, run: &mut Run) -> JobResult {
///     run.log("loss", 0, 1.0 / p.lr)?;
///     Ok(())
/// }
/// let j = job!(train);
/// assert!(j.name().ends_with("::train"));
/// ```
pub struct Job<P> {
    name: String,
    crate_name: String,
    crate_dir: PathBuf,
    file: PathBuf,
    modules: Option<Modules>,
    func: fn(&P, &mut Run) -> JobResult,
    _p: PhantomData<fn(&P)>,
}

impl<P> Clone for Job<P> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            crate_name: self.crate_name.clone(),
            crate_dir: self.crate_dir.clone(),
            file: self.file.clone(),
            modules: self.modules.clone(),
            func: self.func,
            _p: PhantomData,
        }
    }
}

impl<P> std::fmt::Debug for Job<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("file", &self.file)
            .finish()
    }
}

impl<P> Job<P> {
    /// A job from its parts; prefer [`job!`](crate::job). `name` is the function's Rust path
    /// (whitespace is removed), `crate_dir` the folder of the crate's `Cargo.toml`, `file` the
    /// source file the job is defined in (absolute, or relative to `crate_dir` or an ancestor).
    pub fn new(
        name: &str,
        crate_name: &str,
        crate_dir: impl Into<PathBuf>,
        file: impl Into<PathBuf>,
        func: fn(&P, &mut Run) -> JobResult,
    ) -> Self {
        Self {
            name: name.chars().filter(|c| !c.is_whitespace()).collect(),
            crate_name: crate_name.to_string(),
            crate_dir: crate_dir.into(),
            file: file.into(),
            modules: None,
            func,
            _p: PhantomData,
        }
    }

    /// Narrows the owned code of this job to `modules` (default: the orchestrator's setting,
    /// itself defaulting to the whole `src/`).
    pub fn with_modules(mut self, modules: Modules) -> Self {
        self.modules = Some(modules);
        self
    }

    /// The job's name: its Rust path, e.g. `sweep::train`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The crate the job belongs to (`CARGO_PKG_NAME`).
    pub fn crate_name(&self) -> &str {
        &self.crate_name
    }

    /// The crate folder.
    pub fn crate_dir(&self) -> &std::path::Path {
        &self.crate_dir
    }

    /// The file the job is defined in.
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    pub(crate) fn modules(&self) -> Option<&Modules> {
        self.modules.as_ref()
    }

    /// The function.
    pub fn func(&self) -> fn(&P, &mut Run) -> JobResult {
        self.func
    }
}

/// Names a job function: `job!(train)` or `job!(model::train)`.
///
/// Captures the function's path (prefixed by the calling module's path), the crate name and
/// folder, and the calling file (`file!()`, so write `job!` in the file that defines the
/// function, or list the function's module in [`Modules`]).
#[macro_export]
macro_rules! job {
    ($f:path) => {
        $crate::sweep::Job::new(
            concat!(module_path!(), "::", stringify!($f)),
            env!("CARGO_PKG_NAME"),
            env!("CARGO_MANIFEST_DIR"),
            file!(),
            $f,
        )
    };
}
