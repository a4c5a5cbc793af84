"""Rank 0's expert load at one MoE layer under a routing distribution, as AIConfigurator's MoE
collector generates it (the measured `moe.csv.gz` rows are rank 0 of such a routing).

- `balanced`: `balanced_logits`, round-robin top-k with stride ceil(E / topk), counted exactly.
- `power_law_<alpha>`: `_generate_power_law_distribution`: every expert's load drawn from a power
  law on [1, 0.8 x tokens] (on [0.01, 2] when tokens x topk <= experts), scaled and rounded to
  tokens x topk pairs, experts in contiguous groups per rank with the heaviest group moved to rank 0;
  the mean over `POWER_LAW_DRAWS` draws of a generator seeded by the shape (deterministic, no global
  state), as the collector averages its latency over that many routings.
- `served:power_law_<alpha>` (`served`): the same routing as a serving engine's router meets it,
  what the simulator's MoE nodes ask for. Where tokens x topk > experts it is the collector's load.
  Where a few tokens meet many experts the collector's rounding gives most experts a share of zero
  and its repair tops up the lowest-numbered experts, which all sit on rank 0 (4 tokens, top-10 of
  512 experts over 8 ranks: all 40 pairs on rank 0), a placement no router has; there the collector's
  draws are placed with the experts shuffled over the ranks, and the load is the busiest rank's
  (`_served_load`).

One function serves both the kernel graph (rank 0's roofline work, `sim.graph.moe`) and the fitted
MoE family's features (`sim.perf.table_kernels`); measured rows keep the collector's routing.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Final

import numpy as np

POWER_LAW_DRAWS: Final = 5
SERVED: Final = "served:"
"""Prefix of a routing as a serving engine's router meets it (`served`)."""
SERVED_SHUFFLES: Final = 16
"""Seeded placements of the experts over the ranks per collector draw (`_served_load`)."""


def load_distribution(distribution: str) -> str:
    """The distribution a rank's load is drawn from, as AIConfigurator reads its rows: EPLB's
    `<routing>_eplb` (experts placed for even shares), `uniform` and a power law of exponent 0 are
    the balanced round robin; anything else is itself."""
    if distribution == "uniform" or distribution.endswith("_eplb"):
        return "balanced"
    if distribution.startswith("power_law_"):
        try:
            if float(distribution.removeprefix("power_law_")) == 0.0:
                return "balanced"
        except ValueError:
            pass
    return distribution


def served(distribution: str) -> str:
    """The distribution key of a simulated MoE layer under `distribution`: its load distribution
    (`load_distribution`), a power law as a router meets it (`served:power_law_<alpha>`)."""
    drawn = load_distribution(distribution)
    return SERVED + drawn if drawn.startswith("power_law_") else drawn


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
    out: np.ndarray = _power_law_counts_of([tokens], experts, topk, ep, alpha, rng.random((1, draws, experts)))[0]
    return out


