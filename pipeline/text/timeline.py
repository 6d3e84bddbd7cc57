"""Timeline captions: an LLM writes one sentence from a mixture's events and when each is heard.

Input: a mixture's :class:`~pipeline.schema.LabelPhrase` rows (phrase and audible segments)
and its duration. Output: the few-shot prompt (:func:`timeline_prompt`) and the check of the
answer (:func:`validate_timeline_caption`), which keeps one sentence without its
``Caption:`` prefix or quotes.
"""

from __future__ import annotations

import re

from pipeline.schema import LabelPhrase
from pipeline.text.llm import MalformedCompletion, strip_fences

MAX_CAPTION_WORDS = 80

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


def timeline_text(phrases: list[LabelPhrase]) -> str:
    """``"a dog barking 0.5-2.1, 6.0-7.2; rain 0.0-10.0"``: each phrase with its segments in seconds."""
    return "; ".join(f"{p.phrase} " + ", ".join(f"{s.start_s:.1f}-{s.end_s:.1f}" for s in p.segments) for p in phrases)


def timeline_prompt(duration_s: float, phrases: list[LabelPhrase]) -> str:
    """The prompt that asks for the caption of a ``duration_s`` mixture with these phrases."""
    return TIMELINE_PROMPT.format(duration=duration_s, events=timeline_text(phrases))


def validate_timeline_caption(text: str) -> str:
    """The caption in an LLM answer; :class:`MalformedCompletion` when it is empty, templated or too long."""
    lines = [ln.strip() for ln in strip_fences(text).splitlines() if ln.strip()]
    if not lines:
        raise MalformedCompletion("empty caption")
    caption = re.sub(r"^caption:\s*", "", lines[0], flags=re.IGNORECASE).strip().strip('"').strip()
    if not caption or "{" in caption or len(caption.split()) > MAX_CAPTION_WORDS:
        raise MalformedCompletion(f"not a one-sentence caption: {caption[:80]!r}")
    return caption
