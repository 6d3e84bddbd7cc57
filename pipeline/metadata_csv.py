"""Reading metadata CSVs (FSD50K ground truth, ambience metadata) one physical line at a time.

Input: a CSV file whose records never span lines (true of both formats). Output: the
lower-cased header and ``(line_number, fields)`` for every non-blank line. Parsing each line
on its own means an unbalanced quote spoils only its own row, which then fails the
field-count check, instead of swallowing the rows after it; line numbers are the file's
own. A UTF-8 byte-order mark and CRLF endings are accepted; undecodable bytes become U+FFFD.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path


def read_header_and_rows(path: Path) -> tuple[list[str], Iterator[tuple[int, list[str]]]]:
    """The header (stripped, lower case; empty for an empty file) and an iterator of rows."""
    lines = Path(path).read_text(encoding="utf-8-sig", errors="replace").splitlines()
    header_at = next((i for i, line in enumerate(lines) if line.strip()), None)
    if header_at is None:
        return [], iter(())
    header = [h.strip().lower() for h in next(csv.reader([lines[header_at]]))]

    def rows() -> Iterator[tuple[int, list[str]]]:
        for i in range(header_at + 1, len(lines)):
            if lines[i].strip():
                yield i + 1, next(csv.reader([lines[i]]))

    return header, rows()


def plain_text(value: object) -> str:
    """A metadata value as text: ``None`` -> ``""``; lone surrogates replaced (Parquet needs UTF-8)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    return text.encode("utf-8", errors="replace").decode("utf-8")
