"""The bad-input suite: damaged inputs and faults, each refused in one clear line (issue 14).

Every case starts from fresh copies of committed fixtures (migrated to the current schema, with file
hashes, unless it tests schema 1), damages one thing, runs one mneme command and asserts: the documented
exit code (2 unless said), no traceback, the message names the file (or store) at fault, it took at most
10 s, and no file outside the case's target changed. Commands run in-process; only those where LLVM could
abort the process (schema-1 IR) and the Hydra app run in a subprocess.

Classes: truncation, bitflip, types, paths, swapped, targets (unwritable and full: a small tmpfs mounted
here; needs root, as in CI), stores (unreachable tracking and study stores). The suite prints its counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from mnemetest import FIXTURES, MNEME, ROOT
from mneme import cli
from mneme.record.db import RecordedExecution, find_dbs


@dataclass
class Case:
    cls: str
    name: str
    #: (work dir, context) -> (argv, text the message must contain); damages the copy in `work`
    build: Callable[["Work"], Tuple[List[str], str]]
    rc: int = 2
    #: paths (relative to the work dir) the command may change
    targets: Tuple[str, ...] = ()
    subprocess: bool = False
    env: Dict[str, str] = field(default_factory=dict)
    limit: float = 10.0


class Work:
    """A case's directory: fresh copies of the fixtures it asks for."""

    def __init__(self, root: Path, pristine: Path, ctx: dict):
        self.root, self.pristine, self.ctx = root, pristine, ctx

    def rec(self, name: str) -> Path:
        d = self.root / name
        if not d.exists():
            shutil.copytree(self.pristine / name, d)
        return d

    def db(self, name: str = "vecadd", i: int = 0) -> Path:
        return sorted(self.rec(name).glob("*.json"))[i]

    def data(self, name: str = "vecadd", i: int = 0) -> dict:
        return json.loads(self.db(name, i).read_text())

    def write(self, data, name: str = "vecadd", i: int = 0) -> Path:
        p = self.db(name, i)
        p.write_text(data if isinstance(data, str) else json.dumps(data, indent=1))
        return p

    def ir(self, name: str = "vecadd", i: int = 0) -> Path:
        return self.db(name, i).parent / self.data(name, i)["Modules"][0]

    def snap(self, kind: str, name: str = "vecadd", i: int = 0, inst: int = 0) -> Path:
        d = self.data(name, i)
        key = sorted(d["instances"])[inst]
        return self.db(name, i).parent / d["instances"][key][kind]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def truncate(p: Path, at: float) -> Path:
    data = p.read_bytes()
    n = int(len(data) * at) if isinstance(at, float) else (at if at >= 0 else len(data) + at)
    p.write_bytes(data[:n])
    return p


def flip(p: Path, offset: int, bit: int = 0) -> Path:
    data = bytearray(p.read_bytes())
    data[offset % len(data)] ^= 1 << bit
    p.write_bytes(bytes(data))
    return p


def replay(db: Path, *extra: str) -> List[str]:
    return ["replay", "-rdb", str(db), "--compile-only", *extra]


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- the cases ------------------------------------------------------------------------------------------
CASES: List[Case] = []


def case(cls: str, name: str, **kw):
    def deco(fn):
        CASES.append(Case(cls, name, fn, **kw))
        return fn
    return deco


def _add(cls: str, name: str, fn, **kw) -> None:
    CASES.append(Case(cls, name, fn, **kw))


# truncation: every file kind, at several lengths
for at in (0, 0.1, 0.3, 0.5, 0.9, -3):
    _add("truncation", f"db-json@{at}", lambda w, at=at: (replay(truncate(w.db(), at)), w.db().name))
for at in (0, 100, 0.5, -1):
    _add("truncation", f"ir@{at}", lambda w, at=at: (replay(w.db()), truncate(w.ir(), at).name))
for at in (0, 64, 0.5, -1):
    _add("truncation", f"prologue@{at}", lambda w, at=at: (replay(w.db(), "--specialize"), truncate(w.snap("Prologue"), at).name))
for at in (0, 0.5):
    _add("truncation", f"epilogue@{at}", lambda w, at=at: (["copy", str(w.db()), str(w.root / "dest")],
                                                          truncate(w.snap("Epilogue"), at).name), targets=("dest",))

