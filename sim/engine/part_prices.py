"""Priced step parts, shareable by every run with the same pricing identity (a sweep worker's trials).

A part's price is a function of what it is, never of the run that asked for it: a run prices a
family's first few counts alone and the later ones by block pricing (`StepPricer`), and with a
column kernel model the two are the same bits. This holds both kinds, each keyed by the part alone:

- `priced(nodes)`: one part alone, each kernel priced once per signature, through the kernel
  model's column path when it has one (else its scalar path), and `alone_part(family, n, build)`
  memoizing those per part;
- `block_pricer(family, top)`: block pricing (`sim.engine.block_pricing`). A count's price does
  not depend on the window it is priced in nor on the counts priced before it (the kernel model's
  column arithmetic is row by row; tests price families in different orders and in narrow and
  wide windows and compare), so a part priced by an earlier run is the part this run would price.

`PriceCache` keeps `PartPrices` per pricing identity: the model, precision and hardware, the
engine fields the kernel graph reads (parallelism, dtypes, quantization, backend), the eager launch
cost, and the kernel model (the efficiency model object itself, held by the entry so its id stays
unique; `sim.calibration.select.EfficiencyModels` hands the same object to every trial that
selects the same hardware, tier, calibration file version, backend and kernel sources). Scheduling
limits are not part of the identity: they enter a block pricer's key as its top count, and a run
with a lower top shares the family's widest pricer, capped at its top. The cache
is bounded in identities (least recently used dropped) and in parts per identity (cleared when
full; prices come back the same when priced again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from sim.engine.block_pricing import BlockPricer, NodeList, Part, PartSource, summed_part
from sim.engine.step_parts import PartFamily, PartNodes
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.shared_experts import depends_on_decode_only
from sim.perf.efficiency import EfficiencyModel, KernelColumns
from sim.perf.step import StepCostModel
from sim.provenance import Provenance
from sim.serde import config_hash
from sim.specs.engine import EngineParams
from sim.specs.scenario import Scenario

_WorkSignature = tuple[object, ...]

SCHEDULING_ONLY_FIELDS = (
    "data_parallel_size", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
    "enable_prefix_caching", "long_prefill_token_threshold",
    "gpu_memory_utilization", "block_size", "max_model_len", "enforce_eager", "max_cudagraph_capture_size",
    "async_scheduling", "launch_mode", "scheduler", "router", "batch_wait_timeout_iters",
    "batch_wait_max_tokens_ratio", "attention_dp_enable_balance", "attention_dp_timeout_iters",
    "attention_dp_batching_wait_iters", "api_server_latency_s",
)
"""Engine fields that never reach a step part's kernel nodes (they shape the schedule, the host
overhead or the memory plan), so trials that differ only in them share priced parts. MoE expert
layers read `data_parallel_size` (tokens of every attention-DP rank, experts split over TP x DP): it
stays in the identity for MoE models, and the CUDA-graph fields for engines that run the shared expert
beside the routed experts only in captured decode steps (tests check every field listed here against
the kernel graph)."""


def pricing_identity(scenario: Scenario, efficiency: EfficiencyModel, eager_launch_s: float,
                     block_pricing: bool) -> tuple[object, ...]:
    engine = scenario.engine
    kept = {f: getattr(EngineParams(), f) for f in SCHEDULING_ONLY_FIELDS}
    if scenario.model.moe is not None:
        del kept["data_parallel_size"]  # MoE layers see every DP rank's tokens; experts split over TP x DP
    if depends_on_decode_only(scenario.model, engine, scenario.precision, scenario.hardware):
        # Captured decode steps run the shared expert beside the routed ones (`sim.graph.shared_experts`).
        for f in ("max_cudagraph_capture_size", "enforce_eager", "launch_mode"):
            del kept[f]
    graph_engine = replace(engine, **kept)
    return (config_hash(scenario.model), config_hash(scenario.precision), config_hash(scenario.hardware),
            config_hash(graph_engine), eager_launch_s, id(efficiency), block_pricing)


class PartPrices:
    """Parts of one pricing identity, priced on demand and kept (see the module docstring)."""

    def __init__(self, scenario: Scenario, cost: StepCostModel, eager_launch_s: float, *, block_pricing: bool = True,
                 max_parts: int = 1 << 16) -> None:
        self.nodes = PartNodes(scenario)
        self.cost = cost
        self.eager_launch_s = eager_launch_s
        self.block_pricing = block_pricing and cost.prices_columns()
        self._max_parts = max_parts
        self._by_signature: dict[_WorkSignature, tuple[float, Provenance]] = {}
        self._alone: dict[tuple[PartFamily, int], Part] = {}
        self._blocks: dict[tuple[PartFamily, int], PartSource] = {}
        self._widest: dict[PartFamily, BlockPricer] = {}
        """Per family, the pricer with the highest top made so far (the one narrower runs share)."""

    def block_pricer(self, family: PartFamily, top: int) -> PartSource | None:
        """The family's block pricer over counts 1..top; None when the kernel model prices no columns.

        A run whose limit (`top`) is below that of a pricer the family already has gets that pricer
        capped at `top` (`BlockPricer.capped`: the same prices), so trials that differ only in
        `max_num_seqs` or `max_num_batched_tokens` share priced windows and templates.
        """
        if not self.block_pricing:
            return None
        pricer = self._blocks.get((family, top))
        if pricer is None:
            if len(self._blocks) >= self._max_parts // 64:
                self._blocks.clear()  # bounded: a family priced again gets the same prices
                self._widest.clear()
            wide = self._widest.get(family)
            if wide is not None and wide.max_count >= top and wide.has_template():
                pricer = wide if wide.max_count == top else wide.capped(top)
            else:
                made = self.nodes.block_pricer(family, self.cost, self.eager_launch_s, top)
                if wide is None or top > wide.max_count:
                    self._widest[family] = made
                pricer = made
            self._blocks[(family, top)] = pricer
        return pricer

    def alone_part(self, family: PartFamily, n: int, build: Callable[[int], NodeList]) -> Part:
        """The part of count `n` of `family` priced alone (`priced(build(n))`), kept per part."""
        part = self._alone.get((family, n))
        if part is None:
            if len(self._alone) >= self._max_parts:
                self._alone.clear()
            part = self._alone[(family, n)] = self.priced(build(n))
        return part

    def priced(self, nodes: NodeList) -> Part:
        """The part of these nodes, each kernel priced once per signature: through the kernel model's
        column path when it has one (so a count priced alone is bitwise the price block pricing
        gives it: the same arithmetic, row by row), else kernel by kernel."""
        if len(self._by_signature) >= self._max_parts:
            self._by_signature.clear()
        if self.block_pricing:
            self._price_columns([w for w, _ in nodes])
        known = self._by_signature
        priced: list[tuple[KernelKind, int, float, Provenance]] = []
        for work, repeat in nodes:
            signature = _signature(work)
            price = known.get(signature)
            if price is None:
                est = self.cost.estimate(work)
                price = known[signature] = (est.time_s, est.provenance)
            priced.append((work.kind, repeat, *price))
        return summed_part(priced, tuple((w.kind.value, w.name) for w, _ in nodes), self.eager_launch_s)

    def _price_columns(self, works: list[KernelWork]) -> None:
        """Price the works without a price yet, one column call per kernel group (kind, dtype, group
        size, shape length, variant: `NodeTemplate.groups`' grouping)."""
        groups: dict[tuple[object, ...], dict[_WorkSignature, KernelWork]] = {}
        known = self._by_signature
        for work in works:
            signature = _signature(work)
            if signature not in known:
                key = (work.kind, work.dtype, work.group_size, len(work.shape), work.variant)
                groups.setdefault(key, {})[signature] = work
        for group in groups.values():
            times, provs = self.cost.estimate_columns(KernelColumns.of(list(group.values())))
            for signature, time_s, prov in zip(group, times.tolist(), provs.tolist(), strict=True):
                known[signature] = (time_s, Provenance(prov))


def _signature(work: KernelWork) -> _WorkSignature:
    """What a kernel's time depends on (not its name: kernels alike but for it share a price)."""
    return (work.kind, work.dtype, work.flops, work.weight_bytes, work.activation_bytes, work.kv_read_bytes,
            work.kv_write_bytes, work.comm_bytes, work.group_size, work.shape, work.variant)


class PriceCache:
    """`PartPrices` by pricing identity, for the runs of one long-lived owner (a sweep worker);
    at most `max_identities` kept, the least recently used dropped first. Not thread-safe: one
    owner simulates one trial at a time."""

    def __init__(self, max_identities: int = 16, max_parts: int = 1 << 16) -> None:
        if max_identities < 1:
            raise ValueError(f"max_identities={max_identities!r} must be >= 1")
        self._max = max_identities
        self._max_parts = max_parts
        self._entries: OrderedDict[tuple[object, ...], tuple[EfficiencyModel, PartPrices]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def prices(self, scenario: Scenario, efficiency: EfficiencyModel, eager_launch_s: float, *,
               block_pricing: bool = True) -> PartPrices:
        """The shared parts of the scenario's pricing identity (new ones on the first call)."""
        key = pricing_identity(scenario, efficiency, eager_launch_s, block_pricing)
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
            self._entries.move_to_end(key)
            return entry[1]
        self.misses += 1
        prices = PartPrices(scenario, StepCostModel(scenario.hardware, efficiency), eager_launch_s,
                            block_pricing=block_pricing, max_parts=self._max_parts)
        self._entries[key] = (efficiency, prices)  # the model is held so that its id stays unique
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return prices
