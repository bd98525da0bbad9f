"""compile_kernel: configuration -> cubin, cloning its input, compiling each code hash once."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from irutil import bc_dir, build  # noqa: F401  (fixtures)

from mneme.config import ExperimentConfiguration, dim3
from mneme.errors import ConfigurationError
from mneme.ir import CompileCache, compile_kernel, link_modules, static_hash

SAXPY = "_Z5saxpyfPKfPfii"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def saxpy(build):
    mod = link_modules([build("params.cu")], SAXPY)
    return mod, static_hash(mod, SAXPY)


def _config(**kw):
    return ExperimentConfiguration(grid=dim3(64), block=dim3(256), **kw)


def test_compile_reports_times_and_resources_and_never_changes_its_input(saxpy):
    mod, sh = saxpy
    before = str(mod)
    ck = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=False, keep_ll=True)
    assert str(mod) == before
    assert ck.cubin.cubin[:4] == b"\x7fELF" and ck.obj_size == ck.cubin.size and ck.cubin.registers > 0
    assert ck.cubin.const_mem == 64
    assert all(t > 0 for t in (ck.preprocess_ir_time, ck.opt_time, ck.ptx_time, ck.cubin_time))
    assert ck.codegen_time == ck.ptx_time + ck.cubin_time
    assert ".entry _Z5saxpyfPKfPfii(" in ck.ptx and "alloca" not in ck.ll
    assert not ck.cache_hit and ck.specialization == {}


def test_identical_configuration_is_compiled_once(saxpy):
    mod, sh = saxpy
    cache = CompileCache()
    first = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=cache)
    again = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=cache)
    assert not first.cache_hit and again.cache_hit
    assert again.code_hash == first.code_hash and again.cubin.cubin == first.cubin.cubin
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)
    other = compile_kernel(mod, SAXPY, _config(codegen_opt=2), "sm_90", sh, cache=cache)
    assert not other.cache_hit and other.code_hash != first.code_hash and len(cache) == 2


def test_the_assembler_is_part_of_the_code_hash(saxpy, monkeypatch):
    mod, sh = saxpy
    cache = CompileCache()
    monkeypatch.setenv("MNEME_ASSEMBLER", "ptxas")
    whole = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=cache)
    monkeypatch.setenv("MNEME_ASSEMBLER", "nvjitlink")
    reloc = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=cache)
    assert (whole.assembler, reloc.assembler) == ("ptxas", "nvjitlink")
    assert not reloc.cache_hit and reloc.code_hash != whole.code_hash and whole.ptx == reloc.ptx


def test_config_specializations_are_applied_and_hashed(saxpy):
    mod, sh = saxpy
    args = {0: 2.0, 1: 0x7F0000001000, 3: 16384, 4: 16384}  # index 1 is a pointer: ignored
    plain = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, args, cache=False)
    spec = compile_kernel(
        mod, SAXPY,
        _config(specialize=True, specialize_dims=True, set_launch_bounds=True, max_threads=256, min_blocks_per_sm=4),
        "sm_90", sh, args, cache=False, keep_ll=True,
    )
    assert spec.specialization == {
        "args": {"0": (2.0).hex(), "3": 16384, "4": 16384},
        "dims": {"grid": [64, 1, 1], "block": [256, 1, 1]},
        "launch_bounds": [256, 4],
    }
    assert spec.code_hash != plain.code_hash
    assert ".maxntid 256" in spec.ptx and ".minnctapersm 4" in spec.ptx and "%ntid" not in spec.ptx
    # n == stride == grid*block: the grid-stride loop runs once, so n and stride are never read
    assert f"[{SAXPY}_param_4]" in plain.ptx and f"[{SAXPY}_param_4]" not in spec.ptx
    assert "%stride" not in spec.ll.split("entry:")[1]
    # without `specialize`, recorded values are not used and the hash equals the plain one
    dims_only = compile_kernel(mod, SAXPY, _config(specialize_dims=True), "sm_90", sh, args, cache=False)
    assert "args" not in dims_only.specialization


def test_compiled_kernels_pickle(saxpy):
    mod, sh = saxpy
    ck = compile_kernel(mod, SAXPY, _config(), "sm_90", sh, cache=False)
    back = pickle.loads(pickle.dumps(ck))
    assert back == ck


def test_directory_cache_serves_another_process(saxpy, tmp_path):
    mod, sh = saxpy
    ck = compile_kernel(mod, SAXPY, _config(passes="default<O1>"), "sm_90", sh, cache=CompileCache(tmp_path))
    code = (
        "import sys; from mneme.ir import CompileCache; "
        "hit = CompileCache(sys.argv[1]).get(sys.argv[2]); "
        "print(hit.cache_hit, hit.cubin.size, hit.cubin.registers, hit.opt_time > 0)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), ck.code_hash], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", str(ck.cubin.size), str(ck.cubin.registers), "True"]
    assert not list(tmp_path.rglob("*.tmp"))


def test_corrupt_cache_entries_are_misses(saxpy, tmp_path):
    mod, sh = saxpy
    cache = CompileCache(tmp_path)
    ck = compile_kernel(mod, SAXPY, _config(passes="default<O2>"), "sm_90", sh, cache=cache)
    entry = next(tmp_path.rglob(f"{ck.code_hash}.mck"))
    entry.write_bytes(entry.read_bytes()[:-10])
    assert CompileCache(tmp_path).get(ck.code_hash) is None


def test_the_disk_cache_is_per_code_generation(saxpy, tmp_path):
    """Entries live under a directory named after the toolchain and mneme/ir's own code, by content: a mneme
    whose code generation changed misses another's entries instead of serving them for the same key."""
    from mneme.ir.compile import source_tag

    mod, sh = saxpy
    ck = compile_kernel(mod, SAXPY, _config(passes="default<O1>"), "sm_90", sh, cache=CompileCache(tmp_path))
    (entry,) = tmp_path.rglob(f"{ck.code_hash}.mck")
    assert entry.parent.name.endswith(f"-ir{source_tag()}") and entry.parent.name.startswith("llvm")
    src = tmp_path / "src"
    src.mkdir()
    (src / "codegen.py").write_text("X = 1\n")
    (src / "specialize.py").write_text("Y = 2\n")
    before = source_tag(src)
    (src / "specialize.py").write_text("Y = 3\n")
    source_tag.cache_clear()
    after = source_tag(src)
    assert after != before and len(before) == 12
    (src / "notes.txt").write_text("not code")  # only the modules count
    source_tag.cache_clear()
    assert source_tag(src) == after


def test_invalid_configurations_fail_before_compiling(saxpy):
    mod, sh = saxpy
    with pytest.raises(ConfigurationError, match="max_threads=128 is below"):
        compile_kernel(mod, SAXPY, _config(set_launch_bounds=True, max_threads=128), "sm_90", sh, cache=False)
    with pytest.raises(ConfigurationError, match="codegen_method"):
        compile_kernel(mod, SAXPY, _config(codegen_method="fast"), "sm_90", sh, cache=False)


def test_static_hash_is_computed_when_not_given(saxpy):
    mod, sh = saxpy
    a = compile_kernel(mod, SAXPY, _config(passes="sroa,instcombine"), "sm_90", None, cache=False)
    b = compile_kernel(mod, SAXPY, _config(passes="sroa,instcombine"), "sm_90", sh, cache=False)
    assert a.code_hash == b.code_hash
