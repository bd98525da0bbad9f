"""The corpus campaign's CPU parts (bench/corpus): apps.tsv, the stage runner's budget and subsets, the
build stage on real corpus programs with a real CUDA compiler, the GPU stages' command lines checked
against the real `mneme` CLI on the committed fixtures, the parsers of mneme's and ncu's outputs, and
merge/render/schema on synthetic stage results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.corpus import apps as capps  # noqa: E402
from bench.corpus import build, gpu, merge, render, schema, stage  # noqa: E402
from bench.corpus import tune as ctune  # noqa: E402
from bench.corpus.apps import App  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
CORPUS = capps.DEFAULT_CORPUS
needs_corpus = pytest.mark.skipif(not (CORPUS / "apps.tsv").is_file(), reason=f"no corpus at {CORPUS}")
_VENV_NVCC = Path(sys.executable).parent / "mneme-nvcc"
NVCC = (os.environ.get("MNEME_CORPUS_NVCC") or shutil.which("mneme-nvcc")
        or (str(_VENV_NVCC) if _VENV_NVCC.exists() else None) or shutil.which("nvcc"))
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no CUDA compiler on PATH")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


# ---- apps.tsv ------------------------------------------------------------------------------------

@needs_corpus
def test_load_reads_every_program_with_its_checks():
    apps = capps.load(CORPUS)
    names = [a.name for a in apps]
    assert len(apps) == len(set(names)) >= 20
    gm = next(a for a in apps if a.name == "graphMemoryNodes")
    assert gm.success_ok(0, "Validation PASSED!\n" * 6)
    assert not gm.success_ok(0, "Validation PASSED!\n" * 5)
    assert not gm.success_ok(1, "Validation PASSED!\n" * 6)
    nw = next(a for a in apps if a.name == "nw")
    assert nw.argv == ["2048", "10"] and nw.success_ok(0, "") and not nw.success_ok(2, "")
    assert "cmake" in next(a for a in apps if a.name == "inlinePTX").features


@needs_corpus
def test_select_keeps_corpus_order_and_rejects_unknown_names():
    apps = capps.load(CORPUS)
    sel = capps.select(apps, capps.parse_names("nw,inlinePTX"))
    assert [a.name for a in sel] == [a.name for a in apps if a.name in ("nw", "inlinePTX")]
    assert capps.select(apps, capps.parse_names("all")) == apps
    with pytest.raises(capps.CorpusError, match="nosuchapp"):
        capps.select(apps, ["nw", "nosuchapp"])


def test_load_names_the_file_when_the_corpus_is_missing(tmp_path):
    with pytest.raises(capps.CorpusError, match=str(tmp_path / "apps.tsv")):
        capps.load(tmp_path)


def test_build_script_sets_only_compiler_and_arch_as_the_shell_expands_them(tmp_path):
    app = App("x", ".", 'printf "%s|%s" "$NVCC" sm_$CUDA_ARCH; env | grep -c "^NVCC=" || true', "x")
    p = stage.run([app.build_script("/opt/my nvcc/bin/nvcc", "90")], timeout=20, shell=True,
                  env={k: v for k, v in os.environ.items() if k != "NVCC"})
    assert p.output.startswith("/opt/my nvcc/bin/nvcc|sm_90")
    assert p.output.rstrip().endswith("0")  # not exported: the build sees no NVCC environment variable


# ---- the stage runner ----------------------------------------------------------------------------

def test_run_stage_stops_inside_the_budget_and_names_what_remains():
    clock = Clock()
    apps = [App(f"a{i}", ".", "true", "x") for i in range(5)]

    def fn(app, budget):
        clock.t += 40
        return {"ok": True}

    res = stage.run_stage("plain", apps, fn, stage.Budget(100, clock), min_start=15, progress=lambda s: None)
    assert list(res["apps"]) == ["a0", "a1", "a2"]  # a2 starts with 20 s left, a3 would start at -20 s
    assert res["remaining"] == ["a3", "a4"] and res["stopped"] == "budget"
    line = stage.remaining_line(res)
    assert "--apps a3,a4" in line and line.startswith("corpus plain: stopped")


def test_run_stage_keeps_a_budget_cut_app_remaining_and_an_error_alone():
    apps = [App(n, ".", "true", "x") for n in ("bad", "ok", "cut", "later")]

    def fn(app, budget):
        if app.name == "bad":
            raise RuntimeError("boom")
        return {"budget_cut": True} if app.name == "cut" else {"fine": 1}

    res = stage.run_stage("record", apps, fn, stage.Budget(1000), progress=lambda s: None)
    assert res["apps"]["bad"]["stage_error"] == "RuntimeError: boom"
    assert res["apps"]["ok"]["fine"] == 1
    assert res["remaining"] == ["cut", "later"]


def test_run_stage_saves_after_every_app_so_a_killed_call_keeps_its_work(tmp_path):
    apps = [App(n, ".", "true", "x") for n in ("a", "b")]
    path = tmp_path / "plain-x.json"
    seen = []

    def fn(app, budget):
        if app.name == "b":  # the call is killed here: only a's result exists
            seen.append(stage.read_result(path))
        return {"n": app.name}

    stage.run_stage("plain", apps, fn, stage.Budget(100), progress=lambda s: None, save=lambda r: stage.save(r, path))
    assert list(seen[0]["apps"]) == ["a"] and seen[0]["remaining"] == ["b"] and seen[0]["stopped"] == "in progress"
    final = stage.read_result(path)
    assert list(final["apps"]) == ["a", "b"] and final["remaining"] == [] and final["stopped"] is None


def test_run_stops_a_process_group_that_runs_too_long():
    p = stage.run(["bash", "-c", "sleep 30 & sleep 30; echo never"], timeout=1)
    assert p.timed_out and p.returncode is None and "never" not in p.output and p.seconds < 15


def test_write_result_never_overwrites(tmp_path):
    res = {"stage": "plain", "apps": {}}
    a, b = stage.write_result(res, tmp_path, "x"), stage.write_result(res, tmp_path, "x")
    assert a != b and stage.read_result(a)["stage"] == "plain"
    (tmp_path / "junk.json").write_text("[]")
    with pytest.raises(ValueError, match="junk.json"):
        stage.read_result(tmp_path / "junk.json")


def fake_pack(tmp_path, scripts):
    """A pack whose 'apps' are shell scripts (real processes, no GPU needed)."""
    entries = []
    for name, (body, success) in scripts.items():
        exe = tmp_path / "pack" / "bin" / name / name
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/bash\n" + body + "\n")
        exe.chmod(0o755)
        entries.append({**App(name, ".", "true", name, "", success).to_dict(), "exe": f"bin/{name}/{name}"})
    manifest = {"commit": "abc", "apps": entries}
    (tmp_path / "pack" / "manifest.json").write_text(json.dumps(manifest))
    return gpu.Ctx(build.read_manifest(tmp_path / "pack"), tmp_path / "pack", tmp_path / "work", app_timeout=20)


def test_plain_stage_checks_success_and_says_why_it_failed(tmp_path):
    ctx = fake_pack(tmp_path, {"good": ("echo Test passed", "Test passed"), "quiet": ("echo hello", "Test passed"),
                               "waived": ("exit 2", "exit0"), "slow": ("sleep 60", "exit0")})
    rows = {a: gpu.plain_app(App.from_dict(ctx.entries[a]), stage.Budget(600), ctx) for a in ("good", "quiet", "waived")}
    assert rows["good"]["app_ok_plain"] and rows["good"]["plain_error"] is None
    assert not rows["quiet"]["app_ok_plain"] and "not in the output" in rows["quiet"]["plain_error"]
    assert "waived" in rows["waived"]["plain_error"]
    cut = gpu.plain_app(App.from_dict(ctx.entries["slow"]), stage.Budget(2), ctx)
    assert cut == {"budget_cut": True}


def test_gpu_stage_cli_refuses_apps_missing_from_the_pack(tmp_path):
    fake_pack(tmp_path, {"good": ("echo ok", "exit0")})
    p = subprocess.run([sys.executable, "-m", "bench.corpus", "plain", "--pack", str(tmp_path / "pack"), "--apps",
                        "good,other", "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "other" in p.stderr
    p = subprocess.run([sys.executable, "-m", "bench.corpus", "plain", "--pack", str(tmp_path / "pack"),
                        "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    res = stage.read_result(next((tmp_path / "r").glob("plain-*.json")))
    assert res["apps"]["good"]["app_ok_plain"] is True and res["commit"]


def test_gpu_chain_runs_its_stages_under_one_budget(tmp_path):
    fake_pack(tmp_path, {"good": ("echo ok", "exit0"), "slow": ("sleep 3", "exit0")})
    p = subprocess.run([sys.executable, "-m", "bench.corpus", "gpu", "--stages", "plain,plain", "--pack",
                        str(tmp_path / "pack"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r"),
                        "--budget", "18"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    results = {f.name: stage.read_result(f) for f in (tmp_path / "r").glob("plain-*.json")}
    first, second = results["plain-pack.json"], results["plain-pack-2.json"]  # both named by the pack
    assert set(first["apps"]) == {"good", "slow"} and first["remaining"] == []
    assert second["stopped"] == "budget" and "--apps" in p.stdout  # 3 s gone, under 15 s left: nothing started


# ---- build (real corpus programs, real compiler) -------------------------------------------------

def test_first_error_skips_make_and_cmake_summaries():
    out = ("-- Configuring done\nnvcc fatal   : Unsupported gpu architecture 'compute_60'\n"
           "make: *** [Makefile:5: needle] Error 1\n")
    assert build.first_error(out) == "nvcc fatal   : Unsupported gpu architecture 'compute_60'"
    out = "CMake Error at CMakeLists.txt:3 (project):\n  No CMAKE_CUDA_COMPILER could be found.\n\n"
    assert build.first_error(out) == "CMake Error at CMakeLists.txt:3 (project): No CMAKE_CUDA_COMPILER could be found."
    assert build.first_error("gmake[2]: *** [x] Error 1\nlast words\n") == "last words"


@needs_corpus
@needs_nvcc
def test_build_stage_builds_a_makefile_program_and_reports_a_real_failure(tmp_path):
    apps = capps.select(capps.load(CORPUS), ["nw"])
    res = build.build_stage(apps, stage.Budget(900), CORPUS, NVCC, "90", scratch=tmp_path / "s", bin_dir=tmp_path / "bin")
    row = res["apps"]["nw"]
    assert row["built_unmodified"] is True and row["build_error"] is None, row.get("build_log")
    exe = tmp_path / "bin" / "nw" / "needle"
    assert exe.is_file() and row["stripped_bytes"] == exe.stat().st_size <= row["binary_bytes"]
    assert row["cudart"] == "static"  # nvcc links the static runtime by default
    if "mneme" in Path(NVCC).name:
        assert row["ir_kernels"], "mneme-nvcc should embed the device IR"
    assert not (CORPUS / "rodinia/cuda/nw/needle").exists()  # built in the scratch copy only
    bad = build.build_stage(apps, stage.Budget(900), CORPUS, NVCC, "60", scratch=tmp_path / "s2",
                            bin_dir=tmp_path / "bin2")["apps"]["nw"]
    assert bad["built_unmodified"] is False and "60" in bad["build_error"] and "***" not in bad["build_error"]


@needs_corpus
@needs_nvcc
def test_build_stage_builds_a_cmake_program_then_packs_it(tmp_path):
    apps = capps.select(capps.load(CORPUS), ["inlinePTX"])
    res = build.build_stage(apps, stage.Budget(1800), CORPUS, NVCC, "90", scratch=tmp_path / "s", bin_dir=tmp_path / "bin")
    row = res["apps"]["inlinePTX"]
    assert row["built_unmodified"] is True, row.get("build_log")
    assert row["cudart"] == "static"  # CMake links -lcudart_static
    if "mneme" in Path(NVCC).name:  # the stripped binary's IR, read back by `mneme ir`
        p = subprocess.run([str(Path(sys.executable).parent / "mneme"), "ir", "--json",
                            str(tmp_path / "bin" / "inlinePTX" / "inlinePTX")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        listed = sorted({k["name"] for m in json.loads(p.stdout)["modules"] for k in m["kernels"]})
        assert listed and listed == row["ir_kernels"]
    m = build.pack(apps, build.built_apps([res]), bin_dir=tmp_path / "bin", out=tmp_path / "pack", max_mib=64)
    assert m["apps"][0]["exe"] == "bin/inlinePTX/inlinePTX" and (tmp_path / "pack/bin/inlinePTX/inlinePTX").is_file()
    with pytest.raises(ValueError, match="MiB"):
        build.pack(apps, build.built_apps([res]), bin_dir=tmp_path / "bin", out=tmp_path / "p2", max_mib=0.01)


def test_strip_keeps_the_embedded_ir(tmp_path):
    exe = tmp_path / "vecadd"
    p = subprocess.run([str(Path(sys.executable).parent / "mneme"), "cc", "-O3", "--cuda-gpu-arch=sm_90", "-o",
                        str(exe), str(ROOT / "examples" / "vecadd.cu")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    before = build.ir_kernels(exe)["ir_kernels"]
    info = build.strip_copy(exe, tmp_path / "out" / "vecadd")
    assert before and build.ir_kernels(tmp_path / "out" / "vecadd")["ir_kernels"] == before
    assert info["stripped"] and info["stripped_bytes"] < info["binary_bytes"]


def test_plan_groups_fit_the_limit():
    sizes = {"a": 20, "b": 15, "c": 10, "d": 40, "e": 5, "f": 1}
    groups = build.plan_groups(sizes, 30)
    assert sorted(n for g in groups for n in g) == sorted(sizes)
    assert all(sum(sizes[n] for n in g) <= 30 or len(g) == 1 for g in groups) and ["d"] in groups
    assert all(len(g) <= 2 for g in build.plan_groups(sizes, 30, max_apps=2))


# ---- GPU stages: commands and parsers against the real mneme CLI and the fixtures ----------------

def copy_fixture(tmp_path, name):
    rdb = tmp_path / "rdb"
    shutil.copytree(FIXTURES / name, rdb)
    return rdb


def test_read_dbs_reads_the_fixture_record():
    kernels = gpu.read_dbs(FIXTURES / "manylaunch")
    assert len(kernels) == 1
    k = kernels[0]
    assert k["name"] == "_Z8scaleAddPfPKffi" and k["has_ir"] and k["replayable"]
    assert k["launches"] == 15 and k["instances_recorded"] == 3 == len(k["instances"])
    assert k["instances"][0]["in_app_ns"] >= k["instances"][-1]["in_app_ns"]
    assert k["instances"][0]["block"] == "256x1x1"


def test_kernels_without_ir_parses_the_record_line():
    out = ("mneme record: 1 process(es) recorded into rdb\n"
           "mneme record: no IR for 2 kernel(s) (app not built with `mneme cc`): foo(int), bar(float*, int)\n")
    assert gpu.kernels_without_ir(out) == ["foo(int)", "bar(float*, int)"]


def test_replay_command_runs_and_its_json_parses(tmp_path):
    db = next((FIXTURES / "vecadd").glob("*.json"))
    rid = gpu.read_dbs(FIXTURES / "vecadd")[0]["instances"][0]["id"]
    js = tmp_path / "r.json"
    p = subprocess.run(gpu.replay_argv(db, rid, js) + ["--compile-only"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    r = gpu.parse_replay(json.loads(js.read_text()), 30000.0)
    assert r["status"] == "compiled" and r["replay_ns"] is None and r["registers"] > 0
    doc = json.loads(js.read_text())
    doc["result"].update(status="verified", exec_time=[31000, 33000, 32000], fidelity=0.0)
    r = gpu.parse_replay(doc, 32000.0)
    assert r["replay_ns"] == 32000 and r["fidelity"] == 1.0


def test_tune_command_runs_and_its_summary_parses(tmp_path):
    db = next((FIXTURES / "vecadd").glob("*.json"))
    rid = gpu.read_dbs(FIXTURES / "vecadd")[0]["instances"][0]["id"]
    out = tmp_path / "t"
    argv = ctune.tune_argv(db, rid, out, 4, "standard", 1) + ["--devices", "none", "--objective", "registers"]
    p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = ctune.json_object(p.stdout)
    assert doc is not None
    t = ctune.parse_tune(doc, out)
    assert t["trials"] == 4 and t["verified_fraction"] == 0.0  # compile-only trials never verify
    assert t["tune_configs_per_s"] > 0 and t["best_config"]["block"]["x"] > 0
    assert t["failure_reasons"] == [] and isinstance(t["best_changes"], dict)
    assert (out / ctune.STUDY_FILE).is_file() and not (out / "study.db").exists()
    assert ctune.tune_argv(db, rid, out, 4, "standard", None, resume=True)[-3:] == [
        "--resume", "--stale-after", "10"]


def test_pick_kernels_prefers_verified_heavy_instances():
    ks = [{"name": "big", "replayable": True, "instances": [{"id": "b1", "in_app_ns": 9e5}, {"id": "b2", "in_app_ns": 5e4}]},
          {"name": "nr", "replayable": False, "instances": [{"id": "n1", "in_app_ns": 1e7}]},
          {"name": "small", "replayable": True, "instances": [{"id": "s1", "in_app_ns": 1e4}]}]
    assert [(k["name"], i["id"]) for k, i in ctune.pick_kernels(ks, None, 3, 0)] == [("big", "b1"), ("small", "s1")]
    assert [(k["name"], i["id"]) for k, i in ctune.pick_kernels(ks, None, 3, 20000)] == [("big", "b1")]
    replayed = [{"name": "big", "replayed": [{"id": "b1", "status": "failed_verification"},
                                             {"id": "b2", "status": "verified"}]}]
    assert [(k["name"], i["id"]) for k, i in ctune.pick_kernels(ks, replayed, 1, 0)] == [("big", "b2")]


def test_recorded_traffic_counts_the_argument_allocations_once():
    """vecAdd(a, b, c, n) of the fixture: three 64 KiB buffers, c written."""
    k = gpu.read_dbs(FIXTURES / "vecadd")[0]
    t = ctune.recorded_traffic(FIXTURES / "vecadd" / k["db"], k["instances"][0]["id"])
    assert t == {"allocations": 3, "read_bytes": 2 * 65536, "written_bytes": 65536, "bytes_moved": 3 * 65536}


def tune_ctx(tmp_path):
    ctx = fake_pack(tmp_path, {"A": ("echo Test passed", "Test passed")})
    shutil.copytree(FIXTURES / "vecadd", ctx.work / "A" / "rdb")
    return ctx, App.from_dict(ctx.entries["A"])


def test_tune_stage_reuses_finished_kernels_and_stops_before_the_budget(tmp_path):
    """Resumable per kernel: a row an earlier call left (same instance, space, trials) is reused without
    running anything; a kernel is not started with less than KERNEL_MIN_S left, and the app comes back partial."""
    ctx, app = tune_ctx(tmp_path)
    k, inst = ctune.pick_kernels(gpu.read_dbs(ctx.rdb(app)), None, 3, 0)[0]
    d = ctune.kernel_dir(ctx, app.name, k, inst)
    d.mkdir(parents=True)
    done = {"name": k["name"], "instance": inst["id"], "space": "standard", "trials_requested": 100, "trials": 100,
            "by_status": {"verified": 97, "compile_error": 3}, "verified_fraction": 0.97, "best_speedup": 1.21,
            "gain_from": "unroll", "tune_s": 31.0}
    (d / ctune.ROW_FILE).write_text(json.dumps(done))
    said = []
    row = ctune.tune_app(app, stage.Budget(600), ctx, min_us=0, progress=said.append)
    assert row["tune"] == [{**done, "resumed": True}] and "budget_cut" not in row
    assert "kernel 1/1" in said[0] and "done in an earlier call" in said[0] and "gain from unroll" in said[0]
    (d / ctune.ROW_FILE).write_text(json.dumps({**done, "trials_requested": 30}))  # other settings: not reused
    clock = Clock()
    budget = stage.Budget(ctune.KERNEL_MIN_S - 1, clock)
    said.clear()
    row = ctune.tune_app(app, budget, ctx, min_us=0, progress=said.append)
    assert row["budget_cut"] and row["partial"] and row["tune"] == [] and "not started" in said[0]
    assert not (d / ctune.STUDY_FILE).exists()
    res = stage.run_stage("tune", [app], lambda a, b: ctune.tune_app(a, b, ctx, min_us=0, progress=said.append), budget,
                          min_start=1, progress=said.append)
    assert res["remaining"] == ["A"] and res["apps"]["A"]["partial"] and res["stopped"] == "budget"


def test_tune_stage_defaults_are_the_issue_budget():
    args = __import__("bench.corpus.cli", fromlist=["parser"]).parser().parse_args(["tune"])
    assert (args.trials, args.space, args.top, args.min_us, args.fresh) == (100, "standard", 3, 20.0, False)


NCU_OUT = '''Test passed
==PROF== Connected to process 123 (/w/app)
==PROF== Profiling "_Z6kernelPfi" - 0: 0%....50%....100% - 1 pass
==PROF== Disconnected from process 123
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","app","127.0.0.1","_Z6kernelPfi","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","53,950"
"1","123","app","127.0.0.1","_Z6kernelPfi","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","54,050"
"2","123","app","127.0.0.1","_Z5otherv","1","7","(32, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","2.5"
'''


def test_ncu_command_and_csv():
    argv = gpu.ncu_argv(Path("/w/app"), ["-n", "3"], 50)
    assert argv[:3] == ["ncu", "--clock-control", "none"] and "--cache-control" in argv
    assert argv[argv.index("--metrics") + 1] == "gpu__time_duration.sum" and argv[-3:] == ["/w/app", "-n", "3"]
    n = gpu.parse_ncu_csv(NCU_OUT)
    assert n["_Z6kernelPfi"]["launches"] == 2 and n["_Z6kernelPfi"]["median_ns"] == 54000
    assert n["_Z6kernelPfi"]["by_shape"] == {"4096x1x1/256x1x1": 54000}
    assert n["_Z5otherv"]["median_ns"] == 2500
    assert gpu.parse_ncu_csv("no csv here") == {}


# ---- merge, render, schema -------------------------------------------------------------------------

def result(st, apps, date, commit="c1", **kw):
    return {"stage": st, "commit": commit, "date": date, "gpu": "NVIDIA H200" if st != "build" else "none",
            "driver": "580.159.04" if st != "build" else "", "apps": apps, **kw}


KERNEL = {"name": "_Z1kPf", "demangled": "k(float*)", "static_hash": "ab" * 32, "db": "x.json", "has_ir": True,
          "replayable": True, "not_replayable_reason": None, "launches": 10, "instances_recorded": 2,
          "total_in_app_ns": 5e5, "in_app_ns": 4e4,
          "instances": [{"id": "i1", "grid": "64x1x1", "block": "256x1x1", "in_app_ns": 5e4, "occurrences": 5},
                        {"id": "i2", "grid": "8x1x1", "block": "256x1x1", "in_app_ns": 5e3, "occurrences": 5}]}
NR_KERNEL = {**KERNEL, "name": "_Z1qv", "demangled": "q()", "replayable": False,
             "not_replayable_reason": "cooperative launch", "instances": []}


def synthetic():
    return [
        result("build", {"A": {"built_unmodified": True, "build_error": None, "ir_kernels": ["_Z1kPf"]},
                         "B": {"built_unmodified": False, "build_error": "nvcc fatal : bad flag"}}, "2026-12-02T10:00:00"),
        result("record", {"A": {"app_ok_plain": True, "plain_s": 2.0, "app_ok_recorded": True, "record_s": 3.0,
                                "recorded": True, "record_overhead": 1.5, "record_added_s": 1.0, "kernels": [KERNEL, NR_KERNEL]}},
               "2026-12-02T11:00:00", commit="c2"),
        result("replay", {"A": {"replay": [{"name": "_Z1kPf", "replayed": [
            {"id": "i1", "in_app_ns": 5e4, "status": "verified", "replay_ns": 5.1e4, "fidelity": 1.02},
            {"id": "i2", "in_app_ns": 5e3, "status": "verified", "replay_ns": 6e3, "fidelity": 1.2}]}]}},
               "2026-12-02T12:00:00"),
        result("tune", {"A": {"tune": [{"name": "_Z1kPf", "instance": "i1", "trials": 30, "verified_fraction": 0.9,
                                        "best_speedup": 1.2, "tune_configs_per_s": 40.0, "gpu_busy": 0.5}]}},
               "2026-12-02T13:00:00"),
        result("ncu", {"A": {"app_ok_ncu": True, "ncu": {"_Z1kPf": {"launches": 10, "median_ns": 4.8e4,
                                                                    "by_shape": {"64x1x1/256x1x1": 5.0e4}}}}},
               "2026-12-02T14:00:00"),
        result("apply", {"A": {"apply": {"kernels_applied": 1, "app_ok": True, "wall_speedup": 1.05,
                                         "kernels": [{"kernel": "_Z1kPf", "predicted": 1.2, "realized": 1.15}]}}},
               "2026-12-02T15:00:00"),
    ]


def test_merge_folds_every_stage_and_derives_the_app_figures():
    doc = merge.merge(None, synthetic(), ["A", "B", "C"])
    a, b, c = doc["apps"]
    assert [x["name"] for x in doc["apps"]] == ["A", "B", "C"] and doc["gpu"] == "NVIDIA H200"
    assert a["built_unmodified"] and a["recorded"] and a["app_ok_recorded"]
    assert (a["kernels_recorded"], a["kernels_replayable"], a["kernels_verified"]) == (2, 1, 1)
    assert a["not_replayable"] == {"q()": "cooperative launch"}
    assert a["fidelity"] == [1.02]  # i2 is under 20 us
    assert a["fidelity_ncu"] == [round(5.1e4 / 5.0e4, 4)]
    assert (a["tune_verified_fraction"], a["best_speedup"], a["tune_configs_per_s"]) == (0.9, 1.2, 40.0)
    assert a["apply"]["kernels"][0]["realized"] == 1.15
    assert a["stages"]["record"] == {"commit": "c2", "date": "2026-12-02T11:00:00"} and set(a["stages"]) == {
        "build", "record", "replay", "tune", "ncu", "apply"}
    assert b["built_unmodified"] is False and b["kernels_recorded"] is None and c["stages"] == {}
    assert doc["summary"].startswith("corpus: 1/3 built unmodified (1 not built yet), 1/3 recorded ok")
    assert "fidelity median 1.020 over 1 instances >= 20 us (1 within 3 %, 1 within 5 %)" in doc["summary"]
    assert "record overhead median 1.50x, worst 1.50x (1 apps >= 1 s plain)" in doc["summary"]
    assert "geomean 1.200" in doc["summary"]


def test_merge_a_later_stage_keeps_the_others_results():
    doc = merge.merge(None, synthetic(), ["A", "B"])
    again = result("record", {"A": {"app_ok_plain": True, "app_ok_recorded": False, "record_error": "exit 1: x",
                                    "recorded": True, "record_overhead": 2.0, "kernels": [KERNEL]}},
                   "2026-12-03T09:00:00", commit="c3")
    doc2 = merge.merge(doc, [again], ["A", "B"])
    a = doc2["apps"][0]
    assert a["stages"]["record"]["commit"] == "c3" and a["stages"]["replay"]["commit"] == "c1"
    assert a["app_ok_recorded"] is False and a["record_overhead"] == 2.0
    assert a["kernels"][0]["instances"][0]["replay_ns"] == 5.1e4  # replay results of a still-recorded instance stay
    assert a["kernels_recorded"] == 1 and a["not_replayable"] == {}
    assert doc2["apps"][1]["build_error"] == "nvcc fatal : bad flag"


def test_schema_requires_the_issue_fields():
    doc = merge.merge(None, synthetic(), ["A"])
    schema.validate(doc)
    bad = json.loads(json.dumps(doc))
    del bad["apps"][0]["kernels_verified"]
    with pytest.raises(jsonschema.ValidationError, match="kernels_verified"):
        schema.validate(bad)
    bad = json.loads(json.dumps(doc))
    bad["apps"][0]["fidelity"] = ["high"]
    with pytest.raises(jsonschema.ValidationError):
        schema.validate(bad)


def test_render_shows_each_app_and_each_miss_with_its_cause():
    md = render.render(merge.merge(None, synthetic(), ["A", "B", "C"]))
    assert md.startswith("# Corpus campaign") and "corpus: 1/3 built unmodified (1 not built yet)" in md
    assert "| A | yes | yes | yes | yes | 2 / 1 / 1 | 1.50x (+1.0 s) |" in md
    assert "- **B**: build failed: nvcc fatal : bad flag" in md
    assert "- **A**: kernel `q()` not replayable: cooperative launch" in md
    assert "| A | k(float\\*)" not in md and "| A | k(float*) | 10 | 2 | 50.00 | 51.00 | 1.020 | 50.00 | 1.020 |" in md


def tune_rows():
    """A tune stage result of the new budget: two kernels of A, the second without a gain."""
    k2 = {**KERNEL, "name": "_Z2k2Pf", "demangled": "k2(float*)", "total_in_app_ns": 1e5}
    rows = [{"name": "_Z1kPf", "instance": "i1", "in_app_ns": 5e4, "space": "standard", "trials_requested": 100,
             "trials": 100, "by_status": {"verified": 96, "compile_error": 4}, "verified_fraction": 0.96,
             "best_speedup": 1.25, "best_ns": 4e4, "baseline_ns": 5e4, "gain_from": "unroll", "gain_from_factor": 1.2,
             "best_changes": {"unroll": 4, "block": {"x": 128, "y": 1, "z": 1}}, "tune_configs_per_s": 20.0,
             "gpu_busy": 0.4, "traffic": {"bytes_moved": 8 * 2 ** 20, "read_bytes": 4 * 2 ** 20, "written_bytes": 4 * 2 ** 20},
             "failure_reasons": [{"status": "compile_error", "count": 4, "reason": "ptxas rejected | error : bad"}]},
            {"name": "_Z2k2Pf", "instance": "j1", "in_app_ns": 2.5e4, "space": "standard", "trials_requested": 100,
             "trials": 100, "by_status": {"verified": 100}, "verified_fraction": 1.0, "best_speedup": 1.01,
             "best_ns": 2.0e4, "baseline_ns": 2.02e4, "gain_from": None, "best_changes": {}, "tune_configs_per_s": 30.0,
             "gpu_busy": 0.6, "traffic": {"bytes_moved": 48_000_000, "read_bytes": 32_000_000, "written_bytes": 16_000_000}}]
    return result("tune", {"A": {"tune": rows, "kernels": [KERNEL, k2]}}, "2026-12-03T13:00:00", commit="c4")


def test_merge_and_render_the_tuning_table_beside_the_first_campaign():
    doc = merge.merge(None, synthetic() + [tune_rows()], ["A", "B"])
    a = doc["apps"][0]
    assert (a["tune_verified_fraction"], a["best_speedup"], a["gpu_busy"]) == (0.96, 1.25, 0.4)  # heaviest kernel's
    s = doc["summary"]
    assert ("tune (100 trials of standard): 2 kernels, verified fraction median 0.98, best speedup geomean 1.124 "
            "(1 >= 1.05x), every trial failed: 0, configs/s median 25.0, gpu_busy median 0.50") in s
    assert merge.FIRST_TUNE in s and "30 trials" in merge.FIRST_TUNE
    schema.validate(doc)
    md = render.render(doc)
    assert "## Tuning" in md and "4.8 TB/s of HBM3e" in md
    line = next(ln for ln in md.splitlines() if ln.startswith("| A | k(float*) | 50.0 | 100 / 100"))
    assert "| 96% | 1.250x | unroll (x1.200) | unroll=4, block=128x1x1 |" in line and line.endswith("|  |")
    slow = next(ln for ln in md.splitlines() if ln.startswith("| A | k2(float*) | 25.0 |"))
    assert "none (the baseline's)" in slow and slow.endswith("| 2400 GB/s (50.0 % of HBM), 45.8 MiB |")
    assert "4 x compile_error: ptxas rejected \\| error : bad" in md
    cut = result("tune", {"A": {"tune": [], "partial": True}}, "2026-12-03T14:00:00")
    assert merge.merge(doc, [cut], ["A", "B"])["apps"][0]["best_speedup"] == 1.25  # a cut call keeps what was


LONG_ERROR = ("mneme replay: error: /work/main/.corpus/work/reduction/rdb/" + "b6" * 32 + ".json: its IR module(s) "
              "/work/main/.corpus/work/reduction/rdb/RecordedIR_" + "b6" * 32 + ".bc hash to static hash "
              "0123456789abcdef..., the DB records fedcba9876543210...: the IR was changed after recording or "
              "belongs to another kernel; restore it or record again")


def test_a_replay_error_is_kept_whole_in_the_json_and_short_in_the_table():
    """The campaign's first run cut these to 200 characters, before the reason ('hash to static hash ...')."""
    proc = stage.Proc(argv=["mneme"], returncode=2, output="some progress\n" + LONG_ERROR + "\n", seconds=1.0, timed_out=False)
    assert gpu.last_line(proc.output) == LONG_ERROR
    assert gpu.parse_replay({"result": {"status": "error", "error": LONG_ERROR}}, None)["error"] == LONG_ERROR
    assert gpu.last_line("x" * (gpu.MAX_ERROR_CHARS + 10)).endswith("(10 more characters)")
    res = synthetic()
    res[2]["apps"]["A"]["replay"][0]["replayed"] = [
        {"id": i, "in_app_ns": 5e4, "status": "error", "replay_ns": None, "fidelity": None, "error": LONG_ERROR}
        for i in ("i1", "i2")]
    doc = merge.merge(None, res, ["A"])
    assert doc["apps"][0]["not_replayable"]["k(float*)"] == "replay error: " + LONG_ERROR
    md = render.render(doc)
    (line,) = [x for x in md.splitlines() if "k(float*)` not replayable" in x]
    assert "hash to static hash 0123456789abcdef" in line and "/work/main" not in line and "b6" * 7 not in line
    assert "(whole in corpus.json)" in line and len(line) < 400, line


