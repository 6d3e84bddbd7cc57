"""The evaluation's pictures: which absent classes a clip's picture shows, that they are drawn
below its own phrases and marked as absent, and the class-by-class confusion heatmap.

Each figure is kept as it is saved (``plots.save_png`` wrapped), so the tests read what was
drawn (row labels, shading, colours, tick labels, cell values) as well as the PNG written.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle

from trainer.evaluation import plots

SR = 16000
PNG = b"\x89PNG\r\n\x1a\n"
GRID = np.arange(21) * 0.1  # 20 frames of 0.1 s
QUERIES = ["a dog barks", "rain", "a car passes"]
TRUTH = {"a dog barks": [(0.2, 0.8)], "rain": [(1.0, 1.5)]}
EVENTS = {"a dog barks": [(0.2, 0.8, 0.9)], "rain": [(1.0, 1.5, 0.8)]}


@pytest.fixture
def figures(monkeypatch) -> list:
    """The figures saved while the test runs, in order (each still written as a PNG)."""
    kept, real = [], plots.save_png

    def keep(fig, path, dpi):
        kept.append(fig)
        real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_png", keep)
    return kept


def picture(tmp_path, **kwargs):
    wave = np.random.default_rng(0).normal(0, 0.1, 2 * SR).astype(np.float32)
    probs = np.linspace(0, 1, 20 * len(QUERIES)).reshape(20, len(QUERIES))
    path = tmp_path / "pictures" / "clip.png"
    plots.detection_figure(path, wave, SR, GRID, probs, QUERIES, truth=TRUTH, events=EVENTS, title="clip", **kwargs)
    assert path.read_bytes()[:8] == PNG
    return path


def rows_drawn(fig) -> list[dict]:
    """Each query row of a detection figure: its label, shaded spans, event bars and background."""
    return [
        {
            "label": ax.texts[0].get_text(),
            "spans": sum(isinstance(p, Rectangle) for p in ax.patches),
            "lines": len(ax.lines),
            "background": to_rgb(ax.get_facecolor()),
        }
        for ax in fig.axes[1:]
    ]


def test_top_absent_skips_present_classes_and_orders_by_peak():
    classes = ("dog", "car", "bell", "rain", "wind")
    probs = np.array(
        [[0.9, 0.1, 0.3, 0.0, 0.5], [0.2, 0.8, 0.4, 0.6, 0.1]]
    )  # peaks: dog 0.9, car 0.8, bell 0.4, rain 0.6, wind 0.5
    assert plots.top_absent(probs, classes, {"dog"}) == [1, 3, 4]
    assert plots.top_absent(probs, classes, {"car", "rain"}, n=2) == [0, 4]
    assert plots.top_absent(probs, classes, set(classes)) == []
    assert plots.top_absent(np.full((3, 5), 0.5), classes, {"bell"}) == [0, 1, 3]  # ties: the earlier class
    assert plots.top_absent(np.zeros((0, 5)), classes, set()) == [0, 1, 2]


def test_absent_rows_are_drawn_below_in_grey_without_truth_or_events(tmp_path, figures):
    picture(tmp_path, absent=2)
    (fig,) = figures
    own, *gone = rows_drawn(fig)
    assert own == {"label": "a dog barks", "spans": 1, "lines": 2, "background": (1.0, 1.0, 1.0)}  # threshold line + event bar
    assert [g["label"] for g in gone] == ["rain (absent)", "a car passes (absent)"]
    for g in gone:  # rain's truth and event are not drawn on its absent row
        assert (g["spans"], g["lines"]) == (0, 1)
        assert g["background"] == pytest.approx((0.93, 0.93, 0.93))
    assert [to_rgb(ax.texts[0].get_color()) for ax in fig.axes[2:]] == [pytest.approx((0.4, 0.4, 0.4))] * 2


def test_without_absent_rows_the_picture_is_as_before(tmp_path, figures):
    picture(tmp_path)
    (fig,) = figures
    rows = rows_drawn(fig)
    assert [r["label"] for r in rows] == QUERIES
    assert [(r["spans"], r["lines"]) for r in rows] == [(1, 2), (1, 2), (0, 1)]
    assert all(r["background"] == (1.0, 1.0, 1.0) for r in rows)


def test_confusion_figure_names_both_axes_with_a_colour_bar_and_the_values(tmp_path, figures):
    path = tmp_path / "pictures" / "confusion.png"
    plots.confusion_figure(path, np.array([[0.55, 0.5], [np.nan, np.nan]]), ["dog", "car"])
    assert path.read_bytes()[:8] == PNG
    (fig,) = figures
    ax, bar = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["dog", "car"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dog", "car"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("query class", "true class")
    assert "peak probability" in ax.get_title() and "events" in ax.get_title()
    assert bar.get_ylabel() == "mean peak probability"
    assert sorted(t.get_text() for t in ax.texts) == ["0.50", "0.55"]  # the row without events stays blank
    many = [f"class {k}" for k in range(30)]
    plots.confusion_figure(path, np.full((30, 30), 0.2), many)  # too many classes for values in the cells
    assert not figures[-1].axes[0].texts and path.read_bytes()[:8] == PNG
