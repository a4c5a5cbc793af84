"""vLLM v1 continuous batching for one replica (vllm/v1/core/sched/scheduler.py semantics).

Per step: a token budget of `max_num_batched_tokens` and at most `max_num_seqs` running requests.
Running requests go first, in order (decodes and ongoing chunked prefills); when the KV cache
cannot grow a request, the last running request is preempted (recompute: its blocks are freed
and it returns to the front of the waiting queue) until the request fits or preempts itself.
Waiting requests are admitted FCFS only in steps without preemption, taking their prefix-cache
hit first. With chunked prefill a prompt is cut at the remaining budget (and at
`long_prefill_token_threshold` when set); without it a prompt that does not fit the remaining
budget waits, blocking the queue.

Bulk decodes. A request that sampled a token and is not finished decodes in every following step
until something changes the batch: each such step computes one token for it and samples one. With
`bulk_decodes` on, these requests are not visited step by step. Their counters are kept as of the
step they joined (`RequestState.lazy_step`, counted in the bulk clock: see `prefill_priority`)
and the scheduler tracks them in aggregate: their count, their total context, the step each one
finishes, and, per `step mod block_size`, the ones
whose context crosses into a new KV block (those take one block each, in running order). A step
is planned in bulk when the result is provably the same as the request-by-request plan: no
preemption is needed (the blocks all requests need fit in the free queue) and no bulk decode is
left without budget behind a cut prefill chunk. The second never happens with this order (a
request that got its tokens in a step keeps getting them, since the requests before it ask for
no more and none is inserted before it), so it is only checked where a chunk is cut. Otherwise
the scheduler brings every bulk decode up to date and plans the step request by request. Both
ways give the same plans, block tables and finish steps; `bulk_decodes=False` is the reference
path that tests compare against.

Speculative decoding (`speculation`, an `AcceptanceSampler`, with k drafts per request): as vLLM's
scheduler, a decode schedules 1 + k tokens (its last sampled token and k drafts, cut to the token
budget left), allocates KV slots for all of them (vLLM's lookahead slots), and at the step's end
keeps the accepted drafts' KV and samples 1 + accepted tokens; the rejected drafts' slots stay
allocated to the request and are overwritten by the next step, as in vLLM. Bulk decodes are off
(they assume one token per step): every step is planned request by request.

Departures from vLLM (and why): no priority scheduling; no encoder budget;
requests never exceed `max_model_len` because scenarios reject workloads that would (lookahead
slots of speculative decoding may go up to k past it: vLLM caps the drafts there).
Prefix-cache keys of tokens that only one request has are derived when it
is preempted (see `RequestState.keys`): before that no lookup can hit them, so only the
shared prefix is indexed, which changes nothing but the eviction counter. A preempted request's
computed blocks, generated tokens included, are indexed as it is preempted and hit when it
resumes, as in vLLM; `recomputed_tokens` counts only what is computed again.

Engine-profile policies (`sim.perf.profile.SchedulingPolicy`, both off by default):
- `prefill_priority` (SGLang): when a prefill chunk can run (an ongoing chunked prefill or an
  admissible waiting request), the step holds prefill chunks only and running decodes wait;
  otherwise the step decodes every running request. Bulk decodes sit the prefill-only steps out:
  their counters, finish steps and KV-block buckets count in the bulk clock (`_clock`), which
  ticks in every step but those, so they stay exact. Their inter-token gap is then not one step:
  the next decode step's plan lists them by the step of their last sample (`waited_bulk`), and
  a run of bulk steps starts only once all of them sampled in the previous step.
- `reserve_full_output` (TensorRT-LLM GUARANTEED_NO_EVICT): a waiting request is admitted only
  when the KV blocks for its prompt plus all its output tokens fit next to those the running
  requests still need to finish (blocks they share, a common prefix, counted once: `_no_room_reserved`),
  so the cache never runs out and nothing is preempted. It only changes
  admission, so bulk decodes stay exact.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from heapq import heapify, heappop, heappush
from itertools import accumulate
from typing import TypeVar, cast

import numpy as np

from sim.serving.adp_balance import RankLoad
from sim.serving.kv_cache import KVCacheManager, SegmentLike
from sim.serving.request import RequestState
from sim.serving.scheduler import ScheduledChunk, StepPlan
from sim.serving.speculative import AcceptanceSampler


def _run_seq(request: RequestState) -> int:
    return request.run_seq


_FreeAfter = TypeVar("_FreeAfter", np.ndarray, list[int])
"""Free blocks after each bulk step: an array (long runs) or a list (one by one)."""


_DUE_COUNTS: dict[tuple[int, ...], np.ndarray] = {}
"""Cumulated blocks taken per bulk step by block-crossing pattern (`_due_prefix`), shared by every
scheduler of the process: a pure function of the pattern, kept for the runs' lengths."""
_DUE_COUNTS_MAX_STEPS = 1 << 21
"""Steps `_DUE_COUNTS` holds in all before it is cleared (16 MiB)."""
_due_counts_steps = [0]
"""Steps `_DUE_COUNTS` holds now."""


def due_block_counts(num_steps: int, prefix: list[int]) -> np.ndarray:
    """Blocks taken by the next `num_steps` bulk steps whose block-crossing pattern is `prefix`
    (`VllmV1Scheduler._due_prefix`: blocks taken by the first 1, 2, ..., block_size of them),
    cumulated: int64, one per step, a read-only view of `_DUE_COUNTS`' array for the pattern."""
    key = tuple(prefix)
    cached = _DUE_COUNTS.get(key)
    if cached is None or len(cached) < num_steps:
        size = max(num_steps, 2 * len(cached) if cached is not None else 0, 4 * len(prefix))
        held = _due_counts_steps[0] - (len(cached) if cached is not None else 0)
        if held + size > _DUE_COUNTS_MAX_STEPS:
            _DUE_COUNTS.clear()
            held = 0
        _due_counts_steps[0] = held + size
        per_step = np.zeros(size, dtype=np.int64)
        previous = 0
        for r, total in enumerate(prefix):
            if total != previous:
                per_step[r::len(prefix)] = total - previous
                previous = total
        cached = _DUE_COUNTS[key] = per_step.cumsum()
        cached.flags.writeable = False
    return cached[:num_steps]

