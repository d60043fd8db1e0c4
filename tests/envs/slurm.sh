#!/usr/bin/env bash
# Brings up a one-node SLURM cluster on this machine for the SLURM tier
# (tests/ecosystem/slurm) and prints the python to run those tests with on the last line of
# stdout (the main interpreter, $PYTHON, default python3; progress goes to stderr):
#
#   py=$(bash tests/envs/slurm.sh | tail -n 1) && "$py" -m pytest -q tests/ecosystem/slurm
#
# Needs root. Debian's slurm-wlm and munge are installed with apt-get when missing; a munge
# key is made when there is none (/etc/munge/munge.key, owned by munge, 0400) and munged is
# started as the munge user. /etc/slurm/slurm.conf describes one node (this machine's short
# host name at 127.0.0.1, `nproc` CPUs) in one partition, select/cons_tres and
# proctrack/linuxproc (no cgroups), state and logs under /var/spool/fastps-slurm and
# /var/log/fastps-slurm. slurmctld and slurmd run as root, in the background, and stay up
# after this script (the tests need them); the script waits (at most 60 s) until `sinfo`
# shows the node idle. Safe to run repeatedly: quick when all is up with this configuration;
# a changed configuration restarts both daemons.
#
# To stop everything it started:
#   kill $(cat /run/fastps-slurm/slurmctld.pid /run/fastps-slurm/slurmd.pid /run/munge/munged.pid)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
CONF=/etc/slurm/slurm.conf
SPOOL=/var/spool/fastps-slurm
LOGS=/var/log/fastps-slurm
RUN=/run/fastps-slurm
WAIT_S=60

say() { echo "slurm env: $*" >&2; }
die() {
  say "$*"
  exit 1
}

[ "$(id -u)" = 0 ] || die "needs root (starts munged, slurmctld and slurmd)"

missing=()
for tool in sinfo:slurm-wlm slurmctld:slurm-wlm slurmd:slurm-wlm munged:munge; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian's slurm-wlm and munge (missing: ${missing[*]})"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends slurm-wlm munge >&2
fi

# --- munge: a key, and munged running as the munge user
if [ ! -s /etc/munge/munge.key ]; then
  say "creating a munge key"
  install -d -o munge -g munge -m 0700 /etc/munge
  (umask 077 && dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none)
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
for dir in /var/lib/munge /var/log/munge; do
  [ -d "$dir" ] || install -d -o munge -g munge -m 0700 "$dir"
done
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  say "starting munged"
  if [ -f /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
  fi
  runuser -u munge -- munged --force
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.2
  done
  munge -n </dev/null | unmunge >/dev/null || die "munged does not answer (see /var/log/munge)"
fi

# --- slurm.conf for one node: this machine
node=$(hostname -s)
cpus=$(nproc)
conf_text=$(
  cat <<EOF
# Written by fastps tests/envs/slurm.sh: a one-node cluster on this machine.
ClusterName=fastps
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=60
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
)
install -d -m 0755 /etc/slurm "$SPOOL/ctld" "$SPOOL/d" "$LOGS" "$RUN"
changed=0
if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$conf_text" ]; then
  say "writing $CONF (node $node, $cpus CPUs)"
  printf '%s\n' "$conf_text" >"$CONF"
  changed=1
fi

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop() { # pid file, name
  if running "$1"; then
    say "stopping $2 (configuration changed)"
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 50); do running "$1" || return 0; sleep 0.2; done
    kill -9 "$(cat "$1")" 2>/dev/null || true
  fi
}
if [ $changed = 1 ]; then
  stop "$RUN/slurmd.pid" slurmd
  stop "$RUN/slurmctld.pid" slurmctld
fi
if ! running "$RUN/slurmctld.pid"; then
  say "starting slurmctld"
  slurmctld || die "slurmctld did not start (see $LOGS/slurmctld.log)"
fi
if ! running "$RUN/slurmd.pid"; then
  say "starting slurmd"
  slurmd || die "slurmd did not start (see $LOGS/slurmd.log)"
fi

# --- wait until the node takes jobs
deadline=$((SECONDS + WAIT_S))
state=""
while :; do
  state=$(sinfo -h -N -n "$node" -o '%t' 2>/dev/null | head -n 1 || true)
  case "$state" in
    idle | mix | alloc) break ;;
    drain* | down* | drng | fail*)
      # A node that came back after a restart may still carry its old state.
      scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
      ;;
  esac
  if [ $SECONDS -ge $deadline ]; then
    tail -n 20 "$LOGS/slurmctld.log" "$LOGS/slurmd.log" >&2 || true
    die "node $node is not idle after ${WAIT_S} s (state: ${state:-no answer from sinfo})"
  fi
  sleep 0.5
done
say "node $node is $state ($cpus CPUs)"

if ! "$PY" -c "import fastps._core, fastps.torch, pytest, sklearn" >/dev/null 2>&1; then
  die "$PY lacks fastps (built), torch, pytest or scikit-learn: run tests/run.sh's setup first"
fi
"$PY" -c 'import sys; print(sys.executable)'
