#!/usr/bin/env bash
# The main job as a new user runs it (the main-job issue): a new copy of the tree outside this one, then
# `bash scripts/demo.sh` there (what `make demo` runs after its setup step), all paths relative.
# Usage: bash scripts/mainjob.sh LOGDIR   -> LOGDIR/mainjob.log; exit status of the demo
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-$PWD/.gpu}
mkdir -p "$LOG"
work=$(mktemp -d /tmp/mneme-mainjob.XXXXXX)
# tracked and untracked-not-ignored files, plus what the GPU machine was prepared with (docs/GPU.md)
{ git ls-files -co --exclude-standard 2>/dev/null || find . -path ./.git -prune -o -type f -print; } |
  tar -cf - -T - .bundle examples/bin 2>/dev/null | tar -xf - -C "$work"
rm -rf "$work/demo" "$work/mneme/lib/librecord.so" "$work"/mneme/_native*.so
( cd "$work" && unset PYTHONPATH MLFLOW_TRACKING_URI && timeout "${MAINJOB_TIMEOUT:-300}" bash scripts/demo.sh ) \
  >"$LOG/mainjob.log" 2>&1
rc=$?
echo "main job (scripts/demo.sh in $work, relative paths) exited $rc; last lines:"
tail -n 6 "$LOG/mainjob.log"
exit $rc
