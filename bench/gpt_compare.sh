#!/usr/bin/env bash
# bench/gpt_compare.sh: issue 25's speed table: nanoGPT's GPT training tokens/s, ddplua
# (bench/gpt.lua) against PyTorch at its best (bench/gpt_torch.py: thread variables set before
# import, OMP_WAIT_POLICY=PASSIVE, torchrun for DDP), 1 process x 2 threads and DDP 2 x 1
# thread, batch per process as given. In each of ROUNDS rounds every layout runs ddplua and
# PyTorch back to back (ddplua first in odd rounds, PyTorch first in even ones); the table
# holds the medians over the rounds and the range.
# Environment: ROUNDS (3), STEPS (100), WARMUP (20), SHAPE (nanoGPT's CPU shape:
# "--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12"), AMP (empty or bf16).
# Prints a markdown section for bench/RESULTS.md on stdout, progress on stderr.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
rounds=${ROUNDS:-3}
steps=${STEPS:-100}
warmup=${WARMUP:-20}
shape=${SHAPE:---n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12}
amp=()
[ -n "${AMP:-}" ] && amp=(--amp "$AMP")
export DDPLUA_STORE_SECRET=gpt-compare-$$
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2206
args=($shape --steps "$steps" --warmup "$warmup" "${amp[@]}")
torch_env() { local n=$1; shift; env OMP_NUM_THREADS="$n" OPENBLAS_NUM_THREADS="$n" OMP_WAIT_POLICY=PASSIVE "$@"; }
run() { # run LAYOUT FRAMEWORK
  case $2/$1 in
    ddplua/1x2) build/ddplua bench/gpt.lua "${args[@]}" --threads 2 2>&1 ;;
    torch/1x2) torch_env 2 /usr/bin/python3 bench/gpt_torch.py "${args[@]}" --threads 2 2>&1 ;;
    ddplua/2x1) build/ddplua --nproc_per_node=2 --standalone bench/gpt.lua "${args[@]}" --threads 1 2>&1 ;;
    torch/2x1) torch_env 1 /usr/bin/python3 -m torch.distributed.run --nproc_per_node 2 --redirects 2 --tee 2 \
      --master_port $((29300 + RANDOM % 600)) bench/gpt_torch.py "${args[@]}" --threads 1 2>&1 ;;
  esac
}
for ((r = 1; r <= rounds; r++)); do
  fws=(ddplua torch); ((r % 2 == 0)) && fws=(torch ddplua)
  for layout in 1x2 2x1; do
    for fw in "${fws[@]}"; do
      line=$(run "$layout" "$fw" | grep -m 1 ' tokens_per_s=')
      echo "$line" | sed -n 's/.* tokens_per_s=\([0-9.]*\).*/\1/p' > "$tmp/$layout.$fw.$r"
      echo "$line" | sed -n 's/.* cpu_tokens_per_s=\([0-9.]*\).*/\1/p' > "$tmp/cpu.$layout.$fw.$r"
      echo "round $r $layout $fw: $(cat "$tmp/$layout.$fw.$r") tokens/s, $(cat "$tmp/cpu.$layout.$fw.$r") per CPU s" >&2
    done
  done
done
median() { grep -v '^$' | sort -g | awk '{a[NR] = $1} END {if (!NR) print "-"; else print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
range() { grep -v '^$' | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {if (NR) printf "%.0f–%.0f", lo, hi; else print "-"}'; }
echo "## GPT training tokens/s against PyTorch at its best (issue 25, bench/gpt_compare.sh)"
echo
echo "$(date -u +%Y-%m-%d), $(lscpu | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) cores shared with other work, commit $(git rev-parse --short HEAD)."
echo "Shape: \`$shape\` (batch per process)${AMP:+, amp $AMP}; $steps timed steps after $warmup, $rounds rounds alternating which framework runs first; medians (range)."
echo "Commands: \`ROUNDS=$rounds STEPS=$steps WARMUP=$warmup${AMP:+ AMP=$AMP} bash bench/gpt_compare.sh\`."
echo
echo "tokens/s is wall-clock (all ranks); tokens per CPU second divides by the CPU time of the processes (all their threads), which the other jobs on a shared machine move far less."
echo
echo "| layout | ddplua tokens/s | PyTorch 1.13 tokens/s | ratio | ranges (ddplua; PyTorch) | ddplua tokens/CPU s | PyTorch tokens/CPU s | ratio |"
echo "|---|---|---|---|---|---|---|---|"
for layout in 1x2 2x1; do
  d=$(cat "$tmp/$layout.ddplua".* | median); t=$(cat "$tmp/$layout.torch".* | median)
  ratio=$(awk -v a="$d" -v b="$t" 'BEGIN {if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f×", a / b}')
  label=$([ "$layout" = 1x2 ] && echo "1 process × 2 threads" || echo "DDP 2 × 1 thread")
  dc=$(cat "$tmp/cpu.$layout.ddplua".* | median); tc=$(cat "$tmp/cpu.$layout.torch".* | median)
  cratio=$(awk -v a="$dc" -v b="$tc" 'BEGIN {if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f×", a / b}')
  echo "| $label | $(printf %.0f "$d" 2>/dev/null || echo "$d") | $(printf %.0f "$t" 2>/dev/null || echo "$t") | $ratio | $(cat "$tmp/$layout.ddplua".* | range); $(cat "$tmp/$layout.torch".* | range) | $(printf %.0f "$dc" 2>/dev/null || echo "$dc") | $(printf %.0f "$tc" 2>/dev/null || echo "$tc") | $cratio |"
done
