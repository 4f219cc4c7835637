//! What runs on a host: POSIX `sh` scripts (fixed text, never built from data) that get every
//! value as a positional argument, and the parser of their answers.
//!
//! Layout of `<remote root>/<attempt id>/` on the host: `submitted` (ms), `started/` (made
//! exclusively by the one wrapper that runs the job, or by a cancel that came first), `wrapper`
//! and `job` (`<pid> <start ticks> [<start ms>] <boot id> <PID namespace> <machine id>`, ticks
//! from field 22 of `/proc/<pid>/stat`, so a recycled pid is never taken for the job; `-` for a
//! part that cannot be read), `cancel` (ms), `timeout` (walltime hit), `exit`
//! (`status=exited|cancelled_before_start`, `code`, `timeout`, `cancelled`, `start_ms`, `end_ms`;
//! written to a temp file, synced, renamed). The job runs under `setsid`: its pid is its
//! process group, which cancel and walltime signal as a whole.

use std::collections::HashMap;

/// Who may judge a recorded process (`alive PID TICKS BOOT PIDNS MACHINE`), by the store's rules
/// (`store/liveness.rs`): its pid and start time decide only in the boot and PID namespace it
/// was recorded in. A record of another boot of the same machine (same `/etc/machine-id`: the
/// host rebooted) is dead, whatever pid runs now. One of another PID namespace, or of another
/// boot of a machine that cannot be told the same, cannot be judged from here and counts as
/// alive (the poll never declares such a task lost; its exit record still ends it). Records of
/// older builds (pid and ticks only) are judged by pid and ticks, as before.
///
/// The remote root when the executor names none: `$PUZZLETRON_BAREMETAL_ROOT`, else
/// `$HOME/.puzzletron/baremetal`. Every script starts with it (`$1` = the configured root, or
/// empty).
const ROOT: &str = r#"root=$1; shift
if [ -z "$root" ]; then root=${PUZZLETRON_BAREMETAL_ROOT:-$HOME/.puzzletron/baremetal}; fi
now() { date +%s%3N; }
ticks() { l=; read -r l < "/proc/$1/stat" 2>/dev/null || return 1; r=${l##*) }; set -- $r; shift 19; echo "$1"; }
space() { b=; m=; read -r b < /proc/sys/kernel/random/boot_id 2>/dev/null; read -r m < /etc/machine-id 2>/dev/null; n=$(readlink /proc/self/ns/pid 2>/dev/null); echo "${b:--} ${n:--} ${m:--}"; }
alive() {
  [ -n "$1" ] || return 1
  set -- "$1" "$2" "${3:--}" "${4:--}" "${5:--}" $(space)
  if [ "$3" != - ] && [ "$3" != "$6" ]; then
    if [ "$5" != - ] && [ "$5" = "$8" ]; then return 1; fi
    return 0
  fi
  if [ "$4" != - ] && [ "$4" != "$7" ]; then return 0; fi
  [ -r "/proc/$1/stat" ] && [ "$(ticks "$1")" = "$2" ]
}
"#;

/// The job itself, run under `setsid` by the wrapper: enters the checkout, sources the setup
/// script and the venv, runs the site's prerun commands (trusted text of the runner file, like
/// in the Slurm script), exports the environment, enters the working directory, writes the
/// start mark (the attempt id to `$PUZZLETRON_START_FILE`, when the spec sets it: its setup
/// succeeded, the payload starts now; a job ending without it failed on its host, issue 27)
/// and runs the argv.
/// Run as `sh <dir>/job.sh <dir>`; reads its arguments from `<dir>/args` (mode 0600, so
/// environment values never show in `ps`): log walltime_s grace_s repo setup venv cwd nprerun
/// prerun... npostrun postrun... nenv K=V... argv...
pub(super) const JOB: &str = r#"eval "set -- $(cat "$1/args")"; shift 3
repo=$1; setup=$2; venv=$3; cwd=$4; shift 4
fail() { echo "puzzletron-baremetal: $*" >&2; exit 126; }
if [ -n "$repo" ]; then cd -- "$repo" || fail "cannot enter the repository $repo"; fi
if [ -n "$setup" ]; then case $setup in */*) ;; *) setup=./$setup ;; esac; . "$setup" || fail "setup_env $setup failed"; fi
n=$1; shift; while [ "$n" -gt 0 ]; do eval "$1" || fail "prerun command failed: $1"; shift; n=$((n-1)); done
if [ -n "$venv" ]; then . "$venv/bin/activate" || fail "cannot activate the venv $venv"; fi
post=$1; shift; i=0; while [ "$i" -lt "$post" ]; do eval "p$i=\$1"; shift; i=$((i+1)); done
n=$1; shift; while [ "$n" -gt 0 ]; do export "$1" || fail "bad environment entry"; shift; n=$((n-1)); done
if [ -n "$cwd" ]; then cd -- "$cwd" || fail "cannot enter the working directory $cwd"; fi
if [ -n "${PUZZLETRON_START_FILE:-}" ]; then printf '%s\n' "${PUZZLETRON_ATTEMPT_ID:-}" > "$PUZZLETRON_START_FILE" || :; fi
if [ "$post" -eq 0 ]; then exec "$@"; fi
"$@"; rc=$?
i=0; while [ "$i" -lt "$post" ]; do eval "eval \"\$p$i\""; i=$((i+1)); done
exit $rc
"#;

/// The wrapper: claims the start, runs the job in its own session, enforces the walltime,
/// records the exit code, and kills what the job left in its process group.
/// Args (after the root): dir; the rest is read from `<dir>/args` (see [`JOB`]).
const WRAPPER: &str = r#"d=$1
eval "set -- $(cat "$d/args")"
log=$1; wall=$2; grace=$3
[ -n "$log" ] || log=$d/output.log
mkdir "$d/started" 2>/dev/null || exit 0
echo "$$ $(ticks $$) $(space)" > "$d/wrapper.tmp" && mv -f "$d/wrapper.tmp" "$d/wrapper"
record() { printf '%s' "$1" > "$d/exit.tmp" && sync "$d/exit.tmp" 2>/dev/null; mv -f "$d/exit.tmp" "$d/exit"; }
if [ -e "$d/cancel" ]; then t=$(now); record "status=cancelled_before_start
start_ms=$t
end_ms=$t
"; exit 0; fi
trap : HUP INT TERM
mkdir -p "$(dirname -- "$log")" 2>/dev/null
start=$(now)
setsid sh "$d/job.sh" "$d" < /dev/null >> "$log" 2>&1 &
jp=$!
echo "$jp $(ticks $jp) $start $(space)" > "$d/job.tmp" && mv -f "$d/job.tmp" "$d/job"
if [ -e "$d/cancel" ]; then kill -TERM "-$jp" 2>/dev/null || kill -TERM "$jp" 2>/dev/null; fi
wd=
if [ "$wall" != 0 ]; then
  setsid sh -c 'trap "kill \$s 2>/dev/null; exit 0" TERM; sleep "$1" & s=$!; wait $s
    [ -e "$2/exit" ] && exit 0; : > "$2/timeout"; kill -TERM "-$3" 2>/dev/null
    sleep "$4" & s=$!; wait $s; kill -KILL "-$3" 2>/dev/null' ptron-walltime "$wall" "$d" "$jp" "$grace" < /dev/null > /dev/null 2>&1 &
  wd=$!
fi
while :; do wait "$jp"; rc=$?; kill -0 "$jp" 2>/dev/null || break; done
kill -KILL "-$jp" 2>/dev/null
end=$(now)
to=0; [ -e "$d/timeout" ] && to=1
c=0; [ -e "$d/cancel" ] && c=1
record "status=exited
code=$rc
timeout=$to
cancelled=$c
start_ms=$start
end_ms=$end
"
if [ -n "$wd" ]; then kill -TERM "-$wd" 2>/dev/null; fi
exit 0
"#;

/// Submit, for one or several attempts in one exchange (issue 27, P06: the launches a host
/// gets within a short window share one remote script). For each attempt: makes its folder
/// exclusively and starts its wrapper detached (`setsid`, no terminal, no tie to the SSH
/// session). Answers one line per attempt, once every started attempt's pid record (`job`) or
/// exit record is there (issue 27, P07: the pid file exists before the launch returns; at most
/// ~1 s in all, after which the poll follows them): `OK <id>`, `DUP <id>` when the attempt was
/// already started on this host, or `ERR <id> <what>` when its folder or files cannot be
/// written (the others go on). Args (after the root): wrapper_text job_text, then per attempt
/// id args_text (the job's arguments as quoted shell words, written to `<dir>/args`).
const SUBMIT: &str = r#"W=$1; J=$2; shift 2
umask 077
if ! mkdir -p "$root" 2>/dev/null; then
  while [ $# -ge 2 ]; do echo "ERR $1 cannot make the remote root $root"; shift 2; done; exit 0
fi
ans=; wait_for=
while [ $# -ge 2 ]; do
  id=$1; A=$2; shift 2; d=$root/$id
  umask 077
  if ! mkdir "$d" 2>/dev/null; then
    if [ -e "$d/started" ] || [ -e "$d/exit" ]; then ans="$ans
DUP $id"; continue; fi
    if [ ! -d "$d" ]; then ans="$ans
ERR $id cannot make $d"; continue; fi
  fi
  umask 022
  if ! printf '%s' "$J" > "$d/job.sh" || ! ( umask 077; printf '%s' "$A" > "$d/args" ); then
    ans="$ans
ERR $id cannot write the job files in $d"; continue
  fi
  [ -e "$d/submitted" ] || now > "$d/submitted"
  setsid sh -c "$W" ptron-wrap "" "$d" < /dev/null > /dev/null 2>&1 &
  ans="$ans
OK $id"; wait_for="$wait_for $id"
done
i=0
for id in $wait_for; do
  d=$root/$id
  while [ ! -f "$d/job" ] && [ ! -f "$d/exit" ] && [ $i -lt 100 ]; do sleep 0.01; i=$((i+1)); done
done
printf '%s\n' "$ans" | sed '/^$/d'
"#;

/// Poll: one line per attempt id. `E <id> k=v...` (exit record), `R <id> <start ms>` (job
/// alive), `W <id>` (wrapper alive, job starting or ending), `S <id> <submitted ms>` (folder
/// made, wrapper not up yet), `D <id>` (wrapper gone without a record), `A <id>` (no folder).
/// Before it, `M <id> job|wrapper <text>` for a pid record that is malformed (pid or start
/// ticks not a number; its first 80 bytes, unprintables as `?`): such a record is not used,
/// and without an exit record the attempt is judged by whether a process of the host has the
/// attempt folder as an argument (the wrapper and the job do): `W` if one does, else `D`.
const POLL: &str = r#"num() { case $1 in ''|*[!0-9]*) return 1 ;; esac; }
bad() { printf 'M %s %s %s\n' "$1" "$2" "$(head -c 80 "$3" 2>/dev/null | tr -c '[:print:]' '?')"; }
runs() { for f in /proc/[0-9]*/cmdline; do a=$(tr '\0' '\n' < "$f" 2>/dev/null) || continue; case "
$a
" in *"
$1
"*) return 0 ;; esac; done; return 1; }
for id in "$@"; do
  d=$root/$id
  if [ ! -d "$d" ]; then echo "A $id"; continue; fi
  if [ ! -f "$d/exit" ]; then
    p=; t=; s=; m1=
    if [ -f "$d/job" ]; then read -r p t s b n m < "$d/job"
      if ! num "$p" || ! num "$t" || { [ -n "$s" ] && ! num "$s"; }; then bad "$id" job "$d/job"; m1=1
      elif alive "$p" "$t" "$b" "$n" "$m"; then echo "R $id $s"; continue; fi; fi
    p=; t=
    if [ -f "$d/wrapper" ]; then read -r p t b n m < "$d/wrapper"
      if ! num "$p" || ! num "$t"; then bad "$id" wrapper "$d/wrapper"; m1=1
      elif alive "$p" "$t" "$b" "$n" "$m"; then echo "W $id"; continue; fi; fi
    if [ -n "$m1" ] && [ ! -f "$d/exit" ] && runs "$d"; then echo "W $id"; continue; fi
  fi
  if [ -f "$d/exit" ]; then
    line="E $id"; while IFS= read -r l; do line="$line $l"; done < "$d/exit"; echo "$line"; continue
  fi
  if [ -f "$d/wrapper" ]; then echo "D $id"; continue; fi
  s=0; [ -f "$d/submitted" ] && read -r s < "$d/submitted"; echo "S $id $s"
done
"#;

/// Cancel: records the request, signals the job's process group (TERM, then KILL after the
/// grace) and waits for the exit record; an attempt not started yet never starts (its
/// `started/` claim is taken). Prints `DONE` or `PENDING <state>`.
/// Args (after the root): id grace_s confirm_s
const CANCEL: &str = r#"id=$1; grace=$2; confirm=$3; d=$root/$id
[ -f "$d/exit" ] && { echo DONE; exit 0; }
mkdir -p "$d" || exit 3
now > "$d/cancel.tmp" && mv -f "$d/cancel.tmp" "$d/cancel"
i=0; while [ ! -f "$d/job" ] && [ ! -f "$d/exit" ] && [ $i -lt 50 ]; do
  if [ ! -f "$d/wrapper" ] && mkdir "$d/started" 2>/dev/null; then
    t=$(now); printf 'status=cancelled_before_start\nstart_ms=%s\nend_ms=%s\n' "$t" "$t" > "$d/exit.tmp"; mv -f "$d/exit.tmp" "$d/exit"
    echo DONE; exit 0
  fi
  sleep 0.1; i=$((i+1))
done
p=; t=
[ -f "$d/job" ] && read -r p t s jb jn jm < "$d/job"
[ -n "$p" ] && kill -TERM "-$p" 2>/dev/null
i=0; n=$((grace*10)); while [ ! -f "$d/exit" ] && [ $i -lt $n ]; do sleep 0.1; i=$((i+1)); done
[ -f "$d/exit" ] || { [ -n "$p" ] && kill -KILL "-$p" 2>/dev/null; }
i=0; n=$((confirm*10)); while [ ! -f "$d/exit" ] && [ $i -lt $n ]; do sleep 0.1; i=$((i+1)); done
[ -f "$d/exit" ] && { echo DONE; exit 0; }
# The wrapper died without a record (killed, host rebooted): the task is gone once neither the
# wrapper nor any process of the job's group is left.
w=; wt=; wb=; wn=; wm=; [ -f "$d/wrapper" ] && read -r w wt wb wn wm < "$d/wrapper"
if ! alive "$w" "$wt" "$wb" "$wn" "$wm" && { [ -z "$p" ] || ! kill -0 "-$p" 2>/dev/null; }; then echo DONE; else echo "PENDING running"; fi
"#;

/// Preflight: the repository and the venv exist, and the GPU probe's output. Prints
/// `REPO ok|missing`, `VENV ok|missing|none`, `PROBE <exit code>` and then the probe's output.
/// Args (after the root): repo venv probe_argv...
const PREFLIGHT: &str = r#"repo=$1; venv=$2; shift 2
if [ -z "$repo" ]; then echo "REPO none"; elif [ -d "$repo" ]; then echo "REPO ok"; else echo "REPO missing"; fi
if [ -z "$venv" ]; then echo "VENV none"; elif [ -f "$venv/bin/activate" ]; then echo "VENV ok"; else echo "VENV missing"; fi
mkdir -p "$root" && [ -w "$root" ] && echo "ROOT ok $root" || echo "ROOT unwritable $root"
out=$("$@" 2>&1); rc=$?
echo "PROBE $rc"
printf '%s\n' "$out"
"#;

/// Resolve: whether the program a job would run is found on the host after the job's setup
/// (repository, setup script, venv, the spec's `PATH`, working directory), as the job's `exec`
/// looks it up. Prints `FOUND <path>`; or `MISSING`, `DIR <working directory>`, `PATH <path>`;
/// or `SETUP <what>` when the setup itself fails here (nothing is judged then: the job meets
/// it). Args (after the root): repo setup venv cwd path program
const RESOLVE: &str = r#"repo=$1; setup=$2; venv=$3; cwd=$4; p=$5; prog=$6
if [ -n "$repo" ]; then cd -- "$repo" 2>/dev/null || { echo "SETUP repository"; exit 0; }; fi
if [ -n "$setup" ]; then case $setup in */*) ;; *) setup=./$setup ;; esac; . "$setup" < /dev/null > /dev/null 2>&1 || { echo "SETUP setup_env"; exit 0; }; fi
if [ -n "$venv" ]; then . "$venv/bin/activate" > /dev/null 2>&1 || { echo "SETUP venv"; exit 0; }; fi
if [ -n "$p" ]; then PATH=$p; export PATH; fi
if [ -n "$cwd" ]; then cd -- "$cwd" 2>/dev/null || { echo "SETUP cwd"; exit 0; }; fi
if w=$(command -v -- "$prog" 2>/dev/null) && [ -n "$w" ]; then echo "FOUND $w"; else printf 'MISSING\nDIR %s\nPATH %s\n' "$(pwd)" "$PATH"; fi
"#;

/// The whole text of a script: the root preamble, then the body.
fn script(body: &str) -> String {
    format!("{ROOT}{body}")
}

/// The remote command line for `body` with `args`: `sh -c '<script>' <name> <args...>`, every
/// word quoted (the remote login shell parses the line; nothing in it is left unquoted).
pub(super) fn command_line(
    name: &str,
    body: &str,
    env: &[(&str, &str)],
    args: &[String],
) -> String {
    let mut words: Vec<String> = Vec::with_capacity(args.len() + 6);
    if !env.is_empty() {
        words.push("env".into());
        for (k, v) in env {
            words.push(quote(&format!("{k}={v}")));
        }
    }
    words.push("sh".into());
    words.push("-c".into());
    words.push(quote(&script(body)));
    words.push(quote(name));
    words.extend(args.iter().map(|a| quote(a)));
    words.join(" ")
}

pub(super) use crate::executor::shell::quote;

/// Script bodies by operation.
pub(super) fn submit_body() -> &'static str {
    SUBMIT
}
/// See [`POLL`].
pub(super) fn poll_body() -> &'static str {
    POLL
}
/// See [`CANCEL`].
pub(super) fn cancel_body() -> &'static str {
    CANCEL
}
/// See [`PREFLIGHT`].
pub(super) fn preflight_body() -> &'static str {
    PREFLIGHT
}
/// See [`RESOLVE`].
pub(super) fn resolve_body() -> &'static str {
    RESOLVE
}

/// What the resolve script said: `Ok(None)` found (or not judged), `Ok(Some((dir, path)))`
/// missing, looked up in `path` from working directory `dir`.
pub(super) fn parse_resolve(out: &str) -> Option<(String, String)> {
    let mut lines = out.lines();
    if lines.next()?.trim() != "MISSING" {
        return None;
    }
    let (mut dir, mut path) = (String::new(), String::new());
    for l in lines {
        if let Some(d) = l.strip_prefix("DIR ") {
            dir = d.to_string();
        } else if let Some(p) = l.strip_prefix("PATH ") {
            path = p.to_string();
        }
    }
    Some((dir, path))
}
/// The wrapper's full text (with the root preamble for `now`/`ticks`; its root argument is
/// passed empty and unused).
pub(super) fn wrapper_script() -> String {
    script(WRAPPER)
}

/// One line of the poll script's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(super) enum RemoteState {
    /// No attempt folder.
    Absent,
    /// Folder made at `submitted_ms`, wrapper not started yet.
    Submitted { submitted_ms: u64 },
    /// The wrapper runs but the job is not (yet, or any more) alive.
    Wrapping,
    /// The job runs, started at this time.
    Running { start_ms: Option<u64> },
    /// The wrapper died without recording an exit (host rebooted, wrapper killed).
    Dead,
    /// The exit record.
    Exited(ExitRecord),
}

/// The wrapper's exit record.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub(super) struct ExitRecord {
    /// `exited` or `cancelled_before_start`.
    pub status: String,
    /// Exit code (128+N for death by signal N, as the shell reports it).
    pub code: Option<i32>,
    /// The walltime watchdog fired.
    pub timeout: bool,
    /// A cancel was requested before the job ended.
    pub cancelled: bool,
    /// Start, ms.
    pub start_ms: Option<u64>,
    /// End, ms.
    pub end_ms: Option<u64>,
    /// Entries of the exit file that could not be read (`code=abc`, a line without `=`), as
    /// written: the record is malformed and reported with its path.
    pub malformed: Vec<String>,
}

/// One attempt's line of the submit script's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SubmitAnswer {
    /// Started now (its pid or exit record was there, or the wait ran out).
    Ok,
    /// Already started on this host earlier: not started again.
    Dup,
    /// Its folder or files could not be written there (why).
    Err(String),
}

/// Parses the submit answer into `(attempt id, answer)` pairs (unknown lines skipped; an id
/// missing from the answer is the caller's to report).
pub(super) fn parse_submit(out: &str) -> HashMap<String, SubmitAnswer> {
    let mut m = HashMap::new();
    for line in out.lines() {
        let mut w = line.splitn(3, ' ');
        let (Some(tag), Some(id)) = (w.next(), w.next()) else {
            continue;
        };
        let a = match tag {
            "OK" => SubmitAnswer::Ok,
            "DUP" => SubmitAnswer::Dup,
            "ERR" => SubmitAnswer::Err(w.next().unwrap_or("failed").to_string()),
            _ => continue,
        };
        m.insert(id.to_string(), a);
    }
    m
}

/// The malformed pid records of the poll answer (`M` lines): `(attempt id, file name, its
/// first bytes)`.
pub(super) fn parse_bad_records(out: &str) -> Vec<(String, String, String)> {
    out.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("M ")?;
            let (id, rest) = rest.split_once(' ')?;
            let (file, text) = rest.split_once(' ').unwrap_or((rest, ""));
            Some((id.to_string(), file.to_string(), text.to_string()))
        })
        .collect()
}

/// Parses the poll answer into `(attempt id, state)` pairs (unknown lines are skipped; the
/// caller treats a missing id as an incomplete answer).
pub(super) fn parse_poll(out: &str) -> Vec<(String, RemoteState)> {
    let mut v = Vec::new();
    for line in out.lines() {
        let mut w = line.split(' ');
        let (Some(tag), Some(id)) = (w.next(), w.next()) else {
            continue;
        };
        let num = |s: Option<&str>| s.and_then(|x| x.parse::<u64>().ok());
        let st = match tag {
            "A" => RemoteState::Absent,
            "S" => RemoteState::Submitted {
                submitted_ms: num(w.next()).unwrap_or(0),
            },
            "W" => RemoteState::Wrapping,
            "R" => RemoteState::Running {
                start_ms: num(w.next()),
            },
            "D" => RemoteState::Dead,
            "E" => {
                let mut r = ExitRecord::default();
                for kv in w {
                    let Some((k, val)) = kv.split_once('=') else {
                        if !kv.is_empty() {
                            r.malformed.push(kv.to_string());
                        }
                        continue;
                    };
                    let mut bad = false;
                    match k {
                        "status" => r.status = val.to_string(),
                        "code" => {
                            r.code = val.parse().ok();
                            bad = r.code.is_none();
                        }
                        "timeout" => r.timeout = val == "1",
                        "cancelled" => r.cancelled = val == "1",
                        "start_ms" => {
                            r.start_ms = val.parse().ok();
                            bad = r.start_ms.is_none();
                        }
                        "end_ms" => {
                            r.end_ms = val.parse().ok();
                            bad = r.end_ms.is_none();
                        }
                        _ => {}
                    }
                    if bad {
                        r.malformed.push(kv.to_string());
                    }
                }
                RemoteState::Exited(r)
            }
            _ => continue,
        };
        v.push((id.to_string(), st));
    }
    v
}

/// Tests: runs the poll script here (not over ssh) on attempt `id` under `root`; its answer.
#[cfg(test)]
pub(super) fn poll_here(root: &std::path::Path, id: &str) -> String {
    let line = command_line(
        "ptron-poll",
        poll_body(),
        &[],
        &[root.display().to_string(), id.into()],
    );
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(&line)
        .output()
        .expect("running sh");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `args` file of a job (the layout [`JOB`] reads): no log, no walltime, 1 s grace,
    /// no repository, setup or venv, working directory `cwd`, the `prerun` commands, no
    /// postrun, the `env` entries, then `sh -c script`.
    fn job_args(cwd: &str, prerun: &[&str], env: &[String], script: &str) -> String {
        let mut words: Vec<String> = vec![
            String::new(),
            "0".into(),
            "1".into(),
            String::new(),
            String::new(),
            String::new(),
            cwd.into(),
            prerun.len().to_string(),
        ];
        words.extend(prerun.iter().map(|p| p.to_string()));
        words.push("0".into());
        words.push(env.len().to_string());
        words.extend(env.iter().cloned());
        words.extend(["sh".into(), "-c".into(), script.into()]);
        words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn poll_lines_parse() {
        let out = "A x\nS y 17\nW z\nR r 42\nD d\nE e status=exited code=3 timeout=0 cancelled=1 start_ms=5 end_ms=9\ngarbage\n";
        let v = parse_poll(out);
        assert_eq!(v.len(), 6);
        assert_eq!(v[1].1, RemoteState::Submitted { submitted_ms: 17 });
        assert_eq!(v[3].1, RemoteState::Running { start_ms: Some(42) });
        assert_eq!(
            v[5].1,
            RemoteState::Exited(ExitRecord {
                status: "exited".into(),
                code: Some(3),
                timeout: false,
                cancelled: true,
                start_ms: Some(5),
                end_ms: Some(9),
                malformed: Vec::new(),
            })
        );
        // Issue 27, bad input: a malformed exit file's entries are kept, never a made-up code.
        let v = parse_poll("E e status=exited code=12x start_ms=5 junk\n");
        let RemoteState::Exited(r) = &v[0].1 else {
            panic!("{v:?}")
        };
        assert_eq!(r.code, None);
        assert_eq!(r.malformed, ["code=12x", "junk"]);
    }

    #[test]
    fn command_line_quotes_every_word() {
        let line = command_line(
            "n",
            "echo \"$@\"",
            &[],
            // The first argument is the remote root (empty: the default).
            &[String::new(), "a b".into(), "it's; rm -rf /".into()],
        );
        assert!(line.ends_with("n '' 'a b' 'it'\\''s; rm -rf /'"), "{line}");
        // Run it through a real shell: the values come back verbatim.
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&line)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("a b it's; rm -rf /"), "{text}");
    }

    /// Issue 27: the job writes its start mark after its own setup (prerun commands, exports,
    /// working directory) and before the payload; a job whose setup fails writes none.
    #[test]
    fn the_job_writes_its_start_mark_after_its_setup_and_before_the_payload() {
        let run = |prerun: &str| {
            let d = tempfile::tempdir().unwrap();
            let mark = d.path().join("_STARTED");
            let seen = d.path().join("seen");
            let args = job_args(
                &d.path().display().to_string(),
                &[prerun],
                &[
                    format!("{}={}", crate::executor::START_FILE_ENV, mark.display()),
                    format!("{}=c.s.0.a1", crate::executor::ATTEMPT_ID_ENV),
                ],
                // The payload sees the mark already there.
                &format!(
                    "cat \"$PUZZLETRON_START_FILE\" > {}",
                    quote(&seen.display().to_string())
                ),
            );
            std::fs::write(d.path().join("args"), args).unwrap();
            std::fs::write(d.path().join("job.sh"), JOB).unwrap();
            let out = std::process::Command::new("sh")
                .arg(d.path().join("job.sh"))
                .arg(d.path())
                .env_remove(crate::executor::START_FILE_ENV)
                .output()
                .unwrap();
            (
                out.status.code(),
                std::fs::read_to_string(&mark).ok(),
                std::fs::read_to_string(&seen).ok(),
            )
        };
        assert_eq!(
            run("true"),
            (
                Some(0),
                Some("c.s.0.a1\n".into()),
                Some("c.s.0.a1\n".into())
            )
        );
        // Its setup failed (a site's mount missing on this host): no mark, no payload.
        assert_eq!(run("exit 1"), (Some(1), None, None));
        assert_eq!(run("false"), (Some(126), None, None));
    }

    /// Issue 27 (P06/P07): one submit script launches several attempts, answering each on
    /// its own line once its pid or exit record is there; an attempt started before is `DUP`
    /// (never started twice) and one whose folder cannot be made is `ERR`, the others go on.
    #[test]
    fn one_submit_script_launches_several_attempts_each_exactly_once() {
        let root = tempfile::tempdir().unwrap();
        let job_args = |tag: &str| job_args("", &[], &[], &format!("echo {tag}"));
        let run = |ids: &[&str]| {
            let mut args = vec![
                root.path().display().to_string(),
                wrapper_script(),
                JOB.to_string(),
            ];
            for id in ids {
                args.push(id.to_string());
                args.push(job_args(id));
            }
            let line = command_line("ptron-submit", submit_body(), &[], &args);
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(&line)
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        let out = run(&["a1", "a2"]);
        let m = parse_submit(&out);
        assert_eq!(m.len(), 2, "{out}");
        assert_eq!((&m["a1"], &m["a2"]), (&SubmitAnswer::Ok, &SubmitAnswer::Ok));
        for id in ["a1", "a2"] {
            let d = root.path().join(id);
            // The pid record (or the exit record) was there when the script answered.
            assert!(d.join("job").is_file() || d.join("exit").is_file(), "{id}");
        }
        // a4's folder cannot be made (a file is in the way): its own error only.
        std::fs::write(root.path().join("a4"), b"").unwrap();
        let out = run(&["a1", "a3", "a4"]);
        let m = parse_submit(&out);
        assert_eq!(m["a1"], SubmitAnswer::Dup, "{out}");
        assert_eq!(m["a3"], SubmitAnswer::Ok, "{out}");
        assert!(
            matches!(&m["a4"], SubmitAnswer::Err(w) if w.contains("cannot make")),
            "{out}"
        );
        // Each ran once: its exit record says so, and its log holds one line.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        for id in ["a1", "a2", "a3"] {
            let d = root.path().join(id);
            while !d.join("exit").is_file() {
                assert!(std::time::Instant::now() < deadline, "{id} never ended");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let log = std::fs::read_to_string(d.join("output.log")).unwrap();
            assert_eq!(log, format!("{id}\n"), "{id}");
        }
    }

    /// Runs the poll script locally on one attempt folder holding `wrapper` and `job` records
    /// `rec` (the part after pid and ticks, and after the start time for `job`).
    fn poll_locally(pid: u32, rec: &str) -> String {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join("a1");
        std::fs::create_dir_all(&d).unwrap();
        let ticks = crate::sys::process_start_ticks(pid).unwrap_or(1);
        std::fs::write(d.join("wrapper"), format!("{pid} {ticks} {rec}\n")).unwrap();
        std::fs::write(d.join("job"), format!("{pid} {ticks} 1000 {rec}\n")).unwrap();
        poll_here(root.path(), "a1")
    }

    #[test]
    fn a_recorded_process_is_judged_by_its_pid_only_in_its_own_boot_and_pid_namespace() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let here = crate::sys::ProcessSpace::here();
        let boot = here.boot_id.clone().unwrap();
        let ns = here.pidns.clone().unwrap();
        let machine = std::fs::read_to_string("/etc/machine-id")
            .map(|m| m.trim().to_string())
            .unwrap_or_else(|_| "-".into());
        // Its own space: the live pid with its start time is the job.
        assert_eq!(
            poll_locally(pid, &format!("{boot} {ns} {machine}")),
            "R a1 1000"
        );
        // A record of an older build (pid and ticks only): as before.
        assert_eq!(poll_locally(pid, ""), "R a1 1000");
        // Another PID namespace: its pid means nothing here, and nothing proves it dead.
        assert_eq!(
            poll_locally(pid, &format!("{boot} pid:[1] {machine}")),
            "R a1 1000"
        );
        if machine != "-" {
            // Another boot of this machine: the host rebooted, every process of then is gone,
            // whichever process has that pid (and start time) now.
            assert_eq!(
                poll_locally(pid, &format!("another-boot {ns} {machine}")),
                "D a1"
            );
        }
        // Another boot of a machine that cannot be told the same: not judged dead.
        assert_eq!(
            poll_locally(pid, &format!("another-boot {ns} another-machine")),
            "R a1 1000"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        // Its own space, pid gone: dead.
        assert_eq!(poll_locally(pid, &format!("{boot} {ns} {machine}")), "D a1");
    }
}
