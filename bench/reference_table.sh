#!/usr/bin/env bash
# bench/reference_table.sh: issue 16's table: ddplua against PyTorch at its best, every row
# measured in this one run, with the physical limit where there is one:
#   CNN and MLP samples/s, 1 process x 2 threads and DDP 2 x 1 thread    bench/train.lua
#       against bench/train_torch.py --loader index (batches gathered by indexing, no
#       DataLoader; torchrun for DDP)
#   ResNet-20 samples/s on the CPU (3x32x32, batch 128), 1 process x 2 threads
#       bench/gpu_train.lua --device cpu against bench/gpu_train_torch.py --device cpu
#   all-reduce, 2 and 4 ranks (4 is oversubscribed on a 2-core machine): back-to-back and
#       barrier-synchronised latency and busbw, 4 KiB to 64 MiB     bench/allreduce.lua
#       (--b2b --shared --memcpy) against bench/allreduce_torch.py --b2b (gloo)
#   one small op from Lua, tape on and off     bench/small_op.lua against small_op_torch.py
#   the FMA peak: 2 cores x one core's rate of raw cblas_sgemm 1024^3 with OpenBLAS's AVX2
#       kernels (OPENBLAS_CORETYPE=Haswell; ddplua is built for AVX2 + FMA) by CPU time
#       (bench/ops.lua --threads 1 --sgemm-only: FLOP / the seconds the thread ran, which
#       other processes on a shared machine barely move), at the start of every round
# PyTorch at its best (TOOLCHAIN.md): OMP_NUM_THREADS / OPENBLAS_NUM_THREADS set before
# import, OMP_WAIT_POLICY=PASSIVE, ATEN_CPU_CAPABILITY=avx512 where the CPU has AVX-512,
# torchrun (--redirects 2 --tee 2) for DDP. In each of ROUNDS rounds every row runs ddplua
# and PyTorch back to back (ddplua first in odd rounds, PyTorch first in even ones); every
# cell is the median over the rounds.
# Prints its bench/RESULTS.md section (heading, method, machine, tables) on stdout, progress
# on stderr. Environment: ROUNDS (default 4), STEPS (200, CNN/MLP timed steps), TRAIN_WARMUP (100),
# RESNET_STEPS (20), RESNET_WARMUP (3), AR_ROUNDS (5, back-to-back rounds per size),
# SMALL_CALLS (100000), SMALL_RUNS (7), ROWS (default "cnn mlp resnet20 allreduce small_op").
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
rounds=${ROUNDS:-4}
steps=${STEPS:-200}
warmup=${TRAIN_WARMUP:-100} # see the METHOD text: past the collector's first cycles
resnet_steps=${RESNET_STEPS:-20}
resnet_warmup=${RESNET_WARMUP:-3}
ar_rounds=${AR_ROUNDS:-5}
small_calls=${SMALL_CALLS:-100000}
small_runs=${SMALL_RUNS:-7}
rows=${ROWS:-cnn mlp resnet20 allreduce small_op}
ar_sizes=4096,65536,1048576,4194304,16777216,67108864
export DDPLUA_STORE_SECRET=reference-table-$$
aten_cap=()
grep -q avx512f /proc/cpuinfo && aten_cap=(ATEN_CPU_CAPABILITY=avx512)
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "reference_table: /usr/bin/python3 has no torch (apt-get install python3-torch)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# torch_env THREADS CMD...: CMD with PyTorch at its best for THREADS threads.
torch_env() {
  local n=$1; shift
  env OMP_NUM_THREADS="$n" OPENBLAS_NUM_THREADS="$n" OMP_WAIT_POLICY=PASSIVE "${aten_cap[@]}" "$@"
}
torchrun() { # torchrun NPROC SCRIPT ARGS...: rank 0's lines (prefix stripped)
  local n=$1; shift
  torch_env 1 /usr/bin/python3 -m torch.distributed.run --nproc_per_node "$n" --redirects 2 --tee 2 \
    --master_port $((29300 + RANDOM % 600)) "$@" 2>&1 | sed 's/^\[[^]]*\]:\(<stdout>:\)\{0,1\}//'
}
ddplua_ranks() { # ddplua_ranks NPROC SCRIPT ARGS...: rank 0's lines (prefix stripped)
  local n=$1; shift
  build/ddplua --nproc_per_node="$n" --standalone "$@" 2>&1 | sed 's/^\[rank 0\]: //'
}

