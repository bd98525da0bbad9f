"""Integrity: the code hash (the compile cache's key) comes from the IR compiled, an edited IR is refused before
it compiles, and a shared cache never serves code compiled from other IR (issue 14: `fadd` -> `fmul` kept code
hash c8758bf45df3 and a shared --cache-dir served the old cubin)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import llvmlite.binding as llvm
import pytest

from mnemetest import FIXTURES
from mneme.config import ExperimentConfiguration
from mneme.errors import RecordError
from mneme.ir import CompileCache, compile_kernel, link_modules, parse_module
from mneme.record import integrity
from mneme.record.db import RecordedExecution, find_dbs
from mneme.replay.pipeline import ReplayPipeline


def edited_copy(tmp_path: Path, schema2: bool, update_hash: bool = False) -> Path:
    d = tmp_path / "vecadd"
    shutil.copytree(FIXTURES / "vecadd", d)
    (db,) = find_dbs(str(d))
    if schema2:
        RecordedExecution.from_json(db).to_json()
    data = json.loads(Path(db).read_text())
    ir = d / data["Modules"][0]
    text = str(parse_module(ir))
    assert " fadd " in text
    ir.write_bytes(llvm.parse_assembly(text.replace(" fadd ", " fmul ")).as_bitcode())
    if update_hash:
        data["ModuleSha256"] = [integrity.sha256(str(ir))]
        Path(db).write_text(json.dumps(data))
    return Path(db)


@pytest.mark.parametrize("schema2,update_hash,says", [
    (True, False, "does not match the SHA-256"),  # the recorded hash catches it before LLVM
    (True, True, "hash to static hash"),         # hash updated by hand: the IR's own static hash catches it
    (False, False, "hash to static hash"),       # schema 1, no hashes
])
def test_edited_ir_is_refused_before_it_compiles(tmp_path, schema2, update_hash, says):
    db = edited_copy(tmp_path, schema2, update_hash)
    with pytest.raises(RecordError, match=says) as e:
        ReplayPipeline(str(db), device_id=None).linked()
    assert "RecordedIR_" in str(e.value)


def test_the_code_hash_is_the_compiled_irs_so_a_shared_cache_cannot_serve_other_code(tmp_path):
    (src,) = find_dbs(str(FIXTURES / "vecadd"))
    rec = RecordedExecution.from_json(src)
    good = link_modules(rec.llvm_files, rec.kernel_name)
    edited = llvm.parse_assembly(str(good).replace(" fadd ", " fmul "))
    cache = CompileCache(tmp_path / "cache")
    config = ExperimentConfiguration(grid=rec.instance().grid_dim, block=rec.instance().block_dim)
    a = compile_kernel(good, rec.kernel_name, config, cache=cache)
    b = compile_kernel(edited, rec.kernel_name, config, cache=CompileCache(tmp_path / "cache"))
    assert a.code_hash != b.code_hash and not b.cache_hit
    assert "mul.f32" in b.ptx and "add.f32" in a.ptx
    again = compile_kernel(good, rec.kernel_name, config, cache=CompileCache(tmp_path / "cache"))
    assert again.cache_hit and again.code_hash == a.code_hash
