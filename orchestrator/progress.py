"""The one progress bar of the CLI: a tqdm bar on stderr with count, rate and time left.

`run` (requests), `sweep` (trials or capacity candidates), `validate` (simulations) and
`accuracy kernels` (GPUs) all draw it through `ProgressBar`, so they look alike. It is drawn only
when stderr is a terminal (tqdm's `disable=None`), which keeps CI logs and redirected stderr
clean, and never on stdout, so `--json` output stays pure JSON. Without tqdm installed (a core
install without the `orchestrate` extra) the bar is silently off.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any, TextIO


class ProgressBar:
    """`update_to(done)` moves the bar; `close()` (or leaving a `with` block) ends its line."""

    def __init__(self, total: int, *, desc: str, unit: str, initial: int = 0, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        """`enabled=None`: on when `stream` (default stderr) is a terminal; True forces it on."""
        self._bar: Any = None
        try:
            from tqdm import tqdm
        except ImportError:  # the core install has no tqdm; the bar is an extra
            return
        self._bar = tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream or sys.stderr,
                         dynamic_ncols=True, leave=True, mininterval=0.5, smoothing=0.1,
                         disable=None if enabled is None else not enabled)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Set the count of finished items (and the total, when it changed)."""
        bar = self._bar
        if bar is None:
            return
        if total is not None and bar.total != total:
            bar.total = total
            bar.refresh()
        if done != bar.n:
            bar.update(done - bar.n)  # tqdm redraws at most every mininterval

    def set_postfix(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
