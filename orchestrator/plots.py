"""Predicted-vs-measured scatter plots (PNG) for `kernelsight validate`; matplotlib lives here, not in sim/."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

_MARKERS = {"aiconfigurator": "o", "llmservingsim": "s", "trtllm_throughput": "^", "trtllm_static": "D"}
_PANELS = (("ttft_mean_s", "mean TTFT (s)"), ("tpot_mean_s", "mean TPOT (s)"),
           ("output_throughput_tokens_per_s", "output tokens/s"))


def scatter_png(path: Path, points: Sequence[tuple[str, str, float, float]], title: str) -> bool:
    """(source, metric key, predicted, measured) points -> one log-log panel per metric; False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, label) for k, label in _PANELS if any(p[1] == k for p in points)]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.4), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        lo, hi = math.inf, 0.0
        for source, marker in _MARKERS.items():
            xs = [m for s, k, p, m in points if s == source and k == key and p > 0 and m > 0]
            ys = [p for s, k, p, m in points if s == source and k == key and p > 0 and m > 0]
            if xs:
                ax.scatter(xs, ys, s=12, marker=marker, alpha=0.6, label=f"{source} ({len(xs)})")
                lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
            for f in (0.8, 1.25):
                ax.plot([lo, hi], [lo * f, hi * f], color="grey", linewidth=0.5, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, which="both", linewidth=0.2)
    fig.suptitle(f"{title} (dashed: +-25%)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
