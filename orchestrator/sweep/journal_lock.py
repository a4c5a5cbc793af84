"""A journal-file lock that a Ctrl-C cannot break in half.

Optuna's journal file locks (`JournalFileSymlinkLock`) turn a `KeyboardInterrupt` that lands inside
`acquire` or `release` into the wrong error: `release` unlinks a rename target that was never
created (`FileNotFoundError` on `optuna.journal.lock<uuid>.rename`), and `acquire` releases a lock
another writer holds. The sweep driver then reports a file error instead of an interruption, and a
half-released lock stalls the next `--resume` for the lock's grace period.

`InterruptSafeLock` holds SIGINT back from the moment the lock is taken until it is released (a
journal append takes milliseconds) and delivers it right after, so the interruption reaches the
driver between two whole journal writes. Only the main thread receives signals; in any other
thread the lock is the plain Optuna lock.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from optuna.storages.journal import JournalFileSymlinkLock
from optuna.storages.journal._file import BaseJournalFileLock


class InterruptSafeLock(BaseJournalFileLock):
    """`JournalFileSymlinkLock` with SIGINT deferred while the lock is being taken, held or given back."""

    def __init__(self, filepath: str) -> None:
        self._inner = JournalFileSymlinkLock(filepath)
        self._previous: Any = None
        self._pending: list[tuple[int, FrameType | None]] = []
        self._deferring = False

    def acquire(self) -> bool:
        self._defer()
        try:
            return self._inner.acquire()
        except BaseException:
            self._deliver()
            raise

    def release(self) -> None:
        try:
            self._inner.release()
        finally:
            self._deliver()

    def _defer(self) -> None:
        if self._deferring or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.getsignal(signal.SIGINT)
        self._pending = []
        signal.signal(signal.SIGINT, lambda signum, frame: self._pending.append((signum, frame)))
        self._deferring = True

    def _deliver(self) -> None:
        """Put the previous SIGINT handler back and run it for a signal that arrived meanwhile."""
        if not self._deferring:
            return
        self._deferring = False
        previous, pending = self._previous, self._pending
        signal.signal(signal.SIGINT, previous)
        if pending and callable(previous):
            previous(*pending[0])
        elif pending and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)