# bit flips at many offsets of each file kind
for off in (0, 3, 17, 100, 777, 1500, 2500, -5):
    _add("bitflip", f"ir@{off}", lambda w, off=off: (replay(w.db()), flip(w.ir(), off).name))
for off in (0, 9, 40, 300, 100_000, -1):
    _add("bitflip", f"prologue@{off}", lambda w, off=off: (replay(w.db(), "--specialize"), flip(w.snap("Prologue"), off).name))
for off in (0, 9, 40, 300, 30_000, -1):
    _add("bitflip", f"epilogue@{off}", lambda w, off=off: (["copy", str(w.db()), str(w.root / "dest")],
                                                          flip(w.snap("Epilogue"), off).name), targets=("dest",))
# schema 1 (no hashes): LLVM must never see damaged bitcode in this process, nor the snapshot reader pass it
for off in (4, 12, 200, 1000, 3000):  # (a flip at 6 or 21 changes no code: same static hash, rightly compiled)
    _add("bitflip", f"v1-ir@{off}", lambda w, off=off: (replay(w.db("vecadd_v1")), flip(w.ir("vecadd_v1"), off).name),
         subprocess=True, limit=30.0)
# flips that make this llvmlite's LLVM abort (assertions in the bitstream and metadata readers, rc -6 in-process)
for off in (701, 2482, 3441):
    _add("bitflip", f"v1-ir-llvm-abort@{off}", lambda w, off=off: (replay(w.db("vecadd_v1")), flip(w.ir("vecadd_v1"), off, 7).name),
         subprocess=True, limit=30.0)
for off in (0, 40, 5000):
    _add("bitflip", f"v1-prologue@{off}", lambda w, off=off: (["copy", str(w.db("vecadd_v1")), str(w.root / "dest")],
                                                            flip(w.snap("Prologue", "vecadd_v1"), off).name),
         targets=("dest",))


# wrong types per field
def _typed(change: Callable[[dict, str], None], field_path: str):
    def build(w: Work):
        d = w.data()
        change(d, sorted(d["instances"])[0])
        return replay(w.write(d)), f"{w.db().name}: {field_path}"
    return build


TYPE_CASES = [
    ("BlockDims.x=256.7", lambda d, k: d["instances"][k]["BlockDims"].update(x=256.7), "instances.{k}.BlockDims.x"),
    ("GridDims=\"64\"", lambda d, k: d["instances"][k].update(GridDims="64"), "instances.{k}.GridDims"),
    ("GridDims.x=\"abc\"", lambda d, k: d["instances"][k]["GridDims"].update(x="abc"), "instances.{k}.GridDims.x"),
    ("SharedMem=null", lambda d, k: d["instances"][k].update(SharedMem=None), "instances.{k}.SharedMem"),
    ("no Prologue", lambda d, k: d["instances"][k].pop("Prologue"), "instances.{k}.Prologue"),
    ("Modules=[\"\"]", lambda d, k: d.update(Modules=[""]), "Modules.0"),
    ("Replayable=\"false\"", lambda d, k: d.update(Replayable="false"), "Replayable"),
    ("VASize=\"4G\"", lambda d, k: d.update(VASize="4G"), "VASize"),
    ("Args=[1,2,3,4]", lambda d, k: d["instances"][k].update(Args=[1, 2, 3, 4]), "instances.{k}.Args.0"),
    ("Occurrences=-1", lambda d, k: d["instances"][k].update(Occurrences=-1), "instances.{k}.Occurrences"),
    ("instances=[]", lambda d, k: d.update(instances=[]), "instances"),
    ("SchemaVersion=\"2\"", lambda d, k: d.update(SchemaVersion="2"), "SchemaVersion"),
    ("ModuleSha256=[\"x\"]", lambda d, k: d.update(ModuleSha256=["x"]), "ModuleSha256.0"),
    ("PrologueSha256=7", lambda d, k: d["instances"][k].update(PrologueSha256=7), "instances.{k}.PrologueSha256"),
    ("InAppTimeNs=NaN", lambda d, k: d["instances"][k].update(InAppTimeNs=float("nan")), "instances.{k}.InAppTimeNs"),
    ("Specializations=[1,0,0,1]", lambda d, k: d.update(Specializations=[1, 0, 0, 1]), "Specializations.0"),
    ("StaticHash=42", lambda d, k: d.update(StaticHash=42), "StaticHash"),
]
for label, change, path in TYPE_CASES:
    def _build(w: Work, change=change, path=path):
        d = w.data()
        k = sorted(d["instances"])[0] if isinstance(d["instances"], dict) else ""
        change(d, k)
        return replay(w.write(d)), f"{w.db().name}: {path.format(k=k)}"
    _add("types", label, _build)
