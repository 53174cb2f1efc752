#!/usr/bin/env bash
# bench/run.sh: run the benchmarks and rewrite the tables in bench/RESULTS.md.
# Each table is measured in one run (ratios are measured together; absolute times move
# from run to run on a shared machine).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/out
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for threads in 1 2; do
  build/ddplua bench/ops.lua --threads "$threads" --out "bench/out/ops_t$threads.md"
done

# Training throughput against PyTorch (Debian's python3-torch), same run, medians of 3.
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench: installing python3-torch for the PyTorch side"
  ${SUDO:-} env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null
fi
bench/train_compare.sh > bench/out/train.md
bench/allreduce_compare.sh > bench/out/allreduce.md
bench/ddp_compare.sh > bench/out/ddp.md
{
  echo "# Benchmark results"
  echo
  echo "Written by \`make bench\` (bench/run.sh). Machine: $machine. Commit $commit. Date $(date -u +%F)."
  echo
  echo "## All-reduce, 2 ranks over gloo, against torch.distributed (bench/allreduce_compare.sh)"
  echo
  echo "Ratio = PyTorch time / ddplua time (higher is better for ddplua). Medians of 3 runs."
  echo
  cat bench/out/allreduce.md
  echo
  echo "## DDP training, 2 ranks × 1 thread, against PyTorch DDP under torchrun (bench/ddp_compare.sh)"
  echo
  echo "Batch 64 per rank, gloo, samples/s of all ranks. Medians of 3 runs."
  echo
  cat bench/out/ddp.md
  echo
  echo "## Training throughput against PyTorch (bench/train_compare.sh)"
  echo
  cat bench/out/train.md
  echo
  for threads in 1 2; do
    echo "## Engine core (bench/ops.lua), $threads thread(s)"
    echo
    echo "Command: \`build/ddplua bench/ops.lua --threads $threads\`. Medians of 5 runs."
    echo
    cat "bench/out/ops_t$threads.md"
    echo
  done
} > bench/RESULTS.md
echo "wrote bench/RESULTS.md"
