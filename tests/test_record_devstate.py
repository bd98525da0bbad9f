"""Device state a kernel's IR closure touches beyond its arguments and variables (mneme.record.kerneltable
.device_state): the device heap, printf, device-side launches; and the replay note that names the kernels
of a recording that allocate from the heap (mneme.replay.devstate)."""

import json
from pathlib import Path
from typing import List

import pytest
from irutil import bc_dir, compile_cu  # noqa: F401  (fixtures)

from mneme.ir.link import extract_kernel_closure
from mneme.record.kerneltable import device_state
from mneme.replay.devstate import failure_notes, heap_kernels, with_notes

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def states(src: str, bc_dir: Path, rdc: bool = False) -> dict:
    from mneme.ir.module import module_kernels, parse_module

    bc = compile_cu(EXAMPLES / src, bc_dir, rdc=rdc, extra=[f"-I{EXAMPLES}"]).read_bytes()
    out = {}
    for k in module_kernels(parse_module(bc)):
        mod, _ = extract_kernel_closure([(src, bc)], k)
        out[k.split("P")[0]] = device_state(str(mod))
    return out


def test_heap_kernels_are_told_from_their_readers(bc_dir):
    got = states("devheap.cu", bc_dir)
    # the reader of the heap tables does not allocate: its own IR cannot say it reads the heap
    assert got == {"_Z8heapFill": ["heap"], "_Z7heapSum": [], "_Z8heapFree": ["heap"]}


def test_device_side_launches_and_printf(bc_dir, tmp_path):
    got = states("dynpar.cu", bc_dir, rdc=True)
    assert got["_Z10launchRows"] == ["launch"] and got["_Z8scaleRow"] == []
    src = tmp_path / "printing.cu"
    src.write_text('#include <cstdio>\n__global__ void say(int v) { printf("%d\\n", v); }\n')
    from mneme.ir.module import parse_module

    mod = parse_module(compile_cu(src, bc_dir).read_bytes())
    assert device_state(str(mod)) == ["printf"]


def test_replay_failures_name_the_recordings_heap_kernels(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"StaticHash": "a", "DemangledName": "heapFill(float**)",
                                                 "DeviceState": ["heap"]}))
    (tmp_path / "b.json").write_text(json.dumps({"StaticHash": "b", "DemangledName": "heapSum(float**)",
                                                 "DeviceState": []}))
    (tmp_path / "c.json").write_text("not json")
    assert heap_kernels(str(tmp_path / "b.json")) == ["heapFill(float**)"]
    assert heap_kernels(str(tmp_path / "nothere" / "x.json")) == []


def test_a_failed_replays_error_opens_with_the_device_state_that_explains_it(tmp_path):
    """devheap on the H200: heapFill's failed verification (a per-buffer diff of some 700 characters) had its
    heap note appended last, and the GPU test's 500-character cut (and `mneme track`'s first line) lost it."""
    from mneme.record.db import RecordedExecution

    def rec(name: str, state: List[str]) -> RecordedExecution:
        return RecordedExecution("s", name, name, [], [], [], "0x0", 0, {}, extra={"DeviceState": state})

    (tmp_path / "fill.json").write_text(json.dumps({"StaticHash": "f", "DemangledName": "heapFill(float**)",
                                                    "DeviceState": ["heap"]}))
    verdict = "not verified: 1 buffer(s) differ (3 buffers)\n" + "\n".join(f"  FAIL blob {i}: " + "x" * 120
                                                                           for i in range(6))
    fill = with_notes(verdict, failure_notes(rec("heapFill", ["heap"]), str(tmp_path / "fill.json"), {}))
    assert "allocates from the device heap" in fill.splitlines()[0] and fill.endswith(verdict)
    total = with_notes(verdict, failure_notes(rec("heapSum", []), str(tmp_path / "sum.json"), {}))
    assert "heapFill(float**)" in total[:500] and "device heap" in total.splitlines()[0]
    limits = with_notes("", failure_notes(rec("k", []), str(tmp_path / "nothere" / "k.json"), {"stack_size": "refused"}))
    assert limits == "context limit stack_size: refused"
    assert with_notes(verdict, []) == verdict


def test_function_pointer_arguments_and_tables_are_found(bc_dir):
    from mneme.ir.module import module_kernels, parse_module
    from mneme.record.kerneltable import function_pointer_calls

    bc = compile_cu(EXAMPLES / "devfnptr.cu", bc_dir, extra=[f"-I{EXAMPLES}"]).read_bytes()
    got = {}
    for k in module_kernels(parse_module(bc)):
        mod, _ = extract_kernel_closure([("devfnptr.cu", bc)], k)
        got[k.split("P")[0]] = function_pointer_calls(mod, k)
    assert got == {"_Z7applyFn": ([1], False), "_Z10applyTable": ([], True), "_Z12applyVirtual": ([], True)}
    plain = extract_kernel_closure([("devheap.cu", compile_cu(EXAMPLES / "devheap.cu", bc_dir,
                                                               extra=[f"-I{EXAMPLES}"]).read_bytes())],
                                   "_Z7heapSumPKPfS_i")[0]
    assert function_pointer_calls(plain, "_Z7heapSumPKPfS_i") == ([], False)


