"""The cells of a Markdown table row as the documentation site reads them (Python-Markdown's
tables): a ``|`` inside a code span is text, not a cell's end, and so is an escaped ``\\|``."""

from __future__ import annotations

import re

CODE_SPAN = re.compile(r"`([^`]+)`")


def cells(row: str) -> list[str]:
    """``| `a|b` | c \\| d |`` -> ``["`a|b`", "c \\| d"]``."""
    found, cell, in_code, escaped = [], "", False, False
    for char in row.strip().strip("|"):
        if char == "|" and not in_code and not escaped:
            found.append(cell.strip())
            cell = ""
            continue
        in_code ^= char == "`"
        escaped = char == "\\" and not escaped
        cell += char
    return [*found, cell.strip()]
