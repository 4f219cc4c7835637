//! Table-driven tests of the sbatch/squeue/sacct parsers and the state mapping, one row per
//! real output form; cases C01–C19 of `docs/evidence.md` are named in the rows.

use super::parse::*;
use crate::executor::JobState;

fn r(id: u64) -> JobRef {
    JobRef::new(id)
}

fn rc(id: u64, c: &str) -> JobRef {
    JobRef::new(id).with_cluster(c)
}

#[test]
fn sbatch_output_forms() {
    // (case, stdout, stderr, expected)
    let ok: &[(&str, &str, &str, JobRef)] = &[
        ("parsable", "4711\n", "", r(4711)),
        (
            "C01 cluster suffix",
            "4711;clusterA\n",
            "",
            rc(4711, "clusterA"),
        ),
        ("C02 human", "Submitted batch job 4711\n", "", r(4711)),
        (
            "C02 human with cluster",
            "Submitted batch job 4711 on cluster clusterA\n",
            "",
            rc(4711, "clusterA"),
        ),
        ("C02 site wrapper bare id", "4711", "", r(4711)),
        (
            "C03 banner then id, stderr noise",
            "INFO: jobs over 128 GB need a larger node\n4711\n",
            "sbatch: no partition specified, using default partition p1\nsbatch: error: Slurm temporarily unable to accept job, sleeping and retrying\n",
            r(4711),
        ),
        ("trailing blank lines", "4711\n\n\n", "", r(4711)),
        ("CRLF", "4711\r\n", "", r(4711)),
    ];
    for (case, out, err, want) in ok {
        assert_eq!(&parse_sbatch(out, err).unwrap(), want, "{case}");
    }
    let bad: &[(&str, &str)] = &[
        ("C02 word, not id", "sbatch: will submit later\n"),
        ("empty", ""),
        ("non-numeric id", "abc;clusterA\n"),
        ("negative", "-5\n"),
        ("cluster with space", "4711;cluster A\n"),
    ];
    for (case, out) in bad {
        let e = parse_sbatch(out, "some stderr").unwrap_err().to_string();
        assert!(
            e.contains("no job id") && e.contains("some stderr"),
            "{case}: {e}"
        );
    }
}

#[test]
fn error_classes() {
    use ErrorClass::*;
    let table: &[(&str, &str, ErrorClass)] = &[
        (
            "C04/C05",
            "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
            Transient,
        ),
        (
            "C05",
            "sbatch: error: Batch job submission failed: Unexpected message received",
            Transient,
        ),
        (
            "C05",
            "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
            Transient,
        ),
        (
            "issue",
            "squeue: error: Unable to contact slurm controller (connect failure)",
            Transient,
        ),
        (
            "C16",
            "slurm_load_jobs error: Socket timed out on send/recv operation",
            Transient,
        ),
        (
            "issue",
            "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
            Transient,
        ),
        ("issue", "sbatch: error: Connection refused", Transient),
        (
            "C05 throttle",
            "sbatch: error: QOSMaxSubmitJobPerUserLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
            Throttle,
        ),
        (
            "C05 fatal",
            "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            Fatal,
        ),
        (
            "C05 fatal",
            "sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
            Fatal,
        ),
        (
            "C05 fatal",
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
            Fatal,
        ),
        (
            "C05 fatal",
            "sbatch: error: Illegal character in job name",
            Fatal,
        ),
        (
            "C05 unknown is fatal",
            "sbatch: error: something nobody has seen",
            Fatal,
        ),
        (
            "C15",
            "slurm_load_jobs error: Invalid job id specified",
            InvalidJobId,
        ),
        (
            "C18",
            "sacct: error: Slurm accounting storage is disabled",
            AccountingDisabled,
        ),
        (
            "N02 slurmdbd refused",
            "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent connection to host:dbhost:6819: Connection refused\nsacct: error: Problem talking to the database: Connection refused",
            AccountingUnavailable,
        ),
        (
            "N02 no route",
            "sacct: error: Problem talking to the database: No route to host",
            AccountingUnavailable,
        ),
        (
            "N02 unknown error 1021",
            "sacct: error: slurmdbd: Unknown error 1021",
            AccountingUnavailable,
        ),
        (
            "N02 is not a busy slurmctld",
            "squeue: error: Unable to contact slurm controller (connect failure)",
            Transient,
        ),
    ];
    for (case, stderr, want) in table {
        assert_eq!(classify_error(stderr), *want, "{case}: {stderr}");
    }
}

