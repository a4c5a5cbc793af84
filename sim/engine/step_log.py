"""An optional, bounded log of the engine's steps (for `kernelsight run --trace`).

The engine calls `add` once per step it starts, or once per group of identical decode-only steps
the bulk path runs; nothing is logged when no `StepLog` is passed, so runs without a trace pay one
`is None` test per step. A step identical to the replica's previous logged event and starting at
its end extends that event (`num_steps` + 1), so decode phases take one event per priced mean
context rather than one per step, on the bulk and the reference path alike. Events are kept in
column arrays (about 70 bytes each); past `max_events` the log stops growing and counts the steps
it did not keep.
"""

from __future__ import annotations

from array import array

from sim.engine.pricer import StepKey
from sim.engine.records import StepRecord


class StepLog:
    def __init__(self, max_events: int) -> None:
        if max_events < 1:
            raise ValueError(f"max_events={max_events!r} must be >= 1")
        self.max_events = max_events
        self.num_dropped_steps = 0
        """Steps not logged because the log was full."""
        self._replica = array("i")
        self._start_s = array("d")
        self._end_s = array("d")
        self._step_s = array("d")
        self._num_steps = array("q")
        self._num_prefills = array("i")
        self._prefill_tokens = array("q")
        self._num_decodes = array("i")
        self._mean_context = array("q")
        self._num_preempted = array("i")
        self._last: dict[int, int] = {}
        """Replica -> index of its last event."""

    def __len__(self) -> int:
        return len(self._start_s)

    def add(self, *, replica: int, start_s: float, step_s: float, num_steps: int, end_s: float,
            key: StepKey, num_preempted: int) -> None:
        """Log `num_steps` back-to-back steps of one key and duration, from `start_s` to `end_s`."""
        prefills, num_decodes, mean_context = key
        num_prefills = len(prefills)
        prefill_tokens = sum(new for new, _, _ in prefills)
        i = self._last.get(replica)
        if (i is not None and not num_preempted and not self._num_preempted[i]
                and self._end_s[i] == start_s and self._step_s[i] == step_s
                and self._num_decodes[i] == num_decodes and self._mean_context[i] == mean_context
                and self._num_prefills[i] == num_prefills and self._prefill_tokens[i] == prefill_tokens):
            self._num_steps[i] += num_steps
            self._end_s[i] = end_s
            return
        if len(self._start_s) >= self.max_events:
            self.num_dropped_steps += num_steps
            return
        self._last[replica] = len(self._start_s)
        self._replica.append(replica)
        self._start_s.append(start_s)
        self._end_s.append(end_s)
        self._step_s.append(step_s)
        self._num_steps.append(num_steps)
        self._num_prefills.append(num_prefills)
        self._prefill_tokens.append(prefill_tokens)
        self._num_decodes.append(num_decodes)
        self._mean_context.append(mean_context)
        self._num_preempted.append(num_preempted)

    def records(self) -> tuple[StepRecord, ...]:
        """The events in the order their first step started."""
        return tuple(
            StepRecord(replica=r, start_s=s, end_s=e, num_steps=n, step_s=d, num_prefills=p,
                       num_prefill_tokens=t, num_decodes=k, mean_decode_context_tokens=c, num_preempted=q)
            for r, s, e, n, d, p, t, k, c, q in zip(
                self._replica, self._start_s, self._end_s, self._num_steps, self._step_s, self._num_prefills,
                self._prefill_tokens, self._num_decodes, self._mean_context, self._num_preempted, strict=True)
        )
