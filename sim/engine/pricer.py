"""Prices step plans: kernel graph + host overhead -> step wall time, memoized per instance.

Steps are keyed by their batch shape with decode contexts summarised as (count, mean context
rounded to `decode_context_bucket_tokens`): consecutive decode steps differ only by growing
contexts, so most steps hit the memo. A new key is priced from parts that are memoized on their
own, because a run has thousands of distinct keys but far fewer distinct parts: the token part,
the sampling part, one attention part per distinct prefill chunk and the decode attention part
(`sim.engine.step_parts` says what each holds). Kernels that differ only by name are priced once.
Accumulated per-key counts give the kernel breakdown of a run without touching per-kernel data in
the loop.

A part not seen before is priced with its family's block pricer when the efficiency model prices
columns (`sim.engine.block_pricing`: many counts in one vectorised call per kernel kind), else, and
where block pricing does not apply, count by count; a family's first count (a prefill family at
a nonzero context: its first `BLOCK_FROM_ASK - 1`) is priced alone too, through the same column
arithmetic, so the prices are the same bits either way. Priced parts live in a `PartPrices`
(`sim.engine.part_prices`), which a long-lived caller shares between runs of the same pricing
identity (`PriceCache`): the run's prices are the same either way.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final, NamedTuple

import numpy as np

from sim.engine.block_pricing import NodeList, Part, PartSource
from sim.engine.micro_batches import split_step
from sim.engine.part_prices import PartPrices
from sim.engine.step_parts import PartFamily
from sim.perf.host import HostCost, HostOverheadParams, host_cost, launches_eagerly, step_time_s
from sim.perf.step import StepCostModel
from sim.provenance import Provenance
from sim.serving.scheduler import StepPlan
from sim.specs.scenario import Scenario

StepKey = tuple[tuple[tuple[int, int, bool], ...], int, int]


class GroupKey(NamedTuple):
    """A data-parallel group step: the keys of the ranks that run a batch, sorted (their order
    does not change the price)."""

    ranks: tuple[StepKey, ...]


AnyKey = StepKey | GroupKey
_TOKEN: PartFamily = ("token",)
_DECODE_ONLY_TOKEN: PartFamily = ("token", "decode_only")
_SAMPLING: PartFamily = ("sampling",)
NGRAM_LOOKUP_S_PER_REQUEST = 10e-6
_Axis = tuple[PartFamily, int, int, int]
"""A family that holds a part: (family, the part's count in it, the family's top, the ask it is
block priced from; `StepPricer._part_in_families`)."""
_CONTEXT_STRIDE: Final = 32
"""Contexts of a prefill family along the context are counted in steps of this many tokens when
they fall on them (TensorRT-LLM's chunks end on 32-token KV blocks), else in single tokens."""
BLOCK_FROM_ASK: Final = 8
"""A prefill family at a nonzero context is block priced from the count it is asked for this many
times on (`_new_part`; other families from their second): such a family holds one or a few
prompts' chunks at one context (chunked prefill, a disaggregated decode pool's one-token prefills)
and is rarely asked for more than a few counts, while a template and a first window (~5 ms for an
MLA prefill family) cost about what pricing four or five counts alone does (~1.3 ms each). Token,
sampling, decode and fresh-prompt families are asked for many counts: blocks from the second."""
"""Host time of vLLM's ngram proposer per request per step (an assumption: a numba n-gram match over
the request's tokens; nothing in the data measures it). Added to the step's CPU time."""


class _DecodeTable:
    """Seconds (NaN: not priced yet) and uncounted bulk steps of decode-only steps of one batch
    size, by mean context in buckets (`mean // decode_context_bucket_tokens`)."""

    __slots__ = ("counts", "first_start", "num_decode", "seen", "step_s")

    def __init__(self, num_decode: int) -> None:
        self.num_decode = num_decode
        self.step_s = np.full(0, np.nan)
        self.counts = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros(0, dtype=bool)
        """Keys already in `StepPricer.counts`."""
        self.first_start = np.full(0, np.inf)
        """Start of the earliest step counted of each key (kept with `StepPricer.first_s`)."""

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
                 prices: PartPrices | None = None, micro_batches: int = 1) -> None:
        """`prices`: priced parts shared with other runs of the same pricing identity (from
        `PriceCache.prices`); None prices this run's parts afresh. `micro_batches` > 1: a step is
        that many pipeline micro-batches in flight, as long as the slowest of them
        (`sim.engine.micro_batches`)."""
        self._sc = scenario
        self._micro_batches = micro_batches
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
        self._token_parts: dict[int, Part] = {}
        """Token parts by count; negative counts key decode-only steps' parts (expert-parallel
        models: their all-to-all runs in low-latency mode)."""
        self._sampling_parts: dict[int, Part] = {}
        self._prefill_parts: dict[tuple[int, int, int], Part] = {}
        self._decode_parts: dict[tuple[int, int], Part] = {}
        self._host_costs: dict[tuple[int, int, bool, int, float], HostCost] = {}
        if prices is None:
            prices = PartPrices(scenario, cost, host.eager_launch_s, block_pricing=block_pricing)
        self._prices = prices
        self._nodes = prices.nodes
        # Only the expert all-to-all differs between decode-only steps and others (its mode).
        self._decode_modes = scenario.model.moe is not None and scenario.engine.expert_parallel_size() > 1
        self._mode = scenario.engine.effective_launch_mode()
        assert scenario.engine.max_cudagraph_capture_size is not None
        self._capture_size = scenario.engine.max_cudagraph_capture_size
        self._async = scenario.engine.async_scheduling
        self.first_s: dict[AnyKey, float] | None = None
        """When set (a caller that counts steps out of time order): the start of each key's first
        step, so that `fold_runs` puts `counts` in the order the step-by-step loop counts them."""
        self.clock_s = 0.0
        """The start of the step `price` prices (read only when `first_s` is set)."""
        self._decode_tables: dict[int, _DecodeTable] = {}
        """Decode-only steps run in bulk, by batch size (`decode_run`, `count_run`)."""
        self.counts: Counter[AnyKey] = Counter()
        """Steps run per key (the kernel breakdown multiplies parts by these)."""
        self.worst_provenance = Provenance.MEASURED
        self._blocks: dict[PartFamily, PartSource | None] | None = {} if prices.block_pricing else None
        """This run's block-priced families: the family's block pricer (None where it has none);
        absent while the family has been asked for too few counts (`_new_part`)."""
        self._asks: dict[PartFamily, int] = {}
        """Counts asked per family not yet block priced."""
        self._tops = (scenario.engine.max_num_batched_tokens,
                      min(scenario.engine.max_num_seqs or 0, scenario.engine.max_num_batched_tokens or 0))
        self._context_top = (scenario.engine.max_model_len or 0) // decode_context_bucket_tokens + 1
        """Mean-context buckets a decode family along the context prices (`_decode_part`)."""
        self._k = scenario.engine.num_speculative_tokens()
        """Draft tokens per decoding request (0: no speculative decoding, steps priced as before)."""
        self._draft = self._nodes.draft
        self._spec_parts: dict[tuple[PartFamily, int], Part] = {}
        config = scenario.engine.speculative_config
        self._ngram_s = NGRAM_LOOKUP_S_PER_REQUEST if config is not None and config.method == "ngram" else 0.0

    def key(self, plan: StepPlan) -> StepKey:
        """With speculative decoding a decode is a verification of 1 + k tokens (k drafts); one whose
        drafts the token budget cut is keyed as a (1 + drafts)-token chunk that samples."""
        prefills: list[tuple[int, int, bool]] = []
        num_decode = plan.num_bulk_decodes
        total_context = plan.bulk_decode_context_tokens
        k = self._k
        for c in plan.chunks:
            if c.num_new_tokens == 1 + k and c.num_draft_tokens == k and \
                    c.num_context_tokens >= c.request.prompt_tokens:  # c.is_decode() with all k drafts
                num_decode += 1
                total_context += c.num_context_tokens
            else:
                prefills.append((c.num_new_tokens, c.num_context_tokens, c.samples))
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
        a run prices of each family is priced count by count; see `_new_part`).
        """
        bucket = self._bucket
        x = np.arange(max_steps, dtype=np.float64)  # (context + j x count) / count / bucket, rounded as `key`
        x *= num_decode
        x += context_tokens
        x /= num_decode
        x /= bucket
        b = np.rint(x, out=x).astype(np.int64)
        if max_steps and b[0] < 1:
            b = np.maximum(b, 1)  # the mean context in buckets: max(bucket, round(...) * bucket)
        table = self._decode_tables.get(num_decode)
        if table is None:
            table = self._decode_tables[num_decode] = _DecodeTable(num_decode)
        top = int(b[-1]) if max_steps else 0
        if top >= len(table.step_s):
            table.grow(top + 1)
        step_s = table.step_s
        d = step_s[b]
        now = (now_s,)
        n = max_steps
        if max_steps and np.isnan(step_s[int(b[0]):top + 1]).any():
            while True:
                missing = np.isnan(d)
                if not missing.any():
                    break
                p = int(missing.argmax())
                if p and not price_ahead:
                    n = p
                    break
                if p:
                    ends = np.cumsum(np.concatenate((now, d[:p])))[1:]
                    if ends[-1] >= horizon_s or ends[-1] > max_time_s:
                        n = p  # the run ends before the first unpriced step: it is not priced here
                        break
                key: StepKey = ((), num_decode, int(b[p]) * bucket)
                cached = self._memo.get(key)
                seconds = self._memo[key] = self.step_s(key) if cached is None else cached
                step_s[b[p]] = seconds
                d[p:][b[p:] == b[p]] = seconds
        ends = np.cumsum(np.concatenate((now, d[:n])))[1:]
        k = n
        if n and (ends[-1] >= horizon_s or ends[-1] > max_time_s):
            k = min(int(np.searchsorted(ends, horizon_s, side="left")),
                    int(np.searchsorted(ends, max_time_s, side="right")))
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
        if not seen[first:last + 1].all():
            bucket, n = self._bucket, table.num_decode
            for j in np.unique(b[~seen[b]]).tolist():
                key: StepKey = ((), n, j * bucket)
                if key not in self.counts:
                    self.counts[key] = 0
                seen[j] = True
        if self.first_s is not None:
            # The start of each key's first step in this run (the keys are first..last, in order).
            at = np.searchsorted(b, np.arange(first + 1, last + 1))
            starts = np.concatenate(((run.start_s,), run.ends[at - 1]))
            np.minimum(table.first_start[first:last + 1], starts, out=table.first_start[first:last + 1])

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
        """Seconds of a pipeline cycle (`sim.engine.micro_batches`): its slowest micro-batch's step
        through every stage, and no less than the host work of all its micro-batches, which one
        scheduler thread does in turn. The breakdown keeps the slowest micro-batch's parts."""
        prefills, num_decode, mean = key
        memo = self._rank_steps
        micro = split_step(prefills, num_decode, self._micro_batches)
        assert micro, "a step key with neither prompt chunks nor decodes"
        priced: list[tuple[float, list[Part], HostCost]] = []
        for chunks, n in micro:
            micro_key: StepKey = (chunks, n, mean if n else 0)
            one = memo.get((micro_key, None))
            if one is None:
                one = memo[(micro_key, None)] = self._rank_step(micro_key, None)
            priced.append(one)
        slowest_s, parts, host = max(priced, key=lambda p: p[0])  # the first of equals
        self._key_parts[key] = (parts, host)
        return max(slowest_s, sum(h.cpu_s + h.launch_s for _, _, h in priced))

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
            num_seqs_sampling += samples
        if token_key is None:
            token_key = -num_tokens if self._decode_modes and not prefills else num_tokens
        part = self._token_parts.get(token_key) or self._token_part(token_key)
        parts = [part]
        if num_sampled:
            parts.append(self._sampling_parts.get(num_sampled) or self._sampling_part(num_sampled))
        # Alike chunks (the key's chunks are sorted) are one attention launch over `count` prompts.
        i, n = 0, len(prefills)
        while i < n:
            j = i + 1
            while j < n and prefills[j] == prefills[i]:
                j += 1
            parts.append(self._prefill_part(prefills[i][0], prefills[i][1], j - i))
            i = j
        if num_decode and k:
            parts.append(self._spec_part(("verify", mean, 1 + k), num_decode))
        elif num_decode:
            parts.append(self._decode_parts.get((num_decode, mean)) or self._decode_part(num_decode, mean))
        if self._draft is not None:
            parts += self._draft_parts(prefills, num_decode, mean, num_tokens, num_seqs_sampling)
        gpu = comm = gap = 0.0
        launches = 0
        for p in parts:
            gpu += p.gpu_s
            comm += p.comm_s
            gap += p.short_kernel_gap_s
            launches += p.num_launches
        if not launches_eagerly(params=self._host, mode=self._mode, is_decode_only=not prefills,
                                num_seqs=n + num_decode, max_cudagraph_capture_size=self._capture_size):
            launches, gap = 0, 0.0  # only eager launches cost per kernel
        # The host samples and processes outputs per request (a verification's k + 1 rows are one).
        host_key = (n + num_decode, num_seqs_sampling, not prefills, launches, gap)
        host = self._host_costs.get(host_key)
        if host is None:
            host = self._host_costs[host_key] = host_cost(
                params=self._host, mode=self._mode, num_seqs=host_key[0], num_sampled=num_seqs_sampling,
                is_decode_only=not prefills, max_cudagraph_capture_size=self._capture_size,
                num_launches=launches, num_layers=self._sc.model.num_layers, short_kernel_gap_s=gap,
            )
            if self._ngram_s:
                host = self._host_costs[host_key] = replace(host, cpu_s=host.cpu_s + self._ngram_s * num_seqs_sampling)
        return step_time_s(device_s=gpu + comm, host=host, async_scheduling=self._async), parts, host

    # -- parts ---------------------------------------------------------------------------------
    def _draft_parts(self, prefills: tuple[tuple[int, int, bool], ...], num_decode: int, mean: int,
                     num_tokens: int, num_seqs_sampling: int) -> list[Part]:
        """The drafter's kernels in a step (vLLM's EAGLE / MTP / draft-model proposers): a first pass
        over every token the target computed (it fills the draft's KV cache; prompt chunks attend as
        prefills, verifications with their k + 1 queries) that samples one draft token per request
        that sampled, then k - 1 passes of one token per such request at the decodes' mean context."""
        k, draft = self._k, self._draft
        assert draft is not None
        parts = [self._spec_part(("draft", "token"), num_tokens, draft.token)]
        for chunk in sorted(set(prefills)):
            new, context, count = chunk[0], chunk[1], prefills.count(chunk)

            def prefill(n: int, c: int = context, m: int = count) -> NodeList:
                assert draft is not None
                return draft.prefill(n, c, m)
            parts.append(self._spec_part(("draft", "prefill", context, count), new, prefill))
        if num_decode:
            parts.append(self._spec_part(("draft", "verify", mean, 1 + k), num_decode,
                                         lambda n: draft.verify(n, mean, 1 + k)))
        s = num_seqs_sampling
        if s:
            sampling = self._spec_part(("draft", "sampling"), s, draft.sampling)
            parts.append(sampling)
            if k > 1:
                context = mean if num_decode else max(self._bucket, round(max(
                    new + ctx for new, ctx, samples in prefills if samples) / self._bucket) * self._bucket)
                token = self._spec_part(("draft", "pass_token"), s, draft.pass_token)
                attention = self._spec_part(("draft", "decode", context), s, lambda n: draft.decode(n, context))
                parts += [token, attention, sampling] * (k - 1)  # the same parts k - 1 times
        return parts

    def _spec_part(self, family: PartFamily, n: int, build: Callable[[int], NodeList] | None = None) -> Part:
        """A part of the speculative families (target verification, drafter), memoized per run."""
        part = self._spec_parts.get((family, n))
        if part is None:
            if build is None:
                nodes = self._nodes
                mean, q = int(family[1]), int(family[2])  # type: ignore[call-overload]
                build = lambda m: nodes.verify(m, mean, q)  # noqa: E731
            part = self._spec_parts[(family, n)] = self._new_part(family, n, build)
        return part

    def _new_part(self, family: PartFamily, n: int, build: Callable[[int], NodeList]) -> Part:
        """The part of count `n` of `family`, first asked for in this run: alone (its nodes built and
        priced) for the family's first count (a prefill family at a nonzero context: its first
        `BLOCK_FROM_ASK - 1`), by block pricing from then on (the two give the same bits when the
        kernel model prices columns: `PartPrices.priced`). Families asked for a few times (a
        prompt's chunks at one context, a decode pool's one-token prefills at a new context) never
        pay for a template and a window of counts they do not use."""
        kind, *rest = family[1:] if family[0] == "draft" else family
        from_ask = BLOCK_FROM_ASK if kind == "prefill" and rest[0] != 0 else 2
        top = (self._tops[0] if kind in ("token", "prefill") else self._tops[1]) or 0
        return self._part_in_families([(family, n, top, from_ask)], n, build)

    def _token_part(self, token_key: int) -> Part:
        part = self._token_parts.get(token_key)
        if part is None:
            if token_key < 0:
                part = self._new_part(_DECODE_ONLY_TOKEN, -token_key, self._nodes.decode_only_token)
            else:
                part = self._new_part(_TOKEN, token_key, self._nodes.token)
            self._token_parts[token_key] = part
        return part

    def _sampling_part(self, num_sampled: int) -> Part:
        part = self._sampling_parts.get(num_sampled)
        if part is None:
            part = self._sampling_parts[num_sampled] = self._new_part(_SAMPLING, num_sampled, self._nodes.sampling)
        return part

    def _prefill_part(self, new_tokens: int, context_tokens: int, count: int) -> Part:
        """A prompt chunk's attention: one family per context indexed by the chunk's new tokens
        (`("prefill", context, count)`), and, at a nonzero context, one per chunk size indexed by the
        context in steps of `stride` tokens (`("prefill_at", new, count, stride)`: an offline run's
        chunks take what the decodes leave of the token budget, so one chunk size recurs at many
        contexts; TensorRT-LLM's contexts fall on 32-token KV blocks). `_part_in_families` picks."""
        key = (new_tokens, context_tokens, count)
        part = self._prefill_parts.get(key)
        if part is None:
            nodes = self._nodes
            family = ("prefill", context_tokens, count)
            build = lambda n: nodes.prefill(n, context_tokens, count)  # noqa: E731
            if context_tokens == 0:
                part = self._new_part(family, new_tokens, build)
            else:
                stride = _CONTEXT_STRIDE if context_tokens % _CONTEXT_STRIDE == 0 else 1
                part = self._part_in_families(
                    [(family, new_tokens, self._tops[0] or 0, BLOCK_FROM_ASK),
                     (("prefill_at", new_tokens, count, stride), context_tokens // stride,
                      (self._sc.engine.max_model_len or 0) // stride, BLOCK_FROM_ASK)],
                    new_tokens, build)
            self._prefill_parts[key] = part
        return part

    def _decode_part(self, num_decode: int, mean_context_tokens: int) -> Part:
        """The decode attention part, block priced along whichever of its two axes the run moves on
        (`_part_in_families`): one family per mean-context bucket indexed by the batch size
        (`("decode", mean)`), or one per batch size indexed by the bucket (`("decode_at", batch,
        bucket_tokens)`). A Poisson run's batch moves while its mean context holds; a closed loop or
        an offline run keeps its batch while the mean context sweeps its range."""
        key = (num_decode, mean_context_tokens)
        part = self._decode_parts.get(key)
        if part is None:
            mean = mean_context_tokens
            nodes = self._nodes
            axes: list[_Axis] = [(("decode", mean), num_decode, self._tops[1] or 0, 2)]
            if mean % self._bucket == 0:
                axes.append((("decode_at", num_decode, self._bucket), mean // self._bucket, self._context_top, 2))
            part = self._decode_parts[key] = self._part_in_families(
                axes, num_decode, lambda n: nodes.decode(n, mean))
        return part

    def _part_in_families(self, axes: Sequence[_Axis], n: int, build: Callable[[int], NodeList]) -> Part:
        """A part that one or two families hold (`axes`: (family, its count for this part, the family's
        top, the ask from which it is block priced), the first the family the part is priced alone
        in at count `n`): priced by the first family that has a block pricer, else an ask is counted
        in each family in turn until one is asked often enough to get a block pricer; else alone. Block
        and alone prices are the same bits (`PartPrices.priced`), so the family a part is priced in never
        changes it; a family whose fields are no polynomial of its count (a sliding window along
        the context) gets no template and leaves its parts to the other."""
        part = None
        blocks = self._blocks
        if blocks is not None:
            for family, count, _, _ in axes:
                pricer = blocks.get(family)
                part = pricer.part(count) if pricer is not None else None
                if part is not None:
                    break
            else:
                for family, count, top, from_ask in axes:
                    if family in blocks:
                        continue  # priced by it already, or it has no block pricer
                    asks = self._asks[family] = self._asks.get(family, 0) + 1
                    if asks >= from_ask:
                        pricer = blocks[family] = self._prices.block_pricer(family, top)
                        part = pricer.part(count) if pricer is not None else None
                        if part is not None:
                            break
        if part is None:
            part = self._prices.alone_part(axes[0][0], n, build)
        if part.worst_provenance > self.worst_provenance:
            self.worst_provenance = part.worst_provenance
        return part

    def breakdown(self) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Seconds by kernel kind, by kernel name, host CPU, launch floor, summed over all steps."""
        part_counts: dict[int, tuple[Part, int]] = {}
        host = floor = 0.0
        key_parts = self._key_parts
        for key, count in self.counts.items():
            priced = key_parts.get(key)
            if priced is None:
                self.step_s(key)
                priced = key_parts[key]
            parts, hc = priced
            for part in parts:
                seen = part_counts.get(id(part))
                part_counts[id(part)] = (part, count if seen is None else seen[1] + count)
            host += (hc.cpu_s + hc.launch_s) * count
            floor += hc.launch_floor_s * count
        # Parts with the same node labels (a block's, or alike parts) are summed as one matrix.
        by_labels: dict[tuple[tuple[str, str], ...], tuple[list[tuple[float, ...] | np.ndarray], list[int]]] = {}
        for part, count in part_counts.values():
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