#[test]
fn state_mapping_every_form() {
    use JobState::*;
    let table: &[(&str, JobState)] = &[
        ("PENDING", Pending),
        ("PD", Pending),
        ("RUNNING", Running),
        ("R", Running),
        ("COMPLETING", Completing),
        ("CG", Completing),
        ("COMPLETED", Completed),
        ("CD", Completed),
        ("FAILED", Failed),
        ("F", Failed),
        ("CANCELLED", Cancelled { by_uid: None }),
        ("CA", Cancelled { by_uid: None }),
        ("CANCELLED by 0", Cancelled { by_uid: Some(0) }),
        (
            "CANCELLED by 12345",
            Cancelled {
                by_uid: Some(12345),
            },
        ), // C07
        ("CANCELLED+", Cancelled { by_uid: None }), // C08
        ("TIMEOUT", Timeout),
        ("TO", Timeout),
        ("OUT_OF_MEMORY", OutOfMemory),
        ("OOM", OutOfMemory),
        ("OUT_OF_ME+", OutOfMemory),
        ("NODE_FAIL", NodeFail),
        ("NF", NodeFail),
        ("PREEMPTED", Preempted),
        ("PR", Preempted),
        ("BOOT_FAIL", BootFail),
        ("BF", BootFail),
        ("DEADLINE", Deadline),
        ("DL", Deadline),
        ("REQUEUED", Requeued),
        ("RQ", Requeued),
        ("SUSPENDED", Suspended),
        ("S", Suspended),
        // C13
        ("CF", Pending),
        ("CONFIGURING", Pending),
        ("SI", Completing),
        ("STAGE_OUT", Completing),
        ("SO", Completing),
        ("REQUEUE_HOLD", Pending),
        ("SPECIAL_EXIT", Failed),
        ("  RUNNING  ", Running),
    ];
    for (raw, want) in table {
        assert_eq!(&map_state(raw), want, "{raw:?}");
    }
    let unknown = map_state("FOO");
    assert_eq!(unknown, Unknown { raw: "FOO".into() });
    assert!(
        !unknown.is_terminal(),
        "C13: unknown is re-polled, never completion"
    );
    assert!(!map_state("CG").is_terminal(), "C13: CG is not terminal");
    assert!(
        matches!(map_state("CO+"), Unknown { .. }),
        "ambiguous truncation"
    );
}

#[test]
fn exit_codes_c10() {
    type Row<'a> = (&'a str, Option<(i32, Option<i32>)>);
    let table: &[Row] = &[
        ("0:0", Some((0, None))),
        ("1:0", Some((1, None))),
        ("0:9", Some((0, Some(9)))),
        ("0:15", Some((0, Some(15)))),
        ("137:0", Some((137, None))),
        ("255:0", Some((255, None))),
        ("0:125", Some((0, Some(125)))),
        ("", None),
    ];
    for (f, want) in table {
        let got = parse_exit_code(f).unwrap().map(|e| (e.code, e.signal));
        assert_eq!(&got, want, "{f:?}");
    }
    let note = parse_exit_code("137:0").unwrap().unwrap().note().unwrap();
    assert!(note.contains("likely SIGKILL"), "{note}");
    for bad in ["garbage", "1", "1:x", "-1:0", "256:0"] {
        let e = parse_exit_code(bad).unwrap_err().to_string();
        assert!(e.contains("N:S"), "{bad}: {e}");
    }
}

