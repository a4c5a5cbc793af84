"""Discrete-event core: arrivals, a router, one scheduler per replica, step completions.

Only this module knows the clock. Arrivals are read in order from the sorted request list and
step completions live in a heap of (time_s, seq, replica); a step finishing at the same instant
as an arrival is handled first, and ties keep FIFO order. `max_concurrency` is a client-side
semaphore as in `vllm bench serve`: a request is sent at max(its arrival time, the moment a slot
frees), and latencies count from the send.

Bulk stepping (`SimLimits.bulk_decode`): the schedulers keep running decodes in aggregate (see
`VllmV1Scheduler`), so a step costs the same whatever the batch size, and a replica whose next
step ends before any other event (an arrival, another replica's step end, a limit) finishes it
at once instead of going through the heap. Both give exactly the event order of the reference
path, which handles every request of every step and every event through the heap.

Token times: a request that sampled in the replica's previous step has an inter-token latency of
exactly this step's duration (steps of a replica run back to back); any other gap is measured on
the clock. ITL values are kept exactly, as counts per distinct value.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import get_args

import numpy as np

from sim.engine.pricer import AnyKey, DecodeRun, GroupKey, StepPricer
from sim.engine.records import RequestRecord, new_request_record
from sim.engine.step_log import StepLog
from sim.metrics.kv_usage import KvUsageTrace
from sim.serving.dp_group import DataParallelGroup
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import BulkDecodeScheduler, StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.engine import RouterName
from sim.workload.requests import RequestSpec

_MAX_RUN_STEPS = 256
"""Longest run of decode-only steps priced ahead at once (bounds work priced but not run)."""
PREFIX_AWARE_BALANCE_ABS = 64
"""`prefix_aware` routes for load, not cache, while the most and least outstanding requests of its
candidates differ by more than this (SGLang router's cache-aware `balance_abs_threshold`)..."""
PREFIX_AWARE_BALANCE_REL = 1.5
"""... and the most is above this many times the least (its `balance_rel_threshold`)."""
_SHORT_RUN_STEPS = 24
"""Below about this many steps to the next event, bulk steps are priced and counted one by one in
Python (`StepPricer.decode_steps`); above, in arrays (`StepPricer.decode_run`). Same results."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimLimits:
    max_sim_time_s: float = 7 * 24 * 3600.0
    max_num_steps: int = 1_000_000_000
    bulk_decode: bool = True
    """Advance running decodes in bulk (same results, cost per step independent of the batch);
    False runs the request-by-request reference path."""
    pipeline_micro_batches: bool = True
    """A pipeline-parallel replica keeps one micro-batch per stage in flight
    (`sim.engine.micro_batches`); False runs one batch at a time through the stages (the earlier
    model, kept for comparison)."""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Cyclic garbage collection off for the block (restored after, as it was).

    The event loop allocates many small objects and makes almost no reference cycles (a few
    hundred per 10,000 requests), so the collector's passes over the live requests, records and
    memoized parts cost ~10% of a run and reclaim nearly nothing; reference counting frees the
    rest as usual.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def request_states(specs: Sequence[RequestSpec], kv: KVCacheManager) -> list[RequestState]:
    """Runtime state of each request, keyed for prefix caching by its shared prefix only.

    Keys of prompt tokens that belong to one request alone are derived if it is preempted (see
    `RequestState.keys`). Requests of one prefix group share one key tuple.
    """
    block_size = kv.block_size
    shared: dict[tuple[int, int], tuple[int, ...]] = {}
    states = []
    for spec in specs:
        keys: tuple[int, ...] = ()
        prefix_tokens = spec.prefix_tokens()
        if kv.enable_prefix_caching and prefix_tokens >= block_size:
            head = spec.segments[0]
            memo_key = (head.content_id, prefix_tokens)
            cached = shared.get(memo_key)
            if cached is None:
                cached = kv.prompt_block_keys((head,), spec.request_id, prefix_tokens)
                shared[memo_key] = cached
            keys = cached
        states.append(RequestState(
            request_id=spec.request_id, prompt_tokens=spec.prompt_tokens, output_tokens=spec.output_tokens,
            arrival_s=spec.arrival_s, keys=keys, segments=spec.segments,
        ))
    return states


Scheduler = VllmV1Scheduler | DataParallelGroup
"""A replica: one engine's scheduler, or the lockstep ranks of an attention-data-parallel MoE engine."""


@dataclass(slots=True)
class _Replica:
    scheduler: Scheduler
    bulk: bool
    """The scheduler runs decode-only steps in bulk (`BulkDecodeScheduler`) and the limits allow it."""
    pricer: StepPricer
    """Prices this replica's steps (one pricer for all replicas of an aggregated run; one per pool
    in a disaggregated run)."""
    trace: KvUsageTrace
    """Where this replica's KV usage after each step goes."""
    busy: bool = False
    plan: StepPlan | None = None
    step_s: float = 0.0
    busy_s: float = 0.0
    run: DecodeRun | None = None
    """A run of decode-only steps in flight (run-ahead; `plan` is None then)."""
    event_seq: int = -1
    """Sequence number of this replica's live heap entry (older entries of it are stale)."""
    group_bulk: bool = False
    """An attention-DP group whose steps of bulk decodes only run in bulk (`_run_group_bulk_decodes`)."""
    kv_during_step: bool = False
    """The trace takes the KV blocks held while a step ran (those of requests finishing in it
    included), not those left after it: a prefill pool frees each prompt's blocks as its prefill ends."""
    ends: dict[int, float] | None = None
    """End times of this replica's recent steps by step id, kept while its bulk decodes may sit
    out steps (`prefill_priority`): from the earliest step in which one of them last sampled, for
    their inter-token gaps and the last token time of those brought up to date; else None."""


def _bulk_may_wait(scheduler: Scheduler) -> bool:
    ranks = scheduler.ranks if isinstance(scheduler, DataParallelGroup) else [scheduler]
    return any(rank.bulk_may_wait for rank in ranks)


def loads_imbalanced(loads: Sequence[int]) -> bool:
    """Whether a cache-aware router balances load instead of following the cache: SGLang router's
    cache-aware policy (`sgl-router/src/policies/cache_aware.rs`, defaults 64 and 1.5) sends a
    request to the least loaded worker while max - min > abs threshold and max > rel x min, so
    a prefix every request shares (a system prompt) cannot pile the traffic onto one replica."""
    lo, hi = min(loads), max(loads)
    return hi - lo > PREFIX_AWARE_BALANCE_ABS and hi > PREFIX_AWARE_BALANCE_REL * lo


def check_router(router: str, key: str = "router") -> None:
    """Refuse a router name `Simulation._route_in` does not know (it would route as least_outstanding)."""
    if router not in get_args(RouterName):
        raise ValueError(f"{key}={router!r}: must be one of {', '.join(get_args(RouterName))}")


def _note_end(ends: dict[int, float], step_id: int, end_s: float, oldest: int | None) -> None:
    """Keep `end_s` as step `step_id`'s end and forget the ends of steps before `oldest` (no bulk
    decode last sampled in them; all, if None)."""
    if oldest is None:
        ends.clear()
    else:
        while ends and (first := next(iter(ends))) < oldest:
            del ends[first]
    ends[step_id] = end_s


class Simulation:
    def __init__(self, *, replicas: Sequence[Scheduler], pricer: StepPricer, router: RouterName,
                 max_concurrency: int | None, limits: SimLimits,
                 progress: Callable[[int], None] | None = None, step_log: StepLog | None = None,
                 pricers: Sequence[StepPricer] | None = None, client_latency_s: float = 0.0) -> None:
        """`pricers`: one per replica when replicas differ (disaggregated pools); default `pricer`.
        `client_latency_s`: time outside the engine (the API server's request and response paths)
        added to each record's first-token and finish times; the engine's own events do not see it."""
        check_router(router)
        pricers = pricers or [pricer] * len(replicas)
        self.kv_trace = KvUsageTrace()
        """After each step: its end time and the used fraction of its replica's KV blocks."""
        self._replicas = [_Replica(s, limits.bulk_decode and isinstance(s, BulkDecodeScheduler), p, self.kv_trace,
                                   group_bulk=(limits.bulk_decode and step_log is None
                                               and isinstance(s, DataParallelGroup) and not _bulk_may_wait(s)),
                                   ends={} if limits.bulk_decode and _bulk_may_wait(s) else None)
                          for s, p in zip(replicas, pricers, strict=True)]
        self._pricers = list({id(p): p for p in pricers}.values())
        self._pricer = pricer
        self._router = router
        self._max_concurrency = max_concurrency
        self._limits = limits
        self._inline = limits.bulk_decode
        self._run_ahead = (self.RUN_AHEAD and limits.bulk_decode and step_log is None and len(replicas) > 1
                           and router != "prefix_aware" and limits.max_num_steps >= SimLimits().max_num_steps)
        """Replicas run their decode-only steps ahead of other replicas' events (see `_start_run`). Off
        under a step limit below the default: a run queued ahead counts all its steps against the
        limit before they start, so a limit that binds would stop the fleet early (the steps the
        run-ahead loop counts as in flight are the reference path's future steps)."""
        if self._run_ahead:
            for p in self._pricers:
                p.first_s = {}
        self._progress = progress
        self._client_latency_s = client_latency_s
        self.step_log = step_log
        """Steps run, when given (for a Chrome trace); None keeps the loop free of logging."""
        self._heap: list[tuple[float, int, int]] = []
        self._seq = itertools.count()
        self._next_arrival_s = float("inf")
        self._rr = [0, 0]
        """Round-robin counters per routed pool (one for aggregated runs; prefill, decode)."""
        self._in_flight = 0
        self._held: deque[RequestState] = deque()
        self.now_s = 0.0
        self.num_steps = 0
        self._steps_ahead = 0
        """Steps of run-ahead runs in flight: started, counted in `num_steps` when their run ends."""
        self.records: list[RequestRecord] = []
        self.itl: dict[float, int] = {}
        """Inter-token latency in seconds -> number of token gaps with exactly that value."""
        self.truncated = False
        """The run stopped at a limit, or ended with requests that could not be scheduled."""

    @property
    def kv_usage(self) -> tuple[tuple[float, float], ...]:
        """(time_s, used KV fraction of the replica that just finished a step), one per step, or
        per time bucket once the trace is long (`KvUsageTrace.series`)."""
        return self.kv_trace.series()

    RUN_AHEAD = True
    """Whether this loop may run a replica's decode steps ahead (a subclass with other events
    between replicas turns it off)."""

    stream_known_token_at_admission = True
    """A request admitted with an output token it already knows (a disaggregated decode worker
    given the token the prefill sampled) streams it as it is admitted (SGLang); otherwise it
    streams with the token the request's first step samples (TensorRT-LLM)."""

    def run(self, requests: Sequence[RequestState]) -> list[RequestRecord]:
        with gc_paused():
            records = self._run(requests)
        itl = self.itl
        for pricer in self._pricers:
            for key, step_s, count in pricer.fold_runs():
                itl[step_s] = itl.get(step_s, 0) + key[1] * count
        return records

    def _run(self, requests: Sequence[RequestState]) -> list[RequestRecord]:
        arrivals = list(requests)
        if any(a.arrival_s > b.arrival_s for a, b in itertools.pairwise(arrivals)):
            arrivals.sort(key=lambda r: r.arrival_s)
        heap = self._heap
        limits = self._limits
        i, n = 0, len(arrivals)
        while i < n or heap:
            self._next_arrival_s = arrivals[i].arrival_s if i < n else float("inf")
            if heap and heap[0][0] <= self._next_arrival_s:
                time_s, seq, idx = heapq.heappop(heap)
                if 0 <= idx < len(self._replicas) and self._replicas[idx].event_seq != seq:
                    continue  # a run cut short since: its new end is queued
                req = None
            else:
                time_s, req = self._next_arrival_s, arrivals[i]
                i += 1
            assert time_s >= self.now_s, "time went backwards"
            if time_s > limits.max_sim_time_s or self.num_steps + self._steps_ahead >= limits.max_num_steps:
                self.truncated = True
                break
            self.now_s = time_s
            if req is not None:
                self._next_arrival_s = arrivals[i].arrival_s if i < n else float("inf")
                self._on_arrival(req)
            else:
                self._on_step_done(idx)
        if not self.truncated and len(self.records) < n:
            # Every replica went idle with requests left: they can never be scheduled (e.g. one
            # needs more KV blocks than the replica has). Report the run as cut short.
            self.truncated = True
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
        if self._replicas[idx].run is not None:
            self._cut_run(idx)
        scheduler = self._replicas[idx].scheduler
        if (isinstance(scheduler, DataParallelGroup) and self._router == "prefix_aware" and req.keys
                and not loads_imbalanced([rank.num_outstanding() for rank in scheduler.ranks])):
            # A KV-aware router picks the worker and its DP rank together (as Dynamo's does): the
            # rank holding the longest cached prefix (ties: the least outstanding); without a hit,
            # or while the ranks' loads are imbalanced, the group's load balancer.
            hit, rank = scheduler.prefix_hit(req.keys, req.prompt_tokens)
            scheduler.add(req, rank if hit else None)
        else:
            scheduler.add(req)
        self._wake(idx)

    def _wake(self, idx: int) -> None:
        """Start the replica's next step if it sat idle (a request just reached its queue)."""
        if not self._replicas[idx].busy:
            end_s = self._start_step(idx)
            if end_s is not None:
                self._push(end_s, idx)

    def _push(self, time_s: float, idx: int) -> None:
        seq = next(self._seq)
        if 0 <= idx < len(self._replicas):  # negative indices are a subclass's own events
            self._replicas[idx].event_seq = seq
        heapq.heappush(self._heap, (time_s, seq, idx))

    def _heap_top_s(self) -> float:
        """Time of the next live heap entry (stale entries at the top are dropped)."""
        heap = self._heap
        replicas = self._replicas
        while heap:
            time_s, seq, idx = heap[0]
            if 0 <= idx < len(replicas) and replicas[idx].event_seq != seq:
                heapq.heappop(heap)
                continue
            return time_s
        return math.inf

    def _route(self, req: RequestState) -> int:
        return self._route_in(req, range(len(self._replicas)), self._router, 0)

    def _route_in(self, req: RequestState, candidates: Sequence[int], router: RouterName, pool: int) -> int:
        """The replica among `candidates` (ascending indices) that `router` sends `req` to; `pool`
        names the round-robin counter (a disaggregated run routes its prefill and decode pools
        separately). An autoscaled run passes only its active replicas."""
        n = len(candidates)
        if n == 1:
            return candidates[0]
        if router == "round_robin":
            i = self._rr[pool] % n  # the candidates may have changed since the last request
            self._rr[pool] = (i + 1) % n
            return candidates[i]
        replicas = self._replicas
        load = [replicas[j].scheduler.num_outstanding() for j in candidates]
        if router == "prefix_aware" and req.keys and not loads_imbalanced(load):
            hits = [self._cached_prompt_tokens(replicas[j].scheduler, req) for j in candidates]
            return candidates[max(range(n), key=lambda i: (hits[i], -load[i], -i))]
        return candidates[min(range(n), key=lambda i: (load[i], i))]

    @staticmethod
    def _cached_prompt_tokens(scheduler: Scheduler, req: RequestState) -> int:
        """Prompt tokens of `req` a replica holds cached (a lockstep group: its best rank's)."""
        if isinstance(scheduler, DataParallelGroup):
            return scheduler.prefix_hit(req.keys, req.prompt_tokens)[0]
        return scheduler.kv.get_computed_tokens(req.keys, req.prompt_tokens)

    def _start_step(self, idx: int) -> float | None:
        """Plan and price the replica's next step at `now_s`; its end time, or None when idle."""
        replica = self._replicas[idx]
        plan = replica.scheduler.schedule()
        if plan is None:
            replica.busy, replica.plan = False, None
            return None
        now = self.now_s
        ends = replica.ends
        for req in plan.resynced:
            # They sampled in the step that just ended, or, having sat out prefill-only steps since, earlier.
            req.last_token_s = now if ends is None else ends[req.last_sample_step]
        for chunk in plan.chunks:
            req = chunk.request
            if req.first_scheduled_s is None:
                req.first_scheduled_s = now
                if req.num_output and req.first_token_s is None and self.stream_known_token_at_admission:
                    # It arrived with its first token (a disaggregated decode worker taking the token
                    # the prefill sampled): the token streams as the request is admitted.
                    req.first_token_s = req.last_token_s = now
        replica.pricer.clock_s = now
        step_s = replica.pricer.price(plan)
        if self.step_log is not None:
            self.step_log.add(replica=idx, start_s=now, step_s=step_s, num_steps=1, end_s=now + step_s,
                              key=replica.pricer.key(plan), num_preempted=len(plan.preempted))
        replica.busy, replica.plan, replica.step_s = True, plan, step_s
        replica.busy_s += step_s
        self.num_steps += 1
        return now + step_s

    def _can_finish_inline(self, end_s: float) -> bool:
        """True when nothing else happens before `end_s`, so the step may end without the heap."""
        if not self._inline or end_s >= self._next_arrival_s or end_s >= self._heap_top_s():
            return False
        limits = self._limits
        return end_s <= limits.max_sim_time_s and self.num_steps + self._steps_ahead < limits.max_num_steps

    def _on_step_done(self, idx: int) -> None:
        replica = self._replicas[idx]
        finished = self._finish_run(idx) if replica.run is not None else self._finish_step(idx)
        while True:
            if replica.bulk and not (finished and self._held):
                # Nothing to send for the finished requests: only their slots are released.
                self._in_flight -= len(finished)
                if self._run_ahead:
                    finished = []
                    if self._start_run(idx):
                        return
                else:
                    finished = self._run_bulk_decodes(idx)
            elif replica.group_bulk and not (finished and self._held):
                self._in_flight -= len(finished)
                finished = self._run_group_bulk_decodes(idx)
            end_s = self._start_step(idx)
            seq = next(self._seq)  # this replica's step is queued before the steps the sends start
            replica.event_seq = seq
            for _ in finished:
                self._in_flight -= 1
                if self._held:
                    self._send(self._held.popleft())
            if end_s is None:
                return
            if not self._can_finish_inline(end_s):
                heapq.heappush(self._heap, (end_s, seq, idx))
                return
            self.now_s = end_s
            finished = self._finish_step(idx)

    def _run_bulk_decodes(self, idx: int) -> list[RequestState]:
        """Run the replica's next steps while each is bulk decodes only and ends before any other
        event, a run of steps at a time: their count is fixed until one finishes, so the steps
        are priced and the clock advanced before the scheduler runs them in one call.

        Returns the requests that finished in the last step when held requests wait for their
        slots (they are sent after the next step is planned, as `_on_step_done` does); else [].
        """
        replica = self._replicas[idx]
        scheduler = replica.scheduler
        assert isinstance(scheduler, VllmV1Scheduler)  # a group is not a BulkDecodeScheduler
        limits = self._limits
        while True:
            shape = scheduler.next_bulk_decode_steps()
            if shape is None:
                return []
            num_decode, context_tokens, until_finish = shape
            horizon_s = min(self._next_arrival_s, self._heap[0][0] if self._heap else math.inf)
            max_steps = min(until_finish, _MAX_RUN_STEPS, limits.max_num_steps - 1 - self.num_steps - self._steps_ahead)
            if max_steps <= 0:
                return []
            if horizon_s - self.now_s < _SHORT_RUN_STEPS * replica.step_s:
                # A few steps before the next event: step by step in Python is cheaper.
                num_priced, steps, finished = self._run_few_bulk_decodes(idx, num_decode, context_tokens, max_steps,
                                                                         horizon_s)
                if not num_priced:
                    return []
            else:
                run = replica.pricer.decode_run(num_decode, context_tokens, self.now_s, max_steps, horizon_s,
                                                limits.max_sim_time_s)
                num_priced = run.num_steps
                if not num_priced:
                    return []  # _start_step plans this step and queues its end
                steps, finished, free_after = scheduler.run_bulk_decode_steps(run.num_steps)
                self._account_run(idx, run, steps, np.asarray(free_after))
                self.now_s = float(run.ends[steps - 1])
            for req in finished:
                self._record(req)
            if finished and self._held:
                return finished
            self._in_flight -= len(finished)
            if not finished and (steps < num_priced or steps < max_steps):
                # Blocks ran out (the next step preempts), or the next step, the same as the one
                # `decode_run` stopped at, ends at or past the horizon: `_start_step` plans it.
                return []

    def _run_group_bulk_decodes(self, idx: int) -> list[RequestState]:
        """`_run_bulk_decodes` for an attention-DP group: while every rank with requests runs bulk
        decodes only, the group's steps are priced (`StepPricer.group_decode_steps`) up to the first
        step in which a decode of some rank finishes, its blocks run out, or the next event, and the
        ranks run them in one call each. Same returns as `_run_bulk_decodes`."""
        replica = self._replicas[idx]
        group = replica.scheduler
        assert isinstance(group, DataParallelGroup)
        pricer = replica.pricer
        limits = self._limits
        last_step_s = replica.step_s
        while True:
            horizon_s = min(self._next_arrival_s, self._heap[0][0] if self._heap else math.inf)
            if horizon_s - self.now_s <= last_step_s:
                # A step like the last one would end at or past the next event (in a decode pool,
                # a KV transfer every step or two): not worth asking the ranks.
                return []
            shapes = group.next_bulk_group_steps()
            if shapes is None:
                return []
            busy = [s for s in shapes if s is not None]
            max_steps = min(min(s[2] for s in busy), _MAX_RUN_STEPS,
                            limits.max_num_steps - 1 - self.num_steps - self._steps_ahead)
            max_steps = group.bulk_group_block_steps(max_steps)
            if max_steps <= 0:
                return []
            groups, ends = pricer.group_decode_steps([(n, c) for n, c, _ in busy], self.now_s, max_steps, horizon_s,
                                                     limits.max_sim_time_s)
            steps = len(ends)
            if not steps:
                return []
            finished, used = group.run_bulk_group_steps(steps)
            self._count_step_groups(idx, groups, steps, sum(s[0] for s in busy), ends)
            last_step_s = groups[-1][1]
            total = group.num_kv_blocks
            replica.trace.extend_values(ends, [u / total for u in used])
            self.now_s = ends[-1]
            self.num_steps += steps
            for req in finished:
                self._record(req)
            if finished and self._held:
                return finished
            self._in_flight -= len(finished)
            if not finished and steps < max_steps:
                return []  # the next step ends at or past the next event: `_start_step` plans it

    def _run_few_bulk_decodes(self, idx: int, num_decode: int, context_tokens: int, max_steps: int,
                              horizon_s: float) -> tuple[int, int, list[RequestState]]:
        """`_run_bulk_decodes`' steps priced and counted one by one (`StepPricer.decode_steps`):
        (steps priced to run, steps run, requests that finished)."""
        replica = self._replicas[idx]
        scheduler = replica.scheduler
        assert isinstance(scheduler, VllmV1Scheduler)
        groups, ends = replica.pricer.decode_steps(num_decode, context_tokens, self.now_s, max_steps, horizon_s,
                                                   self._limits.max_sim_time_s)
        if not ends:
            return 0, 0, []
        steps, finished, free_after = scheduler.run_bulk_decode_steps(len(ends))
        self._count_step_groups(idx, groups, steps, num_decode, ends)
        num_blocks = scheduler.kv.num_blocks
        replica.trace.extend_values(ends[:steps], [(num_blocks - free) / num_blocks for free in free_after])
        self.now_s = ends[steps - 1]
        self.num_steps += steps
        if replica.ends is not None:
            _note_end(replica.ends, scheduler.step_id, ends[steps - 1], scheduler.oldest_sample_step())
        return len(ends), steps, finished

    def _count_step_groups(self, idx: int, groups: Sequence[tuple[AnyKey, float, int]], steps: int,
                           num_decode: int, ends: Sequence[float]) -> None:
        """Count the first `steps` bulk steps priced one by one (`groups`: key, seconds and first
        step of each run of steps with one key; `ends`: every step's end) on the replica: breakdown
        counts (and each new key's first start when the pricer keeps them), inter-token latencies of
        the `num_decode` decodes, busy time, step log."""
        replica = self._replicas[idx]
        counts, first_s, itl, step_log = replica.pricer.counts, replica.pricer.first_s, self.itl, self.step_log
        busy_s = replica.busy_s
        for g, (key, step_s, first) in enumerate(groups):
            n = min(groups[g + 1][2] if g + 1 < len(groups) else steps, steps) - first
            if n <= 0:
                break
            start_s = ends[first - 1] if first else self.now_s
            count = counts.get(key)
            if count is None and first_s is not None:
                first_s[key] = start_s
            counts[key] = (count or 0) + n
            itl[step_s] = itl.get(step_s, 0) + num_decode * n
            for _ in range(n):
                busy_s += step_s  # the same running sum as step by step
            if step_log is not None:
                assert not isinstance(key, GroupKey), "groups run bulk steps only without a step log"
                step_log.add(replica=idx, start_s=start_s, step_s=step_s, num_steps=n, end_s=ends[first + n - 1],
                             key=key, num_preempted=0)
        replica.busy_s = busy_s

    def _account_run(self, idx: int, run: DecodeRun, steps: int, free_after: np.ndarray) -> None:
        """Count `steps` bulk steps of `run` just run on the replica: breakdown, busy time, KV
        usage, step log."""
        replica = self._replicas[idx]
        step_s = run.step_s[:steps]
        ends = run.ends[:steps]
        replica.pricer.count_run(run, steps)
        # The same running float sum as adding each step's seconds in turn.
        replica.busy_s = float(np.concatenate(((replica.busy_s,), step_s)).cumsum()[-1])
        scheduler = replica.scheduler
        num_blocks = scheduler.kv.num_blocks
        replica.trace.extend(ends, (num_blocks - free_after) / num_blocks)
        self.num_steps += steps
        if replica.ends is not None and steps:
            assert isinstance(scheduler, VllmV1Scheduler)
            _note_end(replica.ends, scheduler.step_id, float(ends[steps - 1]), scheduler.oldest_sample_step())
        if self.step_log is not None:
            b = run.bucket_idx[:steps]
            firsts = [0, *(np.flatnonzero(np.diff(b)) + 1).tolist(), steps]
            for first, nxt in itertools.pairwise(firsts):
                key = replica.pricer.run_key(run, first)
                self.step_log.add(replica=idx, start_s=float(ends[first - 1]) if first else self.now_s,
                                  step_s=float(step_s[first]), num_steps=nxt - first, end_s=float(ends[nxt - 1]),
                                  key=key, num_preempted=0)

    def _start_run(self, idx: int) -> bool:
        """Run-ahead: when the replica's next steps are decodes only, price them up to the first
        step in which a decode finishes (or blocks run out, or a limit) and queue the run's end as
        one event; False (nothing started) otherwise.

        Nothing but a request routed to this replica can change these steps: other replicas'
        events do not touch its scheduler or KV cache, and the round-robin or least-outstanding
        router reads only its request count, which no step of the run changes before the last. So
        the steps are the ones the step-by-step loop runs; the scheduler runs them when the run
        ends (`_finish_run`), or a request that arrives during the run cuts it after the step in
        flight (`_cut_run`).
        """
        replica = self._replicas[idx]
        scheduler = replica.scheduler
        assert isinstance(scheduler, VllmV1Scheduler)
        shape = scheduler.next_bulk_decode_steps()
        if shape is None:
            return False
        num_decode, context_tokens, until_finish = shape
        limits = self._limits
        # Other replicas' runs in flight have started their steps: they count towards the limit.
        max_steps = min(until_finish, limits.max_num_steps - 1 - self.num_steps - self._steps_ahead)
        if max_steps <= 0:
            return False
        max_steps = scheduler.bulk_decode_block_steps(max_steps)
        if max_steps <= 0:
            return False
        run = replica.pricer.decode_run(num_decode, context_tokens, self.now_s, max_steps, math.inf,
                                        limits.max_sim_time_s, price_ahead=False)
        if not run.num_steps:
            return False
        replica.busy, replica.plan, replica.run = True, None, run
        self._steps_ahead += run.num_steps
        self._push(float(run.ends[run.num_steps - 1]), idx)
        return True

    def _cut_run(self, idx: int) -> None:
        """A request reaches a replica in a run at `now_s`: the run ends with the step in flight
        (the first that ends after now; one that ends at now ended before this event, unless it
        is the run's last: another event at the same instant came first, and the run's end,
        already queued, follows it)."""
        replica = self._replicas[idx]
        run = replica.run
        assert run is not None
        k = int(run.ends[:run.num_steps].searchsorted(self.now_s, side="right")) + 1
        if k < run.num_steps:
            self._steps_ahead -= run.num_steps - k
            run.num_steps = k
            self._push(float(run.ends[k - 1]), idx)

    def _finish_run(self, idx: int) -> list[RequestState]:
        """The end of a run-ahead run: the scheduler runs its steps; the requests that finished."""
        replica = self._replicas[idx]
        run = replica.run
        assert run is not None
        replica.run = None
        self._steps_ahead -= run.num_steps
        scheduler = replica.scheduler
        assert isinstance(scheduler, VllmV1Scheduler)
        steps, finished, free_after = scheduler.run_bulk_decode_steps(run.num_steps)
        assert steps == run.num_steps, "a run's blocks were counted when it started"
        self._account_run(idx, run, steps, np.asarray(free_after))
        for req in finished:
            self._record(req)
        return finished

    def _finish_step(self, idx: int) -> list[RequestState]:
        replica = self._replicas[idx]
        plan = replica.plan
        assert plan is not None
        now = self.now_s
        step_s = replica.step_s
        itl = self.itl
        if plan.num_bulk_decodes:
            in_step = plan.num_bulk_decodes
            if plan.waited_bulk:
                ends = replica.ends
                assert ends is not None
                for step, count in plan.waited_bulk:
                    gap = now - ends[step]
                    itl[gap] = itl.get(gap, 0) + count
                    in_step -= count
            if in_step:
                itl[step_s] = itl.get(step_s, 0) + in_step
        previous = plan.step_id - 1
        for chunk in plan.chunks:
            if chunk.samples:
                req = chunk.request
                if req.first_token_s is None:
                    req.first_token_s = now
                else:
                    assert req.last_token_s is not None
                    gap = step_s if req.last_sample_step == previous else now - req.last_token_s
                    itl[gap] = itl.get(gap, 0) + 1
                req.last_token_s = now
        scheduler = replica.scheduler
        used_during = scheduler.kv_usage_frac() if replica.kv_during_step else -1.0
        finished = scheduler.finish_step(plan)
        for req in finished:
            self._record(req)
        replica.trace.add(now, scheduler.kv_usage_frac() if used_during < 0 else used_during)
        if replica.ends is not None:
            _note_end(replica.ends, plan.step_id, now, scheduler.oldest_sample_step())
        return finished

    def _record(self, req: RequestState) -> None:
        assert req.first_token_s is not None and req.first_scheduled_s is not None
        latency = self._client_latency_s
        self.records.append(new_request_record(
            req.request_id, req.replica, req.sent_s, req.first_scheduled_s, req.first_token_s + latency,
            self.now_s + latency, req.prompt_tokens, req.num_output, req.prefix_hit_tokens, req.num_preemptions,
            req.recomputed_tokens,
        ))
        if self._progress is not None:
            self._progress(len(self.records))

    def replica_kv_usage_frac(self, idx: int) -> float:
        """The replica's used KV fraction now, as the step-by-step loop has it: a run-ahead run's
        steps that started by now have taken their blocks (steps start at the previous one's end;
        a step ending now has not ended yet for this event, as an event queued before it)."""
        replica = self._replicas[idx]
        scheduler = replica.scheduler
        run = replica.run
        if run is None:
            return scheduler.kv_usage_frac()
        assert isinstance(scheduler, VllmV1Scheduler)
        started = 1 + int(run.ends[:run.num_steps].searchsorted(self.now_s, side="left"))
        return scheduler.kv_usage_frac_after_bulk_steps(min(started, run.num_steps))

    def replica_busy_s(self) -> list[float]:
        return [r.busy_s for r in self._replicas]

    def num_preemptions(self) -> int:
        return sum(r.scheduler.num_preemptions for r in self._replicas)
