"""How the CLI's API verbs print: JSON (``--json``), or tables and facts for people.

A table on a terminal is drawn by rich (colour by state, cells wrapped to the terminal's
width); anywhere else (a pipe, a file, ``NO_COLOR``, ``TERM=dumb``) it is plain text: columns
two spaces apart, nothing truncated or coloured, one row per line, for ``grep``, ``awk`` and
``| head``. rich is imported only when a terminal is drawn, so a piped verb starts faster.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TextIO

# The colour of a state word wherever a verb prints one (GPU, node, job, alert, reservation).
STATE_STYLES = {
    **dict.fromkeys(("available", "idle", "free", "completed", "active", "ok"), "green"),
    **dict.fromkeys(("running", "allocated", "busy", "scheduled", "approved"), "cyan"),
    **dict.fromkeys(("pending", "queued", "held", "requested", "preempted"), "blue"),
    **dict.fromkeys(("draining", "maintenance", "probation", "degraded", "warning"), "yellow"),
    **dict.fromkeys(
        ("fenced", "failed", "offline", "quarantined", "unreachable", "critical", "firing"),
        "bold red",
    ),
}


# Between two columns of a drawn table: each cell's one space of padding on either side.
COLUMN_GAP = 2


@dataclass(frozen=True)
class Column:
    """One column of a table: its header and how a row (an API object) gives its cell."""

    header: str
    value: Callable[[Mapping[str, Any]], object]
    align: Literal["left", "right"] = "left"
    coloured: bool = False  # coloured on a terminal by the cell's word (STATE_STYLES)
    # Where a drawn table must fit a narrow terminal (``fit_columns``), the columns with the
    # highest ``drop`` are left out first; 0: always shown.
    drop: int = 0


def add_json_flag(verb: argparse.ArgumentParser) -> None:
    verb.add_argument("--json", action="store_true", help="print the API's JSON instead")


def print_rows(
    out: TextIO, args: argparse.Namespace, columns: Sequence[Column], rows: list[dict[str, Any]]
) -> None:
    """A list verb's answer: the API's JSON with ``--json``, else the table."""
    if args.json:
        print_json(out, rows)
    else:
        print_table(out, columns, rows)


def print_json(out: TextIO, data: Any) -> None:
    json.dump(data, out, indent=2, ensure_ascii=False)
    out.write("\n")


def draws(out: TextIO) -> bool:
    """Whether ``out`` is a terminal that shows colour (https://no-color.org: ``NO_COLOR``)."""
    return (
        out.isatty()
        and "NO_COLOR" not in os.environ
        and os.environ.get("TERM", "") not in ("dumb", "")
    )


def cell_text(value: object) -> str:
    """A cell as text: ``-`` for nothing, so every row has every column (for ``awk``)."""
    if value is None or value == "":
        return "-"
    return str(value)


def table_cells(columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    return [[cell_text(column.value(row)) for column in columns] for row in rows]


def print_table(out: TextIO, columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> None:
    cells = table_cells(columns, rows)
    if draws(out):
        _draw_table(out, columns, cells)
        return
    lines = [[column.header for column in columns], *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    for line in lines:
        padded = [
            cell.rjust(width) if column.align == "right" else cell.ljust(width)
            for cell, width, column in zip(line, widths, columns, strict=True)
        ]
        out.write("  ".join(padded).rstrip() + "\n")


def _draw_table(out: TextIO, columns: Sequence[Column], cells: list[list[str]]) -> None:
    from rich.console import Console

    Console(file=out, highlight=False).print(rich_table(columns, cells))


def rich_table(columns: Sequence[Column], cells: list[list[str]], *, fit: bool = False) -> Any:
    """The rich ``Table`` of ``cells`` (rows of ``cell_text``); with ``fit``, one line per row
    (a cell too long for the width ends in an ellipsis), else cells wrap."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, padding=(0, COLUMN_GAP // 2), header_style="bold")
    for column in columns:
        table.add_column(
            column.header,
            justify=column.align,
            overflow="ellipsis" if fit else "fold",
            no_wrap=fit,
        )
    for line in cells:
        table.add_row(
            *(
                Text(cell, style=STATE_STYLES.get(cell, "")) if column.coloured else Text(cell)
                for cell, column in zip(line, columns, strict=True)
            )
        )
    return table


def fit_columns(columns: Sequence[Column], cells: list[list[str]], width: int) -> list[int]:
    """The indexes of the columns to draw in ``width`` characters: every column while they
    fit (each as wide as its widest cell, ``COLUMN_GAP`` apart), else without those of highest
    ``drop`` first (never those of ``drop`` 0)."""
    widths = [
        max([len(column.header), *(len(line[i]) for line in cells)])
        for i, column in enumerate(columns)
    ]
    kept = list(range(len(columns)))
    droppable = sorted((i for i in kept if columns[i].drop), key=lambda i: -columns[i].drop)
    while droppable and sum(widths[i] for i in kept) + COLUMN_GAP * (len(kept) - 1) > width:
        kept.remove(droppable.pop(0))
    return kept


def print_facts(out: TextIO, facts: Iterable[tuple[str, object]]) -> None:
    """``  label:   value`` lines, aligned; a fact without a value is left out."""
    shown = [(label, value) for label, value in facts if value not in (None, "")]
    width = max((len(label) for label, _ in shown), default=0) + 2
    for label, value in shown:
        out.write(f"  {label + ':':<{width}}{value}\n")