#[test]
fn id_fields() {
    let one = |s: &str| match parse_id_field(s).unwrap() {
        IdField::One { job, step } => (job, step),
        other => panic!("{s}: {other:?}"),
    };
    assert_eq!(one("4711"), (r(4711), None));
    assert_eq!(one("4711.batch"), (r(4711), Some("batch".into())));
    assert_eq!(one("4711.extern"), (r(4711), Some("extern".into())));
    assert_eq!(one("4711.0"), (r(4711), Some("0".into())));
    assert_eq!(one("5000_2"), (JobRef::task(5000, 2), None));
    assert_eq!(
        one("5000_2.batch"),
        (JobRef::task(5000, 2), Some("batch".into()))
    );
    let het = r(21).with_het_component(1);
    assert_eq!(one("21+1"), (het, None));
    assert_eq!(
        parse_id_field("5000_[3-10%2]").unwrap(),
        IdField::PendingArray {
            id: 5000,
            tasks: (3..=10).collect(),
            max_running: Some(2)
        }
    );
    assert_eq!(
        parse_id_field("5000_[1,4-6]").unwrap(),
        IdField::PendingArray {
            id: 5000,
            tasks: vec![1, 4, 5, 6],
            max_running: None
        }
    );
    for bad in ["4711.ba+", "abc", "", "12_x", "5000_[5-3]", "4711."] {
        assert!(parse_id_field(bad).is_err(), "{bad}");
    }
    let e = parse_id_field("4711.ba+").unwrap_err().to_string();
    assert!(e.contains("truncated"), "C08: {e}");
}

#[test]
fn squeue_rows_c11_c13_c14_c16() {
    let out = "5000_[3-10%2]|PENDING|JobArrayTaskLimit|\n5000_1|RUNNING|None|n1\n5000_2|COMPLETED|None|n2\n4711|PENDING|Priority|\n4712|CG|None|n3\n4713|COMPLETING|None|n[1-2]\n";
    let rows = parse_squeue(out).unwrap();
    // C11: 8 pending tasks + 1 + 1, then 3 plain jobs
    assert_eq!(rows.len(), 13);
    let pending: Vec<u32> = rows
        .iter()
        .filter(|r| r.job.id == 5000 && r.state == JobState::Pending)
        .map(|r| r.job.array_task.unwrap())
        .collect();
    assert_eq!(pending, (3..=10).collect::<Vec<_>>());
    assert!(
        rows[..8]
            .iter()
            .all(|r| r.max_running == Some(2) && r.reason.as_deref() == Some("JobArrayTaskLimit"))
    );
    assert_eq!(rows[8].job, JobRef::task(5000, 1));
    assert_eq!(
        (
            rows[8].state.clone(),
            rows[8].nodes.as_deref(),
            rows[8].reason.as_deref()
        ),
        (JobState::Running, Some("n1"), None)
    );
    assert_eq!(rows[9].state, JobState::Completed);
    assert_eq!(
        (rows[10].job.id, rows[10].reason.as_deref()),
        (4711, Some("Priority"))
    );
    assert_eq!(rows[11].state, JobState::Completing);
    assert_eq!(rows[12].nodes.as_deref(), Some("n[1-2]"));
    // Two-field form (lookup by name) and empty output (C14: nothing known yet).
    assert_eq!(parse_squeue("4711|PENDING\n").unwrap()[0].job, r(4711));
    assert!(parse_squeue("").unwrap().is_empty());
    let e = parse_squeue("4711\n").unwrap_err().to_string();
    assert!(e.contains("line 1"), "{e}");
}