_add("types", "top level [1,2,3]", lambda w: (replay(w.write("[1, 2, 3]")), f"{w.db().name}: (top level)"))


# wrong paths
def _edit(change: Callable[[dict, dict, Work], None], argv=None, names=None):
    def build(w: Work):
        d = w.data()
        inst = d["instances"][sorted(d["instances"])[0]]
        change(d, inst, w)
        db = w.write(d)
        return (argv(w, db) if argv else replay(db, "--specialize")), (names(w) if names else db.name)
    return build


_add("paths", "rdb missing", lambda w: (replay(w.root / "nothere.json"), "nothere.json"))
_add("paths", "rdb is a directory", lambda w: (replay(w.rec("vecadd")), "vecadd is a directory"))
_add("paths", "rdb is the bitcode", lambda w: (replay(w.ir()), w.ir().name))
_add("paths", "rdb is a text file", lambda w: (replay(w.rec("vecadd") / "snapshots"), "snapshots"))
_add("paths", "module outside", _edit(lambda d, i, w: d.update(Modules=["../../../etc/passwd"]), names=lambda w: "outside the DB"))
_add("paths", "module absolute", _edit(lambda d, i, w: d.update(Modules=[str(w.ir())]), names=lambda w: "is absolute"))
_add("paths", "module is a directory", _edit(lambda d, i, w: d.update(Modules=["snapshots"]), names=lambda w: "snapshots"))
_add("paths", "prologue missing", _edit(lambda d, i, w: i.update(Prologue="snapshots/gone.prologue"), names=lambda w: "gone.prologue"))
_add("paths", "epilogue outside", _edit(lambda d, i, w: i.update(Epilogue="../../x.epilogue"), names=lambda w: "outside the DB"))
_add("paths", "prologue is the IR", _edit(lambda d, i, w: i.update(Prologue=d["Modules"][0]), names=lambda w: w.ir().name))
_add("paths", "show missing dir", lambda w: (["show", str(w.root / "nodir")], "nodir"))
_add("paths", "copy onto a file", lambda w: (["copy", str(w.db()), str(w.db())], w.db().name))
_add("paths", "clean missing db", lambda w: (["clean", str(w.root / "gone.json")], "gone.json"))
_add("paths", "unknown -rid", lambda w: (replay(w.db(), "-rid", "0123456789abcdef"), w.db().name))
_add("paths", "show truncated db among good ones", lambda w: (["show", str(w.rec("matmul"))], truncate(w.db("matmul", 1), 0.5).name))


# swapped files
def _swap_contents(a: Path, b: Path) -> None:
    da, db_ = a.read_bytes(), b.read_bytes()
    a.write_bytes(db_)
    b.write_bytes(da)


def _swap_entries(w: Work, name: str, src: int, dst: int, kind: str = "Prologue", both_kinds: bool = False):
    d = w.data(name)
    keys = sorted(d["instances"])
    a, b = d["instances"][keys[dst]], d["instances"][keys[src]]
    a[kind], a[kind + "Sha256"] = b[kind], b[kind + "Sha256"]
    w.write(d, name)
    return keys[dst]


def _pro_epi_entries(w: Work):
    d = w.data()
    i = d["instances"][sorted(d["instances"])[0]]
    i["Prologue"], i["Epilogue"] = i["Epilogue"], i["Prologue"]
    i["PrologueSha256"], i["EpilogueSha256"] = i["EpilogueSha256"], i["PrologueSha256"]
    w.write(d)
    return replay(w.db(), "--specialize"), Path(i["Prologue"]).name


