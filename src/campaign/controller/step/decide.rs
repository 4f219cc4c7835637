//! Manual decision stages (`decide`): the loop reads the decision file, these say what it
//! means and what to do.

use std::collections::HashSet;
use std::path::Path;

use super::super::choose_revisions;
use super::super::event::ControllerEvent;
use super::super::journal::Entry;
use super::super::spec::decision_file;
use super::super::state::{StageRt, StageStatus, State};
use super::Action;
use crate::campaign::CampaignPlan;

/// Whether any parent of `s` failed, directly or through an open stage that is blocked.
pub(in crate::campaign::controller) fn blocked(state: &State, s: &StageRt) -> bool {
    s.parents.iter().any(|&p| {
        let ps = &state.stages[p];
        ps.status == StageStatus::Failed || (ps.status == StageStatus::Open && blocked(state, ps))
    })
}

/// Whether `s` is a manual decision stage whose parents are done and that waits for a person.
pub(in crate::campaign::controller) fn awaits_decision(state: &State, s: &StageRt) -> bool {
    s.decision
        && s.status == StageStatus::Open
        && s.parents
            .iter()
            .all(|&p| state.stages[p].status == StageStatus::Done)
}

/// The decision file of a stage, as the loop read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::campaign::controller) enum DecisionFile {
    /// No file (yet).
    Absent,
    /// Its content.
    Text(String),
    /// It exists but cannot be read: why.
    Unreadable(String),
}

/// The choice a decision file makes: `Ok(None)` when there is none yet, `Err` with the
/// problem (reported, and the stage keeps waiting) when its content is bad.
pub(in crate::campaign::controller) fn file_choice(
    file: &DecisionFile,
    candidates: &[String],
) -> Result<Option<Vec<String>>, String> {
    match file {
        DecisionFile::Absent => Ok(None),
        DecisionFile::Text(text) => choose_revisions(text, candidates).map(Some),
        DecisionFile::Unreadable(e) => Err(format!("cannot be read: {e}")),
    }
}

/// The report of a bad decision file, unless the same message was the last one reported
/// for the stage (`last`): reported once per message.
pub(in crate::campaign::controller) fn invalid_decision(
    last: Option<&str>,
    stage: &str,
    file: &Path,
    error: String,
) -> Option<ControllerEvent> {
    (last != Some(error.as_str())).then(|| ControllerEvent::DecisionInvalid {
        stage: stage.to_string(),
        file: file.to_path_buf(),
        error,
    })
}

/// What to do for the decision stage `si` (one that [`awaits_decision`]) given its answer
/// (`chosen`, from the file or the prompt): with one, write the selection, then journal the
/// decision, the stage's end and (for `none`) the skipped descendants in one append; without
/// one, announce once that a decision is needed (the `decisions/` folder made first).
pub(in crate::campaign::controller) fn decision_actions(
    state: &State,
    plan: &CampaignPlan,
    dir: &Path,
    si: usize,
    chosen: Option<Vec<String>>,
) -> Vec<Action> {
    let Some(d) = plan.stages[si].decision.as_ref() else {
        return Vec::new();
    };
    let stage = state.stages[si].id.clone();
    let Some(chosen) = chosen else {
        if state.stages[si].decision_announced {
            return Vec::new();
        }
        let file = decision_file(dir, &stage);
        let mut actions = Vec::new();
        if let Some(parent) = file.parent() {
            actions.push(Action::MakeDecisionDir(parent.to_path_buf()));
        }
        actions.push(Action::Notify(ControllerEvent::DecisionNeeded {
            stage: stage.clone(),
            file: file.clone(),
            candidates: d.candidates.clone(),
        }));
        actions.push(Action::Journal(vec![Entry::DecisionNeeded {
            stage,
            file,
            candidates: d.candidates.clone(),
        }]));
        return actions;
    };
    let body = serde_json::json!({
        "stage": stage,
        "input": d.input,
        "candidates": d.candidates,
        "chosen": chosen,
    });
    let skipped = if chosen.is_empty() {
        descendants(state, si)
    } else {
        Vec::new()
    };
    let mut entries = vec![
        Entry::DecisionMade {
            stage: stage.clone(),
            chosen: chosen.clone(),
        },
        Entry::StageDone {
            stage: stage.clone(),
        },
    ];
    entries.extend(skipped.iter().map(|s| Entry::StageSkipped {
        stage: s.clone(),
        reason: format!("the manual decision {stage} chose none"),
    }));
    vec![
        Action::WriteSelection {
            stage: stage.clone(),
            body,
        },
        Action::Notify(ControllerEvent::DecisionMade {
            stage: stage.clone(),
            chosen,
            skipped,
        }),
        Action::Notify(ControllerEvent::StageDone { stage }),
        Action::Journal(entries),
    ]
}

