#!/usr/bin/env bash
# Fake GPU hosts for the bare-metal executor's tests: several OpenSSH sshd instances on
# loopback addresses (127.0.10.N, port 2222; h1-h7 by default, tests use h1-h4 as the cluster,
# h5/h6 for fault injection and h7 as the sshd-limits host: `MaxSessions 2` and
# `MaxStartups 3:30:10`, where fan-out meets refused sessions and dropped connections as on a
# strict site, issue 27 P06), key authentication only, each "host" with its own fake GPU probe
# (`nvidia-smi -L` listing 4 GPUs) and its own state folder.
#
#   scripts/ssh-hosts.sh start              start every host (idempotent); prints the env to eval
#   scripts/ssh-hosts.sh stop [HOST]        stop every host's sshd (or one), sessions included;
#                                           a host stopped alone stays down until `start HOST`
#   scripts/ssh-hosts.sh start HOST         start one host again
#   scripts/ssh-hosts.sh kill-tasks HOST    kill the processes a host runs (a machine gone for good)
#   scripts/ssh-hosts.sh ps HOST            the processes a host runs (pid, pgid, args)
#   scripts/ssh-hosts.sh env                the variables the tests read
#
# Everything lives in $PUZZLETRON_SSH_HOSTS_DIR (default /tmp/puzzletron-ssh-hosts), which this
# script owns: host and client keys, authorized_keys, known_hosts, an ssh_config with one
# `Host hN` alias per host, and per host hN/: sshd_config, pid file, bin/nvidia-smi, state/,
# home/ (the session's HOME, so the login shell reads no rc file of the machine's user).
# The machine's own ~/.ssh and /etc/ssh are never touched. Only loopback addresses are used.
# Tasks of host hN carry PUZZLETRON_FAKE_HOST=hN and PUZZLETRON_BAREMETAL_ROOT=$DIR/hN/state in
# their environment (set by that sshd); the second is how `ps` and `kill-tasks` tell the hosts
# (and two sets of hosts in two folders) apart on this one machine.
set -euo pipefail
DIR=${PUZZLETRON_SSH_HOSTS_DIR:-/tmp/puzzletron-ssh-hosts}
N=${PUZZLETRON_SSH_HOSTS:-7}
PORT=${PUZZLETRON_SSH_PORT:-2222}
SSHD=/usr/sbin/sshd

hosts() { local i; for i in $(seq 1 "$N"); do echo "h$i"; done; }
addr() { echo "127.0.10.${1#h}"; }
# sshd's session and connection limits: generous everywhere but on h7, the sshd-limits host.
limits() {
  case $1 in
    h7) printf 'MaxSessions 2\nMaxStartups 3:30:10\n' ;;
    *) printf 'MaxSessions 200\nMaxStartups 100:30:200\n' ;;
  esac
}

need_packages() {
  if [ ! -x "$SSHD" ] || ! command -v ssh >/dev/null || ! command -v ssh-keygen >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server openssh-client >&2
    else
      echo "ssh-hosts: need openssh-server and openssh-client (apt-get install -y openssh-server)" >&2
      exit 1
    fi
  fi
}

# Writes stdin to $1 with mode $2, atomically (temp file + rename) and only when the content
# changes: every test's `start` runs setup while other tests' sessions authenticate, and a
# truncate-then-write of authorized_keys or nvidia-smi was seen by a concurrent login as an
# empty file (`Permission denied (publickey)` under CI load).
put() {
  local t="$1.tmp.$$"
  cat > "$t"
  chmod "$2" "$t"
  if [ -f "$1" ] && cmp -s "$t" "$1"; then rm -f "$t"; else mv -f "$t" "$1"; fi
}

