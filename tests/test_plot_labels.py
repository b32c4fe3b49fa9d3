"""PNG plots: the y axis is labelled with the definition's unit, the notes wrap instead of being cut."""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from registry import Registry
from registry.web.curves import SmoothOptions, run_plot_spec
from registry.web.plotting import PlotSpec, render, wrap_notes


def test_run_plot_is_labelled_with_the_definition_unit(sqlite_url):
    reg = Registry(sqlite_url)
    res = reg.register_arrays("r", {"train/approx_kl": (np.arange(1, 5001), np.abs(np.random.default_rng(1).normal(0.01, 0.002, 5000)))},
                              framework="stable-baselines3")
    detail = reg.run_detail(res.run_id)
    [series] = detail["series"]
    definition = reg.definitions_by_name([series["definition"]])[series["definition"]]
    assert definition["unit"]
    data = reg.read_series(res.run_id, "train/approx_kl")
    spec, _ = run_plot_spec(data, sign=1.0, definition=definition, task=None,
                            opts=SmoothOptions.from_args({"points": "300"}))
    assert spec.ylabel == definition["unit"]
    assert any(n.startswith("downsampled 5,000 -> ") or n.startswith("downsampled 5000 -> ") for n in spec.notes)
    labelled = Image.open(io.BytesIO(render(spec))).convert("L")
    unlabelled = Image.open(io.BytesIO(render(PlotSpec(traces=spec.traces, notes=spec.notes, ylim=spec.ylim)))).convert("L")
    # The label is drawn: more dark pixels in the left margin, where a rotated label goes, than tick labels alone make.
    strip = lambda im: int((np.asarray(im)[:, : int(im.width * 0.065)] < 128).sum())  # noqa: E731
    assert strip(labelled) > strip(unlabelled) + 30
    reg.close()


def test_notes_wrap_onto_a_second_line_and_are_never_lost():
    notes = ["smoothing window 6 (the definition's 15, capped to 10% of 60 points)", "downsampled 60 -> 20 points",
             "3 NaN/Inf (red ticks)"]
    lines = wrap_notes(notes, 80)
    assert lines == [notes[0], notes[1] + "  \u00b7  " + notes[2]]
    assert wrap_notes(notes[1:], 80) == [notes[1] + "  \u00b7  " + notes[2]]
    assert len(wrap_notes(notes, 30)) == 2
