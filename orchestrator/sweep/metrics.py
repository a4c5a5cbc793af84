"""The numbers a trial reports: every numeric `SimSummary` field plus a few derived ratios.

These names are what sweep objectives and `[slo]` bounds refer to and what MLflow records as
metrics, so a sweep result reads the same as `kernelsight run --json`'s `summary`.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Final

from sim.metrics.autoscaling import AutoscalingSummary
from sim.metrics.summary import SimSummary
from sim.suggest import did_you_mean
from sim.uncertainty import INTERVAL_METRICS, RunIntervals, bounds_of

DERIVED_METRICS: Final[dict[str, str]] = {
    "goodput_frac": "fraction of completed requests that meet every per-request [slo] target of the scenario",
    "output_throughput_tokens_per_s_per_gpu": "output tokens per second divided by the number of GPUs",
    "output_tokens_per_s_per_user": "1 / median TPOT: the decode speed one user sees (interactivity, the x axis "
                                    "of disaggregation studies' cost vs tokens/s/user plots)",
}


def _summary_numeric_fields() -> tuple[str, ...]:
    hints = typing.get_type_hints(SimSummary)
    numeric = (int, float, bool, float | None)
    return tuple(f.name for f in dataclasses.fields(SimSummary) if hints[f.name] in numeric)


def _number(value: float | None) -> float:
    """A metric as a float; a missing one (a cost with no known GPU price) is NaN, which ranks nowhere."""
    return math.nan if value is None else float(value)


SUMMARY_METRICS: Final[tuple[str, ...]] = _summary_numeric_fields()
METRIC_NAMES: Final[tuple[str, ...]] = (*SUMMARY_METRICS, *DERIVED_METRICS)


def trial_metrics(summary: SimSummary) -> dict[str, float]:
    """All metrics of one simulation as floats (booleans as 0/1), in `METRIC_NAMES` order."""
    out = {name: _number(getattr(summary, name)) for name in SUMMARY_METRICS}
    rate = summary.request_throughput_per_s
    out["goodput_frac"] = summary.goodput_requests_per_s / rate if rate > 0 and math.isfinite(rate) else math.nan
    out["output_throughput_tokens_per_s_per_gpu"] = (
        summary.output_throughput_tokens_per_s / summary.num_gpus if summary.num_gpus else math.nan)
    tpot = summary.tpot_median_s
    out["output_tokens_per_s_per_user"] = 1.0 / tpot if tpot > 0 and math.isfinite(tpot) else math.nan
    return out


def interval_metrics(point: SimSummary, intervals: RunIntervals) -> dict[str, float]:
    """`<metric>_lo` / `_hi` of every trial metric: the run's intervals as `kernelsight run --intervals`
    gives them (the kernel draws stretched by the shipped end-to-end widening) for `INTERVAL_METRICS`,
    the metrics derived from them from their ends (per GPU, per user = 1 / median TPOT), and the
    other metrics from the perturbed runs alone (`bounds_of`; e.g. `goodput_frac`, a ratio of two
    widened metrics)."""
    out = bounds_of(trial_metrics(point), [trial_metrics(s) for s in intervals.samples], intervals.alpha)
    for name in INTERVAL_METRICS:
        lo, hi = intervals.lo.get(name), intervals.hi.get(name)
        if lo is not None and hi is not None and f"{name}_lo" in out:
            out[f"{name}_lo"], out[f"{name}_hi"] = _number(lo), _number(hi)
    if point.num_gpus:
        for end in ("lo", "hi"):
            out[f"output_throughput_tokens_per_s_per_gpu_{end}"] = (
                out[f"output_throughput_tokens_per_s_{end}"] / point.num_gpus)
    tpot_lo, tpot_hi = out["tpot_median_s_lo"], out["tpot_median_s_hi"]
    if tpot_lo > 0 and math.isfinite(tpot_hi):
        out["output_tokens_per_s_per_user_lo"] = 1.0 / tpot_hi
        out["output_tokens_per_s_per_user_hi"] = 1.0 / tpot_lo
    return out


def _vllm_bench_names() -> dict[str, str]:
    names = {"request_throughput": "request_throughput_per_s", "output_throughput": "output_throughput_tokens_per_s",
             "total_token_throughput": "total_token_throughput_tokens_per_s",
             "request_goodput": "goodput_requests_per_s", "completed": "num_completed", "duration": "duration_s"}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for theirs, ours in (("mean", "mean"), ("median", "median"), ("std", "std"), ("p50", "median"),
                             ("p90", "p90"), ("p99", "p99")):
            names[f"{theirs}_{metric}_ms"] = f"{metric}_{ours}_s"
    return names


VLLM_BENCH_NAMES: Final[dict[str, str]] = _vllm_bench_names()
"""`vllm bench serve` result names -> the metric names here (which are in seconds, not ms)."""


def unknown_metric_rule(name: str) -> str:
    """The rule text of a `ConfigError` for metric `name`: the vLLM bench mapping or close names."""
    ours = VLLM_BENCH_NAMES.get(name)
    if ours is not None:
        unit = " (seconds here: divide a millisecond bound by 1000)" if name.endswith("_ms") else ""
        return f"unknown metric; vLLM bench name {name} is {ours} here{unit}"
    names = (*METRIC_NAMES, *AUTOSCALING_METRICS)
    return f"unknown metric; {did_you_mean(name, names)}known: {', '.join(names)}"


def is_metric_name(name: str) -> bool:
    """A metric objectives and `[slo]` may name: every trial's, or an `[autoscaling]` trial's
    (`needs_autoscaling`)."""
    return name in METRIC_NAMES or name in AUTOSCALING_METRICS


def needs_autoscaling(name: str) -> bool:
    """Only trials of a base scenario with `[autoscaling]` report this metric."""
    return name in AUTOSCALING_METRICS


AUTOSCALING_METRICS: Final[dict[str, str]] = {
    "peak_replicas": "most replicas provisioned at once (active, starting, draining)",
    "peak_gpus": "peak_replicas x GPUs per replica",
    "mean_replicas": "replica-seconds over the run's window",
    "gpu_hours": "GPU-hours provisioned (start-up included)",
    "slo_attainment": "completed requests meeting their targets (a traffic class's, else [slo]'s) / completed requests",
}
"""Metrics a trial of an `[autoscaling]` scenario adds (sim.metrics.autoscaling); its
`cost_per_hour_usd` and `cost_per_million_output_tokens_usd` are then the provisioned GPU-hours'."""


def autoscaling_metrics(autoscaling: AutoscalingSummary) -> dict[str, float]:
    return {name: float(getattr(autoscaling, name)) for name in AUTOSCALING_METRICS}
