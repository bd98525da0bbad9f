"""librecord's CUDA graphs (native/recorder/graph.c) without a GPU: a probe (tests/data/graph/probe.c) builds
graphs against a stand-in driver (tests/data/graph/fake_libcuda.c, whose kernels run on the host), through
librecord's wrapped cuGetProcAddress as a CUDA runtime would, and the fake's call log shows what the recorder
made the driver do:

- graph A (kernel, memcpy, kernel, host nodes; the source graph destroyed after instantiating, the fake
  answers cuGraphGetNodes in reverse order): its first launch runs node by node in a topological order,
  each kernel launched with the graph's argument bytes and recorded; the next launches are the real
  cuGraphLaunch; after cuGraphExecKernelNodeSetParams it runs node by node once more (the new instance);
- graph B (stream capture): the captured kernel is not run at capture, it is recorded at the first launch;
- graph C (a memory allocation node): always the real launch, its kernel counted as graph_opaque with the
  reason in a "graph" event.
The app's results equal the host-computed ones whichever way the graphs ran. The GPU side:
tests/gpu/test_record_examples.py (examples/graph.cu, examples/graphupdate.cu)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Dict, List

import pytest

from mnemetest import cc, run_mneme

DATA = Path(__file__).resolve().parent / "data" / "graph"
N = 64


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("graph")
    (d / "fake").mkdir()
    cc("-fPIC", "-shared", "-o", str(d / "fake" / "libcuda.so.1"), str(DATA / "fake_libcuda.c"))
    cc("-o", str(d / "probe"), str(DATA / "probe.c"), "-ldl")
    cc("-o", str(d / "direct"), str(DATA / "direct.c"), "-ldl")
    return d


def run_probe(built: Path, tmp_path: Path, record: bool = True, wrap=(), **extra_env: str) -> tuple:
    from mneme.record.runner import find_librecord

    raw, calls = tmp_path / "raw", tmp_path / "calls.log"
    raw.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(find_librecord()), FAKE_LOG=str(calls))
    if record:
        env.update(MNEME_RECORD_DIR=str(raw), MNEME_VA_BYTES=str(64 << 20), MNEME_HOST_BYTES=str(16 << 20),
                   MNEME_RETIME="0")
    env.update(extra_env)
    p = subprocess.run([*wrap, str(built / "probe")], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    out = dict(kv.split("=") for kv in p.stdout.split())
    assert out["bad"] == "0" and out["host_calls"] == "8", p.stdout  # the app computed what it should
    return out, phases(calls.read_text()), raw, p.stderr


def phases(log: str) -> Dict[str, List[str]]:
    """The fake's calls between the probe's marks: {"A0": [...], ...}."""
    out: Dict[str, List[str]] = {"start": []}
    cur = "start"
    for line in log.splitlines():
        if line.startswith("mark "):
            cur = line[5:]
            out[cur] = []
        else:
            out[cur].append(line)
    return out


def args(ptr: str, value: float) -> str:
    return struct.pack("<Qfi", int(ptr), value, N).hex()


def launch(kernel: str, ptr: str, value: float) -> str:
    return f"launch {kernel} grid=1 block={N} args={args(ptr, value)}"


SCALE, OFFSET = "_Z5scalePffi", "_Z6offsetPffi"


def test_graph_kernels_are_recorded_node_by_node_then_launched_whole(built, tmp_path):
    from mneme.record.rawlog import read_log

    out, calls, raw, _ = run_probe(built, tmp_path)
    x, y, z, w = out["x"], out["y"], out["z"], out["w"]
    # first launch: node by node, dependencies respected though cuGraphGetNodes answered in reverse
    assert calls["A0"] == [launch(SCALE, x, 2.0), f"memcpy3d bytes={4 * N}", launch(OFFSET, y, 1.0), "host_func"]
    # nothing new to record: the driver's own launch
    assert calls["A1"] == calls["A2"] == ["graph_launch nodes=4"]
    # after the exec update: node by node again, with the new argument bytes
    assert calls["update"] == ["exec_kernel_set"]
    assert calls["A3"] == [launch(SCALE, x, 2.0), f"memcpy3d bytes={4 * N}", launch(OFFSET, y, 5.0), "host_func"]
    assert calls["A4"] == ["graph_launch nodes=4"]
    # cuGraphExecUpdate from another graph of the same shape: its arguments, node by node once
    assert calls["execupdate"] == ["exec_update", "graph_destroy"]
    assert calls["A5"] == [launch(SCALE, x, 3.0), f"memcpy3d bytes={4 * N}", launch(OFFSET, y, 7.0), "host_func"]
    assert calls["A6"] == ["graph_launch nodes=4"]
    # a node handle of the original graph still names its node after the update
    assert calls["update2"] == ["exec_kernel_set"]
    assert calls["A7"] == [launch(SCALE, x, 3.0), f"memcpy3d bytes={4 * N}", launch(OFFSET, y, 9.0), "host_func",
                           "exec_destroy"]
    # captured: not run at capture, run through the recorder at the first launch (counted into scale(x, 3))
    assert calls["capture"] == ["begin_capture", f"captured {SCALE}", "end_capture", "instantiate exec=2 nodes=1",
                                "graph_destroy"]
    assert calls["B0"] == [launch(SCALE, z, 3.0)] and calls["B1"] == ["graph_launch nodes=1", "exec_destroy",
                                                                  "instantiate exec=3 nodes=2", "graph_destroy"]
    # a memory allocation node: never run node by node
    assert calls["C0"] == ["graph_launch nodes=2"] and calls["C1"] == ["graph_launch nodes=2", "exec_destroy"]

    (path,) = raw.glob("r0-p*.jsonl")
    log = read_log(path)
    assert log.exit is not None and log.complete and not log.errors, log.errors
    # pointers are masked from the instance key: graph B's scale(z, 3) is graph A's scale(x, 3) again
    assert len(log.instances) == 6
    events = [json.loads(line) for line in path.read_text().splitlines()]
    recorded = sorted((log.kernels[e["k"]], e["args"]) for e in events if e["ev"] == "inst")
    assert recorded == sorted([(SCALE, args(x, 2.0)), (OFFSET, args(y, 1.0)), (OFFSET, args(y, 5.0)),
                               (SCALE, args(x, 3.0)), (OFFSET, args(y, 7.0)), (OFFSET, args(y, 9.0))])
    for e in events:
        if e["ev"] == "inst":
            assert (raw / e["pro"]).exists() and (raw / e["epi"]).exists()
    # every launch counted once: scale 8 (graph A) + 2 (graph B), all recorded or counted into an instance;
    # offset 8 in graph A, 2 in graph C (not recordable, by name)
    scale, offset = log.stats[SCALE], log.stats[OFFSET]
    assert (scale.launches, scale.recorded_launches, scale.instances, scale.skips) == (10, 10, 2, {})
    assert (offset.launches, offset.recorded_launches, offset.instances) == (10, 8, 4)
    assert offset.skips == {"graph_opaque": 2}
    assert log.unsupported == {OFFSET: ["graph_opaque"]}
    occ: Dict[int, int] = {e["i"]: 1 for e in events if e["ev"] == "inst"}  # "occ" events come with more
    for e in events:
        if e["ev"] == "occ":
            occ[e["i"]] = max(occ.get(e["i"], 0), e["n"])
    by_args = {e["args"]: e["i"] for e in events if e["ev"] == "inst"}
    assert occ[by_args[args(x, 2.0)]] == 5 and occ[by_args[args(y, 1.0)]] == 3 and occ[by_args[args(y, 5.0)]] == 2
    assert occ[by_args[args(x, 3.0)]] == 3 + 2 and occ[by_args[args(y, 7.0)]] == 2 and occ[by_args[args(y, 9.0)]] == 1
    graphs = [e for e in events if e["ev"] == "graph"]
    assert [(g["at"], g["nodes"], g["kernels"]) for g in graphs] == [("instantiate", 4, 2), ("update", 4, 2),
                                                                    ("instantiate", 1, 1), ("instantiate", 2, 1)]
    assert not [g for g in graphs[:3] if "why" in g]
    assert graphs[3]["why"] == "the graph has a memory allocation node"

    # what `mneme record` shows while the app runs
    from mneme.record.runner import Progress

    shown = io.StringIO()
    Progress(raw, shown, lambda n: n).poll()
    text = shown.getvalue()
    assert text.count("mneme record: recorded ") == 6, text
    assert ("mneme record: a CUDA graph (2 nodes) is launched whole, not node by node: the graph has a memory "
            "allocation node; its kernels are not recorded") in text
    assert f"{OFFSET}: launched in a CUDA graph the recorder cannot run node by node" in text


def test_the_dbs_count_every_launch_of_a_graph(built, tmp_path):
    """Through `mneme record`: the instances' occurrences and the launches reported, in the record DB."""
    from mneme.record.db import RecordedExecution, find_dbs

    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), FAKE_LOG=str(tmp_path / "calls.log"))
    p = run_mneme("record", "-rdb", tmp_path / "db", "--va-size", "0.0625", "--retime", "0", "--", built / "probe",
                  env=env)
    assert "bad=0" in p.stdout, p.stdout
    dbs = {r.kernel_name: r for r in (RecordedExecution.from_json(f, check_files=False) for f in find_dbs(str(tmp_path / "db")))}
    scale, offset = dbs[SCALE], dbs[OFFSET]
    assert sorted(i.occ for i in scale.values()) == [5, 5]
    assert sorted(i.occ for i in offset.values()) == [1, 2, 2, 3]
    assert not scale.extra.get("UnsupportedLaunches") and offset.extra["UnsupportedLaunches"] == {"graph_opaque": 2}
    assert "2 launched in a CUDA graph the recorder cannot run node by node" in p.stdout, p.stdout


