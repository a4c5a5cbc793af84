"""Prices step plans: kernel graph + host overhead -> step wall time, memoized per instance.

Steps are keyed by their batch shape with decode contexts summarised as (count, mean context
rounded to `decode_context_bucket_tokens`): consecutive decode steps differ only by growing
contexts, so most steps hit the memo. A new key is priced from parts that are memoized on their
own, because a run has thousands of distinct keys but far fewer distinct parts:

- the token part: every kernel whose work depends only on the step's token count (embedding,
  norms, projections, MLP or MoE, collectives);
- the sampling part: the kernels of sampled tokens only (LM head, logits gather, sampler);
- one attention part per distinct prefill chunk (new tokens, context, how many alike);
- the decode attention part (count, mean context).

The parts are exactly the nodes `build_step_graph` gives for the key's batch (tests compare the
two), and kernels that differ only by name are priced once. Accumulated per-key counts give the
kernel breakdown of a run without touching per-kernel data in the loop.

Block pricing (when the efficiency model prices columns, `ColumnEfficiencyModel`). Each part
family is indexed by one count: the token part by the token count, the sampling part by the
sampled count, a prefill part by its new tokens (for one context and multiplicity), a decode part
by its decode count (for one mean context). From the second part of a family not seen before, a
miss prices every unpriced count of an aligned window around it (128 counts first, then as wide
as the counts the family has priced, so short runs price little and long runs make few calls) in
one vectorised kernel-model call per kernel kind, and keeps them. The kernel fields of these
parts are polynomials of degree <= 2 in the count (GEMM m, pointwise tokens, collective bytes and
decode batch are linear; prefill attention FLOPs quadratic): their columns come from the nodes at
counts 1, 2 and 3, after an exact check against the real nodes at enough other counts to rule
out a second piece (`_PolynomialNodes.checks`). A family that fails the check is priced count by
count (MoE: expected experts hit), or, for prefill attention with a sliding window, with nodes
built per count and the kernel model vectorised. Prices equal count-by-count pricing to float
rounding (tests compare them, per step and in the breakdown).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelWork
from sim.graph.moe import as_decode_only
from sim.graph.transformer import (
    build_step_graph,
    decode_attention_nodes,
    is_attention_work,
    prefill_attention_nodes,
)
from sim.perf.efficiency import KernelColumns
from sim.perf.host import HostCost, HostOverheadParams, host_cost, step_time_s
from sim.perf.step import StepCostModel
from sim.provenance import Provenance
from sim.serving.scheduler import StepPlan
from sim.specs.scenario import Scenario

StepKey = tuple[tuple[tuple[int, int, bool], ...], int, int]
_WorkSignature = tuple[object, ...]
_NodeList = list[tuple[KernelWork, int]]
_FLOAT_FIELDS = tuple(f.name for f in fields(KernelWork) if f.type == "float")
_MIN_BLOCK = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class _Part:
    """Priced kernel nodes of one part of a step."""

    labels: tuple[tuple[str, str], ...]
    """(kind, name) per node (one tuple shared by the parts of a block)."""
    seconds: tuple[float, ...] | np.ndarray
    """Seconds of each node in the step (launch time x repeat)."""
    gpu_s: float
    comm_s: float
    num_launches: int
    short_kernel_gap_s: float
    """Sum over launches of max(0, eager launch cost - kernel time)."""
    worst_provenance: Provenance


class _Template:
    """The kernel nodes of a part as a function of a count n >= 1: node labels and repeats (the
    same for every n), distinct kernel rows, and the rows' columns at many counts."""

    def __init__(self, first: _NodeList) -> None:
        self.nodes = [(w.kind, w.name, w.dtype, w.group_size, len(w.shape), r) for w, r in first]
        self.row_of: list[int] = list(range(len(first)))
        self.num_rows = len(first)

    def groups(self) -> list[list[int]]:
        """Rows by (kind, dtype, group size, shape length): one kernel-model call each."""
        out: dict[tuple[object, ...], list[int]] = {}
        for (kind, _, dtype, group, ndim, _), row in zip(self.nodes, self.row_of, strict=True):
            rows = out.setdefault((kind, dtype, group, ndim), [])
            if row not in rows:
                rows.append(row)
        return list(out.values())

    def same_nodes(self, nodes: _NodeList) -> bool:
        return [(w.kind, w.name, w.dtype, w.group_size, len(w.shape), r) for w, r in nodes] == self.nodes

    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        """Columns of `rows` (one kind, dtype, group) at counts `ns`, row after row."""
        raise NotImplementedError