#[test]
fn sacct_rows_c07_c09_c11_c12_c24() {
    // C09: allocation row decides; steps are details.
    let out = "4711|TIMEOUT|0:0\n4711.batch|CANCELLED|0:15\n4711.extern|COMPLETED|0:0\n4712|NODE_FAIL|1:0|node07\n4712.batch|CANCELLED|0:15\n";
    let recs = parse_sacct(out).unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].job, r(4711));
    assert_eq!(recs[0].state, JobState::Timeout);
    assert_eq!(
        recs[0].steps.keys().collect::<Vec<_>>(),
        ["batch", "extern"]
    );
    assert_eq!(
        recs[0].steps["batch"].state,
        JobState::Cancelled { by_uid: None }
    );
    assert_eq!(recs[0].steps["batch"].exit.unwrap().signal, Some(15));
    assert_eq!(recs[1].state, JobState::NodeFail);
    assert_eq!(recs[1].nodes.as_deref(), Some("node07"));
    assert_eq!(recs[1].exit.unwrap().code, 1);

    // C07
    let rec = &parse_sacct("4711|CANCELLED by 12345|0:15\n").unwrap()[0];
    assert_eq!(
        rec.state,
        JobState::Cancelled {
            by_uid: Some(12345)
        }
    );
    assert!(rec.state.is_terminal());

    // C24: requeued three times under one id, newest row wins.
    let out = "4711|REQUEUED|0:0\n4711|REQUEUED|0:0\n4711|REQUEUED|0:0\n4711|COMPLETED|0:0\n4711.batch|COMPLETED|0:0\n";
    let recs = parse_sacct(out).unwrap();
    assert_eq!(recs.len(), 1);
    assert_eq!(
        (recs[0].state.clone(), recs[0].restarts),
        (JobState::Completed, 3)
    );

    // Array tasks (C11) and a pending range in sacct.
    let out = "5000_0|COMPLETED|0:0\n5000_0.batch|COMPLETED|0:0\n5000_1|FAILED|3:0\n5000_[2-3]|PENDING|0:0\n";
    let recs = parse_sacct(out).unwrap();
    let got: Vec<(JobRef, JobState)> = recs
        .iter()
        .map(|r| (r.job.clone(), r.state.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (JobRef::task(5000, 0), JobState::Completed),
            (JobRef::task(5000, 1), JobState::Failed),
            (JobRef::task(5000, 2), JobState::Pending),
            (JobRef::task(5000, 3), JobState::Pending),
        ]
    );
    assert_eq!(recs[1].exit.unwrap().code, 3);

    // C12: het job components, parsed per component.
    let recs = parse_sacct("21+0|RUNNING|0:0\n21+0.batch|RUNNING|0:0\n21+1|PENDING|0:0\n").unwrap();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].job.het_component, Some(0));
    assert_eq!(recs[1].job.het_component, Some(1));
    assert_eq!(
        (recs[0].state.clone(), recs[1].state.clone()),
        (JobState::Running, JobState::Pending)
    );

    // C20 form and extra fields; Unknown/None fields are absent.
    let rec = &parse_sacct("4711|OUT_OF_MEMORY|0:125|n1|2026-01-01T10:00:00|Unknown\n").unwrap()[0];
    assert_eq!(rec.state, JobState::OutOfMemory);
    assert_eq!(
        (rec.start.as_deref(), rec.end.as_deref()),
        (Some("2026-01-01T10:00:00"), None)
    );
    // C14: empty answer is no records, not an error.
    assert!(parse_sacct("").unwrap().is_empty());
}

