#!/usr/bin/env bash
# tools/fuzz.sh: run the libFuzzer targets built by `make fuzz-build` (Note [fuzz targets] in
# fuzz/fuzz.h), each for SECONDS on a working copy of its corpus, and print one line per
# target: seconds, executions, coverage (cov: edges, ft: features, from libFuzzer's final
# stats), corpus size, findings. A finding is any crash, leak, UBSan report (the targets are
# built with -fno-sanitize-recover=all), timeout (> 10 s for one input) or out-of-memory
# (> 2 GB): its input is kept under BUILD/findings/<name>/ and the target's report on it is
# printed. The repository's corpus (fuzz/corpus/<name>/) is only read; new inputs go to
# BUILD/corpus/<name>/, which starts as a copy of it on every run. A dictionary is
# fuzz/<name>.dict, else fuzz/<family>.dict (the name up to its first '_').
#
# Usage: tools/fuzz.sh BUILD SECONDS [NAME ...]   (default: every fuzz/*.c)
# Exit status: 0 when no target found anything (and each ran), 1 otherwise. The last line
# is "fuzz: N targets, M with findings ...".
set -u
cd "$(dirname "$0")/.."
build=${1:?usage: tools/fuzz.sh BUILD SECONDS [NAME ...]}
secs=${2:?usage: tools/fuzz.sh BUILD SECONDS [NAME ...]}
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in fuzz/*.c; do names+=("$(basename "$f" .c)"); done
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

rows=()
bad=0
for name in "${names[@]}"; do
  bin=$build/fuzz/$name
  work=$build/corpus/$name
  found=$build/findings/$name
  log=$build/logs/$name.log
  rm -rf "$work" "$found"
  mkdir -p "$work" "$found" "$build/logs"
  if [ -d "fuzz/corpus/$name" ]; then cp -R "fuzz/corpus/$name/." "$work/"; fi
  opts=(-max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$found/" -close_fd_mask=2)
  # a target's dictionary: fuzz/<name>.dict, else the one of its family (fuzz/store.dict
  # for store_handshake and store_requests)
  if [ -f "fuzz/$name.dict" ]; then opts+=(-dict="fuzz/$name.dict")
  elif [ -f "fuzz/${name%%_*}.dict" ]; then opts+=(-dict="fuzz/${name%%_*}.dict"); fi
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (make fuzz-build)"
    rows+=("$(printf '%-20s %6s %12s %7s %7s %7s %s' "$name" - - - - - "not built")")
    bad=$((bad + 1))
    continue
  fi
  start=$(date +%s)
  # the hard limit leaves libFuzzer time to finish the input in hand and print its stats
  timeout -k 10 $((secs + 60)) "$bin" "${opts[@]}" "$work" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -n 1 | awk '{print $2}')
  last=$(grep -E '^#[0-9]+' "$log" | grep -E 'cov: ' | tail -n 1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<< "$last")
  n_found=$(find "$found" -type f | wc -l)
  note=""
  if [ "$n_found" -gt 0 ] || [ "$rc" -ne 0 ]; then
    bad=$((bad + 1))
    [ "$n_found" -eq 0 ] && n_found=1 && note="exit status $rc"
    echo "==== fuzz: $name: FINDING (exit status $rc); the log's end ($log):"
    tail -n 40 "$log"
    for a in "$found"/*; do
      [ -f "$a" ] || continue
      echo "==== fuzz: $name: its report on $a (reproduce: $bin $a):"
      timeout 60 "$bin" "$a" 2>&1 | tail -n 40
    done
  fi
  rows+=("$(printf '%-20s %6s %12s %7s %7s %7s %s' "$name" "$took" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$n_found${note:+ ($note)}")")
done

echo
printf '%-20s %6s %12s %7s %7s %7s %s\n' target seconds executions cov ft corpus findings
for r in "${rows[@]}"; do echo "$r"; done
# the last line, read by .ci/run: targets run, and how many found something
echo "fuzz: ${#names[@]} targets, $bad with findings (${secs} s each; inputs under $build/findings/)"
[ "$bad" -eq 0 ]
