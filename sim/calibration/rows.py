"""The kernel-row schema of `kernelsight predict-kernels`, and rows as `KernelWork`.

One row is one measured (or to-be-predicted) kernel call, with the meanings of
shared/data/README.md: `kernel` is gemm | context_attention | generation_attention |
nccl_all_reduce | nccl_all_gather | nccl_reduce_scatter | nccl_alltoall | custom_allreduce |
norm | elementwise | embedding | sampling (small memory-bound kernels: m = tokens, n = width);
blank cells are "not applicable". Malformed rows raise `ConfigError` naming row and column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from sim.dtypes import DType
from sim.errors import ConfigError
from sim.graph.kernels import KernelKind, KernelWork, gemm_work
from sim.graph.transformer import collective_work, decode_attention_work, prefill_attention_work
from sim.perf.table_kernels import (
    MOE_DTYPES,
    NUMERIC,
    REQUIRED,
    TABLE_COLUMNS,
    TABLE_FAMILY,
    table_batch,
)
from sim.specs.catalog import load_hardware
from sim.specs.engine import routing_alpha

BASE_COLUMNS: Final[tuple[str, ...]] = (
    "kernel", "backend", "backend_version", "kernel_source", "dtype", "m", "n", "k", "batch_size",
    "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim", "attn_dtype", "kv_cache_dtype",
    "window_size", "num_gpus", "message_bytes", "variant",
)
"""Columns of the GEMM, attention, collective and small-kernel rows."""
TABLE_ROW_COLUMNS: Final[tuple[str, ...]] = tuple(dict.fromkeys(
    c for cols in TABLE_COLUMNS.values() for c in cols if c not in BASE_COLUMNS))
"""Columns the table-keyed kernels (MoE, MLA, DeepEP; `kernel` = table name) add, named as in the
data README."""
ROW_COLUMNS: Final[tuple[str, ...]] = (*BASE_COLUMNS, *TABLE_ROW_COLUMNS)
INTERVAL_COLUMNS: Final = ("predicted_latency_lo_ms", "predicted_latency_hi_ms")
"""Nominal 90% interval of each prediction (sim.calibration.intervals)."""
PREDICTION_COLUMNS: Final[tuple[str, ...]] = (*BASE_COLUMNS, "predicted_latency_ms", "provenance",
                                              *TABLE_ROW_COLUMNS, *INTERVAL_COLUMNS)
"""The output: the earlier columns first (unchanged positions), then the table-keyed ones, then the
interval's ends."""

_DTYPES: Final[dict[str, DType]] = {
    "bfloat16": DType.BFLOAT16, "float16": DType.FLOAT16, "fp16": DType.FLOAT16, "bf16": DType.BFLOAT16,
    "fp8": DType.FP8, "fp8_block": DType.FP8_BLOCK, "nvfp4": DType.NVFP4, "mxfp4": DType.MXFP4,
    "int8_wo": DType.INT8_WO, "int4_wo": DType.INT4_WO, "sq": DType.INT8, "int8": DType.INT8,
}
_COLLECTIVES: Final[dict[str, KernelKind]] = {
    "nccl_all_reduce": KernelKind.ALL_REDUCE, "custom_allreduce": KernelKind.ALL_REDUCE,
    "nccl_all_gather": KernelKind.ALL_GATHER, "nccl_reduce_scatter": KernelKind.REDUCE_SCATTER,
    "nccl_alltoall": KernelKind.ALL_TO_ALL,
}
POINTWISE_KERNELS: Final[dict[str, KernelKind]] = {
    "norm": KernelKind.NORM, "elementwise": KernelKind.ELEMENTWISE,
    "embedding": KernelKind.EMBEDDING, "sampling": KernelKind.SAMPLING,
}
"""Small memory-bound kernels: `m` = tokens, `n` = width, `variant` names the operation."""
KERNELS: Final[tuple[str, ...]] = ("gemm", "context_attention", "generation_attention", *_COLLECTIVES,
                                   *POINTWISE_KERNELS, *TABLE_FAMILY)