class _BuiltNodes(_Template):
    """Nodes built for every count (exact for any shape function; a Python object per kernel)."""

    def __init__(self, build: Callable[[int], _NodeList]) -> None:
        super().__init__(build(1))
        self._build = build

    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        built = [self._build(n) for n in ns.tolist()]
        assert all(self.same_nodes(nodes) for nodes in built)
        return KernelColumns.of([nodes[r][0] for r in rows for nodes in built])


class _PolynomialNodes(_Template):
    """Nodes whose every numeric field is a polynomial of degree <= 2 in the count n, in Newton
    form f(1) + d1 k + d2 k (k - 1) / 2 with k = n - 1 (d1, d2 the differences at counts 1, 2, 3),
    evaluated exactly: the fields are integer-valued floats. Columns without building nodes per
    count."""

    def __init__(self, one: _NodeList, two: _NodeList, three: _NodeList) -> None:
        super().__init__(one)
        rows: dict[tuple[object, ...], int] = {}
        self.row_of = []
        self.coef: list[tuple[list[tuple[float, float, float]], list[tuple[int, int, int]]]] = []
        for (w1, _), (w2, _), (w3, _) in zip(one, two, three, strict=True):
            f1, f2, f3 = ([getattr(w, f) for f in _FLOAT_FIELDS] for w in (w1, w2, w3))
            floats = [(a, b - a, c - 2.0 * b + a) for a, b, c in zip(f1, f2, f3, strict=True)]
            shape = [(a, b - a, c - 2 * b + a) for a, b, c in zip(w1.shape, w2.shape, w3.shape, strict=True)]
            # Kernels alike but for the name are one row (priced once, as `_by_signature` does).
            sig = (w1.kind, w1.dtype, w1.group_size, tuple(floats), tuple(shape))
            if sig not in rows:
                rows[sig] = len(self.coef)
                self.coef.append((floats, shape))
            self.row_of.append(rows[sig])
        self.num_rows = len(self.coef)

    @staticmethod
    def checks(top: int) -> list[int]:
        """Counts where the form is checked: powers of two, the top three and a few others.

        A field that is one polynomial of degree <= 2 on either side of one breakpoint (prefill
        attention: full below the window, capped above) and matches the form at all of them is
        that polynomial everywhere in 1..top: the side above the breakpoint holds at least three
        of these counts.
        """
        points = {top - 2, top - 1, top, 5, 17, 100, 1000}
        k = 4
        while k <= top:
            points.add(k)
            k *= 2
        return sorted(c for c in points if 3 < c <= top)

    @staticmethod
    def of(build: Callable[[int], _NodeList], top: int) -> _PolynomialNodes | None:
        """The form of `build` on counts 1..top, or None if `build(n)` departs from it at any check."""
        one, two, three = build(1), build(2), build(3)
        poly = _PolynomialNodes(one, two, three)
        if not (poly.same_nodes(two) and poly.same_nodes(three)):
            return None
        for n in _PolynomialNodes.checks(top):
            real = build(n)
            if not poly.same_nodes(real):
                return None
            k, tri = n - 1, (n - 1) * (n - 2) // 2
            for (work, _), row in zip(real, poly.row_of, strict=True):
                floats, shape = poly.coef[row]
                if [getattr(work, f) for f in _FLOAT_FIELDS] != [a + d1 * k + d2 * tri for a, d1, d2 in floats]:
                    return None
                if list(work.shape) != [a + d1 * k + d2 * tri for a, d1, d2 in shape]:
                    return None
        return poly

    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        kind, _, dtype, group, _, _ = self.nodes[self.row_of.index(rows[0])]
        k = ns - 1
        tri = k * (k - 1) // 2
        kf, trif = k.astype(float), tri.astype(float)
        floats = [np.concatenate([a + d1 * kf + d2 * trif for a, d1, d2 in (self.coef[r][0][i] for r in rows)])
                  for i in range(len(_FLOAT_FIELDS))]
        ndim = len(self.coef[rows[0]][1])
        shape = tuple(np.concatenate([a + d1 * k + d2 * tri for a, d1, d2 in (self.coef[r][1][i] for r in rows)])
                      for i in range(ndim))
        by_name = dict(zip(_FLOAT_FIELDS, floats, strict=True))
        return KernelColumns(kind=kind, dtype=dtype, group_size=group, shape=shape, **by_name)


