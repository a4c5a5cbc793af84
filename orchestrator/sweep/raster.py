"""A small RGB canvas that draws filled rectangles and text and encodes a PNG, for charts rendered
once per trial.

A matplotlib figure with a legend costs ~150-350 ms to draw on the 2-core box, most of it shaping
and rasterising the same few dozen glyphs again for every string; one trial's whole simulation
costs less. Here each glyph is rasterised once per process and font size (matplotlib's FreeType
wrapper and its default font, so the text looks like the project's other plots) and strings are
composited from the cached bitmaps with the font's advances and kerning: a chart is ~15 ms
(docs/benchmarks.md, "Sweeps").
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import numpy.typing as npt
from matplotlib.ft2font import FT2Font, Kerning

if TYPE_CHECKING:
    from matplotlib.ft2font import GlyphIndexType

DPI: Final = 90.0
"""Pixels per inch: font sizes are in points, as in matplotlib."""

RGB = tuple[float, float, float]
HAlign = Literal["left", "center", "right"]
VAlign = Literal["top", "baseline", "center"]


@dataclass(frozen=True)
class Glyph:
    """One character's coverage bitmap and where it sits relative to the pen on the baseline."""

    alpha: npt.NDArray[np.float32]
    left_px: int
    top_px: int
    """Rows of the bitmap above the baseline."""
    advance_px: float
    index: GlyphIndexType
    """The font's glyph index, for kerning."""


@lru_cache(maxsize=1)
def _font_path() -> str:
    from matplotlib import font_manager

    return str(font_manager.findfont(font_manager.FontProperties()))


@lru_cache(maxsize=8)
def _font(size_pt: float) -> FT2Font:
    font = FT2Font(_font_path())
    font.set_size(size_pt, DPI)
    return font


@lru_cache(maxsize=4096)
def glyph(char: str, size_pt: float) -> Glyph:
    """`char` rasterised at `size_pt` (anti-aliased, hinted as matplotlib hints), cached for the
    life of the process."""
    font = _font(size_pt)
    loaded = font.load_char(ord(char))
    top_px = math.ceil(loaded.horiBearingY / 64.0)
    pad = 4
    scratch = np.zeros((math.ceil(loaded.height / 64.0) + 2 * pad, math.ceil(loaded.width / 64.0) + 3 * pad),
                       dtype=np.uint8)
    # the bitmap's top row lands on row `pad` (FreeType's bitmap top is the glyph's top bearing)
    font.draw_glyph_to_bitmap(scratch, pad, pad, loaded, antialiased=True)
    rows, cols = np.nonzero(scratch)
    if rows.size == 0:  # a space
        return Glyph(alpha=np.zeros((0, 0), dtype=np.float32), left_px=0, top_px=0,
                     advance_px=loaded.horiAdvance / 64.0, index=font.get_char_index(ord(char)))
    r0, r1, c0, c1 = int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1
    return Glyph(alpha=scratch[r0:r1, c0:c1].astype(np.float32) / 255.0, left_px=c0 - pad,
                 top_px=top_px - (r0 - pad), advance_px=loaded.horiAdvance / 64.0,
                 index=font.get_char_index(ord(char)))


@lru_cache(maxsize=65536)
def _kerning_px(left: GlyphIndexType, right: GlyphIndexType, size_pt: float) -> float:
    return float(_font(size_pt).get_kerning(left, right, Kerning.DEFAULT)) / 64.0


def _pen_positions(text: str, size_pt: float) -> tuple[list[tuple[float, Glyph]], float]:
    """Each character's pen x from the string's start, and the string's advance width."""
    placed: list[tuple[float, Glyph]] = []
    pen = 0.0
    previous: Glyph | None = None
    for char in text:
        g = glyph(char, size_pt)
        if previous is not None:
            pen += _kerning_px(previous.index, g.index, size_pt)
        placed.append((pen, g))
        pen += g.advance_px
        previous = g
    return placed, pen


def text_width_px(text: str, size_pt: float) -> float:
    return _pen_positions(text, size_pt)[1]


def line_height_px(size_pt: float) -> float:
    """Baseline-to-baseline distance of one line of text, as matplotlib spaces multi-line text."""
    return 1.2 * size_pt * DPI / 72.0


def fit_text(text: str, size_pt: float, width_px: float) -> str:
    """`text`, cut short with an ellipsis if it is wider than `width_px`."""
    if text_width_px(text, size_pt) <= width_px:
        return text
    while text and text_width_px(text + "\u2026", size_pt) > width_px:
        text = text[:-1]
    return text + "\u2026"


class Canvas:
    """A white RGB image, drawn on in pixels (x right, y down)."""

    def __init__(self, width_px: int, height_px: int) -> None:
        self.width_px = width_px
        self.height_px = height_px
        self.pixels = np.ones((height_px, width_px, 3), dtype=np.float32)

    def fill(self, x0: float, y0: float, x1: float, y1: float, color: RGB) -> None:
        """The rectangle [x0, x1) x [y0, y1), snapped to whole pixels, at least one pixel wide."""
        left, top = max(0, round(x0)), max(0, round(y0))
        right, bottom = min(self.width_px, max(round(x1), left + 1)), min(self.height_px, max(round(y1), top + 1))
        if right > left and bottom > top:
            self.pixels[top:bottom, left:right] = color

    def text(self, x: float, y: float, text: str, size_pt: float, color: RGB = (0.0, 0.0, 0.0), *,
             ha: HAlign = "left", va: VAlign = "baseline") -> None:
        """One line of text anchored at (x, y): `va` says whether y is its baseline, the top of its
        capitals or the middle between the two."""
        placed, width = _pen_positions(text, size_pt)
        start = x - {"left": 0.0, "center": width / 2.0, "right": width}[ha]
        cap_px = 0.73 * size_pt * DPI / 72.0  # DejaVu Sans capitals are 0.73 em tall
        baseline = round(y + {"baseline": 0.0, "top": cap_px, "center": cap_px / 2.0}[va])
        ink = np.asarray(color, dtype=np.float32)
        for pen, g in placed:
            rows, cols = g.alpha.shape
            left, top = round(start + pen) + g.left_px, baseline - g.top_px
            # clip the bitmap to the canvas
            r0, c0 = max(0, -top), max(0, -left)
            r1, c1 = min(rows, self.height_px - top), min(cols, self.width_px - left)
            if r1 <= r0 or c1 <= c0:
                continue
            a = g.alpha[r0:r1, c0:c1, None]
            region = self.pixels[top + r0:top + r1, left + c0:left + c1]
            region += (ink - region) * a

    def png(self) -> bytes:
        from PIL import Image

        buf = io.BytesIO()
        rgb8 = np.rint(np.clip(self.pixels, 0.0, 1.0) * 255.0).astype(np.uint8)
        # A flat-coloured chart compresses about as well at level 1 as at 6, in a fraction of the time.
        Image.fromarray(rgb8, "RGB").save(buf, format="PNG", compress_level=1)
        return buf.getvalue()
