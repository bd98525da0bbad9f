"""The recorder's pure C parts, through ctypes on a test build of them: the best-fit arena, pitch
computation, rank selection, the kernel table parser, the JSON-line builder and the crash-safe log.
Also: librecord.so itself builds with -Wall -Wextra -Werror and exports exactly its driver-level hooks."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDER = ROOT / "native" / "recorder"
BASE = 0x153940000000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("librecord")
    p = subprocess.run(["make", "-C", str(RECORDER), f"OUT={out}", f"TESTLIB={out}/libmnrec_test.so", "all", "test-lib"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "warning" not in (p.stdout + p.stderr).lower()
    return out


class Span(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("size", ctypes.c_uint64)]


class Alloc(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_uint64), ("size", ctypes.c_uint64), ("reserved", ctypes.c_uint64)]


class Arena(ctypes.Structure):
    _fields_ = [
        ("base", ctypes.c_uint64), ("size", ctypes.c_uint64), ("align", ctypes.c_uint64),
        ("free", ctypes.POINTER(Span)), ("nfree", ctypes.c_size_t), ("capfree", ctypes.c_size_t),
        ("live", ctypes.POINTER(Alloc)), ("nlive", ctypes.c_size_t), ("caplive", ctypes.c_size_t),
        ("in_use", ctypes.c_uint64), ("top", ctypes.c_uint64),
    ]


@pytest.fixture(scope="module")
def lib(built):
    L = ctypes.CDLL(str(built / "libmnrec_test.so"))
    L.mn_arena_init.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    L.mn_arena_alloc.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64]
    L.mn_arena_alloc.restype = ctypes.c_uint64
    L.mn_arena_free.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64, ctypes.POINTER(Alloc)]
    L.mn_arena_find.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64]
    L.mn_arena_find.restype = ctypes.POINTER(Alloc)
    L.mn_arena_largest_free.argtypes = [ctypes.POINTER(Arena)]
    L.mn_arena_largest_free.restype = ctypes.c_uint64
    L.mn_arena_destroy.argtypes = [ctypes.POINTER(Arena)]
    L.mn_arena_keep_front.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64]
    L.mn_capture_verdict.argtypes = [ctypes.c_int, ctypes.c_int]
    L.mn_arena_contains.argtypes = [ctypes.POINTER(Arena), ctypes.c_uint64]
    L.mn_pitch.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    L.mn_pitch.restype = ctypes.c_uint64
    L.mn_rank_selected.argtypes = [ctypes.c_char_p, ctypes.c_int]
    L.mn_json_escape.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
    L.mn_json_escape.restype = ctypes.c_size_t
    return L


def new_arena(lib, size=1 << 20, align=256, base=BASE):
    a = Arena()
    assert lib.mn_arena_init(ctypes.byref(a), base, size, align) == 0
    return a


def free_list(a):
    return [(a.free[i].addr - a.base, a.free[i].size) for i in range(a.nfree)]


# ---- librecord.so ---------------------------------------------------------------------------------


def test_librecord_exports_the_driver_hooks_and_nothing_of_the_runtime(built):
    out = subprocess.run(["nm", "-D", "--defined-only", str(built / "librecord.so")], capture_output=True, text=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    # the runtime is reached through dlsym/cuGetProcAddress (native/interpose), the app's own -lcuda launches by name
    for must in ("dlsym", "dlopen", "cuGetProcAddress", "cuGetProcAddress_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz",
                 "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "mneme_recorder_annotate"):
        assert must in names, must
    runtime = sorted(n for n in names if n.startswith(("cuda", "__cuda")))
    assert not runtime, f"runtime-level hooks would see shared-libcudart apps twice: {runtime}"
    leaked = sorted(n for n in names if n.startswith("mn_"))
    assert not leaked, f"internal symbols exported (would collide with the app's): {leaked}"


# ---- the arena -----------------------------------------------------------------------------------


def test_arena_aligns_every_allocation(lib):
    a = new_arena(lib)
    addrs = [lib.mn_arena_alloc(ctypes.byref(a), n) for n in (1, 255, 256, 257, 1000)]
    assert all(x % 256 == 0 for x in addrs)
    assert [x - BASE for x in addrs] == [0, 256, 512, 768, 1280]
    p = lib.mn_arena_find(ctypes.byref(a), addrs[3] + 100)
    assert p and p.contents.addr == addrs[3] and p.contents.size == 257 and p.contents.reserved == 512
    assert not lib.mn_arena_find(ctypes.byref(a), addrs[3] + 300), "padding after an allocation belongs to no one"
    assert not lib.mn_arena_find(ctypes.byref(a), BASE - 1)
    lib.mn_arena_destroy(ctypes.byref(a))


def test_arena_keeps_a_guard_below_its_first_allocation(lib):
    """srad (Rodinia) reads a row before its first buffer; at the arena's first byte that faulted."""
    a = new_arena(lib, size=1 << 16)
    assert lib.mn_arena_keep_front(ctypes.byref(a), 4000) == 0
    x = lib.mn_arena_alloc(ctypes.byref(a), 1000)
    assert x == BASE + 4096, "rounded up to the alignment"
    assert lib.mn_arena_contains(ctypes.byref(a), BASE) == 1, "inside the range: mapped, and replay maps it too"
    assert not lib.mn_arena_find(ctypes.byref(a), BASE), "the guard belongs to no allocation"
    assert lib.mn_arena_largest_free(ctypes.byref(a)) == (1 << 16) - 4096 - 1024
    assert lib.mn_arena_free(ctypes.byref(a), x, None) == 0
    assert free_list(a) == [(4096, (1 << 16) - 4096)], "a free never gives the guard back"
    assert lib.mn_arena_keep_front(ctypes.byref(a), 256) == -1, "only on a fresh arena"
    lib.mn_arena_destroy(ctypes.byref(a))
    b = new_arena(lib, size=8192)
    assert lib.mn_arena_keep_front(ctypes.byref(b), 8192) == -1, "a guard must leave room"
    lib.mn_arena_destroy(ctypes.byref(b))


