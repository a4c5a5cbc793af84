"""Numeric formats the simulator prices, with their storage size and tensor-core rate class.

`DType` values are the spellings used in the measured tables (`bfloat16`, `fp8`, `fp8_block`, ...)
so a measured row maps to a member by value. `peak_key` names the dense tensor-core rate in a
hardware spec's `[peak_flops_per_s]` table that the format runs at.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

Quantization = Literal["fp8", "fp8_block", "mxfp4", "nvfp4"]
"""vLLM's `--quantization` methods the simulator prices (`[engine] quantization`, and the draft's
`speculative_config.quantization`)."""


class DType(StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    """Per-tensor scaled FP8 (e4m3)."""
    FP8_BLOCK = "fp8_block"
    """FP8 with 128x128 block scales (DeepSeek-style)."""
    NVFP4 = "nvfp4"
    MXFP4 = "mxfp4"
    INT8 = "int8"
    INT8_WO = "int8_wo"
    """Weight-only int8: weights stored in int8, math in 16-bit."""
    INT4_WO = "int4_wo"

    def bytes_per_element(self) -> float:
        return _BYTES[self]

    def peak_key(self) -> str:
        """Key of the dense tensor-core rate this format computes at."""
        return _PEAK_KEY[self]


_BYTES: Final[dict[DType, float]] = {
    DType.FLOAT32: 4.0,
    DType.BFLOAT16: 2.0,
    DType.FLOAT16: 2.0,
    DType.FP8: 1.0,
    DType.FP8_BLOCK: 1.0,
    # 4-bit values plus one 8-bit scale per 16 (nvfp4) or 32 (mxfp4) elements.
    DType.NVFP4: 0.5 + 1.0 / 16,
    DType.MXFP4: 0.5 + 1.0 / 32,
    DType.INT8: 1.0,
    DType.INT8_WO: 1.0,
    DType.INT4_WO: 0.5,
}

_PEAK_KEY: Final[dict[DType, str]] = {
    # FP32 matmuls in serving run on tensor cores as TF32 at roughly half the bf16 rate; the
    # simulator only meets fp32 in the sampler, which is memory bound, so the bf16 key is used.
    DType.FLOAT32: "bf16",
    DType.BFLOAT16: "bf16",
    DType.FLOAT16: "fp16",
    DType.FP8: "fp8",
    DType.FP8_BLOCK: "fp8",
    DType.NVFP4: "fp4",
    DType.MXFP4: "fp4",
    DType.INT8: "int8",
    DType.INT8_WO: "bf16",
    DType.INT4_WO: "bf16",
}

PEAK_KEYS: Final[tuple[str, ...]] = ("bf16", "fp16", "fp8", "fp4", "int8")
