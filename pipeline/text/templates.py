"""Caption templates: sentences with one ``{}`` slot, filled with a mixture's event phrases.

Input: a ``captions.templates`` setting: ``default`` (the shipped
``pipeline/data/caption_templates.txt``), ``llm`` (FineLAP 4.2: an LLM writes them, asked once
and cached) or the path of a file of templates, one per line. Output: the usable templates
(:func:`load_templates`), and a caption from a template and phrases (:func:`fill`:
``"This audio contains the sounds of {}."`` with ``dog barking`` and ``rain`` gives
``"This audio contains the sounds of dog barking and rain."``).
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.files import NotRegularFileError, read_regular
from pipeline.ontology import DATA_DIR
from pipeline.text.llm import MalformedCompletion, strip_fences
from pipeline.text.phrases import join_phrases

DEFAULT_TEMPLATES = DATA_DIR / "caption_templates.txt"
SLOT = "{}"
MIN_LLM_TEMPLATES = 5

TEMPLATE_PROMPT = (
    "Write {n} different caption templates for short audio recordings. Each template is one English sentence "
    'with exactly one {{}} slot, which will be replaced by a list of sound events such as "a dog barking, rain '
    'and a door slam". Vary the wording and the sentence structure. Output one template per line and nothing else.'
)


class CaptionError(ValueError):
    """A captions problem the user must fix; the message says how."""


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


MAX_TEMPLATE_BYTES = 16 * 1024 * 1024  # far past any template list; a device would never end


def read_templates(path: Path) -> list[str]:
    """The usable templates of a file, one per line; :class:`CaptionError` when it is missing, not a regular
    file (a FIFO would block the reader), over :data:`MAX_TEMPLATE_BYTES` or has no usable line."""
    if not path.exists():
        raise CaptionError(f"captions: template file {path} not found; set captions.templates to default, llm or a file path")
    try:
        text = read_regular(path, "captions.templates", max_bytes=MAX_TEMPLATE_BYTES).decode("utf-8", "replace")
        return validate_templates(text.splitlines())
    except MalformedCompletion:  # a ValueError: before the size's
        raise CaptionError(f"captions: {path} has no usable template; each line needs exactly one {{}} slot") from None
    except (NotRegularFileError, ValueError) as e:
        raise CaptionError(f"captions: {e}") from None


def load_templates(setting: str, completer_factory, num_llm: int) -> list[str]:
    """The template set: ``default`` (shipped), ``llm`` (cached completion) or a file path.

    ``completer_factory`` returns the :class:`~pipeline.text.llm.Completer` to ask; it is
    called only for ``llm``, so the other settings never open a connection.
    """
    if setting == "default":
        return read_templates(DEFAULT_TEMPLATES)
    if setting == "llm":
        prompt = TEMPLATE_PROMPT.format(n=num_llm)
        return completer_factory().complete(
            prompt, lambda text: validate_templates(strip_fences(text).splitlines(), MIN_LLM_TEMPLATES)
        )
    return read_templates(Path(setting))


def fill(template: str, phrases: list[str]) -> str:
    """A caption: ``template`` with the phrases joined as English in its slot."""
    text = template.replace(SLOT, join_phrases(phrases), 1)
    return text[:1].upper() + text[1:]
