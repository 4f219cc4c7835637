//! [`PlanSummary`]: one row per stage of a plan and the node-hours it asks for, the table a
//! dry run ends with.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::plan::CampaignPlan;
use super::runner::RunnerKind;

/// One stage of a [`PlanSummary`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageSummary {
    /// Stage id.
    pub stage_id: String,
    /// `single`, `sharded`, `pool`, ..., or `manual` for a manual decision (no job, no node).
    pub strategy: String,
    /// Instances.
    pub instances: u32,
    /// Nodes the stage's allocation takes.
    pub nodes: u32,
    /// GPUs requested per node (the most any node uses; 0 for CPU stages).
    pub gpus_per_node: u32,
    /// The Slurm partition list the stage is submitted to (`None`: not Slurm, or the
    /// cluster's default partition).
    pub partition: Option<String>,
    /// `gpu` or `cpu`.
    pub resource: String,
    /// `direct` or `torchrun`.
    pub launcher: String,
    /// Parent stage ids.
    pub parents: Vec<String>,
    /// The stage's time limit (its own, else the runner's), in seconds; `None`: unlimited.
    pub time_limit_s: Option<u64>,
}

impl StageSummary {
    /// `nodes x time limit` in node-hours; `None` without a time limit.
    pub fn node_hours(&self) -> Option<f64> {
        self.time_limit_s
            .map(|s| f64::from(self.nodes) * s as f64 / 3600.0)
    }
}

/// Per stage: strategy, instances, nodes x GPUs, partition, resource, launcher, parents; and
/// the node-hours the plan asks for at its time limits (an upper bound of what it may use:
/// each stage's nodes held for its whole `--time`; retries not counted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlanSummary {
    /// One row per stage, in plan order.
    pub stages: Vec<StageSummary>,
    /// Overrides the compiler did not check (keys it does not read, passed to the workers
    /// unchanged), as typed.
    pub unchecked_overrides: Vec<String>,
}

impl PlanSummary {
    /// The summary of `plan`.
    pub fn of(plan: &CampaignPlan) -> Self {
        let slurm = plan.runner.slurm.clone().unwrap_or_default();
        let stages = plan
            .stages
            .iter()
            .map(|st| {
                let a = &st.spec.allocation;
                let partition = match plan.runner.kind {
                    RunnerKind::Slurm => {
                        let p = slurm.resolve_partition(st.spec.partition.as_deref());
                        (!p.is_empty()).then(|| p.to_slurm())
                    }
                    RunnerKind::Local | RunnerKind::Baremetal | RunnerKind::Ray => None,
                };
                let time_limit = st.spec.time_limit.as_ref().or(match plan.runner.kind {
                    RunnerKind::Slurm => slurm.time_limit.as_ref(),
                    RunnerKind::Local | RunnerKind::Baremetal | RunnerKind::Ray => None,
                });
                let manual = st.decision.is_some();
                StageSummary {
                    stage_id: st.stage_id.clone(),
                    strategy: if manual {
                        "manual".to_string()
                    } else {
                        st.spec.strategy.to_string()
                    },
                    instances: st.spec.instances,
                    // A manual decision submits no job: no node, no GPU.
                    nodes: if manual { 0 } else { a.nodes },
                    gpus_per_node: a.max_gpus_on_a_node(),
                    partition,
                    resource: st.spec.resource.as_str().to_string(),
                    launcher: super::work::launcher_kind(&st.work.topology.launcher).to_string(),
                    parents: st.parents.clone(),
                    time_limit_s: time_limit.map(|t| t.as_duration().as_secs()),
                }
            })
            .collect();
        PlanSummary {
            stages,
            unchecked_overrides: plan.unchecked_overrides.clone(),
        }
    }

    /// Node-hours of the stages that have a time limit.
    pub fn node_hours(&self) -> f64 {
        self.stages
            .iter()
            .filter_map(StageSummary::node_hours)
            // From +0.0: `sum()` of no f64 is -0.0, which would print as "-0.0".
            .fold(0.0, |a, b| a + b)
    }

    /// Stages without a time limit (not in [`PlanSummary::node_hours`]).
    pub fn stages_without_time_limit(&self) -> Vec<&str> {
        self.stages
            .iter()
            .filter(|s| s.time_limit_s.is_none())
            .map(|s| s.stage_id.as_str())
            .collect()
    }
}

fn hms(secs: u64) -> String {
    let (d, rest) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rest / 3600, rest % 3600 / 60, rest % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h}:{m:02}:{s:02}")
    }
}

/// A text table, one row per stage, then the total node-hours and the unchecked overrides.
impl fmt::Display for PlanSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header = [
            "stage",
            "strategy",
            "instances",
            "nodes x GPUs",
            "partition",
            "resource",
            "launcher",
            "time",
            "node-h",
            "parents",
        ];
        let rows: Vec<[String; 10]> = self
            .stages
            .iter()
            .map(|s| {
                [
                    s.stage_id.clone(),
                    s.strategy.clone(),
                    s.instances.to_string(),
                    format!("{} x {}", s.nodes, s.gpus_per_node),
                    s.partition.clone().unwrap_or_else(|| "-".into()),
                    s.resource.clone(),
                    s.launcher.clone(),
                    s.time_limit_s.map_or_else(|| "-".into(), hms),
                    s.node_hours()
                        .map_or_else(|| "-".into(), |h| format!("{h:.1}")),
                    if s.parents.is_empty() {
                        "-".into()
                    } else {
                        s.parents.join(",")
                    },
                ]
            })
            .collect();
        let mut width = header.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[&str]| -> fmt::Result {
            let mut out = String::new();
            for (i, (c, w)) in cells.iter().zip(width).enumerate() {
                if i + 1 == cells.len() {
                    out.push_str(c);
                } else {
                    out.push_str(&format!("{c:<w$}  "));
                }
            }
            writeln!(f, "{}", out.trim_end())
        };
        line(f, &header)?;
        for r in &rows {
            line(f, &r.each_ref().map(String::as_str))?;
        }
        write!(
            f,
            "total: {} stage(s), {:.1} node-hours at their time limits",
            self.stages.len(),
            self.node_hours()
        )?;
        let open = self.stages_without_time_limit();
        if !open.is_empty() {
            write!(f, " (no time limit, not counted: {})", open.join(", "))?;
        }
        writeln!(f)?;
        if !self.unchecked_overrides.is_empty() {
            writeln!(
                f,
                "overrides passed to the workers unchecked (keys the compiler does not read): {}",
                self.unchecked_overrides.join(" ")
            )?;
        }
        Ok(())
    }
}
