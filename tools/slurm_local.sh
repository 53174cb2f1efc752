#!/usr/bin/env bash
# tools/slurm_local.sh: a private Slurm cluster on this machine, brought up for one command
# and taken down after it, so the README's sbatch script and srun lines can run for real.
#
# Note [local Slurm]: everything the cluster needs lives in a fresh folder
# /run/ddplua-slurm.XXXXXX: a munge key and a munged of its own (its socket there, named in
# AuthInfo), a slurm.conf generated for this machine (each node gets this machine's cores
# and memory; proctrack/linuxproc and task/none, so neither systemd nor cgroup limits are
# used; accounting off), the daemons' state, logs and pid files. slurmd still looks for
# the cgroup file systems at start: in a namespace node (whose /sys is its own) it gets a
# tmpfs at /sys/fs/cgroup and mounts the v1 controllers there itself (cgroup.conf's
# CgroupAutomount), in that node's private mount namespace. The machine's /etc/slurm and
# /etc/munge are not touched, and client commands find the cluster through $SLURM_CONF.
#   --nodes 1 (default): slurmctld and one slurmd named after this host (so the README's
#   `scontrol show hostnames` gives a name that resolves), at 127.0.0.1, on free ports.
#   --nodes N > 1: the nodes of tools/netns_nodes.sh (root only): slurmctld and slurmd 0 in
#   namespace node 0, slurmd K in node K, so the job's tasks run on hosts named node0 ..
#   node<N-1> with their own addresses, and CMD runs in node 0 (where a login node would
#   submit from). Each slurmd reports this machine's cores, so N nodes oversubscribe them.
# Usage (root; Debian's slurmctld, slurmd, slurm-client and munge):
#   tools/slurm_local.sh run [--nodes N] CMD [ARG...]   start the cluster, run CMD with
#       SLURM_CONF set (e.g. `sbatch --wait job.sh`), stop the cluster and remove its folder
#       (always: also when CMD fails or this script is interrupted). Exit status: CMD's.
#   tools/slurm_local.sh cleanup    stop the daemons of runs whose script has ended
#   tools/slurm_local.sh check      exit 0 when the packages are here, else say which is missing
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
NODES_TOOL=$here/netns_nodes.sh

die() { echo "slurm_local: $*" >&2; exit 2; }

cmd_check() {
  [ "$EUID" = 0 ] || { echo "needs root to run the Slurm daemons (uid $EUID)"; return 1; }
  local c
  for c in munged slurmctld slurmd sbatch srun sinfo scontrol; do
    command -v "$c" >/dev/null 2>&1 || {
      echo "$c is not installed (make deps installs slurmctld, slurmd, slurm-client and munge)"
      return 1
    }
  done
}

# A TCP port nothing on 127.0.0.1 listens on now.
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}

# Stop the daemons of the cluster in folder $1 and remove it.
stop_cluster() {
  local dir=$1 f pid i
  [ -f "$dir/netns_id" ] && "$NODES_TOOL" down "$(cat "$dir/netns_id")"
  for f in "$dir"/slurmd*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || continue
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  rm -rf "$dir"
}