def test_a_function_pointer_argument_is_replayable_where_a_code_table_names_the_functions():
    from mneme.record.kerneltable import KernelIR
    from mneme.record.postprocess import _KernelRun, _replay_reasons

    ir = KernelIR("_Z7applyFnPfPFffEi", "applyFn", "0" * 64, ["devfnptr.cu"], b"", ["v", "f", "n"],
                  ["ptr", "ptr", "int"], [False, False, True], [], [], False, fnptr_params=[1])
    (reason,) = _replay_reasons(ir, _KernelRun(ir.name), [])
    assert reason.startswith("argument 1 (f) is a device function pointer") and "no variable" in reason
    ir.code_tables = ["d_twice"]  # replay pairs the app's address with its module's through d_twice
    assert _replay_reasons(ir, _KernelRun(ir.name), []) == []
    ir.fnptr_params, ir.code_tables = [], []
    assert _replay_reasons(ir, _KernelRun(ir.name), []) == []


def test_devfnptrs_closures_carry_the_tables_that_relocate_their_pointers(bc_dir):
    import hashlib

    from mneme.cc.embedded import EmbeddedModule
    from mneme.record.kerneltable import IRIndex

    bc = compile_cu(EXAMPLES / "devfnptr.cu", bc_dir, extra=[f"-I{EXAMPLES}"]).read_bytes()
    sha = hashlib.sha256(bc).hexdigest()
    index = IRIndex()
    index.modules[sha] = EmbeddedModule(name="devfnptr.cu", source="devfnptr.cu", arch="sm_90", sha256=sha, bitcode=bc)
    for k in ("_Z7applyFnPfPFffEi", "_Z10applyTablePfii", "_Z12applyVirtualPfi"):
        index.defined_in[k] = [sha]
    tables = ["d_table", "d_twice"]
    assert sorted(index.table_entry("_Z7applyFnPfPFffEi")[2]) == tables
    fn, table = index.closure("_Z7applyFnPfPFffEi"), index.closure("_Z10applyTablePfii")
    assert fn.fnptr_params == [1] and fn.code_tables == tables
    assert "d_twice" in fn.variables, "the recorder snapshots the pointer variable the host read"
    assert table.code_tables == tables and "fnptr" in table.state
    # the recorder's kernel table (asked above, before any closure existed) named the same variables
    assert sorted(fn.variables) == tables
    # the vtables (linkonce) stay with the kernel that constructs their objects, not with every caller
    virt = index.closure("_Z12applyVirtualPfi")
    assert virt.code_tables == ["_ZTV2Op", "_ZTV4Half"] + tables and "fnptr" in virt.state
    assert sorted(index.table_entry("_Z12applyVirtualPfi")[2]) == sorted(virt.variables)


def test_unselected_rdc_kernels_get_their_device_state_without_a_closure(bc_dir, tmp_path):
    """The table gives unselected kernels their device state only; in a relocatable-device-code app a kernel
    whose heap use is in another translation unit must still be told, from the modules' reference graphs
    (IRIndex.device_state), as its linked closure says — without linking that closure."""
    import hashlib

    from mneme.cc.embedded import EmbeddedModule
    from mneme.record.kerneltable import IRIndex, compile_selector, table_text

    (tmp_path / "alloc.cu").write_text(
        "__device__ float *grab(int n) { return (float *)malloc(n * sizeof(float)); }\n"
        "__device__ float twice(float x) { return 2 * x; }\n")
    (tmp_path / "use.cu").write_text(
        "__device__ float *grab(int n);\n__device__ float twice(float x);\n"
        "__global__ void take(float **out, int n) { out[threadIdx.x] = grab(n); }\n"
        "__global__ void scale(float *x) { x[threadIdx.x] = twice(x[threadIdx.x]); }\n"
        "__global__ void alone(float *x) { x[threadIdx.x] += 1; }\n")
    index = IRIndex()
    for src in ("alloc.cu", "use.cu"):
        bc = compile_cu(tmp_path / src, bc_dir, rdc=True).read_bytes()
        sha = hashlib.sha256(bc).hexdigest()
        index.modules[sha] = EmbeddedModule(name=src, source=str(tmp_path / src), arch="sm_90", sha256=sha, bitcode=bc)
        if src == "use.cu":
            for k in ("_Z4takePPfi", "_Z5scalePf", "_Z5alonePf"):
                index.defined_in[k] = [sha]
    got = {k: index.device_state(k) for k in index.kernels()}
    assert got == {"_Z4takePPfi": ["heap"], "_Z5scalePf": [], "_Z5alonePf": []}
    assert not index._closures, "no closure was linked for the device state"
    closures = IRIndex()
    closures.modules, closures.defined_in = index.modules, index.defined_in
    assert {k: [s for s in closures.closure(k).state if s != "fnptr"] for k in got} == got
    table = table_text(index, compile_selector("alone"))
    assert "K\t_Z4takePPfi\t0\t0\t-\t-\theap\n" in table and "K\t_Z5scalePf\t0\t0\t-\t-\t-\n" in table