ZERO_ALLOWED: Final = frozenset({"window_size", "prefix_len", "aic_step"})
"""Integer columns that may be 0 (all others are >= 1)."""
TABLE_KV_CACHE_DTYPES: Final = ("bfloat16", "fp8")
"""`kv_cache_dtype` of the table-keyed (MLA) rows."""
TABLE_LEVELS: Final[dict[str, tuple[str, ...]]] = {
    "moe_dtype": tuple(MOE_DTYPES), "quant_type": tuple(MOE_DTYPES), "bmm_dtype": ("bfloat16", "fp8"),
    "gemm_type": ("bfloat16", "fp8", "fp8_block", "nvfp4"), "op_name_mla_bmm": ("mla_gen_pre", "mla_gen_post"),
}
"""Levels the table-keyed kernels' text columns accept."""


POINTWISE_PASSES: Final[dict[str, float]] = {
    "add": 3.0, "silu_and_mul": 3.0, "gelu_and_mul": 3.0, "residual_add": 3.0, "fused_add_rms_norm": 4.0,
    "add3": 6.0,
}
"""Tensors of tokens x width a pointwise variant reads plus writes; any other variant reads one and
writes one (2). `add3` is a three-way sum done as two binary adds (Vidur's parallel-block models)."""
DEFAULT_OP: Final[dict[str, str]] = {"norm": "rms_norm", "elementwise": "add", "embedding": "embedding",
                                     "sampling": "sampling"}
"""Operation a pointwise row means when its `variant` is blank."""
OP_ALIASES: Final[dict[str, str]] = {"fused_add_rmsnorm": "fused_add_rms_norm"}
"""Other names of an operation: FlashInfer's `fused_add_rmsnorm` is vLLM's `fused_add_rms_norm` (the
microbenchmark runner takes either; until 2026-12-02 a row named so was another op, priced at 2 passes)."""


def pointwise_passes(variant: str) -> float:
    return POINTWISE_PASSES.get(variant, 2.0)


def pointwise_op(kernel: str, variant: str) -> str:
    """The operation label the efficiency model keys on (`variant` under its one name, or the kernel's default)."""
    return OP_ALIASES.get(variant, variant) or DEFAULT_OP.get(kernel, kernel)


def pointwise_work(kernel: str, tokens: int, width: int, dtype: DType, variant: str = "") -> KernelWork:
    """A small memory-bound kernel as a row describes it (one FLOP per element)."""
    op = pointwise_op(kernel, variant)
    return KernelWork(kind=POINTWISE_KERNELS[kernel], name=op, dtype=dtype,
                      flops=float(tokens * width),
                      activation_bytes=pointwise_passes(op) * tokens * width * dtype.bytes_per_element(),
                      shape=(tokens, width))


MAX_CELL: Final = 2**31 - 1
"""Largest integer cell: cuBLAS and the attention kernels take 32-bit sizes."""
MAX_CELLS: Final[dict[str, int]] = {"message_bytes": 2**40, "batch_size": 2**20}
"""Columns with another bound: messages up to 1 TiB; at most 2^20 requests in one attention call."""


def max_cell(column: str) -> int:
    """Largest value an integer cell of `column` may hold (docs/cli.md)."""
    return MAX_CELLS.get(column, MAX_CELL)


class _Row:
    def __init__(self, row: Mapping[str, str | None], number: int, source: str) -> None:
        self._row, self._number, self._source = row, number, source

    def fail(self, column: str, rule: str) -> ConfigError:
        return ConfigError(source=f"{self._source} row {self._number}", key=column,
                           value=self._row.get(column), rule=rule)

    def text(self, column: str) -> str:
        return (self._row.get(column) or "").strip()

    def integer(self, column: str, *, minimum: int = 1, default: int | None = None) -> int:
        raw = self.text(column)
        if not raw:
            if default is not None:
                return default
            raise self.fail(column, f"is required for kernel={self.text('kernel')!r}")
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, "must be an integer") from None
        if not math.isfinite(value) or value != int(value) or not minimum <= value <= max_cell(column):
            raise self.fail(column, f"must be an integer >= {minimum} and <= {max_cell(column)}")
        return int(value)

    def dtype(self, column: str, default: str | None = None) -> DType:
        raw = self.text(column) or default
        if raw is None:
            raise self.fail(column, f"is required for kernel={self.text('kernel')!r}")
        try:
            return _DTYPES[raw]
        except KeyError:
            raise self.fail(column, f"must be one of {', '.join(sorted(_DTYPES))}") from None


