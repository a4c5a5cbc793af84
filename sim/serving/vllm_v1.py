"""vLLM v1 continuous batching for one replica (vllm/v1/core/sched/scheduler.py semantics).

Per step: a token budget of `max_num_batched_tokens` and at most `max_num_seqs` running requests.
Running requests go first, in order (decodes and ongoing chunked prefills); when the KV cache
cannot grow a request, the last running request is preempted (recompute: its blocks are freed
and it returns to the front of the waiting queue) until the request fits or preempts itself.
Waiting requests are admitted FCFS only in steps without preemption, taking their prefix-cache
hit first. With chunked prefill a prompt is cut at the remaining budget (and at
`long_prefill_token_threshold` when set); without it a prompt that does not fit the remaining
budget waits, blocking the queue.

Departures from vLLM (and why): `max_num_partial_prefills` is accepted but not enforced (vLLM v1
does not enforce it either in its default scheduler); no priority scheduling; no speculative
decoding; no encoder budget; requests never exceed `max_model_len` because scenarios reject
workloads that would.

Engine-profile policies (`sim.perf.profile.SchedulingPolicy`, both off by default):
- `prefill_priority` (SGLang): when a prefill chunk can run (an ongoing chunked prefill or an
  admissible waiting request), the step holds prefill chunks only and running decodes wait;
  otherwise the step decodes every running request.
- `reserve_full_output` (TensorRT-LLM GUARANTEED_NO_EVICT): a waiting request is admitted only
  when the KV blocks for its prompt plus all its output tokens fit next to those reserved by the
  running requests, so the cache never runs out and nothing is preempted.
"""

from __future__ import annotations

from collections import deque

from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import ScheduledChunk, StepPlan


