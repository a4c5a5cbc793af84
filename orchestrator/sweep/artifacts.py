"""Files recorded with MLflow runs: kernel breakdown (Parquet + stacked bar), Pareto front (CSV + plot).

Figures use matplotlib's object API on the Agg canvas (no pyplot global state) and are returned
as bytes, so actors can render a trial's files and the driver only uploads them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from matplotlib.figure import Figure

from orchestrator.sweep.results import Breakdown

BREAKDOWN_PARQUET: Final = "kernel_breakdown.parquet"
BREAKDOWN_PNG: Final = "kernel_breakdown.png"
_TOP_KERNELS: Final = 9


def breakdown_parquet(breakdown: Breakdown) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(breakdown.rows()), sink)
    return bytes(sink.getvalue().to_pybytes())


def breakdown_png(breakdown: Breakdown, title: str) -> bytes:
    """One horizontal bar of the run's GPU-side time split by kernel (largest first), plus host time."""
    rows = breakdown.rows()
    kernels = [r for r in rows if r["kernel"] not in ("host", "launch_floor")]
    shown = kernels[:_TOP_KERNELS]
    other = sum(r["share"] for r in kernels[_TOP_KERNELS:])
    parts = [(r["kernel"], r["share"]) for r in shown]
    if other > 0:
        parts.append(("other kernels", other))
    parts += [(r["kernel"], r["share"]) for r in rows if r["kernel"] in ("host", "launch_floor")]
    fig = Figure(figsize=(8.0, 2.6), dpi=90)
    ax = fig.add_subplot()
    left = 0.0
    cmap = _colors(len(parts))
    for (name, share), color in zip(parts, cmap, strict=True):
        ax.barh([0], [share * 100], left=left, color=color, label=f"{name} {share:.1%}")
        left += share * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel(f"share of {breakdown.total_s():.3g} s busy time (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(ncols=4, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
    fig.subplots_adjust(bottom=0.55, top=0.85, left=0.03, right=0.97)
    return _png(fig)


def trial_artifacts(breakdown: Breakdown, title: str) -> dict[str, bytes]:
    return {BREAKDOWN_PARQUET: breakdown_parquet(breakdown), BREAKDOWN_PNG: breakdown_png(breakdown, title)}


def table_csv(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """CSV with the union of the rows' keys as header, in first-seen order."""
    header: dict[str, None] = {}
    for row in rows:
        header.update(dict.fromkeys(row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(header), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def pareto_png(points: Sequence[Sequence[float]], feasible: Sequence[bool], front: Sequence[int],
               labels: Sequence[str], title: str) -> bytes:
    """Scatter of trials on the first two objectives (or value by trial for one), front highlighted."""
    fig = Figure(figsize=(7.0, 5.0), dpi=90)
    ax = fig.add_subplot()
    finite = [i for i, p in enumerate(points) if all(math.isfinite(v) for v in p)]
    if len(labels) >= 2:
        xs, ys = [points[i][0] for i in finite], [points[i][1] for i in finite]
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
    else:
        xs, ys = [float(i) for i in finite], [points[i][0] for i in finite]
        ax.set_xlabel("trial (finished order)")
        ax.set_ylabel(labels[0])
    ok = [j for j, i in enumerate(finite) if feasible[i]]
    bad = [j for j, i in enumerate(finite) if not feasible[i]]
    ax.scatter([xs[j] for j in bad], [ys[j] for j in bad], s=12, c="#bbbbbb", label="misses an SLO")
    ax.scatter([xs[j] for j in ok], [ys[j] for j in ok], s=14, c="#4c72b0", label="meets the SLOs")
    pos = {i: j for j, i in enumerate(finite)}
    best = sorted((xs[pos[i]], ys[pos[i]]) for i in front if i in pos)
    if best:
        ax.plot([b[0] for b in best], [b[1] for b in best], "o-", c="#dd5500", ms=6,
                label="Pareto front" if len(labels) >= 2 else "best")
    for axis, vals in (("x", xs), ("y", ys)):
        pos_vals = [v for v in vals if v > 0]
        if len(pos_vals) == len(vals) and vals and max(vals) > 30 * min(vals):
            (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _png(fig)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
