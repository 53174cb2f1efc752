#!/usr/bin/env bash
# bench/shm_compare.sh: bench/shm_collectives.lua (collectives between the ranks of this host)
# for this build against another build of ddplua ($BASE: its repository root, e.g. a git
# worktree of an older commit built with `make CUDA=0`), RUNS alternating rounds (default
# 3) at NPROC ranks (default 2); prints a Markdown table of medians and new/old ratios.
#   BASE=/path/to/old/checkout RUNS=5 NPROC=2 bench/shm_compare.sh
# Without BASE only this build runs. Rows the old build does not print show "-" (an old build
# without dist.shared_buffer: its ordinary tensor's row stands in for allreduce_shared*).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
nproc=${NPROC:-2}
max_mb=${MAX_MB:-64}
base=${BASE:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
here=$(pwd)
for r in $(seq "$runs"); do
  build/ddplua --nproc_per_node="$nproc" --standalone bench/shm_collectives.lua --max-mb "$max_mb" 2>&1 \
    | sed -n 's/^\[rank 0\]: //p' > "$tmp/new.$r"
  if [ -n "$base" ]; then
    (cd "$base" && build/ddplua --nproc_per_node="$nproc" --standalone "$here/bench/shm_collectives.lua" \
      --max-mb "$max_mb" 2>&1 | sed -n 's/^\[rank 0\]: //p') > "$tmp/old.$r"
  fi
done
median() { sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]; else print "-"}'; }
get() { cat "$tmp"/$1.* 2>/dev/null | sed -n "s/^what=$2 bytes=$3 .*$4=\([0-9.]*\).*/\1/p" | median; }
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "$nproc ranks on $(nproc) cores ($cpu), medians of $runs alternating rounds; old = ${base:-none};" \
  "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| figure | size | old µs | new µs | old / new time | old busbw GB/s | new busbw GB/s |"
echo "|---|---|---|---|---|---|---|"
sed -n 's/^what=\([a-z_0-9]*\) bytes=\([0-9]*\).*/\1 \2/p' "$tmp/new.1" | while read -r what bytes; do
  # an old build without dist.shared_buffer: its ordinary tensor's row stands in
  o=$(get old "$what" "$bytes" time_us)
  [ "$o" = - ] && o=$(get old "${what/allreduce_shared/allreduce}" "$bytes" time_us)
  nw=$(get new "$what" "$bytes" time_us)
  bw=$(get new "$what" "$bytes" busbw_gbs)
  obw=$(get old "$what" "$bytes" busbw_gbs)
  [ "$obw" = - ] && obw=$(get old "${what/allreduce_shared/allreduce}" "$bytes" busbw_gbs)
  label=$(awk -v b="$bytes" 'BEGIN { if (b >= 1048576) printf "%d MiB", b / 1048576; else if (b > 0) printf "%d KiB", b / 1024; else print "-" }')
  ratio=$(awk -v a="$o" -v b="$nw" 'BEGIN { if (a == "-" || b == 0) print "-"; else printf "%.2f×", a / b }')
  echo "| $what | $label | $o | $nw | $ratio | $obw | $bw |"
done
