//! GPU visibility (N04): which GPUs a task can see, parsed from `CUDA_VISIBLE_DEVICES`,
//! `SLURM_STEP_GPUS` or `SLURM_JOB_GPUS`; which device a rank uses; and the worker-side
//! preflight that compares the visible count with the stage's mesh.
//!
//! Rules:
//! - Forms: integer indices (`0,1`), index ranges in the Slurm variables (`4-7`), GPU UUIDs
//!   (`GPU-8f3c…`), MIG ids (`MIG-…`, `MIG-GPU-…/1/0`), empty (no GPU) and Slurm's
//!   `NoDevFiles` (= 0 GPUs: the job asked for none, or the node's gres has no device files).
//!   Anything else, or an id listed twice, is an error naming the variable, the value and the
//!   entry — never a guess.
//! - Precedence: `CUDA_VISIBLE_DEVICES` (what the CUDA runtime itself obeys) over
//!   `SLURM_STEP_GPUS` over `SLURM_JOB_GPUS`. Two ranks with `CUDA_VISIBLE_DEVICES=0` under
//!   `SLURM_JOB_GPUS=4,5` each see one GPU (their own physical 4 or 5, renumbered 0).
//! - A rank's device is its *position* in its own visible list, never the raw id: with one
//!   visible GPU it is device 0; with several, the rank's local index (`SLURM_LOCALID`,
//!   `LOCAL_RANK`) within that list.
//! - The preflight fails with 0 visible GPUs, or fewer than the stage's mesh needs per node
//!   ([`GPUS_PER_NODE_ENV`], set by the controller), or with no visibility variable at all
//!   (nothing fences the task's GPUs from another task's). Its error reads
//!   `gpu preflight: …` and a worker exits with [`PREFLIGHT_EXIT_CODE`]: the controller
//!   classifies it as a configuration failure, never retried.

use std::fmt;

/// Environment variable with the GPUs per node the stage's mesh needs (the instance's GPUs
/// on each of its nodes), set by the campaign controller for GPU stages.
pub const GPUS_PER_NODE_ENV: &str = "PUZZLETRON_GPUS_PER_NODE";

/// Exit code of a worker whose preflight failed: 2, a usage/configuration error (the
/// controller's classification rule 7).
pub const PREFLIGHT_EXIT_CODE: i32 = 2;

/// The visibility variables, in precedence order.
pub const VISIBILITY_VARS: [&str; 3] =
    ["CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"];

/// Longest index range accepted (`0-4095`): more is a typo, not a node.
const MAX_RANGE: u32 = 4096;

/// One visible GPU as the variable names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GpuId {
    /// A device index (`3`).
    Index(u32),
    /// A GPU UUID (`GPU-8f3c0c6e-…`).
    Uuid(String),
    /// A MIG instance (`MIG-…` or `MIG-GPU-<uuid>/<gi>/<ci>`).
    Mig(String),
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuId::Index(i) => write!(f, "{i}"),
            GpuId::Uuid(s) | GpuId::Mig(s) => f.write_str(s),
        }
    }
}

