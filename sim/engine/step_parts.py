"""The parts a step is priced from, and the kernel nodes of each, from the scenario alone.

A step's kernel graph splits into parts that recur across steps far more often than whole steps:

- the token part: every kernel whose work depends only on the step's token count (embedding,
  norms, projections, MLP or MoE, collectives);
- the sampling part: the kernels of sampled tokens only (LM head, logits gather, sampler);
- one attention part per distinct prefill chunk (new tokens, context, how many alike);
- the decode attention part (count, mean context);
- with speculative decoding (`[engine] speculative_config`), the verification attention part
  (decoding requests each running k + 1 queries: count, mean context, k + 1) in place of the decode
  attention part, and the drafter's parts: the same families built on the draft model
  (`PartNodes.draft`), named `draft:<kernel>`.

The parts are exactly the nodes `build_step_graph` gives for a batch (tests compare the two).
Each part family is indexed by one count, which is what block pricing (`sim.engine.block_pricing`)
needs: the token part by the token count, the sampling part by the sampled count, a prefill part
by its new tokens (for one context and multiplicity), a decode part by its decode count (for one
mean context) or, equally, by its mean-context bucket (for one decode count: the pricer takes the
axis a run moves on, `PartBook.decode`). A family is named by a `PartFamily` key: ("token",),
("token", "decode_only") (a decode-only step of a model whose experts exchange tokens by DeepEP,
whose all-to-all runs in low-latency mode there, or of an engine that runs the shared expert beside
the routed ones only in captured decode steps), ("sampling",), ("prefill", context_tokens, count),
("decode", mean_context_tokens),
("decode_at", decode_count, bucket_tokens) (count: the bucket, mean context = bucket x bucket_tokens),
("prefill_at", new_tokens, count, stride) (a prompt chunk of one size indexed by its context in steps
of `stride` tokens: the other axis of a prefill part at a nonzero context), ("verify",
mean_context_tokens, query_tokens), and ("draft", <one of these>) for the drafter's (its token
families, "token" and "pass_token", with "decode_only" in decode-only steps as the target's).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

from sim.dtypes import DType
from sim.engine.block_pricing import BlockPricer, BuiltNodes, NodeList, NodeTemplate, PolynomialNodes, Rebuild
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, KernelWork, gemm_work
from sim.graph.moe import draw_rank0_loads, moe_work
from sim.graph.transformer import (
    build_step_graph,
    decode_attention_nodes,
    is_attention_work,
    prefill_attention_nodes,
    verify_attention_nodes,
)
from sim.perf.step import StepCostModel
from sim.specs.precision import draft_input_projection_dtype, resolve_draft_precision
from sim.specs.scenario import Scenario

PartFamily = tuple[object, ...]


class PartNodes:
    """The kernel nodes of each kind of part, from the scenario alone (no reference back to the
    pricer, so the pricer's memos are freed by reference counting)."""

    def __init__(self, scenario: Scenario, *, name_prefix: str = "", fc_input_width: int = 0,
                 fc_weight_dtype: DType | None = None, fc_every_pass: bool = True) -> None:
        """`name_prefix`, `fc_input_width` and `fc_every_pass` are for the drafter's nodes (`draft`): a
        prefix on every kernel name, the width of the EAGLE `fc` / MTP `eh_proj` input projection (0:
        none) and its weight format (default: the scenario's linear weights), and whether later draft
        passes run it too (EAGLE and MTP fuse the token embedding with
        the previous hidden state every pass; EAGLE-3 fuses the target's three layers once)."""
        self._sc = scenario
        self._prefix = name_prefix
        self._fc = fc_input_width
        self._fc_every_pass = fc_every_pass
        self._fc_dtype = fc_weight_dtype or scenario.precision.linear_weight_dtype
        self.draft: PartNodes | None = None
        """The drafter's parts (speculative decoding with a draft model or head), else None."""
        config = scenario.engine.speculative_config
        if config is not None and scenario.draft_model is not None:
            draft = scenario.draft_model
            engine = dataclasses.replace(scenario.engine, pipeline_parallel_size=1, speculative_config=None)
            precision = resolve_draft_precision(draft, scenario.engine, scenario.precision)
            fc = {"eagle": 2, "mtp": 2, "eagle3": 3}.get(config.method, 0) * scenario.model.hidden_size
            self.draft = PartNodes(dataclasses.replace(scenario, model=draft, engine=engine, precision=precision,
                                                       draft_model=None), name_prefix="draft:", fc_input_width=fc,
                                   fc_weight_dtype=draft_input_projection_dtype(config.method, precision),
                                   fc_every_pass=config.method != "eagle3")

    def _named(self, nodes: NodeList) -> NodeList:
        if not self._prefix:
            return nodes
        return [(dataclasses.replace(w, name=self._prefix + w.name), r) for w, r in nodes]

    def non_attention(self, num_tokens: int, num_sampled: int, decode_only: bool | None = None) -> NodeList:
        """Kernels other than attention of any batch with these token and sampled counts;
        `decode_only` as `build_step_graph` takes it (default: whether the batch is all decodes)."""
        prefills: tuple[PrefillChunk, ...] = ()
        if num_tokens > num_sampled:
            prefills = (PrefillChunk(new_tokens=num_tokens - num_sampled, samples=False),)
        batch = BatchShape(prefills=prefills, decode_context_tokens=(1,) * num_sampled)
        sc = self._sc
        graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch, decode_only=decode_only)
        nodes = [(n.work, n.repeat) for n in graph.nodes if not is_attention_work(n.work)]
        if self._fc:
            # EAGLE's fc (2h or, EAGLE-3, 3 fused target layers -> h) or DeepSeek MTP's eh_proj (2h -> h).
            w = self._fc_dtype
            nodes.insert(1, (gemm_work("fc", num_tokens, sc.model.hidden_size, self._fc, weight_dtype=w,
                                       act_dtype=sc.precision.activation_dtype,
                                       compute_dtype=sc.precision.gemm_compute_dtype(w, sc.hardware)), 1))
        return self._named(nodes)

    def token(self, num_tokens: int, decode_only: bool = False) -> NodeList:
        """Kernels of any batch of `num_tokens` tokens; a decode-only step launches the expert
        all-to-all (where there is one) in low-latency mode and may run the shared expert beside the
        routed ones (`sim.graph.shared_experts`)."""
        return self.non_attention(num_tokens, 0, decode_only=decode_only)

    def decode_only_token(self, num_tokens: int) -> NodeList:
        return self.token(num_tokens, decode_only=True)

    def pass_token(self, num_tokens: int, decode_only: bool = False) -> NodeList:
        """The drafter's token kernels in draft passes after the first (no `fc` for EAGLE-3)."""
        nodes = self.token(num_tokens, decode_only)
        if self._fc_every_pass:
            return nodes
        return [(w, r) for w, r in nodes if w.name != self._prefix + "fc"]

    def decode_only_pass_token(self, num_tokens: int) -> NodeList:
        return self.pass_token(num_tokens, decode_only=True)

    def sampling(self, num_sampled: int) -> NodeList:
        """The kernels a batch gains when `num_sampled` of its tokens are sampled."""
        unsampled = Counter(self.token(num_sampled, decode_only=True))
        return [node for node in self.non_attention(num_sampled, num_sampled) if unsampled[node] == 0]

    def prefill(self, new_tokens: int, context_tokens: int, count: int) -> NodeList:
        sc = self._sc
        return self._named(prefill_attention_nodes(sc.model, sc.engine, sc.precision, sc.hardware,
                                                   new_tokens=new_tokens, context_tokens=context_tokens, count=count))

    def decode(self, num_decode: int, mean_context_tokens: int) -> NodeList:
        sc = self._sc
        return self._named(decode_attention_nodes(sc.model, sc.engine, sc.precision,
                                                  {mean_context_tokens: num_decode}))

    def verify(self, num_decode: int, mean_context_tokens: int, query_tokens: int) -> NodeList:
        """Verification attention of `num_decode` requests of `query_tokens` = k + 1 queries each."""
        sc = self._sc
        return self._named(verify_attention_nodes(sc.model, sc.engine, sc.precision, sc.hardware,
                                                  num_requests=num_decode, context_tokens=mean_context_tokens,
                                                  num_query_tokens=query_tokens))

    def _moe_at(self, first: KernelWork, shapes: Sequence[tuple[int, ...]]) -> list[KernelWork]:
        """The fused MoE node `first` at other shapes (`PolynomialNodes` rebuilds it per count: its
        work follows rank 0's routed load, drawn for all the shapes at once); `PolynomialNodes.of`
        checks it against the real nodes."""
        precision = self._sc.precision
        routing = first.variant
        draw_rank0_loads(shapes, routing)
        out = []
        for num_tokens, hidden, inter_size, topk, num_experts, moe_tp, moe_ep in shapes:
            out.append(moe_work(num_tokens=num_tokens, hidden=hidden, inter_size=inter_size, topk=topk,
                                num_experts=num_experts, moe_tp=moe_tp, moe_ep=moe_ep, routing=routing,
                                weight_dtype=first.dtype, act=precision.activation_dtype))
        return out

    def block_pricer(self, family: PartFamily, cost: StepCostModel, eager_launch_s: float, top: int) -> BlockPricer:
        """The block pricer of one part family over counts 1..top (the run's token budget for token and
        prefill parts, its running-request cap for sampling and decode parts)."""

        rebuild: dict[KernelKind, Rebuild] = {KernelKind.MOE: self._moe_at}
        # Rows that move one tensor-parallel rank's share of the tokens are polynomials of ceil(n / tp).
        tp = self._sc.engine.tensor_parallel_size

        def polynomial(build: Callable[[int], NodeList], fallback: bool = False,
                       divisor: int = tp) -> Callable[[], NodeTemplate | None]:
            def make() -> NodeTemplate | None:
                poly = PolynomialNodes.of(build, top, rebuild, divisor=divisor)
                return poly if poly is not None or not fallback else BuiltNodes(build)
            return make

        kind, eager = family[0], eager_launch_s
        if kind == "draft":
            assert self.draft is not None
            return self.draft.block_pricer(family[1:], cost, eager, top)
        if kind == "verify":
            mean, q = int(family[1]), int(family[2])  # type: ignore[call-overload]
            return BlockPricer(polynomial(lambda n: self.verify(n, mean, q), fallback=True), cost, eager, top)
        if kind == "token":
            return BlockPricer(polynomial(self.decode_only_token if len(family) > 1 else self.token), cost, eager, top)
        if kind == "pass_token":
            return BlockPricer(polynomial(self.decode_only_pass_token if len(family) > 1 else self.pass_token),
                               cost, eager, top)
        if kind == "sampling":
            return BlockPricer(polynomial(self.sampling), cost, eager, top)
        if kind == "decode":
            mean = int(family[1])  # type: ignore[call-overload]
            return BlockPricer(polynomial(lambda n: self.decode(n, mean)), cost, eager, top)
        if kind == "decode_at":
            # One batch size, counted in mean-context buckets: no row carries a TP rank's token share.
            batch, bucket = int(family[1]), int(family[2])  # type: ignore[call-overload]
            return BlockPricer(polynomial(lambda b: self.decode(batch, b * bucket), divisor=1), cost, eager, top)
        if kind == "prefill_at":
            # One chunk size, counted in context steps: polynomial without a window (no fallback).
            new, count, stride = int(family[1]), int(family[2]), int(family[3])  # type: ignore[call-overload]
            return BlockPricer(polynomial(lambda k: self.prefill(new, k * stride, count), divisor=1), cost, eager, top)
        assert kind == "prefill"
        context, count = int(family[1]), int(family[2])  # type: ignore[call-overload]
        # Prefill attention is quadratic in the chunk; with a window, piecewise (then built per count).
        return BlockPricer(polynomial(lambda n: self.prefill(n, context, count), fallback=True), cost, eager, top)
