"""scripts/summary.py, the GPU check's one line: a JUnit report, a run cut before its report (named from
pytest.log's -v lines), and the stages-only part of a check split over device calls."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "summary.py"


def line(*args: str):
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    return p.returncode, p.stdout.strip()


def test_a_report_counts_and_a_skip_fails(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="0"/></testsuites>')
    rc, out = line(str(junit), "0", "12", "main job=0")
    assert rc == 0 and out.startswith("gpu-check: PASSED 3 passed, 0 failed") and "main job: passed" in out
    junit.write_text('<testsuites><testsuite tests="3" failures="0" errors="0" skipped="1"/></testsuites>')
    assert line(str(junit), "0", "12")[0] == 1, "a skipped GPU test proves nothing"


def test_a_cut_run_is_named_from_its_log(tmp_path):
    (tmp_path / "pytest.log").write_text("tests/gpu/a.py::t1 PASSED [ 1%]\ntests/gpu/a.py::t2[x] FAILED [ 2%]\n"
                                         "tests/gpu/b.py::t3 PASSED [ 3%]\n")
    rc, out = line(str(tmp_path / "junit.xml"), "124", "300")
    assert rc == 1 and "pytest exited 124" in out and "before the cut: 2 passed, 1 failed (t2[x])" in out


def test_the_stages_part_counts_its_stages_only():
    rc, out = line("-", "0", "40", "mneme apply tests=0", "main job (demo.sh in a new copy)=0")
    assert rc == 0 and out.startswith("gpu-check (stages): PASSED mneme apply tests: passed; main job")
    rc, out = line("-", "0", "40", "mneme apply tests=124")
    assert rc == 1 and "FAILED (exit 124)" in out
