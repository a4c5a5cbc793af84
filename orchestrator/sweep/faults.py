"""Test-only fault injection: kill the driver at a named moment of an MLflow write.

`KERNELSIGHT_FAULT_POINT=<name>` makes the driver SIGKILL itself (and, when the write runs in the MLflow tracker's
process, that process too) the first time it reaches that
point, exactly as a crash or an OOM kill would stop it there, so tests can check what `--resume`
makes of the state left behind. Unset (always, outside tests), `fault_point` does nothing.

Points: `trial-run-created` (a trial's MLflow run exists with its tags only), `trial-metrics-logged`
(its params and metrics are written, its artifacts and end status are not).
"""

from __future__ import annotations

import os
import signal
from typing import Final

FAULT_ENV: Final = "KERNELSIGHT_FAULT_POINT"
_also_killed: list[int] = []


def also_kill(pid: int) -> None:
    """In a helper process of the driver (the MLflow tracker's): a fault point kills `pid` (the
    driver) first, so the driver stops where an in-process write would have stopped it."""
    _also_killed.append(pid)


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        for pid in _also_killed:
            os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