#[test]
fn sacct_bad_rows_are_errors_c06_c08() {
    // C08: a truncated id is a parse error naming the line.
    let e = parse_sacct("4711|COMPLETED|0:0\n4711.ba+|COMPLETED|0:0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("truncated"), "{e}");
    // C06: a JobName with '|' is never requested; such a row shifts fields and is caught.
    let e = parse_sacct("4711|COMPLETED|a|b\n").unwrap_err().to_string();
    assert!(e.contains("ExitCode"), "{e}");
    let e = parse_sacct("4711|COMPLETED\n").unwrap_err().to_string();
    assert!(e.contains("JobID|State|ExitCode"), "{e}");
}

#[test]
fn deadline_is_a_terminal_failure() {
    assert!(map_state("DEADLINE").is_terminal() && !map_state("DEADLINE").is_success());
}

/// N04: every form of a GPU visibility variable, parsed into typed ids; bad forms are errors
/// naming the variable, the value and the entry.
#[test]
fn n04_gpu_visibility_forms() {
    use crate::executor::gpu::{GpuId, parse_visible};
    let i = GpuId::Index;
    let uuid = "GPU-8f3c0c6e-2b1a-4d1e-9c3b-1a2b3c4d5e6f";
    let mig = "MIG-GPU-8f3c0c6e-2b1a-4d1e-9c3b-1a2b3c4d5e6f/1/0";
    let mig_new = "MIG-5c8a6b0e-4a3f-5d2c-8e1f-0a1b2c3d4e5f";
    let ok: Vec<(&str, String, Vec<GpuId>)> = vec![
        ("CUDA_VISIBLE_DEVICES", "0".to_string(), vec![i(0)]),
        ("CUDA_VISIBLE_DEVICES", "2,3".to_string(), vec![i(2), i(3)]),
        ("SLURM_JOB_GPUS", "4,5".to_string(), vec![i(4), i(5)]),
        (
            "SLURM_STEP_GPUS",
            "0-3".to_string(),
            vec![i(0), i(1), i(2), i(3)],
        ),
        (
            "SLURM_JOB_GPUS",
            "0,2-3".to_string(),
            vec![i(0), i(2), i(3)],
        ),
        ("CUDA_VISIBLE_DEVICES", "".to_string(), vec![]),
        ("CUDA_VISIBLE_DEVICES", "NoDevFiles".to_string(), vec![]),
        ("SLURM_JOB_GPUS", " 1 , 0 ".to_string(), vec![i(1), i(0)]),
        (
            "CUDA_VISIBLE_DEVICES",
            uuid.to_string(),
            vec![GpuId::Uuid(uuid.into())],
        ),
        (
            "CUDA_VISIBLE_DEVICES",
            format!("{uuid},{mig_new}"),
            vec![GpuId::Uuid(uuid.into()), GpuId::Mig(mig_new.into())],
        ),
        (
            "CUDA_VISIBLE_DEVICES",
            mig.to_string(),
            vec![GpuId::Mig(mig.into())],
        ),
    ];
    for (var, value, want) in ok {
        assert_eq!(parse_visible(var, &value).unwrap(), want, "{var}={value:?}");
    }
    for (value, entry) in [
        ("0,,1", ""),
        ("0,1,0", "0"),
        ("gpu0", "gpu0"),
        ("GPU-", "GPU-"),
        ("GPU-xyz", "GPU-xyz"),
        ("3-1", "3-1"),
        ("0-99999", "0-99999"),
        ("-1", "-1"),
        ("99999999999", "99999999999"),
        ("0;1", "0;1"),
        ("nodevfiles", "nodevfiles"),
    ] {
        let e = parse_visible("CUDA_VISIBLE_DEVICES", value)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("gpu preflight: CUDA_VISIBLE_DEVICES=")
                && e.contains(&format!("entry {entry:?}")),
            "{value:?}: {e}"
        );
    }
}

