#!/usr/bin/env bash
# The GPU check: run on a machine with an NVIDIA GPU (about 10 minutes in all).
# First checks that the engine's tokens on the GPU are right (gpu_parity.py: batched = alone, torch =
# JAX, the decode step replayed as a CUDA graph, fast f32 and bf16 near exact), then where a torch
# step's time goes (gpu_profile.py: the decode step replayed and eager, a packed and a mixed pass,
# their costliest kernels), then prints a table: throughput.py's load with random Llama 3.1 8B
# weights in bf16 on torch and on JAX, one request (128 prompt, 128 new tokens) on both,
# (torch choosing between its runtime's kernels and Linnet's Triton ones by timing both at the decode
# step's capture; the choice is in gpu_check.log), the torch rows again with the runtime's kernels
# only (LINNET_TRITON_DECODE=0 LINNET_TRITON_OPS=0),
# transformers' generate on the same load, JAX's step and passes timed (gpu_profile.py --backend
# jax), and the torch rows again with LINNET_TORCH_INDUCTOR=1 (the decode step fused by
# torch.compile before it is captured).
#   bash benchmarks/gpu_check.sh [--quick] [--gpt-oss] [--no-inductor]
# GPU_CHECK_SECONDS (default 580, under the 10 minutes a borrowed machine gives one command): the
# whole check's time, from its start. Each step runs for at most its own cap, and never into the
# time kept for the steps after it: a slow step (a long compile) costs its own row, not the others'.
# --quick: 64 requests instead of 256. --gpt-oss: also gpt-oss-20b (random weights, 42 GB in bf16)
# on both backends, after the table's other rows (give GPU_CHECK_SECONDS 10 minutes more).
# --no-inductor: without the LINNET_TORCH_INDUCTOR rows (which no longer fit in 580 s after the
# others: run them in a second call, GPU_CHECK_ONLY=inductor).
# GPU_CHECK_ONLY: a bash regex; only the rows whose names match it run (a second, short call:
#   GPU_CHECK_ONLY=inductor bash benchmarks/gpu_check.sh).
# lark, gguf, interegular and llguidance may be missing there: put their wheels in .whl/ first (here,
# with the network: pip download --no-deps -d .whl lark gguf interegular llguidance, for the GPU
# machine's Python), bring .whl along, and they are installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
DEADLINE=$((SECONDS + ${GPU_CHECK_SECONDS:-580}))
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if ! PYTHONPATH=/tmp/site:${PYTHONPATH:-} python3 -c "import lark" 2>/dev/null; then
  echo "gpu_check: lark is not installed and no wheel of it is in .whl/ (see the top of this script)" >&2
  exit 2
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.85}
REQ=256; GPT_OSS=0; INDUCTOR=1
for flag in "$@"; do
  case $flag in
    --quick) REQ=64 ;;
    --gpt-oss) GPT_OSS=1 ;;
    --no-inductor) INDUCTOR=0 ;;
    *) echo "gpu_check: unknown flag $flag (flags: --quick, --gpt-oss, --no-inductor)" >&2; exit 2 ;;
  esac
done
T=examples/04-serve/throughput.py
OUT=${OUT:-/tmp}
: > "$OUT/gpu_table.txt"
: > "$OUT/gpu_check.log"
# Without a GPU every row would run on the CPU for its whole cap (10 minutes of nothing): stop here
if ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  echo "gpu_check: no CUDA GPU here (torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)," \
       "nvidia-smi: $(nvidia-smi -L 2>/dev/null | head -1 || true)$(command -v nvidia-smi >/dev/null || echo not installed)); this check runs on a machine with an NVIDIA GPU" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, jax; print('torch', torch.__version__, '| jax', jax.__version__, jax.devices())"
if ! python3 -c "import jax, sys; sys.exit(jax.devices()[0].platform != 'gpu')" 2>/dev/null; then
  echo "jax (no GPU)                       its rows would run on the CPU: JAX's CUDA plugin is missing" >> "$OUT/gpu_table.txt"
fi

