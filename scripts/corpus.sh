#!/usr/bin/env bash
# The corpus campaign (issue 20 item 6; docs/GPU.md "Corpus campaign"):
#   bash scripts/corpus.sh STAGE [--apps A,B] [options]      (make corpus STAGE=... APPS=...)
# development machine: build, plan, pack, merge;  GPU machine: plain, record, replay, tune, ncu, apply.
# `bash scripts/corpus.sh list --help` shows every option.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
  export PATH="$PWD/.venv/bin:$PATH"   # mneme-nvcc, mneme
else
  # the GPU machine: wheels from the bundle (or installed by an earlier call), native parts built once
  source scripts/gpu-env.sh || { echo "corpus: FAILED to set up the GPU environment (see above)"; exit 2; }
  PY=python3
fi
export PYTHONUNBUFFERED=1
exec "$PY" -m bench.corpus "$@"
