"""Plain-text tables and number formatting for CLI output (stdout)."""

from __future__ import annotations

from collections.abc import Sequence


def si(value: float, unit: str = "") -> str:
    """1.23G-style engineering notation."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for j, row in enumerate(cells):
        padded = (c.rjust(w) if j and _numeric(c) else c.ljust(w) for c, w in zip(row, widths, strict=True))
        lines.append("  ".join(padded).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _numeric(text: str) -> bool:
    return bool(text) and (text[0].isdigit() or text[0] in "-.") and not text.startswith("--")
