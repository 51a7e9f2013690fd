"""The one table renderer: Markdown pipe tables (bench.md, `hvdcls report`) and plain-text
columns (`hvdcls demo`, `hvdcls timeline`). Cells are strings already formatted by the caller."""
from __future__ import annotations

from typing import Iterable, Sequence


def markdown(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """`| a | b |` lines: the header, a `|---|---|` rule, one line per row (cells not padded)."""
    return [_pipe(header), "|" + "---|" * len(header), *map(_pipe, rows)]


def _pipe(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def text(header: Sequence[str], rows: Iterable[Sequence[str]], *, align: str = "",
         widths: Sequence[int] = (), gap: str = "  ", rule: bool = False) -> list[str]:
    """Plain-text columns: each cell padded to its column's width (its widest cell, at least
    widths[i]), left-aligned unless align[i] is ">", `gap` between them, no trailing spaces;
    rule: a line of dashes under the header."""
    rows = [list(row) for row in rows]
    width = [max(len(header[i]), *(len(row[i]) for row in rows), widths[i] if i < len(widths) else 0)
             for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return gap.join(cell.rjust(w) if align[i:i + 1] == ">" else cell.ljust(w)
                        for i, (cell, w) in enumerate(zip(cells, width))).rstrip()

    return [line(header), *([line(["-" * w for w in width])] if rule else []), *map(line, rows)]
