#!/usr/bin/env bash
# tools/netns_nodes.sh: N "nodes" on this machine, each a Linux network namespace that a job
# sees as another host, for multi-node specs and benchmarks without a cluster.
#
# Note [namespace nodes]: node K of a run is
#   - a network namespace ddpn-<ID>-n<K> whose eth0 (one end of a veth pair) has the address
#     <SUBNET>.<K+1>/24; the other end hangs on a bridge in a namespace of its own,
#     ddpn-<ID>-br, so the nodes reach each other (and nothing else) over that bridge and the
#     host's own interfaces, routes and addresses are never touched. Each run's bridge lives
#     in its own namespace, so parallel runs may use the same subnet without clashing;
#   - run through `ip netns exec` (which bind-mounts /etc/netns/<ns>/hosts over /etc/hosts:
#     every node resolves node0 .. node<N-1> to their addresses, as a cluster's DNS would)
#     then `unshare --uts --ipc --mount`: its own host name node<K>, its own System V IPC and
#     a private tmpfs on /dev/shm, so no shared memory can cross nodes. ddplua's shared-memory
#     transport (runtime/comm/pg_shm.c) is chosen only when every rank reports the same
#     host name, boot id and IPC/PID/mount namespaces: two nodes differ in host name, IPC and
#     mount namespace while the ranks of one node agree, so a group within one node uses
#     shared memory and a group spanning nodes Gloo TCP over the bridge, as on real machines;
#   - the file system, users and processes' view of /proc are the machine's (a node is not a
#     container): paths such as build/ddplua and an --out folder are the same on every node.
# A run's state lives in $DDPLUA_NETNS_STATE (default /run/ddplua-netns)/<ID>: its owner's
# pid and start time (written before anything is created), so `cleanup` can tell a live run
# from the leftovers of a killed one.
#
# Usage (root; iproute2 and util-linux's unshare):
#   tools/netns_nodes.sh run N CMD [ARG...]
#       create N nodes, run CMD in every node at once with NODE_RANK, NNODES, NODE_NAME,
#       NODE_ADDR, NODE0_ADDR and NETNS_RUN_ID in its environment (the rest of the environment
#       passes through), print each line prefixed "[node K] ", remove the nodes (always: also
#       on failure, Ctrl-C or SIGTERM, e.g. from `timeout`). When a node's command fails the
#       other nodes' processes are stopped (a job would otherwise wait for its collective
#       timeout). Exit status: the first failing node's, else 0.
#   tools/netns_nodes.sh up N [--owner PID]    create N nodes, print the run ID; they stay
#       until `down` or, once process PID has ended, `cleanup`. PID defaults to the caller;
#       in `id=$(tools/netns_nodes.sh up 2 --owner $$)` pass $$ (a command substitution's
#       caller is a subshell that ends at once)
#   tools/netns_nodes.sh exec ID K CMD [ARG...]  run CMD in node K of run ID (as `run` does)
#   tools/netns_nodes.sh link ID K up|down     bring node K's link onto the bridge up or
#       down (a cut cable: its packets are dropped, no connection is told)
#   tools/netns_nodes.sh kill ID K             SIGKILL every process in node K (a node that
#       dies: the kernel closes its connections)
#   tools/netns_nodes.sh down ID               stop the run's processes, remove its nodes
#   tools/netns_nodes.sh cleanup [--all]       remove every run whose owner has ended (--all:
#       every run), and namespaces named ddpn-* that no run's state describes
#   tools/netns_nodes.sh list                  the runs present: ID, owner, live or stale
#   tools/netns_nodes.sh check                 exit 0 when namespaces can be made here, else
#       print why and exit 1 (specs skip with that reason)
# Environment: DDPLUA_NETNS_SUBNET (default 10.213.0: node K is 10.213.0.<K+1>).
set -u -o pipefail

STATE=${DDPLUA_NETNS_STATE:-/run/ddplua-netns}
SUBNET=${DDPLUA_NETNS_SUBNET:-10.213.0}
PREFIX=ddpn

