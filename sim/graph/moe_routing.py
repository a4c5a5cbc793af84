"""Rank 0's expert load at one MoE layer under a routing distribution, as AIConfigurator's MoE
collector generates it (the measured `moe.csv.gz` rows are rank 0 of such a routing).

- `balanced`: `balanced_logits`, round-robin top-k with stride ceil(E / topk), counted exactly.
- `power_law_<alpha>`: `_generate_power_law_distribution`: every expert's load drawn from a power
  law on [1, 0.8 x tokens] (on [0.01, 2] when tokens x topk <= experts), scaled and rounded to
  tokens x topk pairs, experts in contiguous groups per rank with the heaviest group moved to rank 0;
  the mean over `POWER_LAW_DRAWS` draws of a generator seeded by the shape (deterministic, no global
  state), as the collector averages its latency over that many routings.

One function serves both the kernel graph (rank 0's roofline work, `sim.graph.moe`) and the fitted
MoE family's features (`sim.perf.table_kernels`).
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Final

import numpy as np

POWER_LAW_DRAWS: Final = 5


def _balanced_counts(tokens: int, experts: int, topk: int) -> np.ndarray:
    """Tokens per expert of AIConfigurator's `balanced_logits` (round-robin, stride ceil(E/topk))."""
    stride = math.ceil(experts / topk)
    if tokens >= stride:
        # Token i picks (i + j * stride) % E: count the tokens i < T congruent to e - j*stride.
        e = np.arange(experts)[:, None]
        r = (e - np.arange(topk)[None, :] * stride) % experts
        counts = np.where(r < tokens, (tokens - 1 - r) // experts + 1, 0).sum(1)
    else:
        i = np.arange(tokens)[:, None]
        j = np.arange(topk)[None, :]
        picks = np.floor(np.mod(i * stride / tokens + j * stride, experts)).astype(np.int64)
        counts = np.zeros(experts, dtype=np.int64)
        for row in picks:  # an expert picked twice by one token counts once (one-hot sum)
            counts[np.unique(row)] += 1
    out: np.ndarray = counts.astype(float)
    return out


def _power_law_counts(tokens: int, experts: int, topk: int, ep: int, alpha: float,
                      rng: np.random.Generator, draws: int = 1) -> np.ndarray:
    """`draws` successive draws of the collector's power-law token counts per expert, heaviest EP
    group first (draws x experts). Row i is the i-th draw of one-at-a-time calls on the same
    generator (`rng.random` fills in order; the rest is row-wise), so the draws run as one array."""
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > experts else (0.01, 2.0)
    u = rng.random((draws, experts))
    if abs(1.0 - alpha) < 1e-9:
        x = lo * (hi / lo) ** u
    else:
        x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    target = tokens * topk
    # Each row summed on its own: the order of a one-dimensional sum (pairwise), whatever the draws.
    sums = np.array([row.sum() for row in x])
    counts = np.round(x / sums[:, None] * target).astype(np.int64)
    orders = np.argsort(-counts, axis=1, kind="stable")
    for c, order, total in zip(counts, orders, counts.sum(1).tolist(), strict=True):
        delta = target - total
        if delta > 0:
            c += delta // experts
            c[order[: delta % experts]] += 1
        elif delta < 0:
            # Rounding up overshot by < experts pairs: take one from each of the lightest experts
            # (from the heaviest where a light one has none), on a list for speed.
            values = c.tolist()
            for i in range(-delta):
                k = int(order[-(i % experts) - 1])
                if values[k] > 0:
                    values[k] -= 1
                else:
                    values[values.index(max(values))] -= 1  # the first heaviest, as argmax picks
            c[:] = values
    group = max(experts // max(ep, 1), 1)
    usable = group * (experts // group)
    grouped = counts[:, :usable].reshape(draws, -1, group)
    for i, heavy in enumerate(grouped.sum(2).argmax(1).tolist()):
        if heavy:
            g = grouped[i].copy()
            g[[0, heavy]] = g[[heavy, 0]]
            counts[i, :usable] = g.ravel()
    out: np.ndarray = counts.astype(float)
    return out


@functools.lru_cache(maxsize=1 << 16)
def moe_rank0_load(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """(routed token-expert pairs, active experts, tokens of the heaviest expert) on EP rank 0.

    Kept per argument tuple (a pure function of them; ~0.5 ms per power-law call, and a step's MoE
    rows ask for it once to build the kernel and once to price it)."""
    local = max(experts // max(ep, 1), 1)
    tokens, topk = max(int(tokens), 1), max(min(int(topk), experts), 1)
    if distribution.startswith("power_law_"):
        alpha = float(distribution.removeprefix("power_law_").removesuffix("_eplb"))
        seed = zlib.crc32(f"{tokens}/{experts}/{topk}/{ep}/{distribution}".encode())
        rng = np.random.default_rng(seed)
        draws = _power_law_counts(tokens, experts, topk, ep, alpha, rng, POWER_LAW_DRAWS)[:, :local]
        # Integer-valued per draw, so their means are exact in any order of summation.
        return (float(draws.sum(1).mean()), float((draws > 0).sum(1).mean()), float(draws.max(1).mean()))
    c = _balanced_counts(tokens, experts, topk)[:local]
    return float(c.sum()), float((c > 0).sum()), float(c.max())


def rank0_expert_counts(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> np.ndarray:
    """Tokens per local expert of EP rank 0 in one routing (integers): the balanced counts, or the
    first draw of the power-law generator `moe_rank0_load` averages over (same seed). What a
    microbenchmark of the rank's fused MoE kernel feeds it (`orchestrator.microbench.table_kernels`)."""
    local = max(experts // max(ep, 1), 1)
    tokens, topk = max(int(tokens), 1), max(min(int(topk), experts), 1)
    if distribution.startswith("power_law_"):
        alpha = float(distribution.removeprefix("power_law_").removesuffix("_eplb"))
        seed = zlib.crc32(f"{tokens}/{experts}/{topk}/{ep}/{distribution}".encode())
        counts = _power_law_counts(tokens, experts, topk, ep, alpha, np.random.default_rng(seed))[0, :local]
    else:
        counts = _balanced_counts(tokens, experts, topk)[:local]
    out: np.ndarray = np.minimum(counts, tokens).astype(np.int64)
    return out
