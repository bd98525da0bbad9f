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


def main(path: str, rc: str, seconds: str, *stages: str) -> int:
    """`stages` are NAME=EXIT_STATUS of the check's other steps (the main job, the README's commands): each
    is named in the line, and any non-zero one fails the check."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        print(f"gpu-check: FAILED (pytest exited {rc}, no report) on {gpu_name()}")
        return 1
    suites = [root] if root.tag == "testsuite" else list(root)
    tot = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    passed = tot["tests"] - tot["failures"] - tot["errors"] - tot["skipped"]
    ok = int(rc) == 0 and passed > 0 and tot["skipped"] == 0
    done = [s.rpartition("=") for s in stages]
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
