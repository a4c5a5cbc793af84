"""Block pricing: the parts of one family, a kernel-node list indexed by a count n >= 1, priced
for many counts at once (used when the efficiency model prices columns, `ColumnEfficiencyModel`).

From the `BLOCK_FROM_ASK`-th part of a family a run asks for (the run prices the first ones
alone, `sim.engine.pricer`), a miss prices every unpriced count of an aligned window around it
(128 counts first, then as wide as the counts the family has priced, so short runs price little
and long runs make few calls) in one vectorised kernel-model call per kernel kind, and keeps them.
The kernel fields of the step parts are polynomials of degree <= 2 in the count (GEMM m, pointwise
tokens, collective bytes and decode batch are linear; prefill attention FLOPs quadratic): their
columns come from the nodes at counts 1, 2 and 3 (or, for rows that carry one TP rank's share of
the tokens, of ceil(n / tp)), after an exact check against the real nodes at enough other counts to
rule out a second piece (`PolynomialNodes.checks`). A family that fails the check is priced count by count by the
caller, or, where the family asks for it (prefill attention with a sliding window), with nodes built
per count and the kernel model vectorised (`BuiltNodes`); rows that are no polynomial but are
rebuilt from their count-1 node (the fused MoE layer: expected experts hit) are priced per count
asked (`NodeTemplate.deferred`). Prices are bitwise those of a part priced alone through the same
column path (`PartPrices.priced`), and equal the kernel model's scalar path to float rounding
(tests compare them, per step and in the breakdown).
A count's block price is bitwise the same in any window: the kernel model's column arithmetic is
elementwise or one product per row (`sim.perf.learners.row_products`), never one BLAS call whose
rounding of a row depends on the number of rows. So a pricer may serve many runs, and a run whose
limit is lower than a pricer's top shares it through `BlockPricer.capped`.
Which families there are and how each is built: `sim.engine.step_parts`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol, TypeVar

import numpy as np

from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import KernelColumns
from sim.perf.step import StepCostModel
from sim.provenance import Provenance

NodeList = list[tuple[KernelWork, int]]
"""Kernel nodes of a part: (work, repeat) in step order."""
Rebuild = Callable[[KernelWork, Sequence[tuple[int, ...]]], list[KernelWork]]
"""A kernel of a table-keyed kind rebuilt at other shapes from its count-1 node (MoE: the fused
layer's work follows the routed load, not a polynomial of the count), one kernel per shape."""
_FLOAT_FIELDS = tuple(f.name for f in fields(KernelWork) if f.type == "float")
_DYADIC = 1024.0
"""`PolynomialNodes.evaluates_exactly`: coefficients must be multiples of 1 / this."""
_MIN_BLOCK = 128
_CHUNK = 128
"""Columns of a window whose deferred rows `BlockPricer._complete` prices together."""
_ALONE_ASKS = 2
"""Counts of a chunk priced alone before the rest of the chunk is priced at once."""
_PROVENANCE = {int(p): p for p in Provenance}
_N = TypeVar("_N", int, float)


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
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


class NodeTemplate(ABC):
    """The kernel nodes of a part as a function of a count n >= 1: node labels and repeats (the
    same for every n), distinct kernel rows, and the rows' columns at many counts."""

    def __init__(self, first: NodeList) -> None:
        self.nodes = [(w.kind, w.name, w.dtype, w.group_size, len(w.shape), w.variant, r) for w, r in first]
        self.row_of: list[int] = list(range(len(first)))
        self.num_rows = len(first)
        self.deferred: frozenset[int] = frozenset()
        """Rows priced only at the counts a caller asks for (a rebuilt MoE row costs ~0.5 ms a count,
        the routing draw twice; the other rows cost microseconds and are priced for a whole window)."""

    def groups(self) -> list[list[int]]:
        """Rows by (kind, dtype, group size, shape length, variant): one kernel-model call each (the
        table-keyed kinds price by variant: routing distribution, DeepEP mode, MLA BMM op)."""
        out: dict[tuple[object, ...], list[int]] = {}
        for (kind, _, dtype, group, ndim, variant, _), row in zip(self.nodes, self.row_of, strict=True):
            rows = out.setdefault((kind, dtype, group, ndim, variant), [])
            if row not in rows:
                rows.append(row)
        return list(out.values())

    def same_nodes(self, nodes: NodeList) -> bool:
        return [(w.kind, w.name, w.dtype, w.group_size, len(w.shape), w.variant, r) for w, r in nodes] == self.nodes

    @abstractmethod
    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        """Columns of `rows` (one kind, dtype, group) at counts `ns`, row after row."""


class BuiltNodes(NodeTemplate):
    """Nodes built for every count (exact for any shape function; a Python object per kernel)."""

    def __init__(self, build: Callable[[int], NodeList]) -> None:
        super().__init__(build(1))
        self._build = build

    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        built = [self._build(n) for n in ns.tolist()]
        assert all(self.same_nodes(nodes) for nodes in built)
        return KernelColumns.of([nodes[r][0] for r in rows for nodes in built])


class PolynomialNodes(NodeTemplate):
    """Nodes whose every numeric field is a polynomial of degree <= 2 in its row's count variable v,
    in Newton form f(1) + d1 k + d2 k (k - 1) / 2 with k = v - 1 (d1, d2 the differences at v = 1,
    2, 3), evaluated exactly: the fields are integer-valued floats. The variable is the count n, or,
    for rows that carry one tensor-parallel rank's share of the tokens (the expert all-to-all and
    the MoE-TP all-reduce move `ceil(t / tp)` tokens), q = ceil(n / divisor): such a row is no
    polynomial of n, but is one of q, read off the nodes at n = 1, divisor + 1 and 2 divisor + 1.
    Columns without building nodes per count."""

    def __init__(self, one: NodeList, two: NodeList, three: NodeList,
                 rebuild: Mapping[KernelKind, Rebuild] | None = None, *, divisor: int = 1,
                 quotient: tuple[NodeList, NodeList] | None = None) -> None:
        """`rebuild`: kinds whose nodes only the shape follows the form for; their numeric fields
        come from `rebuild(count-1 node, shape)` at each count (checked by `of` like the form).
        `quotient`: the nodes at n = divisor + 1 and 2 divisor + 1; a row whose n-form misses them
        takes the form in q = ceil(n / divisor) (without them every row is in n)."""
        super().__init__(one)
        rows: dict[tuple[object, ...], int] = {}
        self.row_of = []
        self.divisor = divisor
        self.coef: list[tuple[list[tuple[float, float, float]], list[tuple[int, int, int]]]] = []
        self.in_quotient: list[bool] = []
        """Per row, whether its variable is q = ceil(n / divisor) rather than n."""
        self.rebuilt: dict[int, tuple[KernelWork, Rebuild]] = {}
        """Rows rebuilt per count: their count-1 node and the rebuild."""
        rebuild = rebuild or {}
        at_q = zip(*quotient, strict=True) if quotient is not None else ((None, None) for _ in one)
        for (w1, _), (w2, _), (w3, _), (q2, q3) in zip(one, two, three, at_q, strict=False):
            again = rebuild.get(w1.kind)
            floats, shape = _newton(w1, w2, w3)
            in_q = False
            if q2 is not None and q3 is not None and divisor > 1:
                # The n-form at n = d + 1 and 2d + 1 (k = d and 2d): a row it misses is a row of q.
                fits = all(_at(shape, k) == list(q[0].shape) for k, q in ((divisor, q2), (2 * divisor, q3)))
                if again is None:
                    fits = fits and all(_at(floats, k) == [getattr(q[0], f) for f in _FLOAT_FIELDS]
                                        for k, q in ((divisor, q2), (2 * divisor, q3)))
                if not fits:
                    floats, shape = _newton(w1, q2[0], q3[0])
                    in_q = True
            # Kernels alike but for the name are one row (priced once, as `StepPricer._priced` does).
            sig = (w1.kind, w1.dtype, w1.group_size, w1.variant, tuple(shape), again is not None,
                   () if again is not None else tuple(floats), in_q)
            if sig not in rows:
                rows[sig] = len(self.coef)
                if again is not None:
                    self.rebuilt[len(self.coef)] = (w1, again)
                self.coef.append((floats, shape))
                self.in_quotient.append(in_q)
            self.row_of.append(rows[sig])
        self.num_rows = len(self.coef)
        self.deferred = frozenset(self.rebuilt)

    def evaluates_exactly(self) -> bool:
        """Whether every float field's Newton coefficients are multiples of 2^-10 (integers, or the
        halves and quarters of FP4 byte counts), so the form's values are exact sums, the real node's
        bits at every count. A field such as `dsa_topk`'s FLOPs (keys x log2(span)) is linear in the
        count but not dyadic: its form rounds differently from the node in the last bit."""
        return all((c * _DYADIC).is_integer() for r, (floats, _) in enumerate(self.coef) if r not in self.rebuilt
                   for coef in floats for c in coef)

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
    def of(build: Callable[[int], NodeList], top: int, rebuild: Mapping[KernelKind, Rebuild] | None = None,
           divisor: int = 1) -> PolynomialNodes | None:
        """The form of `build` on counts 1..top, or None if `build(n)` departs from it at any check
        (a rebuilt node: if its shape departs from the form or its rebuild from the real node).
        `divisor`: the tensor-parallel size that rows of q = ceil(n / divisor) divide by."""
        one, two, three = build(1), build(2), build(3)
        quotient = None
        if divisor > 1 and 2 * divisor + 1 <= top:
            quotient = (build(divisor + 1), build(2 * divisor + 1))
        poly = PolynomialNodes(one, two, three, rebuild, divisor=divisor, quotient=quotient)
        if not poly.evaluates_exactly():
            return None
        if not (poly.same_nodes(two) and poly.same_nodes(three)
                and (quotient is None or all(poly.same_nodes(q) for q in quotient))):
            return None
        extra = [divisor + 1, 2 * divisor + 1] if quotient is not None else []
        for n in ([2, 3] if poly.rebuilt or quotient else []) + extra + PolynomialNodes.checks(top):
            real = build(n) if n > 3 else (two if n == 2 else three)
            if not poly.same_nodes(real):
                return None
            for (work, _), row in zip(real, poly.row_of, strict=True):
                floats, shape = poly.coef[row]
                k = (-(-n // divisor) if poly.in_quotient[row] else n) - 1
                at = _at(shape, k)
                if list(work.shape) != at:
                    return None
                again = poly.rebuilt.get(row)
                if again is not None:
                    made = again[1](again[0], [tuple(at)])[0]
                    if (made.kind, made.dtype, made.group_size, made.variant, made.shape) != \
                            (work.kind, work.dtype, work.group_size, work.variant, work.shape) or \
                            [getattr(made, f) for f in _FLOAT_FIELDS] != [getattr(work, f) for f in _FLOAT_FIELDS]:
                        return None
                elif [getattr(work, f) for f in _FLOAT_FIELDS] != _at(floats, k):
                    return None
        return poly

    def columns(self, rows: list[int], ns: np.ndarray) -> KernelColumns:
        kind, _, dtype, group, _, variant, _ = self.nodes[self.row_of.index(rows[0])]
        k_n = ns - 1
        k_q = -(-ns // self.divisor) - 1
        ks = [(k_q if self.in_quotient[r] else k_n) for r in rows]
        tris = [k * (k - 1) // 2 for k in ks]
        if rows[0] in self.rebuilt:  # a group is one kind: all its rows are rebuilt
            made = []
            for r, k, tri in zip(rows, ks, tris, strict=True):
                first, again = self.rebuilt[r]
                shape = np.stack([a + d1 * k + d2 * tri for a, d1, d2 in self.coef[r][1]], axis=1).tolist()
                made += again(first, [tuple(s) for s in shape])
            return KernelColumns.of(made)
        kfs = [k.astype(float) for k in ks]
        trifs = [tri.astype(float) for tri in tris]
        floats = [np.concatenate([a + d1 * kf + d2 * trif for (a, d1, d2), kf, trif in
                                  zip((self.coef[r][0][i] for r in rows), kfs, trifs, strict=True)])
                  for i in range(len(_FLOAT_FIELDS))]
        ndim = len(self.coef[rows[0]][1])
        shape = tuple(np.concatenate([a + d1 * k + d2 * tri for (a, d1, d2), k, tri in
                                      zip((self.coef[r][1][i] for r in rows), ks, tris, strict=True)])
                      for i in range(ndim))
        by_name = dict(zip(_FLOAT_FIELDS, floats, strict=True))
        return KernelColumns(kind=kind, dtype=dtype, group_size=group, shape=shape,
                             variants=(variant,) * len(floats[0]) if variant else (), **by_name)


def _newton(w1: KernelWork, w2: KernelWork, w3: KernelWork
            ) -> tuple[list[tuple[float, float, float]], list[tuple[int, int, int]]]:
    """Newton coefficients (f(1), d1, d2) of every float field and shape entry from the nodes at
    variable values 1, 2 and 3."""
    f1, f2, f3 = ([getattr(w, f) for f in _FLOAT_FIELDS] for w in (w1, w2, w3))
    floats = [(a, b - a, c - 2.0 * b + a) for a, b, c in zip(f1, f2, f3, strict=True)]
    shape = [(a, b - a, c - 2 * b + a) for a, b, c in zip(w1.shape, w2.shape, w3.shape, strict=True)]
    return floats, shape


def _at(coef: list[tuple[_N, _N, _N]], k: int) -> list[_N]:
    """The Newton form's values at k = v - 1."""
    tri = k * (k - 1) // 2
    return [a + d1 * k + d2 * tri for a, d1, d2 in coef]


@dataclass(slots=True)
class _Block:
    """Parts of several counts priced at once; `Part`s are made on first use."""

    seconds: np.ndarray
    """Per node, seconds in the step (launch time x repeat) at each count."""
    gpu_s: list[float]
    comm_s: list[float]
    short_kernel_gap_s: list[float]
    worst: list[Provenance]


@dataclass(slots=True)
class _Pending:
    """A window whose deferred rows (`NodeTemplate.deferred`) are priced on first use, in chunks of
    neighbouring counts (`BlockPricer._complete`)."""

    counts: list[int]
    """The window's counts, one per column."""
    times: np.ndarray
    """Launch time per row and count (deferred rows unset until their column is done)."""
    provs: np.ndarray
    groups: list[list[int]]
    """The deferred rows' groups."""
    done: np.ndarray
    """Per column, whether its deferred rows are priced."""
    asks: dict[int, int] = field(default_factory=dict)
    """Counts asked for so far per chunk of `_CHUNK` columns."""


class PartSource(Protocol):
    """Where a run's parts of one family come from: a `BlockPricer` or a capped view of one."""

    def part(self, n: int) -> Part | None:
        """The part of count `n`, or None where the caller prices it alone."""
        ...


class BlockPricer:
    """Parts of counts 1..`max_count` priced in windows (see the module docstring). Which counts
    a caller prices alone (a run's first part of the family) is the caller's choice: a count's
    block price does not depend on the counts priced before it, so one pricer may serve many runs."""

    def __init__(self, template: Callable[[], NodeTemplate | None], cost: StepCostModel, eager_launch_s: float,
                 max_count: int) -> None:
        self._make_template = template
        self._template: NodeTemplate | None = None
        self._cost = cost
        self._eager = eager_launch_s
        self._max = max_count
        self._where: dict[int, tuple[_Block | _Pending, int]] = {}
        self._parts: dict[int, Part] = {}
        self._labels: tuple[tuple[str, str], ...] = ()
        self._launches = 0

    def part(self, n: int) -> Part | None:
        """The part of count `n`, or None where the caller prices it alone: outside 1..max_count,
        or when no template applies."""
        part = self._parts.get(n)
        if part is not None:
            return part
        at = self._where.get(n)
        if at is None:
            if not 1 <= n <= self._max or not self.has_template():
                return None
            self._price_window(n)
            at = self._where[n]
        block, j = at
        if isinstance(block, _Pending):
            part = self._parts[n] = self._complete(block, j, n)
            return part
        part = self._parts[n] = Part(
            labels=self._labels, seconds=block.seconds[:, j], gpu_s=block.gpu_s[j], comm_s=block.comm_s[j],
            num_launches=self._launches, short_kernel_gap_s=block.short_kernel_gap_s[j],
            worst_provenance=block.worst[j])
        return part

    @property
    def max_count(self) -> int:
        """The top count this pricer prices (0 once it has found that no template applies)."""
        return self._max

    def has_template(self) -> bool:
        """Whether a template applies (built on first call); without one every count is priced
        alone by the caller."""
        if self._template is None and self._max > 0:
            self._template = self._make_template()
            if self._template is None:
                self._max = 0
                return False
            self._labels = tuple((node[0].value, node[1]) for node in self._template.nodes)
            self._launches = sum(node[-1] for node in self._template.nodes)
        return self._template is not None

    def capped(self, top: int) -> CappedPricer:
        """This pricer's parts of counts 1..`top` (`top` <= `max_count`), for a run whose limit is
        lower. Exact when `has_template()`: a template that holds on 1..max_count holds on 1..top
        with the same fields (a polynomial form found on the narrower range is the same polynomial,
        fixed by counts 1, 2 and 3, and nodes built per count are the real nodes), and a count's
        price depends neither on its window nor on the counts priced before it."""
        return CappedPricer(self, top)

    def _price_window(self, n: int) -> None:
        size = _MIN_BLOCK
        while size < len(self._where):
            size *= 2
        template = self._template
        assert template is not None
        lo = (n - 1) // size * size + 1
        where = self._where
        ns = np.array([m for m in range(lo, min(lo + size, self._max + 1)) if m not in where], dtype=np.int64)
        times = np.empty((template.num_rows, len(ns)))
        provs = np.empty((template.num_rows, len(ns)), dtype=np.int64)
        deferred = template.deferred
        later = []
        for rows in template.groups():
            if rows[0] in deferred:  # a group is one kind: deferred as a whole
                later.append(rows)
                continue
            t, p = self._cost.estimate_columns(template.columns(rows, ns))
            times[rows] = t.reshape(len(rows), len(ns))
            provs[rows] = p.reshape(len(rows), len(ns))
        block: _Block | _Pending = _Pending(counts=ns.tolist(), times=times, provs=provs, groups=later,
                                            done=np.zeros(len(ns), dtype=bool)) if later else self._sums(times, provs)
        for j, m in enumerate(ns.tolist()):
            where[m] = (block, j)

    def _complete(self, pending: _Pending, j: int, n: int) -> Part:
        """The part of count `n` (column `j` of a window with deferred rows): its deferred rows priced
        now, alone or with the rest of its chunk (`_CHUNK` aligned columns), then its column summed as
        a window's columns are (the same operations in the same order, so the same numbers; a row's
        price does not depend on the counts priced with it). A deferred MoE row costs ~2 ms to price
        alone (~0.5 ms of routing draw, the rest per call) and ~0.2 ms a count in a chunk, and a run
        asks for a scattered subset of the counts: the first `_ALONE_ASKS` counts asked in a chunk are
        priced alone, the next one prices the chunk's other counts with it (a rent-or-buy rule: never
        much dearer than pricing every count alone, several times cheaper when a run asks for many)."""
        template = self._template
        assert template is not None
        if pending.done[j]:
            return self._one(pending.times[:, j], pending.provs[:, j])
        chunk = j // _CHUNK
        asked = pending.asks[chunk] = pending.asks.get(chunk, 0) + 1
        if asked <= _ALONE_ASKS:
            cols = [j]
        else:
            lo = chunk * _CHUNK
            cols = [c for c in range(lo, min(lo + _CHUNK, len(pending.counts))) if not pending.done[c]]
        ns = np.array([pending.counts[c] for c in cols], dtype=np.int64)
        for rows in pending.groups:
            t, p = self._cost.estimate_columns(template.columns(rows, ns))
            pending.times[np.ix_(rows, cols)] = t.reshape(len(rows), len(cols))
            pending.provs[np.ix_(rows, cols)] = p.reshape(len(rows), len(cols))
        pending.done[cols] = True
        return self._one(pending.times[:, j], pending.provs[:, j])

    def _one(self, times: np.ndarray, provs: np.ndarray) -> Part:
        """`_sums` of one column, on Python floats (`summed_part`: the same operations in the same
        order; numpy's per-call cost on one-element arrays is most of the work otherwise)."""
        template = self._template
        assert template is not None
        time_of, prov_of = times.tolist(), provs.tolist()
        return summed_part(((kind, repeat, time_of[row], _PROVENANCE[prov_of[row]])
                            for (kind, *_, repeat), row in zip(template.nodes, template.row_of, strict=True)),
                           self._labels, self._eager)

    def _sums(self, times: np.ndarray, provs: np.ndarray) -> _Block:
        """Parts' totals from per-row launch times and provenance codes (rows x counts)."""
        template = self._template
        assert template is not None
        k = times.shape[1]
        seconds = np.empty((len(template.nodes), k))
        gpu, comm, gap = np.zeros(k), np.zeros(k), np.zeros(k)
        worst = np.full(k, int(Provenance.MEASURED), dtype=np.int64)
        # The sums run over the nodes in order, as `PartPrices.priced` adds them.
        for i, ((kind, *_, repeat), row) in enumerate(zip(template.nodes, template.row_of, strict=True)):
            time_s = times[row]
            sec = seconds[i] = time_s * repeat
            if kind.is_collective():
                comm += sec
            else:
                gpu += sec
            gap += np.maximum(0.0, self._eager - time_s) * repeat
            np.maximum(worst, provs[row], out=worst)
        return _Block(seconds=seconds, gpu_s=gpu.tolist(), comm_s=comm.tolist(), short_kernel_gap_s=gap.tolist(),
                      worst=[_PROVENANCE[w] for w in worst.tolist()])


def summed_part(nodes: Iterable[tuple[KernelKind, int, float, Provenance]], labels: tuple[tuple[str, str], ...],
                eager_launch_s: float) -> Part:
    """A part from its nodes' (kind, repeat, launch time, provenance), summed in node order: seconds
    per node, GPU and collective totals, the short-kernel gap, the least trustworthy provenance.
    Python floats, the operations `BlockPricer._sums` runs on columns (so the same bits)."""
    seconds = []
    gpu = comm = gap = 0.0
    launches = 0
    worst = Provenance.MEASURED
    for kind, repeat, time_s, provenance in nodes:
        sec = time_s * repeat
        seconds.append(sec)
        if kind.is_collective():
            comm += sec
        else:
            gpu += sec
        gap += max(0.0, eager_launch_s - time_s) * repeat
        launches += repeat
        worst = max(worst, provenance)
    return Part(labels=labels, seconds=tuple(seconds), gpu_s=gpu, comm_s=comm, num_launches=launches,
                short_kernel_gap_s=gap, worst_provenance=worst)


class CappedPricer:
    """A wider `BlockPricer` seen as one over counts 1..top (`BlockPricer.capped`)."""

    __slots__ = ("_base", "_top")

    def __init__(self, base: BlockPricer, top: int) -> None:
        if top > base.max_count:
            raise ValueError(f"top={top} exceeds the base pricer's max_count={base.max_count}")
        self._base = base
        self._top = top

    @property
    def max_count(self) -> int:
        return self._top

    def part(self, n: int) -> Part | None:
        return self._base.part(n) if n <= self._top else None
