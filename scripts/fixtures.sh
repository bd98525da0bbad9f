#!/usr/bin/env bash
# On the GPU machine: record the fixture set (small real recordings that the CPU tests replay, tune and
# track without a GPU) and pack it as one archive: $OUT/fixtures.tar.gz (or ./fixtures.tar.gz).
# Back here: tar -xzf fixtures.tar.gz -C tests/fixtures
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
DEST=$(mktemp -d)
rec() { local name=$1; shift; mneme record -rdb "$DEST/$name" -- "examples/bin/$1" "${@:2}" >"$DEST/$name.log" 2>&1 \
        || { echo "fixtures: recording $name failed:"; cat "$DEST/$name.log"; exit 1; }; rm "$DEST/$name.log"; }
rec vecadd vecadd
rec stencil2d stencil2d
rec rdc rdc
rec ptrglobal ptrglobal
rec matmul matmul
rec manylaunch manylaunch
ARCHIVE="${OUT:-$PWD}/fixtures.tar.gz"
tar -czf "$ARCHIVE" -C "$DEST" .
echo "fixtures: $(find "$DEST" -name '*.json' | wc -l) record DBs, $(du -sh "$DEST" | cut -f1) -> $ARCHIVE"
