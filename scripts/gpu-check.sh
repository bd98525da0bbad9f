#!/usr/bin/env bash
# The one-command GPU check (docs/GPU.md): on the GPU machine, install from the bundle, build the native
# parts, run the gpu-marked tests (they record the examples they need) and print one summary line.
# Usage: bash scripts/gpu-check.sh [PYTEST_K_EXPRESSION]
# The whole check no longer fits one 10-minute device call: GPU_CHECK_PART=tests runs the gpu tests only,
# GPU_CHECK_PART=stages only the stages after them (apply tests, main job, README commands); default both.
set -uo pipefail
cd "$(dirname "$0")/.."
K="${1:-}"
LOG="${OUT:-$PWD/.gpu}"
mkdir -p "$LOG"
t0=$(date +%s)
source scripts/gpu-env.sh || { echo "gpu-check: FAILED to set up (see above)"; exit 2; }
export MNEME_GPU_TESTS=1 PYTHONUNBUFFERED=1
# Tests that need several GPUs run only where there are several; elsewhere they are deselected, by name in
# the summary line, rather than skipped (a skip fails the check).
MARK=gpu
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${NGPU:-0}" -lt 2 ]; then
  MARK="gpu and not multigpu"
  export GPU_CHECK_NOTE="multigpu tests not run: ${NGPU:-0} GPU visible"
fi
# The whole check runs `mneme apply`'s tests (each records, tunes and runs an app several times) as a stage
# of their own with its own time bound, so that a slow or stuck app under libapply cannot take the other
# tests' report with it; with K, pytest alone runs what K selects.
APPLY_TESTS=tests/gpu/test_apply_gpu.py
IGNORE=()
[ -z "$K" ] && IGNORE=(--ignore="$APPLY_TESTS")
PART="${GPU_CHECK_PART:-all}"
JUNIT="$LOG/junit.xml"
rc=0
if [ "$PART" != stages ]; then
  # -v: one line per test as it ends, so a run cut by its time bound still names what passed and failed
  timeout "${GPU_CHECK_TIMEOUT:-470}" python3 -m pytest -m "$MARK" ${K:+-k "$K"} "${IGNORE[@]}" -p no:cacheprovider \
    -v -rfEs --junitxml="$JUNIT" --durations=15 tests/gpu 2>&1 | tee "$LOG/pytest.log" | grep -E "(FAILED|ERROR)( |$)|^(=|gpu-check)" 
  rc=${PIPESTATUS[0]}
else
  JUNIT=-
fi
STAGES=()
if [ -z "$K" ] && [ "$PART" != tests ]; then  # the whole check: the main job as a user runs it, in a new copy of the tree
  timeout "${APPLY_TIMEOUT:-300}" python3 -m pytest -m "$MARK" -p no:cacheprovider -v -rfEs -o faulthandler_timeout=60 \
    --junitxml="$LOG/junit-apply.xml" "$APPLY_TESTS" >"$LOG/apply.log" 2>&1
  STAGES+=("mneme apply tests=$?")
  tail -n 3 "$LOG/apply.log"
  timeout "${MAINJOB_TIMEOUT:-600}" bash scripts/mainjob.sh "$LOG"
  STAGES+=("main job (demo.sh in a new copy)=$?")
  # README.md's commands as a user types them (record, show, replay, tune, sweep, compare), placeholders filled
  timeout "${DOCCMDS_TIMEOUT:-420}" python3 scripts/doccmds.py --gpu >"$LOG/doccmds.log" 2>&1
  STAGES+=("README commands (scripts/doccmds.py --gpu)=$?")
  tail -n 1 "$LOG/doccmds.log"
fi
python3 scripts/summary.py "$JUNIT" "$rc" "$(( $(date +%s) - t0 ))" "${STAGES[@]}"
