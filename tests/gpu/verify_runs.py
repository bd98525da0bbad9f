"""Replays the record DBs given on the command line with calibrated verification (docs/VERIFY.md)
under the recorded configuration, O0, and a deliberately wrong one (half the block, same grid: a
kernel without a grid-stride loop then leaves part of its output unwritten), then the recorded one
again; prints one JSON line per experiment. Run in a subprocess by test_verify_gpu.py.

    python verify_runs.py RUNS DB...
"""

import json
import sys
from dataclasses import replace

from mneme.config import MeasurementSettings
from mneme.record.db import RecordedExecution
from mneme.replay.pipeline import ReplayPipeline


def main(runs, *dbs):
    settings = MeasurementSettings(iterations=3, warmup=1, timeout=30, verify_runs=int(runs))
    for db in dbs:
        rec = RecordedExecution.from_json(db)
        for rid in rec:
            with ReplayPipeline(db, rid, device_id=0, settings=settings) as pipe:
                base = pipe.baseline_config()
                half = replace(base, block=replace(base.block, x=max(1, base.block.x // 2)))
                for name, cfg in (("O3", base), ("O0", replace(base, passes="default<O0>")),
                                  ("half-block", half), ("O3-after", base)):
                    r = pipe.execute(cfg)
                    print(json.dumps({"db": db, "kernel": rec.demangled_name, "variant": name, "status": r.status,
                                      "verified": r.verified, "error": r.error, "verification": r.verification,
                                      "max_abs_err": r.max_abs_err, "max_rel_err": r.max_rel_err}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
