#!/usr/bin/env bash
# On the GPU machine: the MLflow store of two GPU sweeps, for the screenshots in docs/img that
# scripts/mlflow_screenshot.py takes on the development machine (headless Chromium; the GPU machine has none).
#
#   bash scripts/sweep-store.sh [OUT]     (default $OUT, else ./sweep-store)
#
# Records examples/bin/vecadd (16 Mi elements) and examples/bin/stencil2d (4096 x 4096, 2 steps), then runs
#   python -m mneme +experiment=sweep --multirun record.db=DB study.trials=$TRIALS sampler.seed=0
# on each (the `standard` space: block, O1-O3, specialization, launch bounds), in $STORE (default
# /tmp/mneme-sweep-store). Back in OUT: sweep-store.tar.xz (mlflow.db and mlruns/ of $STORE) and sweep.log
# (each sweep's output: one progress line, then its summary, `results:` and `Hydra:` lines).
# Here: mkdir -p /tmp/mneme-sweep-store && tar -xJf sweep-store.tar.xz -C /tmp/mneme-sweep-store
# (the same path, so that the runs' artifact paths resolve), then
#   python scripts/mlflow_screenshot.py --store sqlite:////tmp/mneme-sweep-store/mlflow.db --sweeps 2
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="${1:-${OUT:-$PWD/sweep-store}}"
STORE="${STORE:-/tmp/mneme-sweep-store}"
TRIALS="${TRIALS:-30}"
mkdir -p "$OUT"
if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"
elif [ -d .bundle/wheels ]; then
  source scripts/gpu-env.sh || { echo "sweep-store: FAILED to set up (see above)"; exit 2; }
  PY=python3
else
  PY="$ROOT/.venv/bin/python"
fi
export PYTHONUNBUFFERED=1
unset MLFLOW_TRACKING_URI
rm -rf "$STORE" && mkdir -p "$STORE" && cd "$STORE" || exit 2
LOG="$OUT/sweep.log"
: >"$LOG"
FAILED=0
sweep() {  # sweep NAME ARGV...: record the example, then sweep its record DB
  local name="$1"
  shift
  echo "== $name: mneme record -- $*" | tee -a "$LOG"
  "$PY" -m mneme.cli record -rdb "rec/$name" --quiet -- "$@" >>"$LOG" 2>&1 || { echo "sweep-store: $name: record FAILED" | tee -a "$LOG"; FAILED=1; return; }
  local db
  db=$(ls "rec/$name"/*.json | head -1)
  echo "== $name: python -m mneme +experiment=sweep --multirun record.db=$db study.trials=$TRIALS sampler.seed=0" | tee -a "$LOG"
  "$PY" -m mneme +experiment=sweep --multirun "record.db=$db" "study.trials=$TRIALS" sampler.seed=0 2>&1 | tee -a "$LOG" | tail -n 8
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "sweep-store: $name: sweep FAILED" | tee -a "$LOG"; FAILED=1; }
}
sweep vecadd "$ROOT/examples/bin/vecadd" 16777216
sweep stencil2d "$ROOT/examples/bin/stencil2d" 4096 4096 2
tar -cJf "$OUT/sweep-store.tar.xz" mlflow.db mlruns 2>>"$LOG" || FAILED=1
echo "sweep-store: $([ $FAILED -eq 0 ] && echo done || echo FAILED): $(ls -l "$OUT/sweep-store.tar.xz" 2>/dev/null | awk '{print $5}') bytes in $OUT/sweep-store.tar.xz, log $LOG"
exit $FAILED
