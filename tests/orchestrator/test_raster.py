"""The per-trial chart canvas: text lands where it is anchored, long labels are cut, PNGs decode."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from orchestrator.sweep import raster


def _ink(canvas: raster.Canvas) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of the non-white pixels, right and bottom exclusive."""
    rows, cols = np.nonzero((canvas.pixels < 0.5).any(axis=2))
    return int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1


def test_text_is_anchored_where_asked() -> None:
    size_pt = 9.0
    cap_px = 0.73 * size_pt * raster.DPI / 72.0
    left = raster.Canvas(200, 60)
    left.text(20, 10, "HELLO", size_pt, va="top")
    x0, y0, x1, y1 = _ink(left)
    assert abs(x0 - 20) <= 2 and abs(y0 - 10) <= 1 and abs((y1 - y0) - cap_px) <= 1.5
    assert abs((x1 - x0) - raster.text_width_px("HELLO", size_pt)) <= 2

    right = raster.Canvas(200, 60)
    right.text(180, 30, "HELLO", size_pt, ha="right")  # baseline at y = 30
    x0, _, x1, y1 = _ink(right)
    assert abs(x1 - 180) <= 2 and y1 == 30

    centered = raster.Canvas(200, 60)
    centered.text(100, 30, "HELLO", size_pt, ha="center", va="center")
    x0, y0, x1, y1 = _ink(centered)
    assert abs((x0 + x1) / 2 - 100) <= 1.5 and abs((y0 + y1) / 2 - 30) <= 1.5


def test_descenders_go_below_the_baseline_and_kerning_applies() -> None:
    canvas = raster.Canvas(100, 40)
    canvas.text(10, 20, "g", 12.0)
    assert _ink(canvas)[3] > 20
    # DejaVu Sans kerns "AV" tighter than the sum of the two advances
    advances = raster.glyph("A", 12.0).advance_px + raster.glyph("V", 12.0).advance_px
    assert raster.text_width_px("AV", 12.0) < advances


def test_long_labels_are_cut_with_an_ellipsis_to_fit() -> None:
    label = "flash_attn_varlen_fwd_kernel_prefill_attention 12.3%"
    cut = raster.fit_text(label, 7.0, 100.0)
    assert cut.endswith("\u2026") and label.startswith(cut[:-1])
    assert raster.text_width_px(cut, 7.0) <= 100.0 < raster.text_width_px(label, 7.0)
    assert raster.fit_text("qkv_proj 9.5%", 7.0, 100.0) == "qkv_proj 9.5%"


def test_fills_are_clipped_to_the_canvas_and_text_off_the_edge_is_dropped() -> None:
    canvas = raster.Canvas(50, 20)
    canvas.fill(-10, -10, 5, 5, (1.0, 0.0, 0.0))
    canvas.fill(48, 18, 80, 80, (0.0, 0.0, 1.0))
    canvas.text(45, 15, "clipped text", 9.0)
    canvas.text(-500, 10, "gone", 9.0)
    image = np.asarray(Image.open(io.BytesIO(canvas.png())).convert("RGB"))
    assert image.shape == (20, 50, 3)
    assert tuple(image[0, 0]) == (255, 0, 0) and tuple(image[4, 4]) == (255, 0, 0) and tuple(image[5, 5]) != (255, 0, 0)
    assert tuple(image[19, 49]) == (0, 0, 255)
