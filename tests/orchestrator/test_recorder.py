"""The recorder thread: trials are told in submission order, each after its own first step; when
trials queue up, trial N's first step begins before trial N-1 is finished; a trial with nothing
queued behind it is finished at once; the first error stops the thread."""

from __future__ import annotations

import threading

import pytest

from orchestrator.sweep.recorder import Finish, Recorder, Start


def _job(number: int, events: list[str], *, gate: threading.Event | None = None,
         entered: threading.Event | None = None, fail_finish: bool = False) -> Start:
    def start() -> Finish:
        if entered is not None:
            entered.set()
        if gate is not None:
            assert gate.wait(10)
        events.append(f"start {number}")

        def finish() -> None:
            if fail_finish:
                raise OSError(f"store refused trial {number}")
            events.append(f"finish {number}")
        return finish
    return start


def _done(recorder: Recorder, n: int) -> list[int]:
    got: list[int] = []
    while len(got) < n:
        more = recorder.done(timeout_s=10)
        assert more, f"only {got} recorded"
        got += more
    return got


def test_queued_trials_overlap_and_are_told_in_order() -> None:
    events: list[str] = []
    gate = threading.Event()
    recorder = Recorder()
    recorder.submit(0, _job(0, events, gate=gate))  # holds the thread until the others are queued
    recorder.submit(1, _job(1, events))
    recorder.submit(2, _job(2, events))
    gate.set()
    assert _done(recorder, 3) == [0, 1, 2]
    recorder.close()
    recorder.check()
    assert events == ["start 0", "start 1", "finish 0", "start 2", "finish 1", "finish 2"]


def test_a_trial_with_nothing_behind_it_is_finished_at_once() -> None:
    events: list[str] = []
    recorder = Recorder()
    recorder.submit(7, _job(7, events))
    assert recorder.done(timeout_s=10) == [7]  # no second submit needed
    assert events == ["start 7", "finish 7"]
    recorder.close()


def test_an_error_stops_the_thread_and_later_trials_are_not_told() -> None:
    events: list[str] = []
    gate = threading.Event()
    recorder = Recorder()
    recorder.submit(0, _job(0, events, gate=gate, fail_finish=True))
    recorder.submit(1, _job(1, events))
    recorder.submit(2, _job(2, events))
    gate.set()
    assert recorder.done(timeout_s=10) == [0]
    recorder.close()
    with pytest.raises(OSError, match="trial 0"):
        recorder.check()
    # Trial 1's first step had begun (it overlapped trial 0's finish); it is never finished.
    assert events == ["start 0", "start 1"]


def test_close_without_drain_leaves_a_begun_trial_unfinished() -> None:
    events: list[str] = []
    gate = threading.Event()
    recorder = Recorder()
    recorder.submit(0, _job(0, events))
    assert recorder.done(timeout_s=10) == [0]
    entered = threading.Event()
    recorder.submit(1, _job(1, events, gate=gate, entered=entered))
    recorder.submit(2, _job(2, events))
    assert entered.wait(10)
    recorder.close(drain=False, timeout_s=0.2)  # the thread is held inside trial 1's first step
    gate.set()
    recorder._thread.join(10)
    assert not recorder._thread.is_alive()
    assert events[:3] == ["start 0", "finish 0", "start 1"] and "finish 1" not in events
