"""The sweep's plots as a person reads them: one panel per kernel titled by it, labelled axes with units, a legend,
the baseline and the best trial marked, whole-number ticks for trial numbers and counts. Drawn to SVG, whose text
matplotlib keeps (as comments beside the glyphs), so the labels can be read back."""

import re

import numpy as np
import pandas as pd
import pytest

from mneme.track import plots


@pytest.fixture
def trials():
    rows = []
    for kernel, base in (("vecAdd", 1000.0), ("stencil2d", 4000.0)):
        rows.append(dict(trial=-1, kernel=kernel, role="baseline", verified=1, speedup=1.0, time_ns=base, registers=16,
                         local_mem=0))
        for i, (sp, regs) in enumerate(((1.1, 18), (0.9, 20), (None, None), (1.3, 22), (1.2, 17))):
            rows.append(dict(trial=i, kernel=kernel, role="trial", verified=int(sp is not None),
                             speedup=sp if sp is not None else np.nan, time_ns=base / sp if sp else np.nan,
                             registers=regs if regs is not None else np.nan, local_mem=8 * i if regs else np.nan))
    return pd.DataFrame(rows)


def _texts(path):
    return re.findall(r"<!-- (.*?) -->", path.read_text())


def _ticks_before(texts, label):
    """The tick labels matplotlib wrote just before an axis label (that axis's ticks)."""
    i = texts.index(label)
    ticks = []
    for t in reversed(texts[:i]):
        if not re.fullmatch(r"[-−]?\d+(\.\d+)?", t):
            break
        ticks.append(t)
    return ticks


def test_speedup_over_trials_per_kernel_with_baseline_best_and_failures(trials, tmp_path):
    texts = _texts(plots.speedup_over_trials(trials, tmp_path / "s.svg", title="sweep x"))
    assert texts.count("trial number") == 2 and texts.count("speedup over baseline (x)") == 2
    assert {"vecAdd", "stencil2d", "sweep x"} <= set(texts)
    assert texts.count("baseline (1.0x)") == 2 and texts.count("failed trial") == 2
    assert texts.count("best: 1.30x (trial 3)") == 2 and texts.count("best so far") == 2
    xticks = _ticks_before(texts, "trial number")
    assert xticks and all(re.fullmatch(r"\d+", t) for t in xticks), xticks  # no half trials


def test_pareto_plot_has_units_front_baseline_and_fastest(trials, tmp_path):
    texts = _texts(plots.pareto_time_registers(trials, tmp_path / "p.svg"))
    assert texts.count("registers per thread") == 2 and texts.count("median execution time (µs)") == 2
    assert texts.count("Pareto front") == 2 and texts.count("baseline") == 2
    assert "fastest: 0.77 µs, 22 regs" in texts and "fastest: 3.08 µs, 22 regs" in texts
    assert all(re.fullmatch(r"\d+", t) for t in _ticks_before(texts, "registers per thread"))


def test_compile_only_plot_labels_both_counts_with_whole_ticks(trials, tmp_path):
    texts = _texts(plots.compile_metrics_over_trials(trials, tmp_path / "c.svg"))
    assert texts.count("registers per thread") == 2 and texts.count("local memory (bytes)") == 2
    assert texts.count("baseline: 16") == 2 and "fewest: 17 (trial 4)" in texts and "fewest: 0 (trial 0)" in texts
    assert "compile-only: registers and local memory per trial" in texts
    for label in ("registers per thread", "local memory (bytes)"):
        ticks = _ticks_before(texts, label)
        assert ticks and all(re.fullmatch(r"[-−]?\d+", t) for t in ticks), (label, ticks)
