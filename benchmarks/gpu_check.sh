#!/usr/bin/env bash
# The GPU check: run on a machine with an NVIDIA GPU (about 10 minutes in all).
# First checks that the engine's tokens on the GPU are right (gpu_parity.py: batched = alone, torch =
# JAX, the decode step replayed as a CUDA graph), then prints a table: throughput.py's load with
# random Llama 3.1 8B weights in bf16 on torch and on JAX, one request (128 prompt, 128 new tokens)
# on both, and transformers' generate on the same load.
#   bash benchmarks/gpu_check.sh [--quick] [--gpt-oss]
# GPU_CHECK_SECONDS (default 600): the whole check's time; each step gets its share of what is left,
# so that a slow step (a long compile) costs its own row, not the rows after it.
# --quick: 64 requests instead of 256. --gpt-oss: also gpt-oss-20b (random weights, 42 GB in bf16)
# on both backends, after the table's other rows (a few minutes more).
# lark and gguf may be missing there: put their wheels in .whl/ first (here, with the network:
#   pip download --no-deps -d .whl lark gguf), bring .whl along, and they are installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if ! PYTHONPATH=/tmp/site:${PYTHONPATH:-} python3 -c "import lark" 2>/dev/null; then
  echo "gpu_check: lark is not installed and no wheel of it is in .whl/ (see the top of this script)" >&2
  exit 2
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}
REQ=256; GPT_OSS=0
for flag in "$@"; do
  case $flag in
    --quick) REQ=64 ;;
    --gpt-oss) GPT_OSS=1 ;;
    *) echo "gpu_check: unknown flag $flag (flags: --quick, --gpt-oss)" >&2; exit 2 ;;
  esac
done
T=examples/04-serve/throughput.py
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, jax; print('torch', torch.__version__, '| jax', jax.__version__, jax.devices())"

DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-600}))
run() {  # name, most seconds, command...: one row of the table, from the command's last "tokens/s" line
  local name=$1 most=$2; shift 2
  local left=$((DEADLINE - SECONDS - 5)) begun=$SECONDS line
  [ "$most" -gt "$left" ] && most=$left
  if [ "$most" -lt 20 ]; then
    printf '%-34s %s\n' "$name" "SKIPPED (out of time)" >> "$OUT/gpu_table.txt"; return
  fi
  echo "== $name (at most $most s)" | tee -a "$OUT/gpu_check.log" >&2
  line=$(timeout "$most" "$@" 2>&1 | tee -a "$OUT/gpu_check.log" | grep -E "tokens/s|compiled in|loaded in" | tr '\n' ' ')
  case $line in
    *tokens/s*) ;;
    *) line="FAILED after $((SECONDS - begun)) s of $most (see $OUT/gpu_check.log) $line" ;;
  esac
  printf '%-34s %s\n' "$name" "$line" >> "$OUT/gpu_table.txt"
}
: > "$OUT/gpu_table.txt"
echo "== parity (at most 120 s)" | tee -a "$OUT/gpu_check.log"
timeout 120 python3 benchmarks/gpu_parity.py 2>&1 | tee -a "$OUT/gpu_check.log"
ONE="--requests 1 --rows 1 --min-prompt 128 --max-prompt 128"
run "torch, $REQ requests, 64 rows"  150 python3 $T --weights random --requests $REQ
run "torch, one request"             60  python3 $T --weights random $ONE
run "transformers generate, $REQ req" 100 python3 benchmarks/transformers_peer.py --requests $REQ
run "jax, $REQ requests, 64 rows"    240 env JAX_LOG_COMPILES=1 python3 $T --weights random --requests $REQ --backend jax
run "jax, one request"               120 env JAX_LOG_COMPILES=1 python3 $T --weights random $ONE --backend jax
if [ $GPT_OSS = 1 ]; then
  run "gpt-oss-20b torch, $REQ requests" 300 python3 $T --card gpt-oss-20b --weights random --requests $REQ
  run "gpt-oss-20b jax, $REQ requests"   300 python3 $T --card gpt-oss-20b --weights random --requests $REQ --backend jax
fi
echo
echo "Llama 3.1 8B shape, random weights, bf16 (targets on an H200: torch >= 7000, jax >= 6000, one request >= 200)"
cat "$OUT/gpu_table.txt"