# CUresult values (cuda.h)
CUDA_SUCCESS, CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_LAUNCH_FAILED = 0, 700, 719
CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 906, 901


def test_a_context_error_is_not_counted_as_a_capture_elsewhere(lib):
    """After srad_cuda_1 faulted under the recorder, every later cuStreamIsCapturing failed with the
    context's error and the launches were counted 'launched while another stream was being captured'."""
    v = lib.mn_capture_verdict
    assert v(CUDA_SUCCESS, 0) == 0 and v(CUDA_SUCCESS, 1) == 1
    assert v(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 0) == 2 and v(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 0) == 2
    assert v(CUDA_ERROR_ILLEGAL_ADDRESS, 0) == 3 and v(CUDA_ERROR_LAUNCH_FAILED, 1) == 3


def test_arena_best_fit_takes_the_smallest_hole(lib):
    a = new_arena(lib, size=1 << 16)
    x = [lib.mn_arena_alloc(ctypes.byref(a), n) for n in (1024, 256, 512, 256, 2048, 256)]
    assert lib.mn_arena_free(ctypes.byref(a), x[0], None) == 0  # 1024-byte hole at 0
    assert lib.mn_arena_free(ctypes.byref(a), x[2], None) == 0  # 512-byte hole
    assert lib.mn_arena_free(ctypes.byref(a), x[4], None) == 0  # 2048-byte hole
    assert lib.mn_arena_alloc(ctypes.byref(a), 400) == x[2], "the 512-byte hole fits 400 best"
    assert lib.mn_arena_alloc(ctypes.byref(a), 1000) == x[0]
    assert lib.mn_arena_alloc(ctypes.byref(a), 2000) == x[4]
    lib.mn_arena_destroy(ctypes.byref(a))


def test_arena_free_coalesces_with_both_neighbours(lib):
    a = new_arena(lib, size=4096)
    x = [lib.mn_arena_alloc(ctypes.byref(a), 1024) for _ in range(4)]
    assert a.nfree == 0 and lib.mn_arena_alloc(ctypes.byref(a), 1) == 0, "a full arena serves nothing"
    for i in (0, 2):
        assert lib.mn_arena_free(ctypes.byref(a), x[i], None) == 0
    assert free_list(a) == [(0, 1024), (2048, 1024)]
    dead = Alloc()
    assert lib.mn_arena_free(ctypes.byref(a), x[1], ctypes.byref(dead)) == 0
    assert (dead.addr, dead.size) == (x[1], 1024)
    assert free_list(a) == [(0, 3072)]
    assert lib.mn_arena_free(ctypes.byref(a), x[3], None) == 0
    assert free_list(a) == [(0, 4096)] and a.nlive == 0 and a.in_use == 0
    assert lib.mn_arena_alloc(ctypes.byref(a), 4096) == BASE
    lib.mn_arena_destroy(ctypes.byref(a))