def row_to_work(row: Mapping[str, str | None], *, number: int, source: str) -> KernelWork:
    """The kernel a row describes, as the graph builder would emit it."""
    r = _Row(row, number, source)
    kernel = r.text("kernel")
    if kernel == "gemm":
        dtype = r.dtype("dtype")
        compute = DType.BFLOAT16 if dtype in (DType.INT8_WO, DType.INT4_WO) else dtype
        return gemm_work("gemm", r.integer("m"), r.integer("n"), r.integer("k"), weight_dtype=dtype,
                         act_dtype=DType.BFLOAT16, compute_dtype=compute)
    if kernel in ("context_attention", "generation_attention"):
        act = r.dtype("attn_dtype", "bfloat16")
        kv = r.dtype("kv_cache_dtype", act.value)
        heads = r.integer("num_heads")
        kv_heads = r.integer("num_kv_heads", default=heads)
        if heads % kv_heads:
            raise r.fail("num_kv_heads", f"must divide num_heads={heads}")
        head_dim = r.integer("head_dim")
        window = r.integer("window_size", minimum=0, default=0)
        batch = r.integer("batch_size")
        if kernel == "context_attention":
            return prefill_attention_work(batch=batch, new_tokens=r.integer("seq_len"), context_tokens=0,
                                          heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                          window=window, act=act, kv=kv)
        return decode_attention_work(contexts=(r.integer("kv_len"),) * batch, heads=heads,
                                     kv_heads=kv_heads, head_dim=head_dim, window=window, act=act, kv=kv)
    if kernel in _COLLECTIVES:
        return collective_work(_COLLECTIVES[kernel], kernel, float(r.integer("message_bytes")),
                               r.integer("num_gpus"))
    if kernel in POINTWISE_KERNELS:
        return pointwise_work(kernel, r.integer("m"), r.integer("n"), r.dtype("dtype", "bfloat16"),
                              r.text("variant"))
    if kernel in TABLE_FAMILY:
        return table_row_work(r, kernel)
    raise r.fail("kernel", f"must be one of {', '.join(KERNELS)}")


_KIND_OF_TABLE: Final[dict[str, KernelKind]] = {
    "moe": KernelKind.MOE, "wideep_moe": KernelKind.MOE, "wideep_mlp": KernelKind.MOE,
    "mla_context": KernelKind.MLA_PREFILL, "mla_module_context": KernelKind.MLA_PREFILL,
    "mla_generation": KernelKind.MLA_DECODE, "mla_module_generation": KernelKind.MLA_DECODE,
    "mla_bmm": KernelKind.MLA_BMM, "deepep_ll": KernelKind.EP_ALL_TO_ALL, "deepep_normal": KernelKind.EP_ALL_TO_ALL,
}
_REFERENCE_HW: Final = "h100_sxm"
"""A table row's FLOPs and bytes do not depend on the GPU; `table_batch` is evaluated on this
catalog spec to read them (its roofline times are not used here)."""


DISTRIBUTION_RULE: Final = ("must be balanced, uniform or power_law_<alpha>[_eplb] with alpha >= 0 and "
                             "alpha != 1 (as engine.moe_routing)")


def valid_distribution(dist: str) -> bool:
    """Whether a table row's `distribution` is one the collector writes (blank: balanced): a power
    law takes the exponents the scenario's `engine.moe_routing` takes (a NaN, infinite or negative
    alpha prices nonsense, e.g. a negative latency)."""
    if dist.startswith("power_law_"):
        return routing_alpha(dist.removesuffix("_eplb")) is not False
    return dist in ("", "balanced", "uniform")


