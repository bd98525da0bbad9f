"""Every command of README.md and docs/*.md runs as written (scripts/doccmds.py; GPU mode runs on the GPU)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("doccmds", ROOT / "scripts" / "doccmds.py")
doccmds = importlib.util.module_from_spec(_spec)
sys.modules["doccmds"] = doccmds
_spec.loader.exec_module(doccmds)

DOCS = doccmds.default_docs()


def test_every_code_block_is_tagged_run_or_text():
    cmds = [c for d in DOCS for c in doccmds.extract(d)]
    assert len(cmds) > 20


def test_untagged_block_is_an_error_naming_the_line(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("intro\n\n```\nmneme show rec\n```\n")
    with pytest.raises(ValueError, match=r"x.md:3: untagged"):
        doccmds.extract(md)


def test_readme_gpu_commands_cover_the_main_workflow():
    """GPU mode runs these as a user types them: record, show, replay, tune, sweep, compare, in this order."""
    cmds = doccmds.extract(ROOT / "README.md")
    order = [next(i for i, c in enumerate(cmds) if c.text.startswith(p) and (c.gpu == g)) for p, g in (
        ("mneme record", True), ("mneme show", False), ("mneme replay", True), ("mneme tune", True),
        ("python -m mneme +experiment=sweep", True), ("mneme compare", False))]
    assert order == sorted(order)


def test_a_failing_command_and_an_unknown_placeholder_fail(tmp_path):
    md = tmp_path / "bad.md"
    md.write_text("```bash\ntrue\nls rec/<static-hash>.json\nmneme show <nothing>\nfalse   # fails\n```\n")
    out = doccmds.run_doc(doccmds.extract(md), tmp_path / "s", gpu=False, timeout=60, say=lambda s: None)
    assert [o.status for o in out] == ["ran", "failed", "failed", "failed"]
    assert "<static-hash>" in out[1].detail and "unknown placeholder <nothing>" in out[2].detail
    assert doccmds.summary(out, False).startswith("doccmds (CPU): FAILED 1 ran")


@pytest.mark.parametrize("doc", [d for d in DOCS if any(not c.skip and not c.gpu for c in doccmds.extract(d))],
                         ids=lambda d: d.name)
def test_doc_commands_run_as_written(doc, tmp_path):
    out = doccmds.run_doc(doccmds.extract(doc), tmp_path, gpu=False, timeout=420, say=lambda s: None)
    failed = [f"{o.cmd.where}: {o.cmd.text}\n  ran: {o.ran}\n  {o.detail}" for o in out if o.status == "failed"]
    assert not failed, "\n".join(failed)
    assert any(o.status == "ran" for o in out)
