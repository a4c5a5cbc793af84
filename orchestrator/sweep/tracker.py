"""What the sweep driver records through, without MLflow: the `Tracker` protocol, `LoggedRun` and
`NullTracker`. The MLflow implementation is `orchestrator.sweep.tracking.MlflowTracker`; the driver
reaches it through `orchestrator.sweep.tracker_process.TrackerProcess`, so the driver's process never
imports MLflow (~3 s of imports before Ray could start, ~1 s more at exit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from orchestrator.sweep.results import TrialResult
from orchestrator.sweep.spec import SweepSpec

_TERMINAL: Final = ("FINISHED", "FAILED", "KILLED")


@dataclass(frozen=True, slots=True)
class LoggedRun:
    run_id: str
    status: str

    def is_done(self) -> bool:
        return self.status in _TERMINAL


class Tracker(Protocol):
    """Where a sweep records itself. Call order: `start_study`, then `logged_trials` (resume),
    any number of `log_trial`, then `finish_study`; `close` at the end, whatever happened."""

    def start_study(self, *, study_uid: str, spec: SweepSpec, tags: Mapping[str, str],
                    files: Sequence[tuple[str, Path]]) -> None: ...

    def logged_trials(self) -> dict[int, LoggedRun]: ...

    def log_trial(self, result: TrialResult, *, tags: Mapping[str, str], timestamp_ms: int,
                  existing: LoggedRun | None = None) -> None: ...

    def finish_study(self, *, files: Mapping[str, bytes], metrics: Mapping[str, float], ok: bool) -> None: ...

    def interrupt_study(self) -> None: ...

    def describe(self) -> dict[str, str]: ...

    def close(self) -> None: ...


class NullTracker:
    """Records nothing (benchmarks of the driver without MLflow, programmatic use)."""

    def start_study(self, *, study_uid: str, spec: SweepSpec, tags: Mapping[str, str],
                    files: Sequence[tuple[str, Path]]) -> None:
        return None

    def logged_trials(self) -> dict[int, LoggedRun]:
        return {}

    def log_trial(self, result: TrialResult, *, tags: Mapping[str, str], timestamp_ms: int,
                  existing: LoggedRun | None = None) -> None:
        return None

    def finish_study(self, *, files: Mapping[str, bytes], metrics: Mapping[str, float], ok: bool) -> None:
        return None

    def interrupt_study(self) -> None:
        return None

    def describe(self) -> dict[str, str]:
        return {}

    def close(self) -> None:
        return None
