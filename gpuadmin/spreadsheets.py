"""Cells of the CSV exports (the audit log, the usage page): text a spreadsheet would run as a
formula (OWASP "CSV injection": a cell starting with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return) gets a leading quote, as the README promises for every export."""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(text: str) -> str:
    """``text`` as a spreadsheet shows it without running it."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text
