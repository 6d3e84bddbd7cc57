"""The captions stage: mixtures -> one phrase per audible label and one caption per mixture.

Input: the mix stage's folder (``mixtures.parquet``, ``occurrences.parquet``,
``segments.parquet``), the label phrases (shipped ``pipeline/data/label_phrases.json``,
optionally with LLM variants) and the caption templates (the shipped
``pipeline/data/caption_templates.txt``, a file of your own, or LLM-written ones). Output, in
``captions.out_dir``:

- ``phrases.parquet``: :class:`~pipeline.schema.LabelPhrase`, one row per label with audible
  segments per mixture, its segments exactly the label's rows of ``segments.parquet``;
- ``captions.parquet``: :class:`~pipeline.schema.Caption`, one row per mixture;
- ``templates.txt`` and ``label_phrases.json``: the templates and phrases this run drew from;
- ``summary.json``.

FineLAP 4.2: a caption fills a template ("This audio contains the sounds of {}.") with the
mixture's event phrases, here in temporal order (first audible instant) and joined as English
("a, b and c"). Each mixture draws its phrases and template from its own generator, seeded by
(seed, split, index), so the captions do not depend on how the work is divided. With
``captions.timeline`` an LLM writes each caption from the mixture's timeline instead.

Templates come from :mod:`pipeline.text.templates`, phrases from
:mod:`pipeline.text.label_phrases`, timeline captions from :mod:`pipeline.text.timeline`.
Everything an LLM writes is cached in ``captions.llm.cache`` (:mod:`pipeline.text.llm`): the
default run needs no network, and an LLM run repeated later reads the cache.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.config.params import folders_besides
from pipeline.outputs import check_out_dir, staged_dir, write_json, write_manifest
from pipeline.schema import (
    SPLITS,
    Caption,
    EventOccurrence,
    LabelPhrase,
    LabelSegment,
    MixtureRecipe,
    TimeSpan,
    from_table,
)
from pipeline.text.label_phrases import default_label_phrases, llm_phrase_variants, phrases_for
from pipeline.text.llm import Completer
from pipeline.text.templates import CaptionError, fill, load_templates
from pipeline.text.timeline import timeline_prompt, validate_timeline_caption

CAPTION_STREAM = 0xCA


def label_phrases_of(recipe: MixtureRecipe, occurrences: list[EventOccurrence], segments: list[LabelSegment],
                     by_label: dict[str, list[str]], rng: np.random.Generator) -> list[LabelPhrase]:
    """One :class:`LabelPhrase` per label with segments, in temporal order (then label)."""
    events: dict[str, dict[int, EventOccurrence]] = defaultdict(dict)
    for o in sorted(occurrences, key=lambda o: o.occurrence_index):
        events[o.label].setdefault(o.event_index, o)
    spans: dict[str, list[LabelSegment]] = defaultdict(list)
    for s in segments:
        spans[s.label].append(s)
    out = []
    for label in sorted(spans, key=lambda lab: (min(s.onset_s for s in spans[lab]), lab)):
        segs = sorted(spans[label], key=lambda s: s.onset_s)
        choices = by_label[label]
        firsts = [events[label][k] for k in sorted(events[label])]
        out.append(LabelPhrase(
            mixture_id=recipe.mixture_id,
            label=label,
            mid=segs[0].mid,
            phrase=choices[int(rng.integers(len(choices)))],
            segments=tuple(TimeSpan(s.onset_s, s.offset_s) for s in segs),
            source_clip_ids=tuple(o.clip_id for o in firsts),
            snr_db=tuple(o.snr_db for o in firsts),
        ))
    return out


def read_mixtures(mix_dir: Path) -> tuple[list[MixtureRecipe], dict[str, list[EventOccurrence]], dict[str, list[LabelSegment]]]:
    """The mix stage's three manifests, occurrences and segments grouped by mixture."""
    missing = [n for n in ("mixtures.parquet", "occurrences.parquet", "segments.parquet") if not (mix_dir / n).exists()]
    if missing:
        raise CaptionError(f"{mix_dir} lacks {', '.join(missing)}: run `sedsynth mix` (or `dvc repro mix`) first")
    recipes = from_table(pq.read_table(mix_dir / "mixtures.parquet"), MixtureRecipe)
    occ: dict[str, list[EventOccurrence]] = defaultdict(list)
    for o in from_table(pq.read_table(mix_dir / "occurrences.parquet"), EventOccurrence):
        occ[o.mixture_id].append(o)
    seg: dict[str, list[LabelSegment]] = defaultdict(list)
    for s in from_table(pq.read_table(mix_dir / "segments.parquet"), LabelSegment):
        seg[s.mixture_id].append(s)
    return recipes, occ, seg


