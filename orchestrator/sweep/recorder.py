"""One background thread that records finished trials, in order, while the driver keeps asking.

Writing a trial (MLflow run, then Optuna tell) is mostly waiting on the database's commits and
fsyncs; on its own thread that wait overlaps with asking the next trials and collecting results.
The driver's main thread still owns every decision: it submits `(number, job)` pairs here and
reads back the numbers of recorded trials with `done`. The first error stops the thread; the
driver re-raises it from `check`. Trials submitted but not recorded when the process dies stay
RUNNING in Optuna, which is exactly what `--resume` re-evaluates.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class Recorder:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[int, Callable[[], None]] | None] = queue.Queue()
        self._done: queue.Queue[int] = queue.Queue()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernelsight-recorder", daemon=True)
        self._thread.start()

    def submit(self, number: int, job: Callable[[], None]) -> None:
        self._jobs.put((number, job))

    def done(self, timeout_s: float | None = None) -> list[int]:
        """Trials recorded since the last call; waits up to `timeout_s` for the first (0 = do not wait)."""
        out: list[int] = []
        try:
            out.append(self._done.get(timeout=timeout_s) if timeout_s else self._done.get_nowait())
            while True:
                out.append(self._done.get_nowait())
        except queue.Empty:
            pass
        return out

    def check(self) -> None:
        """Re-raise the error that stopped the thread, if any."""
        if self._error is not None:
            raise self._error

    def close(self, *, drain: bool = True, timeout_s: float = 120.0) -> None:
        """End the thread after the jobs already submitted (`drain`) or after the current one."""
        if not drain:
            self._stop.set()
        self._jobs.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None or self._error is not None or self._stop.is_set():
                return
            number, job = item
            try:
                job()
            except BaseException as exc:  # surfaced to the driver by check()
                self._error = exc
                self._done.put(number)
                return
            self._done.put(number)