/// Why GPU visibility is wrong for the task. Every message starts with `gpu preflight:`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuVisibilityError {
    /// An entry of a visibility variable is not a GPU id.
    #[error("gpu preflight: {var}={value:?}: entry {entry:?} is not {expected}")]
    Malformed {
        /// The variable.
        var: String,
        /// Its whole value.
        value: String,
        /// The bad entry.
        entry: String,
        /// What was expected.
        expected: String,
    },
    /// Fewer GPUs are visible than the stage's mesh needs on this node (0 included).
    #[error(
        "gpu preflight: {visible} GPU(s) visible ({var}={value:?}) but the stage mesh needs {needed} per node"
    )]
    TooFew {
        /// GPUs visible.
        visible: usize,
        /// GPUs the mesh needs per node.
        needed: u32,
        /// The variable that decided.
        var: String,
        /// Its value.
        value: String,
    },
    /// No visibility variable is set although the stage needs GPUs: every GPU of the node is
    /// visible, shared with any other task there.
    #[error(
        "gpu preflight: none of CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS is set but the stage mesh needs {needed} GPU(s) per node: the task's GPUs are not fenced from other tasks"
    )]
    Unfenced {
        /// GPUs the mesh needs per node.
        needed: u32,
    },
    /// A rank's local index has no GPU in its visible list.
    #[error(
        "gpu preflight: local rank {local_rank} has no GPU: {visible} visible ({var}={value:?})"
    )]
    NoDeviceForRank {
        /// The rank's index on its node.
        local_rank: u32,
        /// GPUs visible.
        visible: usize,
        /// The variable that decided.
        var: String,
        /// Its value.
        value: String,
    },
    /// [`GPUS_PER_NODE_ENV`] is not a number.
    #[error("gpu preflight: {GPUS_PER_NODE_ENV}={value:?} is not a whole number of GPUs")]
    BadNeeded {
        /// Its value.
        value: String,
    },
}

/// Parses one visibility variable's value (`var` names it in errors): `""` and `NoDevFiles`
/// are no GPU; otherwise comma-separated indices (ranges `a-b` too), `GPU-` UUIDs and `MIG-`
/// ids, each once.
///
/// # Errors
/// [`GpuVisibilityError::Malformed`] naming the variable, value and entry.
pub fn parse_visible(var: &str, value: &str) -> Result<Vec<GpuId>, GpuVisibilityError> {
    let v = value.trim();
    if v.is_empty() || v == "NoDevFiles" {
        return Ok(Vec::new());
    }
    let bad = |entry: &str, expected: &str| GpuVisibilityError::Malformed {
        var: var.into(),
        value: value.into(),
        entry: entry.into(),
        expected: expected.into(),
    };
    let mut out: Vec<GpuId> = Vec::new();
    for raw in v.split(',') {
        let e = raw.trim();
        let ids: Vec<GpuId> = if !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit()) {
            vec![GpuId::Index(
                e.parse().map_err(|_| bad(e, "an index below 2^32"))?,
            )]
        } else if let Some((a, b)) = e.split_once('-').filter(|(a, b)| {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }) {
            let (a, b): (u32, u32) = match (a.parse(), b.parse()) {
                (Ok(a), Ok(b)) if a <= b && b - a < MAX_RANGE => (a, b),
                _ => return Err(bad(e, "an ascending index range of at most 4096 GPUs")),
            };
            (a..=b).map(GpuId::Index).collect()
        } else if let Some(rest) = e.strip_prefix("GPU-") {
            if rest.is_empty() || !rest.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-') {
                return Err(bad(e, "a GPU UUID `GPU-<hex digits and dashes>`"));
            }
            vec![GpuId::Uuid(e.to_string())]
        } else if let Some(rest) = e.strip_prefix("MIG-") {
            if rest.is_empty()
                || !rest
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'/')
            {
                return Err(bad(
                    e,
                    "a MIG id `MIG-<uuid>` or `MIG-GPU-<uuid>/<gi>/<ci>`",
                ));
            }
            vec![GpuId::Mig(e.to_string())]
        } else {
            return Err(bad(
                e,
                "a GPU index, an index range, a `GPU-` UUID or a `MIG-` id (or the whole value empty / `NoDevFiles`)",
            ));
        };
        for id in ids {
            if out.contains(&id) {
                return Err(bad(e, "listed once (it is listed twice)"));
            }
            out.push(id);
        }
    }
    Ok(out)
}

/// What one task can see.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuVisibility {
    /// The variable that decided (the first set of [`VISIBILITY_VARS`]); `None` when none is
    /// set (every GPU of the node is visible).
    pub source: Option<&'static str>,
    /// Its raw value.
    pub value: String,
    /// The GPUs listed (empty = none visible); meaningless when `source` is `None`.
    pub devices: Vec<GpuId>,
}

