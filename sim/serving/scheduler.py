"""The scheduler contract: a step plan of tokens per request, and the replica scheduler protocol."""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from sim.graph.batch import BatchShape, PrefillChunk
from sim.serving.request import RequestState


class ScheduledChunk(NamedTuple):
    """One request's tokens in a step. A named tuple rather than a frozen dataclass, as `StepPlan`:
    the scheduler makes one per scheduled request per step, and a tuple is made ~3x faster."""

    request: RequestState
    num_new_tokens: int
    """Tokens computed this step (a prompt chunk, a recompute chunk, or 1 for decode)."""
    num_context_tokens: int
    """Tokens already in the KV cache before this step, prefix hits included."""
    samples: bool
    """The step completes the request's known tokens and samples its next output token."""
    num_draft_tokens: int = 0
    """Speculative decoding: draft tokens this decode verifies (counted in `num_new_tokens`, which is
    1 + drafts); the step samples 1 + the accepted drafts."""

    def is_decode(self) -> bool:
        return (self.num_new_tokens - self.num_draft_tokens == 1
                and self.num_context_tokens >= self.request.prompt_tokens)


class StepPlan(NamedTuple):
    """What one step runs (immutable; a named tuple because the scheduler makes one per step)."""

    step_id: int
    chunks: tuple[ScheduledChunk, ...]
    """Requests scheduled one by one: prefill and recompute chunks, and decodes not run in bulk."""
    num_prefix_hit_tokens: int
    preempted: tuple[RequestState, ...]
    num_bulk_decodes: int = 0
    """Decodes run in bulk: requests that sampled in the previous step and decode again, counted
    rather than listed (each computes one token and samples)."""
    bulk_decode_context_tokens: int = 0
    """Sum of the bulk decodes' context lengths (tokens in the KV cache before this step)."""
    resynced: tuple[RequestState, ...] = ()
    """Former bulk decodes whose counters this step brought up to date; each sampled in the
    previous step."""
    waited_bulk: tuple[tuple[int, int], ...] = ()
    """(step id, count): bulk decodes in this step whose previous sample was in that earlier step,
    not the previous one (they sat out prefill-only steps of `prefill_priority`); the others
    sampled in the previous step."""
    ranks: tuple[StepPlan | None, ...] = ()
    """A data-parallel group's step (`sim.serving.dp_group`): each rank's own plan (None for a rank
    that runs a dummy batch); the fields above are then the ranks' plans merged. Empty otherwise."""

    def num_batched_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks) + self.num_bulk_decodes

    def batch_shape(self) -> BatchShape:
        """What the step computes. Bulk decodes enter with their total context spread evenly
        (the pricer only uses the decode count and mean context)."""
        prefills = tuple(PrefillChunk(new_tokens=c.num_new_tokens, context_tokens=c.num_context_tokens,
                                      samples=c.samples) for c in self.chunks if not c.is_decode())
        decodes = [c.num_context_tokens for c in self.chunks if c.is_decode()]
        n = self.num_bulk_decodes
        if n:
            q, r = divmod(self.bulk_decode_context_tokens, n)
            decodes += [q + 1] * r + [q] * (n - r)
        return BatchShape(prefills=prefills, decode_context_tokens=tuple(decodes))


class ReplicaScheduler(Protocol):
    """Iteration-level scheduler of one replica.

    Call order: `add()` for arrivals, then `schedule()`; the engine prices the plan and at the
    step's end calls `finish_step(plan)`, which returns the requests that finished, in running
    order. `schedule()` returns None when nothing can run; it is not called again before the
    plan's `finish_step`. Implementations never read a clock.
    """

    def add(self, request: RequestState) -> None: ...
    def schedule(self) -> StepPlan | None: ...
    def finish_step(self, plan: StepPlan) -> list[RequestState]: ...
    def num_outstanding(self) -> int: ...
    def kv_usage_frac(self) -> float: ...


@runtime_checkable
class BulkDecodeScheduler(ReplicaScheduler, Protocol):
    """A replica scheduler that can also run steps of decodes only without building plans.

    Call order: `next_bulk_decode_steps()` between steps (never while a plan is in flight); if
    it gives (count, total context, steps until a decode finishes), `run_bulk_decode_steps(k)`
    runs up to k such steps at once. The engine uses this only when `SimLimits.bulk_decode` is
    on; the results must equal `schedule()` + `finish_step()` step by step.
    """

    def next_bulk_decode_steps(self) -> tuple[int, int, int] | None: ...
    def run_bulk_decode_steps(self, num_steps: int) -> tuple[int, list[RequestState], np.ndarray | list[int]]: ...
    def bulk_decode_block_steps(self, num_steps: int) -> int: ...