class VllmV1Scheduler:
    def __init__(self, *, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool, long_prefill_token_threshold: int,
                 prefill_priority: bool = False, reserve_full_output: bool = False) -> None:
        self._kv = kv
        self._prefill_priority = prefill_priority
        self._reserve_full_output = reserve_full_output
        self._reserved_blocks = 0
        self._max_num_seqs = max_num_seqs
        self._budget = max_num_batched_tokens
        self._chunked = enable_chunked_prefill
        self._threshold = long_prefill_token_threshold
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        self._step_id = 0
        self.num_preemptions = 0

    @property
    def kv(self) -> KVCacheManager:
        return self._kv

    def add(self, request: RequestState) -> None:
        self._waiting.append(request)

    def num_outstanding(self) -> int:
        return len(self._waiting) + len(self._running)

    def num_running(self) -> int:
        return len(self._running)

    def kv_usage_frac(self) -> float:
        return self._kv.usage_frac()

    def _preempt(self, victim: RequestState) -> None:
        self._kv.free(victim.request_id)
        victim.recomputed_tokens += victim.num_computed
        victim.num_computed = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self._waiting.appendleft(victim)

    def _cap(self, pending: int, budget: int) -> int:
        if self._threshold > 0:
            pending = min(pending, self._threshold)
        return min(pending, budget)

    def _full_blocks(self, req: RequestState) -> int:
        return -(-(req.prompt_tokens + req.output_tokens) // self._kv.block_size)

    def _no_room_reserved(self, req: RequestState) -> bool:
        """With `reserve_full_output`: the request's full-length blocks do not fit the reservations."""
        return self._reserve_full_output and self._reserved_blocks + self._full_blocks(req) > self._kv.num_blocks

    def _prefill_only_step(self) -> StepPlan | None:
        """`prefill_priority`: ongoing chunked prefills, then waiting requests FCFS; None if none can run."""
        budget = self._budget
        chunks: list[ScheduledChunk] = []
        for req in self._running:
            if budget <= 0:
                break
            if req.num_pending() <= 1 and req.num_computed >= req.prompt_tokens:
                continue  # a decode: it waits for a step without prefill work
            num_new = self._cap(req.num_pending(), budget)
            if not self._kv.allocate(req.request_id, num_tokens=req.num_computed + num_new,
                                     keys=req.keys, num_computed_tokens=req.num_computed):
                break
            chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                         req.num_computed + num_new == req.num_known()))
            budget -= num_new
        hits = 0
        while self._waiting and budget > 0 and len(self._running) < self._max_num_seqs:
            req = self._waiting[0]
            if self._no_room_reserved(req):
                break
            hit = self._kv.get_computed_tokens(req.keys, req.num_known()) if req.num_computed == 0 and req.keys else 0
            pending = req.num_known() - hit
            if not self._chunked and pending > budget:
                break
            num_new = self._cap(pending, budget)
            if not self._kv.allocate(req.request_id, num_tokens=hit + num_new, keys=req.keys,
                                     num_computed_tokens=hit):
                break
            self._waiting.popleft()
            self._admitted(req, hit)
            hits += hit
            self._running.append(req)
            chunks.append(ScheduledChunk(req, num_new, hit, hit + num_new == req.num_known()))
            budget -= num_new
        if not chunks:
            return None
        self._step_id += 1
        return StepPlan(self._step_id, tuple(chunks), hits, ())

    def _admitted(self, req: RequestState, hit: int) -> None:
        if self._reserve_full_output:
            self._reserved_blocks += self._full_blocks(req)
        if req.num_preemptions == 0 and req.first_scheduled_s is None:
            self._kv.record_prefix_query(req.prompt_tokens, hit)
            req.prefix_hit_tokens = hit
        req.num_computed = hit

    def schedule(self) -> StepPlan | None:
        if self._prefill_priority:
            plan = self._prefill_only_step()
            if plan is not None:
                return plan
        budget = self._budget
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestState] = []
        i = 0
        while i < len(self._running) and budget > 0:
            req = self._running[i]
            num_new = self._cap(req.num_pending(), budget)
            fits = True
            while not self._kv.allocate(req.request_id, num_tokens=req.num_computed + num_new,
                                        keys=req.keys, num_computed_tokens=req.num_computed):
                # Requests before index i are already scheduled; the victim is the last one.
                victim = self._running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                         req.num_computed + num_new == req.num_known()))
            budget -= num_new
            i += 1
        hits = 0
        if not preempted:
            while self._waiting and budget > 0 and len(self._running) < self._max_num_seqs:
                req = self._waiting[0]
                if self._no_room_reserved(req):
                    break
                hit = 0
                if req.num_computed == 0 and req.keys:
                    hit = self._kv.get_computed_tokens(req.keys, req.num_known())
                pending = req.num_known() - hit
                if not self._chunked and pending > budget:
                    break
                num_new = self._cap(pending, budget)
                if not self._kv.allocate(req.request_id, num_tokens=hit + num_new, keys=req.keys,
                                         num_computed_tokens=hit):
                    break
                self._waiting.popleft()
                if self._reserve_full_output:
                    self._reserved_blocks += self._full_blocks(req)
                if req.num_preemptions == 0 and req.first_scheduled_s is None:
                    self._kv.record_prefix_query(req.prompt_tokens, hit)
                    req.prefix_hit_tokens = hit
                hits += hit
                req.num_computed = hit
                self._running.append(req)
                chunks.append(ScheduledChunk(req, num_new, hit, hit + num_new == req.num_known()))
                budget -= num_new
        if not chunks:
            return None
        self._step_id += 1
        return StepPlan(self._step_id, tuple(chunks), hits, tuple(preempted))

    def finish_step(self, plan: StepPlan) -> list[RequestState]:
        finished: list[RequestState] = []
        for chunk in plan.chunks:
            req = chunk.request
            req.num_computed += chunk.num_new_tokens
            if req.num_computed <= req.prompt_tokens + 1:
                self._kv.commit(req.request_id, req.num_computed, req.keys)
            if chunk.samples:
                req.num_output += 1
                if req.is_finished():
                    finished.append(req)
        if finished:
            done = {r.request_id for r in finished}
            self._running = [r for r in self._running if r.request_id not in done]
            for r in finished:
                self._kv.free(r.request_id)
                if self._reserve_full_output:
                    self._reserved_blocks -= self._full_blocks(r)
        return finished
