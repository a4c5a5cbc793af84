"""The model-agnostic microbenchmark sweep a target GPU measures for the target-measured tier.

A fixed grid of kernel shapes that does not depend on any LLM: GEMM on a 6 x 6 grid of (n, k)
sites (log-spaced, 128 .. 65536) over the token range, per dtype; attention at eleven head
configurations (GQA ratios 1..64, head dims 64/128/256, one sliding window) over batch and
length, per KV dtype; collectives at ten message sizes (1 KiB .. 256 MiB) per group size; and
the small memory-bound kernels (norm, add, silu_and_mul, rope, embedding) at a few widths. One
sweep per backend (the framework whose kernels the simulator prices). Every point uses values
present in the AIConfigurator collector grids (and Vidur's model shapes for the small kernels),
so a sweep can also be cut out of an existing table; the grids were chosen by leave-one-GPU-out
on the five training GPUs (docs/kernel-model.md). The GPU-time estimate assumes 30 calls per
point at the cross-generation prediction (5 warm-up plus 25 timed calls), plus 0.15 s of setup
per point.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sim.calibration.rows import ROW_COLUMNS
from sim.specs.hardware import HardwareSpec

GEMM_NK: Final = (128, 512, 2048, 6144, 16384, 65536)
"""n and k values of the GEMM sites (every pair: a 6 x 6 grid in log space)."""
GEMM_TOKENS: Final = (1, 16, 64, 256, 1024, 4096, 16384)
MAX_GEMM_FLOPS: Final = 5.0e11
"""Largest GEMM point (2mnk) measured: keeps the sweep inside its GPU-time budget."""
HEAD_CONFIGS: Final[tuple[tuple[int, int, int, int], ...]] = (
    (2, 1, 128, 0), (8, 1, 128, 0), (64, 1, 128, 0), (12, 4, 128, 0), (32, 8, 128, 0), (96, 8, 128, 0),
    (64, 64, 128, 0), (16, 2, 64, 0), (4, 4, 256, 0), (32, 4, 256, 0), (32, 4, 64, 128))
"""(heads, kv_heads, head_dim, window) per GPU: GQA ratios 1..64, head dims 64..256, one sliding window."""
PREFILL_BATCH: Final = (1, 4, 16, 64)
PREFILL_SEQ: Final = (16, 128, 1024, 8192)
MAX_PREFILL_TOKENS: Final = 32768
DECODE_BATCH: Final = (1, 8, 64, 512)
DECODE_KV: Final = (15, 255, 2047, 16383)
MAX_DECODE_KV_BYTES: Final = 4 * 2**30
MESSAGE_BYTES: Final = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456)
POINTWISE_OPS: Final[tuple[tuple[str, str, tuple[int, ...]], ...]] = (
    ("norm", "rms_norm", (4096, 8192)), ("elementwise", "add", (4096, 8192)),
    ("elementwise", "silu_and_mul", (3584, 14336)), ("elementwise", "rope", (1024, 4096, 16384)),
    ("embedding", "", (4096, 8192)))
"""(kernel, variant, widths) of the small memory-bound kernels (pointwise.csv)."""
POINTWISE_TOKENS: Final = (1, 8, 64, 256, 1024, 4096)
NCCL_KERNELS: Final = ("nccl_all_reduce", "nccl_all_gather", "nccl_reduce_scatter", "nccl_alltoall")
MOE_CONFIGS: Final[tuple[tuple[int, int, int, int], ...]] = (
    (2048, 768, 8, 128), (4096, 14336, 2, 8), (7168, 2048, 8, 256))
"""(hidden, expert width, top-k, experts) of the MoE points: small/many, wide/few, DeepSeek-like."""
MOE_PARALLEL: Final[tuple[tuple[int, int], ...]] = ((1, 1), (1, 8))
"""(moe_tp_size, moe_ep_size) of the MoE points."""
MOE_TOKENS: Final = (1, 8, 64, 512, 4096, 16384)
MOE_DISTRIBUTIONS: Final = ("balanced", "power_law_1.2")
MLA_HEADS: Final = (128, 16)
"""Per-GPU query heads of the MLA points (TP 1 and TP 8 of DeepSeek's 128)."""
MLA_PREFILL_SHAPES: Final = ((1, 128), (1, 1024), (1, 8192), (8, 128), (8, 1024), (64, 128))
"""(batch, prompt tokens) of the MLA prefill points."""
MLA_DECODE_BATCH: Final = (1, 16, 128)
MLA_DECODE_KV: Final = (128, 2048, 16384)
MLA_BMM_TOKENS: Final = (1, 16, 256, 4096)
DEEPEP_CONFIGS: Final[tuple[tuple[int, int, int], ...]] = ((7168, 8, 256), (4096, 8, 128))
"""(hidden, top-k, experts) of the DeepEP points (8 GPUs of one NVLink node)."""
DEEPEP_LL_TOKENS: Final = (1, 16, 128, 512)
DEEPEP_NORMAL_TOKENS: Final = (128, 1024, 8192, 32768)
MAX_POINTS: Final = 2500
MAX_GPU_S: Final = 20 * 60.0
CALLS_PER_POINT: Final = 30
SETUP_S_PER_POINT: Final = 0.15


MLA_KV_DTYPES: Final = ("bfloat16", "fp8")
"""KV-cache formats of the MLA points on every GPU: an FP8 cache is a storage format (TRT-LLM runs
it on A100 too), so its kernels are measured wherever they exist."""
MOE_EXTRA_DTYPES: Final = ("int4_wo",)
"""MoE weight formats measured on every GPU beyond its GEMM formats: weight-only int4 (Marlin-class
W4A16 kernels run on every generation)."""



@dataclass(frozen=True, slots=True, kw_only=True)
class PlanGrid:
    """The sweep's grids (the defaults are the shipped plan)."""

    gemm_nk: tuple[int, ...] = GEMM_NK
    gemm_tokens: tuple[int, ...] = GEMM_TOKENS
    max_gemm_flops: float = MAX_GEMM_FLOPS
    head_configs: tuple[tuple[int, int, int, int], ...] = HEAD_CONFIGS
    prefill_batch: tuple[int, ...] = PREFILL_BATCH
    prefill_seq: tuple[int, ...] = PREFILL_SEQ
    decode_batch: tuple[int, ...] = DECODE_BATCH
    decode_kv: tuple[int, ...] = DECODE_KV
    message_bytes: tuple[int, ...] = MESSAGE_BYTES
    pointwise_ops: tuple[tuple[str, str, tuple[int, ...]], ...] = POINTWISE_OPS
    pointwise_tokens: tuple[int, ...] = POINTWISE_TOKENS
    moe_configs: tuple[tuple[int, int, int, int], ...] = MOE_CONFIGS
    moe_tokens: tuple[int, ...] = MOE_TOKENS
    moe_extra_dtypes: tuple[str, ...] = MOE_EXTRA_DTYPES
    mla_heads: tuple[int, ...] = MLA_HEADS
    mla_kv_dtypes: tuple[str, ...] = MLA_KV_DTYPES
    mla_module_kv_dtypes: tuple[str, ...] = MLA_KV_DTYPES
    mla_module_decode_batch: tuple[int, ...] = MLA_DECODE_BATCH
    mla_module_decode_kv: tuple[int, ...] = MLA_DECODE_KV


DEFAULT_GRID: Final = PlanGrid()


def _row(**values: object) -> dict[str, str]:
    return {c: str(values.get(c, "")) for c in ROW_COLUMNS}


def gemm_dtypes(hw: HardwareSpec) -> tuple[str, ...]:
    out = ["bfloat16"]
    if "fp8" in hw.peak_flops_per_s:
        out += ["fp8", "fp8_block"]
    if "fp4" in hw.peak_flops_per_s:
        out.append("nvfp4")
    return tuple(out)


def prefill_dtypes(hw: HardwareSpec) -> tuple[tuple[str, str], ...]:
    """(attn_dtype, kv_cache_dtype) of prefill points: bf16, and fp8 KV / fp8 compute where supported."""
    if "fp8" not in hw.peak_flops_per_s:
        return (("bfloat16", "bfloat16"),)
    return (("bfloat16", "bfloat16"), ("bfloat16", "fp8"), ("fp8", "fp8"))


def decode_kv_dtypes(hw: HardwareSpec) -> tuple[str, ...]:
    return ("bfloat16", "fp8") if "fp8" in hw.peak_flops_per_s else ("bfloat16",)


def moe_dtypes(hw: HardwareSpec, grid: PlanGrid = DEFAULT_GRID) -> tuple[str, ...]:
    """MoE weight formats: the GPU's GEMM formats plus `grid.moe_extra_dtypes`."""
    return (*gemm_dtypes(hw), *grid.moe_extra_dtypes)


def mla_gemm_types(hw: HardwareSpec) -> tuple[str, ...]:
    """Projection GEMM formats of the MLA module points (the GPU's block formats)."""
    out = ["bfloat16"]
    if "fp8" in hw.peak_flops_per_s:
        out.append("fp8_block")
    if "fp4" in hw.peak_flops_per_s:
        out.append("nvfp4")
    return tuple(out)


def mla_bmm_dtypes(hw: HardwareSpec) -> tuple[str, ...]:
    return ("bfloat16", "fp8") if "fp8" in hw.peak_flops_per_s else ("bfloat16",)


def microbench_plan(hw: HardwareSpec, grid: PlanGrid = DEFAULT_GRID) -> list[dict[str, str]]:
    """The sweep's rows in the `predict-kernels` schema (backend left blank: one sweep per backend)."""
    rows: list[dict[str, str]] = []
    for dtype in gemm_dtypes(hw):
        rows += [_row(kernel="gemm", dtype=dtype, m=m, n=n, k=k)
                 for n in grid.gemm_nk for k in grid.gemm_nk for m in grid.gemm_tokens
                 if 2.0 * m * n * k <= grid.max_gemm_flops]
    for heads, kv_heads, head_dim, window in grid.head_configs:
        shape = {"num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim, "window_size": window}
        for act, kvd in prefill_dtypes(hw):
            rows += [_row(kernel="context_attention", batch_size=b, seq_len=s, attn_dtype=act,
                          kv_cache_dtype=kvd, **shape)
                     for b in grid.prefill_batch for s in grid.prefill_seq if b * s <= MAX_PREFILL_TOKENS]
        for kvd in decode_kv_dtypes(hw):
            kv_bytes_per_token = 2 * kv_heads * head_dim * (1 if kvd == "fp8" else 2)
            rows += [_row(kernel="generation_attention", batch_size=b, kv_len=kv, attn_dtype="bfloat16",
                          kv_cache_dtype=kvd, **shape)
                     for b in grid.decode_batch for kv in grid.decode_kv
                     if b * (kv + 1) * kv_bytes_per_token <= MAX_DECODE_KV_BYTES]
    groups = [g for g in (2, 4, 8) if g <= hw.num_gpus_per_node]
    for g in groups:
        for msg in grid.message_bytes:
            rows += [_row(kernel=k, num_gpus=g, message_bytes=msg) for k in NCCL_KERNELS]
            rows.append(_row(kernel="custom_allreduce", num_gpus=g, message_bytes=msg))
    for kernel, variant, widths in grid.pointwise_ops:
        rows += [_row(kernel=kernel, variant=variant, dtype="bfloat16", m=t, n=w)
                 for w in widths for t in grid.pointwise_tokens]
    return rows + table_plan(hw, grid)


def table_plan(hw: HardwareSpec, grid: PlanGrid = DEFAULT_GRID) -> list[dict[str, str]]:
    """The table-keyed families' points (MoE, MLA, MLA-BMM; DeepEP on 8-GPU NVLink nodes)."""
    rows: list[dict[str, str]] = []
    for dtype in moe_dtypes(hw, grid):
        rows += [_row(kernel="moe", moe_dtype=dtype, num_tokens=t, hidden_size=h, inter_size=i, topk=k,
                      num_experts=e, moe_tp_size=tp, moe_ep_size=ep, distribution=d)
                 for h, i, k, e in grid.moe_configs for tp, ep in MOE_PARALLEL for d in MOE_DISTRIBUTIONS
                 for t in grid.moe_tokens]
    kv_dtypes = grid.mla_kv_dtypes
    gemm_types = mla_gemm_types(hw)
    for heads in grid.mla_heads:
        for kvd in kv_dtypes:
            rows += [_row(kernel="mla_context", num_heads=heads, batch_size=b, seq_len=s, kv_cache_dtype=kvd)
                     for b, s in MLA_PREFILL_SHAPES]
            rows += [_row(kernel="mla_generation", num_heads=heads, batch_size=b, kv_len=kv, kv_cache_dtype=kvd)
                     for b in MLA_DECODE_BATCH for kv in MLA_DECODE_KV]
        for kvd in grid.mla_module_kv_dtypes:
            for gt in gemm_types:
                rows += [_row(kernel="mla_module_context", num_heads=heads, batch_size=b, seq_len=s,
                              kv_cache_dtype=kvd, gemm_type=gt) for b, s in MLA_PREFILL_SHAPES]
                rows += [_row(kernel="mla_module_generation", num_heads=heads, batch_size=b, kv_len=kv,
                              kv_cache_dtype=kvd, gemm_type=gt)
                         for b in grid.mla_module_decode_batch for kv in grid.mla_module_decode_kv]
        rows += [_row(kernel="mla_bmm", op_name=op, bmm_dtype=d, num_tokens=t, num_heads=heads)
                 for op in ("mla_gen_pre", "mla_gen_post") for d in mla_bmm_dtypes(hw) for t in MLA_BMM_TOKENS]
    if hw.num_gpus_per_node >= 8 and hw.intra_node_link.kind == "nvlink":
        for h, k, e in DEEPEP_CONFIGS:
            rows += [_row(kernel="deepep_ll", node_num=1, num_gpus=8, hidden_size=h, num_tokens_per_rank=t, topk=k,
                          num_experts=e) for t in DEEPEP_LL_TOKENS]
            rows += [_row(kernel="deepep_normal", node_num=1, num_gpus=8, hidden_size=h, num_tokens_per_rank=t,
                          topk=k, num_experts=e, dispatch_sms=24, combine_sms=24) for t in DEEPEP_NORMAL_TOKENS]
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
    "pointwise": ("kernel", "variant", "m", "n"),
    "moe": ("kernel", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size", "distribution"),
    "mla_context": ("kernel", "num_heads", "batch_size", "seq_len", "kv_cache_dtype"),
    "mla_generation": ("kernel", "num_heads", "batch_size", "kv_len", "kv_cache_dtype"),
    "mla_module_context": ("kernel", "num_heads", "batch_size", "seq_len", "kv_cache_dtype", "gemm_type"),
    "mla_module_generation": ("kernel", "num_heads", "batch_size", "kv_len", "kv_cache_dtype", "gemm_type"),
    "mla_bmm": ("kernel", "op_name", "bmm_dtype", "num_tokens", "num_heads"),
    "deepep_ll": ("kernel", "node_num", "num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts"),
    "deepep_normal": ("kernel", "node_num", "num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts",
                      "dispatch_sms"),
}
"""Columns that identify a plan point (backend-independent)."""
KEY_OFFSETS: Final[dict[str, tuple[str, int]]] = {"mla_module_generation": ("kv_len", 1)}
"""Plan-point columns a measured table may record shifted: AIConfigurator's TRT-LLM and vLLM MLA
module decode rows count the decoded token in `kv_len` (129 for 128 cached tokens; SGLang's do
not), so a table row at `kv_len` = plan value + offset is that plan point too."""


def plan_key_family(kernel: str) -> str:
    if kernel in ("norm", "elementwise", "embedding", "sampling"):
        return "pointwise"
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
