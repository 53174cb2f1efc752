#!/usr/bin/env bash
# bench/before_after.sh BEFORE_DIR AFTER_DIR: paired samples/s of two builds of ddplua (two
# checkouts, each built with make) on bench/train.lua, the CNN and the MLP, as DDP 2 ranks x
# 1 thread (the launcher, --standalone) and 1 process x 2 threads. In each of ROUNDS rounds
# (default 5) every row runs both builds back to back, before first in odd rounds and after
# first in even ones, so both see the same load; prints a Markdown table of the medians and
# of the median of the per-round after/before ratios, and every run's figures on stderr.
# Each run also goes under `perf stat -e task-clock` (when perf is there): the CPU time of
# the whole run, every process and thread, start-up and data loading included, which other
# processes on a shared machine move far less than the wall clock; the table then gives the
# median before/after ratio of that CPU time too (above 1: after used less CPU).
# Environment: ROUNDS, STEPS (200 timed steps), WARMUP (100), ROWS (default
# "cnn_2x1 mlp_2x1 cnn_1x2 mlp_1x2").
set -u -o pipefail
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd)
rounds=${ROUNDS:-5} steps=${STEPS:-200} warmup=${WARMUP:-100}
rows=${ROWS:-cnn_2x1 mlp_2x1 cnn_1x2 mlp_1x2}
export DDPLUA_STORE_SECRET=before-after-$$
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | head -1; }

perf_file=$(mktemp)
trap 'rm -f "$perf_file"' EXIT
timed() { # timed CMD...: CMD under perf stat when perf is there (task-clock into $perf_file)
  if command -v perf >/dev/null; then perf stat -x, -e task-clock -o "$perf_file" "$@"
  else echo "nan,msec,task-clock" >"$perf_file"; "$@"; fi
}
# run DIR ROW: "samples/s cpu_ms" of ROW with the build in DIR
run() {
  local model=${2%_*} shape=${2#*_} sps
  cd "$1" || return 1
  if [ "$shape" = 2x1 ]; then
    sps=$(timed build/ddplua --nproc_per_node=2 --standalone bench/train.lua --model "$model" --threads 1 \
      --steps "$steps" --warmup "$warmup" 2>&1 | field samples_per_s)
  else
    sps=$(timed build/ddplua bench/train.lua --model "$model" --threads 2 --steps "$steps" --warmup "$warmup" \
      2>&1 | field samples_per_s)
  fi
  echo "$sps $(awk -F, '/task-clock/ {print $1}' "$perf_file")"
}

echo "| row | before samples/s | after samples/s | after / before samples/s | before CPU s | after CPU s | before / after CPU |"
echo "|---|---|---|---|---|---|---|"
for row in $rows; do
  b=() a=() r=() bc=() ac=() rc=()
  for k in $(seq "$rounds"); do
    if [ $((k % 2)) = 1 ]; then x=$(run "$before" "$row"); y=$(run "$after" "$row")
    else y=$(run "$after" "$row"); x=$(run "$before" "$row"); fi
    echo "$row round $k: before $x after $y (samples/s, CPU ms; load $(cut -d' ' -f1 /proc/loadavg))" >&2
    set -- $x $y
    b+=("$1") a+=("$3") bc+=("$2") ac+=("$4")
    r+=("$(awk -v a="$3" -v b="$1" 'BEGIN {printf "%.4f", a / b}')")
    rc+=("$(awk -v a="$4" -v b="$2" 'BEGIN {printf "%.4f", b / a}')")
  done
  mb=$(printf '%s\n' "${b[@]}" | median) ma=$(printf '%s\n' "${a[@]}" | median)
  mr=$(printf '%s\n' "${r[@]}" | median) mrc=$(printf '%s\n' "${rc[@]}" | median)
  mbc=$(printf '%s\n' "${bc[@]}" | median) mac=$(printf '%s\n' "${ac[@]}" | median)
  printf '| %s | %.0f | %.0f | %.3f | %.1f | %.1f | %.3f |\n' "$row" "$mb" "$ma" "$mr" \
    "$(awk -v c="$mbc" 'BEGIN {print c / 1000}')" "$(awk -v c="$mac" 'BEGIN {print c / 1000}')" "$mrc"
done
