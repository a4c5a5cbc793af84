"""Keep stdout for the sweep's one document while Ray runs.

Ray writes to the driver's stdout from several places that a sweep does not control: the driver's
error-listener thread prints cluster messages as `(raylet) ...` lines on `sys.stdout`, forwarded
worker output (`log_to_driver`) goes to `sys.stdout`, and processes Ray starts inherit file
descriptor 1. While a `ReservedStdout` is active, both `sys.stdout` and descriptor 1 point at
stderr, so all of that lands on stderr; the sweep's table or JSON is handed to `emit` and written
to the real stdout when the block ends, after Ray has shut down.
"""

from __future__ import annotations

import contextlib
import os
import sys
from types import TracebackType
from typing import Self, TextIO


class ReservedStdout:
    def __init__(self) -> None:
        self._saved_fd: int | None = None
        self._redirect: contextlib.redirect_stdout[TextIO] | None = None
        self._original: TextIO = sys.stdout
        self._out: list[str] = []

    def emit(self, text: str) -> None:
        """Text for the real stdout, written when the block ends."""
        self._out.append(text)

    def __enter__(self) -> Self:
        self._original = original = sys.stdout
        original.flush()
        with contextlib.suppress(OSError, ValueError):  # no usable descriptor 1: sys.stdout alone is redirected
            if sys.__stdout__ is not None:
                sys.__stdout__.flush()
            saved = os.dup(1)
            try:
                os.dup2(2, 1)
            except OSError:
                os.close(saved)
                raise
            self._saved_fd = saved
        self._redirect = contextlib.redirect_stdout(sys.stderr)
        self._redirect.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._redirect is not None
        # Whatever sits in the original stream's buffer was written during the block: flush it to
        # stderr before descriptor 1 is restored.
        with contextlib.suppress(OSError, ValueError):
            self._original.flush()
        self._redirect.__exit__(exc_type, exc, tb)
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 1)
            os.close(self._saved_fd)
            self._saved_fd = None
        if self._out:
            sys.stdout.write("".join(self._out))
            sys.stdout.flush()
