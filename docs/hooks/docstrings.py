"""A griffe extension for the API reference: the project's docstrings are written for Sphinx
(``:class:`~pipeline.schema.EventClip```, a list right under its paragraph); mkdocstrings reads
them as Markdown. This turns each role into a code span naming the object (the last part
after ``~``, as Sphinx shows it), puts a blank line before a list that follows a paragraph
line, so it renders as a list, and escapes a ``>`` that a line break left at the start of a
line (``>= 1.1``), which Markdown would read as a quote; Sphinx's ``::`` before a literal block
becomes ``:`` (the indented block is code in Markdown too)."""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
LIST_AFTER_TEXT = re.compile(r"^(?P<text>[^\s\-*].*)\n(?P<item>[-*] )", re.MULTILINE)
QUOTE_LIKE = re.compile(r"^(?P<indent>[ \t]*)>(?!>>)", re.MULTILINE)  # ">= 1.1" wrapped to a line start; doctests kept
LITERAL_MARK = re.compile(
    r"(?<=\S)::$", re.MULTILINE
)  # Sphinx's "layout::" before an indented block, which Markdown shows as code anyway


def _role(match: re.Match) -> str:
    short, target = match.groups()
    return f"``{target.rsplit('.', 1)[-1] if short else target}``"


def markdown_docstring(text: str) -> str:
    """The docstring with Sphinx roles as code spans, every list set apart from the text above it and
    no line read as a quote."""
    text = LITERAL_MARK.sub(":", QUOTE_LIKE.sub(r"\g<indent>\\>", ROLE.sub(_role, text)))
    return LIST_AFTER_TEXT.sub(r"\g<text>\n\n\g<item>", text)


class SphinxRolesAsCode(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
