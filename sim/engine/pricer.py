"""Prices step plans: kernel graph + host overhead -> step wall time, with a per-instance memo.

Steps are keyed by their batch shape with decode contexts summarised as (count, mean context
rounded to `decode_context_bucket_tokens`): consecutive decode steps differ only by growing
contexts, so most steps hit the memo. Accumulated per-key counts give the kernel breakdown of a
run without touching per-kernel data in the loop.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.transformer import build_step_graph
from sim.perf.host import HostOverheadParams, host_cost, step_time_s
from sim.perf.step import StepCostModel, StepTiming
from sim.provenance import Provenance
from sim.serving.scheduler import StepPlan
from sim.specs.scenario import Scenario

StepKey = tuple[tuple[tuple[int, int, bool], ...], int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class PricedStep:
    step_s: float
    timing: StepTiming
    host_cpu_s: float
    host_launch_s: float
    launch_floor_s: float


class StepPricer:
    def __init__(self, scenario: Scenario, cost: StepCostModel, host: HostOverheadParams,
                 decode_context_bucket_tokens: int = 16) -> None:
        self._sc = scenario
        self._cost = cost
        self._host = host
        self._bucket = decode_context_bucket_tokens
        self._memo: dict[StepKey, PricedStep] = {}
        self.counts: Counter[StepKey] = Counter()
        self.worst_provenance = Provenance.MEASURED

    def key(self, plan: StepPlan) -> StepKey:
        prefills: list[tuple[int, int, bool]] = []
        num_decode = total_context = 0
        for c in plan.chunks:
            if c.is_decode():
                num_decode += 1
                total_context += c.num_context_tokens
            else:
                prefills.append((c.num_new_tokens, c.num_context_tokens, c.samples))
        mean = 0
        if num_decode:
            mean = max(self._bucket, round(total_context / num_decode / self._bucket) * self._bucket)
        return tuple(sorted(prefills)), num_decode, mean

    def price(self, plan: StepPlan) -> PricedStep:
        key = self.key(plan)
        self.counts[key] += 1
        priced = self._memo.get(key)
        if priced is None:
            priced = self._price_key(key)
            self._memo[key] = priced
            self.worst_provenance = max(self.worst_provenance, priced.timing.worst_provenance)
        return priced

    def _price_key(self, key: StepKey) -> PricedStep:
        prefills, num_decode, mean = key
        batch = BatchShape(
            prefills=tuple(PrefillChunk(new_tokens=n, context_tokens=c, samples=s) for n, c, s in prefills),
            decode_context_tokens=(mean,) * num_decode,
        )
        sc = self._sc
        graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch)
        timing = self._cost.cost(graph)
        mode = sc.engine.effective_launch_mode()
        gap = 0.0
        if mode == "eager":
            gap = sum(max(0.0, self._host.eager_launch_s - k.estimate.time_s) * k.repeat for k in timing.kernels)
        assert sc.engine.max_cudagraph_capture_size is not None
        host = host_cost(
            params=self._host, mode=mode, num_seqs=batch.num_sequences(), num_sampled=batch.num_sampled(),
            is_decode_only=not prefills, max_cudagraph_capture_size=sc.engine.max_cudagraph_capture_size,
            num_launches=graph.num_launches(), num_layers=sc.model.num_layers, short_kernel_gap_s=gap,
        )
        step_s = step_time_s(device_s=timing.device_s(), host=host, async_scheduling=sc.engine.async_scheduling)
        return PricedStep(step_s=step_s, timing=timing, host_cpu_s=host.cpu_s, host_launch_s=host.launch_s,
                          launch_floor_s=host.launch_floor_s)

    def breakdown(self) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Seconds by kernel kind, by kernel name, host CPU, launch floor, summed over all steps."""
        by_kind: dict[str, float] = {}
        by_name: dict[str, float] = {}
        host = floor = 0.0
        for key, count in self.counts.items():
            p = self._memo[key]
            for k in p.timing.kernels:
                sec = k.total_s() * count
                by_kind[k.estimate.work.kind.value] = by_kind.get(k.estimate.work.kind.value, 0.0) + sec
                by_name[k.estimate.work.name] = by_name.get(k.estimate.work.name, 0.0) + sec
            host += (p.host_cpu_s + p.host_launch_s) * count
            floor += p.launch_floor_s * count
        return by_kind, by_name, host, floor
