"""The repository's experiments/ directory, presented to Hydra as the config group `experiment`.

`+experiment=sweep` looks for `experiment/sweep.yaml` on the search path; the files live in
`experiments/sweep.yaml` at the repository root, beside conf/. A small ConfigSource maps the one onto
the other, and a SearchPathPlugin puts it on the search path of mneme's app (and only of mneme's app:
it checks that the primary config is mneme's conf/). MNEME_EXPERIMENTS may name more directories
(os.pathsep-separated) whose files take precedence, for experiments kept outside the repository.
"""


import os
from pathlib import Path
from typing import List, Optional

from hydra._internal.core_plugins.file_config_source import FileConfigSource
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

from mneme.track import schema

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
EXPERIMENTS_DIR = ROOT / "experiments"
GROUP = "experiment"
SCHEME = "mneme-experiments"

schema.register()


class ExperimentsConfigSource(FileConfigSource):
    """A directory of experiment files that Hydra sees as `experiment/<name>.yaml`."""

    @staticmethod
    def scheme() -> str:
        return SCHEME

    @staticmethod
    def _inner(config_path: str) -> Optional[str]:
        """The path inside the directory, or None for anything outside the `experiment` group."""
        config_path = config_path.strip("/")
        if config_path == GROUP:
            return ""
        if config_path.startswith(GROUP + "/"):
            return config_path[len(GROUP) + 1:]
        return None

    def available(self) -> bool:
        return os.path.isdir(self.path)

    def is_group(self, config_path: str) -> bool:
        if config_path.strip("/") == "":
            return True
        inner = self._inner(config_path)
        return inner is not None and super().is_group(inner)

    def is_config(self, config_path: str) -> bool:
        inner = self._inner(config_path)
        return bool(inner) and super().is_config(inner)

    def load_config(self, config_path: str) -> ConfigResult:
        inner = self._inner(config_path)
        if not inner:
            raise ConfigLoadError(f"Config not found: {config_path} (this source holds only the '{GROUP}' group)")
        return super().load_config(inner)

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        if config_path.strip("/") == "":
            return [GROUP] if results_filter in (None, ObjectType.GROUP) else []
        inner = self._inner(config_path)
        if inner is None or not super().is_group(inner):
            return []
        files: List[str] = []
        for name in os.listdir(os.path.join(self.path, inner)):
            self._list_add_result(files=files, file_path=f"{config_path.strip('/')}/{name}", file_name=name,
                                  results_filter=results_filter)
        return sorted(set(files))


def experiment_dirs() -> List[Path]:
    """Where experiments are looked up, first match wins: MNEME_EXPERIMENTS, then the repository's."""
    extra = [Path(p).resolve() for p in os.environ.get("MNEME_EXPERIMENTS", "").split(os.pathsep) if p.strip()]
    return [*extra, EXPERIMENTS_DIR]


def is_mneme_app(search_path: ConfigSearchPath) -> bool:
    for element in search_path.get_path():
        path = element.path or ""
        if element.provider == "main" and "://" not in path.replace("file://", "", 1):
            if Path(path.replace("file://", "", 1)).resolve() == CONF_DIR:
                return True
    return False


class MnemeSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        if not is_mneme_app(search_path):
            return
        for directory in experiment_dirs():
            search_path.append(provider="mneme-experiments", path=f"{SCHEME}://{directory}")
