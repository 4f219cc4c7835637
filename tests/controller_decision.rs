//! Manual decision stages (post-MIP filters with `mode: manual`) on the mock executor with a
//! virtual clock: off a terminal the campaign waits for the decision file (other stages go
//! on), a bad file is reported once and the stage keeps waiting, a good one lets it continue,
//! the journal keeps the decision across a restart, a prompt answers instead of the file, and
//! `none` skips the flow below the decision.

mod support;
use support::plan::PlanBuilder;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use puzzletron::campaign::controller::{
    CampaignController, CampaignControllerBuilder, ControllerEvent, DecisionPrompt, RetryPolicy,
    RunOptions, VirtualClock,
};
use puzzletron::campaign::{CampaignPlan, ManualDecision};
use puzzletron::executor::{MockCall, MockClock, MockExecutor, MockScript};
use serde_json::json;

/// a (3 shards) -> pick (manual decision over a's items) -> c; b independent.
fn decision_plan() -> CampaignPlan {
    let mut plan = PlanBuilder::stages(json!([
        {"id": "a", "strategy": "sharded", "instances": 3, "command": ["w"]},
        {"id": "pick", "needs": ["a"], "command": ["w"]},
        {"id": "c", "needs": ["pick"], "command": ["w"]},
        {"id": "b", "command": ["w"]},
    ]))
    .build();
    let candidates: Vec<String> = plan
        .stage("a")
        .unwrap()
        .work
        .items
        .iter()
        .map(|i| i.work_id.clone())
        .collect();
    assert_eq!(candidates, ["a:0", "a:1", "a:2"]);
    let i = plan
        .stages
        .iter()
        .position(|s| s.stage_id == "pick")
        .unwrap();
    plan.stages[i].decision = Some(ManualDecision::new("a", candidates));
    plan
}

struct Sim {
    mock: MockExecutor,
    clock: MockClock,
}

fn sim() -> Sim {
    let clock = MockClock::new();
    let mock = MockExecutor::with_clock(clock.clone())
        .with_default_script(|_| MockScript::completes_after(Duration::from_secs(5)));
    Sim { mock, clock }
}

type Events = Arc<Mutex<Vec<ControllerEvent>>>;

fn controller(s: &Sim, dir: &Path, events: &Events) -> CampaignControllerBuilder {
    let ev = events.clone();
    CampaignController::builder()
        .require_success_marker(false)
        .plan(decision_plan())
        .executor(Arc::new(s.mock.clone()))
        .campaign_dir(dir)
        .clock(Arc::new(VirtualClock::new(s.clock.clone())))
        .poll_interval(Duration::from_secs(1), Duration::from_secs(1))
        .retry_policy(RetryPolicy::default().with_jitter(0.0))
        .on_event(move |e| ev.lock().unwrap().push(e.clone()))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn iterations(n: u64) -> RunOptions {
    RunOptions::default().with_max_iterations(Some(n))
}

/// Stages submitted, in order, one entry per attempt (`a`, `a`, `a`, `b`, `c`).
fn submitted_stages(m: &MockExecutor) -> Vec<String> {
    m.calls()
        .iter()
        .filter_map(|c| match c {
            MockCall::Submit {
                attempt_id,
                job_id: Some(_),
                ..
            } => Some(attempt_id.as_str().split('.').nth(1).unwrap().to_string()),
            _ => None,
        })
        .collect()
}

fn journal_kinds(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("controller/journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let e = &v["entry"];
            match e["t"].as_str().unwrap() {
                "event" => format!("event:{}", e["kind"].as_str().unwrap()),
                t => t.to_string(),
            }
        })
        .collect()
}

fn count(v: &[String], k: &str) -> usize {
    v.iter().filter(|x| *x == k).count()
}