SGLANG_INIT_NEW_TOKEN_RATIO = 0.7
"""SGLang's `SGLANG_INIT_NEW_TOKEN_RATIO`: the share of a running request's remaining output its
admission reserves at first (times `--schedule-conservativeness`, 1.0 by default)."""
SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
"""The ratio's floor, as a fraction of its initial value (`SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`)."""
SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS = 600
"""Decode steps over which the ratio falls from its initial value to its floor."""
SGLANG_CLIP_MAX_NEW_TOKENS = 4096
"""`CLIP_MAX_NEW_TOKENS`: a request's remaining output counts at most this many tokens."""
SGLANG_RETRACT_DECODE_STEPS = 20
"""`RETRACT_DECODE_STEPS`: after a retraction the ratio is (decoded + this x requests) / their outputs."""
SGLANG_DP_ATTENTION_CONSERVATIVENESS = 0.3
"""`--schedule-conservativeness` under attention DP: `ServerArgs._handle_data_parallelism` multiplies
it (1.0 by default) by 0.3, so each DP rank's ratio starts at 0.21 and decays to 0.0294."""


class VllmV1Scheduler:
    def __init__(self, *, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 enable_chunked_prefill: bool, long_prefill_token_threshold: int,
                 bulk_decodes: bool = True, prefill_priority: bool = False,
                 reserve_new_token_ratio: bool = False,
                 reserve_full_output: bool = False, batch_wait_timeout_iters: int = 0,
                 batch_wait_max_tokens_ratio: float = 0.0, num_speculative_tokens: int = 0,
                 speculation: AcceptanceSampler | None = None, context_chunk_unit: int = 1,
                 micro_batches: int = 1, num_lookahead_tokens: int = 0, max_model_len: int | None = None,
                 drop_last_hit_block: bool = False, schedule_conservativeness: float = 1.0) -> None:
        """`context_chunk_unit` > 1: a prompt chunk that the token budget cuts short is cut down to a
        multiple of it, and one cut to nothing waits for the next step (TensorRT-LLM's chunk unit,
        `SchedulingPolicy.context_chunks_in_blocks`). `micro_batches` > 1: a step plans that many
        pipeline micro-batches (`sim.engine.micro_batches`); `max_num_batched_tokens` is all of
        theirs, and a prompt chunk gets at most what one micro-batch's share of the budget leaves
        beside its share of the running requests (`_set_micro_batch_room`). `num_lookahead_tokens`:
        KV slots a running request's step allocates past the tokens it schedules (vLLM v1 sets them
        to k for the drafter methods, whose draft writes its own KV in the step: `allocate_slots(...,
        num_lookahead_tokens)`; a waiting request that has computed nothing allocates none).
        `max_model_len`: with speculation, a verification's drafts stop at the position max_model_len - 1
        and its slots (lookahead included) at max_model_len, as vLLM's scheduler and `allocate_slots`
        cut them, so a cache that holds one max_model_len request always runs it (None: no cap).
        `drop_last_hit_block`: a waiting request's prefix-cache hit gives back its last block, which
        is computed again (vLLM v1 with a drafter that reads the target's hidden states, `use_eagle()`:
        `FullAttentionManager.find_longest_cache_hit` pops the last hit block so that the step
        computes those hidden states). `schedule_conservativeness`: SGLang's, which scales the
        new-token ratio's start (and with it its floor and decay) under `reserve_new_token_ratio`."""
        self._kv = kv
        self._max_len = max_model_len if max_model_len is not None else 1 << 62
        self._lookahead = num_lookahead_tokens if speculation is not None else 0
        self._hit_give_back = kv.block_size if drop_last_hit_block else 0
        self._unit = context_chunk_unit
        self._batch_wait_iters = batch_wait_timeout_iters
        self._batch_wait_tokens = batch_wait_max_tokens_ratio * max_num_batched_tokens
        self._batch_wait = batch_wait_timeout_iters > 0 and batch_wait_max_tokens_ratio > 0.0
        self._waited_iters = 0
        self._k = num_speculative_tokens if speculation is not None else 0
        self._spec = speculation
        self._prefill_priority = prefill_priority
        self._sglang_admission = reserve_new_token_ratio
        """SGLang's admission (`PrefillAdder`): a new request needs room for its prompt and its output
        (clipped) beside the running requests' remaining outputs times the new-token ratio; a refused
        one (`NO_TOKEN`) marks the batch full until a running request leaves it. KV exhaustion
        retracts the running request with the fewest outputs (the longest prompt among equals) to
        the back of the queue and resets the ratio from the decoded share (`retract_decode`)."""
        self._init_ratio = min(SGLANG_INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        """SGLang's `init_new_token_ratio`: the default ratio times `--schedule-conservativeness`."""
        self._ratio_base = self._init_ratio
        self._ratio_clock = 0
        """The ratio is `_ratio_base` at clock tick `_ratio_clock` and decays by one decay step per tick."""
        self._batch_full = False
        self._reserve_full_output = reserve_full_output
        self._reserved_blocks = 0
        self._max_num_seqs = max_num_seqs
        self._budget = max_num_batched_tokens
        self._chunked = enable_chunked_prefill
        self._threshold = long_prefill_token_threshold
        self._base_threshold = long_prefill_token_threshold
        self._micro_batches = micro_batches
        self._micro_room = max_num_batched_tokens
        """Without chunked prefill, the longest prompt a plan admits (`_set_micro_batch_room`)."""
        self._block_size = kv.block_size
        self._bulk = bulk_decodes and not self._k
        self._bulk_waits = self._bulk and prefill_priority
        """Bulk decodes may sit out steps (prefill-only steps under `prefill_priority`)."""
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []
        """All running requests in running order (ascending `run_seq`)."""
        self._active: list[RequestState] = []
        """Running requests that are not bulk decodes, in running order."""
        self._num_bulk = 0
        self._bulk_context_base = 0
        """Sum over bulk decodes of (num_computed - lazy_step): their total context after step u is
        this plus num_bulk x u."""
        self._due: list[list[RequestState]] = [[] for _ in range(self._block_size)]
        """Bulk decodes by (lazy_step - num_computed) mod block_size, in running order: bucket
        u mod block_size holds the ones whose context after step u fills its last block."""
        self._finish_at: dict[int, list[RequestState]] = {}
        """Bulk decodes by the step that samples their last token."""
        self._finish_steps: list[int] = []
        """The keys of `_finish_at` as a heap: steps end in order, so the key popped is always the
        smallest, and the next finish is read without scanning the dict."""
        self._step_id = 0
        self._clock = 0
        """The bulk decodes' clock: steps in which every bulk decode decodes (all steps but the
        prefill-only ones of `prefill_priority`). Their counters (`lazy_step`), finish steps and
        KV-block buckets count in it."""
        self._clock_step = 0
        """The step id of the clock's latest tick (the step in which bulk decodes last sampled)."""
        self._sampled: list[list[int]] = []
        """With `_bulk_waits`: the bulk decodes by the step of their last sample, [step id, count],
        oldest first: all of them at the last clock tick, then those that joined in each prefill-only
        step since."""
        self._prefill_only = False
        """The plan in flight is a prefill-only step (bulk decodes sit it out)."""
        self._next_seq = 0
        self._in_flight = False
        self.num_preemptions = 0
        self.hold_new = False
        """Run no context request while set, neither a waiting prompt nor the next chunk of one being
        chunked (TensorRT-LLM's attention-DP balance, `PyExecutor._balance_adp_requests`, returns no
        context request for the iteration; `sim.serving.dp_group`)."""

    @property
    def kv(self) -> KVCacheManager:
        return self._kv

    def add(self, request: RequestState) -> None:
        self._waiting.append(request)

    def add_transferred(self, request: RequestState) -> None:
        """Queue a request whose prompt KV arrived from a prefill worker (disaggregated serving).

        As vLLM's scheduler does for a remote prefill (`WAITING_FOR_REMOTE_KVS`), all known tokens
        but the last count as computed: admission allocates blocks for the whole prompt without
        computing it, and the first step computes the last prompt token to sample the first output.
        A request that arrives with the prefill's sampled token (`num_output` = 1, SGLang) has its
        whole prompt computed: its first step computes that token and samples the second.
        """
        request.num_computed = request.num_known() - 1
        # SGLang's prefill server also runs the drafter's extend and sends its proposals with the KV
        # (the metadata buffers' top-k drafts and hidden states): the first decode step verifies them.
        request.has_drafts = request.num_output > 0
        self._waiting.append(request)

    def num_outstanding(self) -> int:
        return len(self._waiting) + len(self._running)

    def num_waiting(self) -> int:
        """Requests queued for admission (the queue depth an autoscaler reads)."""
        return len(self._waiting)

    def num_running(self) -> int:
        return len(self._running)

    def kv_usage_frac(self) -> float:
        return self._kv.usage_frac()

    def kv_usage_frac_after_bulk_steps(self, num_steps: int) -> float:
        """`kv_usage_frac()` once the first `num_steps` of the bulk decode steps that
        `next_bulk_decode_steps` describes have taken their blocks (each takes them when it
        starts): what the replica reports while those steps are still to be run in bulk."""
        kv = self._kv
        if num_steps <= 0:
            return kv.usage_frac()
        taken = int(due_block_counts(num_steps, self._due_prefix())[-1])
        return (kv.num_blocks - (kv.num_free_blocks() - taken)) / kv.num_blocks

    def adp_load(self) -> RankLoad:
        """This rank's counts for TensorRT-LLM's attention-DP balance (`sim.serving.adp_balance`):
        context requests it would run (ongoing prefills, and waiting prompts it has batch slots
        and reserved KV room for) and generation requests (1, TRT-LLM's dummy, if it has none at all)."""
        prefilling = sum(1 for r in self._active if r.num_pending() > 1 or r.num_computed < r.prompt_tokens)
        slots = self._max_num_seqs - len(self._running)
        new = 0
        if self._waiting and slots > 0 and not self._no_room_reserved(self._waiting[0]):
            new = min(len(self._waiting), slots)
        generation = len(self._running) - prefilling
        if not self._running and not self._waiting:
            generation = 1
        return RankLoad(num_context=prefilling + new, num_generation=generation, max_batch=self._max_num_seqs)

    @property
    def bulk_may_wait(self) -> bool:
        """Bulk decodes may sit out steps (prefill-only steps of `prefill_priority`)."""
        return self._bulk_waits

    @property
    def step_id(self) -> int:
        """The id of the last step planned (or run in bulk)."""
        return self._step_id

    def oldest_sample_step(self) -> int | None:
        """With bulk decodes that sit out prefill-only steps: the earliest step in which one of
        them last sampled (the engine keeps the end times of the steps since); else None."""
        return self._sampled[0][0] if self._sampled else None

    def skip_to_step(self, step_id: int) -> None:
        """Number the next step `step_id + 1` (a data-parallel rank that sat out group steps in a
        dummy batch keeps the group's step numbers). Only while no bulk decode is kept, whose
        aggregate counters are indexed by step."""
        if step_id != self._step_id:
            assert not self._num_bulk and not self._in_flight and step_id > self._step_id
            self._step_id = step_id

    def _cap(self, pending: int, budget: int) -> int:
        """Tokens a request with `pending` tokens to compute gets from `budget` (0: none this step)."""
        want = pending
        if 0 < self._threshold < want:
            want = self._threshold
        num_new = want if want <= budget else budget
        if num_new < want and self._unit > 1:  # cut by the budget: whole units
            num_new -= num_new % self._unit
        return num_new

    @property
    def max_num_seqs(self) -> int:
        """Running requests the scheduler holds at most."""
        return self._max_num_seqs

    def _set_micro_batch_room(self, beside_decodes: bool) -> None:
        """The room a prompt gets in this plan of pipeline micro-batches: one micro-batch's budget,
        less its even share of the running requests when `beside_decodes` (the engines fill a
        micro-batch's budget with its running requests first; SGLang's prefill-only steps hold
        none). `_micro_room` is that room in whole chunk units, at least one unit (without chunked
        prefill: the longest prompt admitted whole); `_threshold`, the most tokens a chunk gets,
        is it capped by `long_prefill_token_threshold` when set. Read from the running requests at
        the start of the plan, so the bulk and the request-by-request plans see the same room."""
        m = self._micro_batches
        room = self._budget // m - (len(self._running) // m if beside_decodes else 0)
        unit = self._unit if self._chunked else 1
        room = max(room - room % unit, unit)
        self._micro_room = room
        self._threshold = self._base_threshold if 0 < self._base_threshold < room else room

    # -- planning ------------------------------------------------------------------------------
    def schedule(self) -> StepPlan | None:
        assert not self._in_flight, "schedule() called before finish_step() of the previous plan"
        if not self._running and not self._waiting:
            self._active = []  # what planning an empty replica leaves (`_schedule_each`)
            if self._sglang_admission:  # SGLang's idle loop re-initialises the ratio
                self._ratio_base, self._ratio_clock = self._init_ratio, self._clock
            return None
        resynced: tuple[RequestState, ...] = ()
        micro = self._micro_batches > 1
        if self._prefill_priority:
            if micro:
                self._set_micro_batch_room(beside_decodes=False)
            plan = self._prefill_only_step()
            if plan is not None:
                self._in_flight = True
                return plan
        if micro:
            self._set_micro_batch_room(beside_decodes=True)
        if self._num_bulk:
            plan = self._schedule_bulk()
            if plan is not None:
                self._in_flight = True
                return plan
            resynced = self._resync_all()
        plan = self._schedule_each(resynced)
        self._in_flight = plan is not None
        return plan

    def next_bulk_decode_steps(self) -> tuple[int, int, int] | None:
        """(count, total context, steps until one finishes) when the next step is bulk decodes only.

        That is: no other request is running or waiting and the blocks the step needs are free.
        The count stays the same and the total context grows by the count per step until the step
        in which some decode samples its last token (counted in the third number). None
        otherwise; plan such a step with `schedule()`.
        """
        if self._active or (self._waiting and not self._batch_full) or not self._num_bulk or self._in_flight:
            return None  # (a full SGLang batch admits nothing until a request leaves it: a finish ends the run)
        if self._bulk_waits and (len(self._sampled) != 1 or self._sampled[0][0] != self._step_id):
            return None  # some sat out a prefill-only step: their next gap is not one step
        u = self._clock
        if len(self._due[u % self._block_size]) > self._kv.num_free_blocks():
            return None
        return self._num_bulk, self._bulk_context_base + self._num_bulk * u, self._finish_steps[0] - u

    def bulk_decode_block_steps(self, num_steps: int) -> int:
        """How many of the next `num_steps` steps `next_bulk_decode_steps` described find the KV
        blocks they take free (the count `run_bulk_decode_steps(num_steps)` runs, before it stops
        at a finish)."""
        free = self._kv.num_free_blocks()
        if (num_steps // self._block_size + 1) * self._num_bulk <= free:
            return num_steps  # each bulk decode takes at most one block per block_size steps
        prefix = self._due_prefix()
        q, r = divmod(num_steps, self._block_size)
        if q * prefix[-1] + (prefix[r - 1] if r else 0) <= free:
            return num_steps
        return int(np.searchsorted(due_block_counts(num_steps, prefix), free, side="right"))

    def _due_prefix(self) -> list[int]:
        """Blocks taken by the next 1, 2, ..., block_size bulk steps (each bulk decode crosses into
        a new block once per `block_size` steps, so the pattern repeats with that period)."""
        r = self._clock % self._block_size
        sizes = list(map(len, self._due))
        return list(accumulate(sizes[r:] + sizes[:r]))


    def run_bulk_decode_steps(self, num_steps: int) -> tuple[int, list[RequestState], np.ndarray | list[int]]:
        """Run up to `num_steps` of the steps `next_bulk_decode_steps` described, each the same as
        `schedule()` and then `finish_step()` of its plan; stop before a step whose blocks are not
        free and after one in which a decode finishes.

        Returns the steps run, the requests that finished in the last one, and the free blocks
        after each step (an int64 array; a list for up to `block_size` steps, run one by one).
        The work is O(block_size + blocks taken), not per step: the requests crossing into a new
        block repeat with period `block_size`.
        """
        if num_steps <= self._block_size:
            return self._run_bulk_steps_one_by_one(num_steps)
        u = self._clock
        bs = self._block_size
        free = self._kv.num_free_blocks()
        last = self._finish_steps[0] - u
        if num_steps > last:
            num_steps = last
        prefix = self._due_prefix()
        taken = due_block_counts(num_steps, prefix)
        steps = num_steps
        if num_steps and int(taken[-1]) > free:
            steps = int(taken.searchsorted(free, side="right"))
        free_after = free - taken[:steps]
        if steps and int(taken[steps - 1]):
            due = self._due
            # The requests crossing into a new block in each of the first block_size steps, in
            # step order; the pattern repeats (`prefix[r - 1]` of them cross in the first r steps).
            period = [r.request_id for r_off in range(min(steps, bs)) for r in due[(u + r_off) % bs]]
            q, rem = divmod(steps, bs)
            if len(period) == 1:  # one request crosses (a lone decode): its blocks in one call
                self._kv.append_blocks(period[0], q + (prefix[rem - 1] if rem else 0) if q else 1)
            else:
                self._kv.append_one_block(period * q + (period[:prefix[rem - 1]] if rem else []) if q else period)
        return self._end_bulk_steps(u + steps, steps == last, free_after)

    def _run_bulk_steps_one_by_one(self, num_steps: int) -> tuple[int, list[RequestState], list[int]]:
        """`run_bulk_decode_steps` a step at a time (cheaper for a few steps)."""
        u = self._clock
        bs = self._block_size
        free = self._kv.num_free_blocks()
        request_ids: list[int] = []
        free_after: list[int] = []
        steps = 0
        last = self._finish_steps[0] - u
        if num_steps > last:
            num_steps = last
        while steps < num_steps:
            due = self._due[(u + steps) % bs]
            if len(due) > free:
                break
            if due:
                free -= len(due)
                request_ids += [r.request_id for r in due]
            free_after.append(free)
            steps += 1
        if request_ids:
            self._kv.append_one_block(request_ids)
        return self._end_bulk_steps(u + steps, steps == last, free_after)

    def _end_bulk_steps(self, clock: int, finishing: bool,
                        free_after: _FreeAfter) -> tuple[int, list[RequestState], _FreeAfter]:
        """Both bulk-step paths' end: advance the step counter and the clock and, when the run
        reached the next finish, finish and release those requests (the last free count then
        includes their blocks)."""
        steps = clock - self._clock
        self._clock = clock
        self._step_id += steps
        self._clock_step = self._step_id
        finished: list[RequestState] = []
        if finishing:
            finished = self._finish_bulk(clock)
            self._release(finished)
            free_after[-1] = self._kv.num_free_blocks()
        if self._bulk_waits and steps:
            self._sampled = [[self._step_id, self._num_bulk]] if self._num_bulk else []
        return steps, finished, free_after

    def _schedule_bulk(self) -> StepPlan | None:
        """The step with bulk decodes kept in aggregate, or None when it would differ from `_schedule_each`."""
        u = self._clock
        bs = self._block_size
        due = self._due[u % bs]
        num_bulk = self._num_bulk
        if not self._active and (not self._waiting or self._batch_full) and not self._bulk_waits \
                and len(due) <= self._kv.num_free_blocks():
            # Bulk decodes only (every rank of a data-parallel group, most steps): the blocks they
            # cross into, then `_bulk_plan`'s plan with no chunk.
            if due:
                self._kv.append_one_block([r.request_id for r in due])
            self._step_id += 1
            self._clock = u + 1
            self._clock_step = self._step_id
            return StepPlan(self._step_id, (), 0, (), num_bulk, self._bulk_context_base + num_bulk * u)
        budget = self._budget - num_bulk
        num_needed = len(due)
        planned: list[tuple[RequestState, int]] = []
        checked_tail = False
        held = self._kv.num_blocks_held
        for req in self._active:
            if self.hold_new and req.num_computed < req.prompt_tokens:
                continue  # attention-DP balance holds it (`_schedule_each`)
            if budget <= 0:
                # This and later requests get nothing; as in vLLM no bulk decode may come after them.
                if not checked_tail and self._last_bulk_seq() > req.run_seq:
                    return None
                break
            want = req.num_pending()
            if 0 < self._threshold < want:
                want = self._threshold
            num_new = want if want <= budget else budget
            if num_new < want and self._unit > 1:  # cut by the budget: whole units
                num_new -= num_new % self._unit
            if num_new < want and not checked_tail:
                if self._last_bulk_seq() > req.run_seq:
                    return None
                checked_tail = True
            if not num_new:
                continue  # cut to nothing (`context_chunk_unit`): it waits; later requests still run
            planned.append((req, num_new))
            budget -= num_new
            num_needed += -(-(req.num_computed + num_new) // bs) - held(req.request_id)
        if num_needed > self._kv.num_free_blocks():
            return self._schedule_bulk_preempting(planned)
        chunks: list[ScheduledChunk] = []
        self._grow_in_order(due, planned, chunks)
        hits = 0
        if self._waiting:
            hits, budget = self._admit(chunks, budget)
        return self._bulk_plan(chunks, hits, ())

    def _bulk_plan(self, chunks: list[ScheduledChunk], hits: int, preempted: tuple[RequestState, ...],
                   resynced: tuple[RequestState, ...] = ()) -> StepPlan:
        """The planned bulk step: the clock ticks; the bulk decodes left run in it."""
        u = self._clock
        waited: tuple[tuple[int, int], ...] = ()
        if self._bulk_waits:
            previous = self._step_id
            waited = tuple((step, n) for step, n in self._sampled if step != previous)
        self._step_id += 1
        self._clock = u + 1
        self._clock_step = self._step_id
        num_bulk = self._num_bulk
        return StepPlan(self._step_id, tuple(chunks), hits, preempted, num_bulk,
                        self._bulk_context_base + num_bulk * u, resynced, waited_bulk=waited)

    def _schedule_bulk_preempting(self, planned: list[tuple[RequestState, int]]) -> StepPlan:
        """`_schedule_bulk` when the KV blocks run out: `_schedule_each`'s walk in running order
        (allocate each request's blocks; when they do not fit, preempt the last running request
        until they do, or until it is the request itself), with the bulk decodes that keep running
        left in bulk. The walk visits only the requests that take blocks in this step (the bulk
        decodes crossing into a new block, the non-bulk requests with tokens); the others need
        nothing from the cache. Only the preempted ones are brought up to date (in `resynced`).

        `planned` are the tokens of the non-bulk requests that `_schedule_bulk` found, in running
        order; a request after them gets none, and no bulk decode comes after them.
        """
        kv = self._kv
        running = self._running
        due = list(self._due[self._clock % self._block_size])  # victims leave the bucket
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestState] = []
        resynced: list[RequestState] = []
        i = j = 0
        while i < len(due) or j < len(planned):
            if j == len(planned) or (i < len(due) and due[i].run_seq < planned[j][0].run_seq):
                req, num_new = due[i], 0
                i += 1
            else:
                req, num_new = planned[j]
                j += 1
            if req.run_seq < 0:
                continue  # preempted in this step (its run_seq is -1 now)
            # A chunk's blocks, or one more block for a bulk decode crossing into a new one.
            while not (kv.allocate(req.request_id, num_tokens=req.num_computed + num_new, keys=req.keys,
                                   num_computed_tokens=req.num_computed) if num_new
                       else kv.num_free_blocks() >= 1):
                first = bisect_left(running, req.run_seq, key=_run_seq)
                self._preempt_running(self._pick_victim(running, first), preempted, resynced)
                if req.run_seq < 0:
                    break  # it preempted itself: so were all after it
            else:
                if num_new:
                    chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                                 req.num_computed + num_new == req.num_known()))
                else:
                    kv.append_one_block([req.request_id])
                continue
            break
        self._active = [r for r in self._active if r.run_seq >= 0]
        assert preempted and (chunks or self._num_bulk), "a running request fits the cache alone"
        self._retracted()
        return self._bulk_plan(chunks, 0, tuple(preempted), tuple(resynced))

    def _preempt_running(self, victim: RequestState, preempted: list[RequestState],
                         resynced: list[RequestState]) -> None:
        """Preempt `victim`, just popped from the running requests; a bulk decode is first brought
        up to date and dropped from the bulk state."""
        if victim.lazy_step >= 0:
            self._drop_bulk(victim)
            resynced.append(victim)
        self._preempt(victim)
        preempted.append(victim)

    def _drop_bulk(self, req: RequestState) -> None:
        """Stop running `req` in bulk: out of the aggregate counters, its block bucket, its finish
        step and its sample group, with its counters brought up to the current clock."""
        finish = req.lazy_step + req.output_tokens - req.num_output
        self._untrack(req)
        at = self._finish_at[finish]
        at.remove(req)
        if not at:
            del self._finish_at[finish]
            self._finish_steps.remove(finish)
            heapify(self._finish_steps)
        self._sync(req, self._clock)
        if self._bulk_waits:
            for group in self._sampled:
                if group[0] == req.last_sample_step:
                    group[1] -= 1
                    if not group[1]:
                        self._sampled.remove(group)
                    break

    def _grow_in_order(self, due: list[RequestState], planned: list[tuple[RequestState, int]],
                       chunks: list[ScheduledChunk]) -> None:
        """Allocate blocks for bulk decodes crossing a block and planned chunks, in running order."""
        kv = self._kv
        if not planned:
            if due:
                kv.append_one_block([r.request_id for r in due])
            return
        i = 0
        for req, num_new in planned:
            seq = req.run_seq
            j = i
            while j < len(due) and due[j].run_seq < seq:
                j += 1
            if j > i:
                kv.append_one_block([r.request_id for r in due[i:j]])
                i = j
            ok = kv.allocate(req.request_id, num_tokens=req.num_computed + num_new, keys=req.keys,
                             num_computed_tokens=req.num_computed)
            assert ok
            chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                         req.num_computed + num_new == req.num_known()))
        if i < len(due):
            kv.append_one_block([r.request_id for r in due[i:]])

    def _last_bulk_seq(self) -> int:
        for req in reversed(self._running):
            if req.lazy_step >= 0:
                return req.run_seq
        return -1

    def _schedule_each(self, resynced: tuple[RequestState, ...]) -> StepPlan | None:
        """Plan request by request (no bulk decodes exist)."""
        budget = self._budget
        chunks: list[ScheduledChunk] = []
        preempted: list[RequestState] = []
        running = self._running
        i = 0
        k = self._k
        while i < len(running) and budget > 0:
            req = running[i]
            if self.hold_new and req.num_computed < req.prompt_tokens:
                i += 1  # attention-DP balance: every context request waits, a chunked prompt's next chunk too
                continue
            drafts = 0
            if k and req.has_drafts and req.num_pending() == 1:
                # A decode verifies its drafts (vLLM cuts them to the budget, to max_model_len - 1 and,
                # when it is set, to `long_prefill_token_threshold`, which caps `num_tokens_with_spec` too).
                drafts = max(0, min(k, budget - 1, self._max_len - 2 - req.num_computed))
                if 0 < self._base_threshold <= drafts:
                    drafts = self._base_threshold - 1
                num_new = 1 + drafts
            else:
                num_new = self._cap(req.num_pending(), budget)
                if not num_new:  # cut to nothing (`context_chunk_unit`): it waits; later requests still run
                    i += 1
                    continue
            fits = True
            slots = min(req.num_computed + num_new + self._lookahead, max(self._max_len, req.num_computed + num_new))
            while not self._kv.allocate(req.request_id, num_tokens=slots,
                                        keys=req.keys, num_computed_tokens=req.num_computed):
                # Requests before index i are already scheduled; the victim is one of the others.
                victim = self._pick_victim(running, i)
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                         drafts > 0 or req.num_computed + num_new == req.num_known(), drafts))
            budget -= num_new
            i += 1
        hits = 0
        if not preempted:
            hits, budget = self._admit(chunks, budget)
        else:
            self._retracted()
        self._active = list(running)
        if not chunks:
            return None
        self._step_id += 1
        self._clock += 1
        self._clock_step = self._step_id
        return StepPlan(self._step_id, tuple(chunks), hits, tuple(preempted), resynced=resynced)

    def _full_blocks(self, req: RequestState) -> int:
        """Blocks a request holds at most (`reserve_full_output`): its prompt and output, and with
        speculation the lookahead slots of its last verification (its last output token's step
        allocates prompt + output - 1 + k slots)."""
        full = min(req.prompt_tokens + req.output_tokens + max(self._k - 1, 0),
                   max(self._max_len, req.prompt_tokens + req.output_tokens))
        return -(-full // self._block_size)

    def _no_room_reserved(self, req: RequestState, hit: int | None = None) -> bool:
        """With `reserve_full_output`: the blocks the request needs to completion do not fit beside
        those the running requests need to theirs (TensorRT-LLM's GUARANTEED_NO_EVICT: free blocks
        less each running request's `getRemainingBlocksToCompletion`, its full-length blocks less
        those it holds, shared prefix blocks included; a new request's need is its full-length
        blocks less the blocks of its prefix hit that running requests hold). With counters: the
        running requests hold `num_blocks - free + num_shared_refs()` block-table entries, so the
        room is `num_blocks + num_shared_refs()` less their full-length blocks. `hit`: its prefix
        hit in tokens (None: look it up)."""
        if not self._reserve_full_output:
            return False
        kv = self._kv
        if hit is None:
            hit = kv.get_computed_tokens(req.keys, req.num_known()) if req.keys and not req.num_computed else 0
        credit = kv.num_shared_refs() + kv.num_held_hit_blocks(req.keys, hit)
        return self._reserved_blocks + self._full_blocks(req) > kv.num_blocks + credit

    def _prefill_only_step(self) -> StepPlan | None:
        """`prefill_priority`: ongoing chunked prefills, then waiting requests FCFS; None if none can run.

        Bulk decodes sit the step out: their clock does not tick."""
        budget = self._budget
        chunks: list[ScheduledChunk] = []
        for req in self._active:  # the bulk decodes, not in it, are decodes
            if budget <= 0:
                break
            if req.num_pending() <= 1 and req.num_computed >= req.prompt_tokens:
                continue  # a decode: it waits for a step without prefill work
            num_new = self._cap(req.num_pending(), budget)
            if not num_new:
                continue  # cut to nothing (`context_chunk_unit`): it waits for the next step
            if not self._kv.allocate(req.request_id, num_tokens=req.num_computed + num_new,
                                     keys=req.keys, num_computed_tokens=req.num_computed):
                break
            chunks.append(ScheduledChunk(req, num_new, req.num_computed,
                                         req.num_computed + num_new == req.num_known()))
            budget -= num_new
        hits, budget = self._admit(chunks, budget)
        if not chunks:
            return None
        self._step_id += 1
        self._prefill_only = True
        return StepPlan(self._step_id, tuple(chunks), hits, ())

    def _holds_waiting(self, chunks: list[ScheduledChunk], budget: int) -> bool:
        """TensorRT-LLM batch waiting (`PyExecutor._waiting_requests`): while decodes run, waiting
        prefills are held until `batch_wait_timeout_iters` steps have held them or the step's tokens
        (the prompts that would be admitted plus the tokens already scheduled) reach
        `batch_wait_max_tokens_ratio` x the token budget. Without running decodes nothing is held:
        the GPU would idle."""
        if not (self._num_bulk or any(c.request.num_computed >= c.request.prompt_tokens for c in chunks)):
            return False
        slots = self._max_num_seqs - len(self._running)
        admissible = zip(range(slots), self._waiting, strict=False)
        prompt_tokens = sum(req.num_known() - req.num_computed for _, req in admissible)
        scheduled_tokens = self._budget - budget + min(prompt_tokens, budget)
        if self._waited_iters < self._batch_wait_iters and scheduled_tokens < self._batch_wait_tokens:
            self._waited_iters += 1
            return True
        self._waited_iters = 0
        return False

    def _admit(self, chunks: list[ScheduledChunk], budget: int) -> tuple[int, int]:
        """Admit waiting requests FCFS into the remaining budget; returns (prefix hit tokens, budget)."""
        hits = 0
        kv = self._kv
        if self.hold_new and self._waiting:
            return hits, budget
        if self._batch_wait and self._waiting and self._holds_waiting(chunks, budget):
            return hits, budget
        room = 0
        if self._sglang_admission and self._waiting:
            if self._batch_full:
                return hits, budget
            room = self._sglang_room_tokens(chunks)
        if self._waiting and kv.enable_prefix_caching:
            # vLLM's `allocate_slots` registers the full blocks a step's tokens will fill as it
            # schedules them (`cache_blocks`), so a request admitted later in the same step hits the
            # prompt chunks scheduled before it.
            for c in chunks:
                if c.request.keys and not c.is_decode():
                    kv.commit(c.request.request_id, c.num_context_tokens + c.num_new_tokens, c.request.keys)
        while self._waiting and budget > 0 and len(self._running) < self._max_num_seqs:
            req = self._waiting[0]
            remote = req.num_computed  # > 0 only for transferred KV (`add_transferred`)
            hit = 0
            if remote == 0 and req.keys:
                hit = kv.get_computed_tokens(req.keys, req.num_known())
                if hit:
                    hit -= self._hit_give_back
            if self._reserve_full_output and self._no_room_reserved(req, hit):
                break
            pending = req.num_known() - hit - remote
            if self._sglang_admission:
                need = pending + min(req.output_tokens - req.num_output, SGLANG_CLIP_MAX_NEW_TOKENS)
                if need >= room and self._running:  # `AddReqResult.NO_TOKEN`
                    self._batch_full = True
                    break
                # (Alone on the replica a request is admitted whatever it reserves: a request as large as
                # the cache, which the scenario check lets through, would otherwise never run.)
                room -= need
            # Without chunked prefill vLLM cuts a prompt to `long_prefill_token_threshold` first and
            # then holds it if the cut count exceeds the budget left (`Scheduler.schedule`).
            whole = self._base_threshold if 0 < self._base_threshold < pending else pending
            if not self._chunked and (whole > budget or pending > self._micro_room):
                break
            num_new = self._cap(pending, budget)
            if not num_new:
                break  # cut to nothing (`context_chunk_unit`): FCFS, it and those behind it wait
            lookahead = self._lookahead if remote else 0  # vLLM: none for a request with nothing computed
            slots = min(remote + hit + num_new + lookahead, max(self._max_len, remote + hit + num_new))
            if not kv.allocate(req.request_id, num_tokens=slots, keys=req.keys, num_computed_tokens=hit):
                break
            self._waiting.popleft()
            if self._reserve_full_output:
                self._reserved_blocks += self._full_blocks(req)
            if req.keys and not remote and kv.enable_prefix_caching:
                kv.commit(req.request_id, hit + num_new, req.keys)  # as above, for those admitted after it
            if not remote and req.num_preemptions == 0 and req.first_scheduled_s is None:
                kv.record_prefix_query(req.prompt_tokens, hit)
                req.prefix_hit_tokens = hit
            elif req.num_preemptions:
                req.recomputed_tokens -= hit  # resumed: its cached blocks are not computed again
            hits += hit
            hit += remote
            req.num_computed = hit
            req.run_seq = self._next_seq
            self._next_seq += 1
            self._running.append(req)
            self._active.append(req)
            chunks.append(ScheduledChunk(req, num_new, hit, hit + num_new == req.num_known()))
            budget -= num_new
        return hits, budget

    def _new_token_ratio(self) -> float:
        floor = min(self._init_ratio * SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        decay = (self._init_ratio - floor) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
        return max(floor, self._ratio_base - decay * (self._clock - self._ratio_clock))

    def _outputs_now(self, req: RequestState) -> int:
        """Output tokens `req` has sampled so far (a bulk decode's counters lag the clock)."""
        return req.num_output + (self._clock - req.lazy_step if req.lazy_step >= 0 else 0)

    def _sglang_room_tokens(self, chunks: list[ScheduledChunk]) -> int:
        """SGLang's `rem_total_tokens` before this step's admissions: free (and evictable) KV tokens
        less what the running requests hold in reserve: a decode's remaining output (clipped) times
        the new-token ratio, a prompt still being computed its remaining tokens and its whole output.
        The chunks the step already holds (`chunks`) took their blocks from the free count, so a
        prompt's tokens in them are not reserved again (`add_chunked_req` charges the chunk once,
        against the KV free before the step); a retracted request's chunk that runs past its prompt
        (it recomputes its outputs too) leaves no prompt to reserve, not a negative amount."""
        ratio = self._new_token_ratio()
        scheduled = {c.request.request_id: c.num_new_tokens for c in chunks if not c.is_decode()}
        reserved = 0.0
        for r in self._running:
            left = min(r.output_tokens - self._outputs_now(r), SGLANG_CLIP_MAX_NEW_TOKENS)
            if r.lazy_step < 0 and r.num_computed < r.prompt_tokens:
                reserved += max(r.prompt_tokens - r.num_computed - scheduled.get(r.request_id, 0), 0) + left
            else:
                reserved += left * ratio
        return int(self._kv.num_free_blocks() * self._block_size - reserved)

    def _pick_victim(self, running: list[RequestState], first: int) -> RequestState:
        """The request a KV shortage preempts, taken out of `running`, where `running[first]` is the
        request the step is placing and those after it are not scheduled yet: vLLM's newest; SGLang's
        retraction order (fewest outputs, then the longest prompt: `ScheduleBatch.retract_decode`)
        among those after it, the request being placed only when none is left. (SGLang retracts before
        it places anything; retracting the request being placed while later ones run would leave the
        step's walk with requests it never placed: they would run without their blocks.)"""
        if not self._sglang_admission or first >= len(running) - 1:
            return running.pop()
        at = min(range(first + 1, len(running)),
                 key=lambda j: (self._outputs_now(running[j]), -running[j].prompt_tokens, -running[j].run_seq))
        return running.pop(at)

    def _retracted(self) -> None:
        """After a step's retractions (planned, its clock tick to come): SGLang resets the ratio from the
        running requests' decoded share, and that decode step does not decay it."""
        if not self._sglang_admission or not self._running:
            return
        decoded = sum(self._outputs_now(r) for r in self._running)
        outputs = sum(r.output_tokens for r in self._running)
        self._ratio_base = min(1.0, (decoded + SGLANG_RETRACT_DECODE_STEPS * len(self._running)) / outputs)
        self._ratio_clock = self._clock + 1

    def _preempt(self, victim: RequestState) -> None:
        kv = self._kv
        if kv.enable_prefix_caching and victim.segments:
            if self._sglang_admission:
                # SGLang's retraction frees the KV without inserting it into the radix tree
                # (`release_kv_cache(..., is_insert=False)`): what stays cached is the prompt its
                # prefill inserted (`cache_unfinished_req`); generated tokens are computed again.
                indexed = min(victim.num_computed, victim.prompt_tokens)
            else:
                # vLLM: everything it computed, prompt and generated tokens, stays indexed after the
                # blocks are freed, and it hits them on resuming unless they are evicted first. But
                # for the drafts its last verification accepted: vLLM indexed its blocks when it
                # scheduled that step, up to the tokens then known (`accepted_drafts`).
                indexed = victim.num_computed - victim.accepted_drafts
            num_tokens = max(victim.num_computed, len(victim.keys) * self._block_size)
            victim.keys = kv.prompt_block_keys(cast(Sequence[SegmentLike], victim.segments),
                                               victim.request_id, num_tokens)
            kv.commit(victim.request_id, indexed, victim.keys)
        kv.free(victim.request_id)
        victim.recomputed_tokens += victim.num_computed
        victim.num_computed = 0
        victim.num_preemptions += 1
        victim.has_drafts = False  # vLLM clears a preempted request's `spec_token_ids`
        victim.accepted_drafts = 0
        victim.run_seq = -1
        if self._reserve_full_output:
            self._reserved_blocks -= self._full_blocks(victim)
        self.num_preemptions += 1
        self._batch_full = False
        if self._sglang_admission:
            self._waiting.append(victim)  # SGLang queues a retracted request behind the waiting ones
        else:
            self._waiting.appendleft(victim)

    # -- bulk decode bookkeeping ---------------------------------------------------------------
    def _make_bulk(self, req: RequestState, step: int) -> None:
        """`req` sampled in the step at clock tick `step` and decodes in every tick from the next."""
        req.lazy_step = step
        insort(self._due[(step - req.num_computed) % self._block_size], req, key=_run_seq)
        finish = step + req.output_tokens - req.num_output
        at = self._finish_at.get(finish)
        if at is None:
            self._finish_at[finish] = [req]
            heappush(self._finish_steps, finish)
        else:
            at.append(req)
        self._num_bulk += 1
        self._bulk_context_base += req.num_computed - step

    def _sync(self, req: RequestState, clock: int) -> None:
        """Bring a bulk decode's counters to their values after clock tick `clock` (the current
        one) and make it a plain request."""
        n = clock - req.lazy_step
        if n:
            req.num_computed += n
            req.num_output += n
            req.last_sample_step = self._clock_step
        req.lazy_step = -1

    def _resync_all(self) -> tuple[RequestState, ...]:
        u = self._clock
        self._sampled = []
        synced = []
        for req in self._running:
            if req.lazy_step >= 0:
                self._sync(req, u)
                synced.append(req)
        for bucket in self._due:
            bucket.clear()
        self._finish_at.clear()
        self._finish_steps.clear()
        self._num_bulk = 0
        self._bulk_context_base = 0
        self._active = list(self._running)
        return tuple(synced)

    # -- step end ------------------------------------------------------------------------------
    def finish_step(self, plan: StepPlan) -> list[RequestState]:
        assert self._in_flight and plan.step_id == self._step_id, "finish_step() out of order"
        self._in_flight = False
        clock = self._clock
        if not plan.chunks and not self._prefill_only and not self._bulk_waits:
            # Bulk decodes only: the general path below with no chunk to finish.
            if clock not in self._finish_at:
                return []
            done = self._finish_bulk(clock)
            self._active = [r for r in self._active if not r.is_finished()]
            self._release(done)
            return done
        step = plan.step_id
        prefill_only = self._prefill_only
        self._prefill_only = False
        kv = self._kv
        finished: list[RequestState] = []
        joined = 0
        for chunk in plan.chunks:
            req = chunk.request
            req.num_computed += chunk.num_new_tokens
            if req.keys and not chunk.is_decode():
                kv.commit(req.request_id, req.num_computed, req.keys)
            if chunk.samples:
                if chunk.num_draft_tokens:
                    # 1 + accepted tokens; the KV of the rejected drafts is not kept.
                    assert self._spec is not None
                    emitted = min(1 + self._spec.accepted(req.request_id, chunk.num_draft_tokens),
                                  req.output_tokens - req.num_output)
                    req.num_computed -= chunk.num_new_tokens - emitted
                    req.num_output += emitted
                    req.accepted_drafts = emitted - 1
                else:
                    req.num_output += 1
                    req.accepted_drafts = 0
                req.last_sample_step = step
                req.has_drafts = True
                if req.is_finished():
                    finished.append(req)
                elif self._bulk:
                    self._make_bulk(req, clock)
                    joined += 1
        if not prefill_only and clock in self._finish_at:
            finished += self._finish_bulk(clock)
            finished.sort(key=_run_seq)
        if self._bulk_waits:
            if not prefill_only:
                self._sampled = [[step, self._num_bulk]] if self._num_bulk else []
            elif joined:
                self._sampled.append([step, joined])
        if joined:
            self._active = [r for r in self._active if r.lazy_step < 0 and not r.is_finished()]
        elif finished:
            self._active = [r for r in self._active if not r.is_finished()]
        self._release(finished)
        return finished

    def _finish_bulk(self, clock: int) -> list[RequestState]:
        """Bulk decodes that sample their last token at clock tick `clock` (the current one), in
        running order, brought up to date."""
        done = self._finish_at.pop(clock)
        popped = heappop(self._finish_steps)
        assert popped == clock, "bulk decodes finish in clock order"
        for req in done:
            self._untrack(req)
            self._sync(req, clock)
        if len(done) > 1:
            done.sort(key=_run_seq)
        return done

    def _untrack(self, req: RequestState) -> None:
        """Take a bulk decode out of the aggregate count, the context sum and its block bucket
        (its counters are still those of `lazy_step`)."""
        self._bulk_context_base -= req.num_computed - req.lazy_step
        self._num_bulk -= 1
        self._due[(req.lazy_step - req.num_computed) % self._block_size].remove(req)

    def _release(self, finished: list[RequestState]) -> None:
        running = self._running
        if finished:
            self._batch_full = False  # the batch shrank (SGLang's `update_running_batch`)
        for req in finished:
            running.remove(req)
            self._kv.free(req.request_id)
            if self._spec is not None:
                self._spec.forget(req.request_id)
            req.run_seq = -1
            if self._reserve_full_output:
                self._reserved_blocks -= self._full_blocks(req)
