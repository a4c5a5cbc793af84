""""Did you mean" hints for unknown names in input files (keys, metrics, catalog ids)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`did you mean 'x'? ` for the closest known names (up to 3), or `` when none is close."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return f"did you mean {' or '.join(repr(c) for c in close)}? "