run() {  # name, most seconds, seconds kept for the steps after it, command...: one row of the table
  local name=$1 most=$2 keep=$3; shift 3
  if [ -n "${GPU_CHECK_ONLY:-}" ]; then  # a few rows: each takes its cap, none kept for rows not run
    [[ $name =~ $GPU_CHECK_ONLY ]] || return
    keep=0
  fi
  local left=$((DEADLINE - SECONDS - keep - 5)) begun=$SECONDS line status
  [ "$most" -gt "$left" ] && most=$left
  if [ "$most" -lt 20 ]; then
    printf '%-34s %s\n' "$name" "SKIPPED (out of time)" >> "$OUT/gpu_table.txt"; return
  fi
  echo "== $name (at most $most s)" | tee -a "$OUT/gpu_check.log" >&2
  timeout -k 10 "$most" "$@" > "$OUT/step.log" 2>&1
  status=$?
  cat "$OUT/step.log" >> "$OUT/gpu_check.log"
  line=$(grep -E "tokens/s|compiled in|loaded in|^FAIL |^decode step|^engine step|^packed pass|^mixed pass|^passes |^weight layers " "$OUT/step.log" | tr '\n' ' ')
  rm -f "$OUT/step.log"
  if [ $status = 124 ] || [ $status = 137 ]; then
    line="TIMED OUT after $((SECONDS - begun)) s $line"
  elif [ $status != 0 ]; then
    line="FAILED (exit $status after $((SECONDS - begun)) s; see gpu_check.log) $line"
  else
    line="$line(step $((SECONDS - begun)) s)"
  fi
  printf '%-34s %s\n' "$name" "$line" >> "$OUT/gpu_table.txt"
}
ONE="--requests 1 --rows 1 --min-prompt 128 --max-prompt 128"
RUNTIME_KERNELS="LINNET_TRITON_DECODE=0 LINNET_TRITON_OPS=0"  # none of Linnet's Triton kernels, untimed
# kept: the least time the steps after it need (the sum of their floors: parity 60, profile 30, torch
# 45, one request 30, the runtime's kernels' rows 30 each, transformers 45, jax 90, jax one request 50, jax
# profile 60, and the inductor rows 60 each where they run), so a shorter GPU_CHECK_SECONDS shortens
# the first steps rather than skipping the last.
I=$((INDUCTOR * 120))
#   name                                 cap  kept        command
run "parity (gpu_parity.py)"             140  $((410 + I)) python3 benchmarks/gpu_parity.py
run "profile (gpu_profile.py)"           75   $((380 + I)) python3 benchmarks/gpu_profile.py
run "torch, $REQ requests, 64 rows"      130  $((335 + I)) python3 $T --weights random --requests $REQ
run "torch, one request"                 60   $((305 + I)) python3 $T --weights random $ONE
run "torch runtime's kernels, one req"   45   $((275 + I)) env $RUNTIME_KERNELS python3 $T --weights random $ONE
run "torch runtime's kernels, $REQ req"  60   $((245 + I)) env $RUNTIME_KERNELS python3 $T --weights random --requests $REQ
run "transformers generate, $REQ req"    90   $((200 + I)) python3 benchmarks/transformers_peer.py --requests $REQ
run "jax, $REQ requests, 64 rows"        220  $((110 + I)) env JAX_LOG_COMPILES=1 python3 $T --weights random --requests $REQ --backend jax
run "jax, one request"                   120  $((60 + I))  python3 $T --weights random $ONE --backend jax
run "jax profile (gpu_profile.py)"       120  $I           python3 benchmarks/gpu_profile.py --backend jax
if [ $INDUCTOR = 1 ]; then
  run "torch inductor, one request"      150  60           env LINNET_TORCH_INDUCTOR=1 python3 $T --weights random $ONE
  run "torch inductor, $REQ requests"    150  0            env LINNET_TORCH_INDUCTOR=1 python3 $T --weights random --requests $REQ
fi
if [ $GPT_OSS = 1 ]; then
  run "gpt-oss-20b torch, $REQ requests" 300  300  python3 $T --card gpt-oss-20b --weights random --requests $REQ
  run "gpt-oss-20b jax, $REQ requests"   300  0    python3 $T --card gpt-oss-20b --weights random --requests $REQ --backend jax
fi
echo
echo "Llama 3.1 8B shape, random weights, bf16 (targets on an H200: torch >= 7000, jax >= 6000, one request >= 200)"
cat "$OUT/gpu_table.txt"
