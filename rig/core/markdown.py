"""Markdown tables rig writes into its reports (bench, tune, prove, probe, fleet): input reaches their cells, and
a value's own newline or `|` must never start a row or a cell."""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from rig.core.escape import inline

MARKDOWN_SPECIAL = re.compile(r"([\\|`<\[\]])")  # what would end a cell, open code, HTML or a link


def cell(value: object) -> str:
    """VALUE as one markdown table cell (or inline text): its lines joined by <br> (the one line break a cell
    holds), no `|` that would end it, no code, HTML or link of the input's own; emphasis is left alone, it changes
    no row."""
    lines = ("-" if value is None else str(value)).splitlines() or [""]
    return "<br>".join(MARKDOWN_SPECIAL.sub(r"\\\1", inline(line)) for line in lines)


def table(header: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines: HEADER, its rule and one line per row, every value one cell() (the one rule for
    every table rig writes)."""
    def line(values: Sequence[object]) -> str:
        return "| " + " | ".join(cell(v) for v in values) + " |"

    return [line(header), "|" + "---|" * len(header), *(line(row) for row in rows)]
