"""The corpus's programs as apps.tsv describes them (../shared/corpus/README.md): name, folder, build
command with $NVCC/$CUDA_ARCH placeholders, binary, arguments, success check, features, notes."""

from __future__ import annotations

import csv
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus"
COLUMNS = ("name", "path", "build", "binary", "args", "success", "features", "notes")
EXIT0 = "exit0"


class CorpusError(Exception):
    """A corpus or selection problem, with the file and the fix in the message."""


@dataclass
class App:
    name: str
    path: str
    build: str
    binary: str
    args: str = ""
    success: str = EXIT0
    features: List[str] = field(default_factory=list)
    notes: str = ""

    @property
    def argv(self) -> List[str]:
        return shlex.split(self.args)

    @property
    def uses_cmake(self) -> bool:
        return "cmake" in self.features or self.build.lstrip().startswith("cmake")

    def build_script(self, nvcc: str, arch: str) -> str:
        """The build column run by bash with only the compiler and the architecture set, as plain (not
        exported) shell variables: the shell expands $NVCC and $CUDA_ARCH exactly as the corpus wrote it."""
        return f"NVCC={shlex.quote(nvcc)}; CUDA_ARCH={shlex.quote(arch)}; {self.build}"

    def success_ok(self, returncode: Optional[int], output: str) -> bool:
        """The corpus's success check: exit 0, and the regex (if any) found in stdout+stderr."""
        if returncode != 0:
            return False
        if self.success == EXIT0:
            return True
        return re.search(self.success, output) is not None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "App":
        return cls(**{k: d[k] for k in COLUMNS if k in d})


def load(corpus: Path = DEFAULT_CORPUS) -> List[App]:
    """Every program of `corpus`/apps.tsv, in file order."""
    tsv = Path(corpus) / "apps.tsv"
    if not tsv.is_file():
        raise CorpusError(f"{tsv}: no such file; pass the corpus folder with --corpus DIR "
                          f"(default {DEFAULT_CORPUS}, beside the checkout)")
    apps = []
    with tsv.open(newline="") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = [c for c in COLUMNS[:6] if c not in (rows.fieldnames or [])]
        if missing:
            raise CorpusError(f"{tsv}: header lacks column(s) {', '.join(missing)}")
        for i, row in enumerate(rows, start=2):
            if not (row.get("name") or "").strip():
                continue
            try:
                re.compile(row["success"] or EXIT0)
            except re.error as e:
                raise CorpusError(f"{tsv}:{i}: success pattern of {row['name']} does not compile: {e}") from e
            apps.append(App(name=row["name"].strip(), path=row["path"].strip(), build=row["build"].strip(),
                            binary=row["binary"].strip(), args=(row.get("args") or "").strip(),
                            success=(row.get("success") or EXIT0).strip() or EXIT0,
                            features=[x for x in (row.get("features") or "").split(",") if x],
                            notes=(row.get("notes") or "").strip()))
    return apps


def parse_names(spec: Optional[str]) -> Optional[List[str]]:
    """`--apps A,B` -> ['A', 'B']; None or '' or 'all' -> None (every app)."""
    if spec is None or spec.strip() in ("", "all"):
        return None
    return [s.strip() for s in spec.split(",") if s.strip()]


def select(apps: Sequence[App], names: Optional[Iterable[str]]) -> List[App]:
    """The apps named (in corpus order), all when `names` is None; an unknown name is an error."""
    if names is None:
        return list(apps)
    wanted = list(names)
    known = {a.name for a in apps}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise CorpusError(f"unknown app(s) {', '.join(unknown)}; apps.tsv has: {', '.join(a.name for a in apps)}")
    return [a for a in apps if a.name in set(wanted)]