_add("swapped", "prologue<->epilogue files", lambda w: (_swap_contents(w.snap("Prologue"), w.snap("Epilogue")),
                                                        (replay(w.db(), "--specialize"), w.snap("Prologue").name))[1])
_add("swapped", "prologue<->epilogue entries", _pro_epi_entries)
for src, dst in ((1, 0), (2, 1), (0, 2)):
    _add("swapped", f"manylaunch prologue {src}->{dst}",
         lambda w, src=src, dst=dst: (lambda key: (replay(w.db("manylaunch"), "-rid", key, "--specialize"),
                                                  "belongs to another instance"))(_swap_entries(w, "manylaunch", src, dst)))
for a, b in ((0, 1), (1, 2)):
    _add("swapped", f"manylaunch prologue files {a}<->{b}",
         lambda w, a=a, b=b: (_swap_contents(w.snap("Prologue", "manylaunch", inst=a), w.snap("Prologue", "manylaunch", inst=b)),
                              (replay(w.db("manylaunch"), "-rid", sorted(w.data("manylaunch")["instances"])[a], "--specialize"),
                               w.snap("Prologue", "manylaunch", inst=a).name))[1])


def _foreign_ir(w: Work, name: str, i: int, other: str, j: int, update_hash: bool):
    src = w.ir(other, j)
    dst = w.ir(name, i)
    shutil.copyfile(src, dst)
    if update_hash:
        d = w.data(name, i)
        d["ModuleSha256"] = [_sha(dst)]
        w.write(d, name, i)
    return replay(w.db(name, i)), dst.name


for i, j in ((0, 1), (1, 2)):
    _add("swapped", f"matmul IR {j} in db {i}", lambda w, i=i, j=j: _foreign_ir(w, "matmul", i, "matmul", j, False))
    _add("swapped", f"matmul IR {j} in db {i}, hash updated", lambda w, i=i, j=j: _foreign_ir(w, "matmul", i, "matmul", j, True))
_add("swapped", "matmul IR in vecadd, hash updated", lambda w: _foreign_ir(w, "vecadd", 0, "matmul", 0, True))


# unwritable and full targets (tmpfs mounted by the `mounts` fixture)
def _needs(w: Work, key: str) -> Path:
    return Path(w.ctx[key])


_add("targets", "copy to a full disk", lambda w: (["copy", str(w.db()), str(_needs(w, "full") / "dest")], "full"),
     targets=("@full",))
_add("targets", "move to a full disk", lambda w: (["move", str(w.db()), str(_needs(w, "full") / "dest")], "full"),
     targets=("@full",))
_add("targets", "copy manylaunch to a full disk", lambda w: (["copy", str(w.db("manylaunch")), str(_needs(w, "full"))],
                                                             "full"), targets=("@full",))
_add("targets", "--output-ptx on a full disk", lambda w: (replay(w.db(), "--output-ptx", str(_needs(w, "full") / "k.ptx")),
                                                          "k.ptx"), targets=("@full",))
_add("targets", "--json on a full disk", lambda w: (replay(w.db(), "--json", str(_needs(w, "full") / "r.json")), "r.json"),
     targets=("@full",))
_add("targets", "tune -o on a full disk", lambda w: (["tune", "-rdb", str(w.db()), "--devices", "none", "--objective", "registers", "--trials", "1",
                                                      "--no-track", "-o", str(_needs(w, "full") / "out")], "out"),
     targets=("@full",))
_add("targets", "copy to a read-only disk", lambda w: (["copy", str(w.db()), str(_needs(w, "ro") / "dest")], "ro"),
     targets=("@ro",))
_add("targets", "move from a read-only disk", lambda w: (["move", str(_needs(w, "ro_db")), str(w.root / "dest")],
                                                         "not writable"), targets=("dest",))
_add("targets", "clean on a read-only disk", lambda w: (["clean", str(_needs(w, "ro_db"))], _needs(w, "ro_db").name))
_add("targets", "--output-ptx on a read-only disk", lambda w: (replay(w.db(), "--output-ptx", str(_needs(w, "ro") / "k.ptx")),
                                                               "k.ptx"))