# run ROW FRAMEWORK: ROW's measurement, its output lines on stdout.
run() {
  local train=(--steps "$steps" --warmup "$warmup")
  local resnet=(--model resnet20 --device cpu --threads 2 --steps "$resnet_steps" --warmup "$resnet_warmup")
  local ar=(--sizes "$ar_sizes" --b2b --rounds "$ar_rounds")
  case $2/$1 in
    ddplua/cnn_1x2 | ddplua/mlp_1x2) build/ddplua bench/train.lua --model "${1%_*}" --threads 2 "${train[@]}" 2>&1 ;;
    torch/cnn_1x2 | torch/mlp_1x2) torch_env 2 /usr/bin/python3 bench/train_torch.py --model "${1%_*}" --threads 2 "${train[@]}" --loader index 2>&1 ;;
    ddplua/cnn_2x1 | ddplua/mlp_2x1) ddplua_ranks 2 bench/train.lua --model "${1%_*}" --threads 1 "${train[@]}" ;;
    torch/cnn_2x1 | torch/mlp_2x1) torchrun 2 bench/train_torch.py --model "${1%_*}" --threads 1 "${train[@]}" --loader index ;;
    ddplua/resnet20) build/ddplua bench/gpu_train.lua "${resnet[@]}" 2>&1 ;;
    torch/resnet20) torch_env 2 /usr/bin/python3 bench/gpu_train_torch.py "${resnet[@]}" 2>&1 ;;
    ddplua/ar2) ddplua_ranks 2 bench/allreduce.lua "${ar[@]}" --shared --memcpy ;;
    torch/ar2) torchrun 2 bench/allreduce_torch.py "${ar[@]}" ;;
    ddplua/ar4) ddplua_ranks 4 bench/allreduce.lua "${ar[@]}" --shared --memcpy ;;
    torch/ar4) torchrun 4 bench/allreduce_torch.py "${ar[@]}" ;;
    ddplua/small_op) build/ddplua bench/small_op.lua "$small_calls" "$small_runs" 2>&1 ;;
    torch/small_op) /usr/bin/python3 bench/small_op_torch.py "$small_calls" "$small_runs" 2>&1 ;;
    ddplua/peak) # OpenBLAS's AVX2 kernels on 1 and 2 threads, then its own choice of kernels
      OPENBLAS_CORETYPE=Haswell build/ddplua bench/ops.lua --threads 1 --sgemm-only 2>&1 | sed 's/^/avx2 /'
      OPENBLAS_CORETYPE=Haswell build/ddplua bench/ops.lua --threads 2 --sgemm-only 2>&1 | sed 's/^/avx2 /'
      build/ddplua bench/ops.lua --threads 2 --sgemm-only 2>&1 | sed 's/^/default /' ;;
  esac
}

order=()
for r in $rows; do
  case $r in
    cnn | mlp) order+=("${r}_1x2" "${r}_2x1") ;;
    resnet20 | small_op) order+=("$r") ;;
    allreduce) order+=(ar2 ar4) ;;
    *) echo "reference_table: unknown row '$r' in ROWS" >&2; exit 2 ;;
  esac
done
for ((round = 1; round <= rounds; round++)); do
  fws=(ddplua torch)
  ((round % 2 == 0)) && fws=(torch ddplua)
  run peak ddplua > "$tmp/peak.ddplua.$round"
  echo "round $round sgemm: $(tr '\n' ' ' < "$tmp/peak.ddplua.$round")" >&2
  for row in "${order[@]}"; do
    for fw in "${fws[@]}"; do
      out="$tmp/$row.$fw.$round"
      run "$row" "$fw" > "$out"
      if grep -qE '(samples_per_s|b2b_us|cpu_us|sgemm_gflops)=[0-9]' "$out"; then
        echo "round $round $row $fw: done" >&2
      else
        tail -n 5 "$out" | sed "s|^|round $round $row $fw failed: |" >&2
      fi
    done
  done
done

