"""What a step computes, as the graph builder needs it: token counts and context lengths only."""

from __future__ import annotations

from dataclasses import dataclass

from sim.serde import require


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillChunk:
    new_tokens: int
    """Prompt tokens computed this step."""
    context_tokens: int = 0
    """Tokens of the same request already in the KV cache (earlier chunks, prefix-cache hits)."""
    samples: bool = True
    """The chunk finishes the prompt, so the step samples this request's first output token."""

    def __post_init__(self) -> None:
        require(self.new_tokens >= 1, "new_tokens", self.new_tokens, "must be >= 1")
        require(self.context_tokens >= 0, "context_tokens", self.context_tokens, "must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchShape:
    prefills: tuple[PrefillChunk, ...] = ()
    decode_context_tokens: tuple[int, ...] = ()
    """Per decoding request, tokens already in the KV cache; each computes one new token."""

    def __post_init__(self) -> None:
        require(bool(self.prefills or self.decode_context_tokens), "batch", "empty",
                "must hold at least one prefill chunk or decode")
        for c in self.decode_context_tokens:
            require(c >= 1, "decode_context_tokens", c, "must be >= 1")

    def num_tokens(self) -> int:
        return sum(p.new_tokens for p in self.prefills) + len(self.decode_context_tokens)

    def num_sampled(self) -> int:
        return sum(1 for p in self.prefills if p.samples) + len(self.decode_context_tokens)

    def num_sequences(self) -> int:
        return len(self.prefills) + len(self.decode_context_tokens)
