"""What a user reads: each command's --help (purpose, one example, no internal names), the Hydra app's
--help (its experiments), `mneme cc --help` (mneme's additions first), shell completion, JSON on stdout."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mneme import cli

ROOT = Path(__file__).resolve().parent.parent
VECADD = next((ROOT / "tests" / "fixtures" / "vecadd").glob("*.json"))
INTERNAL = ("seeds", "add_arguments", "imported only", "CFG:", "console script", "Proteus")


def _run(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_top_level_help_says_what_mneme_is_for_with_examples(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "record the CUDA kernels" in out and "examples:" in out and "mneme record -rdb rec" in out
    assert not [w for w in INTERNAL if w in out]


@pytest.mark.parametrize("command", sorted(set(cli.COMMANDS) - {"cc", "nvcc"}))
def test_each_command_help_has_purpose_and_example(command, capsys):
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    out = capsys.readouterr().out
    purpose, example = cli.COMMANDS[command][1:]
    assert purpose[1:] in out and f"example:\n  {example}" in out
    assert not [w for w in INTERNAL if w in out], out


def test_cc_help_describes_mneme_additions_before_clang():
    p = _run("-m", "mneme.cli", "cc", "--help")
    assert p.returncode == 0, p.stderr
    ours, clang = p.stdout.find("embedded"), p.stdout.find("OVERVIEW: clang")
    assert 0 <= ours < clang, p.stdout[:400]


def test_nvcc_help_describes_mneme_additions_with_an_example():
    p = _run("-m", "mneme.cli", "nvcc", "--help")
    assert p.returncode == 0, p.stderr
    ours, theirs = p.stdout.find("What mneme adds"), p.stdout.find("nvcc's options it takes")
    assert 0 <= ours < theirs and "example:" in p.stdout, p.stdout[:400]


def test_hydra_app_help_lists_every_experiment():
    p = _run("-m", "mneme", "--help", cwd=ROOT)
    assert p.returncode == 0, p.stderr
    listed = {line.split()[0] for line in p.stdout.split("experiments (")[1].split("examples:")[0].splitlines()[1:]
              if line.strip()}
    assert listed == {f.stem for f in (ROOT / "experiments").glob("*.yaml")}
    assert "python -m mneme +experiment=sweep record.db=" in p.stdout and "__main__ is powered by Hydra" not in p.stdout


def test_shell_completion_completes_subcommands_and_their_flags(tmp_path):
    pytest.importorskip("argcomplete")
    out = tmp_path / "completions"
    for line, want in (("mneme rep", "replay"), ("mneme replay --compile-o", "--compile-only")):
        p = _run("-m", "mneme.cli", env={"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
                                          "_ARGCOMPLETE_STDOUT_FILENAME": str(out)})
        assert p.returncode == 0, p.stderr
        assert want in out.read_text().split(), out.read_text()


def test_the_hydra_apps_console_script_runs_anywhere_and_hydra_completes_it(tmp_path):
    """`mneme-run` is `python -m mneme` as a program of its own, so that Hydra's shell completion can call it."""
    exe = Path(sys.executable).parent / "mneme-run"
    assert exe.is_file(), f"{exe}: the console script is missing (pip install -e .)"
    run = lambda *a, env=None: subprocess.run([str(exe), *a], capture_output=True, text=True, cwd=tmp_path,  # noqa: E731
                                               env={**os.environ, **(env or {})}, timeout=300)
    p = run("--help")
    assert p.returncode == 0 and "experiments (experiments/NAME.yaml):" in p.stdout, p.stderr[-2000:]
    for line, want in (("mneme-run +experiment=", "+experiment=sweep"), ("mneme-run search_space=", "search_space=standard"),
                       ("mneme-run stu", "study.")):
        q = run("-sc", "query=bash", env={"COMP_LINE": line})
        assert q.returncode == 0 and want in q.stdout.split(), (line, q.stdout, q.stderr[-2000:])
    assert "complete -o nospace" in run("-sc", "install=bash").stdout


def test_replay_json_to_stdout_is_json_only():
    p = _run("-m", "mneme.cli", "replay", "-rdb", str(VECADD), "--compile-only", "--json", "-")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # the human summary went to stderr
    assert doc["result"]["reg_usage"] > 0 and "registers" in p.stderr