# Medians (the mean of the two middle values for an even count), "-" when nothing was measured.
median() { grep -v '^$' | sort -g | awk '{a[NR] = $1} END {if (!NR) print "-"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
spread() { # spread FORMAT: "lo–hi" of the values on stdin
  grep -v '^$' | sort -g | awk -v f="$1" 'NR == 1 {lo = $1} {hi = $1} END {if (NR) printf f "–" f, lo, hi; else print "-"}'; }
# values ROW FW FILTER FIELD: FIELD's value in the lines of every round that match FILTER.
values() { cat "$tmp/$1.$2".* 2>/dev/null | grep -e "$3" | sed -n "s/.* $4=\([0-9.]*\).*/\1/p; s/^$4=\([0-9.]*\).*/\1/p"; }
med() { values "$@" | median; }
fmt() { awk -v x="$1" -v f="$2" 'BEGIN {if (x == "-" || x == "") print "-"; else printf f, x}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-" || a == "" || b == "" || b == 0) print "-"; else printf "%.2f×", a / b}'; }
size_label() { awk -v b="$1" 'BEGIN {if (b >= 1048576) printf "%d MiB", b / 1048576; else printf "%d KiB", b / 1024}'; }

# FLOP per sample of one training step: 2 per multiply-add of the convolutions and linear
# layers, forward + weight gradient + input gradient (none for the first layer, whose input
# needs no gradient); batch norm, pooling and element-wise work not counted.
#   CNN (1->32 3x3 at 28x28, 32->64 3x3 at 14x14, 3136->128, 128->10): 4.241 M MACs forward
#     -> 2 * (3 * 4.241 M - 0.226 M) = 25.0 MFLOP
#   ResNet-20 (3->16 at 32x32; 6 convs 16->16 at 32x32; 32 and 64 channels at 16x16 and 8x8
#     with their stride-2 3x3 and 1x1 shortcuts; fc 64->10): 40.81 M MACs forward
#     -> 2 * (3 * 40.81 M - 0.44 M) = 244 MFLOP
#   MLP (784->256->128->10): 0.2348 M MACs -> 2 * (3 * 0.2348 M - 0.2007 M) = 1.01 MFLOP
flop_cnn=24.995e6 flop_resnet20=244.0e6 flop_mlp=1.007e6
best() { sort -g | tail -n 1; }
peak1=$(values peak ddplua "^avx2 .* threads=1 " sgemm_cpu_gflops | median)
peak=$(awk -v p="$peak1" 'BEGIN {if (p == "-") print "-"; else print 2 * p}')
peak2=$(values peak ddplua "^avx2 .* threads=2 " sgemm_best_gflops | best)
peak_default=$(values peak ddplua "^default .* threads=2 " sgemm_best_gflops | best)
core_default=$(cat "$tmp"/peak.ddplua.* 2>/dev/null | sed -n 's/^default .*core=\([^ ]*\).*/\1/p' | head -n 1)
limit() { awk -v p="$peak" -v f="$1" 'BEGIN {if (p == "-") print "-"; else printf "%.0f", p * 1e9 / f}'; }

train_row() { # train_row LABEL ROW LIMIT_TEXT
  local d t
  d=$(med "$2" ddplua samples_per_s samples_per_s); t=$(med "$2" torch samples_per_s samples_per_s)
  echo "| $1 | $(fmt "$d" %.0f) | $(fmt "$t" %.0f) | $(ratio "$d" "$t") | $3 | $(values "$2" ddplua samples_per_s samples_per_s | spread %.0f); $(values "$2" torch samples_per_s samples_per_s | spread %.0f) |"
}
ar_get() { med "$1" "$2" "^bytes=$3 tensor=$4 " "$5"; } # ar_get ROW FW BYTES KIND FIELD
min_busbw() { # lowest median b2b busbw over the sizes from 1 MiB up
  local row=$1 fw=$2 kind=$3 b out=""
  for b in ${ar_sizes//,/ }; do
    [ "$b" -ge 1048576 ] && out+="$(ar_get "$row" "$fw" "$b" "$kind" b2b_busbw_gbs)"$'\n'
  done
  printf '%s' "$out" | grep -v '^-$' | sort -g | head -n 1
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
machine="$(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores"
echo "## ddplua against PyTorch at its best (issue 16's table, bench/reference_table.sh)"
echo
cat <<'METHOD'
PyTorch at its best: Debian's python3-torch (`/usr/bin/python3`), batches gathered by
indexing the whole data tensors (`bench/train_torch.py --loader index`, no DataLoader),
OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set before import, OMP_WAIT_POLICY=PASSIVE,
ATEN_CPU_CAPABILITY=avx512 where the CPU has AVX-512, torchrun for DDP (gloo). ddplua runs
as a typical script does: `bench/train.lua` with its DataLoader, the launcher for DDP
(`--nproc_per_node=2 --standalone`). CNN and MLP: Fashion-MNIST, batch 64 per process, SGD
with momentum, STEPS timed steps after TRAIN_WARMUP warm-up steps (both frameworks). The
warm-up is 100 steps (it was 20) so that the timed steps start once ddplua's collector has
run its first cycles: until then each step's tensors take pages new to the process (the
block cache fills up to the collector's headroom), and a new 4 KiB page costs ~3 µs on this
VM, so MLP steps 1-24 and ~48-56 ran at ~2.5× the steady step time, which a 20-step warm-up
left inside the 200 timed steps (MLP 1 × 2 ~110k samples/s with 20, ~130k with 100); ResNet-20: `bench/gpu_train.lua` / `bench/gpu_train_torch.py --device cpu`,
random 3×32×32 data, batch 128. Samples/s of all ranks. Ratios: ddplua / PyTorch for rates,
PyTorch / ddplua for times (above 1: ddplua is faster).

Physical limits: the FMA peak is measured in the same run: 2 cores × one core's rate of raw
`cblas_sgemm` 1024³ with OpenBLAS's AVX2 + FMA kernels (`OPENBLAS_CORETYPE=Haswell`: ddplua
is built for x86-64-v3, AVX2 + FMA), which runs at about the core's FMA peak, taken by CPU
time (FLOP / seconds the thread ran: other processes on a shared machine barely move it;
the wall-clock 2-thread figures are shown next to it); samples/s at that peak = peak /
FLOP per sample, counting 2 FLOP per multiply-add of the convolutions and linear layers
forward, for the weight gradients and for the input gradients (none for the first layer):
CNN 25.0 MFLOP, ResNet-20 244 MFLOP, MLP 1.01 MFLOP per sample (derivation in
bench/reference_table.sh). The all-reduce's limit is the copy rate of one process copying
64 MiB in the same run (`bench/allreduce.lua --memcpy`); the 4 KiB figure's ~1 µs is the
issue's estimate (a few cache-line hand-offs), not measured.
METHOD
echo
echo "Machine: $machine (lscpu), shared with other work while this ran (load average at the" \
  "end $(cut -d' ' -f1-3 /proc/loadavg)). Commit $commit, $(date -u +%F). $rounds round(s):" \
  "ddplua and PyTorch alternate run by run within each round (ddplua first in odd rounds);" \
  "every figure is the median over the rounds, the last column the range over the rounds."
echo "FMA peak: $(fmt "$peak" %.1f) GFLOP/s (2 × $(fmt "$peak1" %.1f), one core's AVX2 sgemm rate by CPU time," \
  "median over the rounds); by wall clock on 2 threads (fastest run) AVX2 sgemm reached $(fmt "$peak2" %.1f)" \
  "GFLOP/s and OpenBLAS's own kernels (${core_default:-?}) $(fmt "$peak_default" %.1f) GFLOP/s."
echo
echo "| figure | ddplua | PyTorch | ratio | physical limit | range over rounds (ddplua; PyTorch) |"
echo "|---|---|---|---|---|---|"
case " $rows " in *" cnn "*)
  train_row "CNN samples/s, 1 process × 2 threads" cnn_1x2 "$(limit "$flop_cnn") at FMA peak (25.0 MFLOP/sample)"
  train_row "CNN samples/s, DDP 2 × 1 thread" cnn_2x1 "same"
  share() { awk -v a="$(med cnn_1x2 "$1" samples_per_s samples_per_s)" -v b="$(med cnn_2x1 "$1" samples_per_s samples_per_s)" \
    'BEGIN {if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.0f%%", 100 * a / b}'; }
  echo "| CNN: 1 process × 2 threads as a share of DDP 2 × 1 (medians) | $(share ddplua) | $(share torch) | | (issue 16's goal for ddplua: ≥ 95%) | |" ;;
esac
case " $rows " in *" resnet20 "*)
  train_row "ResNet-20 samples/s (3×32×32, batch 128), 1 process × 2 threads" resnet20 \
    "$(limit "$flop_resnet20") at FMA peak (244 MFLOP/sample)" ;;
