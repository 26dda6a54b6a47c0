"""Tables of results, as Markdown: readable in a terminal and in RESULTS files alike."""
from __future__ import annotations

from typing import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A Markdown table with columns padded to their widest cell."""
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)
