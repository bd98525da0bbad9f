"""Run the shell commands of README.md and docs/*.md as a user types them (one harness, two modes).

Which blocks run: fenced blocks tagged ``bash`` or ``sh``. Other blocks are never run; an untagged fence
is an error (tag it ``bash`` to run it, ``text`` for synopses, diagrams and output), so no command can
drop out of the check silently. Markers, all visible in the Markdown source:

* ``[GPU]`` in a line's trailing comment: the command needs a GPU (``mneme record ... # [GPU] ...``);
* ``<!-- doccmds: gpu -->`` on the line before a fence: every command of the block needs a GPU;
* ``<!-- doccmds: skip REASON -->`` on the line before a fence: the block is never run (setup commands
  that install packages, the GPU check itself); the reason is printed.

Placeholders are filled before a command runs: ``DIR/<static-hash>`` is the static hash of the record DB
in DIR (the one ``mneme show DIR`` ranks first is the only one for the single-kernel app), and
``<sweep-run-name>`` is the name of the latest sweep parent run in ./mlflow.db. An unknown ``<...>``
placeholder is an error naming the line.

Each document runs in order in its own scratch directory holding the files the docs name: ``app.cu``
(examples/vecadd.cu), ``saxpy.cu``/``main.cpp``/``Makefile``/``CMakeLists.txt`` (tests/fixtures/docs). In
CPU mode (the default; the CPU test runs it) the GPU commands do not run, but the ones whose products later
commands read have stand-ins: ``mneme record -rdb DIR`` copies the recorded fixture tests/fixtures/vecadd
into DIR, and ``+experiment=sweep|launch_search`` runs the compile-only experiment on the same DB. In GPU
mode (``--gpu``, on the GPU machine) README.md's commands all run as written -- record, show, replay,
tune, sweep, compare -- except that ``mneme cc`` lines, when clang-22 is absent (the GPU machine has
none), are replaced by the prebuilt example (examples/bin/vecadd, ``make gpu-bundle``). Servers
(``mlflow ui``, ``mneme ui``) get a free ``--port``, must answer HTTP, and are then stopped.

Usage: python scripts/doccmds.py [--gpu] [--list] [--keep DIR] [--timeout S] [DOC.md ...]
Exit status 0 when every command that ran exited 0; the last line is one status line.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re
import shlex
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGS = {"bash", "sh"}
MARKER = re.compile(r"<!--\s*doccmds:\s*(gpu|skip)\b\s*(.*?)\s*-->")
PLACEHOLDER = re.compile(r"<([a-z][a-z0-9-]*)>")
SERVER = re.compile(r"^(mlflow ui|mneme ui|optuna-dashboard)\b")


@dataclass
class Command:
    doc: str
    line: int
    text: str           # as written (continuations joined), comments kept
    gpu: bool = False
    skip: str = ""      # reason, when the block is marked skip

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass
class Outcome:
    cmd: Command
    status: str         # ran | gpu | skip | standin | failed
    detail: str = ""
    ran: str = ""       # the command line actually run, after placeholders/stand-ins


def default_docs() -> List[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def _comment_at(line: str) -> int:
    """Index of the '#' that starts a shell line's trailing comment (a word outside quotes), or -1."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return -1


def _comment(line: str) -> str:
    i = _comment_at(line)
    return line[i + 1:] if i >= 0 else ""


def _code(line: str) -> str:
    i = _comment_at(line)
    return (line[:i] if i >= 0 else line).strip()


def extract(path: Path) -> List[Command]:
    """The commands of one Markdown file, in order. Raises ValueError for an untagged fence."""
    rel = os.path.relpath(path, ROOT)
    lines = path.read_text().splitlines()
    cmds: List[Command] = []
    i = 0
    prev = ""
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", line)
        if not m:
            if line.strip():
                prev = line
            i += 1
            continue
        fence, lang = m.group(2), m.group(3).lower()
        if not lang:
            raise ValueError(f"{rel}:{i + 1}: untagged code block: tag it ```bash (a command the docs check runs) "
                             "or ```text (synopsis, diagram, output)")
        marker = MARKER.search(prev)
        body_start = i + 1
        j = body_start
        while j < len(lines) and not lines[j].strip().startswith(fence[:3]):
            j += 1
        if lang in RUN_LANGS:
            k = body_start
            while k < j:
                start, text = k, lines[k].rstrip()
                while text.endswith("\\") and k + 1 < j:
                    k += 1
                    text = text[:-1] + " " + lines[k].strip()
                k += 1
                stripped = text.strip()
                if not stripped or stripped.startswith("#"):
                    continue
                cmds.append(Command(rel, start + 1, stripped,
                                    gpu="[GPU]" in _comment(stripped) or bool(marker and marker.group(1) == "gpu"),
                                    skip=(marker.group(2) or "marked skip") if marker and marker.group(1) == "skip" else ""))
        prev = ""
        i = j + 1
    return cmds