esac
case " $rows " in *" mlp "*)
  train_row "MLP samples/s, 1 process × 2 threads" mlp_1x2 "$(limit "$flop_mlp") at FMA peak (1.01 MFLOP/sample)"
  train_row "MLP samples/s, DDP 2 × 1 thread" mlp_2x1 "same" ;;
esac
case " $rows " in *" allreduce "*)
  for n in 2 4; do
    row=ar$n
    note=""
    [ "$n" -gt "$(nproc)" ] && note=" (oversubscribed, $n processes on $(nproc) cores)"
    big=67108864
    ds=$(ar_get "$row" ddplua $big shared b2b_busbw_gbs); do_=$(ar_get "$row" ddplua $big ordinary b2b_busbw_gbs)
    tb=$(ar_get "$row" torch $big ordinary b2b_busbw_gbs)
    mc=$(med "$row" ddplua '^memcpy' gbs)
    echo "| all-reduce 64 MiB, $n ranks$note, busbw GB/s back to back: shared buffer / ordinary tensor | $(fmt "$ds" %.2f) / $(fmt "$do_" %.2f) | $(fmt "$tb" %.2f) (gloo) | $(ratio "$ds" "$tb") | memcpy $(fmt "$mc" %.1f) GB/s (one process, same run) | $(values "$row" ddplua "^bytes=$big tensor=shared " b2b_busbw_gbs | spread %.2f); $(values "$row" torch "^bytes=$big " b2b_busbw_gbs | spread %.2f) |"
    ds=$(min_busbw "$row" ddplua shared); do_=$(min_busbw "$row" ddplua ordinary); tb=$(min_busbw "$row" torch ordinary)
    echo "| all-reduce from 1 MiB up, $n ranks$note, lowest busbw GB/s: shared / ordinary | $(fmt "$ds" %.2f) / $(fmt "$do_" %.2f) | $(fmt "$tb" %.2f) (gloo) | $(ratio "$ds" "$tb") | same | |"
    d=$(ar_get "$row" ddplua 4096 ordinary b2b_us); t=$(ar_get "$row" torch 4096 ordinary b2b_us)
    echo "| all-reduce 4 KiB, $n ranks$note, back to back, µs | $(fmt "$d" %.1f) | $(fmt "$t" %.1f) | $(ratio "$t" "$d") | ~1 µs (issue's estimate) | $(values "$row" ddplua "^bytes=4096 tensor=ordinary " b2b_us | spread %.1f); $(values "$row" torch "^bytes=4096 " b2b_us | spread %.1f) |"
    d=$(ar_get "$row" ddplua 4096 ordinary time_us); t=$(ar_get "$row" torch 4096 ordinary time_us)
    echo "| all-reduce 4 KiB, $n ranks$note, right after a barrier (typical script), µs | $(fmt "$d" %.1f) | $(fmt "$t" %.1f) | $(ratio "$t" "$d") | | $(values "$row" ddplua "^bytes=4096 tensor=ordinary " time_us | spread %.1f); $(values "$row" torch "^bytes=4096 " time_us | spread %.1f) |"
  done ;;