@dataclass(slots=True)
class _Block:
    """Parts of several counts priced at once; `_Part`s are made on first use."""

    seconds: np.ndarray
    """Per node, seconds in the step (launch time x repeat) at each count."""
    gpu_s: np.ndarray
    comm_s: np.ndarray
    short_kernel_gap_s: np.ndarray
    worst: np.ndarray


class _BlockPricer:
    """Parts of counts 1..`max_count` priced in windows (see the module docstring)."""

    def __init__(self, template: Callable[[], _Template | None], cost: StepCostModel, eager_launch_s: float,
                 max_count: int) -> None:
        self._make_template = template
        self._template: _Template | None = None
        self._cost = cost
        self._eager = eager_launch_s
        self._max = max_count
        self._where: dict[int, tuple[_Block, int]] = {}
        self._misses = 0
        self._labels: tuple[tuple[str, str], ...] = ()
        self._launches = 0

    def part(self, n: int) -> _Part | None:
        """The part of count `n`, or None where the caller prices it alone: outside 1..max_count,
        on the first miss (a part asked for once needs no window), or when no template applies."""
        at = self._where.get(n)
        if at is None:
            self._misses += 1
            if not 1 <= n <= self._max or self._misses == 1:
                return None
            if self._template is None:
                self._template = self._make_template()
                if self._template is None:
                    self._max = 0
                    return None
                self._labels = tuple((node[0].value, node[1]) for node in self._template.nodes)
                self._launches = sum(node[-1] for node in self._template.nodes)
            self._price_window(n)
            at = self._where[n]
        block, j = at
        return _Part(labels=self._labels, seconds=block.seconds[:, j], gpu_s=float(block.gpu_s[j]),
                     comm_s=float(block.comm_s[j]), num_launches=self._launches,
                     short_kernel_gap_s=float(block.short_kernel_gap_s[j]),
                     worst_provenance=Provenance(int(block.worst[j])))

    def _price_window(self, n: int) -> None:
        size = _MIN_BLOCK
        while size < len(self._where):
            size *= 2
        lo = (n - 1) // size * size + 1
        ns = np.array([m for m in range(lo, min(lo + size, self._max + 1)) if m not in self._where], dtype=np.int64)
        template = self._template
        assert template is not None
        times = np.empty((template.num_rows, len(ns)))
        provs = np.empty((template.num_rows, len(ns)), dtype=np.int64)
        for rows in template.groups():
            t, p = self._cost.estimate_columns(template.columns(rows, ns))
            times[rows] = t.reshape(len(rows), len(ns))
            provs[rows] = p.reshape(len(rows), len(ns))
        seconds = np.empty((len(template.nodes), len(ns)))
        gpu, comm, gap = np.zeros(len(ns)), np.zeros(len(ns)), np.zeros(len(ns))
        worst = np.full(len(ns), int(Provenance.MEASURED), dtype=np.int64)
        # The sums run over the nodes in order, as `StepPricer._priced` adds them.
        for i, ((kind, *_, repeat), row) in enumerate(zip(template.nodes, template.row_of, strict=True)):
            time_s = times[row]
            sec = seconds[i] = time_s * repeat
            if kind.is_collective():
                comm += sec
            else:
                gpu += sec
            gap += np.maximum(0.0, self._eager - time_s) * repeat
            np.maximum(worst, provs[row], out=worst)
        block = _Block(seconds=seconds, gpu_s=gpu, comm_s=comm, short_kernel_gap_s=gap, worst=worst)
        for j, m in enumerate(ns.tolist()):
            self._where[m] = (block, j)


