"""Captions, phrases and class names are untrusted shard data, and figures draw them: every text a
figure draws is cut to 120 characters on one line, with ``$`` shown as written, so a caption of
megabytes does not stall matplotlib's layout and one that looks like TeX does not fail the picture."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from trainer.evaluation import plots

SR = 16000
TEX = r"costs $\frac{1}$ and "  # matplotlib's mathtext cannot parse it


@pytest.fixture
def figures(monkeypatch) -> list:
    kept, real = [], plots.save_png

    def keep(fig, path, dpi):
        kept.append(fig)
        real(fig, path, dpi)

    monkeypatch.setattr(plots, "save_png", keep)
    return kept


def every_text(fig) -> list[str]:
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    return [t for t in texts if t]


def test_a_huge_caption_and_phrase_are_drawn_cut_on_one_line(tmp_path, figures):
    caption = TEX + "a dog barks\n" * 1_000_000  # 12 MB
    phrase = "a dog\tbarking " * 10_000
    start = time.perf_counter()
    plots.detection_figure(
        tmp_path / "clip.png",
        np.zeros(SR, np.float32),
        SR,
        np.arange(11) * 0.1,
        np.full((10, 2), 0.5),
        [phrase, "rain"],
        title=f"clip_1: {caption}",
        absent=1,
    )
    assert time.perf_counter() - start < 10
    [fig] = figures
    title = fig.axes[0].get_title(loc="left")
    assert (
        len(title.replace(r"\$", "$")) == plots.TEXT_MAX_CHARS
        and title.startswith(r"clip_1: costs \$\frac{1}\$ and a dog barks a dog")
        and title.endswith("\u2026")
    )
    labels = [ax.texts[0].get_text() for ax in fig.axes[1:]]
    assert labels[0].startswith("a dog barking") and len(labels[0]) == plots.TEXT_MAX_CHARS and "\t" not in labels[0]
    assert labels[1] == "rain (absent)"
    assert all(len(t) <= plots.TEXT_MAX_CHARS + len(" (absent)") and "\n" not in t for t in every_text(fig))


def test_confusion_and_curve_labels_are_cut_too(tmp_path, figures):
    classes = ["Dog", TEX + "x" * 5000]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Tight layout not applied")  # 120 characters do not fit beside the axes: drawn anyway
        plots.confusion_figure(tmp_path / "c.png", np.full((2, 2), 0.5), classes)
        plots.curves_figure(
            tmp_path / "k.png",
            {"m" * 500: {"roc": ([0, 1], [0, 1]), "psd_1_roc": ([0, 1], [0, 1]), "psd_2_roc": ([0, 1], [0, 1])}},
        )
    confusion, curves = figures
    ticks = [t.get_text() for t in confusion.axes[0].get_xticklabels()]
    assert ticks[0] == "Dog" and ticks[1].startswith(r"costs \$") and len(ticks[1]) == plots.TEXT_MAX_CHARS + 2  # two $ escaped
    assert confusion.axes[0].get_title().count("\n") == 1  # the default title keeps its two lines
    assert all(len(t) <= 160 for f in figures for t in every_text(f))


def test_drawn_keeps_short_text_and_looks_at_its_head_only():
    assert plots.drawn("a dog barks") == "a dog barks"
    assert plots.drawn("x" * 120) == "x" * 120 and plots.drawn("x" * 121) == "x" * 119 + "\u2026"
    assert plots.drawn("a\u2028b\x85c\rd") == "a b c d"
    assert plots.drawn("one\ntwo\nthree", lines=2) == "one\ntwo three"
