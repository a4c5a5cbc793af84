"""Prices step plans: kernel graph + host overhead -> step wall time, memoized per instance.

Steps are keyed by their batch shape with decode contexts summarised as (count, mean context
rounded to `decode_context_bucket_tokens`): consecutive decode steps differ only by growing
contexts, so most steps hit the memo. A new key is priced from parts that are memoized on their
own, because a run has thousands of distinct keys but far fewer distinct parts: the token part,
the sampling part, one attention part per distinct prefill chunk and the decode attention part
(`sim.engine.step_parts` says what each holds). Kernels that differ only by name are priced once.
Accumulated per-key counts give the kernel breakdown of a run without touching per-kernel data in
the loop.

A part not seen before comes from the run's `PartBook` (`sim.engine.part_book`), which decides
the family it is priced in, alone or by the family's block pricer (the same bits either way);
priced parts live in a `PartPrices` (`sim.engine.part_prices`), which a long-lived caller shares
between runs of the same pricing identity (`PriceCache`): the run's prices are the same either way.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import chain
from operator import attrgetter, itemgetter
from typing import NamedTuple, cast

import numpy as np

from sim.engine.block_pricing import Part
from sim.engine.micro_batches import split_step
from sim.engine.part_book import PartBook
from sim.engine.part_prices import PartPrices
from sim.graph.memory import stage_layer_ranges
from sim.graph.moe import expert_all_to_all
from sim.graph.shared_experts import depends_on_decode_only
from sim.graph.transformer import one_token_chunks_decode, pp_hops_leaving_domains
from sim.perf.host import HostCost, HostOverheadParams, host_cost, step_time_s
from sim.perf.profile import load_engine_profile, resolved_async_scheduling
from sim.perf.step import StepCostModel
from sim.provenance import Provenance
from sim.serving.scheduler import StepPlan
from sim.specs.scenario import Scenario

StepKey = tuple[tuple[tuple[int, int, int], ...], int, int]
"""(prompt chunks as (new tokens, context tokens, rows sampled: 0, 1, or 1 + d for a verification whose
drafts the budget cut to d), full verifications (or decodes), their bucketed mean context)."""


class GroupKey(NamedTuple):
    """A data-parallel group step: the keys of the ranks that run a batch, sorted (their order
    does not change the price)."""

    ranks: tuple[StepKey, ...]


AnyKey = StepKey | GroupKey
_FIRST_STAGE_KERNELS = frozenset({"embedding"})
_LAST_STAGE_KERNELS = frozenset({"final_norm", "lm_head", "logits_all_gather", "sampler"})
"""Kernels a pipeline's first and last stage run alone (`build_step_graph`'s nodes outside the layers)."""
NGRAM_LOOKUP_S_PER_REQUEST = 10e-6
"""Host time of vLLM's ngram proposer per request per step (an assumption: a numba n-gram match over
the request's tokens; nothing in the data measures it). Added to the step's CPU time."""


_max = np.maximum.reduce
"""`ndarray.max()` without its Python wrapper."""
_cpu_s, _launch_s, _launch_floor_s = attrgetter("cpu_s"), attrgetter("launch_s"), attrgetter("launch_floor_s")
_first, _second = itemgetter(0), itemgetter(1)
_BUCKET_TABLE_MAX = 1 << 16
"""Largest total context whose bucket a decode table keeps (512 KiB per batch size)."""


_BUCKET_TABLES: dict[tuple[int, int], np.ndarray] = {}
"""`_DecodeTable.bucket_of` by (batch size, bucket tokens), shared by the process's pricers (a pure
function of the two, element by element: a longer table only adds totals), read-only."""
_BUCKET_TABLES_MAX_ENTRIES = 1 << 23
"""Totals `_BUCKET_TABLES` holds in all before it is cleared (64 MiB)."""
_bucket_tables_entries = [0]


def _bucket_table(num_decode: int, bucket: int, top: int) -> np.ndarray:
    """max(1, rint(total / num_decode / bucket)) for totals 0.. at least `top` - 1 (`_BUCKET_TABLE_MAX`
    at most), from `_BUCKET_TABLES` or built there (doubling, as a table of one pricer grew)."""
    key = (num_decode, bucket)
    cached = _BUCKET_TABLES.get(key)
    held = 0 if cached is None else len(cached)
    if top <= held:
        assert cached is not None
        return cached
    size = min(max(top, 2 * held, 1024), _BUCKET_TABLE_MAX)
    x = np.arange(size, dtype=np.float64)  # the same operations as `_DecodeTable.buckets`, element by element
    x /= num_decode
    x /= bucket
    table = np.maximum(np.rint(x, out=x).astype(np.int64), 1)
    table.flags.writeable = False
    entries = _bucket_tables_entries[0] - held
    if entries + size > _BUCKET_TABLES_MAX_ENTRIES:
        _BUCKET_TABLES.clear()
        entries = 0
    _bucket_tables_entries[0] = entries + size
    _BUCKET_TABLES[key] = table
    return table


class _DecodeTable:
    """Seconds (NaN: not priced yet) and uncounted bulk steps of decode-only steps of one batch
    size, by mean context in buckets (`mean // decode_context_bucket_tokens`)."""

    __slots__ = ("bucket_of", "counts", "first_start", "num_decode", "seen", "step_s")

    def __init__(self, num_decode: int) -> None:
        self.num_decode = num_decode
        self.step_s = np.full(0, np.nan)
        self.counts = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros(0, dtype=bool)
        """Keys already in `StepPricer.counts`."""
        self.first_start = np.full(0, np.inf)
        """Start of the earliest step counted of each key (kept with `StepPricer.first_s`)."""
        self.bucket_of = np.zeros(0, dtype=np.int64)
        """Bucketed mean context by total context tokens (`_BUCKET_TABLE_MAX` at most; see `buckets`)."""

    def buckets(self, context_tokens: int, num_steps: int, bucket: int) -> np.ndarray:
        """Mean-context bucket of each of `num_steps` steps whose total context is `context_tokens`
        at the first and grows by the batch size per step: max(1, rint(total / count / bucket)),
        the arithmetic of `StepPricer.key`. Small totals read a table of it by total (a view)."""
        n = self.num_decode
        top = context_tokens + n * num_steps
        if top > len(self.bucket_of) and top <= _BUCKET_TABLE_MAX:
            self.bucket_of = _bucket_table(n, bucket, top)
        if top <= len(self.bucket_of):
            return self.bucket_of[context_tokens:top:n]
        x = np.arange(num_steps, dtype=np.float64)  # (context + j x count) / count / bucket, rounded as `key`
        x *= n
        x += context_tokens
        x /= n
        x /= bucket
        b = np.rint(x, out=x).astype(np.int64)
        if num_steps and b[0] < 1:
            b = np.maximum(b, 1)  # the mean context in buckets: max(bucket, round(...) * bucket)
        return b

    def grow(self, size: int) -> None:
        size = max(size, 2 * len(self.step_s), 64)
        old = len(self.step_s)
        self.step_s = np.concatenate((self.step_s, np.full(size - old, np.nan)))
        self.counts = np.concatenate((self.counts, np.zeros(size - old, dtype=np.int64)))
        self.seen = np.concatenate((self.seen, np.zeros(size - old, dtype=bool)))
        self.first_start = np.concatenate((self.first_start, np.full(size - old, np.inf)))


class DecodeRun:
    """Steps of decodes only, priced ahead (`StepPricer.decode_run`): per step its mean-context
    bucket, seconds and end time; `num_steps` of them are to run (a caller may cut it shorter)."""

    __slots__ = ("bucket_idx", "ends", "num_steps", "start_s", "step_s", "table")

    def __init__(self, table: _DecodeTable, bucket_idx: np.ndarray, step_s: np.ndarray, ends: np.ndarray,
                 num_steps: int, start_s: float) -> None:
        self.table = table
        self.start_s = start_s
        self.bucket_idx = bucket_idx
        self.step_s = step_s
        self.ends = ends
        self.num_steps = num_steps

    @property
    def num_decode(self) -> int:
        return self.table.num_decode


class StepPricer:
    def __init__(self, scenario: Scenario, cost: StepCostModel, host: HostOverheadParams,
                 decode_context_bucket_tokens: int = 16, *, block_pricing: bool = True,
                 prices: PartPrices | None = None, micro_batches: int = 1,
                 async_scheduling: bool | None = None) -> None:
        """`prices`: priced parts shared with other runs of the same pricing identity (from
        `PriceCache.prices`); None prices this run's parts afresh. `micro_batches` > 1: a step is
        that many pipeline micro-batches in flight, as long as the slowest of them
        (`sim.engine.micro_batches`). `async_scheduling`: whether steps overlap CPU and GPU work
        (`sim.api` passes its engine profile's resolution of `[engine] async_scheduling`); None
        resolves it with the backend's shipped profile."""
        self._sc = scenario
        self._micro_batches = micro_batches
        self._stage_memo: dict[StepKey, tuple[list[float], list[float]]] = {}
        """Pipeline micro-batches' device and launch seconds per stage (`_stage_seconds`), by micro-batch key."""
        pp = scenario.engine.pipeline_parallel_size
        layers = stage_layer_ranges(scenario.model.num_layers, pp, scenario.engine.backend)
        self._stage_shares = [len(r) / scenario.model.num_layers for r in layers]
        """Each pipeline stage's share of the layers (the engine's split, `stage_layer_ranges`)."""
        self._hops_leave = pp_hops_leaving_domains(scenario.engine.tensor_parallel_size, pp,
                                                   scenario.hardware.nvlink_domain())
        self._cost = cost
        self._host = host
        self._bucket = decode_context_bucket_tokens
        self._memo: dict[AnyKey, float] = {}
        """Step seconds per key (no more entries than `counts`)."""
        self._rank_steps: dict[tuple[StepKey, int | None], tuple[float, list[Part], HostCost]] = {}
        """Group steps' rank prices by (rank key, token key): a group's ranks repeat their shapes
        far more often than the group does (its key is every rank's); pipeline micro-batches' by
        (micro-batch key, None), for the same reason."""
        self._key_parts: dict[AnyKey, tuple[list[Part], HostCost]] = {}
        """Parts and host cost of each key priced (for the breakdown; a group step's are its
        slowest rank's)."""
        self._host_costs: dict[tuple[int, int, bool, int, float], HostCost] = {}
        if prices is None:
            prices = PartPrices(scenario, cost, host.eager_launch_s, block_pricing=block_pricing)
        self.parts = PartBook(scenario, prices, decode_context_bucket_tokens)
        """This run's parts and how each is priced."""
        # Decode-only steps differ from others in the expert all-to-all's mode and, for some
        # engines, in where the shared expert runs (`sim.graph.shared_experts`).
        self._decode_modes = (scenario.model.moe is not None and expert_all_to_all(
            scenario.engine, topk=scenario.model.moe.num_experts_per_token, hw=scenario.hardware)) or \
            depends_on_decode_only(scenario.model, scenario.engine, scenario.precision, scenario.hardware)
        self._mode = scenario.engine.effective_launch_mode()
        self._graph_mode = self._mode == "cuda_graph"
        self._eager_mode = self._mode == "eager"
        self._uncaptured_eager = host.uncaptured_launch == "eager"
        """`launches_eagerly`'s tests, read once (`_rank_step`)."""
        assert scenario.engine.max_cudagraph_capture_size is not None
        self._capture_size = scenario.engine.max_cudagraph_capture_size
        self._async = (resolved_async_scheduling(scenario.engine, load_engine_profile(scenario.engine.backend))
                       if async_scheduling is None else async_scheduling)
        self._padded = capture_ladder(self._capture_size) if (
            scenario.engine.backend == "vllm" and self._mode == "cuda_graph") else ()
        """vLLM runs a step of at most the largest capture's tokens as the graph of the next capture
        size (`pad_for_cudagraph`): its token part is priced at that size (attention, LM head and
        sampler at the real counts, as the padded rows' logits are not computed)."""
        self.first_s: dict[AnyKey, float] | None = None
        """When set (a caller that counts steps out of time order): the start of each key's first
        step, so that `fold_runs` puts `counts` in the order the step-by-step loop counts them."""
        self.clock_s = 0.0
        """The start of the step `price` prices (read only when `first_s` is set)."""
        self._decode_tables: dict[int, _DecodeTable] = {}
        """Decode-only steps run in bulk, by batch size (`decode_run`, `count_run`)."""
        self.counts: Counter[AnyKey] = Counter()
        """Steps run per key (the kernel breakdown multiplies parts by these)."""
        self._k = scenario.engine.num_speculative_tokens()
        """Draft tokens per decoding request (0: no speculative decoding, steps priced as before)."""
        self._chunks_join_decodes = not self._k and one_token_chunks_decode(scenario.model, scenario.engine)
        """One-token chunks that sample are keyed as decodes (vLLM's MLA backends batch them so)."""
        config = scenario.engine.speculative_config
        self._ngram_s = NGRAM_LOOKUP_S_PER_REQUEST if config is not None and config.method == "ngram" else 0.0

    @property
    def worst_provenance(self) -> Provenance:
        """The least trusted provenance of any kernel this run priced."""
        return self.parts.worst_provenance

    def key(self, plan: StepPlan) -> StepKey:
        """With speculative decoding a decode is a verification of 1 + k tokens (k drafts); one whose
        drafts the token budget cut is keyed as a (1 + drafts)-token chunk that samples."""
        prefills: list[tuple[int, int, int]] = []
        num_decode = plan.num_bulk_decodes
        total_context = plan.bulk_decode_context_tokens
        k = self._k
        joins = self._chunks_join_decodes
        for c in plan.chunks:
            if c.num_new_tokens == 1 + k and c.num_draft_tokens == k and \
                    c.num_context_tokens >= c.request.prompt_tokens:  # c.is_decode() with all k drafts
                num_decode += 1
                total_context += c.num_context_tokens
            elif joins and c.num_new_tokens == 1 and c.samples and c.num_context_tokens >= 1:
                # The engine runs it with the decodes (`sim.graph.transformer.chunks_as_decodes`).
                num_decode += 1
                total_context += c.num_context_tokens
            else:
                # A verification cut to d drafts samples (verifies) all its 1 + d positions.
                prefills.append((c.num_new_tokens, c.num_context_tokens,
                                 c.num_new_tokens if c.num_draft_tokens else int(c.samples)))
        mean = 0
        if num_decode:
            mean = max(self._bucket, round(total_context / num_decode / self._bucket) * self._bucket)
        if len(prefills) > 1:
            prefills.sort()
        return tuple(prefills), num_decode, mean

    def decode_run(self, num_decode: int, context_tokens: int, now_s: float, max_steps: int, horizon_s: float,
                   max_time_s: float, *, price_ahead: bool = True) -> DecodeRun:
        """Consecutive decode-only steps of `num_decode` requests whose total context is
        `context_tokens` at the first and grows by `num_decode` per step, from `now_s`: at most
        `max_steps`, each ending before `horizon_s` and not after `max_time_s`.

        The steps' keys, seconds and end times are those `price` gives such plans, one after
        another (the end times are the same running float sums); keys are priced in step order up
        to the first step that ends at or past the horizon, as step-by-step pricing would. The
        work is a few array operations per call, whatever the number of steps. Nothing is counted
        in the breakdown until `count_run`.

        `price_ahead=False` prices at most the first step's key: the run stops before the next
        step whose key is not priced yet, so that a caller running steps ahead of other replicas
        prices each key when its first step starts, as the step-by-step loop does (the first part
        a run prices of each family is priced count by count; see `PartBook`).
        """
        bucket = self._bucket
        table = self._decode_tables.get(num_decode)
        if table is None:
            table = self._decode_tables[num_decode] = _DecodeTable(num_decode)
        b = table.buckets(context_tokens, max_steps, bucket)
        top = int(b[-1]) if max_steps else 0
        if top >= len(table.step_s):
            table.grow(top + 1)
        step_s = table.step_s
        d = step_s[b]
        now = (now_s,)
        n = max_steps
        if max_steps and np.isnan(step_s[int(b[0]):top + 1].sum()):
            while True:
                missing = np.isnan(d)
                if not missing.any():
                    break
                p = int(missing.argmax())
                if p and not price_ahead:
                    n = p
                    break
                if p:
                    ends = np.concatenate((now, d[:p])).cumsum()[1:]
                    if ends[-1] >= horizon_s or ends[-1] > max_time_s:
                        n = p  # the run ends before the first unpriced step: it is not priced here
                        break
                key: StepKey = ((), num_decode, int(b[p]) * bucket)
                cached = self._memo.get(key)
                seconds = self._memo[key] = self.step_s(key) if cached is None else cached
                step_s[b[p]] = seconds
                d[p:][b[p:] == b[p]] = seconds
        ends = np.concatenate((now, d[:n])).cumsum()[1:]
        k = n
        if n:
            last_s = float(ends[-1])
            if last_s >= horizon_s or last_s > max_time_s:
                k = min(int(ends.searchsorted(horizon_s, side="left")),
                        int(ends.searchsorted(max_time_s, side="right")))
        return DecodeRun(table, b, d, ends, k, now_s)

    def decode_steps(self, num_decode: int, context_tokens: int, now_s: float, max_steps: int, horizon_s: float,
                   max_time_s: float) -> tuple[list[tuple[StepKey, float, int]], list[float]]:
        """Consecutive decode-only steps of `num_decode` requests whose total context is
        `context_tokens` at the first and grows by `num_decode` per step, from `now_s`: at most
        `max_steps`, each ending before `horizon_s` and not after `max_time_s`.

        Returns (key, seconds, index of its first step) for each run of steps with one key (the
        bucketed mean context changes every few steps) and the end time of every step. Keys and
        seconds are those `price` gives such plans; nothing is counted in the breakdown. The same
        steps and pricing as `decode_run`, step by step in Python: cheaper for a few steps.
        """
        bucket, memo = self._bucket, self._memo
        groups: list[tuple[StepKey, float, int]] = []
        ends: list[float] = []
        last_mean = -1
        step_s = 0.0
        for j in range(max_steps):
            mean = max(bucket, round((context_tokens + j * num_decode) / num_decode / bucket) * bucket)
            if mean != last_mean:
                last_mean = mean
                key: StepKey = ((), num_decode, mean)
                cached = memo.get(key)
                step_s = memo[key] = self.step_s(key) if cached is None else cached
                groups.append((key, step_s, j))
            end_s = now_s + step_s
            if end_s >= horizon_s or end_s > max_time_s:
                break
            ends.append(end_s)
            now_s = end_s
        return groups, ends

    def group_decode_steps(self, shapes: Sequence[tuple[int, int]], now_s: float, max_steps: int, horizon_s: float,
                           max_time_s: float) -> tuple[list[tuple[GroupKey, float, int]], list[float]]:
        """`decode_steps` for a data-parallel group whose busy ranks run bulk decodes only: rank r
        has `shapes[r]` = (count, total context at the first step; it grows by the count per step).
        Returns (group key, seconds, index of its first step) for each run of steps with one key
        (a key changes when some rank's bucketed mean context does) and every step's end time:
        the keys and seconds `price` gives those group plans, step after step."""
        bucket, memo = self._bucket, self._memo
        groups: list[tuple[GroupKey, float, int]] = []
        ends: list[float] = []
        last: list[int] = []
        step_s = 0.0
        for j in range(max_steps):
            means = [max(bucket, round((c + j * n) / n / bucket) * bucket) for n, c in shapes]
            if means != last:
                last = means
                key = GroupKey(tuple(sorted(((), n, m) for (n, _), m in zip(shapes, means, strict=True))))
                cached = memo.get(key)
                step_s = memo[key] = self.step_s(key) if cached is None else cached
                groups.append((key, step_s, j))
            end_s = now_s + step_s
            if end_s >= horizon_s or end_s > max_time_s:
                break
            ends.append(end_s)
            now_s = end_s
        return groups, ends

    def run_key(self, run: DecodeRun, step: int) -> StepKey:
        """The key of step `step` of `run`."""
        return (), run.num_decode, int(run.bucket_idx[step]) * self._bucket

    def count_run(self, run: DecodeRun, num_steps: int) -> None:
        """Count the first `num_steps` steps of `run` in the breakdown (a key's first count keeps
        its place in `counts`, as `price` gives it)."""
        table, b = run.table, run.bucket_idx[:num_steps]
        counts = table.counts
        first, last = int(b[0]), int(b[-1])
        if first == last:
            counts[first] += num_steps
        else:
            counts[first:last + 1] += np.bincount(b - first, minlength=last - first + 1)
        seen = table.seen
        all_seen = bool(seen[first:last + 1].all())
        if not all_seen:
            bucket, n = self._bucket, table.num_decode
            for j in np.unique(b[~seen[b]]).tolist():
                key: StepKey = ((), n, j * bucket)
                if key not in self.counts:
                    self.counts[key] = 0
                seen[j] = True
        if self.first_s is not None:
            window = table.first_start[first:last + 1]
            # Every key of the run has a start already, none later than the run's first step:
            # nothing moves (a replica's later run, counted after other replicas' overlapping ones).
            if not (all_seen and run.start_s >= float(_max(window))):
                # The start of each key's first step in this run (the keys are first..last, in order).
                at = b.searchsorted(np.arange(first + 1, last + 1))
                np.minimum(window, np.concatenate(((run.start_s,), run.ends[at - 1])), out=window)

    def fold_runs(self) -> list[tuple[StepKey, float, int]]:
        """Move the steps counted by `count_run` into `counts`; returns (key, seconds, steps) of
        each key they held, for the caller's per-step tallies (inter-token latencies)."""
        out: list[tuple[StepKey, float, int]] = []
        bucket = self._bucket
        for n, table in self._decode_tables.items():
            nz = np.flatnonzero(table.counts)
            first_start = table.first_start[nz].tolist()
            for j, c, sec, start in zip(nz.tolist(), table.counts[nz].tolist(), table.step_s[nz].tolist(),
                                        first_start, strict=True):
                key: StepKey = ((), n, j * bucket)
                self.counts[key] += c
                out.append((key, sec, c))
                if self.first_s is not None and start < self.first_s.get(key, math.inf):
                    self.first_s[key] = start
            table.counts[:] = 0
        if self.first_s is not None:
            # Keys in the order of their first step's start (ties: the order they were counted).
            first_s = self.first_s
            items = list(self.counts.items())
            order = sorted(range(len(items)), key=lambda i: first_s[items[i][0]])
            self.counts = Counter(dict(items[i] for i in order))
        return out

    def group_key(self, plan: StepPlan) -> GroupKey:
        """Key of a data-parallel group's step (`plan.ranks`; see `sim.serving.dp_group`). A rank
        that runs bulk decodes only (most ranks of most steps) is keyed here, as `key` would."""
        bucket = self._bucket
        keys: list[StepKey] = []
        for p in plan.ranks:
            if p is None:
                continue
            if p.chunks:
                keys.append(self.key(p))
            elif n := p.num_bulk_decodes:
                keys.append(((), n, max(bucket, round(p.bulk_decode_context_tokens / n / bucket) * bucket)))
            else:
                keys.append(((), 0, 0))
        keys.sort()
        return GroupKey(tuple(keys))

    def price(self, plan: StepPlan) -> float:
        """Seconds the plan's step takes; counted in the breakdown."""
        key: AnyKey = self.group_key(plan) if plan.ranks else self.key(plan)
        counts = self.counts
        count = counts.get(key)  # (Counter's += calls __missing__ for a new key)
        if count is None:
            counts[key] = 1
            if self.first_s is not None:
                self.first_s[key] = self.clock_s
        else:
            counts[key] = count + 1
        step_s = self._memo.get(key)
        if step_s is None:
            step_s = self._memo[key] = self.step_s(key)
        return step_s

    def step_s(self, key: AnyKey) -> float:
        """Seconds of a step: its kernels (sum of the parts) and host overhead."""
        if isinstance(key, GroupKey):
            return self._group_step_s(key)
        if self._micro_batches > 1:
            return self._pipeline_step_s(key)
        step_s, parts, host = self._rank_step(key, None)
        self._key_parts[key] = (parts, host)
        return step_s

    def _pipeline_step_s(self, key: StepKey) -> float:
        """Seconds of a pipeline cycle (`sim.engine.micro_batches`): the longest of its slowest
        micro-batch's step through every stage, each stage's GPU running its share of every
        micro-batch (`_stage_seconds`: its layers, the embedding on the first stage, the final norm,
        LM head and sampler on the last, the hop into it), and each stage's host thread scheduling
        every micro-batch in turn and launching its own kernels of each. The breakdown keeps the
        slowest micro-batch's parts."""
        prefills, num_decode, mean = key
        memo = self._rank_steps
        micro = split_step(prefills, num_decode, self._micro_batches)
        assert micro, "a step key with neither prompt chunks nor decodes"
        priced: list[tuple[float, list[Part], HostCost]] = []
        stages = len(self._stage_shares)
        device = [0.0] * stages
        host = [0.0] * stages
        for chunks, n in micro:
            micro_key: StepKey = (chunks, n, mean if n else 0)
            one = memo.get((micro_key, None))
            if one is None:
                one = memo[(micro_key, None)] = self._rank_step(micro_key, None)
            priced.append(one)
            split = self._stage_memo.get(micro_key)
            if split is None:
                split = self._stage_memo[micro_key] = self._stage_seconds(one[1], one[2])
            for s, (d, h) in enumerate(zip(*split, strict=True)):
                device[s] += d
                host[s] += h
        slowest_s, parts, slowest_host = max(priced, key=lambda p: p[0])  # the first of equals
        self._key_parts[key] = (parts, slowest_host)
        return max(slowest_s, max(device), max(host))

    def _stage_seconds(self, parts: Sequence[Part], host: HostCost) -> tuple[list[float], list[float]]:
        """One micro-batch's seconds on each pipeline stage: GPU (its kernels, the embedding on the
        first stage, the final norm, LM head, logits gather and sampler on the last, each hop's
        send, receive and gather on the stage it enters, the layers' kernels and the eager-launch
        floor by the stage's share of the layers) and host thread (the step's scheduling and input
        work, which every stage's loop does, and its share of the launches)."""
        shares = self._stage_shares
        stages = len(shares)
        device = [0.0] * stages
        layered = host.launch_floor_s
        intra = inter = gather = 0.0
        for part in parts:
            for (_, name), seconds in zip(part.labels, part.seconds, strict=True):
                if name in _LAST_STAGE_KERNELS:
                    device[-1] += float(seconds)
                elif name in _FIRST_STAGE_KERNELS:
                    device[0] += float(seconds)
                elif name == "pp_send_recv":
                    intra += float(seconds)
                elif name == "pp_send_recv_internode":
                    inter += float(seconds)
                elif name == "pp_recv_all_gather":
                    gather += float(seconds)
                else:
                    layered += float(seconds)
        leave = self._hops_leave
        num_inter = sum(leave)
        num_intra = len(leave) - num_inter
        for s, crosses in enumerate(leave):
            device[s + 1] += (inter / num_inter if crosses else intra / num_intra) + gather / len(leave)
        for s, share in enumerate(shares):
            device[s] += layered * share
        return device, [host.cpu_s + host.launch_s * share for share in shares]

    def _group_step_s(self, key: GroupKey) -> float:
        """Seconds of a data-parallel group step: the slowest rank's.

        vLLM pads every rank's batch to the most tokens of any rank (`get_dp_padding`, so the
        ranks' CUDA graphs and MoE collectives line up): each rank runs the token part (GEMMs,
        norms, the MoE layers over DP x the padded count, the expert all-to-all of the padded
        count) at that count, and its own attention, sampling and host work. The all-to-all runs
        in low-latency mode only when no rank has a prefill. Ranks running dummy batches do the
        token part alone, never longer than a busy rank.
        """
        most = 0
        decode_only = True
        for prefills, num_decode, _ in key.ranks:
            tokens = num_decode * (1 + self._k) + sum(new for new, _, _ in prefills)  # verification: k + 1 each
            most = max(most, tokens)
            decode_only = decode_only and not prefills
        token_key = -most if self._decode_modes and decode_only else most
        slowest = -1.0
        memo = self._rank_steps
        for rank_key in key.ranks:
            priced = memo.get((rank_key, token_key))
            if priced is None:
                priced = memo[(rank_key, token_key)] = self._rank_step(rank_key, token_key)
            step_s, parts, host = priced
            if step_s > slowest:
                slowest, chosen = step_s, (parts, host)
        self._key_parts[key] = chosen
        return slowest

    def _rank_step(self, key: StepKey, token_key: int | None) -> tuple[float, list[Part], HostCost]:
        """Seconds, parts and host cost of one rank's step; `token_key` the token part to use
        (None: the step's own token count)."""
        prefills, num_decode, mean = key
        k = self._k
        num_tokens = num_sampled = num_decode * (1 + k)  # verification computes and samples k + 1 per decode
        num_seqs_sampling = num_decode
        for new, _, samples in prefills:
            num_tokens += new
            num_sampled += samples
            num_seqs_sampling += samples > 0
        if token_key is None:
            token_key = -num_tokens if self._decode_modes and not prefills else num_tokens
        if self._padded and abs(token_key) <= self._padded[-1]:
            size = self._padded[bisect.bisect_left(self._padded, abs(token_key))]
            token_key = -size if token_key < 0 else size
        book = self.parts
        parts = [book.token(token_key)]
        if num_sampled:
            parts.append(book.sampling(num_sampled))
        # Alike chunks (the key's chunks are sorted) are one attention launch over `count` prompts.
        i, n = 0, len(prefills)
        while i < n:
            j = i + 1
            while j < n and prefills[j] == prefills[i]:
                j += 1
            parts.append(book.prefill(prefills[i][0], prefills[i][1], j - i))
            i = j
        if num_decode and k:
            parts.append(book.spec(("verify", mean, 1 + k), num_decode))
        elif num_decode:
            parts.append(book.decode(num_decode, mean))
        if book.has_drafter:
            parts += book.draft(prefills, num_decode, mean, num_tokens, num_seqs_sampling,
                                decode_only=token_key < 0)
        gpu = comm = gap = 0.0
        launches = 0
        for p in parts:
            gpu += p.gpu_s
            comm += p.comm_s
            gap += p.short_kernel_gap_s
            launches += p.num_launches
        # A decode-only step's graph is chosen by its tokens: 1 + k per verifying decode.
        graph_tokens = n + num_decode * (1 + self._k)
        # `launches_eagerly(...)`, inlined (once per new key)
        if self._graph_mode:
            eager = self._uncaptured_eager and not (not prefills and graph_tokens <= self._capture_size)
        else:
            eager = self._eager_mode
        if not eager:
            launches, gap = 0, 0.0  # only eager launches cost per kernel
        # The host samples and processes outputs per request (a verification's k + 1 rows are one).
        host_key = (n + num_decode, num_seqs_sampling, not prefills, launches, gap)
        host = self._host_costs.get(host_key)
        if host is None:
            host = self._host_costs[host_key] = host_cost(
                params=self._host, mode=self._mode, num_seqs=host_key[0], num_sampled=num_seqs_sampling,
                is_decode_only=not prefills, max_cudagraph_capture_size=self._capture_size,
                num_launches=launches, num_layers=self._sc.model.num_layers, short_kernel_gap_s=gap,
                num_tokens=graph_tokens,
            )
            if self._ngram_s:
                host = self._host_costs[host_key] = replace(host, cpu_s=host.cpu_s + self._ngram_s * num_seqs_sampling)
        if self._async:  # `step_time_s(...)`, inlined
            return max(gpu + comm + host.launch_floor_s, host.cpu_s + host.launch_s), parts, host
        return step_time_s(device_s=gpu + comm, host=host, async_scheduling=False), parts, host

    def breakdown(self) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Seconds by kernel kind, by kernel name, host CPU, launch floor, summed over all steps."""
        key_parts = self._key_parts
        found = list(map(key_parts.get, self.counts))
        if None in found:  # keys counted but not priced here (in order, as they come)
            for key in self.counts:
                if key not in key_parts:
                    self.step_s(key)
            found = list(map(key_parts.__getitem__, self.counts))
        priced = cast(list[tuple[list[Part], HostCost]], found)
        part_lists = list(map(_first, priced))
        flat: list[Part] = list(chain.from_iterable(part_lists))
        sizes = list(map(len, part_lists))
        hosts: list[HostCost] = list(map(_second, priced))
        # Per distinct part (by identity, in order of first use) the steps of the keys holding it,
        # as the loop `count[part] += steps of key` over the keys in order gives them (exact integers).
        num_keys = len(sizes)
        steps = np.fromiter(self.counts.values(), dtype=np.int64, count=num_keys)
        ids = np.fromiter(map(id, flat), dtype=np.uint64, count=len(flat))
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        totals = np.bincount(inverse.reshape(-1), weights=np.repeat(steps, sizes), minlength=len(first))
        order = np.argsort(first, kind="stable")
        part_counts = zip([flat[i] for i in first[order].tolist()], totals[order].tolist(), strict=True)
        # Host and floor: the running sums over the keys in order (`cumsum` adds in turn).
        host = floor = 0.0
        if num_keys:
            weight = steps.astype(np.float64)
            cpu = np.fromiter(map(_cpu_s, hosts), dtype=np.float64, count=num_keys)
            cpu += np.fromiter(map(_launch_s, hosts), dtype=np.float64, count=num_keys)
            cpu *= weight
            host = float(np.concatenate(((0.0,), cpu)).cumsum()[-1])
            gaps = np.fromiter(map(_launch_floor_s, hosts), dtype=np.float64, count=num_keys)
            gaps *= weight
            floor = float(np.concatenate(((0.0,), gaps)).cumsum()[-1])
        # Parts with the same node labels (a block's, or alike parts) are summed as one matrix.
        by_labels: dict[tuple[tuple[str, str], ...], tuple[list[tuple[float, ...] | np.ndarray], list[float]]] = {}
        for part, count in part_counts:
            seconds, counts = by_labels.setdefault(part.labels, ([], []))
            seconds.append(part.seconds)
            counts.append(count)
        by_kind: dict[str, float] = {}
        by_name: dict[str, float] = {}
        for labels, (seconds, counts) in by_labels.items():
            totals = np.asarray(counts, dtype=float) @ np.asarray(seconds, dtype=float).reshape(len(seconds), -1)
            for (kind, name), total in zip(labels, totals.tolist(), strict=True):
                by_kind[kind] = by_kind.get(kind, 0.0) + total
                by_name[name] = by_name.get(name, 0.0) + total
        return by_kind, by_name, host, floor


def capture_ladder(max_capture_size: int) -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes up to `max_capture_size` (`_set_cudagraph_sizes`:
    1, 2, 4, then every 8 below 256, every 16 from 256; vLLM's largest graph is the last of them)."""
    return tuple(s for s in (1, 2, 4, *range(8, 256, 8), *range(256, max_capture_size + 1, 16))
                 if s <= max_capture_size)
