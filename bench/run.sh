#!/usr/bin/env bash
# bench/run.sh (`make bench`): run the benchmarks and rewrite the tables in bench/RESULTS.md.
# Each table is measured in one run (ratios are measured together; absolute times move
# from run to run on a shared machine). Sections, in order: issue 16's table against PyTorch
# at its best (bench/reference_table.sh), then the "typical script" tables (PyTorch through
# its DataLoader, small-message latency right after a barrier), the engine core, the GPU
# section and what follows it (kept as they stand), and the seeds' speed table.
# Environment:
#   BENCH_QUICK=1   every row, each measured once with short runs (about 10 minutes on a
#                   quiet 2-core machine): proves the scripts, not final figures (the file
#                   says so at the top)
#   REUSE=1         keep the comparison tables of an earlier run (bench/out/), rerun the rest
#   RUNS, STEPS, ROUNDS, MAX_MB, ...   passed on to the scripts (see each one's header):
#                   RUNS: *_compare.sh runs; ROUNDS: reference_table.sh and speed_table.sh
#                   rounds; STEPS: timed training steps of train.lua in all of them
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
l3="$(lscpu | sed -n 's/^L3 cache: *//p' | head -n 1)"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
started=$(date +%s)
quick=${BENCH_QUICK:-0}
if [ "$quick" = 1 ]; then
  # One round of short runs (callers' own settings win).
  export RUNS=${RUNS:-1} ROUNDS=${ROUNDS:-1} MAX_MB=${MAX_MB:-16}
  export CNN_BATCHES=${CNN_BATCHES:-3} RESNET_BATCHES=${RESNET_BATCHES:-1} WARMUP=${WARMUP:-1}
  export TRAIN_WARMUP=${TRAIN_WARMUP:-10} RESNET_STEPS=${RESNET_STEPS:-5} RESNET_WARMUP=${RESNET_WARMUP:-2}
  export AR_ROUNDS=${AR_ROUNDS:-3} SMALL_RUNS=${SMALL_RUNS:-3}
  quick_steps=${STEPS:-60}
  profile_subset=3200
else
  quick_steps=${STEPS:-}
  profile_subset=12800
fi
# steps_env: STEPS for the training comparisons when quick mode or the caller set it.
steps_env=()
[ -n "$quick_steps" ] && steps_env=(STEPS="$quick_steps")
for threads in 1 2; do
  build/ddplua bench/ops.lua --threads "$threads" --out "bench/out/ops_t$threads.md"
done

# PyTorch (Debian's python3-torch) is the reference of every comparison below.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench: installing python3-torch for the PyTorch side"
  ${SUDO:-} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null
fi
# Per-step breakdown of DDP training (train.lua --profile), 2 ranks x 1 thread, one epoch on
# a 12 800-sample subset of Fashion-MNIST (3 200 in quick mode).
for cfg in mlp cnn; do
  build/ddplua --nproc_per_node=2 --standalone train.lua --config "configs/fashion_mnist_$cfg.lua" \
    --subset "$profile_subset" --test-subset 1000 --epochs 1 --quiet --profile --out "bench/out/profile_$cfg" 2>&1 \
    | sed -n 's/^\[rank 0\]: profile epoch 1 (ms per step, \([0-9]*\) steps): /\1 steps: /p' \
    | sed 's/ | /; /g' | sed "s/^/| $cfg | /; s/\$/ |/" > "bench/out/profile_$cfg.md"
done

# REUSE=1 keeps the comparison tables of an earlier run (bench/out/) and reruns the rest.
# Issue 16's table against PyTorch at its best (bench/reference_table.sh prints its whole
# section; ROUNDS, STEPS, RESNET_STEPS, AR_ROUNDS, SMALL_RUNS set its size).
if [ "${REUSE:-0}" != 1 ] || [ ! -s bench/out/reference.md ]; then
  env "${steps_env[@]}" bench/reference_table.sh > bench/out/reference.md
fi
for part in train allreduce ddp; do
  if [ "${REUSE:-0}" = 1 ] && [ -s "bench/out/$part.md" ]; then continue; fi
  env "${steps_env[@]}" "bench/${part}_compare.sh" > "bench/out/$part.md"
done
# The seeds' speed table (bench/speed_table.sh prints its whole section, heading included;
# ROUNDS, CNN_BATCHES, RESNET_BATCHES set its size).
if [ "${REUSE:-0}" != 1 ] || [ ! -s bench/out/speed_table.md ]; then
  bench/speed_table.sh > bench/out/speed_table.md
