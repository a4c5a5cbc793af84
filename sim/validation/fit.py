"""Fit an engine profile's host overheads on dev rows (never evaluation rows).

Per backend the per-step CPU cost is `base_s + per_seq_s x sequences` (held in the `[schedule]`
phase, the other phases zero) plus `graph_launch_s` per CUDA-graph replay (one per decode step,
two per layer for piecewise graphs around attention in mixed steps). The three numbers minimise
the mean over rows of the clipped log error, min(|log(pred / measured)|, 1), averaged over each
row's headline metrics (TTFT, TPOT, throughput), by coordinate descent over fixed grids.
`evaluate` is injected (it simulates rows with a candidate profile), so the search is testable
without simulating; the caller runs it over processes. When the cheapest and the dearest corner
of the grids score alike, the host work is hidden behind the GPU (overlap scheduling) on every
row: the numbers are not identifiable, the search is skipped and `[fit]` says so.

Every entry point calls `require_dev`: an evaluation row raises `EvalRowRefused`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sim.perf.host import HostOverheadParams, LinearCost
from sim.perf.profile import TABLE_SOURCE_KEYS, EngineProfile, FitRecord
from sim.validation.rows import HEADLINE_METRICS, ValidationRow, require_dev
from sim.validation.runner import RowResult

GRIDS: Mapping[str, tuple[float, ...]] = {
    "base_s": (0.0, 50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1.6e-3),
    "per_seq_s": (0.0, 0.25e-6, 0.5e-6, 1e-6, 2e-6, 4e-6, 8e-6),
    "graph_launch_s": (2e-6, 5e-6, 10e-6, 20e-6, 40e-6, 90e-6),
}
START: Mapping[str, float] = {"base_s": 200e-6, "per_seq_s": 2e-6, "graph_launch_s": 20e-6}
CLIP = 1.0

Evaluate = Callable[[EngineProfile, Sequence[ValidationRow]], Sequence[RowResult]]


def host_params(base_s: float, per_seq_s: float, graph_launch_s: float, *, like: HostOverheadParams,
                source: str) -> HostOverheadParams:
    """The fitted numbers on `like`'s launch behaviour (its eager launch cost and how it launches
    uncaptured steps, which the fit keeps)."""
    zero = LinearCost(base_s=0.0, per_item_s=0.0)
    return HostOverheadParams(schedule=LinearCost(base_s=base_s, per_item_s=per_seq_s), prepare_inputs=zero,
                              sampler=zero, process_outputs=zero, graph_launch_s=graph_launch_s,
                              eager_launch_s=like.eager_launch_s, uncaptured_launch=like.uncaptured_launch,
                              graph_capture_unit=like.graph_capture_unit,
                              api_server_latency_s=like.api_server_latency_s,
                              api_server_latency_fit=like.api_server_latency_fit, source=source)


def row_loss(row: ValidationRow, result: RowResult) -> float:
    """Mean clipped |log error| over the row's headline metrics (nan if none scored)."""
    errs = []
    for key in HEADLINE_METRICS.values():
        m, p = row.measured.get(key), result.predicted.get(key)
        if m is not None and p is not None and m > 0 and p > 0 and math.isfinite(p):
            errs.append(min(abs(math.log(p / m)), CLIP))
    return sum(errs) / len(errs) if errs else math.nan


