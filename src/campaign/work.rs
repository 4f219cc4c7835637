//! Work plans: how one stage's work is cut into [`WorkItem`]s and laid out as task groups
//! ([`StageLayout`]) on nodes and GPUs. Each instance's job gets the executor's
//! [`TaskTopology`](crate::executor::TaskTopology) and [`TaskLauncher`] (the controller's spec
//! builder converts; there is no second set of launch types).
//!
//! - `single`: one item, run by instance 0.
//! - `sharded`: `instances` items, item *i* is shard `i / instances` (or, with shard groups
//!   such as embedding widths, shard `i / (instances / groups)` of its group); the stage needs
//!   an aggregate step when [`WorkPlan::aggregate_required`].
//! - `persistent_pool`: `instances` long-lived workers (model servers) pulling work from a queue
//!   filled at run time; their results are always merged.
//!
//! Every instance is one task group; a group spanning several nodes has one task per node.
//! Distributed instances are started with torchrun: `--nnodes`, `--nproc_per_node`, a c10d
//! rendezvous (`--rdzv_endpoint MASTER_ADDR:MASTER_PORT`, `--rdzv_id`), with a port unique
//! within the campaign so groups sharing a host never collide.

use serde::{Deserialize, Serialize};

use super::execution::Strategy;
use super::mesh::{GpuAllocation, InstancePlacement};
use super::plan_error::PlanError;
pub(super) use crate::executor::TaskLauncher;

/// What one work item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkItemKind {
    /// The only item of a `single` stage.
    Single,
    /// One shard of a `sharded` stage.
    Shard,
    /// One long-lived worker of a `persistent_pool` stage.
    PoolWorker,
}

/// One unit of work of a stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkItem {
    /// Unique id in the plan: `stage:0`, `stage:3`, `stage:w2048:1`, `stage:worker:2`.
    pub work_id: String,
    /// Kind.
    pub kind: WorkItemKind,
    /// Shard (or worker) index within its group, from 0.
    pub shard_index: u32,
    /// Shards (or workers) in its group.
    pub shard_count: u32,
    /// Shard group label (e.g. `w2048`), if the stage shards over a config axis.
    pub group: Option<String>,
    /// The axis value of the group (e.g. `2048`).
    pub group_value: Option<String>,
    /// The instance (task group) that runs it.
    pub instance: u32,
}

/// The reference's name of a stage's launcher: `torchrun`, or `direct` (the command runs as
/// is, one process per task: [`TaskLauncher::Direct`] and [`TaskLauncher::Srun`]).
pub(super) fn launcher_kind(launcher: &TaskLauncher) -> &'static str {
    match launcher {
        TaskLauncher::Torchrun { .. } => "torchrun",
        _ => "direct",
    }
}

/// Where MASTER_ADDR points.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "host", rename_all = "snake_case")]
#[non_exhaustive]
pub enum MasterAddr {
    /// A fixed host (bare metal: the inventory's rendezvous host or the group's first host;
    /// local: `127.0.0.1`).
    Host(String),
    /// The first node of the group within the Slurm allocation, resolved in the job script
    /// from `$SLURM_JOB_NODELIST`.
    FirstNodeOfGroup,
}

/// The torch.distributed rendezvous of one task group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Rendezvous {
    /// `--rdzv_id`: unique per group and campaign.
    pub rdzv_id: String,
    /// MASTER_ADDR.
    pub master_addr: MasterAddr,
    /// MASTER_PORT (also the rdzv endpoint port).
    pub master_port: u16,
}

/// One task group: the processes of one instance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct TaskGroup {
    /// Instance index.
    pub instance: u32,
    /// Nodes and GPUs it uses.
    pub placement: InstancePlacement,
    /// Rendezvous, for torchrun groups.
    pub rendezvous: Option<Rendezvous>,
}

