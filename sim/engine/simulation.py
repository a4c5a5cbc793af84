"""Discrete-event core: arrivals, a router, one scheduler per replica, step completions.

Only this module knows the clock. Events live in a heap of (time_s, priority, seq); a step
finishing at the same instant as an arrival is handled first, and ties keep FIFO order.
`max_concurrency` is a client-side semaphore as in `vllm bench serve`: a request is sent at
max(its arrival time, the moment a slot frees), and latencies count from the send.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sim.engine.pricer import StepPricer
from sim.engine.records import RequestRecord
from sim.metrics.histogram import LogHistogram
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.engine import RouterName

_STEP_DONE, _ARRIVAL = 0, 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SimLimits:
    max_sim_time_s: float = 7 * 24 * 3600.0
    max_num_steps: int = 50_000_000


@dataclass(slots=True)
class _Replica:
    scheduler: VllmV1Scheduler
    busy: bool = False
    plan: StepPlan | None = None
    busy_s: float = 0.0


class Simulation:
    def __init__(self, *, replicas: Sequence[VllmV1Scheduler], pricer: StepPricer, router: RouterName,
                 max_concurrency: int | None, limits: SimLimits,
                 progress: Callable[[int], None] | None = None) -> None:
        self._replicas = [_Replica(s) for s in replicas]
        self._pricer = pricer
        self._router = router
        self._max_concurrency = max_concurrency
        self._limits = limits
        self._progress = progress
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        self._rr = 0
        self._in_flight = 0
        self._held: deque[RequestState] = deque()
        self.now_s = 0.0
        self.num_steps = 0
        self.records: list[RequestRecord] = []
        self.itl = LogHistogram()
        self.kv_usage: list[tuple[float, float]] = []
        self.truncated = False

    def _push(self, time_s: float, priority: int, payload: object) -> None:
        heapq.heappush(self._heap, (time_s, priority, next(self._seq), payload))

    def run(self, requests: Sequence[RequestState]) -> list[RequestRecord]:
        for req in requests:
            self._push(req.arrival_s, _ARRIVAL, req)
        while self._heap:
            time_s, kind, _, payload = heapq.heappop(self._heap)
            assert time_s >= self.now_s, "time went backwards"
            if time_s > self._limits.max_sim_time_s or self.num_steps >= self._limits.max_num_steps:
                self.truncated = True
                break
            self.now_s = time_s
            if kind == _ARRIVAL:
                assert isinstance(payload, RequestState)
                self._on_arrival(payload)
            else:
                assert isinstance(payload, int)
                self._on_step_done(payload)
        return self.records

    def _on_arrival(self, req: RequestState) -> None:
        if self._max_concurrency is not None and self._in_flight >= self._max_concurrency:
            self._held.append(req)
            return
        self._send(req)

    def _send(self, req: RequestState) -> None:
        self._in_flight += 1
        req.sent_s = self.now_s
        idx = self._route(req)
        req.replica = idx
        replica = self._replicas[idx]
        replica.scheduler.add(req)
        if not replica.busy:
            self._start_step(idx)

    def _route(self, req: RequestState) -> int:
        n = len(self._replicas)
        if n == 1:
            return 0
        if self._router == "round_robin":
            self._rr = (self._rr + 1) % n
            return (self._rr - 1) % n
        load = [r.scheduler.num_outstanding() for r in self._replicas]
        if self._router == "prefix_aware" and req.keys:
            hits = [r.scheduler.kv.get_computed_tokens(req.keys, req.prompt_tokens) for r in self._replicas]
            return max(range(n), key=lambda i: (hits[i], -load[i], -i))
        return min(range(n), key=lambda i: (load[i], i))

    def _start_step(self, idx: int) -> None:
        replica = self._replicas[idx]
        plan = replica.scheduler.schedule()
        if plan is None:
            replica.busy = False
            return
        for chunk in plan.chunks:
            if chunk.request.first_scheduled_s is None:
                chunk.request.first_scheduled_s = self.now_s
        priced = self._pricer.price(plan)
        replica.busy, replica.plan = True, plan
        replica.busy_s += priced.step_s
        self.num_steps += 1
        self._push(self.now_s + priced.step_s, _STEP_DONE, idx)

    def _on_step_done(self, idx: int) -> None:
        replica = self._replicas[idx]
        plan = replica.plan
        assert plan is not None
        now = self.now_s
        for chunk in plan.chunks:
            if chunk.samples:
                req = chunk.request
                if req.first_token_s is None:
                    req.first_token_s = now
                elif req.last_token_s is not None:
                    self.itl.add(now - req.last_token_s)
                req.last_token_s = now
        finished = replica.scheduler.finish_step(plan)
        for req in finished:
            self._record(req)
        self.kv_usage.append((now, replica.scheduler.kv_usage_frac()))
        self._start_step(idx)
        for _ in finished:
            self._in_flight -= 1
            if self._held:
                self._send(self._held.popleft())

    def _record(self, req: RequestState) -> None:
        assert req.first_token_s is not None and req.first_scheduled_s is not None
        self.records.append(RequestRecord(
            request_id=req.request_id, replica=req.replica, arrival_s=req.sent_s,
            first_scheduled_s=req.first_scheduled_s, first_token_s=req.first_token_s, finish_s=self.now_s,
            prompt_tokens=req.prompt_tokens, output_tokens=req.num_output,
            prefix_hit_tokens=req.prefix_hit_tokens, num_preemptions=req.num_preemptions,
            recomputed_tokens=req.recomputed_tokens,
        ))
        if self._progress is not None:
            self._progress(len(self.records))

    def replica_busy_s(self) -> list[float]:
        return [r.busy_s for r in self._replicas]

    def num_preemptions(self) -> int:
        return sum(r.scheduler.num_preemptions for r in self._replicas)
