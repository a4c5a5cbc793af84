"""What `kernelsight accuracy kernels` reports: the families, the headline over them and the share of
shapes scored per family. Apart from `sim.calibration.accuracy` (which needs pandas) so that the
report and `validate`'s document writer run on the core install."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np

FAMILIES_REPORTED: Final = ("gemm", "attn_prefill", "attn_decode", "pointwise", "nccl", "custom_allreduce", "moe",
                             "mla_prefill", "mla_decode", "mla_bmm", "ep_a2a")
BASE_FAMILIES: Final = FAMILIES_REPORTED[:6]
"""The families of the earlier headline (kept as its own column so the two stay comparable)."""
KEEP_FRAC: Final[dict[str, float]] = {"gemm": 0.12, "attn_prefill": 0.25, "attn_decode": 0.3, "moe": 0.08,
                                      "mla_prefill": 0.5, "mla_decode": 0.5}
"""Share of shapes kept per family (by shape hash); others are kept whole."""


def headline(scores: Mapping[str, Mapping[str, float]], families: tuple[str, ...] | None = None) -> float:
    """Mean over families (all, or `families`) of the per-family median APE."""
    vals = [s["median_ape"] for f, s in scores.items() if families is None or f in families]
    return float(np.mean(vals)) if vals else float("nan")