class _Nodes:
    """The kernel nodes of each kind of part, from the scenario alone (no reference back to the
    pricer, so the pricer's memos are freed by reference counting)."""

    def __init__(self, scenario: Scenario) -> None:
        self._sc = scenario

    def non_attention(self, num_tokens: int, num_sampled: int) -> _NodeList:
        """Kernels other than attention of any batch with these token and sampled counts."""
        prefills: tuple[PrefillChunk, ...] = ()
        if num_tokens > num_sampled:
            prefills = (PrefillChunk(new_tokens=num_tokens - num_sampled, samples=False),)
        batch = BatchShape(prefills=prefills, decode_context_tokens=(1,) * num_sampled)
        sc = self._sc
        graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch)
        return [(n.work, n.repeat) for n in graph.nodes if not is_attention_work(n.work)]

    def token(self, num_tokens: int, decode_only: bool = False) -> _NodeList:
        """Kernels of any batch of `num_tokens` tokens; a decode-only step launches the expert
        all-to-all in low-latency mode."""
        nodes = self.non_attention(num_tokens, 0)
        return [(as_decode_only(w), r) for w, r in nodes] if decode_only else nodes

    def sampling(self, num_sampled: int) -> _NodeList:
        """The kernels a batch gains when `num_sampled` of its tokens are sampled."""
        unsampled = Counter(self.token(num_sampled, decode_only=True))
        return [node for node in self.non_attention(num_sampled, num_sampled) if unsampled[node] == 0]

    def prefill(self, new_tokens: int, context_tokens: int, count: int) -> _NodeList:
        sc = self._sc
        return prefill_attention_nodes(sc.model, sc.engine, sc.precision, sc.hardware, new_tokens=new_tokens,
                                       context_tokens=context_tokens, count=count)

    def decode(self, num_decode: int, mean_context_tokens: int) -> _NodeList:
        sc = self._sc
        return decode_attention_nodes(sc.model, sc.engine, sc.precision, (mean_context_tokens,) * num_decode)


