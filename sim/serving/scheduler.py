"""The scheduler contract: a step plan of tokens per request, and the replica scheduler protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.graph.batch import BatchShape, PrefillChunk
from sim.serving.request import RequestState


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    request: RequestState
    num_new_tokens: int
    """Tokens computed this step (a prompt chunk, a recompute chunk, or 1 for decode)."""
    num_context_tokens: int
    """Tokens already in the KV cache before this step, prefix hits included."""
    samples: bool
    """The step completes the request's known tokens and samples its next output token."""

    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.num_context_tokens >= self.request.prompt_tokens


@dataclass(frozen=True, slots=True)
class StepPlan:
    step_id: int
    chunks: tuple[ScheduledChunk, ...]
    num_prefix_hit_tokens: int
    preempted: tuple[RequestState, ...]

    def num_batched_tokens(self) -> int:
        return sum(c.num_new_tokens for c in self.chunks)

    def batch_shape(self) -> BatchShape:
        prefills = tuple(PrefillChunk(new_tokens=c.num_new_tokens, context_tokens=c.num_context_tokens,
                                      samples=c.samples) for c in self.chunks if not c.is_decode())
        decodes = tuple(c.num_context_tokens for c in self.chunks if c.is_decode())
        return BatchShape(prefills=prefills, decode_context_tokens=decodes)


class ReplicaScheduler(Protocol):
    """Iteration-level scheduler of one replica.

    Call order: `add()` for arrivals, then `schedule()`; the engine prices the plan and at the
    step's end calls `finish_step(plan)`, which returns the requests that finished. `schedule()`
    returns None when nothing can run. Implementations never read a clock.
    """

    def add(self, request: RequestState) -> None: ...
    def schedule(self) -> StepPlan | None: ...
    def finish_step(self, plan: StepPlan) -> list[RequestState]: ...
    def num_outstanding(self) -> int: ...
    def kv_usage_frac(self) -> float: ...
