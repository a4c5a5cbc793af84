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
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.transformer import collective_work, decode_attention_work, gemm_work, prefill_attention_work

ROW_COLUMNS: Final[tuple[str, ...]] = (
    "kernel", "backend", "backend_version", "kernel_source", "dtype", "m", "n", "k", "batch_size",
    "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim", "attn_dtype", "kv_cache_dtype",
    "window_size", "num_gpus", "message_bytes", "variant",
)
PREDICTION_COLUMNS: Final[tuple[str, ...]] = (*ROW_COLUMNS, "predicted_latency_ms", "provenance")

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
                                   *POINTWISE_KERNELS)


POINTWISE_PASSES: Final[dict[str, float]] = {
    "add": 3.0, "silu_and_mul": 3.0, "gelu_and_mul": 3.0, "residual_add": 3.0, "fused_add_rms_norm": 4.0,
    "add3": 6.0,
}
"""Tensors of tokens x width a pointwise variant reads plus writes; any other variant reads one and
writes one (2). `add3` is a three-way sum done as two binary adds (Vidur's parallel-block models)."""
DEFAULT_OP: Final[dict[str, str]] = {"norm": "rms_norm", "elementwise": "add", "embedding": "embedding",
                                     "sampling": "sampling"}
"""Operation a pointwise row means when its `variant` is blank."""


def pointwise_passes(variant: str) -> float:
    return POINTWISE_PASSES.get(variant, 2.0)


def pointwise_op(kernel: str, variant: str) -> str:
    """The operation label the efficiency model keys on (`variant`, or the kernel's default)."""
    return variant or DEFAULT_OP.get(kernel, kernel)


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
    raise r.fail("kernel", f"must be one of {', '.join(KERNELS)}")
