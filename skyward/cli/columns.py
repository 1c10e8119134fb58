"""Plain aligned columns, the way every command prints a table in a pipe or a log: each
column as wide as its widest cell, two spaces between, no trailing blanks."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """``rows`` (a header first, if any) as lines whose columns line up."""
    if not rows:
        return []
    widths = [max(len(cell) for cell in column) for column in zip(*rows, strict=True)]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
