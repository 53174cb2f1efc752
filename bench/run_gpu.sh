#!/usr/bin/env bash
# bench/run_gpu.sh: check and measure the CUDA backend on a machine with a GPU; writes
# results.md (Markdown tables, the GPU's name from nvidia-smi) and the raw logs into the
# output folder, and prints results.md last.
#
#   bench/run_gpu.sh [--out DIR] [--runs N] [--rounds N] [--dry] [PART ...]
#
# PART: env (always done), parity (spec/backend_ops_spec.lua: every op on the GPU against the
# CPU), specs (every #cuda spec: busted --tags=cuda spec, the harness included), gemm (bench/gpu_gemm.lua against
# bench/gpu_gemm_torch.py), train (bench/gpu_train.lua against bench/gpu_train_torch.py).
# Default: parity gemm train. DIR: --out, else $OUT (the device tool's folder), else
# bench/out/gpu. --runs: training runs per (model, TF32) and framework (default 5);
# --rounds: GEMM rounds per framework (default 3); ddplua and PyTorch alternate run by run,
# the tables give medians. TF32_MODES (default "0 1") picks the training TF32 settings.
# --dry: everything tiny on the CPU (the harness then runs on the simulated and emulated
# devices only): checks the scripts on a machine without a GPU; no timings.
#
# On the lent GPU machine (see /work/.library/device/README.md): that machine has nvcc,
# PyTorch and CUDA, but no LuaJIT, OpenBLAS, Gloo or busted. Build here and pack what the
# runtime needs with bench/gpu_bundle.sh (bench/gpu_bundle/ddplua-gpu.tar.xz: the build, its
# shared libraries, luajit and busted); this script unpacks it when it is there. Then run
# with carry ["bench/gpu_bundle"]; one call has 10 minutes, so split the parts, e.g.
#   run(command="bench/run_gpu.sh parity gemm", carry=["bench/gpu_bundle"])
#   run(command="bench/run_gpu.sh train",       carry=["bench/gpu_bundle"])
# Each call's results come back under files_at (results.md, logs).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

out="${OUT:-}"
runs=5
rounds=3
dry=0
parts=()
cmdline="bench/run_gpu.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --dry) dry=1; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    env|parity|specs|gemm|train) parts+=("$1"); shift ;;
    *) echo "run_gpu.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#parts[@]} -eq 0 ] && parts=(parity gemm train)
[ -z "$out" ] && out="$root/bench/out/gpu"
mkdir -p "$out"
out=$(cd "$out" && pwd)
: > "$out/failures.txt"
log() { echo "run_gpu: $*" >&2; }
want() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
fail_note() { echo "$*" >> "$out/failures.txt"; log "FAILED: $*"; }

# ---- the runtime: a local build, or the bundle made by bench/gpu_bundle.sh ----------------
# ddplua's programs (build/ddplua, luajit, busted) run with LD_LIBRARY_PATH=$ddp_ld (the
# bundle's libraries, the CUDA libraries found below); Python keeps the environment it came
# with, so the bundle's older libz or libexpat never reach PyTorch.
ddp_ld="${LD_LIBRARY_PATH:-}"
ddp() { LD_LIBRARY_PATH="$ddp_ld" "$@"; }
# every command runs under `timeout` so one hang cannot eat the device call (600 s at most):
# RUN_TIMEOUT per benchmark process (default 150 s), SPEC_TIMEOUT per busted run (300 s),
# and the GEMM and training loops stop starting runs after GEMM_BUDGET / TRAIN_BUDGET
# seconds (default 330 / 480), noting what was left out.
run_timeout=${RUN_TIMEOUT:-150}
spec_timeout=${SPEC_TIMEOUT:-300}
tmo() { local t="$1"; shift; timeout --kill-after=10 "$t" env LD_LIBRARY_PATH="$ddp_ld" "$@"; }
bundle="$root/bench/gpu_bundle/ddplua-gpu.tar.xz"
if [ -f "$bundle" ]; then
  b=/tmp/ddplua-gpu
  rm -rf "$b" && mkdir -p "$b"
  if ! tar -xJf "$bundle" -C "$b" 2>/dev/null; then
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$bundle" "$b" \
      || { log "cannot unpack $bundle"; exit 1; }
  fi
  # the bundle's build goes to build/ only where there is none (the device's fresh copy) or
  # where an earlier call put it there: a local build is never overwritten
  if [ ! -e build/libddplua.so ] || [ -e build/.from_bundle ]; then
    mkdir -p build && cp -a "$b/build/." build/ && touch build/.from_bundle
  else
    log "keeping the local build/ (the bundle's libraries, luajit and busted are used)"
  fi
  export PATH="$b/bin:$PATH"
  ddp_ld="$b/lib${ddp_ld:+:$ddp_ld}"
  export LUA_PATH="$b/share/lua/5.1/?.lua;$b/share/lua/5.1/?/init.lua;;"
  export LUA_CPATH="$b/lib/lua/5.1/?.so;;"
  log "using the bundle $bundle ($(cat "$b/BUNDLE" 2>/dev/null || echo '?'))"
fi
for f in build/libddplua.so build/ddplua build/lua/ddplua/cdef.lua; do
  [ -e "$f" ] || { log "$f is missing: run make (or bench/gpu_bundle.sh, then carry bench/gpu_bundle)"; exit 1; }
done
ddp luajit -v >/dev/null 2>&1 || { log "luajit is not on the PATH (the bundle has it: bench/gpu_bundle.sh)"; exit 1; }