die() { echo "netns_nodes: $*" >&2; exit 2; }

# The start time of process $1 (field 22 of /proc/PID/stat), empty when it is gone (a
# zombie that nobody reaps, e.g. under an init that does not, counts as gone).
start_time() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) } # the command name may hold spaces; the fields after it do not
  set -- $stat
  [ "$1" = Z ] || echo "${20}"
}

node_ns() { echo "$PREFIX-$1-n$2"; }
bridge_ns() { echo "$PREFIX-$1-br"; }

# Kill every process in namespace $1 (TERM, then KILL after $2 seconds).
kill_ns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null) || return 0
  [ -n "$pids" ] || return 0
  kill -TERM $pids 2>/dev/null
  local i
  for ((i = 0; i < ${2:-2} * 10; i++)); do
    pids=$(ip netns pids "$1" 2>/dev/null)
    [ -n "$pids" ] || return 0
    sleep 0.1
  done
  kill -KILL $pids 2>/dev/null
}

# Remove run $1: its processes, namespaces, hosts files and state (each step tolerates
# what is already gone, so a half-made or half-removed run is removed too).
down() {
  local id=$1 ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-$id-n"); do
    kill_ns "$ns" 2
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-$id-"); do
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf /etc/netns/"$PREFIX-$id"-* "$STATE/$id"
}

# Create the N nodes of run $1 (state already written).
up_nodes() {
  local id=$1 n=$2 k br ns
  br=$(bridge_ns "$id")
  ip netns add "$br" || return 1
  ip -n "$br" link add br0 type bridge || return 1
  ip -n "$br" link set br0 up || return 1
  local hosts="127.0.0.1 localhost"$'\n'
  for ((k = 0; k < n; k++)); do hosts+="$SUBNET.$((k + 1)) node$k"$'\n'; done
  for ((k = 0; k < n; k++)); do
    ns=$(node_ns "$id" "$k")
    ip netns add "$ns" || return 1
    mkdir -p "/etc/netns/$ns" && printf '%s' "$hosts" > "/etc/netns/$ns/hosts" || return 1
    ip -n "$br" link add "veth$k" type veth peer name eth0 netns "$ns" || return 1
    ip -n "$br" link set "veth$k" master br0 up || return 1
    ip -n "$ns" addr add "$SUBNET.$((k + 1))/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
  done
  echo "$n" > "$STATE/$id/nodes"
}

# Start a run owned by process $2 with $1 nodes; prints its ID.
new_run() {
  local n=$1 owner=$2 id st
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || die "N must be 1 .. 250, got '$n'"
  mkdir -p "$STATE" || die "cannot create $STATE"
  while :; do
    id=$(od -An -tx1 -N3 /dev/urandom | tr -d ' \n')
    mkdir "$STATE/$id" 2>/dev/null && break
  done
  st=$(start_time "$owner")
  echo "$owner $st" > "$STATE/$id/owner"
  if ! up_nodes "$id" "$n" >&2; then
    down "$id"
    die "could not create the nodes (root, iproute2 and a kernel with veth and bridge needed)"
  fi
  echo "$id"
}

# Run CMD in node $2 of run $1 (replaces this shell).
exec_node() {
  local id=$1 k=$2
  shift 2
  local n
  n=$(cat "$STATE/$id/nodes" 2>/dev/null) || die "no run '$id' (see: $0 list)"
  [[ $k =~ ^[0-9]+$ ]] && ((k < n)) || die "run $id has nodes 0 .. $((n - 1)), got '$k'"
  export NODE_RANK=$k NNODES=$n NODE_NAME=node$k NODE_ADDR=$SUBNET.$((k + 1)) NODE0_ADDR=$SUBNET.1 NETNS_RUN_ID=$id
  exec ip netns exec "$(node_ns "$id" "$k")" unshare --uts --ipc --mount --propagation private \
    sh -c 'hostname "$NODE_NAME" && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec "$@"' node "$@"
}