#[test]
fn off_a_terminal_the_campaign_waits_for_the_decision_file_and_keeps_it_across_restarts() {
    let s = sim();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let events: Events = Arc::default();
    let file = dir
        .canonicalize()
        .unwrap_or_else(|_| dir.to_path_buf())
        .join("decisions/pick.txt");

    // 1. No answer: a and b run, pick waits (announced once), c does not start.
    {
        let mut ctl = controller(&s, dir, &events).build().unwrap();
        let file = ctl.campaign_dir().join("decisions/pick.txt");
        let report = rt().block_on(ctl.run(iterations(40))).unwrap();
        assert!(!report.is_complete(), "{report}");
        assert_eq!(report.completed, ["a", "b"]);
        assert_eq!(report.unfinished, ["pick", "c"]);
        assert_eq!(report.decisions.len(), 1);
        assert_eq!(report.decisions[0].stage, "pick");
        assert_eq!(report.decisions[0].file, file);
        assert_eq!(report.decisions[0].candidates, ["a:0", "a:1", "a:2"]);
        let status = |id: &str| {
            report
                .stages
                .iter()
                .find(|p| p.stage == id)
                .unwrap()
                .status
                .clone()
        };
        assert_eq!(status("pick"), "decision");
        assert_eq!(status("c"), "waiting");
        assert!(
            report.to_string().contains(&format!(
                "DECISION NEEDED for pick: write {}",
                file.display()
            )),
            "{report}"
        );
        assert_eq!(submitted_stages(&s.mock), ["a", "a", "a", "b"]);
    }
    let needed: Vec<ControllerEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind() == "decision_needed")
        .cloned()
        .collect();
    assert_eq!(needed.len(), 1, "announced once over 40 iterations");
    match &needed[0] {
        ControllerEvent::DecisionNeeded {
            stage,
            file: f,
            candidates,
        } => {
            assert_eq!(stage, "pick");
            assert!(f.ends_with("decisions/pick.txt"), "{f:?}");
            assert_eq!(candidates.len(), 3);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(count(&journal_kinds(dir), "decision_needed"), 1);

    // 2. A bad file: reported once (file, bad token, valid choices), the stage keeps waiting;
    // a restart does not announce the decision again.
    std::fs::create_dir_all(dir.join("decisions")).unwrap();
    std::fs::write(dir.join("decisions/pick.txt"), "2 a:9\n").unwrap();
    events.lock().unwrap().clear();
    {
        let mut ctl = controller(&s, dir, &events).build().unwrap();
        let report = rt().block_on(ctl.run(iterations(10))).unwrap();
        assert_eq!(report.unfinished, ["pick", "c"]);
        assert_eq!(report.decisions.len(), 1);
    }
    let evs = events.lock().unwrap().clone();
    let invalid: Vec<String> = evs
        .iter()
        .filter(|e| e.kind() == "decision_invalid")
        .map(|e| e.to_string())
        .collect();
    assert_eq!(invalid.len(), 1, "reported once: {invalid:?}");
    assert!(
        invalid[0].contains(&file.display().to_string())
            && invalid[0].contains("\"a:9\"")
            && invalid[0].contains("a:0, a:1, a:2")
            && invalid[0].contains("still waiting"),
        "{}",
        invalid[0]
    );
    assert!(evs.iter().all(|e| e.kind() != "decision_needed"));
    assert_eq!(submitted_stages(&s.mock), ["a", "a", "a", "b"]);

    // 3. A good file: decided, written, journaled; c runs and the campaign completes.
    std::fs::write(dir.join("decisions/pick.txt"), "a:2, 1").unwrap();
    events.lock().unwrap().clear();
    {
        let mut ctl = controller(&s, dir, &events).build().unwrap();
        let report = rt().block_on(ctl.run(iterations(100))).unwrap();
        assert!(report.is_complete(), "{report}");
        assert!(report.decisions.is_empty());
    }
    assert_eq!(submitted_stages(&s.mock), ["a", "a", "a", "b", "c"]);
    let sel: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("work/pick/0/selected.json")).unwrap())
            .unwrap();
    assert_eq!(sel["chosen"], json!(["a:0", "a:2"]));
    assert_eq!(sel["input"], "a");
    assert_eq!(sel["candidates"], json!(["a:0", "a:1", "a:2"]));
    let made: Vec<ControllerEvent> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind() == "decision_made")
        .cloned()
        .collect();
    assert_eq!(
        made,
        [ControllerEvent::DecisionMade {
            stage: "pick".into(),
            chosen: vec!["a:0".into(), "a:2".into()],
            skipped: vec![],
        }]
    );
    let kinds = journal_kinds(dir);
    let at = kinds.iter().position(|k| k == "decision_made").unwrap();
    assert_eq!(
        kinds[at + 1],
        "stage_done",
        "journaled with the stage's end"
    );
    // The decision stage has no attempt.
    let j = std::fs::read_to_string(dir.join("controller/journal.jsonl")).unwrap();
    assert!(
        !j.contains("\"unit\":\"pick/"),
        "no unit of pick is ever submitted"
    );

    // 4. Restart with the file removed: the journal has the decision; nothing is asked again.
    std::fs::remove_file(dir.join("decisions/pick.txt")).unwrap();
    events.lock().unwrap().clear();
    {
        let mut ctl = controller(&s, dir, &events).build().unwrap();
        let report = rt().block_on(ctl.run(iterations(10))).unwrap();
        assert!(report.is_complete(), "{report}");
        assert_eq!(report.completed, ["a", "pick", "c", "b"]);
    }
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .all(|e| !e.kind().starts_with("decision"))
    );
    assert_eq!(count(&journal_kinds(dir), "decision_made"), 1);
    assert_eq!(submitted_stages(&s.mock), ["a", "a", "a", "b", "c"]);
}

