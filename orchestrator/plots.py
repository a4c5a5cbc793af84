"""Predicted-vs-measured scatter plots (PNG) for `kernelsight validate`; matplotlib lives here, not in sim/.

Colour is the GPU (`orchestrator.plot_style.GPU_COLORS`, as in every plot), marker the data source.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from orchestrator.plot_style import gpu_color, short_gpu, unit_of, wrap_title

_MARKERS = {"aiconfigurator": "o", "llmservingsim": "s", "trtllm_throughput": "^", "trtllm_static": "D"}
_PANELS = (("ttft_mean_s", "mean TTFT"), ("tpot_mean_s", "mean TPOT"),
           ("output_throughput_tokens_per_s", "output throughput"))


class ScatterPoint(NamedTuple):
    source: str
    hardware: str
    metric: str
    predicted: float
    measured: float


def scatter_figure(points: Sequence[ScatterPoint], title: str) -> Any:
    """One log-log panel per metric (None if nothing to plot); a `matplotlib.figure.Figure`."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    panels = [(k, label) for k, label in _PANELS if any(p.metric == k for p in points)]
    if not panels:
        return None
    fig = Figure(figsize=(4.8 * len(panels), 5.0), dpi=110, layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)
    gpus = sorted({p.hardware for p in points})
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        lo, hi = math.inf, 0.0
        for source, marker in _MARKERS.items():
            for gpu in gpus:
                pts = [p for p in points if p.source == source and p.hardware == gpu and p.metric == key
                       and p.predicted > 0 and p.measured > 0]
                if pts:
                    xs, ys = [p.measured for p in pts], [p.predicted for p in pts]
                    ax.scatter(xs, ys, s=14, marker=marker, alpha=0.7, color=gpu_color(gpu))
                    lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
            for f in (0.8, 1.25):
                ax.plot([lo, hi], [lo * f, hi * f], color="grey", linewidth=0.5, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        unit = unit_of(key)
        ax.set_xlabel(f"measured {label} [{unit}]")
        ax.set_ylabel(f"predicted {label} [{unit}]")
        ax.grid(True, which="both", linewidth=0.2)
    used_sources = [s for s in _MARKERS if any(p.source == s for p in points)]
    handles = [Line2D([], [], linestyle="", marker="o", color=gpu_color(g), label=short_gpu(g)) for g in gpus]
    handles += [Line2D([], [], linestyle="", marker=_MARKERS[s], color="grey",
                       label=f"{s} ({sum(p.source == s for p in points)})") for s in used_sources]
    fig.legend(handles=handles, fontsize=7, loc="outside lower center", ncols=min(8, len(handles)), frameon=False)
    fig.suptitle(wrap_title(f"{title} (dashed: +-25%)", 40 * len(panels)))
    return fig


def scatter_png(path: Path, points: Sequence[ScatterPoint], title: str) -> bool:
    """Write the scatter of `points` to `path`; False if nothing to plot."""
    fig = scatter_figure(points, title)
    if fig is None:
        return False
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return True