# Is the owner of run $1 still running (the same process: pid and start time)?
owner_alive() {
  local pid st
  read -r pid st < "$STATE/$1/owner" 2>/dev/null || return 1
  [ -n "$st" ] && [ "$(start_time "$pid")" = "$st" ]
}

cmd_run() {
  (($# >= 2)) || die "usage: $0 run N CMD [ARG...]"
  local n=$1
  shift
  RUN_ID=$(new_run "$n" $$) || exit 2
  local id=$RUN_ID
  trap 'down "$RUN_ID"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  local k j pids=() status=0 done_pid rc
  for ((k = 0; k < n; k++)); do
    ("$0" exec "$id" "$k" "$@" 2>&1 | sed -u "s/^/[node $k] /") &
    pids+=($!)
  done
  while ((${#pids[@]} > 0)); do
    wait -n -p done_pid "${pids[@]}"
    rc=$?
    local left=()
    for k in "${pids[@]}"; do [ "$k" = "$done_pid" ] || left+=("$k"); done
    pids=("${left[@]}")
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "netns_nodes: a node's command failed (status $rc); stopping the other nodes" >&2
      for ((j = 0; j < n; j++)); do kill_ns "$(node_ns "$id" "$j")" 5; done
    fi
  done
  exit "$status"
}

cmd_cleanup() {
  local all=0 d id ns
  [ "${1:-}" = "--all" ] && all=1
  for d in "$STATE"/*/; do
    [ -d "$d" ] || continue
    id=$(basename "$d")
    if ((all)) || ! owner_alive "$id"; then
      echo "removing run $id"
      down "$id"
    fi
  done
  # namespaces of a run whose state is gone (e.g. a state folder removed by hand)
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-[0-9a-f]*-"); do
    id=${ns#"$PREFIX"-}
    id=${id%%-*}
    if [ ! -d "$STATE/$id" ]; then
      echo "removing namespace $ns (no run state)"
      kill_ns "$ns" 2
      ip netns del "$ns" 2>/dev/null
      rm -rf "/etc/netns/$ns"
    fi
  done
}

cmd_check() {
  [ "$EUID" = 0 ] || { echo "needs root to create network namespaces (uid $EUID)"; return 1; }
  local c
  for c in ip unshare; do
    command -v "$c" >/dev/null 2>&1 || { echo "$c is not installed (make deps)"; return 1; }
  done
  local id
  if ! id=$(new_run 2 $$ 2>&1); then
    echo "${id##*$'\n'}"
    return 1
  fi
  id=${id##*$'\n'}
  local out
  out=$("$0" exec "$id" 1 sh -c 'hostname' 2>&1)
  down "$id"
  [ "$out" = node1 ] || { echo "cannot run a command in a node: $out"; return 1; }
}

case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  up)
    shift
    (($# >= 1)) || die "usage: $0 up N [--owner PID]"
    owner=$PPID
    [ "${2:-}" = "--owner" ] && owner=${3:?--owner needs a pid}
    new_run "$1" "$owner" || exit 2
    ;;
  exec) shift; (($# >= 3)) || die "usage: $0 exec ID K CMD [ARG...]"; exec_node "$@" ;;
  down) shift; (($# == 1)) || die "usage: $0 down ID"; down "$1" ;;
  link)
    shift
    (($# == 3)) && [[ $3 =~ ^(up|down)$ ]] || die "usage: $0 link ID K up|down"
    ip -n "$(node_ns "$1" "$2")" link set eth0 "$3"
    ;;
  kill)
    shift
    (($# == 2)) || die "usage: $0 kill ID K"
    pids=$(ip netns pids "$(node_ns "$1" "$2")") || die "no node $2 in run $1"
    # Some of the listed processes may end on their own before the signal: not an error.
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ;;
  cleanup) shift; cmd_cleanup "$@" ;;
  list)
    for d in "$STATE"/*/; do
      [ -d "$d" ] || continue
      id=$(basename "$d")
      owner_alive "$id" && s=live || s=stale
      echo "$id $(cut -d' ' -f1 "$d/owner" 2>/dev/null) $s"
    done
    ;;
  check) cmd_check ;;
  *) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
