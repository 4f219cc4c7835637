//! The controller's in-memory view of a campaign, rebuilt from the journal: every change goes
//! through [`State::apply`] with a journal [`Entry`], both live and at replay, so what the
//! controller believes is exactly what the journal says.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use super::classify::FailureClass;
use super::journal::Entry;
use super::policy::Decision;
use crate::campaign::{CampaignPlan, Strategy};
use crate::executor::{AttemptId, JobHandle};
use crate::identity::Hash;

/// Where a unit stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnitStatus {
    Ready,
    Live,
    Done,
    Failed,
}

/// One thing to run to success: a work item (shard, single item, pool worker) or the aggregate
/// step of a sharded stage.
#[derive(Clone, Debug)]
pub(crate) struct Unit {
    pub key: String,
    pub stage: usize,
    /// Index in the stage's work items; `None` for the aggregate step.
    pub item: Option<usize>,
    pub attempts: Vec<usize>,
    pub status: UnitStatus,
    pub not_before_ms: u64,
    pub transient: u32,
    /// Transient failures that failed fast on a node (the infrastructure budget).
    pub infra: u32,
    /// Nodes of the unit's last attempt that failed fast: its later attempts avoid them.
    pub exclude: Vec<String>,
    pub oom: u32,
    pub counted: u32,
    pub next_resume: bool,
    pub next_more_resources: bool,
    pub fail_reason: Option<String>,
    pub last_class: Option<FailureClass>,
}

/// Where an attempt stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Intent recorded, no handle yet.
    Intent {
        at_ms: u64,
    },
    Live,
    Finished,
    SubmitFailed,
}

#[derive(Clone, Debug)]
pub(crate) struct Attempt {
    pub unit: usize,
    pub id: AttemptId,
    pub handle: Option<JobHandle>,
    pub phase: Phase,
    pub cancel_requested: bool,
    pub pending_since_ms: Option<u64>,
    /// When its intent was journaled (controller clock, ms): an upper bound of its run time
    /// where the executor reports no start and end.
    pub intent_ms: u64,
    /// Since when (controller clock, ms) the completed attempt's outputs are looked for
    /// again because `stat`/`readdir`/`open` did not show them (in memory only).
    pub invisible_since_ms: Option<u64>,
    /// The progress mark last seen while it ran (heartbeat timeout; in memory only: after a
    /// restart the timeout counts again from the first poll).
    pub beat: Option<Beat>,
    /// The log of a failed attempt (kept for the report; `None` for successes, to save memory).
    pub log_path: Option<PathBuf>,
}

/// A running attempt's progress mark, as last seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Beat {
    /// Highest `step N` in its logs.
    pub step: Option<u64>,
    /// Modification time of its heartbeat file (ms since the Unix epoch).
    pub file_ms: Option<u64>,
    /// When the controller saw the mark move last (controller clock, ms).
    pub moved_ms: u64,
    /// When the controller last read the logs for it (controller clock, ms).
    pub checked_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StageStatus {
    Open,
    Done,
    Failed,
    /// Not run: a manual decision upstream chose no candidate.
    Skipped,
}

#[derive(Clone, Debug)]
pub(crate) struct StageRt {
    pub id: String,
    pub parents: Vec<usize>,
    pub units: Vec<usize>,
    pub agg: Option<usize>,
    pub pool: bool,
    pub pool_filled: bool,
    pub status: StageStatus,
    pub reason: Option<String>,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    /// A manual decision stage (no units; decided by a person).
    pub decision: bool,
    /// Its `decision_needed` is journaled (announced once).
    pub decision_announced: bool,
    /// What was chosen, once decided.
    pub chosen: Option<Vec<String>>,
}

pub(crate) struct State {
    pub nonce: String,
    pub contract: Option<Hash>,
    pub revision: u32,
    pub units: Vec<Unit>,
    pub unit_index: HashMap<String, usize>,
    pub attempts: Vec<Attempt>,
    pub attempt_index: HashMap<AttemptId, usize>,
    pub stages: Vec<StageRt>,
    pub live: usize,
    /// The units (keys) with an attempt that failed fast, per node.
    pub node_failures: BTreeMap<String, BTreeSet<String>>,
    /// Nodes excluded from later submissions, with why.
    pub excluded_nodes: BTreeMap<String, String>,
}

impl State {
    pub(super) fn new(plan: &CampaignPlan) -> Self {
        let mut s = State {
            nonce: String::new(),
            contract: None,
            revision: 0,
            units: Vec::new(),
            unit_index: HashMap::new(),
            attempts: Vec::new(),
            attempt_index: HashMap::new(),
            stages: Vec::new(),
            live: 0,
            node_failures: BTreeMap::new(),
            excluded_nodes: BTreeMap::new(),
        };
        s.reset_units(plan);
        s
    }

