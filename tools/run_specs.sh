#!/usr/bin/env bash
# tools/run_specs.sh: run every spec under busted/LuaJIT in two shards at once, then print
# the plain line CI reads, "N passed, N failed, N skipped", summed over the shards.
#
# Why shards: most of the suite's wall time is multi-process specs waiting (rendezvous,
# timeouts, fault injection), not computing, so on 2 cores busted processes side by side
# cut the wall time without starving each other. Shard "distributed" holds the multi-process
# specs of spec/distributed/; shard "multinode" the namespace-node, mpirun and Slurm jobs of
# spec/multinode/ (mostly waiting on collective timeouts and daemons); shard "rest" the
# others. Their outputs are printed one after the other when all are done; each shard's own
# summary is labelled, the failing specs are listed once more ("FAILED: ..."), and the total
# comes last.
#
# Usage: tools/run_specs.sh [NAME=VALUE ...]   environment for busted (the sanitizer build
# passes DDPLUA_LIB, LD_PRELOAD, ...). Exit status 0 when every spec passed.
set -u
cd "$(dirname "$0")/.."
out=$(mktemp -d /tmp/ddplua-specs.XXXXXX)
trap 'rm -rf "$out"' EXIT

mapfile -t rest < <(find spec -name '*_spec.lua' -not -path 'spec/distributed/*' -not -path 'spec/multinode/*' | sort)
run_shard() { # name, files...
  local name=$1
  shift
  env "${envs[@]}" DDPLUA_SPEC_SHARD="$name" DDPLUA_SPEC_COUNTS="$out/$name.counts" \
    DDPLUA_SPEC_FAILURES="$out/$name.failures" \
    busted -o spec/helpers/ci_output.lua "$@" > "$out/$name.log" 2>&1
  echo $? > "$out/$name.status"
}
envs=("$@")
[ ${#envs[@]} -eq 0 ] && envs=(DDPLUA_SPEC_RUNNER=1)
run_shard distributed spec/distributed &
run_shard multinode spec/multinode &
run_shard rest "${rest[@]}" &
wait

passed=0 failed=0 skipped=0 status=0
for name in distributed multinode rest; do
  cat "$out/$name.log"
  if read -r p f s < "$out/$name.counts" 2>/dev/null; then
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  else
    echo "spec shard $name ended before it reported (status $(cat "$out/$name.status"))"
    failed=$((failed + 1))
  fi
  [ "$(cat "$out/$name.status")" = 0 ] || status=1
done
echo
# the failing specs' names once more, just above the total (a log cut to its tail shows them)
cat "$out"/*.failures 2>/dev/null
echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