def test_a_kernel_reading_a_graphs_allocation_outside_the_graph_is_reported_not_recorded_without_it(built,
                                                                                                    tmp_path):
    """cuda-samples graphMemoryNodes: validateGPU, a stream launch, reads memory a graph's allocation node
    allocated. That memory is the driver's and not snapshotted; recorded without it, the replay faulted
    (illegal address, H200). The recorder notes each allocation node's range at instantiation."""
    from mneme.record.rawlog import read_log

    out, calls, raw, _ = run_probe(built, tmp_path, PROBE_GRAPHMEM="1")
    gm = out["graphmem"]
    assert calls["graphmem"] == [launch(SCALE, gm, 4.0)], calls["graphmem"]  # the app's launch still runs
    (path,) = raw.glob("r0-p*.jsonl")
    log = read_log(path)
    assert log.complete and not log.errors, log.errors
    events = [json.loads(line) for line in path.read_text().splitlines()]
    (inst,) = [e for e in events if e["ev"] == "inst" and e["args"] == args(gm, 4.0)]
    assert inst["foreign"] == [[0, 4]], inst  # argument offset 0, kind 4: a graph's memory

    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), FAKE_LOG=str(tmp_path / "calls2.log"), PROBE_GRAPHMEM="1")
    p = run_mneme("record", "-rdb", tmp_path / "db", "--va-size", "0.0625", "--retime", "0", "--", built / "probe",
                  env=env)
    assert "bad=0" in p.stdout, p.stdout
    assert ("argument 0 points into memory a CUDA graph's memory allocation node allocated (cudaGraphAddMemAllocNode"
            in p.stdout + p.stderr), p.stdout + p.stderr


