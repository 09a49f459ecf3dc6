#!/usr/bin/env bash
# Run HERE, once, before the GPU session: stages into .gpu/ (git-ignored, carried by the two run calls)
# the embedded model's GGUF in two halves (each call carries < 64 MiB with the tree) and the gguf wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
gguf=$(PYTHONPATH=$PWD/src "$PY" -c "from tokenswift_cli.model.loading import default_model_path; print(default_model_path())")
rm -rf .gpu && mkdir -p .gpu/part1 .gpu/part2
split -n 2 -d "$gguf" .gpu/half
mv .gpu/half00 .gpu/part1/ && mv .gpu/half01 .gpu/part2/
basename "$gguf" >.gpu/part2/name
(cd "$(dirname "$gguf")" && sha256sum "$(basename "$gguf")") >.gpu/part2/sha256
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/part2 gguf==0.19.0
du -sh .gpu/part1 .gpu/part2
