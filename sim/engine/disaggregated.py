"""Disaggregated prefill/decode serving: a prefill pool, a KV transfer, a decode pool.

The loop is `Simulation`'s (one clock, one heap, the same replica machinery and bulk decode
stepping) with three differences:

- Requests are sent to a prefill rank (the pool's router over all its workers' attention-DP
  ranks, as replicas are routed). A prefill rank runs the prompt with one output token, as
  vLLM's disaggregated proxy sends it with `max_tokens=1`; that token is not delivered.
- When the prefill step that samples it ends, the prompt's KV moves to the decode pool: a
  transfer event `TransferPath.exposed_s` later (`sim.serving.kv_transfer`). The prefill rank
  frees its blocks when the prefill ends (departure: NIXL keeps them until the decode side has
  read them).
- At the transfer's end the request is routed to a decode rank and queued there
  (`VllmV1Scheduler.add_transferred`); it is admitted when its KV blocks are free and budget and
  `max_num_seqs` allow, like any waiting request. vLLM's decode worker (NIXL) computes the last
  prompt token in its first step and samples the first output token there, which is the first
  token the client receives (vLLM's proxy streams the decode instance's output; Dynamo's frontend
  does the same): TTFT = prefill queueing + prefill + transfer + decode queueing + the first decode
  step. SGLang's and TensorRT-LLM's decode workers take the token the prefill server sampled
  (`PrefillToken`) and run one step fewer. SGLang's waiting queue builds a `PrebuiltExtendBatch` that
  skips the forward and streams the token when the request is admitted: TTFT = prefill queueing +
  prefill + transfer + decode queueing. TensorRT-LLM's generation server adds it to the request when
  the transfer completes (`_prepare_disagg_gen_transmission_complete`: `add_new_token(first_gen_tokens)`)
  and its first response, after its first generation step, carries it with the second token; the
  disaggregated server streams only the generation server's responses: TTFT = prefill queueing +
  prefill + transfer + decode queueing + the first decode step, with two tokens in the first chunk.
  (A one-token request, with nothing left to decode, takes vLLM's path.)

Replicas: 0 .. P-1 are the prefill pool's, P .. P+D-1 the decode pool's; heap indices >= P+D are
transfers in flight. A replica is one scheduler per rank, or, for an MoE model with attention DP
(`data_parallel_size` > 1), one `DataParallelGroup` per worker: the worker's DP ranks step in
lockstep as in an aggregated engine (`sim.serving.dp_group`), and a request routed to the worker
goes to the rank vLLM's DP load balancer picks. A request's record joins both phases: arrival and
first scheduled from the prefill, tokens and `replica` (the decode replica's index) from the
decode, preemptions and recomputed tokens of both.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Final, Literal

from sim.engine.pricer import StepPricer
from sim.engine.simulation import Scheduler, SimLimits, Simulation, check_router
from sim.engine.step_log import StepLog
from sim.metrics.kv_usage import KvUsageTrace
from sim.serving.dp_group import DataParallelGroup
from sim.serving.kv_transfer import TransferPath
from sim.serving.request import RequestState
from sim.specs.engine import BackendName, RouterName

PrefillToken = Literal["resampled", "at_admission", "with_first_step"]
"""What a decode worker does with the token the prefill sampled: samples the first token again
from the last prompt token (`resampled`: vLLM), streams it when it admits the request
(`at_admission`: SGLang), or streams it with the token its first step samples (`with_first_step`:
TensorRT-LLM)."""

PREFILL_TOKEN: Final[dict[BackendName, PrefillToken]] = {"vllm": "resampled", "sglang": "at_admission",
                                                 "trtllm": "with_first_step"}
"""Each backend's `PrefillToken`."""