/// The task layout of one stage: its instances as task groups on nodes and GPUs, and how
/// each instance's processes start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StageLayout {
    /// Nodes requested.
    pub nodes: u32,
    /// GPUs requested per node (the most any node uses).
    pub gpus_per_node: u32,
    /// GPUs used in total.
    pub gpus: u64,
    /// Tasks (processes launched by the scheduler): one per node per instance.
    pub task_count: u32,
    /// GPUs per task.
    pub gpus_per_task: u32,
    /// Tasks per group (nodes per instance).
    pub tasks_per_group: u32,
    /// Groups (instances).
    pub group_count: u32,
    /// Whether the nodes are taken whole.
    pub exclusive: bool,
    /// How each group starts: [`TaskLauncher::Direct`] (the command as is, once; a worker that
    /// needs several processes starts them) or [`TaskLauncher::Torchrun`] (one torchrun per
    /// node, `nproc_per_node` workers each). A
    /// torchrun's `rdzv_port` here is group 0's; every group has its own in its
    /// [`Rendezvous`], which its job uses.
    pub launcher: TaskLauncher,
    /// The groups, in instance order.
    pub groups: Vec<TaskGroup>,
}

/// The work of one stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WorkPlan {
    /// Stage id.
    pub stage_id: String,
    /// Strategy.
    pub strategy: Strategy,
    /// Items, in order.
    pub items: Vec<WorkItem>,
    /// Whether shard or pool results must be merged before children start.
    pub aggregate_required: bool,
    /// Task layout.
    pub topology: StageLayout,
}

/// Inputs of [`build_work_plan`].
#[non_exhaustive]
pub(super) struct WorkPlanInput<'a> {
    /// Stage id.
    pub stage_id: &'a str,
    /// Strategy.
    pub strategy: Strategy,
    /// Instances.
    pub instances: u32,
    /// Shard groups `(label, value)`; empty for none.
    pub shard_groups: &'a [(String, String)],
    /// Name of the shard axis for errors (e.g. `embedding widths`).
    pub shard_axis_name: Option<&'a str>,
    /// Whether the catalog says results need merging.
    pub aggregate: bool,
    /// Whether instances are torch.distributed jobs.
    pub distributed: bool,
    /// Whether the worker starts its own processes (no torchrun even when distributed).
    pub direct_launch: bool,
    /// The stage's allocation.
    pub allocation: &'a GpuAllocation,
}

/// Allocates MASTER_PORTs and rendezvous addresses for groups, unique within a plan.
pub trait RendezvousAllocator {
    /// The rendezvous of the group of `instance` (placed at `placement`) of `stage_id`.
    ///
    /// # Errors
    /// [`PlanError::WorkPlan`] when ports run out.
    fn next(
        &mut self,
        stage_id: &str,
        instance: u32,
        placement: &InstancePlacement,
    ) -> Result<Rendezvous, PlanError>;
}