def test_arena_refuses_bad_frees_and_oversized_requests(lib):
    a = new_arena(lib, size=8192)
    x = lib.mn_arena_alloc(ctypes.byref(a), 1000)
    assert lib.mn_arena_free(ctypes.byref(a), x + 256, None) == -1, "not the start of an allocation"
    assert lib.mn_arena_free(ctypes.byref(a), x, None) == 0
    assert lib.mn_arena_free(ctypes.byref(a), x, None) == -1, "double free"
    assert lib.mn_arena_alloc(ctypes.byref(a), 8193) == 0
    assert lib.mn_arena_alloc(ctypes.byref(a), 0) == 0
    assert lib.mn_arena_largest_free(ctypes.byref(a)) == 8192
    assert lib.mn_arena_init(ctypes.byref(Arena()), BASE, 4096, 300) == -1, "alignment must be a power of two"
    lib.mn_arena_destroy(ctypes.byref(a))


def test_arena_random_workload_keeps_its_invariants(lib):
    import random

    rng = random.Random(7)
    a = new_arena(lib, size=1 << 22)
    live = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            addr = rng.choice(list(live))
            assert lib.mn_arena_free(ctypes.byref(a), addr, None) == 0
            del live[addr]
        else:
            n = rng.choice([1, 7, 256, 300, 4096, 10000, 65536])
            addr = lib.mn_arena_alloc(ctypes.byref(a), n)
            if addr:
                assert addr % 256 == 0 and BASE <= addr and addr + n <= BASE + (1 << 22)
                live[addr] = n
        spans = sorted([(x, -(-n // 256) * 256) for x, n in live.items()] + [(a.free[i].addr, a.free[i].size) for i in range(a.nfree)])
        pos = BASE
        for s, n in spans:  # live blocks and free blocks tile the arena exactly
            assert s == pos
            pos += n
        assert pos == BASE + (1 << 22)
        frees = free_list(a)
        assert all(o1 + n1 < o2 for (o1, n1), (o2, _) in zip(frees, frees[1:])), "free blocks must be coalesced"
    lib.mn_arena_destroy(ctypes.byref(a))


def test_pitch_rounds_the_width_up_to_the_runtime_alignment(lib):
    # the real cudaMallocPitch on an H200 (seen 2026-11-29): 1->512, 513->1024, 4000->4096, 70000->70144
    assert [lib.mn_pitch(w, 512) for w in (1, 100, 511, 512, 513, 4000, 70000)] == [512, 512, 512, 512, 1024, 4096, 70144]
    assert lib.mn_pitch(0, 512) == 0
    assert lib.mn_pitch(33, 32) == 64


# ---- ranks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, rank, expected",
    [("all", 5, 1), ("0", 0, 1), ("0", 1, 0), ("", 0, 1), ("", 2, 0), ("0,3", 3, 1), ("0,3", 2, 0),
     ("1-3,7", 2, 1), ("1-3,7", 7, 1), ("1-3,7", 4, 0), ("0", -1, 1), ("3-1", 2, -1), ("a", 0, -1), ("1,,2", 1, -1)],
)
def test_rank_selection(lib, spec, rank, expected):
    assert lib.mn_rank_selected(spec.encode(), rank) == expected


def test_rank_comes_from_the_launcher_variables_in_order(built):
    code = (
        "import ctypes, sys; L = ctypes.CDLL(sys.argv[1]); print(L.mn_rank_from_env())"
    )

    def rank(env):
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("FLUX_TASK_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK")}
        clean.update(env)
        return int(subprocess.run([sys.executable, "-c", code, str(built / "libmnrec_test.so")], env=clean,
                                  capture_output=True, text=True, check=True).stdout)

    assert rank({}) == -1
    assert rank({"PMIX_RANK": "4"}) == 4
    assert rank({"SLURM_PROCID": "2", "PMIX_RANK": "4"}) == 2
    assert rank({"PMI_RANK": "6", "SLURM_PROCID": "2"}) == 6
    assert rank({"OMPI_COMM_WORLD_RANK": "1", "PMI_RANK": "6"}) == 1
    assert rank({"FLUX_TASK_RANK": "3", "OMPI_COMM_WORLD_RANK": "1"}) == 3
    assert rank({"FLUX_TASK_RANK": "x", "PMIX_RANK": "5"}) == 5, "a non-number is skipped"


# ---- the kernel table ------------------------------------------------------------------------------


class PtrRange(ctypes.Structure):
    _fields_ = [("param", ctypes.c_uint32), ("offset", ctypes.c_uint32), ("length", ctypes.c_uint32)]


class Entry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("selected", ctypes.c_int), ("nparams", ctypes.c_uint32),
                ("nranges", ctypes.c_uint32), ("ranges", ctypes.POINTER(PtrRange)), ("nvars", ctypes.c_uint32),
                ("vars", ctypes.POINTER(ctypes.c_char_p)), ("no_rerun", ctypes.c_int), ("heap", ctypes.c_int)]


class Table(ctypes.Structure):
    _fields_ = [("n", ctypes.c_size_t), ("e", ctypes.POINTER(Entry))]


def parse_table(lib, text: str):
    t = Table()
    err = ctypes.create_string_buffer(256)
    rc = lib.mn_ktab_parse(ctypes.byref(t), text.encode(), err, 256)
    return rc, t, err.value.decode()


def test_kernel_table_round_trip(lib):
    text = ("# comment\n"
            "K\t_Z1bPfi\t1\t3\t0:0:8,2:4:4\tg_a,g_b\n"
            "K\t_Z1aPf\t0\t0\t-\t-\n")
    rc, t, err = parse_table(lib, text)
    assert rc == 0, err
    assert t.n == 2 and t.e[0].name == b"_Z1aPf" and t.e[1].name == b"_Z1bPfi", "sorted by name"
    lib.mn_ktab_find.restype = ctypes.POINTER(Entry)
    e = lib.mn_ktab_find(ctypes.byref(t), b"_Z1bPfi").contents
    assert (e.selected, e.nparams, e.nranges, e.nvars) == (1, 3, 2, 2)
    assert [(e.ranges[i].param, e.ranges[i].offset, e.ranges[i].length) for i in range(2)] == [(0, 0, 8), (2, 4, 4)]
    assert [e.vars[i] for i in range(2)] == [b"g_a", b"g_b"]
    assert not lib.mn_ktab_find(ctypes.byref(t), b"_Z1cv")
    lib.mn_ktab_free(ctypes.byref(t))


def test_kernel_table_device_state_column_stops_reruns_for_heap_and_printf(lib):
    """The optional 7th column: heap or printf means a timing rerun would change state no prologue restores."""
    text = "K\th\t1\t0\t-\t-\theap,launch\nK\tp\t1\t0\t-\t-\tprintf\nK\tl\t1\t0\t-\t-\tlaunch\nK\to\t1\t0\t-\t-\n"
    rc, t, err = parse_table(lib, text)
    assert rc == 0, err
    lib.mn_ktab_find.restype = ctypes.POINTER(Entry)
    got = {n: lib.mn_ktab_find(ctypes.byref(t), n.encode()).contents.no_rerun for n in "hplo"}
    assert got == {"h": 1, "p": 1, "l": 0, "o": 0}
    heap = {n: lib.mn_ktab_find(ctypes.byref(t), n.encode()).contents.heap for n in "hplo"}
    assert heap == {"h": 1, "p": 0, "l": 0, "o": 0}, "only a heap kernel stops every later kernel's reruns"
    lib.mn_ktab_free(ctypes.byref(t))


@pytest.mark.parametrize("line", [
    "K\tk\t1\t2\t5:0:8\t-",       # range names parameter 5 of 2
    "K\tk\t2\t1\t-\t-",           # selected must be 0/1
    "K\tk\t1\t1\t0:0\t-",         # range needs three numbers
    "K\tk\t1\t1\t0:0:0\t-",       # empty range
    "K\tk\t1\t1\t-",              # missing column
    "X\tk\t1\t1\t-\t-",
    "K\tk\t1\t1\t-\ta,,b",
    "K\tk\t1\t1\t-\t-\theap\textra",  # one column too many
])
def test_kernel_table_rejects_malformed_lines_with_the_line_number(lib, line):
    rc, t, err = parse_table(lib, "K\tok\t1\t0\t-\t-\n" + line + "\n")
    assert rc == -1 and "line 2" in err and t.n == 0


def test_kernel_table_written_by_python_is_read_by_c(lib, tmp_path):
    from mneme.record.kerneltable import table_text

    class FakeIndex:  # the table writer only needs kernels(), table_entry() and device_state() results
        def kernels(self):
            return ["_Z3fooPf1S", "_Z3barv"]

        def table_entry(self, name):
            assert name == "_Z3fooPf1S", "an unselected kernel needs its device state only"
            return 2, [(0, 0, 8), (1, 12, 4), (1, 16, 8)], ["g_x", "g_y"], ["printf"]

        def device_state(self, name):
            return ["heap"]

    import re

    text = table_text(FakeIndex(), re.compile("foo"))
    rc, t, err = parse_table(lib, text)
    assert rc == 0, err
    lib.mn_ktab_find.restype = ctypes.POINTER(Entry)
    foo = lib.mn_ktab_find(ctypes.byref(t), b"_Z3fooPf1S").contents
    bar = lib.mn_ktab_find(ctypes.byref(t), b"_Z3barv").contents
    assert (foo.selected, foo.nparams, foo.nranges, foo.nvars, foo.no_rerun) == (1, 2, 3, 2, 1)
    assert bar.selected == 0, "--kernels foo does not select bar"
    lib.mn_ktab_free(ctypes.byref(t))


# ---- JSON lines and the log ------------------------------------------------------------------------


def test_json_escape_keeps_any_name_valid(lib):
    buf = ctypes.create_string_buffer(256)
    s = 'a"b\\c\nd\te\x01\xff'.encode("latin-1")
    n = lib.mn_json_escape(buf, 256, s)
    assert n == len(buf.value)
    assert json.loads(b'"' + buf.value + b'"') == 'a"b\\c\nd\te\x01\xff'
    assert lib.mn_json_escape(buf, 4, b"abcdef") == ctypes.c_size_t(-1).value, "too small: refused, not cut"


LOG_WRITER = r"""
import ctypes, json, resource, signal, sys
lib = ctypes.CDLL(sys.argv[1])
class Log(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_int), ("failed", ctypes.c_int), ("err", ctypes.c_int), ("bytes", ctypes.c_uint64)]
class Line(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_char_p), ("len", ctypes.c_size_t), ("cap", ctypes.c_size_t),
                ("truncated", ctypes.c_int), ("first", ctypes.c_int)]
limit = int(sys.argv[3])
if limit:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
log = Log()
lib.mn_log_open(ctypes.byref(log), sys.argv[2].encode())
buf = ctypes.create_string_buffer(4096)
fails = 0
for i in range(50):
    l = Line()
    lib.mn_line_begin(ctypes.byref(l), buf, 4096, b"occ")
    lib.mn_line_u64(ctypes.byref(l), b"i", ctypes.c_uint64(i))
    lib.mn_line_i64(ctypes.byref(l), b"neg", ctypes.c_int64(-i - 9223372036854775000))
    lib.mn_line_hexaddr(ctypes.byref(l), b"addr", ctypes.c_uint64(0x153940000000 + i))
    lib.mn_line_hex(ctypes.byref(l), b"args", b"\x00\xff\x10", ctypes.c_size_t(3))
    lib.mn_line_str(ctypes.byref(l), b"name", "_Z3k\u00e9".encode())
    lib.mn_line_u64s(ctypes.byref(l), b"t", (ctypes.c_uint64 * 3)(i, 2**64 - 1, 0), ctypes.c_size_t(3))
    lib.mn_line_u32s(ctypes.byref(l), b"grid", (ctypes.c_uint32 * 3)(i + 1, 2**32 - 1, 7), ctypes.c_size_t(3))
    n = lib.mn_line_end(ctypes.byref(l))
    fails += lib.mn_log_write(ctypes.byref(log), buf, ctypes.c_size_t(n)) != 0
print(json.dumps({"failed": log.failed, "fails": fails, "bytes": log.bytes}))
"""


def test_log_lines_are_json_and_a_full_disk_marks_the_log_failed(built, tmp_path):
    def write(limit):
        path = tmp_path / f"log{limit}.jsonl"
        p = subprocess.run([sys.executable, "-c", LOG_WRITER, str(built / "libmnrec_test.so"), str(path), str(limit)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout), path.read_bytes()

    res, data = write(0)
    assert res == {"failed": 0, "fails": 0, "bytes": len(data)}
    events = [json.loads(x) for x in data.splitlines()]
    assert len(events) == 50 and events[3]["addr"] == hex(0x153940000003) and events[3]["args"] == "00ff10"
    assert events[3]["neg"] == -3 - 9223372036854775000 and events[3]["name"].encode("latin-1") == "_Z3k\u00e9".encode()
    assert events[3]["t"] == [3, 2**64 - 1, 0] and events[3]["grid"] == [4, 2**32 - 1, 7]  # both integer widths

    res, data = write(1000)  # a file-size limit stands in for a full disk
    assert res["failed"] == 1 and res["fails"] > 0, "the failure is noticed, the writer keeps running"
    assert len(data) == 1000 and not data.endswith(b"\n"), "the last line is cut: readers see a truncated log"
