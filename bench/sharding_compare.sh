#!/usr/bin/env bash
# bench/sharding_compare.sh: 2-rank reduce_scatter_tensor and all_gather_into_tensor against
# the all-reduce of the same size, ddplua through shared memory (the default on one host),
# ddplua through Gloo over TCP (DDPLUA_SHM=0) and torch.distributed's gloo (PyTorch 1.13:
# no reduce-scatter and no all_gather_into_tensor in its gloo, so the reference times what a
# script does instead: bench/sharding_collectives_torch.py). The three run alternately RUNS
# times (default 3); prints a Markdown table of the medians. Sizes: 64 KiB .. MAX_MB (default
# 64) MiB, x4; `size` is the full tensor (bench/sharding_collectives.lua).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
max_mb=${MAX_MB:-64}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$runs"); do
  build/ddplua --nproc_per_node=2 --standalone bench/sharding_collectives.lua --max-mb "$max_mb" 2>&1 \
    | sed -n 's/^\[rank 0\]: //p' > "$tmp/shm.$r"
  DDPLUA_SHM=0 build/ddplua --nproc_per_node=2 --standalone bench/sharding_collectives.lua --max-mb "$max_mb" 2>&1 \
    | sed -n 's/^\[rank 0\]: //p' > "$tmp/tcp.$r"
  port=$((29600 + RANDOM % 300))
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 \
    --redirects 2 --tee 2 --master_port "$port" bench/sharding_collectives_torch.py --max-mb "$max_mb" 2>/dev/null \
    | grep -o 'op=.*' > "$tmp/torch.$r"
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
get() { sed -n "s/^op=$2 bytes=$3 .*$4=\([0-9.]*\).*/\1/p" "$tmp"/$1.* | median; }
echo "| size | collective | shm busbw GB/s | shm / all-reduce busbw | shm µs | Gloo TCP busbw GB/s | TCP µs | PyTorch gloo busbw GB/s | PyTorch µs | shm / PyTorch time |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for bytes in $(sed -n 's/^op=all_reduce bytes=\([0-9]*\).*/\1/p' "$tmp/shm.1"); do
  label=$(awk -v b="$bytes" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024 }')
  ar=$(get shm all_reduce "$bytes" busbw_gbs)
  for op in all_reduce reduce_scatter_tensor all_gather_into_tensor; do
    sb=$(get shm $op "$bytes" busbw_gbs); st=$(get shm $op "$bytes" time_us)
    cb=$(get tcp $op "$bytes" busbw_gbs); ct=$(get tcp $op "$bytes" time_us)
    tb=$(get torch $op "$bytes" busbw_gbs); tt=$(get torch $op "$bytes" time_us)
    rel=$(awk -v a="$sb" -v b="$ar" 'BEGIN {printf "%.2f", a / b}')
    ratio=$(awk -v a="$tt" -v b="$st" 'BEGIN {printf "%.2f×", a / b}')
    echo "| $label | $op | $sb | $rel | $st | $cb | $ct | $tb | $tt | $ratio |"
  done
done
