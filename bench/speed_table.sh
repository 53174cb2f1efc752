#!/usr/bin/env bash
# bench/speed_table.sh: the seeds' speed table (seed multigpu-demos.txt, "Performance
# comparisons": method, epoch time, batch time) for ddplua and PyTorch side by side:
#   single process          build/ddplua bench/speed_table.lua
#   DataParallel            ... --data_parallel over every GPU, or without one the 2 devices
#                           of the simulated device (build/libddplua_cuda_sim.so: CPU
#                           kernels, devices run one after another on one thread)
#   DDP, one node           ddplua --nproc_per_node=2 --standalone (PyTorch: torchrun)
#   DDP, two nodes          2 network-namespace nodes x 1 rank (tools/netns_nodes.sh run 2;
#                           Gloo TCP over the bridge), skipped with the reason when
#                           namespaces cannot be made here (not root)
# for the Fashion-MNIST CNN and ResNet-20 on random 32x32x3 data, global batch 256 (as the
# seed), 1 thread per process. An "epoch" is a fixed number of batches (CNN_BATCHES,
# RESNET_BATCHES) after WARMUP untimed ones; rows alternate within each of ROUNDS rounds and
# every cell is the median over the rounds. PyTorch is Debian's python3-torch
# (/usr/bin/python3, CPU), run as bench/ddp_compare.sh runs it (thread variables before
# import, OMP_WAIT_POLICY=PASSIVE, torchrun with --redirects/--tee); it has no DataParallel
# row on the CPU (torch.nn.DataParallel without GPUs just calls the module).
# Prints its bench/RESULTS.md section (heading, notes, machine, one Markdown table per model
# with the epoch stated) on stdout, progress on stderr.
# Environment: ROUNDS (default 2), CNN_BATCHES (20), RESNET_BATCHES (5), WARMUP (2 for the
# CNN, 1 for ResNet-20), MODELS ("cnn resnet20"), BATCH (256).
set -u -o pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-2}
models=${MODELS:-cnn resnet20}
batch=${BATCH:-256}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE DDP_NUM_THREADS=1
export DDPLUA_STORE_SECRET=speed-table-$$

batches_of() { if [ "$1" = cnn ]; then echo "${CNN_BATCHES:-20}"; else echo "${RESNET_BATCHES:-5}"; fi; }
warmup_of() { if [ "$1" = cnn ]; then echo "${WARMUP:-2}"; else echo "${WARMUP:-1}"; fi; }

# DataParallel's devices: the GPUs when there are, else the simulated ones.
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  dp_env=() ; dp_label="DataParallel ($(nvidia-smi -L | wc -l) GPUs)"
else
  dp_env=(DDPLUA_CUDA_PLUGIN="$PWD/build/libddplua_cuda_sim.so" DDPLUA_SIM_DEVICES=2)
  dp_label="DataParallel (2 simulated devices)"
fi
netns_reason=$(tools/netns_nodes.sh check 2>&1) && netns_reason=""
torch_ok=1
/usr/bin/python3 -c "import torch" 2>/dev/null || torch_ok=0

# run ROW FRAMEWORK MODEL -> "epoch_s batch_s", empty when the row failed or cannot run.
run() {
  local row=$1 fw=$2 model=$3 n w out
  n=$(batches_of "$model"); w=$(warmup_of "$model")
  local lua="bench/speed_table.lua --model $model --batches $n --warmup $w --batch_size $batch --threads 1"
  local py="bench/speed_table_torch.py --model $model --batches $n --warmup $w --batch_size $batch --threads 1"
  local torchrun="/usr/bin/python3 -m torch.distributed.run --redirects 2 --tee 2"
  case $fw/$row in
    ddplua/single) out=$(build/ddplua $lua 2>&1) ;;
    ddplua/dp) out=$(env "${dp_env[@]}" build/ddplua $lua --data_parallel 2>&1) ;;
    ddplua/ddp) out=$(build/ddplua --nproc_per_node=2 --standalone $lua 2>&1) ;;
    ddplua/nodes) out=$(tools/netns_nodes.sh run 2 sh -c "exec build/ddplua --nnodes=2 --node_rank=\$NODE_RANK \
        --nproc_per_node=1 --master_addr=\$NODE0_ADDR --master_port=29500 $lua" 2>&1) ;;
    torch/single) out=$(/usr/bin/python3 $py 2>&1) ;;
    torch/ddp) out=$($torchrun --nproc_per_node 2 --master_port $((29300 + RANDOM % 300)) $py 2>&1) ;;
    torch/nodes) out=$(tools/netns_nodes.sh run 2 sh -c "exec $torchrun --nnodes 2 --node_rank \$NODE_RANK \
        --nproc_per_node 1 --master_addr \$NODE0_ADDR --master_port 29500 $py" 2>&1) ;;
    *) return 0 ;;
  esac
  local e b
  e=$(printf '%s\n' "$out" | sed -n 's/.*epoch_time_s=\([0-9.]*\).*/\1/p' | tail -1)
  b=$(printf '%s\n' "$out" | sed -n 's/.*batch_time_s=\([0-9.]*\).*/\1/p' | tail -1)
  if [ -z "$e" ] || [ -z "$b" ]; then
    printf '%s\n' "$out" | tail -5 | sed "s|^|  $fw/$row/$model failed: |" >&2
    return 0
  fi
  echo "$e $b"
}

