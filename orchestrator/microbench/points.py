"""Plan rows as typed measurement points.

A plan is a CSV in the `predict-kernels` row schema (`sim.calibration.rows.ROW_COLUMNS`), as
`kernelsight microbench plan` writes it. Each row becomes a `PlanPoint` with the shape its
family's benchmark needs. Malformed rows raise `ConfigError` naming the row and column (the same
validation `predict-kernels` applies). `--dry-run` shrinks shapes so the whole path runs in
seconds on a CPU; the point keeps its planned shape for the output tables.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from orchestrator.microbench.table_kernels import TableShape
from sim.calibration.rows import KERNELS, POINTWISE_KERNELS, ROW_COLUMNS, row_to_work
from sim.errors import ConfigError

Family = Literal["gemm", "context_attention", "generation_attention", "nccl", "custom_allreduce", "pointwise",
                 "moe", "mla", "mla_bmm", "deepep"]
FAMILIES: Final[tuple[Family, ...]] = (
    "gemm", "context_attention", "generation_attention", "pointwise", "nccl", "custom_allreduce", "moe", "mla",
    "mla_bmm", "deepep")
TABLE_FAMILIES: Final[dict[str, Family]] = {
    "moe": "moe", "wideep_moe": "moe", "wideep_mlp": "moe", "mla_context": "mla", "mla_generation": "mla",
    "mla_module_context": "mla", "mla_module_generation": "mla", "mla_bmm": "mla_bmm", "deepep_ll": "deepep",
    "deepep_normal": "deepep"}
"""Table-keyed plan kernels -> their `microbench run` family (`orchestrator.microbench.table_kernels`)."""
NCCL_OPS: Final[dict[str, str]] = {
    "nccl_all_reduce": "all_reduce", "nccl_all_gather": "all_gather",
    "nccl_reduce_scatter": "reduce_scatter", "nccl_alltoall": "alltoall",
}
"""Plan kernel -> nccl-tests operation name (the `op` column of nccl.csv)."""
_IDENTITY_COLUMNS: Final = tuple(c for c in ROW_COLUMNS if c not in ("backend", "backend_version", "kernel_source"))


def family_of(kernel: str) -> Family:
    if kernel == "gemm":
        return "gemm"
    if kernel in ("context_attention", "generation_attention"):
        return kernel  # type: ignore[return-value]
    if kernel in NCCL_OPS:
        return "nccl"
    if kernel == "custom_allreduce":
        return "custom_allreduce"
    if kernel in POINTWISE_KERNELS:
        return "pointwise"
    if kernel in TABLE_FAMILIES:
        return TABLE_FAMILIES[kernel]
    raise ValueError(f"kernel={kernel!r}: must be one of {', '.join(KERNELS)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmShape:
    """Y[m, n] = X[m, k] . W[n, k]^T."""

    dtype: str
    m: int
    n: int
    k: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """One attention layer forward on one GPU (heads already TP-sharded)."""

    decode: bool
    batch_size: int
    q_tokens: int
    """New tokens per sequence: the prompt length for prefill, 1 for decode."""
    kv_tokens: int
    """Keys each sequence's last query attends to: seq_len for prefill, kv_len + 1 for decode."""
    num_heads: int
    num_kv_heads: int
    head_dim: int
    window_size: int
    attn_dtype: str
    kv_cache_dtype: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PointwiseShape:
    """A small memory-bound kernel over `tokens` rows of `width` elements."""

    kernel: str
    variant: str
    dtype: str
    tokens: int
    width: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveShape:
    """One collective over `num_gpus` ranks; `message_bytes` follows nccl-tests' size (the larger buffer)."""

    op: str
    num_gpus: int
    message_bytes: int
    custom: bool