def loss(rows: Sequence[ValidationRow], results: Sequence[RowResult]) -> float:
    by_id = {r.row_id: r for r in results}
    vals = [row_loss(row, by_id[row.row_id]) for row in rows if row.row_id in by_id
            and by_id[row.row_id].status == "scored"]
    vals = [v for v in vals if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else math.inf


@dataclass(frozen=True, slots=True, kw_only=True)
class FitResult:
    profile: EngineProfile
    params: Mapping[str, float]
    loss_before: float
    loss_after: float
    num_evaluations: int


def fit_host(profile: EngineProfile, rows: Sequence[ValidationRow], evaluate: Evaluate, *, data_sha256: str,
             passes: int = 2) -> FitResult:
    """Coordinate descent of the three host numbers on `rows` (dev only)."""
    rows = require_dev(rows, purpose="fitting host overheads")
    if not rows:
        raise ValueError(f"no dev rows to fit the {profile.backend} profile on")
    cache: dict[tuple[float, float, float], float] = {}

    def candidate(p: Mapping[str, float]) -> EngineProfile:
        host = host_params(p["base_s"], p["per_seq_s"], p["graph_launch_s"], like=profile.host,
                           source="candidate")
        return dataclasses.replace(profile, host=host)

    def score(p: Mapping[str, float]) -> float:
        key = (p["base_s"], p["per_seq_s"], p["graph_launch_s"])
        if key not in cache:
            cache[key] = loss(rows, evaluate(candidate(p), rows))
        return cache[key]

    before = loss(rows, evaluate(profile, rows))
    params = dict(START)
    best = score(params)
    # The extreme corners first: when the cheapest and the dearest host score alike, the CPU work
    # is hidden behind the GPU on every row and no search can tell the numbers apart.
    corners = [{k: g[0] for k, g in GRIDS.items()}, {k: g[-1] for k, g in GRIDS.items()}]
    identifiable = any(abs(score(c) - best) > 1e-9 for c in corners)
    for _ in range(passes if identifiable else 0):
        for name, grid in GRIDS.items():
            for value in grid:
                trial = {**params, name: value}
                s = score(trial)
                if s < best - 1e-12:
                    best, params = s, trial
    ties = sum(1 for v in cache.values() if abs(v - best) <= 1e-9)
    verdict = (f"mean clipped |log error| {before:.3f} with the previous profile, {best:.3f} fitted; {ties} of "
               f"{len(cache)} candidates tie at the best (ties keep the values met first)"
               if identifiable else
               f"not identifiable: the cheapest and the dearest host on the grids both score {best:.3f} (the CPU "
               "work is hidden behind the GPU on these rows), so the starting values are kept")
    fitted = dataclasses.replace(
        profile,
        host=host_params(params["base_s"], params["per_seq_s"], params["graph_launch_s"], like=profile.host,
                         source=f"fitted on {len(rows)} dev rows of sim.validation (see [fit])"),
        fit=FitRecord(
            suite="dev",
            method=("coordinate descent over fixed grids of (base_s, per_seq_s, graph_launch_s) minimising the mean "
                    f"over rows of min(|log(pred/measured)|, {CLIP}) of TTFT, TPOT and throughput"),
            data_sha256=data_sha256, num_rows=len(rows), rows=describe_rows(rows),
            metrics=verdict,
        ))
    return FitResult(profile=fitted, params=params, loss_before=before, loss_after=best,
                     num_evaluations=len(cache) + 1)


API_LATENCY_GRID: tuple[float, ...] = tuple(i * 5e-3 for i in range(31))
"""Candidate API-server latencies, 0 to 150 ms in 5 ms steps."""


def served_rows(rows: Sequence[ValidationRow]) -> list[ValidationRow]:
    """Aggregated dev rows measured by a benchmark client through the engine's API server (the
    offline sources set `api_server_latency_s = 0`; disaggregated rows pass a separate frontend)."""
    return [r for r in rows if r.sections is not None and not r.disaggregated
            and r.sections.get("engine", {}).get("api_server_latency_s") is None]


def fit_api_latency(rows: Sequence[ValidationRow], results: Sequence[RowResult], *,
                    simulated_with_s: float) -> tuple[float, str]:
    """The profile's `api_server_latency_s`: the grid value minimising the mean clipped |log error| of
    mean TTFT over `served_rows(rows)` (dev only). The latency adds to every request's first-token
    time and nothing else, so a row's mean TTFT at latency L is its simulated mean TTFT less the
    latency it was simulated with (`simulated_with_s`) plus L: one simulation per row suffices."""
    rows = require_dev(served_rows(rows), purpose="fitting the API-server latency")
    by_id = {r.row_id: r for r in results if r.status == "scored"}
    pairs = []
    for row in rows:
        result = by_id.get(row.row_id)
        measured = row.measured.get("ttft_mean_s")
        if result is None or measured is None or measured <= 0:
            continue
        predicted = result.predicted.get("ttft_mean_s")
        if predicted is not None and math.isfinite(predicted):
            pairs.append((predicted - simulated_with_s, measured))
    if not pairs:
        raise ValueError("no scored dev rows with a measured TTFT through an API server")

    def score(latency_s: float) -> float:
        return sum(min(abs(math.log(max(p + latency_s, 1e-9) / m)), CLIP) for p, m in pairs) / len(pairs)

    best = min(API_LATENCY_GRID, key=lambda lat: (score(lat), lat))
    return best, (f"grid 0-150 ms in 5 ms steps minimising the mean over {len(pairs)} dev rows measured through "
                  f"the API server of min(|log(pred/measured)|, {CLIP}) of mean TTFT: {score(0.0):.3f} at 0 ms, "
                  f"{score(best):.3f} at {best * 1e3:.0f} ms ({describe_rows(rows)})")


def set_api_latency(toml_text: str, latency_s: float, how: str) -> str:
    """An engine profile TOML's text with `api_server_latency_s` and `api_server_latency_fit` set,
    every other line (comments included) as it was: in place of the old keys, else before the first
    table."""
    keys = ("api_server_latency_s =", "api_server_latency_fit =")
    lines = toml_text.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith(keys)),
              next((i for i, ln in enumerate(lines) if ln.startswith("[")), len(lines)))
    escaped = how.replace("\\", "\\\\").replace('"', '\\"')
    new = [f"api_server_latency_s = {latency_s:.6g}", f'api_server_latency_fit = "{escaped}"']
    kept = [ln for ln in lines[at:] if not ln.startswith(keys)]
    return "\n".join(lines[:at] + new + kept) + "\n"


