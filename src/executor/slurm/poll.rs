//! The poll cycle (one `squeue` + at most one `sacct` for all live jobs), the job cache with
//! its backoff, lookup by job name, and confirmed cancel.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::executor::{AttemptId, ExecutorError, JobHandle, JobState, JobStatus, now_ms};

use super::parse::{self, ErrorClass, JobRef, SacctRecord, SqueueRow};
use super::{Inner, by_cluster, job_key};

/// A job in the cache: cluster, job id, array task.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct JobKey {
    pub cluster: Option<String>,
    pub id: u64,
    pub task: Option<u32>,
}

impl JobKey {
    fn from_ref(cluster: &Option<String>, r: &JobRef) -> Self {
        Self {
            cluster: cluster.clone(),
            id: r.id,
            task: r.array_task,
        }
    }
}

#[derive(Debug, Clone)]
struct Cached {
    state: JobState,
    /// Everything but the attempt id (filled per handle on the way out).
    status: JobStatus,
    /// Terminal and settled: never asked about again.
    final_: bool,
    /// When it was last seen by squeue or sacct (or submitted).
    last_seen: Instant,
    /// Seen by squeue or sacct, or submitted, by this process (else `last_seen` means nothing
    /// and the handle's submit time counts).
    seen: bool,
}

/// Poll state shared by all clones of one executor.
#[derive(Debug)]
pub(crate) struct PollState {
    cache: HashMap<JobKey, Cached>,
    last_cycle: Option<Instant>,
    interval: Duration,
    /// `false` once sacct said accounting is disabled (C18): squeue only from then on.
    accounting: bool,
    /// sacct rows already reported as not ours (each is logged once).
    ignored_rows: std::collections::HashSet<String>,
    /// slurmdbd does not answer (N02): since when, the last error, and when sacct is asked
    /// again. `None` while accounting answers.
    acct_down: Option<AccountingDown>,
    /// Jobs were submitted since the last cycle: that cycle does not back off (a job seconds
    /// old is still pending, which is no sign that nothing will change soon).
    fresh: bool,
}

/// An outage of slurmdbd as the poll sees it (N02).
#[derive(Debug, Clone)]
struct AccountingDown {
    since: Instant,
    retry_at: Instant,
    backoff: Duration,
    last_error: String,
}

/// First wait before sacct is asked again after slurmdbd failed to answer; doubles up to
/// [`ACCT_BACKOFF_MAX`].
const ACCT_BACKOFF_MIN: Duration = Duration::from_secs(5);
/// The longest wait between two sacct calls while slurmdbd is down (N02: "backs off to ≤ ~5
/// min").
const ACCT_BACKOFF_MAX: Duration = Duration::from_secs(300);

impl PollState {
    pub(super) fn new(min_interval: Duration) -> Self {
        Self {
            cache: HashMap::new(),
            last_cycle: None,
            interval: min_interval,
            accounting: true,
            ignored_rows: Default::default(),
            acct_down: None,
            fresh: false,
        }
    }

    /// Records fresh submissions (Pending) and resets the backoff.
    pub(super) fn submitted(&mut self, keys: &[JobKey], min_interval: Duration) {
        let placeholder = AttemptId::new("pending").expect("valid");
        for k in keys {
            self.cache.insert(
                k.clone(),
                Cached {
                    state: JobState::Pending,
                    status: JobStatus::new(placeholder.clone(), JobState::Pending)
                        .with_reason("submitted"),
                    final_: false,
                    last_seen: Instant::now(),
                    seen: true,
                },
            );
        }
        self.interval = min_interval;
        self.fresh = true;
    }
}

/// How long after its last sighting a job missing from squeue and sacct counts as settling
/// (finished, its accounting record on the way) and keeps the poll at its shortest interval:
/// slurmdbd takes seconds behind a busy controller, rarely more; past this the poll backs off
/// again.
const SETTLE_WINDOW: Duration = Duration::from_secs(30);

