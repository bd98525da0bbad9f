"""mneme apply's Nsight Compute timer without a GPU: the ncu command line and its kernel filter, ncu's CSV read
back, which entries need it (applied, never timed in-app: a kernel inside a CUDA graph), how the report picks
its times and wall times, the corpus stage's reading of the runs under ncu, and the error without ncu."""

import os
import re
import sys
from pathlib import Path

import pytest

from bench.corpus import applystage
from mneme.apply import ncutimer
from mneme.apply.evidence import build_report
from mneme.apply.manifest import Entry
from mneme.apply.runner import EntryStats, RunStats, untimed
from mneme.config import ExperimentConfiguration, dim3
from mnemetest import FIXTURES, run_mneme

K = "_Z6reducePfPdmm"
OTHER = "_Z11reduceFinalPdS_m"
HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_rows(*rows):
    """ncu --import --csv's layout: one line per launch and metric."""
    out = ["==PROF== Connected to process 7 (/w/app)", HEAD]
    for i, (name, block, grid, unit, value) in enumerate(rows):
        out.append(f'"{i}","7","app","127.0.0.1","{name}","1","13","{block}","{grid}","0","9.0",'
                   f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')
    return "\n".join(out) + "\n"


def test_the_app_runs_under_ncu_profiling_only_the_manifests_kernels(tmp_path):
    argv = ncutimer.wrap(["./app", "-n", "3"], [K, OTHER, K], tmp_path / "ncu-apply-0", "/opt/ncu")
    assert argv[0] == "/opt/ncu" and argv[-3:] == ["./app", "-n", "3"]
    assert argv[argv.index("--export") + 1] == str(tmp_path / "ncu-apply-0")
    assert argv[argv.index("--metrics") + 1] == "gpu__time_duration.sum"
    assert argv[argv.index("--kernel-name-base") + 1] == "mangled"
    assert argv[argv.index("--clock-control") + 1] == "none" and "--target-processes" in argv
    rx = re.compile(argv[argv.index("--kernel-name") + 1].removeprefix("regex:"))
    assert rx.match(K) and rx.match(OTHER) and not rx.match(K + "x") and not rx.match("_Z6vecAddPKfS0_Pfi")
    with pytest.raises(ValueError):
        ncutimer.wrap(["./app"], [], tmp_path / "r", "ncu")


def test_ncus_csv_is_read_per_launch_with_units_and_shapes():
    text = csv_rows((K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", "31,392"),
                    (K, "(256, 1, 1)", "(1024, 1, 1)", "usecond", "20.5"),
                    (OTHER, "(512, 1, 1)", "(1, 1, 1)", "nsecond", "3456"))
    rows = ncutimer.parse_csv("app output\n" + text)
    assert [r.ns for r in rows] == [31392.0, 20500.0, 3456.0]
    assert rows[1].grid == (1024, 1, 1) and rows[1].block == (256, 1, 1) and rows[2].kernel == OTHER
    assert ncutimer.samples(rows, K) == [31392.0, 20500.0]
    assert ncutimer.samples(rows, K, ((1024, 1, 1), (256, 1, 1))) == [20500.0]
    assert ncutimer.samples(rows, K, skip=1) == [20500.0]
    assert ncutimer.parse_csv("no report here") == []


def test_a_missing_report_says_why(tmp_path):
    rows, why = ncutimer.read_report(tmp_path / "ncu-observe-0", "ncu")
    assert rows == [] and "ncu wrote no report" in why and "ncu-observe-0.ncu-rep" in why


def entry(tuned_block=(256, 1, 1), tuned_grid=(1024, 1, 1)) -> Entry:
    return Entry(kernel=K, cubin="k.cubin", rule="exact", rec_grid=dim3(512, 1, 1), rec_block=dim3(512, 1, 1),
                 rec_shared=0, tuned=ExperimentConfiguration(grid=dim3(*tuned_grid), block=dim3(*tuned_block)),
                 demangled="reduce(float*, double*, unsigned long, unsigned long)", expected_speedup=1.5)


def runs(obs_samples, app_samples, applied=3, wall=(1.0, 0.9), timer="events", rows=((), ())):
    o = RunStats("observe", 0, wall[0], {0: EntryStats(matched=applied, samples=list(obs_samples))}, timer=timer,
                 ncu_rows=list(rows[0]))
    a = RunStats("apply", 0, wall[1], {0: EntryStats(matched=applied, applied=applied, samples=list(app_samples))},
                 timer=timer, ncu_rows=list(rows[1]))
    return {"observe": o, "apply": a}


def test_only_an_applied_kernel_never_timed_in_app_needs_ncu():
    assert untimed([runs([30000], [20000])]) == []
    assert untimed([runs([], [])]) == [0]  # launched inside a graph: matched and applied, no sample
    assert untimed([runs([30000], [])]) == [0]  # timed where it ran alone, but its tuned launches were not
    assert untimed([runs([], [], applied=0)]) == []  # not applied: nothing to time


def test_the_report_takes_ncus_times_for_the_graph_kernel_and_wall_times_from_event_runs():
    obs = ncutimer.parse_csv(csv_rows(*[(K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", v) for v in (30000, 31000, 32000)]))
    # the applied run: the tuned shape, plus a launch of the recorded shape (another instance, not swapped)
    app = ncutimer.parse_csv(csv_rows(*[(K, "(256, 1, 1)", "(1024, 1, 1)", "nsecond", v) for v in (20000, 21000)],
                                      (K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", 99999)))
    rounds = [runs([], [], wall=(1.0, 0.8)), runs([], [], wall=(9.0, 9.5), timer="ncu", rows=(obs, app))]
    rep = build_report([entry()], rounds, {})
    (k,) = rep.kernels
    assert k.timer == "ncu" and k.original_ns == 31000 and k.tuned_ns == 20500
    assert k.realized == pytest.approx(31000 / 20500) and k.gain_ratio == pytest.approx((31000 / 20500 - 1) / 0.5)
    assert k.applied == 3 and k.matched == 3  # counted from the in-app runs, not again from the one under ncu
    assert rep.wall_original_s == 1.0 and rep.wall_applied_s == 0.8  # ncu's slow runs are not wall time
    assert rep.returncodes == {"observe": [0, 0], "apply": [0, 0]}
    lines = "\n".join(rep.lines())
    assert "in-app (ncu) 31.00 us -> 20.50 us" in lines and "not timed" not in lines
    # with no run under ncu, the report says why there is no figure and how to get one
    rep = build_report([entry()], rounds[:1], {})
    assert rep.kernels[0].realized is None and rep.kernels[0].timer == ""
    assert "inside a CUDA graph" in "\n".join(rep.lines()) and "--timer ncu" in "\n".join(rep.lines())
    # the in-app timer's figures win where it has them
    rep = build_report([entry()], [runs([40000], [30000]), rounds[1]], {})
    assert rep.kernels[0].timer == "events" and rep.kernels[0].realized == pytest.approx(40000 / 30000)


def test_checked_launches_are_left_out_of_ncus_applied_times():
    obs = ncutimer.parse_csv(csv_rows((K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", 30000)))
    # same shape tuned (a compiler knob): a checked launch runs original and tuned back to back
    app = ncutimer.parse_csv(csv_rows(*[(K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", v) for v in (30000, 20000, 20000)]))
    r = runs([], [], timer="ncu", rows=(obs, app))
    r["apply"].entries[0].checked = 1
    rep = build_report([entry((512, 1, 1), (512, 1, 1))], [r], {})
    assert rep.kernels[0].tuned_ns == 20000 and rep.kernels[0].timer == "ncu"


def test_runs_under_ncu_alone_count_the_tuned_launches_ncu_timed():
    """--timer ncu on the H200 (simpleCudaGraphs, graphMemoryNodes): ncu launched the graphs' nodes itself, so
    libapply's counters said 0 matched, 0 applied, and the campaign row said 0 kernels applied although ncu timed
    the tuned code (29.9 -> 24.1 us)."""
    obs = ncutimer.parse_csv(csv_rows(*[(K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", v) for v in (30000, 31000)]))
    app = ncutimer.parse_csv(csv_rows(*[(K, "(256, 1, 1)", "(1024, 1, 1)", "nsecond", v) for v in (20000, 21000)]))
    rep = build_report([entry()], [runs([], [], applied=0, timer="ncu", rows=(obs, app))], {})
    (k,) = rep.kernels
    assert (k.applied, k.matched, k.timer) == (2, 2, "ncu") and rep.kernels_applied == 1
    assert rep.wall_speedup is None, "runs under ncu are no wall time"
    # the tuned shape is the recorded one: ncu's rows cannot tell swapped launches from launches libapply never saw
    # (simpleCudaGraphs on the H200: 6 of 12 were the original code), so nothing is counted from them
    same = ncutimer.parse_csv(csv_rows(*[(K, "(512, 1, 1)", "(512, 1, 1)", "nsecond", v) for v in (31000, 19000)]))
    rep = build_report([entry((512, 1, 1), (512, 1, 1))], [runs([], [], applied=0, timer="ncu", rows=(obs, same))], {})
    assert rep.kernels[0].applied == 0


def test_the_corpus_stage_reads_the_runs_under_ncu_as_runs():
    out = ("mneme apply: [observe run 1] ./a\nok A\nmneme apply: [apply run 1] ./a\nok B\n"
           "mneme apply: [observe run 2, under ncu] ./a\n==PROF== x\nok C\nmneme apply: [apply run 2, under ncu] ./a\nok D\n"
           "apply reduce: exact instance ...\n")
    runs_ = applystage.split_runs(out, {"entries": [{"demangled": "reduce(float*)"}]})
    assert runs_[("observe", 2)] == "==PROF== x\nok C\n" and runs_[("apply", 2)] == "ok D\n"


def test_timer_ncu_without_ncu_names_the_way_out(tmp_path, monkeypatch):
    db = next((FIXTURES / "vecadd").glob("[0-9a-f]*.json"))
    out = tmp_path / "tune"
    run_mneme("tune", "-rdb", db, "--space", "quick", "--devices", "none", "--objective", "registers", "--trials", 2,
              "-o", out, "--quiet", "--seed", "1", "--no-track")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_PATH"}
    env.update(PATH=str(Path(sys.executable).parent) + ":/usr/bin:/bin", CUDA_HOME=str(tmp_path / "nocuda"))
    if ncutimer.find_ncu() and Path(ncutimer.find_ncu()).parent == Path("/usr/local/cuda/bin"):
        pytest.skip("ncu is installed in /usr/local/cuda/bin here")
    p = run_mneme("apply", out, "--timer", "ncu", "--workdir", tmp_path / "wd", "--quiet", "--", sys.executable, "-c",
                  "print(1)", env=env, check=False)
    assert p.returncode == 2 and "ncu" in p.stderr and "--timer events" in p.stderr
