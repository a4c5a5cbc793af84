"""The model-agnostic microbenchmark sweep a target GPU measures for the target-measured tier.

A fixed grid of kernel shapes that does not depend on any LLM: GEMM at a few (n, k) sites over
the whole token range, attention at three head configurations (GQA 8:1, GQA 4:1, MHA) over
batch and length, and collectives at a handful of message sizes per group size. Every point uses
values present in the AIConfigurator collector grids, so a sweep can also be cut out of an
existing table. The GPU-time estimate assumes 30 calls per point at the
cross-generation prediction (5 warm-up plus 25 timed calls), plus 0.15 s of setup per point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from sim.calibration.rows import ROW_COLUMNS
from sim.specs.hardware import HardwareSpec

GEMM_SITES: Final[tuple[tuple[int, int], ...]] = (
    (1024, 1024), (4096, 4096), (8192, 8192), (1536, 6144), (6144, 1536), (3072, 12288),
    (12288, 3072), (16384, 4096))
"""(n, k) pairs: square, wide, tall and an LM-head-like site."""
GEMM_TOKENS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
HEAD_CONFIGS: Final[tuple[tuple[int, int, int], ...]] = ((8, 1, 128), (32, 8, 128), (64, 64, 128))
PREFILL_BATCH: Final = (1, 4, 16, 64)
PREFILL_SEQ: Final = (16, 128, 512, 1024, 2048, 4096, 8192)
MAX_PREFILL_TOKENS: Final = 32768
MAX_DECODE_KV_BYTES: Final = 4 * 2**30
DECODE_BATCH: Final = (1, 8, 32, 128, 512)
DECODE_KV: Final = (15, 127, 1023, 4095, 16383)
MESSAGE_BYTES: Final = (4096, 65536, 1048576, 16777216, 67108864)
NCCL_KERNELS: Final = ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_alltoall")
MAX_POINTS: Final = 2000
MAX_GPU_S: Final = 15 * 60.0
CALLS_PER_POINT: Final = 30
SETUP_S_PER_POINT: Final = 0.15


def _row(**values: object) -> dict[str, str]:
    return {c: str(values.get(c, "")) for c in ROW_COLUMNS}


def gemm_dtypes(hw: HardwareSpec) -> tuple[str, ...]:
    out = ["bfloat16"]
    if "fp8" in hw.peak_flops_per_s:
        out += ["fp8", "fp8_block"]
    if "fp4" in hw.peak_flops_per_s:
        out.append("nvfp4")
    return tuple(out)


def microbench_plan(hw: HardwareSpec) -> list[dict[str, str]]:
    """The sweep's rows in the `predict-kernels` schema (backend left blank: the one simulated)."""
    rows: list[dict[str, str]] = []
    for dtype in gemm_dtypes(hw):
        for n, k in GEMM_SITES:
            rows += [_row(kernel="gemm", dtype=dtype, m=m, n=n, k=k) for m in GEMM_TOKENS]
    kv_dtypes = ("bfloat16", "fp8") if "fp8" in hw.peak_flops_per_s else ("bfloat16",)
    for heads, kv_heads, head_dim in HEAD_CONFIGS:
        for kvd in kv_dtypes:
            common = {"attn_dtype": "bfloat16", "kv_cache_dtype": kvd, "num_heads": heads,
                      "num_kv_heads": kv_heads, "head_dim": head_dim, "window_size": 0}
            rows += [_row(kernel="context_attention", batch_size=b, seq_len=s, **common)
                     for b in PREFILL_BATCH for s in PREFILL_SEQ if b * s <= MAX_PREFILL_TOKENS]
            kv_bytes_per_token = 2 * kv_heads * head_dim * (1 if kvd == "fp8" else 2)
            rows += [_row(kernel="generation_attention", batch_size=b, kv_len=kv, **common)
                     for b in DECODE_BATCH for kv in DECODE_KV
                     if b * (kv + 1) * kv_bytes_per_token <= MAX_DECODE_KV_BYTES]
    groups = [g for g in (2, 4, 8) if g <= hw.num_gpus_per_node]
    for g in groups:
        for msg in MESSAGE_BYTES:
            rows += [_row(kernel=k, num_gpus=g, message_bytes=msg) for k in NCCL_KERNELS]
            rows.append(_row(kernel="custom_allreduce", num_gpus=g, message_bytes=msg))
    return rows


def estimate_gpu_s(rows: list[dict[str, str]], latency_s: Callable[[list[dict[str, str]]], list[float]]
                   ) -> float:
    """Estimated device time of the sweep given a latency predictor for its rows."""
    return sum(CALLS_PER_POINT * t + SETUP_S_PER_POINT for t in latency_s(rows))


PLAN_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("kernel", "dtype", "m", "n", "k"),
    "context_attention": ("kernel", "attn_dtype", "kv_cache_dtype", "batch_size", "seq_len",
                          "num_heads", "num_kv_heads", "head_dim", "window_size"),
    "generation_attention": ("kernel", "attn_dtype", "kv_cache_dtype", "batch_size", "kv_len",
                             "num_heads", "num_kv_heads", "head_dim", "window_size"),
    "collective": ("kernel", "num_gpus", "message_bytes"),
}
"""Columns that identify a plan point (backend-independent)."""


def plan_key_family(kernel: str) -> str:
    return kernel if kernel in PLAN_KEYS else "collective"


def point_key(row: dict[str, object]) -> str:
    cols = PLAN_KEYS[plan_key_family(str(row["kernel"]))]
    return "|".join(_norm(row.get(c, "")) for c in cols)


def _norm(value: object) -> str:
    text = str(value)
    try:
        f = float(text)
    except ValueError:
        return text
    return str(int(f)) if f == int(f) else text
