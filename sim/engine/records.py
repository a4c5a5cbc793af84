"""Facts the engine emits: one record per finished request."""

from __future__ import annotations

from dataclasses import dataclass


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