/// A prompt that answers from a script and records what it was asked.
struct Scripted {
    answers: Mutex<Vec<Option<Vec<String>>>>,
    asked: Mutex<Vec<(String, Vec<String>)>>,
}

impl DecisionPrompt for Scripted {
    fn ask(&self, stage: &str, candidates: &[String], _file: &Path) -> Option<Vec<String>> {
        self.asked
            .lock()
            .unwrap()
            .push((stage.to_string(), candidates.to_vec()));
        let mut a = self.answers.lock().unwrap();
        if a.is_empty() { None } else { a.remove(0) }
    }
}

/// A controller over a fresh folder whose prompt gives `answers` in turn.
fn prompted(
    answers: Vec<Option<Vec<String>>>,
) -> (tempfile::TempDir, Events, Arc<Scripted>, CampaignController) {
    let s = sim();
    let tmp = tempfile::tempdir().unwrap();
    let events: Events = Arc::default();
    let prompt = Arc::new(Scripted {
        answers: Mutex::new(answers),
        asked: Mutex::default(),
    });
    let ctl = controller(&s, tmp.path(), &events)
        .decision_prompt(prompt.clone())
        .build()
        .unwrap();
    (tmp, events, prompt, ctl)
}

#[test]
fn a_prompt_answers_instead_of_the_file_and_an_unanswered_one_falls_back_to_it() {
    // Answered: no decision_needed, c runs with the choice.
    let (tmp, events, prompt, mut ctl) = prompted(vec![Some(vec!["a:1".into()])]);
    let report = rt().block_on(ctl.run(iterations(100))).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(
        *prompt.asked.lock().unwrap(),
        [(
            "pick".to_string(),
            vec!["a:0".to_string(), "a:1".into(), "a:2".into()]
        )]
    );
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.kind() != "decision_needed")
    );
    let sel: serde_json::Value = serde_json::from_slice(
        &std::fs::read(tmp.path().join("work/pick/0/selected.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(sel["chosen"], json!(["a:1"]));

    // No answer (end of input): asked once, then the decision file as off a terminal.
    let (tmp, events, prompt, mut ctl) = prompted(vec![None]);
    let report = rt().block_on(ctl.run(iterations(30))).unwrap();
    assert_eq!(report.decisions.len(), 1);
    assert_eq!(prompt.asked.lock().unwrap().len(), 1, "asked once");
    assert_eq!(
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.kind() == "decision_needed")
            .count(),
        1
    );
    std::fs::create_dir_all(tmp.path().join("decisions")).unwrap();
    std::fs::write(tmp.path().join("decisions/pick.txt"), "all\n").unwrap();
    let report = rt().block_on(ctl.run(iterations(100))).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(prompt.asked.lock().unwrap().len(), 1, "never asked again");
}

#[test]
fn choosing_none_skips_the_stages_below_the_decision_and_completes() {
    let s = sim();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("decisions")).unwrap();
    // Written before the run: used without announcing anything.
    std::fs::write(dir.join("decisions/pick.txt"), "none\n").unwrap();
    let events: Events = Arc::default();
    let mut ctl = controller(&s, dir, &events).build().unwrap();
    let report = rt().block_on(ctl.run(iterations(100))).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(report.completed, ["a", "pick", "b"]);
    assert_eq!(report.skipped, ["c"]);
    assert!(
        report
            .to_string()
            .contains("skipped (a manual decision chose none): c")
    );
    assert_eq!(
        submitted_stages(&s.mock),
        ["a", "a", "a", "b"],
        "c never runs"
    );
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .all(|e| e.kind() != "decision_needed")
    );
    let sel: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("work/pick/0/selected.json")).unwrap())
            .unwrap();
    assert_eq!(sel["chosen"], json!([]));
    drop(ctl);
    // After a restart the skip holds.
    let mut ctl = controller(&s, dir, &events).build().unwrap();
    let report = rt().block_on(ctl.run(iterations(5))).unwrap();
    assert!(report.is_complete(), "{report}");
    assert_eq!(report.skipped, ["c"]);
    assert_eq!(submitted_stages(&s.mock), ["a", "a", "a", "b"]);
    // The read-only history agrees.
    let h = puzzletron::report::CampaignHistory::load(dir, false).unwrap();
    let st = |id: &str| h.stages.iter().find(|s| s.id == id).unwrap();
    assert_eq!(st("c").status.as_str(), "skipped");
    assert_eq!(st("pick").status.as_str(), "done");
    assert_eq!(st("pick").chosen, Some(vec![]));
    assert_eq!(st("pick").units, 0);
    assert!(h.finished);
}