fi
# Everything from the GPU section on is kept as it stands, except the speed table's own
# section, which is rewritten at the end.
speed_heading="## The seeds' speed table"
gpu_section=$(sed -n '/^## GPU/,$p' bench/RESULTS.md 2>/dev/null \
  | awk -v h="$speed_heading" 'index($0, h) == 1 {skip = 1; next} /^## / {skip = 0} !skip')
{
  echo "# Benchmark results"
  echo
  echo "Written by \`make bench\` (bench/run.sh). Machine: $machine. Commit $commit. Date $(date -u +%F)."
  echo
  if [ "$quick" = 1 ]; then
    echo "**Quick mode (\`BENCH_QUICK=1\`): one round of short runs, to prove every row is produced;"
    echo "not figures to quote.**"
    echo
  fi
  cat <<'NOTES'
Reading the tables: the machine is shared and noisy, so each table alternates ddplua and
the reference run by run and reports medians (each table says of how many runs); ratios
measured together hold, absolute figures move from run to run. The first section is issue
16's table: the reference rows (PyTorch at its best, back-to-back all-reduce latency) with
the physical limits. The sections after it keep the "typical script" rows: PyTorch through
its DataLoader, small-message latency timed right after a barrier.

- Goals of issue 16: CNN 1 process × 2 threads ≥ 6,500 samples/s, DDP 2 × 1 thread ≥ 7,000,
  and 1 × 2 at least 95% of 2 × 1; ResNet-20 on the CPU (batch 128, 1 × 2) ≥ 600 samples/s;
  MLP ≥ 130,000 samples/s in both; all-reduce between 2 ranks ≥ 8 GB/s busbw at 64 MiB,
  ≥ 6 GB/s from 1 MiB up, ≤ 5 µs back to back at 4 KiB; one small op from Lua ≤ 0.5 µs with
  the tape on.
- Engine core: matmul 1024³ ≥ 95% of raw `cblas_sgemm` (measured alternately, pair by
  pair); element-wise ops on ≥ 4 MiB ≥ 50% of the memcpy figure (glibc's memcpy of 16 MiB
  uses non-temporal stores, while a 16 MiB operand may partly stay in a large L3, so an
  in-place add can beat it).
NOTES
  echo "- This machine (lscpu): $machine, L3 ${l3:-unknown}. $(if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then echo "GPUs: $(nvidia-smi -L | wc -l) (the CUDA figures come from bench/run_gpu.sh, in the GPU section)."; else echo "No GPU here: the CUDA figures, if any, come from a lent GPU machine (GPU section)."; fi)"
  echo "- This run took $(( ($(date +%s) - started + 30) / 60 )) minutes (\`make bench\`$( [ "$quick" = 1 ] && echo ", BENCH_QUICK=1"))."
  echo
  cat bench/out/reference.md
  echo
  echo "## All-reduce, 2 ranks over gloo, against torch.distributed, typical script (bench/allreduce_compare.sh)"
  echo
  echo "Each call timed right after a barrier (the barrier's skew lands in the figure; issue 16's table"
  echo "above has the back-to-back figures). Ratio = PyTorch time / ddplua time (higher is better for"
  echo "ddplua). Runs alternate; medians of ${RUNS:-3} runs."
  echo
  cat bench/out/allreduce.md
  echo
  echo "## Per-step breakdown of DDP training (\`train.lua --profile\`, 2 ranks × 1 thread)"
  echo
  echo "Global batch 64 (32 per rank), one epoch on $profile_subset samples, one run; milliseconds per step on rank 0."
  echo "Exposed communication is the part of backward spent waiting for bucket all-reduces."
  echo
  echo "| model | breakdown |"
  echo "|---|---|"
  cat bench/out/profile_mlp.md bench/out/profile_cnn.md
  echo
  echo "## DDP training, 2 ranks × 1 thread, against PyTorch DDP under torchrun through its DataLoader, typical script (bench/ddp_compare.sh)"
  echo
  echo "Batch 64 per rank, gloo, samples/s of all ranks, ${quick_steps:-150} timed steps. Runs alternate; medians of ${RUNS:-3} runs."
  echo
  cat bench/out/ddp.md
  echo
  echo "## Training throughput against PyTorch through its DataLoader, typical script (bench/train_compare.sh)"
  echo
  echo "Batch 64, ${quick_steps:-200} timed steps; PyTorch with its thread variables set before import and"
  echo "OMP_WAIT_POLICY=PASSIVE, batches from torch.utils.data.DataLoader. Runs alternate; medians of ${RUNS:-3} runs."
  echo
  cat bench/out/train.md
  echo
  for threads in 1 2; do
    echo "## Engine core (bench/ops.lua), $threads thread(s)"
    echo
    echo "Command: \`build/ddplua bench/ops.lua --threads $threads\`. Medians of 5–7 runs (matmul: 7 runs,"
    echo "alternating with sgemm; small ops: 3 runs of 10⁶ calls)."
    echo
    cat "bench/out/ops_t$threads.md"
    echo
  done
  # The GPU section comes from bench/run_gpu.sh on a lent GPU machine, not from this run:
  # keep it as it stands.
  printf '%s\n' "$gpu_section"
  echo
  cat bench/out/speed_table.md
} > bench/RESULTS.md.tmp
mv bench/RESULTS.md.tmp bench/RESULTS.md
echo "wrote bench/RESULTS.md"