def test_merge_cli_writes_both_documents(tmp_path):
    rdir = tmp_path / "results"
    rdir.mkdir()
    for i, r in enumerate(synthetic()):
        (rdir / f"{r['stage']}-{i}.json").write_text(json.dumps(r))
    p = subprocess.run([sys.executable, "-m", "bench.corpus", "merge", str(rdir), "--json", str(tmp_path / "c.json"),
                        "--md", str(tmp_path / "C.md")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1].startswith("corpus: ")
    doc = json.loads((tmp_path / "c.json").read_text())
    schema.validate(doc)
    assert {a["name"] for a in doc["apps"]} >= {"A", "B"} and (tmp_path / "C.md").read_text().startswith("# Corpus")


@pytest.mark.skipif(build.has_libcuda() or Path("/dev/nvidiactl").exists(), reason="a driver is present")
def test_record_stage_runs_mneme_record_and_reports_why_it_failed(tmp_path):
    ctx = fake_pack(tmp_path, {"good": ("echo Test passed", "Test passed")})
    row = gpu.record_app(App.from_dict(ctx.entries["good"]), stage.Budget(600), ctx)
    assert row["app_ok_plain"] is True and row["app_ok_recorded"] is False and row["recorded"] is False
    assert "NVIDIA driver" in row["record_error"] and row["kernels"] == [] and row["record_overhead"] > 0


def test_the_record_stage_keeps_mneme_records_time_split():
    from bench.corpus.gpu import record_split

    out = ("mneme record: recorder time 0.006 s for 1 instance(s): copy 0.001 s (1.27 GB/s over 0.001 GB), "
           "hash/diff 0.003 s, write 0.003 s, retime 0.000 s\n"
           "mneme record: wall 2.750 s: prepare 0.250 s (IR index, kernel table), app 2.000 s (recorder 0.750 s of it), "
           "post-processing 0.500 s\n")
    split = record_split(out)
    assert split == {"recorder_time": 0.006, "copy": 0.001, "hash_diff": 0.003, "write": 0.003, "retime": 0.0,
                     "wall": 2.75, "prepare": 0.25, "app": 2.0, "recorder": 0.75, "post_processing": 0.5}
    assert record_split("no split here") == {}


def test_the_newest_build_result_wins_whatever_the_file_names():
    old = {"date": "2026-12-03T08:36:23+00:00", "apps": {"cdp": {"built_unmodified": False}}}
    new = {"date": "2026-12-03T08:45:00+00:00", "apps": {"cdp": {"built_unmodified": True, "build_s": 1.0}}}
    assert build.built_apps([new, old])["cdp"]["build_s"] == 1.0
    assert "cdp" not in build.built_apps([{**old, "date": "2026-12-04T00:00:00+00:00"}, new])


def test_a_failed_recorded_run_is_named_with_the_recorders_own_error_line():
    cmerge, crender = merge, render
    app = cmerge.skeleton("newdelete")
    row = {"app_ok_recorded": False, "record_error": "exit 1: mneme record: the app exited with status 1",
           "record_log": "newdelete Starting...\nmneme record: the recorded launch failed: _Z15containerDelete: "
                         "unspecified launch failure\nmneme record: the app exited with status 1\n"}
    cmerge.fold_record(app, row, {})
    assert app["record_cause"] == "the recorded launch failed: _Z15containerDelete: unspecified launch failure"
    (miss,) = [m for m in crender.misses(app) if m.startswith("recorded run failed")]
    assert miss.endswith("(the recorder: the recorded launch failed: _Z15containerDelete: unspecified launch failure)")
    cmerge.fold_record(app, {"app_ok_recorded": True, "record_log": ""}, {})
    assert app["record_cause"] is None, "a later good run clears the cause"


def test_a_replay_reason_names_its_status_once_and_drops_the_cli_prefix():
    assert render.short_reason("replay runtime_error: refused: the CUDA context is unusable") == \
        "replay runtime_error: refused: the CUDA context is unusable"
    assert render.short_reason("replay error: mneme replay: error: /a/b/x.prologue: no such file") == \
        "replay error: x.prologue: no such file"
    assert render.short_reason("mneme tune: error: no trials") == "no trials"