_add("targets", "--json on a read-only disk", lambda w: (replay(w.db(), "--json", str(_needs(w, "ro") / "r.json")), "r.json"))
_add("targets", "tune --storage journal on a read-only disk",
     lambda w: (["tune", "-rdb", str(w.db()), "--devices", "none", "--objective", "registers", "--trials", "1", "--no-track", "-o", str(w.root / "out"),
                 "--storage", f"journal:{_needs(w, 'ro') / 'j.log'}"], "j.log"), targets=("out",))
_add("targets", "tune -o on a read-only disk", lambda w: (["tune", "-rdb", str(w.db()), "--devices", "none", "--objective", "registers", "--trials", "1",
                                                          "--no-track", "-o", str(_needs(w, "ro") / "out")], "study.journal"))
_add("targets", "move a DB on a read-only disk to a full one", lambda w: (["move", str(_needs(w, "ro_db")),
                                                                          str(_needs(w, "full") / "d")], "ro"),
     targets=("@full",))


# unreachable stores
def _compare(uri: str) -> List[str]:
    return ["compare", "--tracking-uri", uri]


_add("stores", "http closed port", lambda w: (_compare(f"http://127.0.0.1:{closed_port()}"), "127.0.0.1"))
_add("stores", "https closed port", lambda w: (_compare(f"https://127.0.0.1:{closed_port()}"), "127.0.0.1"))
_add("stores", "http server that never answers", lambda w: (_compare(f"http://127.0.0.1:{w.ctx['silent_port']}"), "unreachable"))
_add("stores", "ipv6 closed port", lambda w: (_compare(f"http://[::1]:{closed_port()}"), "[::1]"))
_add("stores", "sqlite store missing", lambda w: (_compare(f"sqlite:///{w.root}/none/mlflow.db"), "mlflow.db"))
_add("stores", "sqlite store not a database", lambda w: ((w.root / "bad.db").write_bytes(b"not sqlite" * 100),
                                                         (_compare(f"sqlite:///{w.root}/bad.db"), "bad.db"))[1])
