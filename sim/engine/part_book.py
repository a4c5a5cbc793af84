"""The step parts one run asks for: which family a part of a given count is priced in, and when.

`StepPricer` builds a step's price from parts (`sim.engine.step_parts` says what each holds): the
token part by the step's token count, the sampling part, one attention part per distinct prompt
chunk, the decode attention part, and speculative decoding's verification and drafter parts.
`PartBook` hands them out, memoized per run, and decides how each is priced: a family's first count
(a prefill family at a nonzero context: its first `BLOCK_FROM_ASK - 1`) alone, later ones by the
family's block pricer (`sim.engine.block_pricing`: many counts in one vectorised call per kernel
kind), the two giving the same bits when the kernel model prices columns. Decode parts and prompt
chunks at a nonzero context are held by two families each, one along the batch or chunk size and
one along the context, and the first asked often enough gets the block pricer. The priced parts
themselves live in a `PartPrices` (`sim.engine.part_prices`), which runs of one pricing identity may
share; the asks and memos here are this run's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from sim.engine.block_pricing import NodeList, Part, PartSource
from sim.engine.part_prices import PartPrices
from sim.engine.step_parts import PartFamily
from sim.graph.transformer import one_token_chunks_decode
from sim.provenance import Provenance
from sim.specs.scenario import Scenario

_TOKEN: PartFamily = ("token",)
_DECODE_ONLY_TOKEN: PartFamily = ("token", "decode_only")
_SAMPLING: PartFamily = ("sampling",)
_Axis = tuple[PartFamily, int, int, int]
"""A family that holds a part: (family, the part's count in it, the family's top, the ask it is
block priced from; `PartBook._part_in_families`)."""
_CONTEXT_STRIDE: Final = 32
"""Contexts of a prefill family along the context are counted in steps of this many tokens when
they fall on them (TensorRT-LLM's chunks end on 32-token KV blocks), else in single tokens."""
BLOCK_FROM_ASK: Final = 8
"""A prefill family at a nonzero context is block priced from the count it is asked for this many
times on (`_new_part`; other families from their second): such a family holds one or a few
prompts' chunks at one context (chunked prefill, a disaggregated decode pool's one-token prefills)
and is rarely asked for more than a few counts, while a template and a first window (~5 ms for an
MLA prefill family) cost about what pricing four or five counts alone does (~1.3 ms each). Token,
sampling, decode and fresh-prompt families are asked for many counts: blocks from the second."""


class PartBook:
    """One run's parts by kind and count, and the families they are block priced in."""

    def __init__(self, scenario: Scenario, prices: PartPrices, decode_context_bucket_tokens: int) -> None:
        self._sc = scenario
        self._prices = prices
        self._nodes = prices.nodes
        self._bucket = decode_context_bucket_tokens
        self._token_parts: dict[int, Part] = {}
        """Token parts by count; negative counts key decode-only steps' parts (their expert
        all-to-all runs in low-latency mode, their shared expert may run beside the routed ones)."""
        self._sampling_parts: dict[int, Part] = {}
        self._prefill_parts: dict[tuple[int, int, int], Part] = {}
        self._decode_parts: dict[tuple[int, int], Part] = {}
        self._spec_parts: dict[tuple[PartFamily, int], Part] = {}
        self.worst_provenance = Provenance.MEASURED
        """The least trusted provenance of any kernel in a part handed out."""
        self._blocks: dict[PartFamily, PartSource | None] | None = {} if prices.block_pricing else None
        """This run's block-priced families: the family's block pricer (None where it has none);
        absent while the family has been asked for too few counts (`_new_part`); None when the run
        prices every part alone."""
        self._asks: dict[PartFamily, int] = {}
        """Counts asked per family not yet block priced."""
        engine = scenario.engine
        self._tops = (engine.max_num_batched_tokens, min(engine.max_num_seqs or 0, engine.max_num_batched_tokens or 0))
        self._context_top = (engine.max_model_len or 0) // decode_context_bucket_tokens + 1
        """Mean-context buckets a decode family along the context prices (`decode`)."""
        self._k = engine.num_speculative_tokens()
        """Draft tokens per decoding request (0: no speculative decoding)."""
        self._one_token_decodes = one_token_chunks_decode(scenario.model, engine)
        """One-token prompt chunks are priced as decodes at their context (vLLM's MLA backends)."""
        self._draft = self._nodes.draft

    @property
    def prices(self) -> PartPrices:
        """The priced parts the book's parts come from (shared by the runs of one pricing identity)."""
        return self._prices

    @property
    def prices_in_blocks(self) -> bool:
        """Whether families are block priced (the kernel model prices columns), else every part alone."""
        return self._blocks is not None

    @property
    def block_pricers(self) -> Mapping[PartFamily, PartSource | None] | None:
        """The families block priced so far and their pricers (None: one without a template), or
        None when the run prices every part alone."""
        return self._blocks

    @property
    def has_drafter(self) -> bool:
        """Whether steps run a drafter's kernels (speculative decoding with a draft model or head)."""
        return self._draft is not None

    def draft(self, prefills: tuple[tuple[int, int, int], ...], num_decode: int, mean: int,
              num_tokens: int, num_seqs_sampling: int, decode_only: bool = False) -> list[Part]:
        """The drafter's kernels in a step (vLLM's EAGLE / MTP / draft-model proposers): a first pass
        over every token the target computed (it fills the draft's KV cache; prompt chunks attend as
        prefills, verifications with their k + 1 queries) that samples one draft token per request
        that sampled, then k - 1 passes of one token per such request at the decodes' mean context.
        `decode_only`: the step's token kernels launch as a decode-only step's (the target's token
        part is keyed so: expert all-to-all mode, shared expert beside the routed experts)."""
        k, draft = self._k, self._draft
        assert draft is not None
        if decode_only:
            parts = [self.spec(("draft", "token", "decode_only"), num_tokens, draft.decode_only_token)]
        else:
            parts = [self.spec(("draft", "token"), num_tokens, draft.token)]
        for chunk in sorted(set(prefills)):
            new, context, count = chunk[0], chunk[1], prefills.count(chunk)

            def prefill(n: int, c: int = context, m: int = count) -> NodeList:
                assert draft is not None
                return draft.prefill(n, c, m)
            parts.append(self.spec(("draft", "prefill", context, count), new, prefill))
        if num_decode:
            parts.append(self.spec(("draft", "verify", mean, 1 + k), num_decode,
                                   lambda n: draft.verify(n, mean, 1 + k)))
        s = num_seqs_sampling
        if s:
            sampling = self.spec(("draft", "sampling"), s, draft.sampling)
            parts.append(sampling)
            if k > 1:
                context = mean if num_decode else max(self._bucket, round(max(
                    new + ctx for new, ctx, samples in prefills if samples) / self._bucket) * self._bucket)
                token = (self.spec(("draft", "pass_token", "decode_only"), s, draft.decode_only_pass_token)
                         if decode_only else self.spec(("draft", "pass_token"), s, draft.pass_token))
                attention = self.spec(("draft", "decode", context), s, lambda n: draft.decode(n, context))
                parts += [token, attention, sampling] * (k - 1)  # the same parts k - 1 times
        return parts

    def spec(self, family: PartFamily, n: int, build: Callable[[int], NodeList] | None = None) -> Part:
        """A part of the speculative families (target verification, drafter), memoized per run."""
        part = self._spec_parts.get((family, n))
        if part is None:
            if build is None:
                nodes = self._nodes
                mean, q = int(family[1]), int(family[2])  # type: ignore[call-overload]
                build = lambda m: nodes.verify(m, mean, q)  # noqa: E731
            part = self._spec_parts[(family, n)] = self._new_part(family, n, build)
        return part

    def _new_part(self, family: PartFamily, n: int, build: Callable[[int], NodeList]) -> Part:
        """The part of count `n` of `family`, first asked for in this run: alone (its nodes built and
        priced) for the family's first count (a prefill family at a nonzero context: its first
        `BLOCK_FROM_ASK - 1`), by block pricing from then on (the two give the same bits when the
        kernel model prices columns: `PartPrices.priced`). Families asked for a few times (a
        prompt's chunks at one context, a decode pool's one-token prefills at a new context) never
        pay for a template and a window of counts they do not use."""
        kind, *rest = family[1:] if family[0] == "draft" else family
        from_ask = BLOCK_FROM_ASK if kind == "prefill" and rest[0] != 0 else 2
        top = (self._tops[0] if kind in ("token", "prefill") else self._tops[1]) or 0
        return self._part_in_families([(family, n, top, from_ask)], n, build)

    def _block_part(self, family: PartFamily, n: int) -> Part | None:
        """The part of count `n` from `family`'s block pricer when the run has one that prices it
        (what `_part_in_families` picks first for a family that leads its axes); else None."""
        blocks = self._blocks
        pricer = blocks.get(family) if blocks is not None else None
        if pricer is None:
            return None
        part = pricer.part(n)
        if part is not None and part.worst_provenance > self.worst_provenance:
            self.worst_provenance = part.worst_provenance
        return part

    def token(self, token_key: int) -> Part:
        """The token part (GEMMs, norms, activations, collectives, MoE) of a step with `token_key`
        tokens; a negative key is a decode-only step's (its expert all-to-all in low-latency mode)."""
        part = self._token_parts.get(token_key)
        if part is None:
            part = (self._block_part(_TOKEN, token_key) if token_key > 0
                    else self._block_part(_DECODE_ONLY_TOKEN, -token_key))
            if part is not None:
                self._token_parts[token_key] = part
                return part
            if token_key < 0:
                part = self._new_part(_DECODE_ONLY_TOKEN, -token_key, self._nodes.decode_only_token)
            else:
                part = self._new_part(_TOKEN, token_key, self._nodes.token)
            self._token_parts[token_key] = part
        return part

    def sampling(self, num_sampled: int) -> Part:
        """The sampler part of a step that samples `num_sampled` rows."""
        part = self._sampling_parts.get(num_sampled)
        if part is None:
            part = self._block_part(_SAMPLING, num_sampled)
            if part is None:
                part = self._new_part(_SAMPLING, num_sampled, self._nodes.sampling)
            self._sampling_parts[num_sampled] = part
        return part

    def prefill(self, new_tokens: int, context_tokens: int, count: int) -> Part:
        """A prompt chunk's attention: one family per context indexed by the chunk's new tokens
        (`("prefill", context, count)`), and, at a nonzero context, one per chunk size indexed by the
        context in steps of `stride` tokens (`("prefill_at", new, count, stride)`: an offline run's
        chunks take what the decodes leave of the token budget, so one chunk size recurs at many
        contexts; TensorRT-LLM's contexts fall on 32-token KV blocks). `_part_in_families` picks."""
        key = (new_tokens, context_tokens, count)
        part = self._prefill_parts.get(key)
        if part is None and new_tokens == 1 and self._one_token_decodes:
            # The engine runs it as `count` decodes at this context (`one_token_chunks_decode`).
            part = self._prefill_parts[key] = self.decode(count, context_tokens)
        if part is None:
            family = ("prefill", context_tokens, count)
            part = self._block_part(family, new_tokens)  # the first of its axes, as below
            if part is not None:
                self._prefill_parts[key] = part
                return part
            nodes = self._nodes
            build = lambda n: nodes.prefill(n, context_tokens, count)  # noqa: E731
            if context_tokens == 0:
                part = self._new_part(family, new_tokens, build)
            else:
                stride = _CONTEXT_STRIDE if context_tokens % _CONTEXT_STRIDE == 0 else 1
                part = self._part_in_families(
                    [(family, new_tokens, self._tops[0] or 0, BLOCK_FROM_ASK),
                     (("prefill_at", new_tokens, count, stride), context_tokens // stride,
                      (self._sc.engine.max_model_len or 0) // stride, BLOCK_FROM_ASK)],
                    new_tokens, build)
            self._prefill_parts[key] = part
        return part

    def decode(self, num_decode: int, mean_context_tokens: int) -> Part:
        """The decode attention part, block priced along whichever of its two axes the run moves on
        (`_part_in_families`): one family per mean-context bucket indexed by the batch size
        (`("decode", mean)`), or one per batch size indexed by the bucket (`("decode_at", batch,
        bucket_tokens)`). A Poisson run's batch moves while its mean context holds; a closed loop or
        an offline run keeps its batch while the mean context sweeps its range."""
        key = (num_decode, mean_context_tokens)
        part = self._decode_parts.get(key)
        if part is None:
            mean = mean_context_tokens
            part = self._block_part(("decode", mean), num_decode)  # the first of its axes, as below
            if part is not None:
                self._decode_parts[key] = part
                return part
            nodes = self._nodes
            axes: list[_Axis] = [(("decode", mean), num_decode, self._tops[1] or 0, 2)]
            if mean % self._bucket == 0:
                axes.append((("decode_at", num_decode, self._bucket), mean // self._bucket, self._context_top, 2))
            part = self._decode_parts[key] = self._part_in_families(
                axes, num_decode, lambda n: nodes.decode(n, mean))
        return part

    def _part_in_families(self, axes: Sequence[_Axis], n: int, build: Callable[[int], NodeList]) -> Part:
        """A part that one or two families hold (`axes`: (family, its count for this part, the family's
        top, the ask from which it is block priced), the first the family the part is priced alone
        in at count `n`): priced by the first family that has a block pricer, else an ask is counted
        in each family in turn until one is asked often enough to get a block pricer; else alone. Block
        and alone prices are the same bits (`PartPrices.priced`), so the family a part is priced in never
        changes it; a family whose fields are no polynomial of its count (a sliding window along
        the context) gets no template and leaves its parts to the other."""
        part = None
        blocks = self._blocks
        if blocks is not None:
            for family, count, _, _ in axes:
                pricer = blocks.get(family)
                part = pricer.part(count) if pricer is not None else None
                if part is not None:
                    break
            else:
                for family, count, top, from_ask in axes:
                    if family in blocks:
                        continue  # priced by it already, or it has no block pricer
                    asks = self._asks[family] = self._asks.get(family, 0) + 1
                    if asks >= from_ask:
                        pricer = blocks[family] = self._prices.block_pricer(family, top)
                        part = pricer.part(count) if pricer is not None else None
                        if part is not None:
                            break
        if part is None:
            part = self._prices.alone_part(axes[0][0], n, build)
        if part.worst_provenance > self.worst_provenance:
            self.worst_provenance = part.worst_provenance
        return part
