"""The replay pipeline without a GPU: compile-only on every committed fixture, CLI flags mapping onto the
replay configuration, errors before compiling, and refusals of bad record DBs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mnemetest import ROOT, run_mneme
from mneme.config import ExperimentConfiguration
from mneme.errors import ConfigurationError, RecordError
from mneme.record.db import RecordedExecution, find_dbs
from mneme.replay.cli import add_arguments, config_from_args
from mneme.replay.pipeline import ReplayPipeline, compile_only

FIXTURES = ROOT / "tests" / "fixtures"
ALL_DBS = sorted(p for d in sorted(FIXTURES.iterdir()) if d.is_dir() for p in find_dbs(str(d)))


def test_fixtures_are_present():
    names = {Path(p).parent.name for p in ALL_DBS}
    assert names >= {"vecadd", "stencil2d", "rdc", "ptrglobal", "matmul", "manylaunch"}


@pytest.mark.parametrize("db", ALL_DBS, ids=lambda p: f"{Path(p).parent.name}-{Path(p).stem[:8]}")
def test_compile_only_on_every_fixture_instance(db):
    rec = RecordedExecution.from_json(db)
    for rid in rec:
        pipe = ReplayPipeline(db, rid, device_id=None)
        r = pipe.compile_only(pipe.baseline_config())
        assert r.status == "compiled", r.error
        assert r.reg_usage > 0 and r.obj_size > 1000 and r.cubin_time > 0 and r.code_hash
        assert r.config_hash == pipe.baseline_config().hash()


def test_specialization_changes_the_code_but_not_the_resources_contract():
    db = find_dbs(str(FIXTURES / "vecadd"))[0]
    pipe = ReplayPipeline(db, device_id=None)
    base = pipe.baseline_config()
    plain = pipe.compile(base)
    spec = pipe.compile(ExperimentConfiguration.from_dict({**base.to_dict(), "specialize": True, "specialize_dims": True}))
    bounds = pipe.compile(ExperimentConfiguration.from_dict(
        {**base.to_dict(), "set_launch_bounds": True, "max_threads": base.block.total(), "min_blocks_per_sm": 2}))
    assert len({plain.code_hash, spec.code_hash, bounds.code_hash}) == 3
    assert ".maxntid" in bounds.ptx and ".maxntid" not in plain.ptx
    assert "%ntid.x" in plain.ptx and "%ntid.x" not in spec.ptx, "dims specialization folds blockDim"
    again = pipe.compile(base)
    assert again.code_hash == plain.code_hash and again.cache_hit, "identical code is compiled once"


def test_the_recorded_scalar_arguments_are_what_specialization_uses():
    db = find_dbs(str(FIXTURES / "vecadd"))[0]
    pipe = ReplayPipeline(db, device_id=None)
    values = pipe.arg_values()
    assert list(values) == [3], "vecAdd(a, b, c, n): only n is a scalar"
    n = int.from_bytes(values[3], "little")
    assert 0 < n <= pipe.instance.grid_dim.x * pipe.instance.block_dim.x, "the launch covers n"
    plain = pipe.compile(pipe.baseline_config())
    ck = pipe.compile(ExperimentConfiguration.from_dict({**pipe.baseline_config().to_dict(), "specialize": True}))
    assert "[_Z6vecAddPKfS0_Pfi_param_3]" in plain.ptx, "plain code loads n"
    assert "[_Z6vecAddPKfS0_Pfi_param_3]" not in ck.ptx, "specialized code has n as a constant"
    assert str(n) in ck.ptx or str(n - 1) in ck.ptx


def parse(*argv):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["-rdb", "x.json", *argv])


def test_cli_flags_map_onto_the_configuration_fields():
    base = ExperimentConfiguration(block=ExperimentConfiguration().block)
    args = parse("default<O1>", "-gidx", "7", "--grid-dim-y", "3", "-bidx", "64", "-shem", "128", "--specialize",
                 "-sdims", "-slb", "--max-threads", "64", "--min-threads-per-block", "4", "-co", "2",
                 "--codegen-method", "parallel")
    c = config_from_args(args, base)
    assert (c.grid.x, c.grid.y, c.block.x, c.shared_mem) == (7, 3, 64, 128)
    assert c.specialize and c.specialize_dims and c.set_launch_bounds
    assert (c.max_threads, c.min_blocks_per_sm, c.codegen_opt, c.codegen_method) == (64, 4, 2, "parallel")
    assert c.passes == "default<O1>"
    assert not config_from_args(parse("--no-specialize"), ExperimentConfiguration(specialize=True)).specialize


def test_replay_cli_compile_only_prints_resources_and_writes_outputs(tmp_path):
    db = find_dbs(str(FIXTURES / "stencil2d"))[0]
    p = run_mneme("replay", "-rdb", db, "--compile-only", "default<O2>", "--output-ll", tmp_path / "k.ll",
                  "--output-ptx", tmp_path / "k.ptx", "--output-cubin", tmp_path / "k.cubin", "--json", tmp_path / "r.json")
    assert "registers" in p.stdout and "timing needs a GPU" in p.stdout
    assert "define" in (tmp_path / "k.ll").read_text() and ".entry" in (tmp_path / "k.ptx").read_text()
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["config"]["passes"] == "default<O2>" and doc["result"]["status"] == "compiled"


def test_invalid_configurations_fail_before_compiling():
    db = find_dbs(str(FIXTURES / "vecadd"))[0]
    p = run_mneme("replay", "-rdb", db, "--compile-only", "-bidx", "2048", check=False)
    assert p.returncode == 2 and "at most 1024" in p.stderr
    p = run_mneme("replay", "-rdb", db, "--compile-only", "-slb", "--max-threads", "32", check=False)
    assert p.returncode == 2 and "max_threads=32 is below" in p.stderr
    p = run_mneme("replay", "-rdb", db, "--compile-only", "default<O7>", check=False)
    assert p.returncode == 2 and "invalid_config" in p.stdout and "default<O3>" in p.stdout, p.stdout
    pipe = ReplayPipeline(db, device_id=None)
    with pytest.raises(ConfigurationError):
        pipe.compile(ExperimentConfiguration.from_dict({**pipe.baseline_config().to_dict(), "shared_mem": 10**6}))


def test_bad_record_dbs_are_refused_with_the_file_named(tmp_path):
    src = FIXTURES / "vecadd"
    dst = tmp_path / "vecadd"
    shutil.copytree(src, dst)
    (db,) = find_dbs(str(dst))
    data = json.loads(Path(db).read_text())
    data["SchemaVersion"] = 99
    Path(db).write_text(json.dumps(data))
    with pytest.raises(RecordError, match="schema version 99"):
        ReplayPipeline(db, device_id=None)
    data["SchemaVersion"] = 1
    inst = next(iter(data["instances"].values()))
    inst["Prologue"] = "../../etc/passwd"
    Path(db).write_text(json.dumps(data))
    with pytest.raises(RecordError, match="outside the DB's directory"):
        ReplayPipeline(db, device_id=None)
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for f in dst.glob("RecordedIR_*.bc"):
        f.write_bytes(b"BC\xc0\xde garbage")
    r = compile_only(db, None, ReplayPipeline(db, device_id=None).baseline_config())
    assert r.status == "compile_error" and "RecordedIR_" in r.error


def test_multi_instance_db_needs_a_record_id():
    db = find_dbs(str(FIXTURES / "manylaunch"))[0]
    with pytest.raises(RecordError, match="choose one with -rid"):
        ReplayPipeline(db, device_id=None)


def test_rewrite_inputs_restores_all_recorded_memory_before_every_run():
    """--rewrite-inputs: the reset plan grows from the bytes the kernel writes to every recorded blob (the app's
    producer rewrote the inputs just before the kernel); without it the plan is the written bytes alone."""
    from mneme.replay.cli import settings_from_args
    from mneme.snapshot import Snapshot

    db = find_dbs(str(FIXTURES / "vecadd"))[0]
    assert settings_from_args(parse("--rewrite-inputs")).rewrite_inputs
    assert not settings_from_args(parse()).rewrite_inputs
    pipe = ReplayPipeline(db, device_id=None)
    with Snapshot.read(pipe.instance.checked_prologue()) as pro:
        pipe._prologue, pipe._written = pro, [(0x1000, 16)]
        assert pipe._reset_ranges() == [(0x1000, 16)]
        pipe.settings.rewrite_inputs = True
        blobs = [(b.addr, b.size) for b in pro.blobs]
        assert len(blobs) == 3, "vecAdd's a, b and c"
        assert pipe._reset_ranges() == [(0x1000, 16)] + blobs
        pipe._prologue = None
