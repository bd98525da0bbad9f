#!/usr/bin/env bash
# The benchmark suite on a GPU machine (issue 6), in parts that each finish within 8 minutes, so that
# one time-limited call runs one part. Results land in ${OUT:-bench/results}: <bench>.json (for
# bench/report.py), <bench>.log (what the script printed), machine.json, and report.md (the markdown
# of every result there so far).
#
#   bash scripts/bench.sh [PART]      (make bench PART=...)
#     quick    record + compile + replay with --quick, and a short tuning-throughput run (~4 min)
#     record   bench/bench_record.py      record overhead, snapshot bytes (manylaunch)
#     compile  bench/bench_compile.py     compile time per stage (runs without a GPU too)
#     replay   bench/bench_replay.py      replay fidelity, reset time vs D2D bandwidth
#     tune     bench/bench_tune_throughput.py   configurations per second, 1/4/16 compile jobs
#     best     bench/bench_best_speedup.py      best speedup `mneme tune` finds per example (~4 min)
#     kt       bench/bench_kernel_tuner.py      side by side with Kernel Tuner (vecAdd, 2-D stencil; ~3 min)
#     multi    bench/bench_multi_gpu.py         one GPU vs every GPU of the host (needs nvidia-h200-x2 or larger)
#     track    bench/bench_track_corpus.py      tracking on/off on corpus kernels (PACK=.corpus/packN, APPS=A,B, TRACK_ARGS;
#              record DBs of an earlier `corpus.sh record` in .corpus/work are used, else the pack is recorded)
#     all      every full part in turn (no per-call limit: ~18 min)
#     report   only regenerate report.md from the results there
set -uo pipefail
cd "$(dirname "$0")/.."
PART="${1:-quick}"
OUT="${OUT:-$PWD/bench/results}"
LIMIT="${BENCH_TIMEOUT:-470}"
mkdir -p "$OUT"

if [ -n "${PYTHON:-}" ]; then
  PY="$PYTHON"  # an environment that has mneme already (a dev machine: PYTHON=.venv/bin/python)
elif [ -d .bundle/wheels ]; then
  # the GPU machine: wheels from the bundle, native parts built once, mneme on PATH
  source scripts/gpu-env.sh || { echo "bench: FAILED to set up (see above)"; exit 2; }
  PY=python3
elif [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
fi
export PYTHONUNBUFFERED=1
FAILED=()

# run NAME SECONDS COMMAND...: one bench script under a time limit, its output kept in NAME.log
run() {
  local name="$1" limit="$2"
  shift 2
  echo "== bench $name: $* (limit ${limit}s)"
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== bench $name: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || FAILED+=("$name (exit $rc)")
}

tune() {  # tune [ARGS...]: the tune helper's script, if present (it writes a plain list with --json)
  if [ -f bench/bench_tune_throughput.py ]; then
    run tune_throughput "$1" "$PY" bench/bench_tune_throughput.py --json "$OUT/tune_throughput.json" "${@:2}"
  else
    echo "== bench tune: bench/bench_tune_throughput.py is missing, skipped"
  fi
}

"$PY" bench/benchlib.py header machine > "$OUT/machine.json" 2>/dev/null || true
case "$PART" in
  quick)
    run record 120 "$PY" bench/bench_record.py --quick --out "$OUT/record.json"
    run compile 45 "$PY" bench/bench_compile.py --quick --out "$OUT/compile.json"
    run replay 150 "$PY" bench/bench_replay.py --quick --out "$OUT/replay.json"
    tune 150 --configs 60 --jobs 1,4,16 --no-tune-row
    run best_speedup 150 "$PY" bench/bench_best_speedup.py --quick --out "$OUT/best_speedup.json"
    ;;
  record) run record "$LIMIT" "$PY" bench/bench_record.py --out "$OUT/record.json" ;;
  compile) run compile "$LIMIT" "$PY" bench/bench_compile.py --out "$OUT/compile.json" ;;
  replay) run replay "$LIMIT" "$PY" bench/bench_replay.py --out "$OUT/replay.json" ;;
  tune) tune "$LIMIT" ;;
  best) run best_speedup "$LIMIT" "$PY" bench/bench_best_speedup.py --out "$OUT/best_speedup.json" ;;
  kt) run kernel_tuner "$LIMIT" "$PY" bench/bench_kernel_tuner.py --out "$OUT/kernel_tuner.json" ;;
  multi) run multi_gpu "$LIMIT" "$PY" bench/bench_multi_gpu.py --devices "${DEVICES:-0,1}" --out "$OUT/multi_gpu.json" ;;
  # shellcheck disable=SC2086  # TRACK_ARGS: more flags of the script, e.g. "--trials 60 --pairs 2"
  track) run track_corpus "$LIMIT" "$PY" bench/bench_track_corpus.py --pack "${PACK:-.corpus/pack}" ${APPS:+--apps "$APPS"} \
           --budget "$((LIMIT - 40))" ${TRACK_ARGS:-} --out "$OUT/track_corpus.json" ;;
  all)
    run record "$LIMIT" "$PY" bench/bench_record.py --out "$OUT/record.json"
    run compile "$LIMIT" "$PY" bench/bench_compile.py --out "$OUT/compile.json"
    run replay "$LIMIT" "$PY" bench/bench_replay.py --out "$OUT/replay.json"
    tune "$LIMIT"
    run best_speedup "$LIMIT" "$PY" bench/bench_best_speedup.py --out "$OUT/best_speedup.json"
    run kernel_tuner "$LIMIT" "$PY" bench/bench_kernel_tuner.py --out "$OUT/kernel_tuner.json"
    ;;
  report) ;;
  *) echo "bench: unknown part '$PART' (quick, record, compile, replay, tune, best, kt, multi, track, all, report)"; exit 2 ;;
esac

"$PY" bench/report.py "$OUT" --out "$OUT/report.md" || FAILED+=("report")
echo "== bench: results in $OUT (report.md: the markdown for docs/BENCHMARKS.md)"
grep -h '^ratio:' "$OUT"/*.log 2>/dev/null | sed 's/^/   /'
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "bench $PART: FAILED: ${FAILED[*]}"
  exit 1
fi
echo "bench $PART: done"
