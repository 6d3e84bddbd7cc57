"""The phrases a caption may use for each label: the shipped ones, plus LLM-written variants.

Input: a label's FSD50K name and AudioSet MID. Output: its phrases, from the shipped
``pipeline/data/label_phrases.json`` by MID (:func:`default_label_phrases`), else derived from
the label's ontology name (:func:`phrases_for`); with ``captions.phrases: llm``,
:func:`llm_phrase_variants` asks an LLM for more, :data:`LABELS_PER_PROMPT` labels per
request, each answer cached.
"""

from __future__ import annotations

import json

from pipeline.ontology import default_ontology
from pipeline.text.inventory import LABEL_PHRASES_PATH
from pipeline.text.llm import Completer, MalformedCompletion, strip_fences
from pipeline.text.phrases import name_phrases

MAX_PHRASE_WORDS = 8
LABELS_PER_PROMPT = 40

PHRASE_PROMPT = (
    "For each sound event label below, write {n} short natural English phrases (2 to 6 words) that describe "
    'the sound, for example "Bark" -> "a dog barking". Answer with one JSON object that maps every label, '
    "exactly as written below, to a list of phrases, and nothing else.\n\nLabels:\n{labels}"
)


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
        batch = labels[start : start + LABELS_PER_PROMPT]
        prompt = PHRASE_PROMPT.format(n=n, labels="\n".join(batch))
        out.update(completer.complete(prompt, _parse_phrase_variants(batch)))
    return out