impl GpuVisibility {
    /// Reads the visibility variables through `get` (e.g. `|k| std::env::var(k).ok()`), in
    /// precedence order.
    ///
    /// # Errors
    /// [`GpuVisibilityError::Malformed`] for the deciding variable's bad value.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, GpuVisibilityError> {
        for var in VISIBILITY_VARS {
            if let Some(value) = get(var) {
                let devices = parse_visible(var, &value)?;
                return Ok(Self {
                    source: Some(var),
                    value,
                    devices,
                });
            }
        }
        Ok(Self {
            source: None,
            value: String::new(),
            devices: Vec::new(),
        })
    }

    /// GPUs visible, `None` when no variable limits them.
    pub fn count(&self) -> Option<usize> {
        self.source.map(|_| self.devices.len())
    }

    /// The device (CUDA ordinal) of the rank with index `local_rank` on its node: its position
    /// in its own visible list — 0 when it sees one GPU, `local_rank` when it sees several —,
    /// never the raw id. Without a visibility variable, `local_rank`.
    ///
    /// # Errors
    /// [`GpuVisibilityError::NoDeviceForRank`] when the list is empty or shorter than
    /// `local_rank + 1` (and longer than 1).
    pub fn device_for_local_rank(&self, local_rank: u32) -> Result<u32, GpuVisibilityError> {
        let Some(source) = self.source else {
            return Ok(local_rank);
        };
        match self.devices.len() {
            1 => Ok(0),
            n if (local_rank as usize) < n => Ok(local_rank),
            n => Err(GpuVisibilityError::NoDeviceForRank {
                local_rank,
                visible: n,
                var: source.into(),
                value: self.value.clone(),
            }),
        }
    }

    /// The preflight: at least `needed` GPUs visible on this node (the mesh's GPUs per node;
    /// 0 = a CPU stage, always fine).
    ///
    /// # Errors
    /// [`GpuVisibilityError::TooFew`] with both numbers (0 visible included), or
    /// [`GpuVisibilityError::Unfenced`] when nothing limits the visible GPUs.
    pub fn check(&self, needed: u32) -> Result<(), GpuVisibilityError> {
        if needed == 0 {
            return Ok(());
        }
        let Some(source) = self.source else {
            return Err(GpuVisibilityError::Unfenced { needed });
        };
        if self.devices.len() < needed as usize {
            return Err(GpuVisibilityError::TooFew {
                visible: self.devices.len(),
                needed,
                var: source.into(),
                value: self.value.clone(),
            });
        }
        Ok(())
    }
}

/// The worker-side preflight from an environment (`get`, e.g. `|k| std::env::var(k).ok()`):
/// reads the visibility, the GPUs needed ([`GPUS_PER_NODE_ENV`], absent = 0) and the rank's
/// local index (`SLURM_LOCALID`, else `LOCAL_RANK`, else 0), and returns the rank's device.
/// A worker that gets an error prints it and exits with [`PREFLIGHT_EXIT_CODE`].
///
/// # Errors
/// Any [`GpuVisibilityError`].
pub fn preflight(get: impl Fn(&str) -> Option<String>) -> Result<u32, GpuVisibilityError> {
    let vis = GpuVisibility::from_env(&get)?;
    let needed = match get(GPUS_PER_NODE_ENV) {
        None => 0,
        Some(v) => v
            .trim()
            .parse::<u32>()
            .map_err(|_| GpuVisibilityError::BadNeeded { value: v.clone() })?,
    };
    vis.check(needed)?;
    if needed == 0 {
        return Ok(0);
    }
    let local = ["SLURM_LOCALID", "LOCAL_RANK"]
        .iter()
        .find_map(|k| get(k).and_then(|v| v.trim().parse::<u32>().ok()))
        .unwrap_or(0);
    vis.device_for_local_rank(local)
}
