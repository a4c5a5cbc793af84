"""Files recorded with MLflow runs: kernel breakdown (Parquet + stacked bar), Pareto front (CSV + plot).

The Pareto plot uses matplotlib's object API on the Agg canvas (no pyplot global state); the
per-trial breakdown bar is drawn on `raster.Canvas` (~15 ms against 160-340 ms for a figure). Both are returned as
bytes, so actors can render a trial's files and the driver only uploads them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.plot_style import gpu_color, short_gpu, wrap_title
from orchestrator.sweep import raster
from orchestrator.sweep.results import Breakdown
from orchestrator.sweep.spec import ParamValue

if TYPE_CHECKING:
    from matplotlib.figure import Figure

BREAKDOWN_PARQUET: Final = "kernel_breakdown.parquet"
BREAKDOWN_PNG: Final = "kernel_breakdown.png"
_TOP_KERNELS: Final = 9
_NOT_KERNELS: Final = ("host", "launch_floor")
_WIDTH_PX: Final = 720
_MARGIN_PX: Final = 10
_AXES_INSET_PX: Final = 18
_BAR_PX: Final = 56
_LEGEND_COLUMNS: Final = 4
_LEGEND_ROW_PX: Final = 14
_MAX_FRONT_LABELS: Final = 16
_MODE_MARKERS: Final = {"aggregated": "o", "disaggregated": "^"}


def breakdown_parquet(breakdown: Breakdown) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(breakdown.rows()), sink)
    return bytes(sink.getvalue().to_pybytes())


def breakdown_parts(breakdown: Breakdown) -> list[tuple[str, float]]:
    """The chart's segments: the largest kernels, the rest as one, then host time and the launch floor."""
    rows = breakdown.rows()
    kernels = [r for r in rows if r["kernel"] not in _NOT_KERNELS]
    parts = [(str(r["kernel"]), float(r["share"])) for r in kernels[:_TOP_KERNELS]]
    other = sum(float(r["share"]) for r in kernels[_TOP_KERNELS:])
    if other > 0:
        parts.append(("other kernels", other))
    return parts + [(str(r["kernel"]), float(r["share"])) for r in rows if r["kernel"] in _NOT_KERNELS]


def breakdown_png(breakdown: Breakdown, title: str) -> bytes:
    """One horizontal bar of the run's busy time split by kernel (largest first), plus host time,
    with a legend of shares below it.

    Drawn on `raster.Canvas` rather than a matplotlib figure: an actor renders one per trial, and a
    figure with a legend cost more than the trial's simulation (docs/benchmarks.md, "Sweeps").
    """
    parts = breakdown_parts(breakdown)
    title_lines = wrap_title(title, 100).split("\n")
    title_h, tick_h = raster.line_height_px(9.0), raster.line_height_px(8.0)
    legend_rows = -(-len(parts) // _LEGEND_COLUMNS)
    bar_top = _MARGIN_PX + len(title_lines) * title_h + 6
    axis_y = bar_top + _BAR_PX
    xlabel_y = axis_y + 5 + tick_h + 4
    legend_top = xlabel_y + raster.line_height_px(9.0) + 8
    height = round(legend_top + legend_rows * _LEGEND_ROW_PX + _MARGIN_PX)
    canvas = raster.Canvas(_WIDTH_PX, height)
    for k, line in enumerate(title_lines):
        canvas.text(_WIDTH_PX / 2, _MARGIN_PX + k * title_h, line, 9.0, ha="center", va="top")
    x0, x1 = float(_AXES_INSET_PX), float(_WIDTH_PX - _AXES_INSET_PX)  # room for half of "100"
    colors = _colors(len(parts))
    left = 0.0
    for (_, share), color in zip(parts, colors, strict=True):
        if share > 0:
            canvas.fill(x0 + left * (x1 - x0), bar_top, x0 + (left + share) * (x1 - x0), axis_y, color)
        left += share
    black = (0.0, 0.0, 0.0)
    # the axes frame, one pixel outside the bar on every side
    canvas.fill(x0 - 1, bar_top - 1, x1 + 1, bar_top, black)
    canvas.fill(x0 - 1, axis_y, x1 + 1, axis_y + 1, black)
    canvas.fill(x0 - 1, bar_top, x0, axis_y, black)
    canvas.fill(x1, bar_top, x1 + 1, axis_y, black)
    for pct in range(0, 101, 20):
        x = x0 + pct / 100 * (x1 - x0)
        canvas.fill(x - 0.5, axis_y, x + 0.5, axis_y + 5, black)
        canvas.text(x, axis_y + 6, str(pct), 8.0, ha="center", va="top")
    canvas.text(_WIDTH_PX / 2, xlabel_y, breakdown_xlabel(breakdown), 9.0, ha="center", va="top")
    column_px = (x1 - x0) / _LEGEND_COLUMNS
    for k, ((name, share), color) in enumerate(zip(parts, colors, strict=True)):
        x = x0 + (k % _LEGEND_COLUMNS) * column_px
        y = legend_top + (k // _LEGEND_COLUMNS) * _LEGEND_ROW_PX
        canvas.fill(x, y, x + 14, y + 8, color)
        label = raster.fit_text(f"{name} {share:.1%}", 7.0, column_px - 24)
        canvas.text(x + 18, y + 4, label, 7.0, va="center")
    return canvas.png()


def breakdown_xlabel(breakdown: Breakdown) -> str:
    return f"share of {breakdown.total_s():.3g} s busy time (%)"


def trial_title(number: int, params: Mapping[str, ParamValue], limit: int = 110) -> str:
    """The breakdown PNG's title of trial `number`: its number and parameters (last key part), the
    same whether the trial was simulated or answered from the cache."""
    text = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in params.items())
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"trial {number}: {text}"


def trial_artifacts(breakdown: Breakdown, title: str, *, plot: bool = True) -> dict[str, bytes]:
    """The Parquet breakdown, and with `plot` its stacked-bar PNG (`--no-trial-plots` drops the PNG only)."""
    out = {BREAKDOWN_PARQUET: breakdown_parquet(breakdown)}
    if plot:
        out[BREAKDOWN_PNG] = breakdown_png(breakdown, title)
    return out


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
    # matplotlib's figure machinery is imported here, not with the module: actors import this
    # module for the breakdown chart, which does not need it (~1 s of imports).
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

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


def _colors(n: int) -> list[raster.RGB]:
    from matplotlib import colormaps

    cmap = colormaps["tab20"]
    colors: list[raster.RGB] = []
    for i in range(n):
        red, green, blue, _ = cmap(i % 20)
        colors.append((float(red), float(green), float(blue)))
    return colors


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
