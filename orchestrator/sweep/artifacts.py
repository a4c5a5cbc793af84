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
from matplotlib.lines import Line2D

from orchestrator.plot_style import gpu_color, short_gpu, wrap_title
from orchestrator.sweep.results import Breakdown

BREAKDOWN_PARQUET: Final = "kernel_breakdown.parquet"
BREAKDOWN_PNG: Final = "kernel_breakdown.png"
_TOP_KERNELS: Final = 9
_MAX_FRONT_LABELS: Final = 16
_MODE_MARKERS: Final = {"aggregated": "o", "disaggregated": "^"}


def breakdown_parquet(breakdown: Breakdown) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(breakdown.rows()), sink)
    return bytes(sink.getvalue().to_pybytes())


def breakdown_png(breakdown: Breakdown, title: str) -> bytes:
    return _png(breakdown_figure(breakdown, title))


def breakdown_figure(breakdown: Breakdown, title: str) -> Figure:
    """One horizontal bar of the run's GPU-side time split by kernel (largest first), plus host time."""
    rows = breakdown.rows()
    kernels = [r for r in rows if r["kernel"] not in ("host", "launch_floor")]
    shown = kernels[:_TOP_KERNELS]
    other = sum(r["share"] for r in kernels[_TOP_KERNELS:])
    parts = [(r["kernel"], r["share"]) for r in shown]
    if other > 0:
        parts.append(("other kernels", other))
    parts += [(r["kernel"], r["share"]) for r in rows if r["kernel"] in ("host", "launch_floor")]
    fig = Figure(figsize=(8.0, 3.0), dpi=90, layout="constrained")
    ax = fig.add_subplot()
    left = 0.0
    cmap = _colors(len(parts))
    for (name, share), color in zip(parts, cmap, strict=True):
        ax.barh([0], [share * 100], left=left, color=color, label=f"{name} {share:.1%}")
        left += share * 100
    ax.set_xlim(0, 100)
    ax.set_yticks([])
    ax.set_xlabel(f"share of {breakdown.total_s():.3g} s busy time (%)")
    ax.set_title(wrap_title(title, 100), fontsize=9)
    # below the axes, inside the figure: constrained layout makes room for it
    fig.legend(*ax.get_legend_handles_labels(), ncols=4, fontsize=7, loc="outside lower center", frameon=False)
    return fig


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


def pareto_figure(points: Sequence[Sequence[float]], feasible: Sequence[bool], front: Sequence[int],
                  labels: Sequence[str], title: str, *, gpus: Sequence[str | None] | None = None,
                  point_labels: Sequence[str] | None = None, modes: Sequence[str] | None = None) -> Figure:
    """Scatter of trials on the first two objectives (or value by trial for one), front highlighted.

    Points are coloured by GPU (`orchestrator.plot_style.gpu_color`, the same in every plot); trials
    that miss an SLO are hollow; front points carry their configuration label (`point_labels`).
    With `modes` (`aggregated` / `disaggregated` per trial) the two kinds get different markers
    (circle / triangle) on the same axes, so aggregated and disaggregated fleets compare side by side.
    """
    fig = Figure(figsize=(9.0, 5.6), dpi=90, layout="constrained")
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
    gpu_of = list(gpus) if gpus is not None else [None] * len(points)
    mode_of = list(modes) if modes is not None else [""] * len(points)
    for gpu in dict.fromkeys(gpu_of[i] for i in finite):
        color = gpu_color(gpu)
        for mode in dict.fromkeys(mode_of[i] for i in finite):
            marker = _MODE_MARKERS.get(mode, "o")
            ok = [j for j, i in enumerate(finite) if gpu_of[i] == gpu and mode_of[i] == mode and feasible[i]]
            bad = [j for j, i in enumerate(finite) if gpu_of[i] == gpu and mode_of[i] == mode and not feasible[i]]
            if not ok and not bad:
                continue
            name = short_gpu(gpu) if gpu is not None else "trials"
            ax.scatter([xs[j] for j in ok], [ys[j] for j in ok], s=16 if marker == "o" else 26, color=color,
                       marker=marker, label=f"{name} {mode}" if mode else name)
            ax.scatter([xs[j] for j in bad], [ys[j] for j in bad], s=16 if marker == "o" else 26, marker=marker,
                       facecolors="none", edgecolors=color, alpha=0.6)
    pos = {i: j for j, i in enumerate(finite)}
    on_front = sorted((i for i in front if i in pos), key=lambda i: (xs[pos[i]], ys[pos[i]]))
    if on_front:
        ax.plot([xs[pos[i]] for i in on_front], [ys[pos[i]] for i in on_front], "o-", color="black", ms=7,
                mfc="none", lw=1.0, label="Pareto front" if len(labels) >= 2 else "best")
        if point_labels is not None:
            for k, i in enumerate(on_front[:_MAX_FRONT_LABELS]):
                ax.annotate(point_labels[i], (xs[pos[i]], ys[pos[i]]), xytext=(6, 6 if k % 2 == 0 else -10),
                            textcoords="offset points", fontsize=7)
    for axis, vals in (("x", xs), ("y", ys)):
        pos_vals = [v for v in vals if v > 0]
        if len(pos_vals) == len(vals) and vals and max(vals) > 30 * min(vals):
            (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    ax.set_title(wrap_title(title), fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], linestyle="", marker="o", mfc="none", mec="grey"))
    names.append("hollow: misses an SLO")
    fig.legend(handles, names, fontsize=7, loc="outside right upper")
    ax.grid(alpha=0.3)
    return fig


def pareto_png(points: Sequence[Sequence[float]], feasible: Sequence[bool], front: Sequence[int],
               labels: Sequence[str], title: str, *, gpus: Sequence[str | None] | None = None,
               point_labels: Sequence[str] | None = None, modes: Sequence[str] | None = None) -> bytes:
    return _png(pareto_figure(points, feasible, front, labels, title, gpus=gpus, point_labels=point_labels,
                              modes=modes))


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    return [cmap(i % 20) for i in range(n)]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
