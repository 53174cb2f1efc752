#!/usr/bin/env bash
# bench/train_compare.sh: samples/s and peak RSS of ddplua (bench/train.lua) and PyTorch
# (bench/train_torch.py) training the same MLP and CNN on Fashion-MNIST, batch 64, with 1
# and then 2 threads; the two alternate run by run so both see the same machine load.
# Prints a Markdown table of medians over RUNS runs (default 3), ratios first.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-200}
# PyTorch at its best (TOOLCHAIN.md): its AVX-512 kernels where the CPU has AVX-512.
aten_cap=""
grep -q avx512f /proc/cpuinfo && aten_cap="ATEN_CPU_CAPABILITY=avx512"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
echo "| model | threads | ddplua / PyTorch samples/s | ddplua samples/s | PyTorch samples/s | ddplua peak RSS MiB | PyTorch peak RSS MiB |"
echo "|---|---|---|---|---|---|---|"
for model in mlp cnn; do
  for threads in 1 2; do
    d_sps=(); t_sps=(); d_rss=(); t_rss=()
    for _ in $(seq "$runs"); do
      out=$(build/ddplua bench/train.lua --model "$model" --threads "$threads" --steps "$steps")
      d_sps+=("$(echo "$out" | field samples_per_s)"); d_rss+=("$(echo "$out" | field peak_rss_mb)")
      out=$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE \
            env $aten_cap /usr/bin/python3 bench/train_torch.py --model "$model" \
            --threads "$threads" --steps "$steps")
      t_sps+=("$(echo "$out" | field samples_per_s)"); t_rss+=("$(echo "$out" | field peak_rss_mb)")
    done
    ds=$(printf '%s\n' "${d_sps[@]}" | median); ts=$(printf '%s\n' "${t_sps[@]}" | median)
    dr=$(printf '%s\n' "${d_rss[@]}" | median); tr=$(printf '%s\n' "${t_rss[@]}" | median)
    ratio=$(awk -v a="$ds" -v b="$ts" 'BEGIN {printf "%.2f×", a / b}')
    echo "| $model | $threads | $ratio | $ds | $ts | $dr | $tr |"
  done
done