setup() {
  mkdir -p "$DIR/keys"
  chmod 700 "$DIR" "$DIR/keys"
  [ -f "$DIR/keys/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C puzzletron-test-host -f "$DIR/keys/host_ed25519"
  [ -f "$DIR/keys/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C puzzletron-test-client -f "$DIR/keys/id_ed25519"
  put "$DIR/keys/authorized_keys" 600 < "$DIR/keys/id_ed25519.pub"
  : > "$DIR/known_hosts.tmp"
  : > "$DIR/ssh_config.tmp"
  for h in $(hosts); do
    local a; a=$(addr "$h")
    echo "[$a]:$PORT $(cut -d' ' -f1,2 "$DIR/keys/host_ed25519.pub")" >> "$DIR/known_hosts.tmp"
    cat >> "$DIR/ssh_config.tmp" <<CFG
Host $h
  HostName $a
  Port $PORT
  User $(id -un)
  IdentityFile $DIR/keys/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/known_hosts
  StrictHostKeyChecking yes
  ConnectTimeout 5
  ServerAliveInterval 2
  ServerAliveCountMax 2

CFG
    mkdir -p "$DIR/$h/bin" "$DIR/$h/state" "$DIR/$h/home"
    put "$DIR/$h/bin/nvidia-smi" 755 <<SMI
#!/bin/sh
# Fake GPU probe of host $h: 4 GPUs.
[ "\$1" = "-L" ] || { echo "fake nvidia-smi: only -L" >&2; exit 2; }
for i in 0 1 2 3; do echo "GPU \$i: Fake H100 ($h) (UUID: GPU-$h-000\$i)"; done
SMI
    put "$DIR/$h/sshd_config" 644 <<CONF
ListenAddress $a:$PORT
HostKey $DIR/keys/host_ed25519
PidFile $DIR/$h/sshd.pid
AuthorizedKeysFile $DIR/keys/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
$(limits "$h")
LogLevel ERROR
SetEnv HOME=$DIR/$h/home PATH=$DIR/$h/bin:/usr/local/bin:/usr/bin:/bin PUZZLETRON_BAREMETAL_ROOT=$DIR/$h/state PUZZLETRON_FAKE_HOST=$h
CONF
  done
  mv "$DIR/known_hosts.tmp" "$DIR/known_hosts"
  mv "$DIR/ssh_config.tmp" "$DIR/ssh_config"
  mkdir -p /run/sshd
}

pid_of() { local f="$DIR/$1/sshd.pid"; [ -f "$f" ] && cat "$f" || true; }
alive() { local p; p=$(pid_of "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

start_host() {
  alive "$1" && return 0
  "$SSHD" -f "$DIR/$1/sshd_config" -E "$DIR/$1/sshd.log"
  local i
  for i in $(seq 1 50); do
    ssh -F "$DIR/ssh_config" -o BatchMode=yes "$1" true 2>/dev/null && return 0
    sleep 0.1
  done
  echo "ssh-hosts: $1 did not answer; see $DIR/$1/sshd.log" >&2
  return 1
}

# The listener and every session process under it (a machine whose network went away: the
# tasks it started keep running, detached by setsid).
stop_host() {
  # The listener(s) of this host: by pid file and by command line (a listener whose pid file
  # was lost must not survive a stop).
  local all="" frontier next c f
  frontier="$(pid_of "$1")"
  # A running sshd rewrites its process title ("sshd: /usr/sbin/sshd -f CFG ... [listener]"),
  # so match the config path inside the title as well as in a plain argv.
  local cl
  for f in /proc/[0-9]*/cmdline; do
    cl=$(tr '\0' ' ' 2>/dev/null < "$f") || continue
    case "$cl" in
      "sshd: "*"$DIR/$1/sshd_config "*|"$SSHD "*"$DIR/$1/sshd_config "*)
        c=${f#/proc/}; frontier="$frontier ${c%/cmdline}" ;;
    esac
  done
  frontier=$(echo $frontier)
  [ -n "$frontier" ] || { rm -f "$DIR/$1/sshd.pid"; return 0; }
  all="$frontier"
  while [ -n "$frontier" ]; do
    next=""
    for c in $frontier; do
      next="$next $( { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pp="$c" '$4 == pp {print $1}' | tr '\n' ' ')"
    done
    frontier=$(echo $next)
    all="$all $frontier"
  done
  for c in $all; do kill -TERM "$c" 2>/dev/null || true; done
  for c in $all; do
    for _ in $(seq 1 50); do kill -0 "$c" 2>/dev/null || break; sleep 0.05; done
  done
  rm -f "$DIR/$1/sshd.pid"
}

# Processes whose environment says they belong to host $1 of this $DIR: by its state folder
# (PUZZLETRON_BAREMETAL_ROOT, set by that sshd), not by the host's name alone, so that
# `kill-tasks h6` of one set of hosts never kills the tasks of another set's h6 running
# beside it (another checkout's tests on another port).
host_pids() {
  local f pid
  for f in $(grep -l -z -x "PUZZLETRON_BAREMETAL_ROOT=$DIR/$1/state" /proc/[0-9]*/environ 2>/dev/null || true); do
    pid=${f#/proc/}; pid=${pid%/environ}
    [ "$pid" = "$$" ] || echo "$pid"
  done
}

print_env() {
  echo "export PUZZLETRON_SSH_CONFIG=$DIR/ssh_config"
  echo "export PUZZLETRON_SSH_HOSTS_LIST=\"$(hosts | tr '\n' ' ' | sed 's/ $//')\""
  echo "export PUZZLETRON_SSH_HOSTS_DIR=$DIR"
  echo "export PUZZLETRON_SSH_TESTS=1"
}

cmd=${1:-}
case "$cmd" in
  start)
    need_packages
    mkdir -p "$DIR"
    exec 9>"$DIR/.lock"
    flock 9
    if [ -n "${2:-}" ]; then rm -f "$DIR/$2/stopped"; start_host "$2"; else
      setup
      # A host stopped on its own (`stop HOST`: a test's outage) stays down until `start HOST`,
      # so one test's `start` of all hosts cannot end another test's outage.
      for h in $(hosts); do [ -e "$DIR/$h/stopped" ] || start_host "$h"; done
      print_env
    fi ;;
  stop)
    # Under the same lock as start: a concurrent start must not launch a listener whose pid
    # file this stop then removes.
    [ -d "$DIR" ] || exit 0
    exec 9>"$DIR/.lock"
    flock 9
    if [ -n "${2:-}" ]; then : > "$DIR/$2/stopped"; stop_host "$2"; else
      for h in $(hosts); do rm -f "$DIR/$h/stopped"; stop_host "$h"; done
    fi ;;
  kill-tasks)
    for p in $(host_pids "$2"); do kill -KILL "$p" 2>/dev/null || true; done ;;
  ps)
    pids=$(host_pids "$2" | tr '\n' ',' | sed 's/,$//')
    [ -z "$pids" ] || ps -o pid=,pgid=,args= -p "$pids" | grep -v ' ps -o ' || true ;;
  env) print_env ;;
  *) echo "usage: $0 start [HOST] | stop [HOST] | kill-tasks HOST | ps HOST | env" >&2; exit 2 ;;
esac
