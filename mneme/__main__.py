"""`python -m mneme +experiment=NAME [--multirun] [key=value ...]`: mneme's Hydra app.

The experiments live in experiments/ (sweep, baseline, pipeline_search, launch_search, compile_only,
record), the config groups in conf/. Every job is one experiment and one MLflow run; a multirun adds one
parent run. See docs/EXPERIMENTS.md.
"""

from __future__ import annotations

import sys
from typing import List

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def _app(cfg: DictConfig):
    from mneme.track.app import run

    return run(cfg)


def _multirun_first(argv: List[str]) -> List[str]:
    """`python -m mneme +experiment=sweep --multirun k=v` as well as `--multirun +experiment=sweep k=v`
    (Hydra's parser takes its flags only before the overrides)."""
    flags = [a for a in argv if a in ("-m", "--multirun")]
    return flags + [a for a in argv if a not in flags]


def main() -> None:
    from mneme.track import session
    from mneme.track.records import FAILED, FINISHED, KILLED

    sys.argv[1:] = _multirun_first(sys.argv[1:])
    try:
        _app()
    except SystemExit as e:
        failed = e.code not in (0, None)
        session.close(FAILED if failed else FINISHED)
        if failed:
            from mneme.track.schema import explain_overrides

            for line in explain_overrides([a for a in sys.argv[1:] if not a.startswith("-")]):
                print(f"mneme: {line}", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        session.close(KILLED)
        print("mneme: interrupted", file=sys.stderr)
        sys.exit(130)
    session.close(FINISHED)


if __name__ == "__main__":
    main()