def test_without_recording_the_graphs_are_the_drivers(built, tmp_path):
    _, calls, raw, _ = run_probe(built, tmp_path, record=False)
    assert calls["A0"] == ["graph_launch nodes=4"] and calls["B0"] == ["graph_launch nodes=1"]
    assert not list(raw.iterdir())


@pytest.mark.skipif(not shutil.which("valgrind"), reason="needs valgrind")
def test_plans_are_freed_and_memory_is_read_only_where_valid(built, tmp_path):
    _, _, _, err = run_probe(built, tmp_path, wrap=("valgrind", "--leak-check=full", "--show-leak-kinds=all",
                                                     "--error-exitcode=9"))
    assert re.search(r"ERROR SUMMARY: 0 errors", err), err[-4000:]
    # whatever stays allocated at exit (the recorder's kernels and instances) was not allocated by graph.c
    # itself: every plan was freed with its exec
    records = err.split("in loss record")[1:]
    assert records, err[-4000:]
    allocators = [re.findall(r"by 0x[0-9A-F]+: (\S+) \(([^)]*)\)", r)[:1] for r in records]
    assert not [a for a in allocators if a and a[0][1].startswith("graph.c")], err[-6000:]


def run_direct(built: Path, tmp_path: Path, *steps: str, table: str = "", retime: int = 0) -> tuple:
    """tests/data/graph/direct.c's steps under librecord: (the raw log's events, the fake's launch lines)."""
    raw, calls = tmp_path / "raw", tmp_path / "calls.log"
    raw.mkdir(parents=True)
    from mneme.record.runner import find_librecord

    env = {k: v for k, v in os.environ.items() if not k.startswith("MNEME_") and k != "LD_PRELOAD"}
    env.update(LD_LIBRARY_PATH=str(built / "fake"), LD_PRELOAD=str(find_librecord()), FAKE_LOG=str(calls),
               MNEME_RECORD_DIR=str(raw), MNEME_VA_BYTES=str(64 << 20), MNEME_RETIME=str(retime),
               MNEME_RECORD_HOLD="0")
    if table:
        (tmp_path / "kernels.tsv").write_text(table)
        env["MNEME_KERNEL_TABLE"] = str(tmp_path / "kernels.tsv")
    p = subprocess.run([str(built / "direct"), *steps], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "direct done" in p.stdout, p.stdout + p.stderr
    (path,) = raw.glob("r0-p*.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return events, [line for line in calls.read_text().splitlines() if line.startswith("launch ")]


def table(scale_state: str) -> str:
    return "".join(f"K\t{name}\t1\t3\t0:0:8\t-\t{state}\n" for name, state in ((SCALE, scale_state), (OFFSET, "-")))


def test_no_kernel_is_rerun_after_the_first_launch_of_a_heap_kernel(built, tmp_path):
    """devheap on the H200: heapSum, launched after heapFill (DeviceState heap), was rerun 10 times for timing.
    The heap kernel's table entry was looked up only after the heap check of its first launch."""
    events, launches = run_direct(built, tmp_path / "heap", "s:2:64", "o:1:64", table=table("heap"), retime=3)
    insts = {e["k"]: e for e in events if e["ev"] == "inst"}
    kernels = {e["name"]: e["k"] for e in events if e["ev"] == "kernel"}
    assert not insts[kernels[OFFSET]].get("rt") and not insts[kernels[SCALE]].get("rt"), insts
    assert [line.split()[1] for line in launches] == [SCALE, OFFSET], "each kernel ran once: no reruns"
    # without the heap kernel, offset is rerun as asked (the check above can fail)
    events, launches = run_direct(built, tmp_path / "noheap", "s:2:64", "o:1:64", table=table("-"), retime=3)
    assert [line.split()[1] for line in launches] == [SCALE] * 4 + [OFFSET] * 4
    assert all(len(e["rt"]) == 3 for e in events if e["ev"] == "inst")


def test_a_captured_graph_launched_once_after_direct_launches_is_an_instance_of_its_own(built, tmp_path):
    """record_smoke's step 5 (tests/gpu/data/record_smoke.cu) on the stand-in driver: after direct launches
    of the kernel and a pinned allocation, one launch captured into a graph, instantiated through
    "cuGraphInstantiate" at 12000 (cuGraphInstantiateWithFlags' ABI), launched once: recorded at that launch
    as its own instance (other scalar), the direct launches' instance counted apart."""
    from mneme.record.rawlog import read_log

    events, launches = run_direct(built, tmp_path, "host", "s:1:4096", "g:0.5:4096", "s:1:4096")
    assert len(launches) == 3, "each launch ran once"
    insts = [e for e in events if e["ev"] == "inst"]
    assert sorted(struct.unpack("<f", bytes.fromhex(e["args"])[8:12])[0] for e in insts) == [0.5, 1.0], insts
    assert all(e["ptr"] == [[0, 8]] for e in insts), "x is a pointer, (a, n) are not"
    graphs = [e for e in events if e["ev"] == "graph"]
    assert [(g["at"], g["nodes"], g["kernels"], "why" in g) for g in graphs] == [("instantiate", 1, 1, False)]
    (path,) = (tmp_path / "raw").glob("r0-p*.jsonl")
    log = read_log(path)
    assert sorted(i.occurrences for i in log.instances.values()) == [1, 2]
    assert log.stats[SCALE].launches == 3 and log.stats[SCALE].skips == {}