Shape = GemmShape | AttentionShape | PointwiseShape | CollectiveShape | TableShape


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanPoint:
    """One plan row: its number in the file (1-based), its family and its planned shape."""

    number: int
    family: Family
    row: Mapping[str, str]
    """The plan row, every `ROW_COLUMNS` key present (blank = not applicable)."""

    def kernel(self) -> str:
        return self.row["kernel"]

    def key(self) -> str:
        """Identity of the point across runs (every shape column; backend columns excluded)."""
        return "|".join(_norm(self.row.get(c, "")) for c in _IDENTITY_COLUMNS)

    def integer(self, column: str, default: int = 0) -> int:
        raw = self.row.get(column, "").strip()
        return int(float(raw)) if raw else default

    def label(self) -> str:
        """Short human description for the progress line."""
        r = self.row
        if self.family == "gemm":
            return f"gemm {r['dtype']} m={r['m']} n={r['n']} k={r['k']}"
        if self.family in ("context_attention", "generation_attention"):
            length = f"s={r['seq_len']}" if self.family == "context_attention" else f"kv={r['kv_len']}"
            kind = "prefill" if self.family == "context_attention" else "decode"
            return (f"{kind} b={r['batch_size']} {length} h={r['num_heads']}/{r['num_kv_heads']}x{r['head_dim']} "
                    f"kv={r['kv_cache_dtype'] or r['attn_dtype'] or 'bfloat16'}")
        if self.family == "pointwise":
            return f"{r['kernel']} {r['variant']} m={r['m']} n={r['n']}"
        if self.family in ("moe", "mla", "mla_bmm", "deepep"):
            return r["kernel"] + " " + " ".join(f"{c}={v}" for c, v in r.items() if v and c != "kernel")
        return f"{r['kernel']} g={r['num_gpus']} {r['message_bytes']} B"

    def shape(self, *, shrink: bool = False) -> Shape:
        """The benchmark shape; `shrink` caps every dimension (dry runs)."""
        r = self.row
        if self.family in ("moe", "mla", "mla_bmm", "deepep"):
            return TableShape(kernel=r["kernel"], family=self.family, row=r)
        if self.family == "gemm":
            m, n, k = self.integer("m"), self.integer("n"), self.integer("k")
            if shrink:
                m, n, k = min(m, 16), min(n, 64), min(k, 128)
            return GemmShape(dtype=r["dtype"] or "bfloat16", m=m, n=n, k=k)
        if self.family in ("context_attention", "generation_attention"):
            decode = self.family == "generation_attention"
            heads = self.integer("num_heads")
            kv_heads = self.integer("num_kv_heads", heads)
            batch = self.integer("batch_size")
            length = self.integer("kv_len") + 1 if decode else self.integer("seq_len")
            if shrink:
                group = max(heads // kv_heads, 1)
                kv_heads = min(kv_heads, 2)
                heads = kv_heads * min(group, 4)
                batch, length = min(batch, 2), min(length, 64)
            attn = r["attn_dtype"] or "bfloat16"
            return AttentionShape(decode=decode, batch_size=batch, q_tokens=1 if decode else length,
                                  kv_tokens=length, num_heads=heads, num_kv_heads=kv_heads,
                                  head_dim=self.integer("head_dim"), window_size=self.integer("window_size"),
                                  attn_dtype=attn, kv_cache_dtype=r["kv_cache_dtype"] or attn)
        if self.family == "pointwise":
            tokens, width = self.integer("m"), self.integer("n")
            if shrink:
                tokens, width = min(tokens, 16), min(width, 256)
            return PointwiseShape(kernel=r["kernel"], variant=r["variant"], dtype=r["dtype"] or "bfloat16",
                                  tokens=tokens, width=width)
        msg = self.integer("message_bytes")
        return CollectiveShape(op=NCCL_OPS.get(r["kernel"], "all_reduce"), num_gpus=self.integer("num_gpus"),
                               message_bytes=min(msg, 8192) if shrink else msg,
                               custom=self.family == "custom_allreduce")


def _norm(value: str) -> str:
    text = value.strip()
    try:
        f = float(text)
    except ValueError:
        return text
    return str(int(f)) if f == int(f) else text


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    path: Path
    sha256: str
    points: tuple[PlanPoint, ...]
    num_duplicates: int
    """Rows whose shape repeats an earlier row (measured once)."""


def read_plan(path: Path) -> Plan:
    """Parse and validate a plan CSV; duplicates of an earlier row are dropped."""
    if not path.is_file():
        raise ConfigError(source="microbench run", key="--plan", value=str(path), rule="must be a plan CSV file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source=str(path), key="--plan", value=str(path),
                          rule=f"is not UTF-8 text (byte {exc.start}): a plan is the CSV `microbench plan` writes"
                          ) from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    if "kernel" not in header:
        raise ConfigError(source=str(path), key="kernel", value=None, rule="column is required")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise ConfigError(source=str(path), key=repeated[0], value=header.count(repeated[0]),
                          rule="column appears more than once in the header (the last would win)")
    rows = list(reader)
    points: list[PlanPoint] = []
    seen: set[str] = set()
    for number, raw_row in enumerate(rows, start=1):
        if None in raw_row:
            raise ConfigError(source=str(path), key=f"row {number}", value=raw_row[None],
                              rule=f"has more cells than the header's {len(header)} columns")
        row = {c: (raw_row.get(c) or "").strip() for c in ROW_COLUMNS}
        row_to_work(row, number=number, source=str(path))  # validates shape columns, names row and column
        point = PlanPoint(number=number, family=family_of(row["kernel"]), row=row)
        if point.key() in seen:
            continue
        seen.add(point.key())
        points.append(point)
    if not points:
        raise ConfigError(source=str(path), key="<rows>", value=0, rule="plan has no rows")
    return Plan(path=path, sha256=hashlib.sha256(raw).hexdigest(), points=tuple(points),
                num_duplicates=len(rows) - len(points))
