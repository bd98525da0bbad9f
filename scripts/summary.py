"""One summary line for `make gpu-check` from pytest's JUnit XML; fails when anything was skipped."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()
        return out[0] if out else "no GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def _cut_run(junit: str) -> str:
    """What pytest.log (beside the JUnit file; -v: one line per test) says of a run cut before its report."""
    log = os.path.join(os.path.dirname(junit) or ".", "pytest.log")
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return ""
    failed = [ln.split(" ")[0] for ln in lines if "::" in ln and " FAILED" in ln or " ERROR" in ln and "::" in ln]
    passed = sum(1 for ln in lines if "::" in ln and " PASSED" in ln)
    names = ", ".join(f.split("::", 1)[-1] for f in failed[:12]) + (" ..." if len(failed) > 12 else "")
    return f"; before the cut: {passed} passed, {len(failed)} failed" + (f" ({names})" if failed else "")


def main(path: str, rc: str, seconds: str, *stages: str) -> int:
    """`stages` are NAME=EXIT_STATUS of the check's other steps (the main job, the README's commands): each
    is named in the line, and any non-zero one fails the check. `path` "-": the tests were not part of this
    run (GPU_CHECK_PART=stages), the line counts the stages only."""
    done = [s.rpartition("=") for s in stages]
    if path == "-":
        ok = bool(done) and all(code == "0" for _, _, code in done)
        parts = "; ".join(f"{name}: {'passed' if code == '0' else f'FAILED (exit {code})'}" for name, _, code in done)
        print(f"gpu-check (stages): {'PASSED' if ok else 'FAILED'} {parts or 'no stage ran'} in {seconds} s on "
              f"{gpu_name()} (commit {os.environ.get('MNEME_COMMIT', '?')})")
        return 0 if ok else 1
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        print(f"gpu-check: FAILED (pytest exited {rc}, no report{_cut_run(path)}) on {gpu_name()}")
        return 1
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    ok = int(rc) == 0 and passed > 0 and tot["skipped"] == 0
    ok = ok and all(code == "0" for _, _, code in done)
    extra = "".join(f"; {name}: {'passed' if code == '0' else f'FAILED (exit {code})'}" for name, _, code in done)

    print(
        f"gpu-check: {'PASSED' if ok else 'FAILED'} {passed} passed, {tot['failures']} failed, {tot['errors']} errors, "
        f"{tot['skipped']} skipped in {seconds} s on {gpu_name()} (commit {os.environ.get('MNEME_COMMIT', '?')})"
        + extra + (f"; {os.environ['GPU_CHECK_NOTE']}" if os.environ.get("GPU_CHECK_NOTE") else "")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
