#!/usr/bin/env bash
# `make demo`, the main job. On a GPU machine: build an example, record it, replay it, run a short
# tuning sweep logged to MLflow and compare the runs. Without a GPU: the compile-only experiment on the
# committed fixtures (registers, spills, size and compile times per configuration), logged and compared
# the same way; timing needs a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ] && [ ! -x .venv/bin/python ] && [ -d .bundle/wheels ]; then
  source scripts/gpu-env.sh   # a GPU machine prepared with `make gpu-bundle` (docs/GPU.md)
  PY=python3
fi
PY=${PY:-.venv/bin/python}
MNEME=("$PY" -m mneme.cli)
OUTDIR=${DEMO_DIR:-demo}
mkdir -p "$OUTDIR"
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$PWD/$OUTDIR/mlflow.db}
step() { printf '\n== %s\n' "$*"; }

if "$PY" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null; then
  if [ ! -x examples/bin/vecadd ]; then
    step "build the examples with mneme cc"
    make --no-print-directory examples >/dev/null
  fi
  step "record vecadd (16 Mi elements)"
  rm -rf "$OUTDIR/rec"
  "${MNEME[@]}" record -rdb "$OUTDIR/rec" -- examples/bin/vecadd 16777216
  "${MNEME[@]}" show "$OUTDIR/rec"
  DB=$(ls "$OUTDIR"/rec/*.json | head -1)
  step "replay the recorded configuration"
  "${MNEME[@]}" replay -rdb "$DB"
  step "a short launch sweep (40 trials), tracked in MLflow"
  "$PY" -m mneme +experiment=launch_search --multirun record.db="$DB" study.trials=40
  step "compare the runs"
  "${MNEME[@]}" compare --latest --best
else
  echo "No NVIDIA driver here: running the compile-only experiment on the committed fixtures."
  echo "(Recording, replay timing and tuning for time need a GPU: see docs/GPU.md.)"
  DBS=$(ls tests/fixtures/{vecadd,stencil2d,rdc}/*.json | paste -sd, -)
  step "compile-only: registers, spills, size and compile times at two codegen levels"
  "$PY" -m mneme +experiment=compile_only --multirun "record.db=$DBS" replay.codegen_opt=0,3
  step "compare the runs"
  "${MNEME[@]}" compare --latest
fi
step "MLflow store: ${MLFLOW_TRACKING_URI}"
echo "browse it with: mlflow ui --backend-store-uri ${MLFLOW_TRACKING_URI}"
