#!/usr/bin/env bash
# bench/hierarchical_nodes.sh: all-reduce time and train.lua throughput on 2 namespace nodes x
# 2 ranks (tools/netns_nodes.sh), hierarchical (the default for such a group: Note
# [hierarchical all-reduce] in runtime/comm/pg_gloo.c) against the flat Gloo ring
# (DDPLUA_HIERARCHICAL=0), in alternating rounds so that load drifts on a shared machine hit
# both alike. RATE (e.g. 1gbit) shapes each node's eth0 with a token bucket (tc tbf) before
# the job; this kernel has no sch_netem, so no delay can be added. Prints every round and
# the medians with the flat/hierarchical ratio.
# Usage (root): bench/hierarchical_nodes.sh [ROUNDS=5] [RATE=none] [SUBSET=3200]
set -u -o pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
rate=${2:-none}
subset=${3:-3200}
dir=$(mktemp -d /tmp/ddplua-bench-hier.XXXXXX)
trap 'rm -rf "$dir"' EXIT
export DDPLUA_STORE_SECRET=bench-$$
shape=true
[ "$rate" = none ] || shape="tc qdisc add dev eth0 root tbf rate $rate burst 256kb latency 20ms"
launch="build/ddplua --nnodes=2 --node_rank=\$NODE_RANK --nproc_per_node=2 --master_addr=\$NODE0_ADDR --master_port=29500"
train="train.lua --subset $subset --test-subset 200 --epochs 1 --quiet --threads 1 --out $dir/t"
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

for ((r = 1; r <= rounds; r++)); do
  for v in hier flat; do
    h=1; [ $v = flat ] && h=0
    DDPLUA_HIERARCHICAL=$h tools/netns_nodes.sh run 2 sh -c "$shape && exec $launch bench/hierarchical_allreduce.lua 5" \
      2>&1 | grep -o 'size [0-9]* ms [0-9.]*' | while read -r _ s _ ms; do echo "$v $s $ms"; done >> "$dir/ar"
    x=$(DDPLUA_HIERARCHICAL=$h tools/netns_nodes.sh run 2 sh -c "$shape && exec $launch $train" 2>&1 |
      grep -o '[0-9.]* samples/s' | tail -1 | cut -d' ' -f1)
    echo "round $r $v train ${x:-failed} samples/s"
    echo "$v ${x:-0}" >> "$dir/train"
  done
done
echo "link: ${rate} (tc tbf on each node's eth0)"
for s in $(awk '{print $2}' "$dir/ar" | sort -un); do
  mh=$(awk -v s="$s" '$1 == "hier" && $2 == s {print $3}' "$dir/ar" | median)
  mf=$(awk -v s="$s" '$1 == "flat" && $2 == s {print $3}' "$dir/ar" | median)
  echo "all_reduce $((s / 1048576)) MiB: hierarchical $mh ms, flat $mf ms, flat/hierarchical $(awk -v a="$mf" -v b="$mh" 'BEGIN {printf "%.2f", a / b}')"
done
th=$(awk '$1 == "hier" {print $2}' "$dir/train" | median)
tf=$(awk '$1 == "flat" {print $2}' "$dir/train" | median)
echo "train.lua: hierarchical $th samples/s, flat $tf samples/s, hierarchical/flat $(awk -v a="$th" -v b="$tf" 'BEGIN {printf "%.2f", a / b}')"
