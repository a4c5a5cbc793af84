"""Progress bar on stderr with an ETA from the plan's budget.

Each point weighs its planned GPU time (the `microbench plan` estimate: 30 calls at the
cross-generation prediction plus setup), so a GEMM at m=8192 advances the bar more than one at
m=1. Before the first point the ETA is the plan's budget; after it, the remaining budget scaled
by how fast the run has gone through budget so far. On a terminal the line redraws in place;
otherwise (logs, CI) a line is written at most every `interval_s` seconds.
"""

from __future__ import annotations

import time
from typing import Final, TextIO

BAR_WIDTH: Final = 24


def format_duration(seconds: float) -> str:
    s = max(round(seconds), 0)
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def format_line(*, done: int, total: int, done_weight: float, total_weight: float, elapsed_s: float,
                eta_s: float | None, label: str, budget_s: float | None) -> str:
    frac = done_weight / total_weight if total_weight > 0 else 1.0
    filled = min(int(frac * BAR_WIDTH), BAR_WIDTH)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    eta = format_duration(eta_s) if eta_s is not None else "?"
    budget = f" (plan budget {budget_s / 60:.1f} GPU-min)" if budget_s is not None else ""
    return (f"microbench [{bar}] {100 * frac:3.0f}% {done}/{total} | {format_duration(elapsed_s)} elapsed, "
            f"ETA {eta}{budget} | {label}")


class Progress:
    """Weighted progress over a run's points; writes to `stream`."""

    def __init__(self, weights_total: float, num_points: int, budget_s: float | None, stream: TextIO, *,
                 tty: bool | None = None, interval_s: float = 10.0) -> None:
        self._total_w, self._total, self._budget = weights_total, num_points, budget_s
        self._stream = stream
        self._tty = stream.isatty() if tty is None else tty
        self._interval = interval_s
        self._start = time.perf_counter()
        self._last_print = -float("inf")
        self._done, self._done_w = 0, 0.0

    def eta_s(self, elapsed_s: float) -> float | None:
        remaining = max(self._total_w - self._done_w, 0.0)
        if self._done_w > 0:
            return elapsed_s / self._done_w * remaining
        return self._budget

    def advance(self, weight: float, label: str, count: int = 1) -> None:
        self._done += count
        self._done_w += weight
        now = time.perf_counter()
        elapsed = now - self._start
        line = format_line(done=self._done, total=self._total, done_weight=self._done_w, total_weight=self._total_w,
                           elapsed_s=elapsed, eta_s=self.eta_s(elapsed), label=label, budget_s=self._budget)
        if self._tty:
            self._stream.write("\r\x1b[2K" + line)
            self._stream.flush()
        elif now - self._last_print >= self._interval or self._done >= self._total:
            self._stream.write(line + "\n")
            self._stream.flush()
            self._last_print = now

    def close(self) -> None:
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