rows=(single dp ddp)
[ -z "$netns_reason" ] && rows+=(nodes)
fws=(ddplua)
[ "$torch_ok" = 1 ] && fws+=(torch)
declare -A epoch batch_t
for ((r = 1; r <= rounds; r++)); do
  for model in $models; do
    for row in "${rows[@]}"; do
      for fw in "${fws[@]}"; do
        [ "$fw/$row" = torch/dp ] && continue
        x=$(run "$row" "$fw" "$model")
        echo "round $r $model $row $fw: ${x:-failed}" >&2
        [ -n "$x" ] || continue
        epoch[$fw/$row/$model]+="${x% *} "
        batch_t[$fw/$row/$model]+="${x#* } "
      done
    done
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
# m:ss.ss as the seed writes an epoch time (hundredths: short epochs).
minutes() { awk -v s="$1" 'BEGIN {printf "%d:%05.2f", int(s / 60), s - 60 * int(s / 60)}'; }
cell() { # cell KEY -> "epoch | batch" or "failed | failed"
  local e b
  e=$(echo "${epoch[$1]:-}" | median); b=$(echo "${batch_t[$1]:-}" | median)
  if [ -z "$e" ]; then echo "failed | failed"; else echo "$(minutes "$e") | $(awk -v b="$b" 'BEGIN {printf "%.3f", b}') s"; fi
}
label() {
  case $1 in
    single) echo "single process" ;;
    dp) echo "$dp_label" ;;
    ddp) echo "DDP, one node (2 ranks)" ;;
    nodes) echo "DDP, two namespace nodes (2 × 1 rank, Gloo TCP over a veth bridge)" ;;
  esac
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "## The seeds' speed table: single process, DataParallel, DDP on one node, DDP over two nodes (issue 13, bench/speed_table.sh)"
echo
cat <<'SPEED'
The layout of seed multigpu-demos.txt's "Performance comparisons" (its figures: P100s,
CIFAR-10, batch 256, 196 iterations: single gpu 2:34 / 1.04 s, v1 DataParallel 2:17 /
0.70 s, v2 one node 2:09 / 0.60 s, v3 several nodes 2:01 / 0.58 s). Here: epoch time is the
wall time of the stated number of batches (data loading included), batch time the median
time of one training step (forward, backward with DDP's all-reduces, optimizer step). Each
DDP row has 2 ranks of 1 thread (half the batch each), the single process 1 thread.
Without a GPU, DataParallel runs on the simulated device (build/libddplua_cuda_sim.so: the
CPU kernels, its 2 devices one after another on one thread), so it measures the cost of
scatter, replicate and gather, not a speed-up; PyTorch has no such row on the CPU
(torch.nn.DataParallel without GPUs just calls the module). The two nodes are network
namespaces on this machine (tools/netns_nodes.sh): separate host names, no shared memory,
Gloo TCP over a veth bridge, with no link shaping.
SPEED
echo
echo "Machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1), $(grep -c ^processor /proc/cpuinfo) cores, shared" \
  "with other engineers' builds and tests while this ran (load average at the end" \
  "$(cut -d' ' -f1-3 /proc/loadavg)): ratios measured in the same round hold better than" \
  "absolute times. Commit $commit, $(date -u +%F)."
if [ ${#dp_env[@]} -eq 0 ]; then
  echo
  echo "GPUs found: ddplua's rows ran on them (DDP over nccl), PyTorch's on the CPU (Debian's" \
    "python3-torch has no CUDA), so the ddplua / PyTorch column compares a GPU with a CPU."
fi
for model in $models; do
  n=$(batches_of "$model")
  if [ "$model" = cnn ]; then what="CNN (models/cnn.lua) on Fashion-MNIST"; else what="ResNet-20 (models/resnet.lua) on random 32×32×3 data"; fi
  echo
  echo "**$what**: batch $batch, epoch = $n batches (after $(warmup_of "$model") untimed), 1 thread per process, medians of $rounds rounds."
  echo
  echo "| method | ddplua epoch time | ddplua batch time | PyTorch epoch time | PyTorch batch time | batch time ddplua / PyTorch | batch time / single process (ddplua, PyTorch) |"
  echo "|---|---|---|---|---|---|---|"
  for row in single dp ddp nodes; do
    if [ "$row" = nodes ] && [ -n "$netns_reason" ]; then
      echo "| $(label nodes) | skipped: $netns_reason | | | | | |"
      continue
    fi
    d=$(cell "ddplua/$row/$model")
    if [ "$row" = dp ]; then
      t="n/a (DataParallel without GPUs calls the module) | n/a"
    elif [ "$torch_ok" = 0 ]; then
      t="no python3-torch | no python3-torch"
    else
      t=$(cell "torch/$row/$model")
    fi
    db=$(echo "${batch_t[ddplua/$row/$model]:-}" | median); tb=$(echo "${batch_t[torch/$row/$model]:-}" | median)
    ratio="-"
    [ -n "$db" ] && [ -n "$tb" ] && [ "$row" != dp ] && ratio=$(awk -v a="$db" -v b="$tb" 'BEGIN {printf "%.2f", a / b}')
    ds=$(echo "${batch_t[ddplua/single/$model]:-}" | median); ts=$(echo "${batch_t[torch/single/$model]:-}" | median)
    vs=$(awk -v a="$db" -v b="$ds" 'BEGIN {printf (a != "" && b != "") ? "%.2f" : "-", a / (b ? b : 1)}')
    if [ "$row" = dp ]; then vs+=", -"; else vs+=", $(awk -v a="$tb" -v b="$ts" 'BEGIN {printf (a != "" && b != "") ? "%.2f" : "-", a / (b ? b : 1)}')"; fi
    echo "| $(label "$row") | $d | $t | $ratio | $vs |"
  done
done
