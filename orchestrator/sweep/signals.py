"""SIGTERM as an interrupt, so a terminated sweep stops the way a Ctrl-C'd one does.

A sweep is terminated, not interrupted, where it runs unattended: `kill PID`, `timeout`, a Kubernetes
pod or RayJob being deleted or evicted, `docker stop`. Without a handler of its own the driver dies
at once (Ray's core worker installs a fatal-signal handler that logs `SIGTERM received` and exits, and
before it connects Ray's `sys.exit(15)` handler skips every `except KeyboardInterrupt`): the MLflow
parent run is left RUNNING for good, a capacity plan's as well, and no `--resume` line is printed.
Inside `sigterm_as_interrupt()` a SIGTERM raises `Terminated`, a `KeyboardInterrupt`, on the main
thread, so the Ctrl-C paths run: the parent run is marked KILLED, the actors, Ray and the MLflow
child are shut down, the resume line is printed; the exit code is 143 (128 + SIGTERM).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Final

TERMINATED_EXIT: Final = 128 + signal.SIGTERM


class Terminated(KeyboardInterrupt):
    """The process got SIGTERM."""


_received: list[int] = []
"""SIGTERMs handled: Ray's blocking calls (`ray.get`, `ray.wait`) run the handler and raise a plain
`KeyboardInterrupt` in place of the `Terminated` it raised, so the exception alone cannot tell."""


def terminated(exc: KeyboardInterrupt) -> bool:
    return isinstance(exc, Terminated) or bool(_received)


def exit_code(exc: KeyboardInterrupt) -> int:
    """143 for a SIGTERM, 130 for a Ctrl-C."""
    return TERMINATED_EXIT if terminated(exc) else 130


def stopped_word(exc: KeyboardInterrupt) -> str:
    return "terminated" if terminated(exc) else "interrupted"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Raise `Terminated` on the main thread at the first SIGTERM, and ignore further ones while the
    clean-up it starts runs (SIGKILL still ends the process). Enter it after `ray.init`, whose core
    worker replaces the process's SIGTERM handler with its own; outside the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _received.append(signum)
        raise Terminated()

    _received.clear()  # a SIGTERM of an earlier sweep in this process does not make a later Ctrl-C one
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