/// Open stages that depend on stage `si`, directly or not, in plan order.
pub(in crate::campaign::controller) fn descendants(state: &State, si: usize) -> Vec<String> {
    let mut below: HashSet<usize> = HashSet::from([si]);
    let mut out = Vec::new();
    // Plan order is topological: parents come before their children.
    for (i, s) in state.stages.iter().enumerate().skip(si + 1) {
        if s.parents.iter().any(|p| below.contains(p)) {
            below.insert(i);
            if s.status == StageStatus::Open {
                out.push(s.id.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn file_choice_reads_all_numbers_and_problems() {
        let c: Vec<String> = vec!["a:0".into(), "a:1".into(), "a:2".into()];
        assert_eq!(file_choice(&DecisionFile::Absent, &c), Ok(None));
        assert_eq!(
            file_choice(&DecisionFile::Text("all\n".into()), &c),
            Ok(Some(c.clone()))
        );
        assert_eq!(
            file_choice(&DecisionFile::Text("1 3".into()), &c),
            Ok(Some(vec!["a:0".into(), "a:2".into()]))
        );
        assert_eq!(
            file_choice(&DecisionFile::Text("none".into()), &c),
            Ok(Some(vec![]))
        );
        assert!(file_choice(&DecisionFile::Text("7".into()), &c).is_err());
        assert_eq!(
            file_choice(&DecisionFile::Unreadable("EACCES".into()), &c),
            Err("cannot be read: EACCES".into())
        );
    }

    #[test]
    fn a_bad_file_is_reported_once_per_message() {
        let f = Path::new("/c/decisions/pick.txt");
        assert_eq!(
            invalid_decision(None, "pick", f, "bad".into()),
            Some(ControllerEvent::DecisionInvalid {
                stage: "pick".into(),
                file: f.to_path_buf(),
                error: "bad".into(),
            })
        );
        assert_eq!(invalid_decision(Some("bad"), "pick", f, "bad".into()), None);
        assert!(invalid_decision(Some("bad"), "pick", f, "worse".into()).is_some());
    }

    #[test]
    fn a_decision_waits_for_its_parents() {
        let p = decision_plan();
        let s = state_after(&p, &[]);
        assert!(!awaits_decision(&s, &s.stages[si(&s, "pick")]));
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        assert!(awaits_decision(&s, &s.stages[si(&s, "pick")]));
        assert!(
            !awaits_decision(&s, &s.stages[si(&s, "c")]),
            "not a decision"
        );
        let s = state_after(
            &p,
            &[Entry::StageFailed {
                stage: "a".into(),
                reason: "x".into(),
            }],
        );
        assert!(!awaits_decision(&s, &s.stages[si(&s, "pick")]));
        assert!(
            blocked(&s, &s.stages[si(&s, "d")]),
            "blocked through pick, c"
        );
        assert!(!blocked(&s, &s.stages[si(&s, "b")]));
    }

    #[test]
    fn no_answer_announces_once() {
        let p = decision_plan();
        let dir = Path::new("/c");
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let file = decision_file(dir, "pick");
        let candidates: Vec<String> = vec!["a:0".into(), "a:1".into(), "a:2".into()];
        assert_eq!(
            decision_actions(&s, &p, dir, si(&s, "pick"), None),
            vec![
                Action::MakeDecisionDir(file.parent().unwrap().to_path_buf()),
                Action::Notify(ControllerEvent::DecisionNeeded {
                    stage: "pick".into(),
                    file: file.clone(),
                    candidates: candidates.clone(),
                }),
                Action::Journal(vec![Entry::DecisionNeeded {
                    stage: "pick".into(),
                    file: file.clone(),
                    candidates: candidates.clone(),
                }]),
            ]
        );
        let s = state_after(
            &p,
            &[
                Entry::StageDone { stage: "a".into() },
                Entry::DecisionNeeded {
                    stage: "pick".into(),
                    file,
                    candidates,
                },
            ],
        );
        assert_eq!(decision_actions(&s, &p, dir, si(&s, "pick"), None), vec![]);
    }

    #[test]
    fn a_file_present_advances_the_stage() {
        let p = decision_plan();
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let chosen = vec!["a:0".to_string(), "a:2".to_string()];
        let actions = decision_actions(
            &s,
            &p,
            Path::new("/c"),
            si(&s, "pick"),
            Some(chosen.clone()),
        );
        assert_eq!(
            actions,
            vec![
                Action::WriteSelection {
                    stage: "pick".into(),
                    body: serde_json::json!({
                        "stage": "pick",
                        "input": "a",
                        "candidates": ["a:0", "a:1", "a:2"],
                        "chosen": ["a:0", "a:2"],
                    }),
                },
                Action::Notify(ControllerEvent::DecisionMade {
                    stage: "pick".into(),
                    chosen: chosen.clone(),
                    skipped: vec![],
                }),
                Action::Notify(ControllerEvent::StageDone {
                    stage: "pick".into()
                }),
                Action::Journal(vec![
                    Entry::DecisionMade {
                        stage: "pick".into(),
                        chosen,
                    },
                    Entry::StageDone {
                        stage: "pick".into()
                    },
                ]),
            ]
        );
    }

    #[test]
    fn choosing_none_skips_every_open_descendant() {
        let p = decision_plan();
        let s = state_after(&p, &[Entry::StageDone { stage: "a".into() }]);
        let actions = decision_actions(&s, &p, Path::new("/c"), si(&s, "pick"), Some(vec![]));
        let Some(Action::Journal(entries)) = actions.last() else {
            panic!("no journal action: {actions:?}");
        };
        assert_eq!(
            entries[2..],
            [
                Entry::StageSkipped {
                    stage: "c".into(),
                    reason: "the manual decision pick chose none".into(),
                },
                Entry::StageSkipped {
                    stage: "d".into(),
                    reason: "the manual decision pick chose none".into(),
                },
            ]
        );
        assert_eq!(descendants(&s, si(&s, "a")), ["pick", "c", "d"]);
    }
}
