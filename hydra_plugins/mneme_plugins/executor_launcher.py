"""A Hydra launcher that runs a batch of jobs on the AsyncReplayExecutor's workers.

Every job of the batch is composed first and its replay configuration submitted to the executor (one
per recorded kernel and measurement settings, kept across batches): compilation runs in the compile
pool, timed runs go to one worker per GPU. Then each job runs through Hydra's `run_job` as usual (its
own directory, config files, callbacks, return value), picking up its result instead of replaying the
kernel itself. Jobs that are not replays (`mode=record`) run as the basic launcher would run them.
"""


import atexit
import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from mneme.errors import MnemeError

log = logging.getLogger(__name__)


@dataclass
class ExecutorLauncherConf:
    _target_: str = "hydra_plugins.mneme_plugins.executor_launcher.ExecutorLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="mneme_executor", node=ExecutorLauncherConf, provider="mneme")


class ExecutorLauncher(Launcher):
    def __init__(self) -> None:
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None
        self._executors: Dict[str, Tuple[Any, str]] = {}

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    # -- executors -----------------------------------------------------------------------------------
    def executor_for(self, cfg: DictConfig, target: Any, settings: Any) -> Tuple[Any, str]:
        """The executor for this job's kernel and settings (and its compile cache directory)."""
        from mneme.track import app
        from mneme.tune.executor import AsyncReplayExecutor

        ex_cfg = cfg.executor
        devices = [] if app.compile_only(cfg) else OmegaConf.to_container(ex_cfg.devices) if ex_cfg.devices is not None else None
        key = json.dumps([target.db, target.instance.dynamic_hash, settings.to_dict(), devices, ex_cfg.compile_jobs,
                          ex_cfg.compile_timeout, ex_cfg.run_timeout, ex_cfg.cache_dir, ex_cfg.backend],
                         sort_keys=True, default=str)
        if key not in self._executors:
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            cache_dir = str(ex_cfg.cache_dir or sweep_dir / "cache")
            executor = AsyncReplayExecutor(
                target.db, target.instance.dynamic_hash, devices=devices, compile_jobs=ex_cfg.compile_jobs,
                settings=settings, cache_dir=cache_dir, log_dir=str(sweep_dir / "logs"),
                compile_timeout=float(ex_cfg.compile_timeout), run_timeout=ex_cfg.run_timeout, backend=ex_cfg.backend,
            )
            if not self._executors:
                atexit.register(self.shutdown)
            self._executors[key] = (executor, cache_dir)
            log.info(f"executor for {target.kernel}: devices={devices if devices is not None else 'all visible'}, "
                     f"compile jobs={executor.compile_jobs}, logs in {sweep_dir / 'logs'}")
        return self._executors[key]

    def shutdown(self, cancel: bool = False) -> None:
        """Stop every executor (the sweeper calls this when the sweep ends; atexit otherwise)."""
        executors, self._executors = self._executors, {}
        for executor, _ in executors.values():
            executor.shutdown(wait=not cancel, cancel_futures=cancel)
        atexit.unregister(self.shutdown)

    def parallelism(self) -> int:
        """How many jobs keep the executors busy (the sweeper's default batch size)."""
        import os

        busy = [ex.compile_jobs + 2 * len(ex.devices) for ex, _ in self._executors.values()]
        return max(busy + [4, os.cpu_count() or 1])

    # -- launching -----------------------------------------------------------------------------------
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from mneme.track import app, session

        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        sess = session.get(self.config.tracking, self.config.name, multirun=True).start()
        jobs: List[Tuple[int, Sequence[str], DictConfig]] = []
        for i, overrides in enumerate(job_overrides):
            idx = initial_job_idx + i
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.id = idx
                cfg.hydra.job.num = idx
            jobs.append((idx, overrides, cfg))
        sess.open()  # the store is checked before any executor (and so any GPU) starts
        futures: Dict[int, Tuple[Any, str]] = {}
        try:
            for idx, _, cfg in jobs:
                if cfg.mode not in ("replay", "compile_only"):
                    continue
                try:
                    target, config, settings = app.experiment(cfg)
                except MnemeError:
                    continue  # the job itself reports it, with Hydra's usual error handling
                executor, cache_dir = self.executor_for(cfg, target, settings)
                futures[idx] = (executor.submit(config), cache_dir)
            # one progress line instead of a line of overrides per job: each job's full overrides are in its
            # directory (.hydra/overrides.yaml) and in its log (mneme.log there)
            from tqdm import tqdm

            runs = []
            bar = tqdm(total=len(jobs), desc=f"jobs {jobs[0][0]}-{jobs[-1][0]}" if jobs else "jobs", unit="job",
                       dynamic_ncols=True, leave=False, disable=None)
            try:
                for idx, overrides, cfg in jobs:
                    log.debug(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
                    ready = futures.get(idx)
                    with app.prepared(idx, *ready) if ready else contextlib.nullcontext():
                        ret = run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                                      job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
                    runs.append(ret)
                    configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
                    bar.update(1)
                    line = getattr(ret, "_return_value", None)
                    if isinstance(line, dict) and line.get("line"):
                        bar.set_postfix_str(line["line"][:90], refresh=False)
            finally:
                bar.close()
            return runs
        except BaseException:
            self.shutdown(cancel=True)
            raise
