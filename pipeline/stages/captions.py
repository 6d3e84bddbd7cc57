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

The files a user names (a ``captions.templates`` file, and ``captions.llm.cache`` where an LLM is
asked) must be regular files: a FIFO would block the stage for ever and a device never ends, so
either is refused in one line (:class:`~pipeline.files.NotRegularFileError`) before the mixtures
are read.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.config.params import folders_besides
from pipeline.files import NotRegularFileError, special_file_problem
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


def label_phrases_of(
    recipe: MixtureRecipe,
    occurrences: list[EventOccurrence],
    segments: list[LabelSegment],
    by_label: dict[str, list[str]],
    rng: np.random.Generator,
) -> list[LabelPhrase]:
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
        out.append(
            LabelPhrase(
                mixture_id=recipe.mixture_id,
                label=label,
                mid=segs[0].mid,
                phrase=choices[int(rng.integers(len(choices)))],
                segments=tuple(TimeSpan(s.onset_s, s.offset_s) for s in segs),
                source_clip_ids=tuple(o.clip_id for o in firsts),
                snr_db=tuple(o.snr_db for o in firsts),
            )
        )
    return out


MIXTURES_PER_CHUNK = 4096  # recipes made Python records at a time (their occurrences and segments with them)


def read_mixtures(mix_dir: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The mix stage's three manifests as Arrow tables: the recipes in (split, index) order, the
    occurrences and segments in the same mixture order (a mixture's rows in their stored order),
    each with its recipe's row number in ``_position`` (-1: a row of no recipe, never read)."""
    missing = [n for n in ("mixtures.parquet", "occurrences.parquet", "segments.parquet") if not (mix_dir / n).exists()]
    if missing:
        raise CaptionError(f"{mix_dir} lacks {', '.join(missing)}: run `sedsynth mix` (or `dvc repro mix`) first")
    recipes = pq.read_table(mix_dir / "mixtures.parquet")
    split_rank = pc.index_in(recipes["split"], value_set=pa.array(SPLITS))
    recipes = recipes.take(np.lexsort((recipes["index"].to_numpy(), split_rank.to_numpy(zero_copy_only=False))))

    def in_recipe_order(table: pa.Table) -> pa.Table:
        position = pc.fill_null(pc.index_in(table["mixture_id"], value_set=recipes["mixture_id"]), -1).to_numpy()
        order = np.argsort(position, kind="stable")
        return table.take(order).append_column("_position", pa.array(position[order]))

    return (
        recipes,
        in_recipe_order(pq.read_table(mix_dir / "occurrences.parquet")),
        in_recipe_order(pq.read_table(mix_dir / "segments.parquet")),
    )


def mixtures_in_order(
    recipes: pa.Table, occurrences: pa.Table, segments: pa.Table, chunk: int = MIXTURES_PER_CHUNK
) -> Iterator[tuple[MixtureRecipe, list[EventOccurrence], list[LabelSegment]]]:
    """Each recipe of :func:`read_mixtures`' tables with its occurrences and segments, as records,
    ``chunk`` recipes at a time: memory holds the tables' columns, not every mixture's records."""
    bounds = [np.searchsorted(t["_position"].to_numpy(), np.arange(recipes.num_rows + 1)) for t in (occurrences, segments)]
    for start in range(0, recipes.num_rows, chunk):
        stop = min(start + chunk, recipes.num_rows)
        rows = [
            from_table(t.slice(b[start], b[stop] - b[start]), kind)
            for t, b, kind in ((occurrences, bounds[0], EventOccurrence), (segments, bounds[1], LabelSegment))
        ]
        for i, recipe in enumerate(from_table(recipes.slice(start, stop - start), MixtureRecipe), start):
            yield recipe, *(r[b[i] - b[start] : b[i + 1] - b[start]] for r, b in zip(rows, bounds))


def refuse_special_files(p) -> None:
    """Raise :class:`NotRegularFileError` where a file the captions settings ``p`` name, and the run
    will read, is a FIFO, device, socket or folder (a missing one is left to its reader)."""
    named = []
    if p.templates not in ("default", "llm"):
        named.append(("captions.templates", p.templates))
    if p.templates == "llm" or p.phrases == "llm" or p.timeline:
        named.append(("captions.llm.cache", p.llm.cache))
    for role, path in named:
        problem = special_file_problem(path)
        if problem:
            raise NotRegularFileError(f"{role} {path} {problem}; point it at a file")


def run(params, mix_dir: Path | None = None, out_dir: Path | None = None) -> dict:
    """Write phrases and captions for every mixture; returns the summary."""
    p = params.captions
    mix_dir = Path(mix_dir or params.mix.out_dir)
    out_dir = Path(out_dir or p.out_dir)
    check_out_dir(out_dir, "captions.out_dir", {**folders_besides(params, "captions.out_dir"), "mix.out_dir": mix_dir})
    refuse_special_files(p)
    tables = read_mixtures(mix_dir)
    completer: Completer | None = None

    def get_completer() -> Completer:
        nonlocal completer
        completer = completer or Completer(p.llm)
        return completer

    try:
        templates = load_templates(p.templates, get_completer, p.llm_templates)
        labels = sorted(tuple(row.values()) for row in tables[2].group_by(["label", "mid"]).aggregate([]).to_pylist())
        defaults = default_label_phrases()
        by_label = {label: list(phrases_for(label, mid, defaults)) for label, mid in labels}
        if p.phrases == "llm":
            extra = llm_phrase_variants([label for label, _ in labels], get_completer(), p.llm_phrase_variants)
            by_label = {label: list(dict.fromkeys([*by_label[label], *extra.get(label, [])])) for label in by_label}

        phrase_rows: list[LabelPhrase] = []
        captions: list[Caption] = []
        for recipe, occurrences, segments in tqdm(
            mixtures_in_order(*tables, chunk=MIXTURES_PER_CHUNK),
            total=tables[0].num_rows,
            desc="captions",
            unit="mix",
            disable=None,
        ):
            rng = np.random.default_rng([params.seed, CAPTION_STREAM, SPLITS.index(recipe.split), recipe.index])
            phrases = label_phrases_of(recipe, occurrences, segments, by_label, rng)
            phrase_rows += phrases
            template = templates[int(rng.integers(len(templates)))]
            words = list(dict.fromkeys(ph.phrase for ph in phrases))
            if not words:
                captions.append(Caption(recipe.mixture_id, p.empty_caption, "", "empty"))
            elif p.timeline:
                prompt = timeline_prompt(recipe.duration_s, phrases)
                captions.append(
                    Caption(recipe.mixture_id, get_completer().complete(prompt, validate_timeline_caption), "", "timeline")
                )
            else:
                captions.append(Caption(recipe.mixture_id, fill(template, words), template, "template"))
    finally:
        if completer is not None:  # its requests' thread and connections
            completer.close()

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
    print(
        f"captions: {summary['mixtures']} captions, {summary['phrases']} label phrases "
        f"({summary['distinct_phrases']} distinct) from {summary['templates']} templates -> {out_dir}",
        file=sys.stderr,
    )
    return summary