def table_row_work(r: _Row, kernel: str) -> KernelWork:
    """A table-keyed row (MoE, MLA, DeepEP) validated and as a `KernelWork` of the graph's shape
    conventions (`sim.graph.kernels`), its work that of the row's own routing (the collector's; a
    simulated MoE layer asks for the served routing, `sim.graph.moe_routing.served`)."""
    import numpy as np

    for c in REQUIRED[kernel]:
        if c in NUMERIC or c in ("num_heads", "batch_size", "seq_len", "kv_len", "num_gpus"):
            r.integer(c, minimum=0 if c in ZERO_ALLOWED else 1)
        elif not r.text(c):
            raise r.fail(c, f"is required for kernel={kernel!r}")
    for c in TABLE_COLUMNS[kernel]:
        if (c in NUMERIC or c in ("num_heads", "batch_size", "seq_len", "kv_len", "num_gpus")) and r.text(c):
            r.integer(c, minimum=0 if c in ZERO_ALLOWED else 1)
        levels = TABLE_LEVELS.get(f"{c}_{kernel}" if c == "op_name" else c)
        if levels is not None and r.text(c) and r.text(c) not in levels:
            raise r.fail(c, f"must be one of {', '.join(levels)}")
    if r.text("kv_cache_dtype") not in ("", *TABLE_KV_CACHE_DTYPES):
        raise r.fail("kv_cache_dtype", "must be bfloat16 or fp8")
    if not valid_distribution(r.text("distribution")):
        raise r.fail("distribution", DISTRIBUTION_RULE)
    if "topk" in TABLE_COLUMNS[kernel] and r.text("topk") and r.text("num_experts") \
            and float(r.text("topk")) > float(r.text("num_experts")):
        # A token cannot be routed to more experts than there are: the priced layer would be nonsense.
        raise r.fail("topk", f"must be <= num_experts={r.text('num_experts')}")
    cols = {c: np.array([r.text(c)], dtype=object) for c in (*TABLE_COLUMNS[kernel], "kernel")}
    tb = table_batch(kernel, cols, np.arange(1), load_hardware(_REFERENCE_HW))
    kind = _KIND_OF_TABLE[kernel]
    num = {c: int(float(r.text(c))) if r.text(c) else 0 for c in TABLE_COLUMNS[kernel] if c not in ("backend",)
           and (c in NUMERIC or c in ("num_heads", "batch_size", "seq_len", "kv_len", "num_gpus"))}
    shape: tuple[int, ...]
    if kind is KernelKind.EP_ALL_TO_ALL:
        shape = (num["num_tokens_per_rank"], num["hidden_size"], num["topk"], num["num_experts"], num["num_gpus"],
                 num.get("node_num") or 1)
        return KernelWork(kind=kind, name=kernel, dtype=DType.BFLOAT16, comm_bytes=float(tb.bytes[0]),
                          group_size=num["num_gpus"], shape=shape,
                          variant="low_latency" if kernel == "deepep_ll" else "normal")
    if kind is KernelKind.MOE:
        if kernel == "wideep_mlp":
            shape = (num["num_tokens"], num["hidden_size"], num["intermediate_size"], 1, 1, 1, 1)
            dt, variant = r.text("quant_type") or "bfloat16", "balanced"
        else:
            shape = (num["num_tokens"], num["hidden_size"], num["inter_size"], num["topk"], num["num_experts"],
                     num.get("moe_tp_size") or 1, num["moe_ep_size"])
            dt, variant = r.text("moe_dtype"), r.text("distribution")
        dtype = MOE_DTYPES[dt][1] if dt not in ("w4a16_mxfp4", "w4a8_mxfp4_mxfp8") else DType.MXFP4
    elif kind is KernelKind.MLA_BMM:
        shape = (num["num_tokens"], num["num_heads"], 512 if r.text("op_name") == "mla_gen_pre" else 128,
                 128 if r.text("op_name") == "mla_gen_pre" else 512)
        dtype, variant = (DType.FP8 if r.text("bmm_dtype") == "fp8" else DType.BFLOAT16), r.text("op_name")
    elif kind is KernelKind.MLA_PREFILL:
        shape = (num["batch_size"], num["seq_len"], num.get("prefix_len", 0), num["num_heads"], 128, 64, 128)
        dtype, variant = (DType.FP8 if r.text("kv_cache_dtype") == "fp8" else DType.BFLOAT16), ""
    else:
        shape = (num["batch_size"], num["kv_len"], num["kv_len"], num["num_heads"], 512, 64)
        dtype, variant = (DType.FP8 if r.text("kv_cache_dtype") == "fp8" else DType.BFLOAT16), ""
    return KernelWork(kind=kind, name=kernel, dtype=dtype, flops=float(tb.flops[0]),
                      activation_bytes=float(tb.bytes[0]), shape=shape, variant=variant)