def describe_rows(rows: Sequence[ValidationRow]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        key = f"{r.source} {r.model.split('/')[-1]} on {r.hardware}"
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{k} x{v}" for k, v in sorted(counts.items()))


def profile_toml(profile: EngineProfile, *, header: str) -> str:
    """The profile as the TOML that ships in sim/data/host/<backend>.toml."""
    h, d, pol = profile.host, profile.defaults, profile.policy

    def lit(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return f"{v:.6g}" if v != int(v) or abs(v) >= 1e16 else f"{v:.1f}"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, tuple):
            return "[" + ", ".join(lit(x) for x in v) + "]"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [*(f"# {ln}" for ln in header.splitlines()), f"source = {lit(h.source)}",
             f"graph_launch_s = {lit(h.graph_launch_s)}", f"eager_launch_s = {lit(h.eager_launch_s)}",
             f"uncaptured_launch = {lit(h.uncaptured_launch)}",
             f"graph_capture_unit = {lit(h.graph_capture_unit)}",
             f"api_server_latency_s = {lit(h.api_server_latency_s)}",
             f"api_server_latency_fit = {lit(h.api_server_latency_fit)}"]
    for phase in ("schedule", "prepare_inputs", "sampler", "process_outputs"):
        c: LinearCost = getattr(h, phase)
        lines += ["", f"[{phase}]", f"base_s = {lit(c.base_s)}", f"per_item_s = {lit(c.per_item_s)}"]
    lines += ["", "[policy]", *(f"{f.name} = {lit(getattr(pol, f.name))}" for f in dataclasses.fields(pol))]
    lines += ["", "[defaults]", *(f"{f.name} = {lit(getattr(d, f.name))}" for f in dataclasses.fields(d)
                                  if getattr(d, f.name) is not None)]
    sources = profile.kernel_sources
    named = [(key, getattr(sources, key)) for key in TABLE_SOURCE_KEYS if getattr(sources, key) is not None]
    if sources.gemm or named:
        lines += ["", "[kernel_sources]"]
        if sources.gemm:
            lines.append("gemm = { " + ", ".join(f"{k} = {lit(v)}" for k, v in sorted(sources.gemm.items())) + " }")
        lines += [f"{key} = {lit(backend)}" for key, backend in named]
    if profile.fit is not None:
        lines += ["", "[fit]", *(f"{f.name} = {lit(getattr(profile.fit, f.name))}"
                                 for f in dataclasses.fields(profile.fit))]
    return "\n".join(lines) + "\n"
