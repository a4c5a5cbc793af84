"""Per-request runtime state: the one mutable entity of the simulation."""

from __future__ import annotations


class RequestState:
    """Progress and timestamps of one request inside a replica.

    Token accounting follows vLLM: a request knows `prompt_tokens + num_output` tokens; a step
    computes the next `num_new` of them; when all known tokens are computed the step samples one
    more output token. Preemption (recompute) resets `num_computed` to 0 but keeps outputs.
    """

    __slots__ = (
        "arrival_s", "first_scheduled_s", "first_token_s", "keys", "last_token_s", "num_computed",
        "num_output", "num_preemptions", "output_tokens", "prefix_hit_tokens", "prompt_tokens",
        "recomputed_tokens", "replica", "request_id", "segments", "sent_s",
    )

    def __init__(self, *, request_id: int, prompt_tokens: int, output_tokens: int, arrival_s: float,
                 keys: tuple[int, ...], segments: tuple[object, ...] = ()) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.sent_s = arrival_s
        self.keys = keys
        self.segments = segments
        self.num_computed = 0
        self.num_output = 0
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.recomputed_tokens = 0
        self.first_scheduled_s: float | None = None
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.replica = -1

    def num_known(self) -> int:
        return self.prompt_tokens + self.num_output

    def num_pending(self) -> int:
        """Known tokens not yet computed (prompt or recompute: many; decode: 1)."""
        return self.num_known() - self.num_computed

    def is_finished(self) -> bool:
        return self.num_output >= self.output_tokens