def _power_law_counts_of(tokens: Sequence[int], experts: int, topk: int, ep: int, alpha: float,
                         u: np.ndarray) -> np.ndarray:
    """`_power_law_counts` of several token counts at once from their uniforms `u` (counts x draws x
    experts): every element goes through the same IEEE operations as one count's arrays (per-count
    scalars are computed on Python floats as before, the row sums reduce each row on its own axis,
    the rounding repair is integer arithmetic), so each count's draws are bitwise those of a call
    for it alone."""
    m, draws, _ = u.shape
    few = [t * topk <= experts for t in tokens]
    lo = [0.01 if f else 1.0 for f in few]
    hi = [2.0 if f else t * 0.8 for t, f in zip(tokens, few, strict=True)]
    if abs(1.0 - alpha) < 1e-9:
        # A scalar base to an array power, count by count: the base stays a scalar as in one call.
        x = np.stack([low * (high / low) ** ui for low, high, ui in zip(lo, hi, u, strict=True)])
    else:
        scale = np.array([high ** (1 - alpha) - low ** (1 - alpha) for low, high in zip(lo, hi, strict=True)])
        shift = np.array([low ** (1 - alpha) for low in lo])
        x = (scale[:, None, None] * u + shift[:, None, None]) ** (1 / (1 - alpha))
    target = np.array(tokens, dtype=np.int64) * topk
    # Each row summed on its own (pairwise over its last axis), whatever the other rows.
    sums = x.sum(axis=2)
    counts = np.round(x / sums[:, :, None] * target[:, None, None].astype(float)).astype(np.int64)
    # Heaviest first, ties by index: the stable order of -counts, from keys that are all distinct
    # (so any sort gives it; numpy's default sort is several times faster than its stable one).
    keys = -counts * experts + np.arange(experts)
    orders = np.argsort(keys, axis=2)
    delta = target[:, None] - counts.sum(2)
    _settle(counts, keys, orders, delta, experts)
    group = _rank0_experts(experts, ep)
    usable = group * (experts // group)
    grouped = counts[:, :, :usable].reshape(m, draws, -1, group)
    heavy = grouped.sum(3).argmax(2)
    if heavy.any():
        # Swap the heaviest group with group 0 in every draw (a no-op where group 0 is the heaviest).
        perm = np.broadcast_to(np.arange(grouped.shape[2]), (*heavy.shape, grouped.shape[2])).copy()
        rows = np.indices(heavy.shape)
        perm[rows[0], rows[1], heavy] = 0
        perm[:, :, 0] = heavy
        counts[:, :, :usable] = np.take_along_axis(grouped, perm[:, :, :, None], axis=2).reshape(m, draws, usable)
    out: np.ndarray = counts.astype(float)
    return out


def _settle(counts: np.ndarray, keys: np.ndarray, orders: np.ndarray, delta: np.ndarray, experts: int) -> None:
    """The collector's repair of the rounding, so that each draw routes exactly tokens x topk pairs:
    `delta` > 0 pairs short, every expert gets delta // E more and the heaviest delta % E one more
    each; `delta` < 0 (over by fewer than E), one less from each of the -delta lightest experts
    (`keys`: -count x E + expert, all distinct; `orders`: their argsort, heaviest first). An
    expert is among the first r of its draw's order exactly when its key is below the r-th's, so
    the ones and minus ones are comparisons with one key per draw. A draw whose lightest experts
    include one with none takes the collector's loop (`_take_surpluses`)."""
    missing = np.maximum(delta, 0)
    surplus = np.maximum(-delta, 0)
    looped = (surplus > 0) & (counts == 0).any(2)
    counts += (missing // experts)[:, :, None]
    heavy_end = np.take_along_axis(keys, np.take_along_axis(orders, (missing % experts)[:, :, None], axis=2), axis=2)
    counts += keys < heavy_end
    taken = np.where(looped, 0, surplus)
    light_start = np.take_along_axis(keys, np.take_along_axis(orders, (experts - np.maximum(taken, 1))[:, :, None],
                                                              axis=2), axis=2)
    counts -= (keys >= light_start) & (taken > 0)[:, :, None]
    if looped.any():
        _take_surpluses(counts, keys, orders, surplus, looped, experts)


def _take_surpluses(counts: np.ndarray, keys: np.ndarray, orders: np.ndarray, surplus: np.ndarray,
                    looped: np.ndarray, experts: int) -> None:
    """`_take_surplus` of every `looped` draw in arrays. The empty experts are the lightest, so
    the loop's first `zeros` takes (`zeros` = the empty experts among the `surplus` lightest) all
    fall on the first heaviest expert in turn: that brings every expert above some level L down
    to L and then takes one more from the lowest-numbered experts at L (L the lowest level whose
    excess over it is at most `zeros`). The remaining takes are one from each non-empty light
    expert. Draws where a heaviest take lands on such a light expert (its own take then meets
    another value) run the collector's loop instead."""
    rows = np.nonzero(looped)
    c = counts[rows]
    order = orders[rows]
    s = surplus[rows]
    zeros = np.minimum(s, (c == 0).sum(1))
    # Heaviest first, bringing the first j experts down to the (j+1)-th's value takes `excess[j]`
    # (nondecreasing in j): the last j within `zeros` is the heaviest group the takes level,
    # and what is left lowers it by whole rounds.
    v = np.take_along_axis(c, order, axis=1)
    excess = np.cumsum(v, axis=1) - v - np.arange(experts) * v
    j = (excess <= zeros[:, None]).sum(1) - 1
    at = np.arange(len(c))
    level = (v[at, j] - (zeros - excess[at, j]) // (j + 1))[:, None]
    at_level = c >= level
    extra = zeros - np.maximum(c - level, 0).sum(1)
    after = np.minimum(c, level) - (at_level & (np.cumsum(at_level, axis=1) <= extra[:, None]))
    # The light experts: the last `s` of each order (heaviest first), i.e. keys from the (E-s)-th on.
    k = keys[rows]
    light = k >= k[at, order[at, experts - s]][:, None]
    rest = light & (c > 0)
    interact = (rest & (after < c)).any(1)
    after -= rest
    counts[rows] = after
    for i in np.flatnonzero(interact).tolist():
        row = (rows[0][i], rows[1][i])
        counts[row] = c[i]
        _take_surplus(counts[row], orders[row], int(s[i]), experts)


def _take_surplus(c: np.ndarray, order: np.ndarray, surplus: int, experts: int) -> None:
    """Rounding up overshot by `surplus` < experts pairs: take one from each of the lightest experts,
    lightest first, and from the first heaviest where a light one has none (the collector's loop).
    The experts with none are the lightest, so they come first: their takes all fall on the heaviest
    before any light expert loses one; when none of those heaviest is among the light experts taken
    from, the loop's result is that of the takes in two batches, else the loop runs as written."""
    light = order[::-1][:surplus].tolist()
    values = c.tolist()
    zeros = sum(1 for k in light if values[k] == 0)
    # Each take lowers the maximum by at most one, so the `zeros` takes only reach experts within
    # `zeros` of the heaviest: look for the first heaviest among those (in expert order) alone.
    floor = values[int(order[0])] - zeros
    near = []
    for k in order.tolist():  # heaviest first: the experts at or above `floor` are a prefix
        if values[k] < floor:
            break
        near.append(k)
    near.sort()
    near_values = [values[k] for k in near]
    hit = set()
    for _ in range(zeros):
        j = near_values.index(max(near_values))
        near_values[j] -= 1
        hit.add(near[j])
    rest = light[zeros:]
    if not hit.isdisjoint(rest):
        for i in range(surplus):
            k = int(order[-(i % experts) - 1])
            if values[k] > 0:
                values[k] -= 1
            else:
                values[values.index(max(values))] -= 1
        c[:] = values
        return
    for k, v in zip(near, near_values, strict=True):
        values[k] = v
    for k in rest:
        values[k] -= 1
    c[:] = values


LoadKey = tuple[int, int, int, int, str]
"""(tokens, experts, topk, ep, distribution): the arguments of `moe_rank0_load`."""

_LOADS: dict[LoadKey, tuple[float, float, float]] = {}
_LOADS_MAX: Final = 1 << 16
_BATCH: Final = 512
"""Token counts drawn in one set of arrays (~5 MB of float64 per array at 256 experts)."""


def moe_rank0_load(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """(routed token-expert pairs, active experts, tokens of the heaviest expert) on EP rank 0.

    Kept per argument tuple (a pure function of them; ~0.5 ms per power-law call alone, and a step's
    MoE rows ask for it once to build the kernel and once to price it)."""
    key = (tokens, experts, topk, ep, distribution)
    load = _LOADS.get(key)
    return load if load is not None else moe_rank0_loads([key])[0]


def moe_rank0_loads(keys: Sequence[LoadKey]) -> list[tuple[float, float, float]]:
    """`moe_rank0_load` of every key, the power-law ones not kept yet drawn together per (experts,
    topk, ep, distribution), `_BATCH` token counts at a time: one generator per key as alone, the
    arithmetic in arrays over the keys (`_power_law_counts_of`, bitwise the values of one call
    each; ~0.2 ms a key instead of ~0.5)."""
    found: dict[LoadKey, tuple[float, float, float]] = {}
    todo: dict[tuple[int, int, int, str], dict[int, list[LoadKey]]] = {}
    aliases: dict[LoadKey, LoadKey] = {}
    for key in keys:
        load = _LOADS.get(key)
        if load is not None:
            found[key] = load
            continue
        tokens, experts, topk, ep, distribution = key
        tokens_n, topk_n = max(int(tokens), 1), max(min(int(topk), experts), 1)
        if distribution.startswith(SERVED):
            base = distribution.removeprefix(SERVED)
            if tokens_n * topk_n <= experts:
                found[key] = _served_load(tokens_n, experts, topk_n, ep, base)
                continue
            # Enough tokens for the collector's draw to spread them: its load stands.
            aliases[key] = key = (tokens, experts, topk, ep, base)
            load = _LOADS.get(key)
            if load is not None:
                found[key] = load
                continue
            distribution = base
        if distribution.startswith("power_law_"):
            todo.setdefault((experts, topk_n, ep, distribution), {}).setdefault(tokens_n, []).append(key)
        else:
            local = _rank0_experts(experts, ep)
            c = _balanced_counts(tokens_n, experts, topk_n)[:local]
            found[key] = (float(c.sum()), float((c > 0).sum()), float(c.max()))
    for (experts, topk, ep, distribution), by_tokens in todo.items():
        local = _rank0_experts(experts, ep)
        alpha = _alpha(distribution)
        pending = list(by_tokens)
        for start in range(0, len(pending), _BATCH):
            counts = pending[start:start + _BATCH]
            u = np.stack([_generator(t, experts, topk, ep, distribution).random((POWER_LAW_DRAWS, experts))
                          for t in counts])
            draws = _power_law_counts_of(counts, experts, topk, ep, alpha, u)[:, :, :local]
            # Integer-valued per draw, so their means are exact in any order of summation.
            loads = zip(draws.sum(2).mean(1).tolist(), (draws > 0).sum(2).mean(1).tolist(),
                        draws.max(2).mean(1).tolist(), strict=True)
            for t, load in zip(counts, loads, strict=True):
                for key in by_tokens[t]:
                    found[key] = load
    for served_key, base_key in aliases.items():
        found[served_key] = found[base_key]
    if len(_LOADS) + len(found) > _LOADS_MAX:
        _LOADS.clear()  # a bound, not a policy: a sweep's shapes fit many times over
    _LOADS.update(found)
    return [found[key] for key in keys]


def _served_load(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """(pairs, active experts, heaviest expert's tokens) of the busiest EP rank under the collector's
    power-law draws with the experts' places shuffled. The collector's rounding repair tops up the
    lowest-numbered experts, which all sit on rank 0; a router's popular experts sit anywhere. Each of
    the collector's `POWER_LAW_DRAWS` draws (the same counts as `moe_rank0_load`'s) is placed by
    `SERVED_SHUFFLES` seeded permutations of the experts over the ranks, and the load is the mean of
    the busiest rank's. With one rank (EP 1) it is the collector's load."""
    counts = _power_law_counts(tokens, experts, topk, ep, _alpha(distribution),
                               _generator(tokens, experts, topk, ep, distribution), POWER_LAW_DRAWS)
    rng = _generator(tokens, experts, topk, ep, SERVED + distribution)
    places = np.argsort(rng.random((POWER_LAW_DRAWS, SERVED_SHUFFLES, experts)), axis=2)
    placed = counts[np.arange(POWER_LAW_DRAWS)[:, None, None], places]
    group = _rank0_experts(experts, ep)
    grouped = placed[:, :, :group * (experts // group)].reshape(POWER_LAW_DRAWS * SERVED_SHUFFLES, -1, group)
    busiest = grouped[np.arange(len(grouped)), grouped.sum(2).argmax(1)]
    return (float(busiest.sum(1).mean()), float((busiest > 0).sum(1).mean()), float(busiest.max(1).mean()))


def _rank0_experts(experts: int, ep: int) -> int:
    """Experts EP rank 0 holds: ceil(experts / ep), as vLLM's `determine_expert_map` gives the first
    experts % ep ranks one more than the rest (the busiest rank holds most)."""
    return max(-(-experts // max(ep, 1)), 1)


def _alpha(distribution: str) -> float:
    """The exponent of `power_law_<alpha>` (or of its `_eplb` variant)."""
    return float(distribution.removeprefix("power_law_").removesuffix("_eplb"))


def _generator(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> np.random.Generator:
    """The generator a power-law routing of this shape draws from, seeded by the shape alone."""
    return np.random.default_rng(zlib.crc32(f"{tokens}/{experts}/{topk}/{ep}/{distribution}".encode()))


def rank0_expert_counts(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> np.ndarray:
    """Tokens per local expert of EP rank 0 in one routing (integers): the balanced counts, or the
    first draw of the power-law generator `moe_rank0_load` averages over (same seed). What a
    microbenchmark of the rank's fused MoE kernel feeds it (`orchestrator.microbench.table_kernels`)."""
    local = _rank0_experts(experts, ep)
    tokens, topk = max(int(tokens), 1), max(min(int(topk), experts), 1)
    if distribution.startswith("power_law_"):
        counts = _power_law_counts(tokens, experts, topk, ep, _alpha(distribution),
                                   _generator(tokens, experts, topk, ep, distribution))[0, :local]
    else:
        counts = _balanced_counts(tokens, experts, topk)[:local]
    out: np.ndarray = np.minimum(counts, tokens).astype(np.int64)
    return out
