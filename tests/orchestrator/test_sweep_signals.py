"""SIGTERM bookkeeping of sweeps (orchestrator.sweep.signals)."""

from __future__ import annotations

from orchestrator.sweep import signals


def test_an_earlier_sigterm_does_not_make_a_later_ctrl_c_a_termination() -> None:
    """The flag of a SIGTERM handled by an earlier sweep in the same process (a notebook, a test
    runner) is cleared when the next sweep installs its handler: its Ctrl-C exits 130, not 143."""
    signals._received.append(15)
    try:
        assert signals.exit_code(KeyboardInterrupt()) == signals.TERMINATED_EXIT
        with signals.sigterm_as_interrupt():
            assert signals.exit_code(KeyboardInterrupt()) == 130
            assert signals.stopped_word(KeyboardInterrupt()) == "interrupted"
        assert signals.exit_code(signals.Terminated()) == signals.TERMINATED_EXIT
    finally:
        signals._received.clear()
