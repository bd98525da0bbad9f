#!/usr/bin/env bash
# Prepares what the GPU machine cannot make itself (docs/GPU.md): cp312 wheels of the Python packages its
# image lacks, and the example apps built here with clang-22 through `mneme cc`. Both land in ignored
# folders that the device call carries: .bundle/ and examples/bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
W=.bundle/wheels
mkdir -p "$W"
if ! ls "$W"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  # antlr4 4.9.3 (hydra-core's parser runtime) is published only as an sdist.
  "$PY" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$W"
fi
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$W" -r scripts/gpu-wheels.txt
make --no-print-directory examples
git rev-parse --short HEAD > .bundle/COMMIT 2>/dev/null || echo unknown > .bundle/COMMIT
git diff --quiet 2>/dev/null || sed -i 's/$/-dirty/' .bundle/COMMIT
echo "bundle: $(ls "$W" | wc -l) wheels ($(du -sh "$W" | cut -f1)), $(ls examples/bin | wc -l) example binaries, commit $(cat .bundle/COMMIT)"
