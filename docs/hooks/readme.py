"""MkDocs hook: the README's "What you should see" section, shown on the page that asks for it.

The figures of the default run are written once, in the README. A page holding the line
``<!-- README: What you should see -->`` gets that section (from its heading to the next
``## `` heading) in its place. The README links into ``docs/``; those links are made relative
to the site's root, so they resolve from a page at the top of ``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = re.compile(r"^<!-- README: (?P<title>.+?) -->$", re.MULTILINE)


def readme_section(readme: str, title: str) -> str:
    """The section ``## {title}`` of ``readme``, up to the next second-level heading."""
    found = re.search(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", readme, re.MULTILINE | re.DOTALL)
    if found is None:
        raise ValueError(f"README.md has no section '## {title}'")
    return re.sub(r"\]\(docs/", "](", found.group(0))


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not MARKER.search(markdown):
        return markdown
    if page.file.src_uri.count("/"):
        raise ValueError(f"{page.file.src_uri}: the README's sections resolve their links from the top of docs/ only")
    readme = (Path(config["config_file_path"]).parent / "README.md").read_text(encoding="utf-8")
    return MARKER.sub(lambda m: readme_section(readme, m.group("title")), markdown)
