#!/usr/bin/env bash
# bench/ddp_compare.sh: DDP training throughput, 2 ranks x 1 thread, ddplua (launcher +
# bench/train.lua) against PyTorch DDP under torchrun (bench/train_torch.py), same models,
# batch 64 per rank, gloo; plus each framework's single process (1 thread) for the scaling
# from 1 to 2 ranks. Alternating runs, medians of RUNS (default 3). Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-150}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
echo "| model | ddplua / PyTorch (2 ranks) | ddplua 2×1 samples/s | PyTorch 2×1 samples/s | ddplua scaling 1→2 | PyTorch scaling 1→2 |"
echo "|---|---|---|---|---|---|"
for model in mlp cnn; do
  d2=(); t2=(); d1=(); t1=()
  for _ in $(seq "$runs"); do
    d2+=("$(build/ddplua --nproc_per_node=2 --standalone bench/train.lua --model "$model" --threads 1 --steps "$steps" | field samples_per_s)")
    port=$((29300 + RANDOM % 300))
    t2+=("$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 -m torch.distributed.run \
      --nproc_per_node 2 --redirects 2 --tee 2 --master_port "$port" bench/train_torch.py --model "$model" \
      --threads 1 --steps "$steps" 2>/dev/null | field samples_per_s)")
    d1+=("$(build/ddplua bench/train.lua --model "$model" --threads 1 --steps "$steps" | field samples_per_s)")
    t1+=("$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/train_torch.py \
      --model "$model" --threads 1 --steps "$steps" | field samples_per_s)")
  done
  D2=$(printf '%s\n' "${d2[@]}" | median); T2=$(printf '%s\n' "${t2[@]}" | median)
  D1=$(printf '%s\n' "${d1[@]}" | median); T1=$(printf '%s\n' "${t1[@]}" | median)
  echo "| $model | $(awk -v a="$D2" -v b="$T2" 'BEGIN {printf "%.2f×", a / b}') | $D2 | $T2 | $(awk -v a="$D2" -v b="$D1" 'BEGIN {printf "%.2f×", a / b}') | $(awk -v a="$T2" -v b="$T1" 'BEGIN {printf "%.2f×", a / b}') |"
done
