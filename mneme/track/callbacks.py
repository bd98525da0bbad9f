"""Hydra callback that ends the invocation's MLflow session (see session.py), with the right status."""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback

from mneme.track import session
from mneme.track.records import FAILED, FINISHED


class TrackingCallback(Callback):
    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        job_return = kwargs.get("job_return")
        ok = job_return is None or getattr(job_return.status, "name", "") == "COMPLETED"
        session.close(FINISHED if ok else FAILED)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        session.close(FINISHED)