/// `sacct -S` wants local time `YYYY-MM-DDTHH:MM:SS`.
fn slurm_time(ms: u64) -> String {
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes into the provided struct only.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe { libc::localtime_r(&secs, &mut tm) };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Margin subtracted from the earliest submission time for `sacct -S` (clock skew between
/// controller and slurmdbd, C17).
const SACCT_MARGIN_MS: u64 = 3600 * 1000;

/// How much earlier than our own clock's submit time the scheduler may date our job (clock
/// skew between this machine and slurmctld) before a row counts as someone else's.
const SUBMIT_SKEW_MS: u64 = 120 * 1000;

/// The status of a job that left squeue (or is terminal there) while slurmdbd is down: its
/// last known state, with a reason that says why it is not settled yet.
fn accounting_pending(
    prev: &JobStatus,
    d: &AccountingDown,
    squeue: Option<&JobState>,
) -> JobStatus {
    let mut s = prev.clone();
    s.accounting_pending = true;
    let seen = squeue.map_or_else(|| "left squeue".to_string(), |st| format!("{st} in squeue"));
    s.reason = Some(format!(
        "finished ({seen}), accounting pending: slurmdbd unreachable for {:.0} s ({})",
        d.since.elapsed().as_secs_f64(),
        d.last_error.trim()
    ));
    s
}

/// The job name our script gives an attempt's job (`--job-name`): the attempt id, or for an
/// array task the array's (template's) id.
fn expected_job_name(h: &JobHandle) -> String {
    // A chunk of a split array (N01) has its own name.
    if let Some(n) = h.data.get("job_name") {
        return n.clone();
    }
    match (h.array_task, h.attempt_id.split_array_task()) {
        (Some(_), Some((base, _))) => base.as_str().to_string(),
        _ => h.attempt_id.as_str().to_string(),
    }
}

/// Milliseconds since the epoch of a Slurm local time `YYYY-MM-DDTHH:MM:SS`; `None` for
/// `Unknown` or anything else.
pub(crate) fn parse_slurm_time_ms(s: &str) -> Option<u64> {
    let b = s.trim().as_bytes();
    if b.len() != 19
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| std::str::from_utf8(&b[r]).ok()?.parse::<i32>().ok();
    // SAFETY: mktime reads and normalises the struct we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = num(0..4)? - 1900;
    tm.tm_mon = num(5..7)? - 1;
    tm.tm_mday = num(8..10)?;
    tm.tm_hour = num(11..13)?;
    tm.tm_min = num(14..16)?;
    tm.tm_sec = num(17..19)?;
    tm.tm_isdst = -1;
    let t = unsafe { libc::mktime(&mut tm) };
    (t >= 0).then(|| t as u64 * 1000)
}

fn cluster_args(cluster: &Option<String>) -> Vec<String> {
    match cluster {
        Some(c) => vec!["-M".into(), c.clone()],
        None => Vec::new(),
    }
}

fn status_from_sacct(rec: &SacctRecord) -> JobStatus {
    let placeholder = AttemptId::new("pending").expect("valid");
    let mut state = rec.state.clone();
    let mut s = JobStatus::new(placeholder, JobState::Pending).with_restarts(rec.restarts);
    if let Some(e) = rec.exit {
        if state.is_terminal() {
            s.exit_code = Some(e.code);
            s.signal = e.signal;
            s.reason = e.note();
        }
        // A batch script ended by a signal it did not ask for (not a cancel, not OOM).
        if state == JobState::Failed
            && let Some(sig) = e.signal
        {
            state = JobState::Killed { signal: sig };
            s.exit_code = Some(128 + sig);
        }
    }
    s.nodes = rec.nodes.clone();
    s.state = state;
    s.steps = rec
        .steps
        .iter()
        .map(|(name, st)| {
            crate::executor::StepStatus::new(
                name.clone(),
                st.state.clone(),
                st.exit.map(|e| e.code),
                st.exit.and_then(|e| e.signal),
            )
        })
        .collect();
    s
}

impl Inner {
    /// Answers `handles` from the cache, querying the scheduler first when the interval has
    /// passed (or `force`).
    pub(crate) async fn poll_cycle(
        &self,
        handles: &[JobHandle],
        force: bool,
    ) -> Result<Vec<JobStatus>, ExecutorError> {
        let keys: Vec<JobKey> = handles.iter().map(job_key).collect::<Result<_, _>>()?;
        let mut st = self.state.lock().await;
        for (k, h) in keys.iter().zip(handles) {
            st.cache.entry(k.clone()).or_insert_with(|| {
                // A handle this process never saw (a restarted controller): its job was last
                // known alive at submit, so the grace for "not visible yet" runs from there,
                // and a job that is in neither squeue nor sacct long after its submit is Lost
                // at once instead of after another full grace.
                Cached {
                    state: JobState::Pending,
                    status: JobStatus::new(h.attempt_id.clone(), JobState::Pending)
                        .with_reason("not polled yet"),
                    final_: false,
                    last_seen: Instant::now(),
                    seen: false,
                }
            });
        }
        let due = force || st.last_cycle.is_none_or(|t| t.elapsed() >= st.interval);
        let live: BTreeSet<(JobKey, usize)> = keys
            .iter()
            .enumerate()
            .filter(|(_, k)| !st.cache[*k].final_)
            .map(|(i, k)| (k.clone(), i))
            .collect();
        if due && !live.is_empty() {
            let (changed, settling) = self.query(&mut st, handles, &live).await?;
            st.last_cycle = Some(Instant::now());
            // Back off only while nothing moves: not after a change, not right after a
            // submit, not while finished jobs wait for their accounting records (each of
            // these ends within seconds, and a doubled interval would be waited out in full).
            let steady = !(changed || settling || st.fresh);
            st.fresh = false;
            st.interval = if !steady {
                self.poll_policy.min_interval
            } else {
                (st.interval * 2).min(self.poll_policy.max_interval)
            };
            self.runner
                .counters
                .poll_cycles
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(keys
            .iter()
            .zip(handles)
            .map(|(k, h)| {
                let c = &st.cache[k];
                let mut s = c.status.clone();
                s.attempt_id = h.attempt_id.clone();
                s.log_path = h.data.get("log").map(Into::into);
                s
            })
            .collect())
    }

    /// One scheduler query for the live jobs; returns whether any state changed, and whether
    /// a job is settling: finished by squeue (terminal there, or gone from it) within
    /// [`SETTLE_WINDOW`] of its last sighting, with no accounting record yet.
    async fn query(
        &self,
        st: &mut PollState,
        handles: &[JobHandle],
        live: &BTreeSet<(JobKey, usize)>,
    ) -> Result<(bool, bool), ExecutorError> {
        let mut changed = false;
        let mut settling = false;
        let groups = by_cluster(
            live.iter()
                .map(|(k, i)| (k.cluster.clone(), (k.clone(), *i))),
        );
        for (cluster, jobs) in groups {
            let ids: BTreeSet<u64> = jobs.iter().map(|(k, _)| k.id).collect();
            let id_list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            // --- squeue, once ---
            let mut args = vec![
                "-h".to_string(),
                "-t".into(),
                "all".into(),
                "-o".into(),
                "%i|%T|%r|%N".into(),
                "-j".into(),
                id_list.clone(),
            ];
            args.extend(cluster_args(&cluster));
            let out = self.runner.run_retrying("squeue", &args).await?;
            let rows: Vec<SqueueRow> = if out.ok() {
                parse::parse_squeue(&out.stdout)?
            } else if out.class() == ErrorClass::InvalidJobId {
                Vec::new() // every listed job is gone from squeue (C15): ask sacct
            } else {
                return Err(ExecutorError::CommandFailed {
                    command: "squeue -j".into(),
                    exit_code: out.code,
                    stderr: out.message(),
                });
            };
            let mut seen: HashMap<JobKey, SqueueRow> = HashMap::new();
            for r in rows {
                seen.insert(JobKey::from_ref(&cluster, &r.job), r);
            }
            // An array's row without task (a whole pending array as `ID`) covers its tasks.
            let need_sacct: Vec<&JobKey> = jobs
                .iter()
                .map(|(k, _)| k)
                .filter(|k| seen.get(*k).is_none_or(|r| r.state.is_terminal()))
                .collect();
            // --- sacct, at most once ---
            let mut acct: HashMap<JobKey, SacctRecord> = HashMap::new();
            let acct_due = st
                .acct_down
                .as_ref()
                .is_none_or(|d| Instant::now() >= d.retry_at);
            if !need_sacct.is_empty() && st.accounting && acct_due {
                let ids: BTreeSet<u64> = need_sacct.iter().map(|k| k.id).collect();
                let since = jobs
                    .iter()
                    .map(|(_, i)| handles[*i].submitted_at_ms)
                    .min()
                    .unwrap_or(0)
                    .saturating_sub(SACCT_MARGIN_MS);
                let mut args = vec![
                    "-n".to_string(),
                    "-P".into(),
                    "-D".into(),
                    "-o".into(),
                    parse::SACCT_POLL_FIELDS.into(),
                    "-S".into(),
                    slurm_time(since),
                    "-j".into(),
                    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                ];
                args.extend(cluster_args(&cluster));
                let out = self.runner.run_retrying("sacct", &args).await?;
                if out.ok() {
                    // Our job, not a namesake: the row's job name must be the attempt's and
                    // its submit time not earlier than ours (a recycled id's old row is
                    // neither).
                    let expect: HashMap<u64, (String, u64)> = jobs
                        .iter()
                        .map(|(k, i)| {
                            let h = &handles[*i];
                            (k.id, (expected_job_name(h), h.submitted_at_ms))
                        })
                        .collect();
                    let (recs, rejected) = parse::parse_sacct_for(&out.stdout, 8, |row| {
                        let Some((name, at)) = expect.get(&row.job.id) else {
                            return false;
                        };
                        let submitted = row.submit.and_then(parse_slurm_time_ms);
                        row.name == Some(name.as_str())
                            && submitted.is_some_and(|s| s + SUBMIT_SKEW_MS >= *at)
                    })?;
                    for line in rejected {
                        if st.ignored_rows.insert(line.clone()) {
                            self.warn(format!(
                                "ignored a sacct row that is not our job (another job name or an earlier submit under a recycled id): {line}"
                            ));
                        }
                    }
                    for rec in recs {
                        acct.insert(JobKey::from_ref(&cluster, &rec.job), rec);
                    }
                    if let Some(d) = st.acct_down.take() {
                        self.warn(format!(
                            "slurmdbd answers again after {:.0} s: finished jobs are settled from sacct",
                            d.since.elapsed().as_secs_f64()
                        ));
                    }
                } else if out.class() == ErrorClass::AccountingDisabled {
                    st.accounting = false;
                } else if out.class() == ErrorClass::AccountingUnavailable {
                    let now = Instant::now();
                    let msg = out.message();
                    match &mut st.acct_down {
                        Some(d) => {
                            d.backoff = (d.backoff * 2).min(ACCT_BACKOFF_MAX);
                            d.retry_at = now + d.backoff;
                            d.last_error = msg;
                        }
                        None => {
                            // Warned once per outage; the live view shows it as a poll error.
                            self.warn(format!(
                                "slurmdbd unreachable (sacct: {msg}): polling goes on from squeue; jobs that left squeue wait as \"finished, accounting pending\" and are never resubmitted for it"
                            ));
                            // Never slower than the poll itself would ask.
                            let first = ACCT_BACKOFF_MIN.min(self.poll_policy.max_interval);
                            st.acct_down = Some(AccountingDown {
                                since: now,
                                retry_at: now + first,
                                backoff: first,
                                last_error: msg,
                            });
                        }
                    }
                } else {
                    return Err(ExecutorError::CommandFailed {
                        command: "sacct -j".into(),
                        exit_code: out.code,
                        stderr: out.message(),
                    });
                }
            }
            // --- merge ---
            let now = Instant::now();
            let acct_down = st.acct_down.clone();
            for (k, i) in &jobs {
                let h = &handles[*i];
                let Some(prev) = st.cache.get(k).cloned() else {
                    continue;
                };
                let row = seen.get(k);
                let rec = acct.get(k);
                let next: Option<(JobStatus, bool)> = match (row, rec) {
                    (Some(r), _) if r.state.is_active() => {
                        let mut s = JobStatus::new(h.attempt_id.clone(), r.state.clone());
                        s.reason = r.reason.clone();
                        s.nodes = r.nodes.clone();
                        if let Some(m) = r.max_running {
                            s.reason = Some(format!(
                                "{} (array limit {m} running)",
                                r.reason.as_deref().unwrap_or("pending")
                            ));
                        }
                        s.restarts = prev.status.restarts;
                        Some((s, false))
                    }
                    (_, Some(rec)) => {
                        let s = status_from_sacct(rec);
                        // Terminal in sacct and not active in squeue: settled.
                        let fin = s.state.is_terminal();
                        Some((s, fin))
                    }
                    (Some(r), None) => {
                        // Terminal in squeue, no accounting record (yet).
                        if let Some(d) = &acct_down {
                            Some((accounting_pending(&prev.status, d, Some(&r.state)), false))
                        } else if st.accounting {
                            // Bounded like a job missing from both: a controller that cannot
                            // hand records to slurmdbd for long is polled at the backoff again.
                            settling |= now.duration_since(prev.last_seen) < SETTLE_WINDOW;
                            None // wait for sacct to have it (keeps exit code exact)
                        } else {
                            let s = JobStatus::new(h.attempt_id.clone(), r.state.clone())
                                .with_reason("from squeue; accounting disabled, exit code unknown");
                            Some((s, true))
                        }
                    }
                    (None, None) if st.accounting && acct_down.is_some() => {
                        // Gone from squeue while slurmdbd is down: finished, but how is not
                        // known yet. Never Lost for it (N02).
                        acct_down
                            .as_ref()
                            .map(|d| (accounting_pending(&prev.status, d, None), false))
                    }
                    (None, None) => {
                        let age_ms = now_ms().saturating_sub(h.submitted_at_ms);
                        let since_seen = if prev.seen {
                            now.duration_since(prev.last_seen)
                        } else {
                            Duration::from_millis(age_ms)
                        };
                        let grace = self.poll_policy.missing_grace;
                        if !st.accounting
                            && prev.state.is_active()
                            && prev.state != JobState::Pending
                        {
                            // C18: it left squeue and there is no accounting to ask.
                            Some((
                                JobStatus::new(h.attempt_id.clone(), JobState::Failed).with_reason(
                                    "left squeue; accounting disabled, outcome unknown",
                                ),
                                true,
                            ))
                        } else if since_seen < grace || (age_ms as u128) < grace.as_millis() {
                            settling |= prev.seen && since_seen < SETTLE_WINDOW;
                            None // C14: not visible yet; keep the last state
                        } else {
                            Some((
                                JobStatus::new(h.attempt_id.clone(), JobState::Lost).with_reason(
                                    format!(
                                        "job {} not in squeue or sacct for {:?}",
                                        h.scheduler_ref(),
                                        since_seen
                                    ),
                                ),
                                true,
                            ))
                        }
                    }
                };
                if let Some((status, fin)) = next {
                    if status.state != prev.state {
                        changed = true;
                    }
                    st.cache.insert(
                        k.clone(),
                        Cached {
                            state: status.state.clone(),
                            status,
                            final_: fin,
                            // While slurmdbd is down the job counts as seen: the grace before
                            // Lost runs from when accounting could answer again.
                            last_seen: if row.is_some() || rec.is_some() || acct_down.is_some() {
                                now
                            } else {
                                prev.last_seen
                            },
                            seen: prev.seen || row.is_some() || rec.is_some(),
                        },
                    );
                }
            }
        }
        Ok((changed, settling))
    }

    /// Finds the job named `name` (the attempt id): squeue first, then sacct since `since_ms`
    /// minus a margin. The lowest id wins if there are several.
    pub(crate) async fn lookup(
        &self,
        name: &AttemptId,
        since_ms: u64,
    ) -> Result<Option<JobRef>, ExecutorError> {
        let args = vec![
            "-h".to_string(),
            "-t".into(),
            "all".into(),
            "-o".into(),
            "%i|%T".into(),
            format!("--name={name}"),
        ];
        let out = self.runner.run_retrying("squeue", &args).await?;
        if out.ok() {
            let rows = parse::parse_squeue(&out.stdout)?;
            if let Some(r) = rows.iter().map(|r| r.job.id).min() {
                return Ok(Some(JobRef::new(r)));
            }
        }
        let args = vec![
            "-n".to_string(),
            "-P".into(),
            "-X".into(),
            "-o".into(),
            "JobID,State,ExitCode".into(),
            "-S".into(),
            slurm_time(since_ms.saturating_sub(SACCT_MARGIN_MS)),
            format!("--name={name}"),
        ];
        let out = self.runner.run_retrying("sacct", &args).await?;
        if out.ok() {
            let recs = parse::parse_sacct(&out.stdout)?;
            return Ok(recs.iter().map(|r| r.job.id).min().map(JobRef::new));
        }
        if out.class() == ErrorClass::AccountingDisabled {
            return Ok(None);
        }
        if out.class() == ErrorClass::AccountingUnavailable {
            // Not in squeue and slurmdbd cannot say whether it ever ran: "not found" would
            // let the caller submit a second job. Retryable, so the caller asks again later.
            return Err(ExecutorError::SchedulerUnavailable {
                command: "sacct --name".into(),
                tries: 1,
                message: format!("slurmdbd unreachable: {}", out.message()),
            });
        }
        Err(ExecutorError::CommandFailed {
            command: "sacct --name".into(),
            exit_code: out.code,
            stderr: out.message(),
        })
    }

    /// `scancel`, then polls (forced cycles) until the job is terminal.
    pub(crate) async fn cancel(&self, h: &JobHandle) -> Result<(), ExecutorError> {
        let key = job_key(h)?;
        {
            let st = self.state.lock().await;
            if st.cache.get(&key).is_some_and(|c| c.final_) {
                return Ok(());
            }
        }
        let mut args = vec![h.scheduler_ref()];
        args.extend(cluster_args(&h.cluster));
        let out = self.runner.run_retrying("scancel", &args).await?;
        if !out.ok() {
            let msg = out.stderr.to_ascii_lowercase();
            let gone = msg.contains("already completing or completed")
                || out.class() == ErrorClass::InvalidJobId;
            if !gone {
                return Err(ExecutorError::CommandFailed {
                    command: "scancel".into(),
                    exit_code: out.code,
                    stderr: out.message(),
                });
            }
        }
        let deadline = Instant::now() + self.cancel_timeout;
        let mut nap = Duration::from_millis(200);
        loop {
            let s = self.poll_cycle(std::slice::from_ref(h), true).await?;
            // Gone from squeue with slurmdbd down: it runs no more, which is what a cancel
            // must confirm; its final state comes with the accounting.
            if s[0].state.is_terminal() || s[0].accounting_pending {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ExecutorError::CancelUnconfirmed {
                    attempt_id: h.attempt_id.clone(),
                    job_id: h.scheduler_ref(),
                    state: s[0].state.to_string(),
                });
            }
            tokio::time::sleep(nap).await;
            nap = (nap * 2).min(Duration::from_secs(5));
        }
    }
}
