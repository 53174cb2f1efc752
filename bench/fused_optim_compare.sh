#!/usr/bin/env bash
# bench/fused_optim_compare.sh: the optimizer in backward (ddp:register_optimizer_in_backward)
# against the plain DDP path (backward, then opt:step()), 2 ranks x 1 thread, gloo, MLP
# 784-2048x3-10 (bench/fused_optim.lua). Plain and fused runs alternate (the order flips
# every pair); each run is its own pair of processes, so getrusage's peak RSS is that mode's.
# Prints a Markdown table: medians over RUNS pairs (default 3) of the per-run median step
# time, of rank 0's peak RSS and of its peak of live tensor bytes (dl.memory_stats().peak),
# and the medians of the per-pair ratios fused / plain.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-15}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
one() { build/ddplua --nproc_per_node=2 --standalone bench/fused_optim.lua --mode "$1" --optim "$2" --steps "$steps" --warmup 3; }
echo "| optimizer | step time fused / plain | plain step ms | fused step ms | peak RSS fused / plain | plain peak RSS MiB | fused peak RSS MiB | tensor peak plain / fused MiB | fused bucket steps during backward / total |"
echo "|---|---|---|---|---|---|---|---|---|"
for opt in sgd adam; do
  pt=(); ft=(); pm=(); fm=(); rt=(); rm=(); pk=(); fk=(); ov=""
  for i in $(seq "$runs"); do
    if (( i % 2 )); then p=$(one plain "$opt"); f=$(one fused "$opt"); else f=$(one fused "$opt"); p=$(one plain "$opt"); fi
    a=$(echo "$p" | field step_ms); b=$(echo "$f" | field step_ms)
    c=$(echo "$p" | field peak_rss_mb); d=$(echo "$f" | field peak_rss_mb)
    pt+=("$a"); ft+=("$b"); pm+=("$c"); fm+=("$d")
    pk+=("$(echo "$p" | field tensor_peak_mb)"); fk+=("$(echo "$f" | field tensor_peak_mb)")
    rt+=("$(awk -v x="$b" -v y="$a" 'BEGIN {print x / y}')"); rm+=("$(awk -v x="$d" -v y="$c" 'BEGIN {print x / y}')")
    ov="$(echo "$f" | field during) / $(( $(echo "$f" | field during) + $(echo "$f" | field at_end) ))"
  done
  echo "| $opt | $(printf '%s\n' "${rt[@]}" | median | awk '{printf "%.2f×", $1}') | $(printf '%s\n' "${pt[@]}" | median) | $(printf '%s\n' "${ft[@]}" | median) | $(printf '%s\n' "${rm[@]}" | median | awk '{printf "%.2f×", $1}') | $(printf '%s\n' "${pm[@]}" | median) | $(printf '%s\n' "${fm[@]}" | median) | $(printf '%s\n' "${pk[@]}" | median) / $(printf '%s\n' "${fk[@]}" | median) | $ov |"
done
