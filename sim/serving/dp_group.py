"""Attention-data-parallel ranks of one MoE engine, stepping in lockstep (vLLM's DP for MoE models).

vLLM runs `data_parallel_size` engine cores for an MoE model; each DP rank has its own scheduler,
KV cache and batch, and all ranks meet at every MoE layer (the expert all-to-all, or the naive
all-gather without expert parallelism). A rank with nothing to run executes a dummy batch while
any other rank is busy, so the collectives line up: the ranks' steps start and end together, and
a group step lasts as long as its slowest rank (`sim.engine.pricer.StepPricer` prices it).

`DataParallelGroup` presents the one-replica scheduler interface to the simulation: `schedule()`
asks every rank for its plan and returns them merged (`StepPlan.ranks` keeps each rank's own plan
for the pricer), `finish_step()` finishes every rank's plan. Every rank numbers its steps with the
group's step counter (a rank that ran a dummy batch skips the numbers), so "sampled in the previous
step" means the previous group step for the engine's inter-token latencies.

Requests go to ranks as vLLM's DP load balancer sends them (`DPLBAsyncMPClient`): the rank with the
lowest `4 x waiting + running`, ties to the lowest rank index. vLLM reads these counts from the DP
coordinator's statistics, published every 100 ms, and adds its own assignments to the waiting
count in between; the simulation uses the exact counts at the moment of the send. SGLang's
`DataParallelController` sends them round robin instead (`--load-balance-method auto`: round robin
without disaggregation and in a decode pool; `round_robin=True`).

Dense models keep `data_parallel_size` independent replicas behind the router: vLLM runs dense DP
ranks as independent engines with no collective between them.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.serving.adp_balance import AdpBalance, apply_adp_balance
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import ScheduledChunk, StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler

WAITING_WEIGHT = 4
"""vLLM's DP load-balancing score: `waiting * 4 + running` (vllm/v1/engine/core_client.py)."""


