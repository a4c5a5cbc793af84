"""Facts the engine emits: one record per finished request, and optionally the steps it ran."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