class StepPricer:
    def __init__(self, scenario: Scenario, cost: StepCostModel, host: HostOverheadParams,
                 decode_context_bucket_tokens: int = 16, *, block_pricing: bool = True) -> None:
        self._sc = scenario
        self._cost = cost
        self._host = host
        self._bucket = decode_context_bucket_tokens
        self._memo: dict[StepKey, float] = {}
        """Step seconds per key (no more entries than `counts`)."""
        self._key_parts: dict[StepKey, tuple[list[_Part], HostCost]] = {}
        """Parts and host cost of each key priced (for the breakdown)."""
        self._token_parts: dict[tuple[int, bool], _Part] = {}
        self._sampling_parts: dict[int, _Part] = {}
        self._prefill_parts: dict[tuple[int, int, int], _Part] = {}
        self._decode_parts: dict[tuple[int, int], _Part] = {}
        self._host_costs: dict[tuple[int, int, bool, int, float], HostCost] = {}
        self._by_signature: dict[_WorkSignature, tuple[float, Provenance]] = {}
        self._nodes = _Nodes(scenario)
        # Only the expert all-to-all differs between decode-only steps and others (its mode).
        self._decode_modes = scenario.model.moe is not None and scenario.engine.expert_parallel_size() > 1
        self._mode = scenario.engine.effective_launch_mode()
        assert scenario.engine.max_cudagraph_capture_size is not None
        self._capture_size = scenario.engine.max_cudagraph_capture_size
        self._async = scenario.engine.async_scheduling
        self.counts: Counter[StepKey] = Counter()
        """Steps run per key (the kernel breakdown multiplies parts by these)."""
        self.worst_provenance = Provenance.MEASURED
        self._blocks: dict[tuple[object, ...], _BlockPricer] | None = (
            {} if block_pricing and cost.prices_columns() else None)

    def key(self, plan: StepPlan) -> StepKey:
        prefills: list[tuple[int, int, bool]] = []
        num_decode = plan.num_bulk_decodes
        total_context = plan.bulk_decode_context_tokens
        for c in plan.chunks:
            if c.is_decode():
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
                   max_time_s: float) -> tuple[list[tuple[StepKey, float, int]], list[float]]:
        """Consecutive decode-only steps of `num_decode` requests whose total context is
        `context_tokens` at the first and grows by `num_decode` per step, from `now_s`: at most
        `max_steps`, each ending before `horizon_s` and not after `max_time_s`.

        Returns (key, seconds, index of its first step) for each run of steps with one key (the
        bucketed mean context changes every few steps) and the end time of every step. Keys and
        seconds are those `price` gives such plans; nothing is counted in the breakdown.
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

    def price(self, plan: StepPlan) -> float:
        """Seconds the plan's step takes; counted in the breakdown."""
        key = self.key(plan)
        self.counts[key] += 1
        step_s = self._memo.get(key)
        if step_s is None:
            step_s = self._memo[key] = self.step_s(key)
        return step_s

    def step_s(self, key: StepKey) -> float:
        """Seconds of a step: its kernels (sum of the parts) and host overhead."""
        parts = self._parts(key)
        gpu = comm = gap = 0.0
        launches = 0
        for p in parts:
            gpu += p.gpu_s
            comm += p.comm_s
            gap += p.short_kernel_gap_s
            launches += p.num_launches
        host = self._host_cost(key, launches, gap)
        self._key_parts[key] = (parts, host)
        return step_time_s(device_s=gpu + comm, host=host, async_scheduling=self._async)

    def _parts(self, key: StepKey) -> list[_Part]:
        prefills, num_decode, mean = key
        num_tokens = num_sampled = num_decode
        for new, _, samples in prefills:
            num_tokens += new
            num_sampled += samples
        parts = [self._token_part(num_tokens, self._decode_modes and not prefills)]
        if num_sampled:
            parts.append(self._sampling_part(num_sampled))
        # Alike chunks (the key's chunks are sorted) are one attention launch over `count` prompts.
        i, n = 0, len(prefills)
        while i < n:
            j = i + 1
            while j < n and prefills[j] == prefills[i]:
                j += 1
            parts.append(self._prefill_part(prefills[i][0], prefills[i][1], j - i))
            i = j
        if num_decode:
            parts.append(self._decode_part(num_decode, mean))
        return parts

    def _host_cost(self, key: StepKey, num_launches: int, short_kernel_gap_s: float) -> HostCost:
        prefills, num_decode, _ = key
        num_sampled = num_decode + sum(1 for _, _, s in prefills if s)
        if self._mode != "eager":
            num_launches, short_kernel_gap_s = 0, 0.0  # only eager launches cost per kernel
        host_key = (len(prefills) + num_decode, num_sampled, not prefills, num_launches, short_kernel_gap_s)
        host = self._host_costs.get(host_key)
        if host is None:
            host = self._host_costs[host_key] = host_cost(
                params=self._host, mode=self._mode, num_seqs=host_key[0], num_sampled=num_sampled,
                is_decode_only=not prefills, max_cudagraph_capture_size=self._capture_size,
                num_launches=num_launches, num_layers=self._sc.model.num_layers,
                short_kernel_gap_s=short_kernel_gap_s,
            )
        return host

    # -- parts ---------------------------------------------------------------------------------
    def _block_part(self, which: tuple[object, ...], n: int) -> _Part | None:
        """The part of count `n` of the part family `which` from block pricing, or None where it
        does not apply (the caller prices the part alone)."""
        if self._blocks is None:
            return None
        pricer = self._blocks.get(which)
        if pricer is None:
            pricer = self._blocks[which] = self._block_pricer(which)
        part = pricer.part(n)
        if part is not None:
            self.worst_provenance = max(self.worst_provenance, part.worst_provenance)
        return part

    def _block_pricer(self, which: tuple[object, ...]) -> _BlockPricer:
        engine = self._sc.engine
        assert engine.max_num_batched_tokens is not None and engine.max_num_seqs is not None
        max_tokens, max_seqs = engine.max_num_batched_tokens, min(engine.max_num_seqs, engine.max_num_batched_tokens)

        def polynomial(build: Callable[[int], _NodeList], top: int, fallback: bool = False
                       ) -> Callable[[], _Template | None]:
            def make() -> _Template | None:
                poly = _PolynomialNodes.of(build, top)
                return poly if poly is not None or not fallback else _BuiltNodes(build)
            return make

        kind, nodes, eager = which[0], self._nodes, self._host.eager_launch_s
        if kind == "token":
            decode_only = len(which) > 1
            return _BlockPricer(polynomial(lambda n: nodes.token(n, decode_only), max_tokens), self._cost, eager,
                                max_tokens)
        if kind == "sampling":
            return _BlockPricer(polynomial(nodes.sampling, max_seqs), self._cost, eager, max_seqs)
        if kind == "decode":
            mean = int(which[1])  # type: ignore[call-overload]
            return _BlockPricer(polynomial(lambda n: nodes.decode(n, mean), max_seqs), self._cost, eager, max_seqs)
        assert kind == "prefill"
        context, count = int(which[1]), int(which[2])  # type: ignore[call-overload]
        # Prefill attention is quadratic in the chunk; with a window, piecewise (then built per count).
        return _BlockPricer(polynomial(lambda n: nodes.prefill(n, context, count), max_tokens, fallback=True),
                            self._cost, eager, max_tokens)

    def _token_part(self, num_tokens: int, decode_only: bool) -> _Part:
        part = self._token_parts.get((num_tokens, decode_only))
        if part is None:
            part = (self._block_part(("token", "decode_only") if decode_only else ("token",), num_tokens)
                    or self._priced(self._nodes.token(num_tokens, decode_only)))
            self._token_parts[(num_tokens, decode_only)] = part
        return part

    def _sampling_part(self, num_sampled: int) -> _Part:
        part = self._sampling_parts.get(num_sampled)
        if part is None:
            part = (self._block_part(("sampling",), num_sampled)
                    or self._priced(self._nodes.sampling(num_sampled)))
            self._sampling_parts[num_sampled] = part
        return part

    def _prefill_part(self, new_tokens: int, context_tokens: int, count: int) -> _Part:
        key = (new_tokens, context_tokens, count)
        part = self._prefill_parts.get(key)
        if part is None:
            part = (self._block_part(("prefill", context_tokens, count), new_tokens)
                    or self._priced(self._nodes.prefill(new_tokens, context_tokens, count)))
            self._prefill_parts[key] = part
        return part

    def _decode_part(self, num_decode: int, mean_context_tokens: int) -> _Part:
        part = self._decode_parts.get((num_decode, mean_context_tokens))
        if part is None:
            part = (self._block_part(("decode", mean_context_tokens), num_decode)
                    or self._priced(self._nodes.decode(num_decode, mean_context_tokens)))
            self._decode_parts[(num_decode, mean_context_tokens)] = part
        return part

    def _priced(self, nodes: list[tuple[KernelWork, int]]) -> _Part:
        labels, secs = [], []
        gpu = comm = gap = 0.0
        launches = 0
        worst = Provenance.MEASURED
        eager_launch_s = self._host.eager_launch_s
        for work, repeat in nodes:
            # Time does not depend on the kernel's name: kernels alike but for it share a price.
            signature = (work.kind, work.dtype, work.flops, work.weight_bytes, work.activation_bytes,
                         work.kv_read_bytes, work.kv_write_bytes, work.comm_bytes, work.group_size, work.shape,
                         work.variant)
            priced = self._by_signature.get(signature)
            if priced is None:
                est = self._cost.estimate(work)
                priced = (est.time_s, est.provenance)
                self._by_signature[signature] = priced
            time_s, provenance = priced
            seconds = time_s * repeat
            labels.append((work.kind.value, work.name))
            secs.append(seconds)
            if work.kind.is_collective():
                comm += seconds
            else:
                gpu += seconds
            gap += max(0.0, eager_launch_s - time_s) * repeat
            launches += repeat
            worst = max(worst, provenance)
        self.worst_provenance = max(self.worst_provenance, worst)
        return _Part(labels=tuple(labels), seconds=tuple(secs), gpu_s=gpu, comm_s=comm, num_launches=launches,
                     short_kernel_gap_s=gap, worst_provenance=worst)

    def breakdown(self) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Seconds by kernel kind, by kernel name, host CPU, launch floor, summed over all steps."""
        part_counts: dict[int, tuple[_Part, int]] = {}
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