# ---- placeholders ----------------------------------------------------------------------------------

def _static_hash(cwd: Path, directory: str) -> str:
    dbs = sorted(glob.glob(str(cwd / directory / "*.json")))
    if not dbs:
        raise LookupError(f"no record DB (*.json) in {directory}/ to fill <static-hash>")
    return Path(dbs[0]).stem


def _sweep_run_name(cwd: Path) -> str:
    db = cwd / "mlflow.db"
    if not db.exists():
        raise LookupError("no ./mlflow.db to fill <sweep-run-name>")
    with sqlite3.connect(db) as con:
        row = con.execute("select r.name from runs r join tags t on t.run_uuid = r.run_uuid "
                          "where t.key = 'mneme.role' and t.value = 'sweep' order by r.start_time desc limit 1").fetchone()
    if not row:
        raise LookupError("./mlflow.db has no sweep run to fill <sweep-run-name>")
    return row[0]


def fill(text: str, cwd: Path) -> str:
    code = _code(text)
    code = re.sub(r"([\w./-]*?)/<static-hash>", lambda m: f"{m.group(1)}/{_static_hash(cwd, m.group(1) or '.')}", code)
    code = code.replace("<sweep-run-name>", _sweep_run_name(cwd)) if "<sweep-run-name>" in code else code
    left = PLACEHOLDER.findall(re.sub(r"'[^']*'", "", code))  # <...> inside single quotes is literal
    if left:
        raise LookupError(f"unknown placeholder <{left[0]}> (known: DIR/<static-hash>, <sweep-run-name>)")
    return code


# ---- stand-ins ---------------------------------------------------------------------------------------

def _record_standin(code: str, cwd: Path) -> str:
    m = re.search(r"-rdb\s+(\S+)", code) or re.search(r"record\.dir=(\S+)", code)
    dest = m.group(1) if m else "rec"
    src = ROOT / "tests" / "fixtures" / "vecadd"
    return f"rm -rf {shlex.quote(dest)} && cp -r {shlex.quote(str(src))} {shlex.quote(dest)}"


def _sweep_standin(code: str, cwd: Path) -> Optional[str]:
    if (cwd / "mlflow.db").exists():
        return None  # later commands already have a store to read
    m = re.search(r"record\.db=(\S+)", code)
    db = m.group(1) if m else "rec/*.json"
    return f"python -m mneme +experiment=compile_only --multirun record.db={db} replay.codegen_opt=0,3"


#: (regex on the filled command, CPU-mode replacement) for GPU commands whose products later commands read
CPU_STANDINS: List[tuple] = [
    (re.compile(r"^mneme record\b|\+experiment=record\b"), _record_standin),
    (re.compile(r"\+experiment=(sweep|launch_search)\b"), _sweep_standin),
]


def _gpu_cc_standin(code: str, cwd: Path) -> Optional[str]:
    """GPU mode without clang-22: `mneme cc ... -o OUT` -> the prebuilt example copied to OUT."""
    if not code.startswith("mneme cc") or shutil.which("clang++-22"):
        return None
    m = re.search(r"-o\s+(\S+)", code)
    prebuilt = ROOT / "examples" / "bin" / "vecadd"
    return f"cp {shlex.quote(str(prebuilt))} {shlex.quote(m.group(1) if m else 'a.out')}"


# ---- running ---------------------------------------------------------------------------------------

def prepare(scratch: Path) -> None:
    scratch.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "examples" / "vecadd.cu", scratch / "app.cu")
    shutil.copy(ROOT / "examples" / "common.h", scratch / "common.h")
    docs_fixtures = ROOT / "tests" / "fixtures" / "docs"
    for f in docs_fixtures.iterdir() if docs_fixtures.is_dir() else []:
        shutil.copy(f, scratch / f.name)