class DisaggregatedSimulation(Simulation):
    RUN_AHEAD = False
    """KV transfers route requests to decode ranks outside `_send`: runs are not cut for them."""

    def __init__(self, *, prefill: Sequence[Scheduler], decode: Sequence[Scheduler],
                 prefill_pricer: StepPricer, decode_pricer: StepPricer, prefill_router: RouterName,
                 decode_router: RouterName, path: TransferPath, decode_states: Sequence[RequestState],
                 max_concurrency: int | None, limits: SimLimits,
                 progress: Callable[[int], None] | None = None, step_log: StepLog | None = None,
                 client_latency_s: float = 0.0, prefill_token: PrefillToken = "resampled") -> None:
        check_router(decode_router, "decode_router")  # `Simulation` checks the prefill pool's
        super().__init__(replicas=[*prefill, *decode], pricer=prefill_pricer, router=prefill_router,
                         max_concurrency=max_concurrency, limits=limits, progress=progress, step_log=step_log,
                         pricers=[prefill_pricer] * len(prefill) + [decode_pricer] * len(decode),
                         client_latency_s=client_latency_s)
        self._num_prefill = len(prefill)
        self._num_ranks = len(prefill) + len(decode)
        for replica in self._replicas[:self._num_prefill]:
            replica.bulk = replica.group_bulk = False  # one output token: prefill ranks never decode
        self._decode_router = decode_router
        self._prefill_token = prefill_token
        self.stream_known_token_at_admission = prefill_token == "at_admission"
        self._path = path
        self._decode_states = {s.request_id: s for s in decode_states}
        """Each request's decode-phase state (its full output length), by request id."""
        self._transfers: dict[int, RequestState] = {}
        self._next_transfer = self._num_ranks
        self._prefilled: dict[int, RequestState] = {}
        """Prefill-phase states of requests past their prefill, by request id."""
        self._ready_s: dict[int, float] = {}
        self.transfer_s = array("d")
        """Per request: prefill end to KV complete on the decode worker (the exposed transfer)."""
        self.transfer_bytes = array("d")
        self.prefill_queue_s = array("d")
        """Per request: send to first scheduled on a prefill rank."""
        self.decode_queue_s = array("d")
        """Per request: transfer end to admission on a decode rank."""
        self.prefill_kv_trace = KvUsageTrace()
        """After each prefill step: its end and the KV fraction its rank held during it (the
        finished prompts' blocks included; `kv_trace` holds the decode ranks' after each step)."""
        for replica in self._replicas[:self._num_prefill]:
            replica.trace = self.prefill_kv_trace
            replica.kv_during_step = True  # its prompts' blocks are freed as their prefill ends

    def _route(self, req: RequestState) -> int:
        return self._route_in(req, range(self._num_prefill), self._router, 0)

    def _on_step_done(self, idx: int) -> None:
        if idx >= self._num_ranks:
            self._on_transfer_done(idx)
        elif idx < self._num_prefill:
            self._finish_step(idx)  # finished prefills start their transfers (`_record`)
            end_s = self._start_step(idx)
            if end_s is not None:
                self._push(end_s, idx)
        else:
            super()._on_step_done(idx)

    def _record(self, req: RequestState) -> None:
        if req.request_id in self._decode_states:  # its decode phase has not started: a prefill ended
            self._start_transfer(req)
            return
        rid = req.request_id
        first = self._prefilled.pop(rid)
        assert req.first_scheduled_s is not None
        self.decode_queue_s.append(req.first_scheduled_s - self._ready_s.pop(rid))
        req.first_scheduled_s = first.first_scheduled_s
        req.num_preemptions += first.num_preemptions
        req.recomputed_tokens += first.recomputed_tokens
        req.prefix_hit_tokens = first.prefix_hit_tokens
        super()._record(req)

    def _start_transfer(self, req: RequestState) -> None:
        assert req.first_scheduled_s is not None
        now = self.now_s
        rid = req.request_id
        self._prefilled[rid] = req
        self.prefill_queue_s.append(req.first_scheduled_s - req.sent_s)
        exposed_s = self._path.exposed_s(req.prompt_tokens, now - req.first_scheduled_s)
        self.transfer_s.append(exposed_s)
        self.transfer_bytes.append(req.prompt_tokens * self._path.bytes_per_token)
        state = self._decode_states.pop(rid)
        state.sent_s = req.sent_s
        idx = self._next_transfer
        self._next_transfer += 1
        self._transfers[idx] = state
        self._push(now + exposed_s, idx)

    def _on_transfer_done(self, idx: int) -> None:
        state = self._transfers.pop(idx)
        self._ready_s[state.request_id] = self.now_s
        if self._prefill_token != "resampled" and state.output_tokens > 1:
            # Known from the prefill: streamed at admission or with the first step's token
            # (`Simulation._start_step`, `_finish_step`).
            state.num_output = 1
        j = self._route_in(state, range(self._num_prefill, self._num_ranks), self._decode_router, 1)
        self._replicas[j].scheduler.add_transferred(state)
        state.replica = j  # the decode replica (a group sets its rank)
        self._wake(j)

    def pool_busy_s(self) -> tuple[list[float], list[float]]:
        """Busy step seconds per rank of each pool: a lockstep group's step occupies all its ranks
        (an idle rank runs a dummy batch), so it counts once per rank."""
        busy = [r.busy_s * (len(r.scheduler.ranks) if isinstance(r.scheduler, DataParallelGroup) else 1)
                for r in self._replicas]
        return busy[:self._num_prefill], busy[self._num_prefill:]

    def replica_pools(self) -> list[str]:
        """The pool of each replica index (`prefill` or `decode`)."""
        return ["prefill"] * self._num_prefill + ["decode"] * (self._num_ranks - self._num_prefill)

    def pool_preemptions(self) -> tuple[int, int]:
        counts = [r.scheduler.num_preemptions for r in self._replicas]
        return sum(counts[:self._num_prefill]), sum(counts[self._num_prefill:])
