"""Texture and surface objects on the H200 (examples/texture.cu): the app runs unchanged under the recorder,
every kernel that gets its objects as arguments is recorded replayable with its objects (linear, pitched 2D,
2D array, 3D array, mipmapped array, a surface written into an array) and verifies on replay under the standard variants;
a configuration that changes what the surface kernel writes fails on the array's contents, and the next
replay verifies again (arrays are restored); the kernel that reads its handle from a __device__ variable
is reported by name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_record_examples import dbs_of
from test_replay_gpu import matrix

pytestmark = pytest.mark.gpu

BIN = Path(__file__).resolve().parents[2] / "examples" / "bin"
MNEME = [sys.executable, "-m", "mneme.cli"]
CHECKSUM = "checksum=9.8322945235e+04"
REPLAYED = ["textureRead", "pitchRead", "arrayRead", "volumeRead", "mipRead", "surfaceWrite"]


@pytest.fixture(scope="module")
def rec(small_recordings):
    return small_recordings["texture"]


@pytest.fixture(scope="module")
def dbs(rec):
    return dbs_of(rec)


def textures_of(db):
    (attrs,) = db.extra["InstanceAttributes"].values()
    return attrs.get("Textures", [])


def test_the_app_runs_unchanged_under_the_recorder(rec):
    assert rec.returncode == 0, rec.stdout + rec.stderr
    plain = subprocess.run([str(BIN / "texture")], capture_output=True, text=True, timeout=120)
    assert CHECKSUM in rec.stdout and plain.stdout == CHECKSUM + "\n", plain.stdout + plain.stderr


def test_each_kernel_is_recorded_with_the_objects_its_arguments_hold(dbs):
    assert set(dbs) >= set(REPLAYED) | {"globalRead"}, sorted(dbs)
    for name in REPLAYED:
        assert dbs[name].replayable, f"{name}: {dbs[name].not_replayable_reason}"
    res = {name: [(t["Param"], t["Kind"], t["Resource"], t["Dims"], t["Written"]) for t in textures_of(dbs[name])]
           for name in REPLAYED}
    assert res["textureRead"] == [(0, "texture", "linear", [16384 * 4, 0, 0], False)]
    assert res["pitchRead"] == [(0, "texture", "pitch2d", [64, 48, 0], False)]
    assert res["arrayRead"] == [(0, "texture", "array", [64, 48, 0], False)]
    assert res["volumeRead"] == [(0, "texture", "array", [64, 48, 8], False)]
    assert res["mipRead"] == [(0, "texture", "mipmapped", [64, 48, 0], False)]
    (mip,) = textures_of(dbs["mipRead"])
    assert mip["Levels"] == 3 and mip["Bytes"] == (64 * 48 + 32 * 24 + 16 * 12) * 4
    assert res["surfaceWrite"] == [(0, "texture", "array", [64, 48, 0], False),
                                   (1, "surface", "array", [64, 48, 0], True)]
    assert textures_of(dbs["volumeRead"])[0]["Bytes"] == 64 * 48 * 8 * 4


def test_a_handle_read_from_memory_is_reported_by_name(dbs):
    db = dbs["globalRead"]
    assert not db.replayable and "g_tex" in db.not_replayable_reason and "from memory" in db.not_replayable_reason


@pytest.mark.parametrize("name", REPLAYED)
def test_every_texture_kernel_verifies_under_every_standard_variant(dbs, name):
    rows = matrix("matrix", [dbs[name].path])
    assert rows, "nothing was replayed"
    bad = [r for r in rows if not r["verified"]]
    assert not bad, "\n".join(f"{r['kernel']} {r['variant']}: {r['status']} {r['error']}" for r in bad)
    assert {r["variant"] for r in rows} >= {"O3", "O3+specialize", "O3+dims"}


@pytest.mark.parametrize("name", ["surfaceWrite", "arrayRead"])
def test_a_result_changing_configuration_fails_and_the_next_replay_verifies(dbs, name):
    rows = matrix("override", [dbs[name].path])
    by = {r["variant"]: r for r in rows}
    assert by["half-grid"]["status"] == "failed_verification" and not by["half-grid"]["verified"], by["half-grid"]
    if name == "surfaceWrite":  # only the surface's array is written: the verdict names it, with values
        assert re.search(r"FAIL array 0x[0-9a-f]+ \(64x48, f32", by["half-grid"]["error"]), by["half-grid"]["error"]
    assert by["O3-after"]["verified"], by["O3-after"]


def test_mneme_show_and_replay_cli_on_the_surface_kernel(dbs, rec):
    show = subprocess.run([*MNEME, "show", str(rec.dir)], capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stdout + show.stderr
    assert "textures: arg 0: texture over array 64x48 f32x1; arg 1: surface over array 64x48 f32x1 (written)" in show.stdout
    p = subprocess.run([sys.executable, "-m", "mneme.cli", "replay", "-rdb", dbs["surfaceWrite"].path, "-it", "5"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "verified" in p.stdout, p.stdout + p.stderr
