#!/usr/bin/env bash
# bench/multinode_nodes.sh: train.lua's training throughput (samples/s of its epoch line) for
# the same 4-rank job started three ways, in alternating rounds so that load drifts on a
# shared machine hit every variant alike:
#   launcher  one node:      ddplua --nproc_per_node=4 --standalone
#   netns     two nodes:     tools/netns_nodes.sh run 2 (2 ranks each; Gloo TCP over the bridge)
#   mpirun    one node:      mpirun -np 4 (when installed)
# Prints each variant's samples/s per round, the medians and the ratios to the launcher.
# Usage (root for the netns variant): bench/multinode_nodes.sh [ROUNDS=5] [SUBSET=6400]
set -u -o pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
subset=${2:-6400}
dir=$(mktemp -d /tmp/ddplua-bench-nodes.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export DDPLUA_STORE_SECRET=bench-$$
args="train.lua --subset $subset --test-subset 200 --epochs 1 --quiet --threads 1"
rate() { grep -o '[0-9.]* samples/s' | tail -1 | cut -d' ' -f1; }

variants=(launcher netns)
command -v mpirun > /dev/null && variants+=(mpirun)
declare -A all
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    case $v in
      launcher) x=$(build/ddplua --nproc_per_node=4 --standalone $args --out "$dir/l" 2>&1 | rate) ;;
      netns) x=$(tools/netns_nodes.sh run 2 sh -c "exec build/ddplua --nnodes=2 --node_rank=\$NODE_RANK \
          --nproc_per_node=2 --master_addr=\$NODE0_ADDR --master_port=29500 $args --out $dir/n" 2>&1 | rate) ;;
      mpirun) x=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + RANDOM % 30000)) mpirun -np 4 --oversubscribe \
          $([ "$EUID" = 0 ] && echo --allow-run-as-root) build/ddplua $args --out "$dir/m" 2>&1 | rate) ;;
    esac
    echo "round $r $v ${x:-failed} samples/s"
    all[$v]+="${x:-0} "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
base=$(echo "${all[launcher]}" | median)
for v in "${variants[@]}"; do
  m=$(echo "${all[$v]}" | median)
  echo "$v median $m samples/s, ratio to launcher $(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.2f", a / b}')"
done