_add("stores", "file store missing", lambda w: (_compare(f"file://{w.root}/mlruns"), "mlruns"))
_add("stores", "MLFLOW_TRACKING_URI closed", lambda w: (["compare"], "127.0.0.1"),
     env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
_add("stores", "replay --track, server closed", lambda w: (replay(w.db(), "--track"), "127.0.0.1"),
     env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
_add("stores", "tune --storage postgresql closed",
     lambda w: (["tune", "-rdb", str(w.db()), "--devices", "none", "--objective", "registers", "--trials", "1", "--no-track", "-o", str(w.root / "out"),
                 "--storage", f"postgresql://u@127.0.0.1:{closed_port()}/db"], "postgresql"), targets=("out",))
_add("stores", "tune --storage sqlite on a missing drive",
     lambda w: (["tune", "-rdb", str(w.db()), "--devices", "none", "--objective", "registers", "--trials", "1", "--no-track", "-o", str(w.root / "out"),
                 "--storage", "sqlite:////proc/mneme/study.db"], "/proc/mneme/study.db"), targets=("out",))
_add("stores", "Hydra app, tracking server closed",
     lambda w: (["-m", "mneme", "+experiment=compile_only", f"record.db={w.db()}", "tracking.uri=http://127.0.0.1:9",
                 f"hydra.run.dir={w.root / 'hydra'}"], "127.0.0.1"),
     subprocess=True, limit=40.0, targets=("hydra",))


# -- running them -----------------------------------------------------------------------------------------
def tree(root: Path, skip: List[Path]) -> Dict[str, str]:
    out = {}
    for dirpath, dirnames, files in os.walk(root):
        d = Path(dirpath)
        if any(d == s or s in d.parents for s in skip):
            dirnames[:] = []
            continue
        for f in files:
            p = d / f
            if any(p == s or s in p.parents for s in skip):
                continue
            try:
                out[str(p)] = _sha(p)
            except OSError:
                out[str(p)] = "unreadable"
        for dn in list(dirnames):
            if not any(d / dn == s or s in (d / dn).parents for s in skip):
                out[str(d / dn) + "/"] = "dir"
    return out


def run_case(c: Case, argv: List[str]) -> Tuple[int, str]:
    env = dict(os.environ, **c.env)
    if c.subprocess:
        cmd = [sys.executable, *argv] if argv[0] == "-m" else [*MNEME, *argv]
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=c.limit + 30, cwd=ROOT)
        return p.returncode, p.stdout + p.stderr
    out, err = io.StringIO(), io.StringIO()
    old = dict(os.environ)
    os.environ.update(c.env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(old)
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """The fixtures as this mneme writes them (schema 2, hashes), and vecadd as committed (schema 1)."""
    root = tmp_path_factory.mktemp("pristine")
    for name in ("vecadd", "manylaunch", "matmul"):
        shutil.copytree(FIXTURES / name, root / name)
        for f in find_dbs(str(root / name)):
            RecordedExecution.from_json(f).to_json()
    shutil.copytree(FIXTURES / "vecadd", root / "vecadd_v1")
    return root


def _mount(path: Path, opts: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, pristine):
    """Shared faults: a full and a read-only tmpfs (root only) and a TCP server that never answers."""
    root = tmp_path_factory.mktemp("faults")
    out: dict = {}
    mounted: List[Path] = []
    silent = socket.socket()
    try:
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            _make_mounts(root, pristine, out, mounted)
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts connections (the kernel does), never answers
        out["silent_port"] = silent.getsockname()[1]
        yield out
    finally:
        silent.close()
        for m in mounted:
            subprocess.run(["umount", "-l", str(m)], capture_output=True)


def _make_mounts(root: Path, pristine: Path, out: dict, mounted: List[Path]) -> None:
    full, ro = root / "full", root / "ro"
    if _mount(full, "size=128k"):
        mounted.append(full)
        fd = os.open(full / "filler", os.O_WRONLY | os.O_CREAT)
        try:  # fill it to the last block
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        out["full"] = str(full)
    if _mount(ro, "size=1m"):
        mounted.append(ro)
        shutil.copytree(pristine / "vecadd", ro / "vecadd")
        if subprocess.run(["mount", "-o", "remount,ro", str(ro)], capture_output=True).returncode == 0:
            out["ro"] = str(ro)
            out["ro_db"] = find_dbs(str(ro / "vecadd"))[0]


@pytest.mark.parametrize("c", CASES, ids=[f"{c.cls}:{c.name}" for c in CASES])
def test_bad_input_is_refused_in_one_clear_line(c: Case, pristine, ctx, tmp_path):
    if c.cls == "targets" and not {"full", "ro"} <= set(ctx):
        pytest.skip("unwritable and full targets need a tmpfs mounted here, which needs root (CI runs as root)")
    w = Work(tmp_path / "work", pristine, ctx)
    w.root.mkdir()
    argv, names = c.build(w)
    skip = [w.root / t for t in c.targets if not t.startswith("@")]
    watched = [w.root]
    for t in c.targets:
        if t.startswith("@"):
            skip.append(Path(ctx[t[1:]]))
    for key in ("full", "ro"):
        if key in ctx and not any(Path(ctx[key]) == s for s in skip):
            watched.append(Path(ctx[key]))
    before = {k: v for r in watched for k, v in tree(r, skip).items()}
    t0 = time.monotonic()
    rc, text = run_case(c, [str(a) for a in argv])
    took = time.monotonic() - t0
    after = {k: v for r in watched for k, v in tree(r, skip).items()}
    assert rc == c.rc, f"exit {rc}, expected {c.rc}:\n{text}"
    assert "Traceback" not in text, text
    assert names in text, f"the message does not name {names!r}:\n{text}"
    assert took <= c.limit, f"took {took:.1f} s (limit {c.limit} s):\n{text}"
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"files outside the target changed: {changed}"
    if c.targets and c.targets[0].startswith("@"):  # a full or read-only target keeps nothing of a failed write
        tgt = Path(ctx[c.targets[0][1:]])
        assert sorted(p.name for p in tgt.iterdir()) in (["filler"], ["vecadd"], []), sorted(tgt.iterdir())


def test_the_suite_counts_its_cases(capsys):
    per = Counter(c.cls for c in CASES)
    with capsys.disabled():
        print(f"\nbad-input suite: {len(CASES)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(per.items())))
    assert len(CASES) >= 100
    assert min(per.values()) >= 10 and len(per) == 7, per
