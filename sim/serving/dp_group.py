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
count in between; the simulation uses the exact counts at the moment of the send.

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
    def __init__(self, ranks: Sequence[VllmV1Scheduler], balance: AdpBalance | None = None) -> None:
        assert ranks, "a data-parallel group has at least one rank"
        self.ranks = list(ranks)
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
        """The rank vLLM's DP load balancer picks: least `4 x waiting + running`, lowest index first."""
        best, best_score = 0, -1
        for i, rank in enumerate(self.ranks):
            running = rank.num_running()
            score = WAITING_WEIGHT * (rank.num_outstanding() - running) + running
            if best_score < 0 or score < best_score:
                best, best_score = i, score
        return best

    def add(self, request: RequestState) -> None:
        i = self.rank_for(request)
        request.replica = i
        self.ranks[i].add(request)

    def add_transferred(self, request: RequestState) -> None:
        """A request whose prompt KV arrived from a prefill worker (disaggregated decode pool): it
        goes to the rank the load balancer picks, as a new request would."""
        i = self.rank_for(request)
        request.replica = i
        self.ranks[i].add_transferred(request)

    def num_outstanding(self) -> int:
        return sum(r.num_outstanding() for r in self.ranks)

    def kv_usage_frac(self) -> float:
        """Used fraction of the group's KV blocks (all ranks together)."""
        used = total = 0
        for rank in self.ranks:
            n = rank.kv.num_blocks
            used += n - rank.kv.num_free_blocks()
            total += n
        return used / total if total else 0.0

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
            chunks += plan.chunks
            preempted += plan.preempted
            resynced += plan.resynced
            waited += plan.waited_bulk
            hits += plan.num_prefix_hit_tokens
            num_bulk += plan.num_bulk_decodes
            bulk_context += plan.bulk_decode_context_tokens
        return StepPlan(step + 1, tuple(chunks), hits, tuple(preempted), num_bulk, bulk_context,
                        tuple(resynced), tuple(waited), tuple(plans))

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
