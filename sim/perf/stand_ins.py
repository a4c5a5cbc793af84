"""Stand-ins: which measured table row prices a table-keyed kernel whose own row its backend never
measured, or measured host-bound (docs/moe-mla.md). The rows the simulator builds
(`table_kernels.work_columns` / `kernel_columns`) pass through `stand_ins` before pricing; rows a
user asks `predict-kernels` about do not. A stand-in row is priced as measured and reported as
extrapolated."""

from __future__ import annotations

from typing import Final

import numpy as np

MOE_STAND_IN: Final[dict[tuple[str, str], str]] = {
    ("vllm", "w4a16_mxfp4"): "int4_wo",
    ("sglang", "w4a16_mxfp4"): "int4_wo",
    ("trtllm", "int4_wo"): "w4a16_mxfp4",
}
"""(backend, moe_dtype) the simulator meets but the backend never measured -> its measured kernel of
the same weight bytes and activation precision, which stands in for it. gpt-oss's MXFP4 experts on a
GPU without FP4 tensor cores run a W4A16 MoE: in TensorRT-LLM its own measured `w4a16_mxfp4` kernel;
vLLM and SGLang measured no MXFP4 MoE, and their W4A16 path (Marlin or triton_kernels' grouped GEMM)
reads the same 4-bit weights with 16-bit activations as their measured `int4_wo` (Marlin) MoE.
Kimi-K2.5's INT4 experts on TensorRT-LLM (no `int4_wo` rows) take its W4A16 MXFP4 kernel by the same
rule (no development row has INT4 experts to check it on; docs/moe-mla.md)."""
MLA_KV_STAND_IN: Final[dict[tuple[str, str], str]] = {("vllm", "fp8"): "bfloat16"}
"""(backend, kv_cache_dtype) of MLA attention rows priced by the backend's other cache format. vLLM's
FP8-cache MLA series (`vllm_flashmla`) is host-bound in the collector's eager timing: a ~210 us floor
(its bf16-cache series: ~162 us) and non-monotone small-work rows (H200, 16 heads, batch 4: 0.65 ms
at 1,024 cached tokens, 0.19 ms at 2,048), so the fitted family would price vLLM's FP8-cache decode
at twice its bf16-cache decode. Until that floor is priced as host time (docs/kernel-model.md, Known
limitations), vLLM's bf16-cache rows, which read twice the cache bytes, stand in for it."""
_STAND_INS: Final[dict[str, tuple[str, dict[tuple[str, str], str]]]] = {
    "moe": ("moe_dtype", MOE_STAND_IN),
    "mla_context": ("kv_cache_dtype", MLA_KV_STAND_IN),
    "mla_generation": ("kv_cache_dtype", MLA_KV_STAND_IN),
}
"""Table -> (the keyed column, its stand-ins by (backend, value))."""


def stand_ins(table: str, rows: dict[str, np.ndarray]) -> np.ndarray:
    """Replace, in simulator-built rows of `table`, each keyed value that stands in for another
    (`MOE_STAND_IN`, `MLA_KV_STAND_IN`); returns the mask of replaced rows (priced by a stand-in:
    extrapolated)."""
    n = len(rows["kernel"])
    column, table_of_stand_ins = _STAND_INS.get(table, ("", {}))
    if column not in rows or "backend" not in rows:
        return np.zeros(n, dtype=bool)
    pairs = list(zip(rows["backend"].tolist(), rows[column].tolist(), strict=True))
    hit = np.array([p in table_of_stand_ins for p in pairs], dtype=bool)
    if hit.any():
        rows[column] = np.array([table_of_stand_ins.get(p, p[1]) for p in pairs], dtype=object)
    return hit
