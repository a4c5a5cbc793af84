"""Per-traffic-class metrics of a fleet-day run: latency percentiles and goodput under each class's SLOs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim.engine.records import RequestRecord
from sim.specs.slo import SloSpec
from sim.specs.traffic import TrafficClass


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassSummary:
    name: str
    num_requests: int
    num_completed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    e2el_p90_s: float
    goodput_frac: float
    """Share of completed requests meeting the class's targets (unset ones: the scenario's `[slo]`)."""
    goodput_requests_per_s: float
    slo: SloSpec


def class_slo(cls: TrafficClass, default: SloSpec) -> SloSpec:
    return SloSpec(ttft_s=cls.ttft_s if cls.ttft_s is not None else default.ttft_s,
                   tpot_s=cls.tpot_s if cls.tpot_s is not None else default.tpot_s,
                   e2el_s=cls.e2el_s if cls.e2el_s is not None else default.e2el_s)


def class_summaries(records: Sequence[RequestRecord], class_ids: npt.NDArray[np.int64],
                    classes: Sequence[TrafficClass], *, slo: SloSpec, duration_s: float) -> tuple[ClassSummary, ...]:
    n = len(records)
    rid = np.fromiter((r.request_id for r in records), dtype=np.int64, count=n)
    arrival = np.fromiter((r.arrival_s for r in records), dtype=np.float64, count=n)
    first = np.fromiter((r.first_token_s for r in records), dtype=np.float64, count=n)
    finish = np.fromiter((r.finish_s for r in records), dtype=np.float64, count=n)
    out = np.fromiter((r.output_tokens for r in records), dtype=np.int64, count=n)
    of_record = class_ids[rid] if n else np.zeros(0, dtype=np.int64)
    ttft = first - arrival
    e2el = finish - arrival
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), np.nan)
    summaries = []
    for index, cls in enumerate(classes):
        mask = of_record == index
        target = class_slo(cls, slo)
        good = np.ones(int(mask.sum()), dtype=bool)
        t, p, e = ttft[mask], tpot[mask], e2el[mask]
        if target.ttft_s is not None:
            good &= t <= target.ttft_s
        if target.tpot_s is not None:
            good &= ~(p > target.tpot_s)  # a one-token request has no TPOT and meets it, as in the summary
        if target.e2el_s is not None:
            good &= e <= target.e2el_s
        num_good = int(good.sum())
        summaries.append(ClassSummary(
            name=cls.name, num_requests=int((class_ids == index).sum()), num_completed=int(mask.sum()),
            ttft_p50_s=_pct(t, 50), ttft_p90_s=_pct(t, 90), ttft_p99_s=_pct(t, 99),
            tpot_p50_s=_pct(p, 50), tpot_p90_s=_pct(p, 90), e2el_p90_s=_pct(e, 90),
            goodput_frac=num_good / good.size if good.size else math.nan,
            goodput_requests_per_s=num_good / duration_s if duration_s > 0 else math.nan, slo=target))
    return tuple(summaries)


def _pct(values: npt.NDArray[np.float64], q: float) -> float:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else math.nan
