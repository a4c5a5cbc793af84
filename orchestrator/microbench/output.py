"""Measured points -> tables in the layout of shared/data/aiconfigurator/<system>/, plus device.json.

File names and columns are exactly AIConfigurator's (see shared/data/README.md), so
`kernelsight calibrate --microbench DIR` and anything reading those tables reads a run unchanged:
gemm.csv.gz, context_attention.csv.gz, generation_attention.csv.gz (gzip), nccl.csv,
custom_allreduce.csv, and the table-keyed moe.csv.gz, mla_*.csv(.gz), mla_bmm.csv, deepep_*.csv(.gz)
(their query columns, `sim.perf.table_kernels.TABLE_COLUMNS`, then `latency_ms`; the DeepEP
tables in AIConfigurator's own columns, dispatch and combine apart: `orchestrator.microbench.deepep`). Small
memory-bound kernels, which AIConfigurator does not table, go to
`pointwise.csv` (backend, backend_version, kernel_source, kernel, variant, dtype, m = tokens,
n = width, latency_ms). Only measured points are written; `latency_ms` is the median per call.
The two flag columns are computed as the data README defines them, against the catalog spec of the
identified GPU (False where the GPU is not in the catalog). Files are written atomically;
gzip headers carry no timestamp, so identical measurements give identical bytes.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from orchestrator.microbench.deepep import LL_COLUMNS, NORMAL_COLUMNS, deepep_cells
from orchestrator.microbench.points import NCCL_OPS, TABLE_FAMILIES, family_of
from orchestrator.microbench.records import PointRecord
from sim.dtypes import DType
from sim.perf.table_kernels import TABLE_COLUMNS as TABLE_KEYED_COLUMNS
from sim.specs.hardware import HardwareSpec

TABLE_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "gemm.csv.gz": ("backend", "backend_version", "kernel_source", "dtype", "m", "n", "k", "latency_ms"),
    "context_attention.csv.gz": (
        "backend", "backend_version", "kernel_source", "attn_dtype", "kv_cache_dtype", "batch_size", "seq_len",
        "num_heads", "num_kv_heads", "head_dim", "window_size", "latency_ms", "flag_exceeds_peak_flops"),
    "generation_attention.csv.gz": (
        "backend", "backend_version", "kernel_source", "attn_dtype", "kv_cache_dtype", "batch_size", "kv_len",
        "num_heads", "num_kv_heads", "head_dim", "window_size", "latency_ms", "flag_exceeds_dram_bw"),
    "nccl.csv": ("nccl_version", "nccl_version_reported", "op", "nccl_dtype", "num_gpus", "message_elems",
                 "latency_ms"),
    "custom_allreduce.csv": ("backend", "backend_version", "kernel_source", "variant", "dtype", "num_gpus",
                             "message_elems", "latency_ms"),
    "pointwise.csv": ("backend", "backend_version", "kernel_source", "kernel", "variant", "dtype", "m", "n",
                      "latency_ms"),
}
FILE_OF_TABLE: Final[dict[str, str]] = {
    "moe": "moe.csv.gz", "wideep_moe": "wideep_moe.csv.gz", "wideep_mlp": "wideep_mlp.csv",
    "mla_context": "mla_context.csv.gz", "mla_generation": "mla_generation.csv.gz",
    "mla_module_context": "mla_module_context.csv.gz", "mla_module_generation": "mla_module_generation.csv.gz",
    "mla_bmm": "mla_bmm.csv", "deepep_ll": "deepep_ll.csv", "deepep_normal": "deepep_normal.csv.gz"}
"""Table-keyed kernel (the plan's `kernel`) -> its AIConfigurator file name (the files
`sim.calibration.tables.NEW_TABLE_FILES` reads; not imported here, it needs pandas)."""
TABLE_COLUMNS.update({
    # The table's query columns and the measured latency (DeepEP: dispatch + combine in one call).
    file: (*TABLE_KEYED_COLUMNS[kernel], "latency_ms") for kernel, file in FILE_OF_TABLE.items()})
TABLE_COLUMNS.update({"deepep_ll.csv": LL_COLUMNS, "deepep_normal.csv.gz": NORMAL_COLUMNS})
FILE_OF_FAMILY: Final[dict[str, str]] = {
    "gemm": "gemm.csv.gz", "context_attention": "context_attention.csv.gz",
    "generation_attention": "generation_attention.csv.gz", "nccl": "nccl.csv",
    "custom_allreduce": "custom_allreduce.csv", "pointwise": "pointwise.csv",
}
DEVICE_FILE: Final = "device.json"
KV_FLAG_MIN_BYTES: Final = 1e9
"""Decode rows are flagged only above this KV working set (data README: smaller sets can stay in L2)."""
KV_FLAG_BW_FACTOR: Final = 1.05


def _attn_common(r: Mapping[str, str]) -> tuple[str, str, int, int, int, int, int]:
    attn = r["attn_dtype"] or "bfloat16"
    heads = int(r["num_heads"])
    return (attn, r["kv_cache_dtype"] or attn, int(r["batch_size"]), heads, int(r["num_kv_heads"] or heads),
            int(r["head_dim"]), int(r["window_size"] or 0))


def exceeds_peak_flops(r: Mapping[str, str], latency_s: float, hw: HardwareSpec | None) -> bool:
    """Causal-attention FLOPs 2*b*h*d*s*min(s, window) over latency above the dense peak (data README)."""
    if hw is None:
        return False
    attn, _, b, h, _, d, window = _attn_common(r)
    s = int(r["seq_len"])
    flops = 2.0 * b * h * d * s * (min(s, window) if window > 0 else s)
    return flops / latency_s > hw.peak_flops_for(DType(attn if attn != "bf16" else "bfloat16"))


def exceeds_dram_bw(r: Mapping[str, str], latency_s: float, hw: HardwareSpec | None) -> bool:
    """KV working set > 1 GB read faster than 1.05 x spec DRAM bandwidth (data README). The working set
    is the keys the decode reads: the window's under a sliding window (until 2026-12-02 the whole
    context, so a correct windowed measurement was flagged and dropped)."""
    if hw is None:
        return False
    _, kv_dtype, b, _, kvh, d, window = _attn_common(r)
    keys = int(r["kv_len"]) + 1
    if window > 0:
        keys = min(keys, window)
    kv_bytes = b * keys * 2 * kvh * d * (1 if kv_dtype == "fp8" else 2)
    return kv_bytes > KV_FLAG_MIN_BYTES and kv_bytes / latency_s > KV_FLAG_BW_FACTOR * hw.hbm_bandwidth_bytes_per_s


def table_row(rec: PointRecord, hw: HardwareSpec | None) -> tuple[str, list[str]]:
    """(file name, cells) of one measured point."""
    r, ms = rec.row, rec.latency_ms()
    latency = f"{ms:.6g}"
    labels = [r["backend"], r["backend_version"], r["kernel_source"]]
    if r["kernel"] in ("deepep_ll", "deepep_normal"):
        name = FILE_OF_TABLE[r["kernel"]]
        return name, deepep_cells(r, rec.parts_ms, TABLE_COLUMNS[name])
    if r["kernel"] in TABLE_FAMILIES:
        name = FILE_OF_TABLE[r["kernel"]]
        given = {**r, "backend_version_reported": r["backend_version"]}
        return name, [given.get(c, "") for c in TABLE_COLUMNS[name][:-1]] + [latency]
    family = family_of(r["kernel"])
    name = FILE_OF_FAMILY[family]
    if family == "gemm":
        return name, [*labels, r["dtype"] or "bfloat16", r["m"], r["n"], r["k"], latency]
    if family in ("context_attention", "generation_attention"):
        attn, kv, b, h, kvh, d, window = _attn_common(r)
        decode = family == "generation_attention"
        flag = (exceeds_dram_bw(r, ms * 1e-3, hw) if decode else exceeds_peak_flops(r, ms * 1e-3, hw))
        length = r["kv_len"] if decode else r["seq_len"]
        return name, [*labels, attn, kv, str(b), length, str(h), str(kvh), str(d), str(window), latency, str(flag)]
    if family == "pointwise":
        return name, [*labels, r["kernel"], r["variant"], r["dtype"] or "bfloat16", r["m"], r["n"], latency]
    elems = str(int(r["message_bytes"]) // 2)
    if family == "nccl":
        return name, [r["backend_version"], r["backend_version"], NCCL_OPS[r["kernel"]], "half", r["num_gpus"],
                      elems, latency]
    return name, [*labels, r["variant"], "bfloat16", r["num_gpus"], elems, latency]


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _csv_bytes(header: Sequence[str], rows: Sequence[Sequence[str]], gz: bool) -> bytes:
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    raw = text.getvalue().encode()
    if not gz:
        return raw
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as f:
        f.write(raw)
    return buf.getvalue()


def write_tables(out_dir: Path, records: Sequence[PointRecord], hw: HardwareSpec | None) -> dict[str, int]:
    """Write every table that has measured rows; returns rows per file. Stale tables of a family are removed."""
    rows: dict[str, list[list[str]]] = {}
    for rec in sorted(records, key=lambda r: r.number):
        if rec.status == "measured":
            name, cells = table_row(rec, hw)
            rows.setdefault(name, []).append(cells)
    for name, header in TABLE_COLUMNS.items():
        path = out_dir / name
        if name in rows:
            _atomic_write(path, _csv_bytes(header, rows[name], gz=name.endswith(".gz")))
        elif path.is_file():
            path.unlink()
    return {name: len(v) for name, v in rows.items()}


def write_json(path: Path, payload: Mapping[str, Any], default: Callable[[Any], Any] = str) -> None:
    _atomic_write(path, (json.dumps(payload, indent=1, sort_keys=True, default=default) + "\n").encode())
