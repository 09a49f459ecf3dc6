#!/usr/bin/env bash
# Run once here, in the repository root, before the two `run` calls of heads/gpu_train.sh
# (heads/README.md, "Training on the GPU"): the embedded model's GGUF in two halves under .gpu/
# (each call carries < 64 MiB), and the gguf wheel under .whl/ (the GPU machine has no gguf package).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
python=${PYTHON:-.venv/bin/python}
gguf=$("$python" -c "from tokenswift_cli.model.loading import default_model_path; print(default_model_path())")
exclude="$(git rev-parse --git-common-dir)/info/exclude"
for path in /.gpu/ /.whl/; do
    grep -qxF "$path" "$exclude" 2>/dev/null || echo "$path" >>"$exclude"
done
mkdir -p .gpu .whl
size=$(stat -c %s "$gguf")
head -c $((size / 2)) "$gguf" >.gpu/gguf.part1
tail -c +$((size / 2 + 1)) "$gguf" >.gpu/gguf.part2
cat .gpu/gguf.part1 .gpu/gguf.part2 | sha256sum | cut -d' ' -f1 >.gpu/check
grep -qxF "$(sha256sum "$gguf" | cut -d' ' -f1)" .gpu/check && rm .gpu/check
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl gguf==0.19.0
ls -l .gpu .whl
git status --short --ignored .gpu .whl