esac
case " $rows " in *" small_op "*)
  don=$(med small_op ddplua "op=plus_tape " cpu_us); doff=$(med small_op ddplua "op=plus_nograd " cpu_us)
  ton=$(med small_op torch "op=plus_tape " cpu_us); toff=$(med small_op torch "op=plus_nograd " cpu_us)
  echo "| one small op from Lua (\`a + b\`, (4,) f32), tape on / off, µs CPU time | $(fmt "$don" %.3f) / $(fmt "$doff" %.3f) | $(fmt "$ton" %.3f) / $(fmt "$toff" %.3f) | $(ratio "$ton" "$don") / $(ratio "$toff" "$doff") | | $(values small_op ddplua "op=plus_tape " cpu_us | spread %.3f); $(values small_op torch "op=plus_tape " cpu_us | spread %.3f) |" ;;
esac

case " $rows " in *" allreduce "*)
  for n in 2 4; do
    row=ar$n
    echo
    if [ "$n" -gt "$(nproc)" ]; then
      echo "**All-reduce, $n ranks, oversubscribed ($n processes on $(nproc) cores: every figure includes waiting for a core)**:"
    else
      echo "**All-reduce, $n ranks**:"
    fi
    echo "f32 SUM, gloo groups (ddplua's uses shared memory between the ranks of a host). Back to back:" \
      "k calls in a row timed together (k: about 0.1 s of calls), median of $ar_rounds such rounds per run;" \
      "after a barrier: each call timed alone right after \`barrier()\`, median of up to 200 calls per run" \
      "(the barrier's skew between the ranks lands in it). busbw = bytes / back-to-back time × 2(n−1)/n." \
      "Ordinary: a plain tensor; shared: a \`dist.shared_buffer\` tensor (zero copy, as DDP's buckets). Medians of $rounds run(s)."
    echo
    echo "| size | ddplua b2b µs | ddplua shared b2b µs | PyTorch b2b µs | PyTorch / ddplua b2b | ddplua after barrier µs | PyTorch after barrier µs | ddplua busbw GB/s | ddplua shared busbw GB/s | PyTorch busbw GB/s |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for b in ${ar_sizes//,/ }; do
      d=$(ar_get "$row" ddplua "$b" ordinary b2b_us); s=$(ar_get "$row" ddplua "$b" shared b2b_us)
      t=$(ar_get "$row" torch "$b" ordinary b2b_us)
      echo "| $(size_label "$b") | $(fmt "$d" %.1f) | $(fmt "$s" %.1f) | $(fmt "$t" %.1f) | $(ratio "$t" "$d") |" \
        "$(fmt "$(ar_get "$row" ddplua "$b" ordinary time_us)" %.1f) | $(fmt "$(ar_get "$row" torch "$b" ordinary time_us)" %.1f) |" \
        "$(fmt "$(ar_get "$row" ddplua "$b" ordinary b2b_busbw_gbs)" %.2f) | $(fmt "$(ar_get "$row" ddplua "$b" shared b2b_busbw_gbs)" %.2f) |" \
        "$(fmt "$(ar_get "$row" torch "$b" ordinary b2b_busbw_gbs)" %.2f) |"
    done
  done ;;
