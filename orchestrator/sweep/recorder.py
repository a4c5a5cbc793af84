"""One background thread that records finished trials, in order, while the driver keeps asking.

Writing a trial is two steps: its MLflow run, then its Optuna tell. A job is submitted as a `start`
function that begins the first step and returns `finish`, which waits for it and does the second.
When several trials are waiting, the thread starts trial N's MLflow run before it finishes trial
N-1 (waits for N-1's run, tells N-1), so the tell overlaps with the MLflow child writing the next
run; when none is waiting, it finishes the trial at once. Each trial is still logged before it is
told, and trials are told in the order they were submitted.

The driver's main thread still owns every decision: it submits `(number, start)` pairs here and
reads back the numbers of recorded (told) trials with `done`. The first error stops the thread; the
driver re-raises it from `check`. Trials submitted but not told when the process dies stay RUNNING
in Optuna, which is exactly what `--resume` re-evaluates (a run MLflow already finished is kept).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

Finish = Callable[[], None]
"""Waits for a trial's first step and does the second."""
Start = Callable[[], Finish]
"""Begins a trial's first step; returns its `Finish`."""


class Recorder:
    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[int, Start] | None] = queue.Queue()
        self._done: queue.Queue[int] = queue.Queue()
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kernelsight-recorder", daemon=True)
        self._thread.start()

    def submit(self, number: int, start: Start) -> None:
        self._jobs.put((number, start))

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
        """End the thread after the jobs already submitted (`drain`) or after the current step; a
        trial whose first step was begun but not finished is then left unfinished (not told)."""
        if not drain:
            self._stop.set()
        self._jobs.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        pending: tuple[int, Finish] | None = None
        while True:
            if pending is None:
                item = self._jobs.get()
            else:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:  # nothing to overlap with: finish the waiting trial now
                    if not self._finish(*pending):
                        return
                    pending = None
                    continue
            if self._error is not None or self._stop.is_set():
                return
            if item is None:
                if pending is not None:
                    self._finish(*pending)
                return
            number, start = item
            try:
                finish = start()
            except BaseException as exc:  # surfaced to the driver by check()
                self._fail(number, exc)
                return
            if pending is not None and not self._finish(*pending):
                return
            pending = (number, finish)

    def _finish(self, number: int, finish: Finish) -> bool:
        if self._stop.is_set():
            return False
        try:
            finish()
        except BaseException as exc:
            self._fail(number, exc)
            return False
        self._done.put(number)
        return True

    def _fail(self, number: int, exc: BaseException) -> None:
        self._error = exc
        self._done.put(number)