    /// (Re)creates stages and units from the plan (a new revision starts from scratch).
    pub(super) fn reset_units(&mut self, plan: &CampaignPlan) {
        self.units.clear();
        self.unit_index.clear();
        self.stages.clear();
        let ids: HashMap<&str, usize> = plan
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| (s.stage_id.as_str(), i))
            .collect();
        for (si, st) in plan.stages.iter().enumerate() {
            // A manual decision runs nothing: no units.
            let mut units = Vec::with_capacity(st.work.items.len());
            let mut agg = None;
            for (key, item) in super::spec::stage_units(st) {
                let u = self.add_unit(key, si, item);
                match item {
                    Some(_) => units.push(u),
                    None => agg = Some(u),
                }
            }
            let completed_before = plan.completed_stages.contains(&st.stage_id);
            self.stages.push(StageRt {
                id: st.stage_id.clone(),
                parents: st
                    .parents
                    .iter()
                    .filter_map(|p| ids.get(p.as_str()).copied())
                    .collect(),
                units,
                agg,
                pool: st.work.strategy == Strategy::PersistentPool,
                pool_filled: false,
                status: if completed_before {
                    StageStatus::Done
                } else {
                    StageStatus::Open
                },
                reason: None,
                started_ms: None,
                ended_ms: None,
                decision: st.decision.is_some(),
                decision_announced: false,
                chosen: None,
            });
        }
    }

    fn add_unit(&mut self, key: String, stage: usize, item: Option<usize>) -> usize {
        let i = self.units.len();
        self.unit_index.insert(key.clone(), i);
        self.units.push(Unit {
            key,
            stage,
            item,
            attempts: Vec::new(),
            status: UnitStatus::Ready,
            not_before_ms: 0,
            transient: 0,
            infra: 0,
            exclude: Vec::new(),
            oom: 0,
            counted: 0,
            next_resume: false,
            next_more_resources: false,
            fail_reason: None,
            last_class: None,
        });
        i
    }

    pub(super) fn stage_index(&self, id: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.id == id)
    }

    /// Applies one journal entry. Returns a description of an inconsistency (an entry about an
    /// unknown unit or attempt), which the caller turns into a corrupt-journal error.
    pub(super) fn apply(
        &mut self,
        e: &Entry,
        plan: &CampaignPlan,
        at_ms: u64,
    ) -> Result<(), String> {
        match e {
            Entry::Header {
                nonce,
                contract_hash,
                ..
            } => {
                self.nonce = nonce.clone();
                self.contract = Some(*contract_hash);
            }
            Entry::Revision {
                revision,
                contract_hash,
            } => {
                self.revision = *revision;
                self.contract = Some(*contract_hash);
                self.reset_units(plan);
            }
            Entry::Intent {
                unit, attempt_id, ..
            } => {
                let u = *self
                    .unit_index
                    .get(unit)
                    .ok_or_else(|| format!("intent for unknown unit {unit}"))?;
                let a = self.attempts.len();
                self.attempts.push(Attempt {
                    unit: u,
                    id: attempt_id.clone(),
                    handle: None,
                    phase: Phase::Intent { at_ms },
                    cancel_requested: false,
                    pending_since_ms: None,
                    intent_ms: at_ms,
                    invisible_since_ms: None,
                    beat: None,
                    log_path: None,
                });
                self.attempt_index.insert(attempt_id.clone(), a);
                self.units[u].attempts.push(a);
                self.units[u].status = UnitStatus::Live;
                let st = &mut self.stages[self.units[u].stage];
                st.started_ms.get_or_insert(at_ms);
            }
            Entry::Submitted {
                attempt_id, handle, ..
            } => {
                let a = self.attempt(attempt_id)?;
                if self.attempts[a].phase != Phase::Live {
                    self.live += 1;
                }
                self.attempts[a].handle = Some(handle.clone());
                self.attempts[a].phase = Phase::Live;
            }
            Entry::SubmitFailed { attempt_id, .. } => {
                let a = self.attempt(attempt_id)?;
                self.attempts[a].phase = Phase::SubmitFailed;
                let u = self.attempts[a].unit;
                if self.units[u].status == UnitStatus::Live {
                    self.units[u].status = UnitStatus::Ready;
                }
            }
            Entry::CancelRequested { attempt_id, .. } => {
                let a = self.attempt(attempt_id)?;
                self.attempts[a].cancel_requested = true;
            }
            Entry::Finished {
                attempt_id,
                class,
                log_path,
                nodes,
                fail_fast,
                ..
            } => {
                let a = self.attempt(attempt_id)?;
                if self.attempts[a].phase == Phase::Live {
                    self.live -= 1;
                }
                self.attempts[a].phase = Phase::Finished;
                // A finished attempt is never polled again: drop what only live ones need.
                self.attempts[a].handle = None;
                self.attempts[a].beat = None;
                self.attempts[a].log_path = if class.is_some() {
                    log_path.clone()
                } else {
                    None
                };
                let by_us =
                    self.attempts[a].cancel_requested && *class == Some(FailureClass::Cancelled);
                let unit = &mut self.units[self.attempts[a].unit];
                if by_us {
                    // Cancelled by the controller (shutdown): no decision follows (journals
                    // before this rule have a `Retry` one, which ends the same way). Not a
                    // failure: ready again, with resume where the stage supports it.
                    if unit.status == UnitStatus::Live {
                        unit.status = UnitStatus::Ready;
                        unit.not_before_ms = 0;
                        unit.next_resume = plan.stages[unit.stage].worker.resumable;
                        unit.next_more_resources = false;
                    }
                    return Ok(());
                }
                unit.last_class = *class;
                match class {
                    Some(FailureClass::Transient | FailureClass::Hung) if *fail_fast => {
                        unit.infra += 1;
                        let list = crate::executor::expand_hostlist(nodes.as_deref().unwrap_or(""));
                        for n in &list {
                            self.node_failures
                                .entry(n.clone())
                                .or_default()
                                .insert(unit.key.clone());
                        }
                        unit.exclude = list;
                    }
                    Some(FailureClass::Transient | FailureClass::Hung) => unit.transient += 1,
                    Some(FailureClass::Oom) => {
                        unit.oom += 1;
                        unit.counted += 1
                    }
                    _ => unit.counted += 1,
                }
            }
            Entry::Decided {
                unit,
                decision,
                not_before_ms,
            } => {
                let u = *self
                    .unit_index
                    .get(unit)
                    .ok_or_else(|| format!("decision for unknown unit {unit}"))?;
                let unit = &mut self.units[u];
                match decision {
                    Decision::Done => unit.status = UnitStatus::Done,
                    Decision::Retry {
                        resume,
                        more_resources,
                        ..
                    } => {
                        unit.status = UnitStatus::Ready;
                        unit.not_before_ms = *not_before_ms;
                        unit.next_resume = *resume;
                        unit.next_more_resources = *more_resources;
                    }
                    Decision::Fail { reason } => {
                        unit.status = UnitStatus::Failed;
                        unit.fail_reason = Some(reason.clone());
                    }
                }
            }
            Entry::PoolFilled { stage, .. } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("pool fill of unknown stage {stage}"))?;
                self.stages[s].pool_filled = true;
            }
            Entry::StageDone { stage } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("unknown stage {stage}"))?;
                self.stages[s].status = StageStatus::Done;
                self.stages[s].ended_ms = Some(at_ms);
            }
            Entry::StageFailed { stage, reason } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("unknown stage {stage}"))?;
                self.stages[s].status = StageStatus::Failed;
                self.stages[s].reason = Some(reason.clone());
                self.stages[s].ended_ms = Some(at_ms);
            }
            Entry::DecisionNeeded { stage, .. } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("decision needed by unknown stage {stage}"))?;
                self.stages[s].decision_announced = true;
                self.stages[s].started_ms.get_or_insert(at_ms);
            }
            Entry::DecisionMade { stage, chosen } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("decision for unknown stage {stage}"))?;
                self.stages[s].chosen = Some(chosen.clone());
            }
            Entry::StageSkipped { stage, reason } => {
                let s = self
                    .stage_index(stage)
                    .ok_or_else(|| format!("unknown stage {stage}"))?;
                self.stages[s].status = StageStatus::Skipped;
                self.stages[s].reason = Some(reason.clone());
                self.stages[s].ended_ms = Some(at_ms);
            }
            Entry::NodeExcluded { node, reason } => {
                self.excluded_nodes.insert(node.clone(), reason.clone());
            }
            Entry::Event { .. } => {}
        }
        Ok(())
    }

    fn attempt(&self, id: &AttemptId) -> Result<usize, String> {
        self.attempt_index
            .get(id)
            .copied()
            .ok_or_else(|| format!("record about unknown attempt {id}"))
    }

    /// Indices of attempts with a handle and not finished.
    pub(super) fn live_attempts(&self) -> Vec<usize> {
        self.attempts
            .iter()
            .enumerate()
            .filter(|(_, a)| a.phase == Phase::Live)
            .map(|(i, _)| i)
            .collect()
    }

    /// Indices of attempts with an intent but neither handle nor failure.
    pub(super) fn unresolved_intents(&self) -> Vec<usize> {
        self.attempts
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a.phase, Phase::Intent { .. }))
            .map(|(i, _)| i)
            .collect()
    }
}