# The plug-in's CUDA libraries (cuBLAS, cuDNN, NCCL): where the toolkit or PyTorch's wheels
# keep them, when the loader does not find them by itself.
PY=python3
if ! $PY -c "import torch" 2>/dev/null && /usr/bin/python3 -c "import torch" 2>/dev/null; then PY=/usr/bin/python3; fi
if [ -f build/libddplua_cuda.so ] && [ "$dry" = 0 ]; then
  cand=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  while IFS= read -r d; do cand+=("$d"); done < <($PY - <<'EOF' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu*", "lib")):
        print(d)
EOF
)
  for lib in $(ddp ldd build/libddplua_cuda.so 2>/dev/null | awk '/not found/ {print $1}'); do
    for d in "${cand[@]}"; do
      if [ -e "$d/$lib" ]; then
        ddp_ld="$d${ddp_ld:+:$ddp_ld}"
        log "found $lib in $d"
        break
      fi
    done
  done
  missing=$(ddp ldd build/libddplua_cuda.so 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
  [ -n "$missing" ] && log "the CUDA plug-in still misses: $missing(ddplua will say CUDA is not available)"
fi
export DDPLUA_CUDA_PLUGIN="${DDPLUA_CUDA_PLUGIN:-$root/build/libddplua_cuda.so}"
if [ "$dry" = 1 ]; then export DDPLUA_CUDA_PLUGIN="$root/build/libddplua_cuda_sim.so"; fi

# ---- env ---------------------------------------------------------------------------------
{
  echo "command=$cmdline"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo 'unknown (no .git here)')"
  [ -n "${b:-}" ] && echo "bundle=$(cat "$b/BUNDLE" 2>/dev/null || echo '?')"
  echo "date=$(date -u '+%F %H:%M UTC')"
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    echo "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)"
    echo "gpu_memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader | head -n 1)"
    echo "gpu_clocks=$(nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader | head -n 1)"
  else
    echo "gpu=none (nvidia-smi found no GPU)"
  fi
  ddp build/ddplua bench/gpu_env.lua 2>&1
  echo "torch=$($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1 | tail -n 1)"
  echo "host=$(nproc) CPUs, $(uname -r)"
} > "$out/env.txt"
cat "$out/env.txt" >&2

# ---- specs ---------------------------------------------------------------------------------
if want parity; then
  log "parity spec"
  tmo "$spec_timeout" busted -o spec/helpers/ci_output.lua spec/backend_ops_spec.lua > "$out/parity.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && fail_note "parity spec: busted exit $rc (parity.log)"
fi
if want specs; then
  log "every #cuda spec"
  tmo "$spec_timeout" busted -o spec/helpers/ci_output.lua --tags=cuda spec > "$out/specs.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && fail_note "#cuda specs: busted exit $rc (specs.log)"
fi

# ---- GEMM ------------------------------------------------------------------------------
# one command under RUN_TIMEOUT, its key=value lines appended to $2, failures noted
run_into() {
  local what="$1" dst="$2"; shift 2
  local tmp rc
  tmp=$(mktemp)
  if [ "$1" = "$PY" ]; then  # Python with the environment it came with
    timeout --kill-after=10 "$run_timeout" "$@" > "$tmp" 2> "$tmp.err"
  else
    tmo "$run_timeout" "$@" > "$tmp" 2> "$tmp.err"
  fi
  rc=$?
  cat "$tmp" >> "$dst"
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "(killed after ${run_timeout} s)" >> "$tmp.err"
    fail_note "$what: exit $rc: $(tail -n 3 "$tmp.err" | tr '\n' ' ')"
  fi
  cat "$tmp.err" >> "$out/run.log"
  rm -f "$tmp" "$tmp.err"
}
dryflag=()
[ "$dry" = 1 ] && dryflag=(--dry)
if want gemm; then
  : > "$out/gemm.txt"
  start=$SECONDS
  for r in $(seq "$rounds"); do
    if [ $((SECONDS - start)) -gt "${GEMM_BUDGET:-330}" ]; then
      fail_note "gemm: rounds $r..$rounds left out (GEMM_BUDGET ${GEMM_BUDGET:-330} s spent)"
      break
    fi
    log "gemm round $r/$rounds"
    run_into "ddplua gemm round $r" "$out/gemm.txt" build/ddplua bench/gpu_gemm.lua "${dryflag[@]}"
    run_into "torch gemm round $r" "$out/gemm.txt" $PY bench/gpu_gemm_torch.py "${dryflag[@]}"
  done
fi

# ---- training ------------------------------------------------------------------------------
if want train; then
  : > "$out/train.txt"
  start=$SECONDS
  for r in $(seq "$runs"); do
    if [ $((SECONDS - start)) -gt "${TRAIN_BUDGET:-480}" ]; then
      fail_note "train: runs $r..$runs left out (TRAIN_BUDGET ${TRAIN_BUDGET:-480} s spent)"
      break
    fi
    for model in cnn resnet20; do
      for tf in ${TF32_MODES:-0 1}; do
        tfflag=()
        [ "$tf" = 1 ] && tfflag=(--tf32)
        log "train run $r/$runs $model tf32=$tf"
        run_into "ddplua train $model tf32=$tf run $r" "$out/train.txt" \
          build/ddplua bench/gpu_train.lua --model "$model" --max-seconds 20 "${tfflag[@]}" "${dryflag[@]}"
        run_into "torch train $model tf32=$tf run $r" "$out/train.txt" \
          $PY bench/gpu_train_torch.py --model "$model" --max-seconds 20 "${tfflag[@]}" "${dryflag[@]}"
      done
    done
  done
fi

$PY bench/gpu_report.py "$out" > "$out/results.md" || /usr/bin/python3 bench/gpu_report.py "$out" > "$out/results.md"
[ -s "$out/failures.txt" ] || rm -f "$out/failures.txt"
[ -s "$out/run.log" ] || rm -f "$out/run.log"
cat "$out/results.md"
