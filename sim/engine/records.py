"""Facts the engine emits: one record per finished request, and optionally the steps it ran."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    request_id: int
    replica: int
    arrival_s: float
    """When the client sent it (after any max_concurrency wait)."""
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    recomputed_tokens: int

    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for single-token outputs)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def e2el_s(self) -> float:
        return self.finish_s - self.arrival_s


class _RecordSlots:
    """`RequestRecord`'s slots under a plain class: `new_request_record` stores the fields as plain
    slot stores and then gives the object its real class (the same slots, so `__class__` may be
    assigned). The frozen dataclass's `__init__` sets each field through `object.__setattr__`, and
    a keyword call to a class first builds a dict of the arguments: ~3.5x the instructions, once
    per finished request. The result is a `RequestRecord` like any other (equal, hashable, frozen)."""

    __slots__ = RequestRecord.__slots__

    def __init__(self, request_id: int, replica: int, arrival_s: float, first_scheduled_s: float,
                 first_token_s: float, finish_s: float, prompt_tokens: int, output_tokens: int,
                 prefix_hit_tokens: int, num_preemptions: int, recomputed_tokens: int) -> None:
        self.request_id = request_id
        self.replica = replica
        self.arrival_s = arrival_s
        self.first_scheduled_s = first_scheduled_s
        self.first_token_s = first_token_s
        self.finish_s = finish_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_hit_tokens = prefix_hit_tokens
        self.num_preemptions = num_preemptions
        self.recomputed_tokens = recomputed_tokens
        self.__class__ = RequestRecord  # type: ignore[assignment]


new_request_record = cast(Callable[[int, int, float, float, float, float, int, int, int, int, int], RequestRecord],
                          _RecordSlots)
"""`RequestRecord(...)` with the fields positional, in their declared order (the engine's per-request
constructor; see `_RecordSlots`)."""


StepKind = Literal["prefill", "decode", "mixed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One engine step of one replica, or a run of `num_steps` identical back-to-back steps.

    Identical: the same prefill count and tokens, decode count, priced mean decode context,
    duration and no preemption; such runs come from decode phases (the bulk-decode path runs
    them in groups, the reference path one by one; both give the same records).
    """

    replica: int
    start_s: float
    end_s: float
    """End of the last step of the run."""
    num_steps: int
    step_s: float
    """Duration of each step of the run."""
    num_prefills: int
    """Prompt or recompute chunks per step."""
    num_prefill_tokens: int
    num_decodes: int
    mean_decode_context_tokens: int
    """Mean decode context as the step was priced (rounded to the pricer's bucket); 0 without decodes."""
    num_preempted: int

    def kind(self) -> StepKind:
        if not self.num_prefills:
            return "decode"
        return "mixed" if self.num_decodes else "prefill"
