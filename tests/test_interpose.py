"""native/interpose without a GPU: a small user library built on it, preloaded into (a) a probe that
reaches the driver as every CUDA runtime does and (b) real nvcc-built apps with the static and the shared
CUDA runtime. This machine has no NVIDIA driver, so a stand-in libcuda.so.1 (tests/data/interpose/
fake_libcuda.c: cuGetProcAddress over a few entry points, cuInit failing with NO_DEVICE) plays the
driver; the GPU tests (tests/gpu/test_record_linkage.py) use the real one."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from mnemetest import CUDA, cc

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "interpose"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("interpose")
    (d / "fake").mkdir()
    cc("-fPIC", "-shared", "-o", str(d / "fake" / "libcuda.so.1"), str(DATA / "fake_libcuda.c"))
    cc("-fPIC", "-shared", "-fvisibility=hidden", f"-I{ROOT / 'native' / 'interpose'}", "-o", str(d / "libuser.so"),
       str(ROOT / "native" / "interpose" / "interpose.c"), str(DATA / "user.c"), "-ldl", "-lpthread")
    cc("-o", str(d / "probe"), str(DATA / "probe.c"), "-ldl")
    cc("-o", str(d / "old_abis"), str(DATA / "old_abis.c"), "-ldl")
    return d


def run(exe: Path, built: Path, preload: bool, on: bool, fake_driver: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MN_IP_TEST_ON")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(([str(built / "fake")] if fake_driver else []) + [str(CUDA / "lib64")])
    if preload:
        env["LD_PRELOAD"] = str(built / "libuser.so")
    if on:
        env["MN_IP_TEST_ON"] = "1"
    return subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=60)


def test_the_library_exports_only_the_hooks(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built / "libuser.so")], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    assert {"dlsym", "dlopen", "cuGetProcAddress", "cuGetProcAddress_v2"} <= names
    assert not [n for n in names if n.startswith("mn_")], names


def test_the_probe_gets_wrapped_entry_points_with_their_stream_variant(built):
    plain = run(built / "probe", built, preload=False, on=False)
    rec = run(built / "probe", built, preload=True, on=True)
    assert rec.returncode == plain.returncode == 0, rec.stderr
    assert rec.stdout == plain.stdout, "the app sees the same results"
    assert "rtld_next_from_app=1" in rec.stdout, "dlsym(RTLD_NEXT) from the app still searches after the app"
    err = rec.stderr.splitlines()
    # cuInit through the cuGetProcAddress that dlsym handed out, and through the 11.3-ABI one
    assert err.count("wrapped cuInit") == 2
    # legacy: stream 0 stays 0; the per-thread variant (asked by flag, or by its exported name) means stream 2
    assert err.count("wrapped cuLaunchKernel ptsz=0 stream=(nil)") == 1
    assert err.count("wrapped cuLaunchKernel ptsz=1 stream=0x2") == 2
    assert "driver legacy launch stream=(nil)" in err and "driver ptsz launch stream=(nil)" in err
    assert "bare cuDriverGetVersion 1000: no wrapper for the ABI of this CUDA version" in err
    assert "wrapped cuDriverGetVersion" not in err


def test_without_the_switch_nothing_is_wrapped(built):
    rec = run(built / "probe", built, preload=True, on=False)
    assert rec.returncode == 0 and "wrapped" not in rec.stderr and "bare" not in rec.stderr
    assert "rtld_next_from_app=1" in rec.stdout


def nvcc() -> Optional[str]:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/bin/nvcc", str(CUDA / "bin" / "nvcc")) if Path(p).exists()), None)


@pytest.fixture(scope="module")
def cudart_apps(tmp_path_factory) -> Dict[str, Path]:
    exe = nvcc()
    if not exe:
        pytest.skip("nvcc is not installed here")
    d = tmp_path_factory.mktemp("cudart")
    out = {}
    for linkage in ("static", "shared"):
        out[linkage] = d / f"app_{linkage}"
        p = subprocess.run([exe, "-arch=sm_90", "-cudart", linkage, "-o", str(out[linkage]), str(DATA / "cudart_app.cu")],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    return out


def dynamic_imports(exe: Path) -> List[str]:
    out = subprocess.run(["nm", "-D", "--undefined-only", str(exe)], capture_output=True, text=True).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]


def test_a_static_runtime_app_reaches_the_driver_through_the_dynamic_dlsym(cudart_apps):
    imports = dynamic_imports(cudart_apps["static"])
    assert any(re.fullmatch(r"dlsym@GLIBC_[0-9.]+", n) for n in imports), imports
    assert not [n for n in imports if n.startswith("cuda")], "the runtime is inside the binary"
    assert any(n.startswith("cudaGetDeviceCount") for n in dynamic_imports(cudart_apps["shared"]))


@pytest.mark.parametrize("linkage", ["static", "shared"])
def test_both_runtimes_ask_for_their_entry_points_through_the_wrapped_cuGetProcAddress(built, cudart_apps, linkage):
    app = cudart_apps[linkage]
    plain = run(app, built, preload=False, on=False)
    rec = run(app, built, preload=True, on=True)
    assert plain.stdout == rec.stdout == "cudaGetDeviceCount=100\n", "the stand-in driver has no device"
    assert "wrapped cuInit" in rec.stderr.splitlines(), rec.stderr


@pytest.mark.parametrize("linkage", ["static", "shared"])
def test_a_missing_driver_is_reported_and_the_app_still_gets_its_error(built, cudart_apps, linkage):
    rec = run(cudart_apps[linkage], built, preload=True, on=True, fake_driver=False)
    assert rec.stdout == "cudaGetDeviceCount=35\n", "cudaErrorInsufficientDriver, as without the library"
    assert re.search(r"^no driver: libcuda\.so\.1: cannot open shared object file", rec.stderr, re.M), rec.stderr


# ---- the tables against cudaTypedefs.h -------------------------------------------------------------

ENTRY = re.compile(r'MN_IP_ENTRY\((\w+),\s*"(\w+)",\s*"(\w*)",\s*(\d+),\s*(\d+)\)')
DEFINE = re.compile(r"MN_IP_DEFINE\((\w+),\s*PFN_(\w+)_v(\d+),")


def pfn_versions() -> Dict[str, List[int]]:
    return {name: sorted(v) for name, v in pfn_prototypes().items()}


def pfn_prototypes() -> Dict[str, Dict[int, str]]:
    """{name: {version: parameter list}} of every PFN_<name>_v<version> typedef of cudaTypedefs.h,
    the older ABIs declared under __CUDA_API_VERSION_INTERNAL included."""
    text = (CUDA / "include" / "cudaTypedefs.h").read_text()
    out: Dict[str, Dict[int, str]] = {}
    for name, v, params in re.findall(r"\*PFN_(\w+?)_v(\d+)\)\s*\(([^;]*)\);", text):
        out.setdefault(name, {}).setdefault(int(v), params)
    return out


def narrow(params: str) -> bool:
    """A 32-bit-era ABI (before CUDA 3.2): 32-bit device pointers or `unsigned int` byte counts. No
    CUDA 12+ runtime asks for these; every other ABI of a wrapped name must have a wrapper."""
    return "_v1 *dptr" in params or "CUdeviceptr_v1" in params or bool(
        re.search(r"unsigned int\s*\*?\s*(bytesize|bytes|ByteCount|pPitch|WidthInBytes)\b", params))


TABLES = [ROOT / "native" / "interpose" / "interpose.c", DATA / "user.c", ROOT / "native" / "recorder" / "driver.c"]
#: names whose later ABI is another entry point's prototype (cuda.h `#define cuGraphInstantiate
#: cuGraphInstantiateWithFlags`: from CUDA 12.0 the driver serves that ABI under the old name):
#: (name, version) -> the prototype's PFN name
ALIASES = {("cuGraphInstantiate", 12000): "cuGraphInstantiateWithFlags"}


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_each_entry_covers_exactly_the_versions_of_its_prototype(path):
    if not path.exists():
        pytest.skip(f"{path} not written yet")
    text = path.read_text()
    defines = {m.group(1): (m.group(2), int(m.group(3))) for m in DEFINE.finditer(text)}
    entries = ENTRY.findall(text)
    assert entries and defines
    versions = pfn_versions()
    for ident, name, suffix, lo, hi in entries:
        pfn_name, pfn_version = defines[ident]
        if (name, int(lo)) in ALIASES:
            assert pfn_name == ALIASES[name, int(lo)] and int(hi) == 0, (ident, pfn_name, name)
            assert not [v for v in versions[name] if v >= int(lo)], f"{name} has its own prototype at {lo}"
            continue
        assert pfn_name == name, (ident, pfn_name, name)
        assert int(lo) == pfn_version, f"{name}: the entry starts at {lo}, its prototype is PFN_{name}_v{pfn_version}"
        later = [v for v in versions[name] if v > pfn_version]
        later = [v for v in later if (name, v) not in ALIASES] + [v for (n, v) in ALIASES if n == name and v > pfn_version]
        later.sort()
        expected_hi = later[0] if later else 0
        assert int(hi) == expected_hi, f"{name}: the ABI of {pfn_version} ends at {expected_hi or 'no later version'}"


@pytest.mark.parametrize("path", [ROOT / "native" / "recorder" / "driver.c", ROOT / "native" / "apply" / "hook.c"],
                         ids=lambda p: p.name)
def test_every_abi_a_runtime_can_ask_for_has_a_wrapper(path):
    """The campaign's recorder logged `driver entry point left unwrapped` for cuDevicePrimaryCtxRelease /
    Reset (asked at 7000, the pre-_v2 ABI) and cuStreamBeginCapture (10000, no mode argument)."""
    entries = ENTRY.findall(path.read_text())
    protos = pfn_prototypes()
    missing = []
    for name in sorted({e[1] for e in entries}):
        ranges = [(int(lo), int(hi)) for _, n, _, lo, hi in entries if n == name]
        for v, params in protos[name].items():
            if not narrow(params) and not any(lo <= v and (hi == 0 or v < hi) for lo, hi in ranges):
                missing.append(f"{name} v{v} ({params})")
    assert not missing, missing
    if path.name == "driver.c":
        covered = {(n, int(lo)) for _, n, _, lo, _ in entries}
        assert {("cuDevicePrimaryCtxRelease", 7000), ("cuDevicePrimaryCtxReset", 7000),
                ("cuStreamBeginCapture", 10000)} <= covered
    assert narrow(protos["cuMemAlloc"][2000]) and not narrow(protos["cuStreamBeginCapture"][10000])


@pytest.mark.parametrize("linkage", ["static", "shared"])
def test_librecord_engages_for_both_runtimes(built, cudart_apps, linkage, tmp_path):
    """Before the driver-level recorder, a static-runtime app never reached librecord: no log at all."""
    import json

    from mneme.record.runner import find_librecord

    raw = tmp_path / "raw"
    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=f"{built / 'fake'}{os.pathsep}{CUDA / 'lib64'}", LD_PRELOAD=str(find_librecord()),
               MNEME_RECORD_DIR=str(raw))
    app = cudart_apps[linkage]
    rec = subprocess.run([str(app)], env=env, capture_output=True, text=True, timeout=60)
    assert rec.stdout == "cudaGetDeviceCount=100\n", rec.stderr
    (log,) = raw.glob("r0-p*.jsonl")
    ev = [json.loads(x) for x in log.read_text().splitlines()]
    assert ev[0]["ev"] == "start" and ev[0]["exe"] == str(app.resolve())
    assert ev[-1]["ev"] == "exit"


def test_librecord_wraps_the_older_abis_runtimes_still_ask_for(built, tmp_path):
    """Each older ABI comes back as librecord's wrapper, reaches the driver's function of that ABI with
    the caller's arguments, and no `left unwrapped` warning is logged."""
    import json

    from mneme.record.runner import find_librecord

    raw = tmp_path / "raw"
    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(find_librecord()), MNEME_RECORD_DIR=str(raw))
    rec = subprocess.run([str(built / "old_abis")], env=env, capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    got = dict(line.split(" ", 1) for line in rec.stdout.splitlines())
    assert len(got) == 7, rec.stdout
    assert all(v.endswith("in=librecord.so") and "r=0" in v for v in got.values()), rec.stdout
    err = rec.stderr.splitlines()
    for line in ("driver cuDevicePrimaryCtxRelease v1 dev=0", "driver cuDevicePrimaryCtxRelease v2 dev=1",
                 "driver cuDevicePrimaryCtxReset v1 dev=2", "driver cuStreamBeginCapture v1 stream=0x5",
                 "driver cuStreamBeginCapture v2 stream=0x6 mode=2", "driver cuCtxDestroy v1 ctx=0x7",
                 "driver cuMemHostRegister v1 n=64 flags=0"):
        assert line in err, rec.stderr
    (log,) = raw.glob("r0-p*.jsonl")
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert events[-1]["ev"] == "exit"
    assert not [e for e in events if "unwrapped" in str(e.get("what", ""))], events