/// Builds a stage's [`WorkPlan`].
///
/// # Errors
/// [`PlanError::WorkPlan`] when `instances` is not divisible by the number of shard groups
/// (each group needs the same number of shards), or for a `single` stage with several
/// instances.
pub(super) fn build_work_plan(
    input: &WorkPlanInput<'_>,
    rdzv: &mut dyn RendezvousAllocator,
) -> Result<WorkPlan, PlanError> {
    let stage = input.stage_id;
    let n = input.instances;
    let mut items = Vec::with_capacity(n as usize);
    match input.strategy {
        Strategy::Single => {
            if n != 1 {
                return Err(PlanError::WorkPlan {
                    stage: stage.into(),
                    reason: format!(
                        "strategy single runs exactly one instance; got instances={n} (use sharded or persistent_pool)"
                    ),
                });
            }
            items.push(WorkItem {
                work_id: format!("{stage}:0"),
                kind: WorkItemKind::Single,
                shard_index: 0,
                shard_count: 1,
                group: None,
                group_value: None,
                instance: 0,
            });
        }
        Strategy::Sharded if !input.shard_groups.is_empty() => {
            let g = input.shard_groups.len() as u32;
            if !n.is_multiple_of(g) {
                let values: Vec<&str> =
                    input.shard_groups.iter().map(|(_, v)| v.as_str()).collect();
                return Err(PlanError::WorkPlan {
                    stage: stage.into(),
                    reason: format!(
                        "{stage} instances must be divisible by the number of {}; got instances={n}, {}=({})",
                        input.shard_axis_name.unwrap_or("shard groups"),
                        input
                            .shard_axis_name
                            .and_then(|s| s.split_whitespace().last())
                            .unwrap_or("groups"),
                        values.join(", ")
                    ),
                });
            }
            let per = n / g;
            for (gi, (label, value)) in input.shard_groups.iter().enumerate() {
                for i in 0..per {
                    items.push(WorkItem {
                        work_id: format!("{stage}:{label}:{i}"),
                        kind: WorkItemKind::Shard,
                        shard_index: i,
                        shard_count: per,
                        group: Some(label.clone()),
                        group_value: Some(value.clone()),
                        instance: gi as u32 * per + i,
                    });
                }
            }
        }
        Strategy::Sharded => {
            for i in 0..n {
                items.push(WorkItem {
                    work_id: format!("{stage}:{i}"),
                    kind: WorkItemKind::Shard,
                    shard_index: i,
                    shard_count: n,
                    group: None,
                    group_value: None,
                    instance: i,
                });
            }
        }
        Strategy::PersistentPool if !input.shard_groups.is_empty() => {
            // One pool per group (e.g. per embedding width): workers split as evenly as
            // possible, earlier groups taking the remainder (8 over 3 widths: 3, 3, 2).
            let g = input.shard_groups.len() as u32;
            if n < g {
                return Err(PlanError::WorkPlan {
                    stage: stage.into(),
                    reason: format!(
                        "{stage} needs at least one pool worker per entry of {}; got instances={n} for {g}",
                        input.shard_axis_name.unwrap_or("shard groups")
                    ),
                });
            }
            let (base, extra) = (n / g, n % g);
            let mut instance = 0;
            for (gi, (label, value)) in input.shard_groups.iter().enumerate() {
                let count = base + u32::from((gi as u32) < extra);
                for i in 0..count {
                    items.push(WorkItem {
                        work_id: format!("{stage}:{label}:worker:{i}"),
                        kind: WorkItemKind::PoolWorker,
                        shard_index: i,
                        shard_count: count,
                        group: Some(label.clone()),
                        group_value: Some(value.clone()),
                        instance,
                    });
                    instance += 1;
                }
            }
        }
        Strategy::PersistentPool => {
            for i in 0..n {
                items.push(WorkItem {
                    work_id: format!("{stage}:worker:{i}"),
                    kind: WorkItemKind::PoolWorker,
                    shard_index: i,
                    shard_count: n,
                    group: None,
                    group_value: None,
                    instance: i,
                });
            }
        }
    }
    let aggregate_required = match input.strategy {
        Strategy::Single => false,
        Strategy::Sharded => input.aggregate,
        Strategy::PersistentPool => true,
    };
    let a = input.allocation;
    let (gpus_per_task, tasks_per_group) = if a.nodes_per_instance > 1 {
        (a.gpus_per_node, a.nodes_per_instance)
    } else {
        (a.gpus_per_instance, 1)
    };
    // Pool workers are model servers that start their own processes, like `direct_launch`
    // stages (the reference's launcher choice).
    let torchrun =
        input.distributed && !input.direct_launch && input.strategy != Strategy::PersistentPool;
    let launcher_for = |port: u16| {
        if torchrun {
            TaskLauncher::Torchrun {
                nproc_per_node: gpus_per_task.max(1),
                rdzv_backend: "c10d".into(),
                rdzv_port: port,
                max_restarts: 0,
                // A stage command is an argv (`python -m ...`), not a script file.
                no_python: true,
            }
        } else {
            // The command runs as is (in Slurm: in the batch shell, so a worker that starts
            // its own processes may call srun itself; a step around it would hold the
            // allocation's CPUs and its srun would wait forever).
            TaskLauncher::Direct
        }
    };
    let mut groups = Vec::with_capacity(a.placements().len());
    for (i, p) in a.placements().iter().enumerate() {
        let rendezvous = if input.distributed {
            Some(rdzv.next(stage, i as u32, p)?)
        } else {
            None
        };
        groups.push(TaskGroup {
            instance: i as u32,
            placement: *p,
            rendezvous,
        });
    }
    let launcher = launcher_for(
        groups
            .first()
            .and_then(|g| g.rendezvous.as_ref())
            .map_or(29500, |r| r.master_port),
    );
    let topology = StageLayout {
        nodes: a.nodes,
        gpus_per_node: a.max_gpus_on_a_node(),
        gpus: a.total_gpus,
        task_count: n.saturating_mul(tasks_per_group),
        gpus_per_task,
        tasks_per_group,
        group_count: n,
        exclusive: a.exclusive,
        launcher,
        groups,
    };
    Ok(WorkPlan {
        stage_id: stage.to_string(),
        strategy: input.strategy,
        items,
        aggregate_required,
        topology,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::pack_gpu_allocation;

    struct Ports(u16);
    impl RendezvousAllocator for Ports {
        fn next(
            &mut self,
            stage_id: &str,
            instance: u32,
            _: &InstancePlacement,
        ) -> Result<Rendezvous, PlanError> {
            self.0 += 1;
            Ok(Rendezvous {
                rdzv_id: format!("{stage_id}-{instance}"),
                master_addr: MasterAddr::FirstNodeOfGroup,
                master_port: self.0,
            })
        }
    }

    #[test]
    fn sharded_over_groups_and_divisibility() {
        let alloc = pack_gpu_allocation("z", 8, 8, 8).unwrap();
        let groups = vec![
            ("w2688".to_string(), "2688".to_string()),
            ("w2560".into(), "2560".into()),
            ("w2432".into(), "2432".into()),
        ];
        let input = WorkPlanInput {
            stage_id: "zero_shot_evaluation",
            strategy: Strategy::Sharded,
            instances: 8,
            shard_groups: &groups,
            shard_axis_name: Some("embedding widths"),
            aggregate: true,
            distributed: true,
            direct_launch: false,
            allocation: &alloc,
        };
        let e = build_work_plan(&input, &mut Ports(29500)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "stage `zero_shot_evaluation`: zero_shot_evaluation instances must be divisible by the number of embedding widths; got instances=8, widths=(2688, 2560, 2432)"
        );
        let two = &groups[..2];
        let wp = build_work_plan(
            &WorkPlanInput {
                shard_groups: two,
                ..input
            },
            &mut Ports(29500),
        )
        .unwrap();
        assert_eq!(wp.items.len(), 8);
        assert_eq!(wp.items[5].work_id, "zero_shot_evaluation:w2560:1");
        assert_eq!(
            (
                wp.items[5].shard_index,
                wp.items[5].shard_count,
                wp.items[5].instance
            ),
            (1, 4, 5)
        );
        assert!(wp.aggregate_required);
        assert_eq!(
            wp.topology.launcher,
            TaskLauncher::Torchrun {
                nproc_per_node: 8,
                rdzv_backend: "c10d".into(),
                rdzv_port: 29501,
                max_restarts: 0,
                no_python: true,
            }
        );
        assert_eq!(
            wp.topology.groups[7]
                .rendezvous
                .as_ref()
                .unwrap()
                .master_port,
            29508
        );
    }

    #[test]
    fn multi_node_groups_have_one_task_per_node() {
        let alloc = pack_gpu_allocation("b", 1, 16, 8).unwrap();
        let input = WorkPlanInput {
            stage_id: "bypass",
            strategy: Strategy::Single,
            instances: 1,
            shard_groups: &[],
            shard_axis_name: None,
            aggregate: false,
            distributed: true,
            direct_launch: false,
            allocation: &alloc,
        };
        let wp = build_work_plan(&input, &mut Ports(0)).unwrap();
        let t = &wp.topology;
        assert_eq!(
            (
                t.nodes,
                t.task_count,
                t.gpus_per_task,
                t.tasks_per_group,
                t.group_count
            ),
            (2, 2, 8, 2, 1)
        );
        assert_eq!(t.launcher.name(), "torchrun");
        assert!(matches!(
            t.launcher,
            TaskLauncher::Torchrun {
                nproc_per_node: 8,
                ..
            }
        ));
        assert!(!wp.aggregate_required);
    }
}
