"""MLflow tracking of replays and sweeps, the Hydra app behind `python -m mneme`, and `mneme compare`.

Importing this package is cheap; MLflow, Hydra and matplotlib load only where they are used.
"""


def log_replay(*args, **kwargs):
    """See mneme.track.replay.log_replay (`mneme replay --track`)."""
    from mneme.track.replay import log_replay as _log_replay

    return _log_replay(*args, **kwargs)
