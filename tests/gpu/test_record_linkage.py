"""An app linked with the static CUDA runtime (nvcc's and CMake's default) records exactly as the same
app linked with the shared one: librecord interposes on the driver (native/interpose), which both
runtimes reach through dlsym("cuGetProcAddress_v2"). examples/Makefile builds <name>_static for the
apps below; the shared builds are recorded by tests/gpu/conftest.py (small_recordings)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
BIN = HERE.parents[1] / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]
#: examples/Makefile's STATIC list
LINKED = ["vecadd", "ptrglobal", "pinned", "manylaunch", "launchex"]


def checksum(text: str) -> str:
    m = re.search(r"checksum=(\S+)", text)
    assert m, f"no checksum in:\n{text}"
    return m.group(1)


@pytest.fixture(scope="session")
def static_recordings(tmp_path_factory) -> Dict[str, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("rec-static")
    out = {}
    for name in LINKED:
        exe = BIN / f"{name}_static"
        if not exe.exists():
            pytest.fail(f"{exe} is missing: build the examples here with `make gpu-bundle` and carry examples/bin")
        p = subprocess.run([*MNEME, "record", "-rdb", str(root / name), "--", str(exe)], capture_output=True,
                           text=True, timeout=300)
        p.db_dir = root / name
        out[name] = p
    return out


def dbs(d: Path):
    from mneme.record.db import RecordedExecution, find_dbs

    return {RecordedExecution.from_json(p).demangled_name.split("(")[0]: RecordedExecution.from_json(p)
            for p in find_dbs(str(d))}


def test_the_static_builds_carry_the_runtime_inside():
    for name in LINKED:
        out = subprocess.run(["nm", "-D", "--undefined-only", str(BIN / f"{name}_static")], capture_output=True,
                             text=True).stdout
        assert "cudaMalloc" not in out and "dlsym" in out, name


@pytest.mark.parametrize("name", LINKED)
def test_a_static_runtime_app_records_like_its_shared_twin(static_recordings, small_recordings, name):
    st, sh = static_recordings[name], small_recordings[name]
    assert st.returncode == 0, st.stdout + st.stderr
    plain = subprocess.run([str(BIN / f"{name}_static")], capture_output=True, text=True, timeout=120)
    assert checksum(st.stdout) == checksum(plain.stdout) == checksum(sh.stdout)
    a, b = dbs(st.db_dir), dbs(sh.dir)
    assert sorted(a) == sorted(b) and a, (st.stdout, sh.stdout)
    for kernel in a:
        x, y = a[kernel], b[kernel]
        assert x.replayable and x.complete, (kernel, x.not_replayable_reason)
        assert x.static_hash == y.static_hash, "the same IR"
        assert sorted(x) == sorted(y), "the same instances (dynamic hashes)"
        assert sorted(i.occ for i in x.values()) == sorted(i.occ for i in y.values())
        assert x.provenance["runtime"] >= 13000 and x.provenance["sm"] == "sm_90"


@pytest.mark.parametrize("name", LINKED)
def test_both_linkages_place_the_apps_buffers_at_the_same_addresses(static_recordings, small_recordings, name):
    a, b = dbs(static_recordings[name].db_dir), dbs(small_recordings[name].dir)
    for kernel in a:
        args = {dh: inst.args for dh, inst in a[kernel].items()}
        assert args == {dh: inst.args for dh, inst in b[kernel].items()}, kernel


@pytest.mark.parametrize("name", LINKED)
def test_every_static_runtime_instance_replays_and_verifies(static_recordings, name):
    from mneme.record.db import find_dbs

    found = [str(p) for p in find_dbs(str(static_recordings[name].db_dir))]
    p = subprocess.run([sys.executable, str(HERE / "replay_matrix.py"), "replay", *found], capture_output=True,
                       text=True, timeout=600)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert p.returncode == 0 and rows, p.stdout[-3000:] + p.stderr[-3000:]
    bad = [r for r in rows if not r["verified"]]
    assert not bad, "\n".join(f"{r['kernel']}: {r['status']} {r['error']}" for r in bad)
