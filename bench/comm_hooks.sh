#!/usr/bin/env bash
# bench/comm_hooks.sh: DDP communication hooks, 2 ranks x 1 thread (gloo, CPU): bytes handed
# to all-reduces per step and ms per step for no hook / allreduce / fp16 / bf16 / PowerSGD
# (rank 2) on the CNN and the MLP (bench/comm_hooks.lua), RUNS runs with the hooks
# alternating inside each run, medians; prints a markdown table. ACC_EPOCHS=E (> 0) adds the
# test accuracy of the CNN after E epochs with no hook and with PowerSGD rank 2.
#   RUNS=3 CNN_STEPS=40 MLP_STEPS=200 ACC_EPOCHS=3 bash bench/comm_hooks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}; CNN_STEPS=${CNN_STEPS:-40}; MLP_STEPS=${MLP_STEPS:-200}; ACC_EPOCHS=${ACC_EPOCHS:-0}
hooks="none allreduce fp16 bf16 powersgd"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for run in $(seq "$RUNS"); do
  for model in cnn mlp; do
    steps=$CNN_STEPS; [ "$model" = mlp ] && steps=$MLP_STEPS
    for hook in $hooks; do
      build/ddplua --nproc_per_node=2 --standalone bench/comm_hooks.lua --model "$model" --hook "$hook" \
        --steps "$steps" --warmup 10 2>&1 | sed -n 's/^\[rank 0\]: //p' >> "$out/lines"
    done
  done
done
echo "| model | hook | bytes all-reduced per step (per rank) | bytes / no hook | ms per step (median of $RUNS) | time / no hook |"
echo "|---|---|---|---|---|---|"
for model in cnn mlp; do
  base_b=""; base_t=""
  for hook in $hooks; do
    b=$(grep "model=$model hook=$hook " "$out/lines" | head -n 1 | sed 's/.*bytes_per_step=\([0-9]*\).*/\1/')
    t=$(grep "model=$model hook=$hook " "$out/lines" | sed 's/.*ms_per_step=\([0-9.]*\).*/\1/' | sort -g \
        | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
    [ -z "$base_b" ] && base_b=$b && base_t=$t
    awk -v m="$model" -v h="$hook" -v b="$b" -v t="$t" -v bb="$base_b" -v bt="$base_t" \
      'BEGIN {printf "| %s | %s | %d | %.3f | %.2f | %.2f |\n", m, h, b, b / bb, t, t / bt}'
  done
done
if [ "$ACC_EPOCHS" -gt 0 ]; then
  echo
  echo "| CNN, $ACC_EPOCHS epochs, 2 ranks | test accuracy | seconds |"
  echo "|---|---|---|"
  for hook in none powersgd; do
    line=$(build/ddplua --nproc_per_node=2 --standalone bench/comm_hooks.lua --model cnn --hook "$hook" \
      --epochs "$ACC_EPOCHS" 2>&1 | sed -n 's/^\[rank 0\]: //p')
    echo "$line" >&2
    echo "$line" | sed 's/.*hook=\([a-z0-9]*\).*test_acc=\([0-9.]*\) seconds=\([0-9.]*\).*/| \1 | \2 | \3 |/'
  done
fi
