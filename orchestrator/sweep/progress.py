"""The sweep's progress bar (the CLI's `orchestrator.progress.ProgressBar`): trials done, rate,
time left, and how the finished trials ended."""

from __future__ import annotations

from collections import Counter

from orchestrator.progress import ProgressBar as _Bar
from orchestrator.sweep.results import TrialResult


class ProgressBar:
    def __init__(self, total: int, *, label: str, unit: str = "trial", initial: int = 0,
                 enabled: bool | None = None) -> None:
        self._bar = _Bar(total, desc=label, unit=unit, initial=initial, enabled=enabled)
        self._counts: Counter[str] = Counter()

    def update(self, result: TrialResult, done: int, total: int) -> None:
        self._counts[result.status.value] += 1
        if result.cached_from is not None:
            self._counts["cached"] += 1
        self._bar.set_postfix(" ".join(f"{k}={v}" for k, v in sorted(self._counts.items())))
        self._bar.update_to(done, total)

    def step(self, done: int, total: int) -> None:
        self._bar.update_to(done, total)

    def close(self) -> None:
        self._bar.close()