/// N04 cases (a)–(e): which variable decides, the rank's device (its position in its own
/// visible list, never the raw id) and the preflight against the mesh's GPUs per node.
#[test]
fn n04_rank_device_and_preflight_cases() {
    use crate::executor::gpu::{GPUS_PER_NODE_ENV, GpuVisibility, preflight};
    let env = |pairs: &[(&str, &str)]| {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| m.get(k).cloned()
    };
    // (label, env, device or error parts)
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Result<u32, Vec<&'a str>>);
    let cases: Vec<Case> = vec![
        (
            "(a) rank 0: CUDA_VISIBLE_DEVICES=0 under SLURM_JOB_GPUS=4,5, one GPU per rank",
            vec![
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("SLURM_JOB_GPUS", "4,5"),
                ("SLURM_LOCALID", "0"),
                (GPUS_PER_NODE_ENV, "1"),
            ],
            Ok(0),
        ),
        (
            "(a) rank 1: its device is 0 (position), not 1 (local id) nor 5 (raw id)",
            vec![
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("SLURM_JOB_GPUS", "4,5"),
                ("SLURM_LOCALID", "1"),
                (GPUS_PER_NODE_ENV, "1"),
            ],
            Ok(0),
        ),
        (
            "(a) but the mesh needs 2 per node: 1 visible is too few",
            vec![
                ("CUDA_VISIBLE_DEVICES", "0"),
                ("SLURM_JOB_GPUS", "4,5"),
                ("SLURM_LOCALID", "1"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Err(vec![
                "1 GPU(s) visible",
                "CUDA_VISIBLE_DEVICES=\"0\"",
                "needs 2 per node",
            ]),
        ),
        (
            "(b) NoDevFiles = 0 GPUs",
            vec![("SLURM_JOB_GPUS", "NoDevFiles"), (GPUS_PER_NODE_ENV, "1")],
            Err(vec![
                "0 GPU(s) visible",
                "SLURM_JOB_GPUS=\"NoDevFiles\"",
                "needs 1 per node",
            ]),
        ),
        (
            "(b) empty CUDA_VISIBLE_DEVICES = 0 GPUs, even under SLURM_JOB_GPUS",
            vec![
                ("CUDA_VISIBLE_DEVICES", ""),
                ("SLURM_JOB_GPUS", "0,1"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Err(vec!["0 GPU(s) visible", "needs 2 per node"]),
        ),
        (
            "(c) 2,3 with SLURM_LOCALID=1: device 1 (position), not 3",
            vec![
                ("CUDA_VISIBLE_DEVICES", "2,3"),
                ("SLURM_LOCALID", "1"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Ok(1),
        ),
        (
            "(c) step GPUs decide without CUDA_VISIBLE_DEVICES",
            vec![
                ("SLURM_STEP_GPUS", "2,3"),
                ("SLURM_JOB_GPUS", "0-3"),
                ("LOCAL_RANK", "1"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Ok(1),
        ),
        (
            "(c) local rank beyond the list",
            vec![
                ("CUDA_VISIBLE_DEVICES", "2,3"),
                ("SLURM_LOCALID", "2"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Err(vec!["local rank 2 has no GPU: 2 visible"]),
        ),
        (
            "(d) a bare-metal task without a lease: nothing fences its GPUs",
            vec![(GPUS_PER_NODE_ENV, "1")],
            Err(vec![
                "none of CUDA_VISIBLE_DEVICES",
                "needs 1 GPU(s) per node",
            ]),
        ),
        ("(d) a CPU stage needs no GPU at all", vec![], Ok(0)),
        (
            "(e) UUID form",
            vec![
                (
                    "CUDA_VISIBLE_DEVICES",
                    "GPU-8f3c0c6e-2b1a-4d1e-9c3b-1a2b3c4d5e6f",
                ),
                ("SLURM_LOCALID", "3"),
                (GPUS_PER_NODE_ENV, "1"),
            ],
            Ok(0),
        ),
        (
            "more visible than needed is fine",
            vec![
                ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
                ("SLURM_LOCALID", "2"),
                (GPUS_PER_NODE_ENV, "2"),
            ],
            Ok(2),
        ),
        (
            "a malformed value is an error, not a guess",
            vec![("CUDA_VISIBLE_DEVICES", "0,x"), (GPUS_PER_NODE_ENV, "1")],
            Err(vec!["entry \"x\""]),
        ),
        (
            "a bad needed count",
            vec![("CUDA_VISIBLE_DEVICES", "0"), (GPUS_PER_NODE_ENV, "two")],
            Err(vec!["PUZZLETRON_GPUS_PER_NODE=\"two\""]),
        ),
    ];
    for (label, pairs, want) in cases {
        let got = preflight(env(&pairs));
        match (&got, &want) {
            (Ok(d), Ok(w)) => assert_eq!(d, w, "{label}"),
            (Err(e), Err(parts)) => {
                let m = e.to_string();
                assert!(m.starts_with("gpu preflight: "), "{label}: {m}");
                for p in parts {
                    assert!(m.contains(p), "{label}: {p:?} in {m}");
                }
            }
            _ => panic!("{label}: got {got:?}, want {want:?}"),
        }
    }
    // Precedence: CUDA_VISIBLE_DEVICES over SLURM_STEP_GPUS over SLURM_JOB_GPUS.
    let v = GpuVisibility::from_env(env(&[("SLURM_STEP_GPUS", "1"), ("SLURM_JOB_GPUS", "0,1")]))
        .unwrap();
    assert_eq!((v.source, v.count()), (Some("SLURM_STEP_GPUS"), Some(1)));
    let v = GpuVisibility::from_env(env(&[])).unwrap();
    assert_eq!((v.source, v.count()), (None, None));
}
