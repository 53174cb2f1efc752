#!/usr/bin/env bash
# bench/allreduce_compare.sh: 2-rank gloo all-reduce, ddplua (bench/allreduce.lua under the
# launcher) against torch.distributed (bench/allreduce_torch.py under torchrun), run
# alternately RUNS times (default 3); prints a Markdown table of medians, ratios first.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
max_mb=${MAX_MB:-256}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$runs"); do
  build/ddplua --nproc_per_node=2 --standalone bench/allreduce.lua --max-mb "$max_mb" 2>&1 \
    | sed -n 's/^\[rank 0\]: //p' > "$tmp/ddplua.$r"
  port=$((29600 + RANDOM % 300))
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 \
    --redirects 2 --tee 2 --master_port "$port" bench/allreduce_torch.py --max-mb "$max_mb" 2>/dev/null \
    | grep -o 'bytes=.*' > "$tmp/torch.$r"
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
get() { sed -n "s/^bytes=$2 .*$3=\([0-9.]*\).*/\1/p" "$tmp"/$1.* | median; }
echo "| size | ddplua / PyTorch bus bandwidth | ddplua time µs | PyTorch time µs | ddplua busbw GB/s | PyTorch busbw GB/s |"
echo "|---|---|---|---|---|---|"
for bytes in $(sed -n 's/^bytes=\([0-9]*\).*/\1/p' "$tmp/ddplua.1"); do
  dt=$(get ddplua "$bytes" time_us); tt=$(get torch "$bytes" time_us)
  db=$(get ddplua "$bytes" busbw_gbs); tb=$(get torch "$bytes" busbw_gbs)
  label=$(awk -v b="$bytes" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024 }')
  ratio=$(awk -v a="$tt" -v b="$dt" 'BEGIN {printf "%.2f×", a / b}')
  echo "| $label | $ratio | $dt | $tt | $db | $tb |"
done