esac

case " $rows " in *" small_op "*)
  echo
  echo "**One small op**, (4,) f32 tensors, 1 thread, \`bench/small_op.lua\` against \`bench/small_op_torch.py\`:" \
    "µs per call, median of $small_runs runs of $small_calls calls per run, then the median of $rounds run(s);" \
    "CPU time (user + system; disturbed less by a loaded machine) and wall clock. \"Tape on\": the right" \
    "operand requires grad. Each ddplua call makes a tensor handle that the collector releases: that is in the figure."
  echo
  echo "| op | ddplua CPU µs | PyTorch CPU µs | PyTorch / ddplua | ddplua wall µs | PyTorch wall µs |"
  echo "|---|---|---|---|---|---|"
  for op in plus_tape plus_nograd add_tape add_nograd; do
    case $op in
      plus_tape) label="\`a + b\`, tape on" ;; plus_nograd) label="\`a + b\`, no grad" ;;
      add_tape) label="\`a:add(b)\` (PyTorch \`a.add(b)\`), tape on" ;; add_nograd) label="\`a:add(b)\`, no grad" ;;
    esac
    d=$(med small_op ddplua "op=$op " cpu_us); t=$(med small_op torch "op=$op " cpu_us)
    echo "| $label | $(fmt "$d" %.3f) | $(fmt "$t" %.3f) | $(ratio "$t" "$d") | $(fmt "$(med small_op ddplua "op=$op " wall_us)" %.3f) | $(fmt "$(med small_op torch "op=$op " wall_us)" %.3f) |"
  done ;;
esac
