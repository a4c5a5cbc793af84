"""Per-request runtime state: the one mutable entity of the simulation."""

from __future__ import annotations


class RequestState:
    """Progress and timestamps of one request inside a replica.

    Token accounting follows vLLM: a request knows `prompt_tokens + num_output` tokens; a step
    computes the next `num_new` of them; when all known tokens are computed the step samples one
    more output token. Preemption (recompute) resets `num_computed` to 0 but keeps outputs.

    While a scheduler runs a request as a bulk decode (`lazy_step >= 0`), `num_computed` and
    `num_output` hold their values after tick `lazy_step` of the scheduler's bulk clock (its steps
    but SGLang's prefill-only ones); each later tick adds one to both. The
    scheduler brings them up to date before anything else reads them (see `VllmV1Scheduler`).
    """

    __slots__ = (
        "accepted_drafts", "arrival_s", "first_scheduled_s", "first_token_s", "has_drafts", "keys", "last_sample_step",
        "last_token_s", "lazy_step", "num_computed", "num_output", "num_preemptions", "output_tokens",
        "prefix_hit_tokens", "prompt_tokens", "recomputed_tokens", "replica", "request_id", "run_seq",
        "segments", "sent_s",
    )

    def __init__(self, *, request_id: int, prompt_tokens: int, output_tokens: int, arrival_s: float,
                 keys: tuple[int, ...], segments: tuple[object, ...] = ()) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.sent_s = arrival_s
        self.keys = keys
        """Prefix-cache keys of full blocks that lookups and commits use. They may cover only the
        shared prefix (the rest of the prompt is unique to this request, so no other request can
        hit it); when the request is preempted the scheduler derives keys from `segments` for
        everything it computed, generated tokens included, so that it can hit its own blocks when
        it resumes."""
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
        self.run_seq = -1
        """Position in the scheduler's running order (admission order), -1 when not running."""
        self.lazy_step = -1
        """Step after which `num_computed`/`num_output` were last brought up to date; -1 when the
        request is not a bulk decode."""
        self.last_sample_step = -1
        """Id of the last step that sampled a token for this request (-1: none yet)."""
        self.has_drafts = False
        """Speculative decoding: the request sampled in its last scheduled step, so the drafter
        proposed drafts for its next one (vLLM's `spec_token_ids`); preemption clears them, and a
        resumed request's recompute chunks carry none until one samples again."""
        self.accepted_drafts = 0
        """Speculative decoding: drafts its last scheduled step accepted (0 after a step without
        drafts). Their KV was written while they were drafts, and vLLM's `allocate_slots` indexes
        blocks only up to the known tokens (`request.num_tokens`, drafts excluded), so a block they
        complete is indexed by its next step, not by a preemption before it."""

    def num_known(self) -> int:
        return self.prompt_tokens + self.num_output

    def num_pending(self) -> int:
        """Known tokens not yet computed (prompt or recompute: many; decode: 1)."""
        return self.prompt_tokens + self.num_output - self.num_computed

    def is_finished(self) -> bool:
        return self.num_output >= self.output_tokens
