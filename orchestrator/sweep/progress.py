"""A progress bar on stderr: trials done, rate, time left, and how the finished trials ended."""

from __future__ import annotations

import sys
from collections import Counter

from tqdm import tqdm

from orchestrator.sweep.results import TrialResult


class ProgressBar:
    def __init__(self, total: int, *, label: str, unit: str = "trial", initial: int = 0) -> None:
        self._bar = tqdm(total=total, desc=label, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=True,
                         mininterval=0.5, initial=initial)
        self._counts: Counter[str] = Counter()

    def update(self, result: TrialResult, done: int, total: int) -> None:
        self._counts[result.status.value] += 1
        if result.cached_from is not None:
            self._counts["cached"] += 1
        if self._bar.total != total:
            self._bar.total = total
        self._bar.n = done
        self._bar.set_postfix_str(" ".join(f"{k}={v}" for k, v in sorted(self._counts.items())), refresh=False)
        self._bar.refresh()

    def step(self, done: int, total: int) -> None:
        self._bar.total = total
        self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
