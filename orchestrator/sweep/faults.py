"""Test-only fault injection: kill the driver at a named moment of an MLflow write.

`KERNELSIGHT_FAULT_POINT=<name>` makes the driver SIGKILL itself the first time it reaches that
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


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
