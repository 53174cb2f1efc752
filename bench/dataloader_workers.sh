#!/usr/bin/env bash
# bench/dataloader_workers.sh: samples/s of a DataLoader over a dataset with a costly
# per-sample augmentation written in the framework's own language (a Lua ds:get loop for
# ddplua: bench/dataloader_workers.lua; tensor ops in __getitem__ for PyTorch:
# bench/dataloader_workers_torch.py) at num_workers = 0, 2 (new workers each epoch,
# PyTorch's default) and 2 persistent. Each round runs the six configurations one after
# the other (all see about the same machine load); the table gives medians over ROUNDS
# rounds (default 5) and, for "2 / 0", the median of the rounds' own ratios. Also the CPU
# time per 1000 samples of the training process alone (what is left on the training
# thread) and of the process with its workers (reaped ones: not with persistent workers).
# SAMPLES (default 20000) samples per epoch, batch 64, PASSES (default 16) blur passes.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
samples=${SAMPLES:-20000}
passes=${PASSES:-16}
# PyTorch at its best (TOOLCHAIN.md): one thread per process for per-sample ops, passive
# OpenMP waits, its AVX-512 kernels where the CPU has AVX-512.
aten_cap=""
grep -q avx512f /proc/cpuinfo && aten_cap="ATEN_CPU_CAPABILITY=avx512"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
declare -A rate main total ratio
echo "load average before: $(cut -d" " -f1-3 /proc/loadavg)"
configs="0:0 2:0 2:1" # workers:persistent
for _ in $(seq "$rounds"); do
  for fw in ddplua pytorch; do
    for c in $configs; do
      w=${c%:*}; p=${c#*:}
      if [ "$fw" = ddplua ]; then
        out=$(build/ddplua bench/dataloader_workers.lua --workers "$w" --persistent "$p" --samples "$samples" \
              --passes "$passes" --runs 1)
      else
        out=$(OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE env $aten_cap \
              /usr/bin/python3 bench/dataloader_workers_torch.py --workers "$w" --persistent "$p" \
              --samples "$samples" --passes "$passes" --runs 1)
      fi
      r=$(echo "$out" | field samples_per_s)
      rate[$fw:$c]+="$r "; main[$fw:$c]+="$(echo "$out" | field main_cpu_ms_per_1k) "
      total[$fw:$c]+="$(echo "$out" | field total_cpu_ms_per_1k) "
      [ "$c" = 0:0 ] && r0=$r
      [ "$c" != 0:0 ] && ratio[$fw:$c]+="$(awk -v a="$r" -v b="$r0" 'BEGIN {print a / b}') "
    done
  done
done
med() { printf '%s\n' $1 | median; }
echo "| framework | num_workers | samples/s | vs num_workers = 0 (median of paired ratios) | training process CPU ms / 1000 samples | with its workers | runs (samples/s) |"
echo "|---|---|---|---|---|---|---|"
for fw in ddplua pytorch; do
  name=$([ "$fw" = ddplua ] && echo ddplua || echo PyTorch)
  for c in $configs; do
    w=${c%:*}; p=${c#*:}
    label=$w; [ "$p" = 1 ] && label="$w persistent"
    rr="—"; [ "$c" != 0:0 ] && rr=$(printf '%.2f×' "$(med "${ratio[$fw:$c]}")")
    tt=$(med "${total[$fw:$c]}"); [ "$p" = 1 ] && tt="(not reaped)"
    echo "| $name | $label | $(med "${rate[$fw:$c]}") | $rr | $(med "${main[$fw:$c]}") | $tt | ${rate[$fw:$c]}|"
  done
done
for c in $configs; do
  echo "ddplua / PyTorch samples/s at ${c%:*} workers$([ "${c#*:}" = 1 ] && echo " (persistent)"): $(awk -v a="$(med "${rate[ddplua:$c]}")" -v b="$(med "${rate[pytorch:$c]}")" 'BEGIN {printf "%.2f×", a / b}')"
done
echo "load average after: $(cut -d" " -f1-3 /proc/loadavg); machine: $(lscpu | sed -n "s/^Model name: *//p"), $(nproc) cores, sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)"