def environment() -> dict:
    env = dict(os.environ)
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        env.pop(k, None)
    pypath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    # this checkout's mneme, whatever the scratch directory; console scripts of `pip install --target` dirs
    # (the GPU machine's bundle, scripts/gpu-env.sh) and of this interpreter's environment on PATH
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + pypath)
    bins = [str(ROOT / "scripts" / "bin")] if not shutil.which("mneme") else []
    bins += [os.path.join(p, "bin") for p in pypath if os.path.isdir(os.path.join(p, "bin"))]
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent)] + bins + [env.get("PATH", "")])
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_server(code: str, cwd: Path, env: dict, timeout: float) -> tuple:
    port = _free_port()
    if "--port" not in code:
        code = f"{code} --port {port}"
    else:
        port = int(re.search(r"--port[ =](\d+)", code).group(1))
    log = cwd / f".server-{port}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", f"exec {code}"], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return 1, code, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    if r.status == 200:
                        return 0, code, log.read_text()
            except OSError:
                time.sleep(0.5)
        return 124, code, log.read_text() + f"\n(no HTTP answer on port {port} within {timeout:.0f} s)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def run_doc(cmds: List[Command], scratch: Path, gpu: bool, timeout: float,
            say: Callable[[str], None] = print) -> List[Outcome]:
    prepare(scratch)
    env = environment()
    outcomes: List[Outcome] = []
    for c in cmds:
        if c.skip:
            outcomes.append(Outcome(c, "skip", c.skip))
            continue
        if c.text.startswith("source ") and "activate" in c.text:
            outcomes.append(Outcome(c, "skip", "the harness runs in this Python environment"))
            continue
        try:
            code = fill(c.text, scratch)
        except LookupError as e:
            if c.gpu and not gpu:
                outcomes.append(Outcome(c, "gpu", f"needs a GPU ({e})"))
                continue
            outcomes.append(Outcome(c, "failed", str(e)))
            say(f"FAILED {c.where}: {c.text}\n  {e}")
            continue
        status = "ran"
        if c.gpu and not gpu:
            standin = next((f for rx, f in CPU_STANDINS if rx.search(code)), None)
            alt = standin(code, scratch) if standin else None
            if alt is None:
                outcomes.append(Outcome(c, "gpu", "needs a GPU", code))
                continue
            code, status = alt, "standin"
        elif gpu:
            alt = _gpu_cc_standin(code, scratch)
            if alt:
                code, status = alt, "standin"
        say(f"[{c.where}] {'(stand-in) ' if status == 'standin' else ''}$ {code}")
        t0 = time.monotonic()
        if SERVER.match(code) and gpu and importlib.util.find_spec("flask") is None:
            # the GPU machine's bundle carries mlflow-skinny (no UI server); the CPU test runs the UI commands
            outcomes.append(Outcome(c, "skip", "MLflow's UI server (flask) is not installed here; the CPU test runs it",
                                    code))
            say(f"skip {c.where}: MLflow's UI server (flask) is not installed here; the CPU test runs it")
            continue
        if SERVER.match(code):
            rc, code, out = run_server(code, scratch, env, min(timeout, 300))  # MLflow starts slowly on a busy machine
        else:
            try:
                p = subprocess.run(["bash", "-c", "set -o pipefail; " + code], cwd=scratch, env=env, capture_output=True,
                                   text=True, timeout=timeout)
                rc, out = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired as e:
                rc, out = 124, f"{(e.stdout or b'')!s}{(e.stderr or b'')!s}\n(timed out after {timeout:.0f} s)"
        dt = time.monotonic() - t0
        if rc != 0:
            tail = "\n".join(out.strip().splitlines()[-15:])
            outcomes.append(Outcome(c, "failed", f"exit {rc} after {dt:.1f} s:\n{tail}", code))
            say(f"FAILED {c.where} (exit {rc}): {c.text}\n{tail}")
        else:
            outcomes.append(Outcome(c, status, f"{dt:.1f} s", code))
    return outcomes


def summary(outcomes: List[Outcome], gpu: bool) -> str:
    n = {k: sum(o.status == k for o in outcomes) for k in ("ran", "standin", "failed", "gpu", "skip")}
    ok = n["failed"] == 0 and n["ran"] > 0
    first = next((o for o in outcomes if o.status == "failed"), None)
    return (f"doccmds ({'GPU' if gpu else 'CPU'}): {'PASSED' if ok else 'FAILED'} {n['ran']} ran, {n['standin']} by stand-in, "
            f"{n['failed']} failed, {n['gpu']} need a GPU (not run), {n['skip']} skipped"
            + (f"; first failure {first.cmd.where}: {first.cmd.text}" if first else ""))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: python scripts/doccmds.py --gpu   # README.md's commands on a GPU machine")
    ap.add_argument("docs", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md; with --gpu README.md)")
    ap.add_argument("--gpu", action="store_true", help="run the GPU commands too (on a GPU machine)")
    ap.add_argument("--list", action="store_true", help="only list the commands and how each would run")
    ap.add_argument("--keep", type=Path, help="scratch directory to use and keep (default: a temporary one, removed)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per command (default 420)")
    args = ap.parse_args(argv)
    docs = args.docs or ([ROOT / "README.md"] if args.gpu else default_docs())
    try:
        per_doc = [(d, extract(d)) for d in docs]
    except ValueError as e:
        print(f"doccmds: FAILED {e}")
        return 1
    if args.list:
        for _, cmds in per_doc:
            for c in cmds:
                print(f"{c.where:24} {'skip' if c.skip else 'gpu ' if c.gpu else 'cpu '} {c.text}")
        return 0
    base = args.keep or Path(tempfile.mkdtemp(prefix="mneme-doccmds."))
    outcomes: List[Outcome] = []
    try:
        for d, cmds in per_doc:
            outcomes += run_doc(cmds, base / d.stem, args.gpu, args.timeout)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    line = summary(outcomes, args.gpu)
    print(line)
    return 0 if line.split(": ", 1)[1].startswith("PASSED") else 1


if __name__ == "__main__":
    sys.exit(main())
