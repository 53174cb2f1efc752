#!/usr/bin/env bash
# bench/fsdp.sh: FSDP against DDP on the GPT (bench/fsdp.lua), 2 ranks x 1 thread: median
# step time, the bytes held between steps (parameters + gradients + AdamW state, DDP's
# buckets) and the peak during a step; FSDP with its all-gather prefetch on and off shows
# the all-gather / compute overlap, reshard_after_forward = false the cost of re-gathering
# for backward. ROUNDS rounds (default 3), the modes in a rotated order in each round;
# medians over rounds. Prints a markdown table for bench/RESULTS.md.
#   bash bench/fsdp.sh [ROUNDS] [-- bench/fsdp.lua options]
# PyTorch: Debian's python3-torch 1.13 cannot import torch.distributed.fsdp under Python
# 3.11 (a dataclass with a mutable default in torch.distributed._shard), so there is no
# PyTorch FSDP row; DDP (ddplua's) is the reference row.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
shift || true
[[ "${1:-}" == "--" ]] && shift
args=(--steps 15 --warmup 3 "$@")
modes=(ddp fsdp fsdp-noprefetch fsdp-keep)
declare -A lines
for ((r = 0; r < ROUNDS; r++)); do
  for ((k = 0; k < ${#modes[@]}; k++)); do
    m=${modes[$(((k + r) % ${#modes[@]}))]}
    out=$(build/ddplua --nproc_per_node=2 --standalone bench/fsdp.lua --mode "$m" "${args[@]}" 2>&1 | grep -o 'fsdp mode=.*' || true)
    [[ -n "$out" ]] || { echo "bench/fsdp.sh: mode $m printed nothing" >&2; exit 1; }
    lines[$m]+="$out"$'\n'
  done
done
# the paired prefetch comparison: on and off alternate step by step in one process
ab=""
for ((r = 0; r < ROUNDS; r++)); do
  ab+="$(build/ddplua --nproc_per_node=2 --standalone bench/fsdp.lua --mode fsdp-ab "${args[@]}" 2>&1 | grep -o 'fsdp mode=.*' || true)"$'\n'
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }
echo "$(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores shared with other work, commit $(git rev-parse --short HEAD)."
echo "Command: bash bench/fsdp.sh $ROUNDS -- ${args[*]} (2 ranks x 1 thread, medians of $ROUNDS rounds)."
echo
echo "| mode | step ms (median) | step ms vs DDP | all-gather wait ms / step | state bytes / rank | vs DDP | peak bytes / rank | vs DDP |"
echo "|---|---|---|---|---|---|---|---|"
d_ms=$(printf '%s' "${lines[ddp]}" | field step_ms | median)
d_st=$(printf '%s' "${lines[ddp]}" | field state_bytes | median)
d_pk=$(printf '%s' "${lines[ddp]}" | field peak_bytes | median)
for m in "${modes[@]}"; do
  ms=$(printf '%s' "${lines[$m]}" | field step_ms | median)
  st=$(printf '%s' "${lines[$m]}" | field state_bytes | median)
  pk=$(printf '%s' "${lines[$m]}" | field peak_bytes | median)
  wt=$(printf '%s' "${lines[$m]}" | field allgather_wait_ms | median)
  awk -v m="$m" -v ms="$ms" -v st="$st" -v pk="$pk" -v wt="$wt" -v dms="$d_ms" -v dst="$d_st" -v dpk="$d_pk" \
    'BEGIN { printf "| %s | %.1f | %.2fx | %s | %d | %.2fx | %d | %.2fx |\n", m, ms, ms / dms, (m == "ddp" ? "-" : sprintf("%.2f", wt)), st, st / dst, pk, pk / dpk }'
done
echo
echo "Prefetch on and off alternating step by step in one process (fsdp-ab; medians of each half, then of $ROUNDS rounds):"
echo
echo "| prefetch | step ms | all-gather wait ms / step |"
echo "|---|---|---|"
echo "| on | $(printf '%s' "$ab" | field on_ms | median) | $(printf '%s' "$ab" | field on_wait_ms | median) |"
echo "| off | $(printf '%s' "$ab" | field off_ms | median) | $(printf '%s' "$ab" | field off_wait_ms | median) |"
