"""A Ctrl-C inside a journal write reaches the driver as KeyboardInterrupt, with the lock given back."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileSymlinkLock

from orchestrator.sweep.journal_lock import InterruptSafeLock
from orchestrator.sweep.study import open_storage


class _InterruptedInRelease(InterruptSafeLock):
    """Ctrl-C arrives just as the lock is being given back (where Optuna's lock breaks)."""

    def __init__(self, filepath: str) -> None:
        super().__init__(filepath)
        self._inner = _SignalBeforeRelease(filepath)


class _SignalBeforeRelease(JournalFileSymlinkLock):
    def release(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        super().release()


def _lock_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".lock" in p.name)


def test_sigint_during_release_is_delivered_after_the_lock_is_gone(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    lock = _InterruptedInRelease(str(journal))
    assert lock.acquire()
    assert _lock_files(tmp_path) == ["optuna.journal.lock"]
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    assert _lock_files(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_optunas_own_lock_turns_the_same_interrupt_into_a_stale_lock(tmp_path: Path) -> None:
    """What the wrapper is for: the plain lock leaves its file behind and raises the interrupt."""
    journal = tmp_path / "optuna.journal"
    lock = _SignalBeforeRelease(str(journal))
    assert lock.acquire()
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    assert _lock_files(tmp_path) == ["optuna.journal.lock"]


def test_the_lock_outside_the_main_thread_is_the_plain_lock(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    errors: list[BaseException] = []

    def take_and_give_back() -> None:
        try:
            lock = InterruptSafeLock(str(journal))
            lock.acquire()
            lock.release()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=take_and_give_back)
    thread.start()
    thread.join()
    assert errors == [] and _lock_files(tmp_path) == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_default_journal_storage_uses_the_interrupt_safe_lock(tmp_path: Path) -> None:
    storage, _ = open_storage(None, tmp_path / "study")
    study = optuna.create_study(storage=storage, study_name="s")
    study.tell(study.ask(), 1.0)
    assert isinstance(storage._backend._lock, InterruptSafeLock)  # type: ignore[attr-defined]
    assert _lock_files(tmp_path / "study") == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
