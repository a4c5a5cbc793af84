"""TensorRT-LLM's attention-DP balance (`attention_dp_config.enable_balance`): when context requests run.

With attention data parallelism every DP rank has its own scheduler, and all ranks meet at the MoE
layers every iteration. A context (prefill) step on one rank stalls the decodes of all the others,
so TensorRT-LLM can hold new context requests until every rank has one and run them together
(`PyExecutor._balance_adp_requests`, tensorrt_llm/_torch/pyexecutor/py_executor.py; the scheduler's
`balance_adp_requests` in later releases, logic unchanged; NVIDIA's "ADP Balance Strategy" tech
blog). Every iteration, after each rank's scheduler has picked its context and generation requests,
the ranks all-gather (context requests, generation requests) and each decides alike:

- every rank has a free batch slot (generation requests < `max_batch_size`) and a context request:
  the waiting counter resets; if every rank also has a generation request, the contexts are held
  `batching_wait_iters` more iterations (the batching counter) so more of them batch up, then run;
  without one they run at once;
- otherwise the waiting counter counts the iteration and the contexts are held, unless the counter
  reached `timeout_iters` or some rank has no generation request (its GPU would idle): then the
  counter resets and the contexts run.

The counters tick on every iteration, with or without context requests, so while every rank is
decoding a lone new request waits for the next release, at most `timeout_iters` iterations. A rank
with no request at all runs a dummy generation request (`_pad_attention_dp_dummy_request`): it
counts as having a generation request and no context request.

`AdpBalance` is that decision, given each rank's counts; `sim.serving.dp_group.DataParallelGroup`
asks it once per group step and holds or releases admission on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLoad:
    """What one attention-DP rank's scheduler would run this iteration."""

    num_context: int
    """Context requests it would schedule (new prompts it has room for, ongoing prefills)."""
    num_generation: int
    """Generation requests (decodes), counting TensorRT-LLM's dummy on a rank with no request."""
    max_batch: int
    """The rank's batch ceiling (TensorRT-LLM `max_batch_size`; the simulator's `max_num_seqs`)."""


class AdpBalance:
    """TensorRT-LLM's per-iteration attention-DP balance decision, with its two counters."""

    def __init__(self, *, timeout_iters: int, batching_wait_iters: int) -> None:
        assert timeout_iters >= 0 and batching_wait_iters >= 0
        self.timeout_iters = timeout_iters
        self.batching_wait_iters = batching_wait_iters
        self.waiting_iters = 0
        """TRT-LLM `adp_ctx_waiting_iters_count`."""
        self.batching_iters = 0
        """TRT-LLM `adp_ctx_batching_wait_iters_count`."""

    def release(self, loads: Sequence[RankLoad]) -> bool:
        """One iteration: True if the ranks run their context requests, False if they are held."""
        all_free = all(r.num_generation < r.max_batch for r in loads)
        all_context = all(r.num_context > 0 for r in loads)
        all_generation = all(r.num_generation > 0 for r in loads)
        if all_free and all_context:
            self.waiting_iters = 0
            if all_generation:
                if self.batching_iters < self.batching_wait_iters:
                    self.batching_iters += 1
                    return False
                self.batching_iters = 0
            return True
        self.waiting_iters += 1
        if self.waiting_iters >= self.timeout_iters or not all_generation:
            self.waiting_iters = 0
            return True
        return False


class _Rank(Protocol):
    hold_new: bool

    def adp_load(self) -> RankLoad: ...

    def num_outstanding(self) -> int: ...


def apply_adp_balance(balance: AdpBalance, ranks: Sequence[_Rank]) -> None:
    """Decide the group's next iteration and hold (or let in) new context requests on every rank.

    Only iterations that run count (TensorRT-LLM's executor does not iterate without requests), so
    a group with no outstanding request leaves the counters alone. Holding never stalls the group:
    it needs every rank to have a generation request, so some rank has real decodes to step (a rank
    without requests counts its dummy, and a group of dummies has no context request to hold).
    """
    if not any(r.num_outstanding() for r in ranks):
        return
    hold = not balance.release([r.adp_load() for r in ranks])
    for r in ranks:
        r.hold_new = hold
