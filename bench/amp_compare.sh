#!/usr/bin/env bash
# bench/amp_compare.sh: CNN training samples/s on the CPU in f32 and with bf16 autocast, for
# ddplua (bench/train.lua --amp bf16) and PyTorch (bench/train_torch.py --amp bf16:
# torch.autocast("cpu", dtype=torch.bfloat16)), batch 64, THREADS threads (default 1). The
# four configurations alternate run by run so all see the same machine load. Prints a
# Markdown table of medians over RUNS runs (default 3), ratios first.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-100}
threads=${THREADS:-1}
aten_cap=""
grep -q avx512f /proc/cpuinfo && aten_cap="ATEN_CPU_CAPABILITY=avx512"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
declare -A sps
for _ in $(seq "$runs"); do
  for amp in f32 bf16; do
    flag=""; [ "$amp" = bf16 ] && flag="--amp bf16"
    sps[d_$amp]+="$(build/ddplua bench/train.lua --model cnn --threads "$threads" --steps "$steps" $flag | field samples_per_s) "
    sps[t_$amp]+="$(OPENBLAS_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE \
      env $aten_cap /usr/bin/python3 bench/train_torch.py --model cnn --threads "$threads" \
      --steps "$steps" $flag 2>/dev/null | field samples_per_s) "
  done
done
med() { printf '%s\n' ${sps[$1]} | median; }
df=$(med d_f32); db=$(med d_bf16); tf=$(med t_f32); tb=$(med t_bf16)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f×", a / b}'; }
echo "| CNN, $threads thread(s), batch 64 | bf16 / f32 | f32 samples/s | bf16 autocast samples/s |"
echo "|---|---|---|---|"
echo "| ddplua | $(ratio "$db" "$df") | $df | $db |"
echo "| PyTorch 1.13 | $(ratio "$tb" "$tf") | $tf | $tb |"
echo "| ddplua / PyTorch | | $(ratio "$df" "$tf") | $(ratio "$db" "$tb") |"
