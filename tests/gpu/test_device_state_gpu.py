"""Device-side state and launches on the H200 (issue 15 item 6): a parent kernel that launches child grids
from device code replays with its children (cudadevrt linked in replay) and a wrong grid still fails; kernels
that allocate from the device heap are named, run once in the app (no timing reruns), the heap limit is
recorded, and a replay of a kernel that reads heap objects says which kernels allocated them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import List

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
BIN = HERE.parents[1] / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]


@dataclass
class Rec:
    dir: Path
    returncode: int
    stdout: str
    stderr: str

    def dbs(self) -> List[Path]:
        from mneme.record.db import find_dbs

        return [Path(p) for p in find_dbs(str(self.dir))]

    def db(self, kernel: str) -> Path:
        for p in self.dbs():
            if json.loads(p.read_text()).get("DemangledName", "").startswith(kernel):
                return p
        raise AssertionError(f"no recorded kernel {kernel} in {self.dir}:\n{self.stdout}\n{self.stderr}")


def record(app: str, root: Path) -> Rec:
    if not (BIN / app).is_file():
        pytest.fail(f"{BIN / app} is missing: build the examples with `make gpu-bundle` and carry examples/bin")
    p = subprocess.run([*MNEME, "record", "-rdb", str(root / app), "--", str(BIN / app)],
                       capture_output=True, text=True, timeout=600)
    return Rec(root / app, p.returncode, p.stdout, p.stderr)


def run_app(app: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / app)], capture_output=True, text=True, timeout=300)


def rows_of(mode: str, db: Path) -> List[dict]:
    p = subprocess.run([sys.executable, str(HERE / "replay_matrix.py"), mode, str(db)],
                       capture_output=True, text=True, timeout=600)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert rows, f"replay_matrix printed nothing (exit {p.returncode})\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return rows


def checksum(text: str) -> str:
    return next(w for w in text.split() if w.startswith("checksum="))


@pytest.fixture(scope="module")
def dynpar(tmp_path_factory):
    return record("dynpar", tmp_path_factory.mktemp("rec-dynpar"))


@pytest.fixture(scope="module")
def devheap(tmp_path_factory):
    return record("devheap", tmp_path_factory.mktemp("rec-devheap"))


def doc(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def test_dynamic_parallelism_records_the_parent_with_its_limits(dynpar):
    assert dynpar.returncode == 0, dynpar.stdout + dynpar.stderr
    assert checksum(dynpar.stdout) == checksum(run_app("dynpar").stdout), "the recorder changed the app's result"
    parent = doc(dynpar.db("launchRows"))
    assert parent["Replayable"] and parent["DeviceState"] == ["launch"]
    (attrs,) = parent["InstanceAttributes"].values()
    assert attrs["ContextLimits"]["dev_runtime_pending_launch_count"] == 256 + 64  # the app's cudaDeviceSetLimit
    names = [doc(p)["DemangledName"] for p in dynpar.dbs()]
    assert not [n for n in names if n.startswith("scaleRow")], "device-side launches are not host launches"


def test_the_parent_replays_with_its_child_launches_and_a_half_grid_fails(dynpar):
    rows = rows_of("matrix", dynpar.db("launchRows"))
    bad = [r for r in rows if not r["verified"]]
    assert not bad, "\n".join(f"{r['variant']}: {r['status']} {r['error']}" for r in bad)
    by = {r["variant"]: r for r in rows_of("override", dynpar.db("launchRows"))}
    # half the parent's grid launches half the rows' children: the other rows stay as the prologue had them
    assert by["half-grid"]["status"] == "failed_verification", by["half-grid"]
    assert by["O3-after"]["verified"], by["O3-after"]


def test_heap_kernels_are_named_run_once_and_the_heap_limit_is_recorded(devheap):
    assert devheap.returncode == 0, devheap.stdout + devheap.stderr
    assert checksum(devheap.stdout) == checksum(run_app("devheap").stdout)
    out = devheap.stdout + devheap.stderr
    assert "heapFill" in out and "device heap" in out, out
    fill, total = doc(devheap.db("heapFill")), doc(devheap.db("heapSum"))
    assert fill["DeviceState"] == ["heap"] and total["DeviceState"] == []
    (inst,) = fill["instances"].values()
    # a kernel that mallocs must not be rerun for timing (it would allocate again)
    assert len(inst.get("InAppTimesNs", [])) <= 1, inst
    (inst,) = total["instances"].values()
    # nor any kernel after it: heapSum reads (another kernel might write) objects no snapshot holds, so a
    # rerun could change what the app computes next (newdelete's containerFill pushed again under reruns)
    assert len(inst.get("InAppTimesNs", [])) <= 1, inst
    (attrs,) = fill["InstanceAttributes"].values()
    assert attrs["ContextLimits"]["malloc_heap_size"] == 128 * 1024 * 4 * 2 + (16 << 20)


def test_a_reader_of_heap_objects_fails_and_names_the_allocating_kernel(devheap):
    (row,) = rows_of("fidelity", devheap.db("heapSum"))
    assert not row["verified"], row
    assert "heapFill" in row["error"] and "device heap" in row["error"], row["error"]
    (row,) = rows_of("fidelity", devheap.db("heapFill"))
    assert not row["verified"] and "allocates from the device heap" in row["error"], row


@pytest.fixture(scope="module")
def devfnptr(tmp_path_factory):
    return record("devfnptr", tmp_path_factory.mktemp("rec-devfnptr"))


def test_function_pointers_from_variables_replay_relocated_in_every_module(devfnptr):
    """applyFn calls the pointer the host read from `d_twice` (cudaMemcpyFromSymbol) and passed as an argument;
    applyTable calls an entry of `d_table`; applyVirtual a virtual function through its class's vtable. All hold
    the app module's code addresses: replay pairs them with its own module's (mneme.replay.codemap), for each
    compiled variant, and a wrong grid still fails."""
    assert devfnptr.returncode == 0, devfnptr.stdout + devfnptr.stderr
    assert checksum(devfnptr.stdout) == checksum(run_app("devfnptr").stdout)
    fn = doc(devfnptr.db("applyFn"))
    assert fn["Replayable"], fn["NotReplayableReason"]
    assert fn["FunctionPointerParams"] == [1]
    table = doc(devfnptr.db("applyTable"))
    assert table["Replayable"] and "fnptr" in table["DeviceState"]
    virt = doc(devfnptr.db("applyVirtual"))  # its object's vtable is a variable holding the app's code addresses
    assert virt["Replayable"] and "fnptr" in virt["DeviceState"]
    for db in (devfnptr.db("applyFn"), devfnptr.db("applyTable"), devfnptr.db("applyVirtual")):
        rows = rows_of("matrix", db)
        bad = [r for r in rows if not r["verified"]]
        assert not bad, "\n".join(f"{r['kernel']} {r['variant']}: {r['status']} {r['error']}" for r in bad)
        by = {r["variant"]: r for r in rows_of("override", db)}
        assert by["half-grid"]["status"] == "failed_verification", by["half-grid"]
        assert by["O3-after"]["verified"], by["O3-after"]