write_conf() { # dir nodes ctl_port d_port
  local dir=$1 n=$2 cport=$3 dport=$4 cpus mem k
  cpus=$(nproc)
  mem=$(awk '/^MemTotal:/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  {
    echo "ClusterName=ddplua"
    # slurmctld runs only where the host name is SlurmctldHost's
    if ((n == 1)); then echo "SlurmctldHost=$(hostname -s)(127.0.0.1)"; else echo "SlurmctldHost=node0(10.213.0.1)"; fi
    cat <<EOF
SlurmctldPort=$cport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd.%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MailProg=/bin/true
EOF
    if ((n == 1)); then
      echo "NodeName=$(hostname -s) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    else
      for ((k = 0; k < n; k++)); do
        echo "NodeName=node$k NodeAddr=10.213.0.$((k + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
      done
    fi
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$dir/slurm.conf"
}

# Run CMD in the cluster's login place: this namespace, or node 0's.
in_login() {
  if [ -f "$DIR/netns_id" ]; then "$NODES_TOOL" exec "$(cat "$DIR/netns_id")" 0 "$@"; else "$@"; fi
}

cmd_run() {
  local n=1
  if [ "${1:-}" = "--nodes" ]; then n=${2:?--nodes needs a number}; shift 2; fi
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 16)) || die "--nodes must be 1 .. 16, got '$n'"
  (($# >= 1)) || die "usage: $0 run [--nodes N] CMD [ARG...]"
  local why
  why=$(cmd_check) || die "$why"
  DIR=$(mktemp -d /run/ddplua-slurm.XXXXXX) || die "cannot create a folder under /run"
  echo "$$" > "$DIR/owner"
  trap 'stop_cluster "$DIR"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  export SLURM_CONF=$DIR/slurm.conf
  mkdir -p "$DIR/ctld"
  head -c 1024 /dev/urandom > "$DIR/munge.key" && chmod 600 "$DIR/munge.key"
  munged < /dev/null > /dev/null 2>&1 --force --key-file="$DIR/munge.key" --socket="$DIR/munge.socket" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed" || die "munged did not start: $(cat "$DIR/munged.log" 2>/dev/null)"
  local cport dport k
  if ((n == 1)); then
    cport=$(free_port) dport=$(free_port)
    write_conf "$DIR" 1 "$cport" "$dport"
    slurmctld -f "$SLURM_CONF" < /dev/null > /dev/null 2>&1 || die "slurmctld did not start: $(tail -5 "$DIR/slurmctld.log")"
    mkdir -p "$DIR/slurmd.$(hostname -s)"
    slurmd -f "$SLURM_CONF" < /dev/null > /dev/null 2>&1 || die "slurmd did not start: $(tail -5 "$DIR"/slurmd.*.log)"
  else
    local id
    id=$("$NODES_TOOL" up "$n" --owner $$) || die "could not create the namespace nodes"
    echo "$id" > "$DIR/netns_id"
    write_conf "$DIR" "$n" 6817 6818 # each node's namespace is new: its ports are free
    printf 'CgroupPlugin=cgroup/v1\nCgroupAutomount=yes\n' > "$DIR/cgroup.conf"
    "$NODES_TOOL" exec "$id" 0 slurmctld -f "$SLURM_CONF" < /dev/null > /dev/null 2>&1 || die "slurmctld did not start: $(tail -5 "$DIR/slurmctld.log")"
    for ((k = 0; k < n; k++)); do
      # `ip netns exec` mounts a fresh /sys, without the cgroup file systems slurmd reads:
      # a tmpfs there, and slurmd mounts the controllers (cgroup.conf's CgroupAutomount)
      mkdir -p "$DIR/slurmd.node$k"
      "$NODES_TOOL" exec "$id" "$k" sh -c 'mountpoint -q /sys/fs/cgroup ||
          mount -t tmpfs -o mode=755 cgroup_root /sys/fs/cgroup
        exec slurmd -f "$SLURM_CONF" -N "$NODE_NAME"' < /dev/null > /dev/null 2>&1 ||
        die "slurmd on node$k did not start: $(tail -25 "$DIR/slurmd.node$k.log")"
    done
  fi
  # Wait (at most 60 s) until every node is idle.
  local i idle=0
  for ((i = 0; i < 600; i++)); do
    idle=$(in_login sinfo -h -N -o '%T' 2>/dev/null | grep -c '^idle$')
    ((idle == n)) && break
    sleep 0.1
  done
  ((idle == n)) || die "the nodes did not come up within 60 s: $(in_login sinfo -N 2>&1); $(tail -5 "$DIR"/slurm*.log)"
  local status=0
  in_login "$@" || status=$?
  exit "$status"
}

cmd_cleanup() {
  local d pid
  for d in /run/ddplua-slurm.*/; do
    [ -d "$d" ] || continue
    pid=$(cat "$d/owner" 2>/dev/null)
    if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
      echo "stopping the cluster in $d"
      stop_cluster "${d%/}"
    fi
  done
}

case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  cleanup) cmd_cleanup ;;
  check) cmd_check ;;
  *) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
