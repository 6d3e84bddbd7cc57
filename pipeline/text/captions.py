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

Everything an LLM writes is cached in ``captions.llm.cache`` (:mod:`pipeline.text.llm`): the
default run needs no network, and an LLM run repeated later reads the cache.
"""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from tqdm import tqdm

from pipeline.mix.instantiate import SPLITS
from pipeline.ontology import DATA_DIR, default_ontology
from pipeline.outputs import staged_dir, write_json, write_manifest
from pipeline.schema import (
    Caption,
    EventOccurrence,
    LabelPhrase,
    LabelSegment,
    MixtureRecipe,
    TimeSpan,
    from_table,
)
from pipeline.text.inventory import LABEL_PHRASES_PATH
from pipeline.text.llm import Completer, MalformedCompletion, strip_fences
from pipeline.text.phrases import join_phrases, name_phrases

log = logging.getLogger(__name__)
DEFAULT_TEMPLATES = DATA_DIR / "caption_templates.txt"
CAPTION_STREAM = 0xCA
SLOT = "{}"
MIN_LLM_TEMPLATES = 5
MAX_PHRASE_WORDS = 8
LABELS_PER_PROMPT = 40

TEMPLATE_PROMPT = (
    "Write {n} different caption templates for short audio recordings. Each template is one English sentence "
    "with exactly one {{}} slot, which will be replaced by a list of sound events such as \"a dog barking, rain "
    "and a door slam\". Vary the wording and the sentence structure. Output one template per line and nothing else."
)
PHRASE_PROMPT = (
    "For each sound event label below, write {n} short natural English phrases (2 to 6 words) that describe "
    "the sound, for example \"Bark\" -> \"a dog barking\". Answer with one JSON object that maps every label, "
    "exactly as written below, to a list of phrases, and nothing else.\n\nLabels:\n{labels}"
)
TIMELINE_PROMPT = (
    "Write one fluent English caption for a {duration:g}-second audio clip from its sound events and the times "
    "(in seconds) when each is heard. Mention every event and, where it matters, their order or overlap; do not "
    "write the times as numbers. Output only the final caption.\n\n"
    "Events: a dog barking 0.5-2.1; rain 0.0-10.0\n"
    "Caption: A dog barks briefly while rain falls steadily throughout.\n\n"
    "Events: footsteps 1.0-3.0; a door slam 3.2-3.6; male speech 4.0-8.5\n"
    "Caption: Footsteps approach, a door slams, and then a man starts speaking.\n\n"
    "Events: {events}\n"
    "Caption:"
)


class CaptionError(ValueError):
    """A captions problem the user must fix; the message says how."""


# --------------------------------------------------------------------------- templates


def validate_templates(lines: list[str], minimum: int = 1) -> list[str]:
    """Usable templates from raw lines: one ``{}`` slot, no other braces, deduplicated.

    Bullets, numbering and quotes an LLM adds are removed; lines without exactly one slot are
    dropped. Raises :class:`MalformedCompletion` when fewer than ``minimum`` remain.
    """
    out: dict[str, str] = {}
    for raw in lines:
        line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", raw).strip().strip('"').strip("'").strip()
        if not line or line.startswith("#"):
            continue
        if line.count(SLOT) != 1 or line.replace(SLOT, "").count("{") or line.replace(SLOT, "").count("}"):
            continue
        out.setdefault(line.casefold(), line)
    if len(out) < minimum:
        raise MalformedCompletion(f"{len(out)} usable templates (one {{}} slot each), {minimum} needed")
    return list(out.values())


def read_templates(path: Path) -> list[str]:
    if not path.exists():
        raise CaptionError(f"captions: template file {path} not found; set captions.templates to default, llm or a file path")
    try:
        return validate_templates(path.read_text(encoding="utf-8").splitlines())
    except MalformedCompletion:
        raise CaptionError(f"captions: {path} has no usable template; each line needs exactly one {{}} slot") from None


def load_templates(setting: str, completer_factory, num_llm: int) -> list[str]:
    """The template set: ``default`` (shipped), ``llm`` (cached completion) or a file path."""
    if setting == "default":
        return read_templates(DEFAULT_TEMPLATES)
    if setting == "llm":
        prompt = TEMPLATE_PROMPT.format(n=num_llm)
        return completer_factory().complete(prompt, lambda text: validate_templates(strip_fences(text).splitlines(), MIN_LLM_TEMPLATES))
    return read_templates(Path(setting))


def fill(template: str, phrases: list[str]) -> str:
    """A caption: ``template`` with the phrases joined as English in its slot."""
    text = template.replace(SLOT, join_phrases(phrases), 1)
    return text[:1].upper() + text[1:]


# --------------------------------------------------------------------------- phrases


def default_label_phrases() -> dict[str, list[str]]:
    """MID -> phrases, the shipped offline default."""
    return json.loads(LABEL_PHRASES_PATH.read_text(encoding="utf-8"))["phrases"]


def phrases_for(label: str, mid: str, by_mid: dict[str, list[str]]) -> list[str]:
    """The phrases of one label: by MID, else derived from the label's own name."""
    if mid in by_mid:
        return by_mid[mid]
    onto = default_ontology()
    name = onto.by_fsd50k_name[label].name if label in onto.by_fsd50k_name else label.replace("_", " ")
    return name_phrases(name)


def _parse_phrase_variants(labels: list[str]):
    def validate(text: str) -> dict[str, list[str]]:
        try:
            data = json.loads(strip_fences(text))
        except json.JSONDecodeError as e:
            raise MalformedCompletion(f"not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise MalformedCompletion("not a JSON object")
        out = {}
        for label in labels:
            items = data.get(label)
            if not isinstance(items, list):
                raise MalformedCompletion(f"no phrase list for label {label!r}")
            good = [" ".join(str(p).split()).lower() for p in items if isinstance(p, str)]
            out[label] = [p for p in good if 1 <= len(p.split()) <= MAX_PHRASE_WORDS]
        return out

    return validate


def llm_phrase_variants(labels: list[str], completer: Completer, n: int) -> dict[str, list[str]]:
    """Label -> LLM phrases, asked in batches of :data:`LABELS_PER_PROMPT` (cached)."""
    out: dict[str, list[str]] = {}
    for start in range(0, len(labels), LABELS_PER_PROMPT):
        batch = labels[start:start + LABELS_PER_PROMPT]
        prompt = PHRASE_PROMPT.format(n=n, labels="\n".join(batch))
        out.update(completer.complete(prompt, _parse_phrase_variants(batch)))
    return out


# --------------------------------------------------------------------------- per mixture


def timeline_text(phrases: list[LabelPhrase]) -> str:
    return "; ".join(f"{p.phrase} " + ", ".join(f"{s.start_s:.1f}-{s.end_s:.1f}" for s in p.segments) for p in phrases)


def validate_timeline_caption(text: str) -> str:
    lines = [ln.strip() for ln in strip_fences(text).splitlines() if ln.strip()]
    if not lines:
        raise MalformedCompletion("empty caption")
    caption = re.sub(r"^caption:\s*", "", lines[0], flags=re.IGNORECASE).strip().strip('"').strip()
    if not caption or "{" in caption or len(caption.split()) > 80:
        raise MalformedCompletion(f"not a one-sentence caption: {caption[:80]!r}")
    return caption


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


# --------------------------------------------------------------------------- stage


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
            prompt = TIMELINE_PROMPT.format(duration=recipe.duration_s, events=timeline_text(phrases))
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
          f"({summary['distinct_phrases']} distinct) from {summary['templates']} templates -> {out_dir}")
    return summary
