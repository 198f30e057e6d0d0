"""The days people may ask a page or the API about (a usage period, a calendar week): far
enough from the ends of Python's calendar (year 1 to 9999) that the date arithmetic around
them (the month before, the week after, a time zone's offset) stays inside it."""

from __future__ import annotations

from datetime import date

FIRST_DAY = date(1900, 1, 1)
LAST_DAY = date(9000, 12, 31)
OUT_OF_RANGE = f"a day from {FIRST_DAY} to {LAST_DAY}"
# How a day is written in a query, on the pages and in the API alike (ISO 8601's extended
# form, as the pages' links and the answers write it; no locale's or compact forms).
DAY_INPUT_FORMATS = ["%Y-%m-%d"]


def in_range(day: date) -> bool:
    return FIRST_DAY <= day <= LAST_DAY
