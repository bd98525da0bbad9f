"""A real replay backend whose worker on GPU 1 (pinned: CUDA_VISIBLE_DEVICES=1) dies once, for the multi-GPU crash test (imported by workers)."""

from __future__ import annotations

import os

from mneme.tune.worker import ReplayBackend


class CrashOnGpuOneBackend(ReplayBackend):
    """Replays for real; the first 64-thread block that reaches GPU 1 kills its worker process (once per test:
    the file named by MNEME_TEST_CRASH_MARK records that the crash happened)."""

    def run(self, compiled, config):
        mark = os.environ["MNEME_TEST_CRASH_MARK"]
        if os.environ.get("CUDA_VISIBLE_DEVICES") == "1" and config.block.x == 64 and not os.path.exists(mark):
            open(mark, "w").close()
            os._exit(3)
        return super().run(compiled, config)
