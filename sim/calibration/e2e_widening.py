"""End-to-end widening of the run intervals: conformalized on measured end-to-end rows.

The kernel draws of `sim.uncertainty` cover only the kernel model's share of the error; host
overheads, scheduling and the measured loops' client protocols add the rest, and validate found the
kernel-only intervals covering 0-67% of measured rows instead of 90%. The widening is conformalized
quantile regression (Romano, Patterson & Candes 2019) on the log scale: on calibration rows with
kernel-only bounds [lo, hi] and a measured value y, the score is s = max(log(lo / y), log(y / hi))
(negative inside the interval), and the log width w is the ceil((n + 1) x nominal)-th smallest score
(the largest when n is too small for that order: then it is not a guarantee, and `rows` says so).
A run's interval becomes [lo x e^-w, hi x e^w] (still holding the point run), per tier and metric
group (TTFT, TPOT, throughput). `kernelsight validate --intervals K --e2e-widening-out PATH` fits it
on the dev suite's rows only; the eval suite's coverage is then measured with it and never fitted on.
Units: log widths are natural-log factors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Final

from sim.errors import ConfigError

SHIPPED_PATH: Final = Path(__file__).resolve().parents[1] / "data" / "calibration" / "e2e_widening.json"
SCHEMA: Final = "kernelsight-e2e-widening/1"
GROUPS: Final = ("ttft", "tpot", "throughput")


def group_of(metric: str) -> str | None:
    """The widening group of a summary or validate metric name (None: not widened)."""
    if metric.startswith("ttft"):
        return "ttft"
    if metric.startswith(("tpot", "itl")):
        return "tpot"
    if "throughput" in metric or metric.startswith(("goodput", "cost_per_million")):
        return "throughput"  # cost per token is GPU-hours over throughput: the same relative error
    if metric.startswith("e2el"):
        return "e2el"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class E2EWidening:
    nominal: float
    log_widths: dict[str, dict[str, float]]
    """tier -> group -> log width w."""
    rows: dict[str, dict[str, int]] = field(default_factory=dict)
    """tier -> group -> calibration rows (below ceil((n + 1) x nominal) <= n the width is the largest score)."""
    source: str = ""
    data_sha256: dict[str, str] = field(default_factory=dict)
    """Digest of the measured data the calibration rows came from (`e2e`: `sim.validation.load.data_sha256`)."""

    def log_width(self, tier: str, metric: str) -> float:
        """w for `metric` under `tier` (0 where nothing was fitted); E2E latency takes the wider of TTFT and TPOT."""
        widths = self.log_widths.get(tier, {})
        group = group_of(metric)
        if group == "e2el":
            return max(widths.get("ttft", 0.0), widths.get("tpot", 0.0))
        return widths.get(group, 0.0) if group is not None else 0.0

    def widen(self, tier: str, metric: str, point: float, lo: float, hi: float) -> tuple[float, float]:
        w = self.log_width(tier, metric)
        return min(lo * math.exp(-w), point), max(hi * math.exp(w), point)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "nominal": self.nominal, "log_widths": self.log_widths, "rows": self.rows,
                "source": self.source, "data_sha256": self.data_sha256}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")


def conformal_width(scores: list[float], nominal: float) -> float:
    """The ceil((n + 1) x nominal)-th smallest score (the largest if that order exceeds n)."""
    if not scores:
        return 0.0
    s = sorted(scores)
    k = min(len(s), math.ceil((len(s) + 1) * nominal - 1e-9))
    return s[k - 1]


def fit_widening(samples: Iterable[tuple[str, str, float, float, float]], *, nominal: float = 0.9,
                 source: str = "", data_sha256: dict[str, str] | None = None) -> E2EWidening:
    """From (tier, metric, lo, hi, measured) of calibration rows: the log width per tier and group."""
    scores: dict[str, dict[str, list[float]]] = {}
    for tier, metric, lo, hi, y in samples:
        group = group_of(metric)
        if group not in GROUPS or min(lo, hi, y) <= 0 or not all(map(math.isfinite, (lo, hi, y))):
            continue
        scores.setdefault(tier, {}).setdefault(group, []).append(max(math.log(lo / y), math.log(y / hi)))
    return E2EWidening(nominal=nominal,
                       log_widths={t: {g: conformal_width(v, nominal) for g, v in sorted(gs.items())}
                                   for t, gs in sorted(scores.items())},
                       rows={t: {g: len(v) for g, v in sorted(gs.items())} for t, gs in sorted(scores.items())},
                       source=source, data_sha256=dict(data_sha256 or {}))


def load_widening(path: Path) -> E2EWidening:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(source=str(path), key="e2e widening", value=str(path), rule=f"unreadable: {exc}") from None
    if data.get("schema") != SCHEMA:
        raise ConfigError(source=str(path), key="schema", value=data.get("schema"), rule=f"must be {SCHEMA}")
    return E2EWidening(nominal=float(data["nominal"]),
                       log_widths={t: {g: float(w) for g, w in gs.items()} for t, gs in data["log_widths"].items()},
                       rows={t: {g: int(n) for g, n in gs.items()} for t, gs in data.get("rows", {}).items()},
                       source=str(data.get("source", "")),
                       data_sha256={str(k): str(v) for k, v in data.get("data_sha256", {}).items()})


@lru_cache(maxsize=1)
def shipped_widening() -> E2EWidening | None:
    """The shipped widening (`sim/data/calibration/e2e_widening.json`), None where none ships."""
    return load_widening(SHIPPED_PATH) if SHIPPED_PATH.is_file() else None