class DataParallelGroup:
    def __init__(self, ranks: Sequence[VllmV1Scheduler], balance: AdpBalance | None = None, *,
                 round_robin: bool = False) -> None:
        assert ranks, "a data-parallel group has at least one rank"
        self.ranks = list(ranks)
        self._round_robin = round_robin
        """Requests go to the ranks in turn (SGLang's `round_robin_scheduler`), not by load."""
        self._next_rank = 0
        self._num_kv_blocks = sum(rank.kv.num_blocks for rank in self.ranks)
        self._step_id = 0
        self._balance = balance
        """TensorRT-LLM's attention-DP balance (`sim.serving.adp_balance`); None = off."""

    @property
    def kv(self) -> KVCacheManager:
        """Rank 0's KV cache (every rank's has the same geometry)."""
        return self.ranks[0].kv

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.ranks)

    def rank_for(self, request: RequestState) -> int:
        """The rank vLLM's DP load balancer picks: least `4 x waiting + running`, lowest index first;
        with `round_robin`, the next rank in turn (the turn advances when a request is added)."""
        if self._round_robin:
            return self._next_rank
        best, best_score = 0, -1
        for i, rank in enumerate(self.ranks):
            running = rank.num_running()
            score = WAITING_WEIGHT * (rank.num_outstanding() - running) + running
            if best_score < 0 or score < best_score:
                best, best_score = i, score
        return best

    def prefix_hit(self, keys: tuple[int, ...], prompt_tokens: int) -> tuple[int, int]:
        """(cached prompt tokens, rank) of the rank that holds the longest cached prefix of a
        prompt (ties: the fewest outstanding requests, then the lowest rank, as the router breaks
        them between replicas); (0, -1) when no rank holds any of it."""
        best, best_rank, best_load = 0, -1, 0
        for i, rank in enumerate(self.ranks):
            hit = rank.kv.get_computed_tokens(keys, prompt_tokens)
            if hit and (hit > best or (hit == best and rank.num_outstanding() < best_load)):
                best, best_rank, best_load = hit, i, rank.num_outstanding()
        return best, best_rank

    def add(self, request: RequestState, rank: int | None = None) -> None:
        """Queue a request on `rank`, or on the rank the load balancer picks (`rank_for`)."""
        i = self._pick(request) if rank is None else rank
        request.replica = i
        self.ranks[i].add(request)

    def add_transferred(self, request: RequestState) -> None:
        """A request whose prompt KV arrived from a prefill worker (disaggregated decode pool): it
        goes to the rank the load balancer picks, as a new request would."""
        i = self._pick(request)
        request.replica = i
        self.ranks[i].add_transferred(request)

    def _pick(self, request: RequestState) -> int:
        """`rank_for`, advancing the round-robin turn."""
        i = self.rank_for(request)
        if self._round_robin:
            self._next_rank = (i + 1) % len(self.ranks)
        return i

    def num_outstanding(self) -> int:
        return sum(r.num_outstanding() for r in self.ranks)

    def kv_usage_frac(self) -> float:
        """Used fraction of the group's KV blocks (all ranks together)."""
        total = self.num_kv_blocks
        return (total - sum(rank.kv.num_free_blocks() for rank in self.ranks)) / total

    def schedule(self) -> StepPlan | None:
        """Every rank's plan for the next group step, merged; None when no rank has work."""
        step = self._step_id
        if self._balance is not None:
            apply_adp_balance(self._balance, self.ranks)
        plans: list[StepPlan | None] = []
        busy = False
        for rank in self.ranks:
            rank.skip_to_step(step)
            plan = rank.schedule()
            plans.append(plan)
            busy = busy or plan is not None
        if not busy:
            return None
        self._step_id = step + 1
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestState] = []
        resynced: list[RequestState] = []
        waited: list[tuple[int, int]] = []
        hits = num_bulk = bulk_context = 0
        for plan in plans:
            if plan is None:
                continue
            if plan.chunks:
                chunks += plan.chunks
            if plan.preempted:
                preempted += plan.preempted
            if plan.resynced:
                resynced += plan.resynced
            if plan.waited_bulk:
                waited += plan.waited_bulk
            hits += plan.num_prefix_hit_tokens
            num_bulk += plan.num_bulk_decodes
            bulk_context += plan.bulk_decode_context_tokens
        return StepPlan(step + 1, tuple(chunks), hits, tuple(preempted), num_bulk, bulk_context,
                        tuple(resynced), tuple(waited), tuple(plans))

    # -- bulk group steps (the engine's fast path; same results as schedule() + finish_step()) --
    def next_bulk_group_steps(self) -> list[tuple[int, int, int] | None] | None:
        """Per rank, `VllmV1Scheduler.next_bulk_decode_steps` (None for a rank with no request, which
        runs a dummy batch), when the next group step is bulk decodes only on every rank that has
        requests; None otherwise (plan it with `schedule()`). Not with bulk decodes that may sit out
        steps (`bulk_may_wait`)."""
        shapes: list[tuple[int, int, int] | None] = []
        busy = False
        for rank in self.ranks:
            if not rank.num_outstanding():
                shapes.append(None)
                continue
            if rank.bulk_may_wait:
                return None
            shape = rank.next_bulk_decode_steps()
            if shape is None:
                return None
            shapes.append(shape)
            busy = True
        return shapes if busy else None

    def bulk_group_block_steps(self, num_steps: int) -> int:
        """How many of the next `num_steps` bulk group steps find their KV blocks free on every
        rank (each rank's `bulk_decode_block_steps`)."""
        for rank in self.ranks:
            if rank.num_outstanding() and num_steps > 0:
                num_steps = rank.bulk_decode_block_steps(num_steps)
        return num_steps

    def run_bulk_group_steps(self, num_steps: int) -> tuple[list[RequestState], list[int]]:
        """Run `num_steps` group steps of bulk decodes (`next_bulk_group_steps` described them;
        at most the ranks' steps until a decode finishes and `bulk_group_block_steps`). They are
        not `BulkDecodeScheduler` methods: the engine runs a group's bulk steps on their own path, each the
        same as `schedule()` and `finish_step()` of its plan. Returns the requests that finished in
        the last step (rank by rank, as `finish_step` lists them) and the group's used KV blocks
        after each step (`kv_usage_frac`'s numerator)."""
        if self._balance is not None:
            # Every step's iteration sees the same counts: nothing is admitted or finishes before the last.
            loads = [r.adp_load() for r in self.ranks]
            release = True
            for _ in range(num_steps):
                release = self._balance.release(loads)
            for r in self.ranks:
                r.hold_new = not release
        used = [0] * num_steps
        finished: list[RequestState] = []
        for rank in self.ranks:
            n = rank.kv.num_blocks
            if not rank.num_outstanding():
                idle = n - rank.kv.num_free_blocks()
                used = [u + idle for u in used]
                continue
            steps, done, free_after = rank.run_bulk_decode_steps(num_steps)
            assert steps == num_steps, "a group's bulk steps fit every rank's blocks and finishes"
            finished += done
            used = [u + n - int(f) for u, f in zip(used, free_after, strict=True)]
        self._step_id += num_steps
        return finished, used

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks of all ranks together (`kv_usage_frac`'s denominator)."""
        return self._num_kv_blocks

    def oldest_sample_step(self) -> int | None:
        """The earliest step in which a bulk decode of any rank last sampled, when some may sit
        out steps (`VllmV1Scheduler.oldest_sample_step`); else None."""
        steps = [s for s in (r.oldest_sample_step() for r in self.ranks) if s is not None]
        return min(steps) if steps else None

    def finish_step(self, plan: StepPlan) -> list[RequestState]:
        finished: list[RequestState] = []
        for rank, rank_plan in zip(self.ranks, plan.ranks, strict=True):
            if rank_plan is not None:
                finished += rank.finish_step(rank_plan)
        return finished