def run(params, mix_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Write phrases and captions for every mixture; returns the summary."""
    p = params.captions
    mix_dir = Path(mix_dir or params.mix.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(out_dir, "captions.out_dir", {**folders_besides(params, "captions.out_dir"), "mix.out_dir": mix_dir})
    recipes, occurrences, segments = read_mixtures(mix_dir)
    completer: Completer | None = None

    def get_completer() -> Completer:
        nonlocal completer
        completer = completer or Completer(p.llm)
        return completer

    templates = load_templates(p.templates, get_completer, p.llm_templates)
    labels = sorted({(s.label, s.mid) for segs in segments.values() for s in segs})
    defaults = default_label_phrases()
    by_label = {label: list(phrases_for(label, mid, defaults)) for label, mid in labels}
    if p.phrases == "llm":
        extra = llm_phrase_variants([label for label, _ in labels], get_completer(), p.llm_phrase_variants)
        by_label = {label: list(dict.fromkeys([*by_label[label], *extra.get(label, [])])) for label in by_label}

    phrase_rows: list[LabelPhrase] = []
    captions: list[Caption] = []
    recipes = sorted(recipes, key=lambda r: (SPLITS.index(r.split), r.index))
    for recipe in tqdm(recipes, desc="captions", unit="mix", disable=None):
        rng = np.random.default_rng([params.seed, CAPTION_STREAM, SPLITS.index(recipe.split), recipe.index])
        phrases = label_phrases_of(recipe, occurrences[recipe.mixture_id], segments[recipe.mixture_id], by_label, rng)
        phrase_rows += phrases
        template = templates[int(rng.integers(len(templates)))]
        words = list(dict.fromkeys(ph.phrase for ph in phrases))
        if not words:
            captions.append(Caption(recipe.mixture_id, p.empty_caption, "", "empty"))
        elif p.timeline:
            prompt = timeline_prompt(recipe.duration_s, phrases)
            captions.append(Caption(recipe.mixture_id, get_completer().complete(prompt, validate_timeline_caption), "", "timeline"))
        else:
            captions.append(Caption(recipe.mixture_id, fill(template, words), template, "template"))

    summary = {
        "mixtures": len(captions),
        "phrases": len(phrase_rows),
        "distinct_phrases": len({ph.phrase for ph in phrase_rows}),
        "labels": len(by_label),
        "templates": len(templates),
        "empty_captions": sum(c.source == "empty" for c in captions),
        "llm_requests": completer.requests if completer else 0,
    }
    with staged_dir(out_dir) as staging:
        write_manifest(staging / "phrases.parquet", phrase_rows, LabelPhrase)
        write_manifest(staging / "captions.parquet", captions, Caption)
        (staging / "templates.txt").write_text("".join(t + "\n" for t in templates), encoding="utf-8")
        write_json(staging / "label_phrases.json", by_label)
        write_json(staging / "summary.json", summary)
    print(f"captions: {summary['mixtures']} captions, {summary['phrases']} label phrases "
          f"({summary['distinct_phrases']} distinct) from {summary['templates']} templates -> {out_dir}", file=sys.stderr)
    return summary
