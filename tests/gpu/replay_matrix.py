"""Replays every instance of the record DBs given on the command line under a set of configurations,
in this one process, and prints one JSON line per experiment. The GPU replay tests run it in a
subprocess so that a fault in one example cannot take the test session down."""

import json
import sys
from dataclasses import replace

from mneme.config import MeasurementSettings
from mneme.record.db import RecordedExecution
from mneme.replay.pipeline import ReplayPipeline


def variants(base):
    threads = base.block.total()
    yield "O3", base
    yield "O0", replace(base, passes="default<O0>")
    yield "O3+specialize", replace(base, specialize=True)
    yield "O0+specialize", replace(base, passes="default<O0>", specialize=True)
    yield "O3+dims", replace(base, specialize_dims=True)
    yield "O3+bounds", replace(base, set_launch_bounds=True, max_threads=threads, min_blocks_per_sm=1)
    yield "O3+all", replace(base, specialize=True, specialize_dims=True, set_launch_bounds=True,
                            max_threads=threads, min_blocks_per_sm=2)


def main(mode, *dbs):
    settings = MeasurementSettings(iterations=5 if mode == "matrix" else 20, warmup=2, timeout=30)
    for db in dbs:
        rec = RecordedExecution.from_json(db)
        for rid in rec:
            with ReplayPipeline(db, rid, device_id=0, settings=settings) as pipe:
                base = pipe.baseline_config()
                todo = list(variants(base)) if mode == "matrix" else [("O3", base)]
                if mode == "repeat":  # one module, four replays: the baseline, a launch-space shape, both again
                    half = replace(base, block=replace(base.block, x=max(32, base.block.x // 2)),
                                   grid=replace(base.grid, x=base.grid.x * (base.block.x // max(32, base.block.x // 2))))
                    todo = [("O3", base), ("O3-half-block", half), ("O3-again", base), ("O3-half-block-again", half)]
                if mode == "override":
                    # half the grid computes half the output: must not verify, and must not leak
                    bad = replace(base, grid=replace(base.grid, x=max(1, base.grid.x // 2)))
                    todo = [("half-grid", bad), ("O3-after", base)]
                for name, cfg in todo:
                    r = pipe.execute(cfg)
                    print(json.dumps({"db": db, "rid": rid, "kernel": rec.demangled_name, "variant": name,
                                      "status": r.status, "verified": r.verified, "error": r.error[:500],
                                      "median_ns": r.median_ns(), "in_app_ns": pipe.instance.in_app_time_ns,
                                      "fidelity": r.fidelity, "regs": r.reg_usage}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
