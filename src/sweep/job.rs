//! [`Job`]: a plain Rust function wrapped with its identity (name, crate, file).

use std::marker::PhantomData;
use std::path::PathBuf;

use crate::identity::{CompiledCode, Modules};

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
/// use puzzletron::{JobResult, Run, job};
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
    code: Option<&'static CompiledCode>,
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
            code: self.code,
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
            code: None,
            func,
            _p: PhantomData,
        }
    }

    /// Narrows the owned code of this job to `modules` (default: the orchestrator's setting,
    /// itself defaulting to the whole `src/`).
    ///
    /// Applies to jobs without compiled identity ([`Job::new`]), whose code is read from the
    /// source tree when the program runs. A [`job!`](crate::job) job's code is its compiled
    /// closure (what the function reaches), which needs no narrowing; `modules` is ignored for
    /// it. To make a job's key also cover a file the job does not reach in Rust (a config read
    /// at run time), `include_str!` it in the job or put its content in the params.
    pub fn with_modules(mut self, modules: Modules) -> Self {
        self.modules = Some(modules);
        self
    }

    /// Attaches the compile-time code identity `job!` computed (used by the macro; the key then
    /// depends on `code`, never on files read at run time).
    #[doc(hidden)]
    pub fn with_code(mut self, code: &'static CompiledCode) -> Self {
        self.code = Some(code);
        self
    }

    /// The compile-time code identity, for jobs made with [`job!`](crate::job).
    pub fn code(&self) -> Option<&'static CompiledCode> {
        self.code
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
/// folder, the calling file, and the job's compile-time code identity
/// ([`CompiledCode`]): the digests of every item the function reaches in the calling package and
/// its path/workspace dependencies, computed when the crate is compiled (see
/// [`identity::compiled`](crate::identity::CompiledCode) and CONTRIBUTING.md). Cargo rebuilds
/// the crate when any file read for it changes.
#[macro_export]
macro_rules! job {
    ($f:path) => {
        $crate::Job::new(
            concat!(module_path!(), "::", stringify!($f)),
            env!("CARGO_PKG_NAME"),
            env!("CARGO_MANIFEST_DIR"),
            file!(),
            $f,
        )
        .with_code($crate::__private::job_code!($crate; $f))
    };
}
