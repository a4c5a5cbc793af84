"""Measured kernel tables -> rows of the `predict-kernels` schema plus the measured latency.

Reads a directory in the layout of shared/data/aiconfigurator/<system>/ (any subset of
gemm.csv.gz, context_attention.csv.gz, generation_attention.csv.gz, nccl.csv,
custom_allreduce.csv, plus an optional pointwise.csv of small memory-bound kernels in the
`predict-kernels` row schema with a latency_ms column) and Vidur's compute_mlp_ops.csv.gz
(small memory-bound kernels, mapped to the same schema by `read_vidur_pointwise`). Tables are
named by their upstream file name; `sim.measured.resolve` finds the xz copy of the vendored data.
Exclusions follow shared/data/README.md: broken context-attention series as a whole, rows
flagged as exceeding peak FLOPs or DRAM bandwidth, and GEMM formats outside this model's scope.
Fitting-time only (pandas).
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sim.calibration.rows import ZERO_ALLOWED
from sim.errors import ConfigError, decode_error, file_error
from sim.measured import read_text_bytes, resolve, table_name
from sim.perf.table_kernels import NUMERIC, REQUIRED, TABLE_COLUMNS, TABLE_FAMILY

NEW_TABLE_FILES: Final[tuple[str, ...]] = (
    "moe.csv.gz", "wideep_moe.csv.gz", "wideep_mlp.csv", "mla_context.csv.gz", "mla_generation.csv.gz",
    "mla_module_context.csv.gz", "mla_module_generation.csv.gz", "mla_bmm.csv", "deepep_ll.csv",
    "deepep_normal.csv.gz")
"""Table-keyed tables (data README section 4): rows keep the table's own columns (`kernel` = the
table name), see `read_table_keyed`."""
TABLE_FILES: Final[tuple[str, ...]] = (
    "gemm.csv.gz", "context_attention.csv.gz", "generation_attention.csv.gz", "nccl.csv",
    "custom_allreduce.csv", "pointwise.csv", *NEW_TABLE_FILES)
POINTWISE_COLUMNS: Final = ("kernel", "variant", "dtype", "m", "n", "latency_ms")
"""Required columns of `pointwise.csv` (not an AIConfigurator table; written by `microbench run`):
kernel (norm/elementwise/embedding/sampling), variant, dtype, m (tokens), n (width), latency_ms.
Optional: backend, backend_version, kernel_source."""
BROKEN_CONTEXT_SERIES: Final[tuple[tuple[str, str, str, str], ...]] = (
    ("b200_sxm", "sglang", "0.5.10", "trtllm_mha"),
    ("rtx_pro_6000_server", "vllm", "0.19.0", "vllm_flashinfer"),
    ("l40s", "vllm", "0.14.0", "vllm_flashinfer"),
)
"""(system, backend, version, kernel_source) of context-attention series unreliable as a whole."""
GEMM_DTYPES: Final = ("bfloat16", "fp8", "fp8_block", "nvfp4")
VIDUR_GPUS: Final[dict[str, str]] = {"a100": "a100_sxm", "h100": "h100_sxm"}
FAMILY_OF_KERNEL: Final[dict[str, str]] = {
    "gemm": "gemm", "context_attention": "attn_prefill", "generation_attention": "attn_decode",
    "nccl_all_reduce": "nccl", "nccl_all_gather": "nccl", "nccl_reduce_scatter": "nccl",
    "nccl_alltoall": "nccl", "custom_allreduce": "custom_allreduce", "norm": "pointwise",
    "elementwise": "pointwise", "embedding": "pointwise", "sampling": "pointwise", **TABLE_FAMILY,
}
UNIT_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "moe": ("hidden_size", "inter_size", "topk", "num_experts"),
    "wideep_moe": ("hidden_size", "inter_size", "topk", "num_experts"),
    "wideep_mlp": ("hidden_size", "intermediate_size"),
    "mla_context": ("num_heads",), "mla_generation": ("num_heads",), "mla_module_context": ("num_heads",),
    "mla_module_generation": ("num_heads",), "mla_bmm": ("num_heads",),
    "deepep_ll": ("hidden_size", "topk", "num_experts", "num_gpus"),
    "deepep_normal": ("hidden_size", "topk", "num_experts", "num_gpus"),
}
"""Columns that make a table-keyed row's unit (the model configuration the target-measured score
holds out whole: MoE expert shape, MLA heads per GPU, all-to-all layout)."""

_ATTENTION_COLUMNS: Final = ("backend", "backend_version", "kernel_source", "attn_dtype", "kv_cache_dtype",
                             "batch_size", "num_heads", "num_kv_heads", "head_dim", "window_size", "latency_ms")
REQUIRED_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("backend", "backend_version", "kernel_source", "dtype", "m", "n", "k", "latency_ms"),
    "context_attention": (*_ATTENTION_COLUMNS, "seq_len"),
    "generation_attention": (*_ATTENTION_COLUMNS, "kv_len"),
    "nccl": ("nccl_version", "op", "nccl_dtype", "num_gpus", "message_elems", "latency_ms"),
    "custom_allreduce": ("backend", "backend_version", "kernel_source", "variant", "message_elems", "num_gpus",
                         "latency_ms"),
    "pointwise": POINTWISE_COLUMNS,
    **{t: tuple(dict.fromkeys((*REQUIRED[t], *UNIT_COLUMNS[t], *(() if t.startswith("deepep") else ("latency_ms",)))))
       for t in TABLE_COLUMNS},
}
"""Columns each table's reader uses unconditionally (DeepEP's latency is the sum of its `*_ms` columns)."""
NUMERIC_COLUMNS: Final = frozenset({"m", "n", "k", "batch_size", "seq_len", "kv_len", "num_heads", "num_kv_heads",
                                    "head_dim", "window_size", "num_gpus", "message_elems", *NUMERIC})
"""Shape columns that must be numbers wherever a table has them (the latency columns are checked cell by
cell): whole numbers >= 1 (>= 0 for `ZERO_ALLOWED`) and at most `MAX_SIZE` (until 2026-12-02 a 0, -16,
16.5 or 1e12 was fitted on)."""
MAX_SIZE: Final = 2.0**40


@dataclass(frozen=True, slots=True)
class Exclusion:
    system: str
    table: str
    what: str
    num_rows: int


def file_sha256(paths: list[Path]) -> str:
    """SHA-256 over (table name, CSV text) of each table: the same for an upstream directory
    (`.csv.gz`, `.csv`) and the vendored copy (`.csv.xz`), since compression is left out."""
    h = hashlib.sha256()
    for p in sorted(paths, key=table_name):
        h.update(table_name(p).encode())
        h.update(read_text_bytes(p))
    return h.hexdigest()


def _attention(df: pd.DataFrame, kernel: str, system: str, excl: list[Exclusion]) -> pd.DataFrame:
    table = "context_attention" if kernel == "context_attention" else "generation_attention"
    keep = np.ones(len(df), dtype=bool)
    if kernel == "context_attention":
        for sys_, be, ver, src in BROKEN_CONTEXT_SERIES:
            if sys_ != system:
                continue
            hit = ((df.backend == be) & (df.backend_version.astype(str) == ver)
                   & (df.kernel_source == src)).to_numpy()
            if hit.any():
                excl.append(Exclusion(system, table, f"series {be} {ver} {src} (broken as a whole)",
                                      int(hit.sum())))
            keep &= ~hit
        flag = "flag_exceeds_peak_flops"
    else:
        flag = "flag_exceeds_dram_bw"
    if flag in df:
        bad = df[flag].astype(str).str.lower().eq("true").to_numpy() & keep
        if bad.any():
            excl.append(Exclusion(system, table, f"rows with {flag}", int(bad.sum())))
        keep &= ~bad
    df = df[keep]
    out = pd.DataFrame({
        "kernel": kernel, "backend": df.backend, "backend_version": df.backend_version.astype(str),
        "kernel_source": df.kernel_source, "attn_dtype": df.attn_dtype,
        "kv_cache_dtype": df.kv_cache_dtype, "batch_size": df.batch_size,
        "num_heads": df.num_heads, "num_kv_heads": df.num_kv_heads, "head_dim": df.head_dim,
        "window_size": df.window_size, "latency_s": df.latency_ms * 1e-3,
    })
    out["seq_len" if kernel == "context_attention" else "kv_len"] = (
        df.seq_len if kernel == "context_attention" else df.kv_len)
    out["unit"] = (df.num_heads.astype(str) + "/" + df.num_kv_heads.astype(str) + "/"
                   + df.head_dim.astype(str) + "/" + df.window_size.astype(str))
    return out


UNRELIABLE_SMALL_TOKEN_SERIES: Final = frozenset({"sglang_flashinfer_cutedsl_moe|nvfp4",
                                                  "moe_torch_flow_min_latency|nvfp4"})
"""The MoE series (kernel source | weight format) the data README calls unreliable at small token counts."""


def _unreliable_small_token_series(df: pd.DataFrame, flagged: np.ndarray, system: str,
                                   excl: list[Exclusion]) -> np.ndarray:
    """MoE rows of a series with rows flagged faster than the DRAM allows, up to the series' largest
    flagged token count, whatever their routing distribution. The data README: on b200_sxm the
    flagged rows are balanced small-batch nvfp4 rows of `sglang_flashinfer_cutedsl_moe` and
    `moe_torch_flow_min_latency` ("treat small-token nvfp4 rows of these two kernel sources as
    unreliable"), and the flag is only defined for balanced routing, so the same series' power-law
    rows at those token counts are dropped too (47 of them ran faster than their own roofline)."""
    series = [c for c in ("kernel_source", "moe_dtype") if c in df.columns]
    out = np.zeros(len(df), dtype=bool)
    if len(series) < 2 or "num_tokens" not in df.columns:
        return out
    tokens = pd.to_numeric(df["num_tokens"], errors="coerce").to_numpy()
    keys = df[series].astype(str).agg("|".join, axis=1).to_numpy()
    for key in sorted(set(keys[flagged]) & UNRELIABLE_SMALL_TOKEN_SERIES):
        mine = keys == key
        bound = np.nanmax(tokens[mine & flagged])
        drop = mine & ~flagged & (tokens <= bound)
        if drop.any():
            excl.append(Exclusion(system, "moe", f"unflagged rows of a flagged series ({key.replace('|', ', ')}) "
                                  f"at <= {int(bound)} tokens (data README)", int(drop.sum())))
        out |= drop
    return out


def read_table_keyed(df: pd.DataFrame, name: str, system: str, excl: list[Exclusion]) -> pd.DataFrame:
    """Rows of a table-keyed table: its query columns as they are (`kernel` = table name), the
    latency per call (DeepEP: the sum of the row's `*_ms` columns, dispatch + combine), rows with
    any `flag_*` true left out, and repeated configurations (identical query columns) kept first-wins,
    as AIConfigurator loads them."""
    flags = [c for c in df.columns if c.startswith("flag_")]
    keep = np.ones(len(df), dtype=bool)
    flagged = np.zeros(len(df), dtype=bool)
    for flag in flags:
        bad = df[flag].astype(str).str.lower().eq("true").to_numpy() & keep
        if bad.any():
            excl.append(Exclusion(system, name, f"rows with {flag}", int(bad.sum())))
        keep &= ~bad
        flagged |= bad
    if name == "moe" and flagged.any():
        keep &= ~_unreliable_small_token_series(df, flagged, system, excl)
    df = df[keep]
    query = [c for c in TABLE_COLUMNS[name] if c in df.columns]
    dup = df.duplicated(subset=query, keep="first").to_numpy()
    if dup.any():
        excl.append(Exclusion(system, name, "repeated configurations (first kept, as AIConfigurator)",
                              int(dup.sum())))
    df = df[~dup]
    ms = [c for c in df.columns if c.endswith("_ms")]
    latency = df[ms].sum(axis=1) if name.startswith("deepep") else df["latency_ms"]
    out = df[query].copy()
    for c in query:
        if out[c].dtype.kind not in "fiu":
            out[c] = out[c].astype(str).where(out[c].notna(), "")
    out.insert(0, "kernel", name)
    out["latency_s"] = latency.to_numpy(dtype=float) * 1e-3
    unit = pd.Series(name, index=out.index)
    for c in UNIT_COLUMNS[name]:
        unit = unit + "/" + df[c].astype(str)
    out["unit"] = unit
    return out.reset_index(drop=True)


def _read_table(path: Path) -> pd.DataFrame:
    """One table file, its read errors as `ConfigError`s naming it (pandas' own do not)."""
    try:
        return pd.read_csv(path)
    except (gzip.BadGzipFile, lzma.LZMAError, zlib.error, EOFError) as exc:
        raise ConfigError(source=str(path), key="<file>", value=str(path),
                          rule=f"corrupt or truncated compressed file ({type(exc).__name__}: {exc})") from None
    except OSError as exc:
        raise file_error(exc, path=path) from None
    except UnicodeDecodeError as exc:
        raise decode_error(exc, path=path, what="microbenchmark table") from None
    except pd.errors.EmptyDataError:
        raise ConfigError(source=str(path), key="<file>", value=str(path),
                          rule="empty file: a table needs a header row") from None
    except pd.errors.ParserError as exc:
        raise ConfigError(source=str(path), key="<file>", value=str(path), rule=f"malformed CSV: {exc}") from None


def _check_table(df: pd.DataFrame, path: Path, name: str) -> None:
    """Refuse a table whose columns or latencies the fit cannot use, naming the file, row and column:
    a non-finite or non-positive latency would otherwise be dropped unreported (<= 0, NaN) or turn the
    fitted artifact into NaN (inf)."""
    missing = [c for c in REQUIRED_COLUMNS[name] if c not in df]
    if missing:
        raise ConfigError(source=str(path), key=missing[0], value=None, rule="column is required")
    ms = [c for c in df.columns if c.endswith("_ms")] if name.startswith("deepep") else ["latency_ms"]
    numeric = [c for c in df.columns if c in NUMERIC_COLUMNS or c in ms]
    for c in numeric:
        values = pd.to_numeric(df[c], errors="coerce")
        bad = (values.isna() & df[c].notna()).to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ConfigError(source=f"{path} row {row + 1}", key=c, value=df[c].iloc[row], rule="must be a number")
        df[c] = values
        if c in NUMERIC_COLUMNS:
            # A size is a whole number of tokens, heads, bytes...: >= 1 (a few may be 0) and not absurd.
            v = values.to_numpy(dtype=float)
            lo = 0 if c in ZERO_ALLOWED else 1
            off = ~np.isnan(v) & ((v != np.round(v)) | (v < lo) | (v > MAX_SIZE))
            if off.any():
                row = int(np.flatnonzero(off)[0])
                raise ConfigError(source=f"{path} row {row + 1}", key=c, value=float(v[row]),
                                  rule=f"must be a whole number from {lo} to 2^40")
    latency = df[ms].sum(axis=1, min_count=len(ms)).to_numpy(dtype=float) if ms else np.zeros(len(df))
    bad = ~(np.isfinite(latency) & (latency > 0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ConfigError(source=f"{path} row {row + 1}", key="+".join(ms) or "<*_ms>",
                          value=float(latency[row]), rule="must be a finite number of milliseconds > 0")


def read_microbench_dir(directory: Path, system: str) -> tuple[pd.DataFrame, list[Exclusion], str]:
    """All rows found in `directory`, the exclusions applied, and the SHA-256 of the files read."""
    parts: list[pd.DataFrame] = []
    excl: list[Exclusion] = []
    found = [resolve(directory / f) for f in TABLE_FILES if resolve(directory / f).is_file()]
    for path in found:
        df = _read_table(path)
        name = path.name.split(".")[0]
        _check_table(df, path, name)
        if name == "gemm":
            other = ~df.dtype.isin(GEMM_DTYPES)
            if other.any():
                excl.append(Exclusion(system, name, "GEMM formats int8_wo/int4_wo/sq (out of scope)",
                                      int(other.sum())))
            df = df[~other]
            g = pd.DataFrame({"kernel": "gemm", "backend": df.backend,
                              "backend_version": df.backend_version.astype(str),
                              "kernel_source": df.kernel_source, "dtype": df.dtype, "m": df.m,
                              "n": df.n, "k": df.k, "latency_s": df.latency_ms * 1e-3})
            g["unit"] = df.n.astype(str) + "x" + df.k.astype(str)
            parts.append(g)
        elif name in ("context_attention", "generation_attention"):
            parts.append(_attention(df, name, system, excl))
        elif name == "nccl":
            per = np.where(df.nccl_dtype == "int8", 1, 2)
            msg = df.message_elems * per
            parts.append(pd.DataFrame({
                "kernel": "nccl_" + df.op, "backend": "nccl", "backend_version": df.nccl_version.astype(str),
                "message_bytes": msg, "num_gpus": df.num_gpus, "latency_s": df.latency_ms * 1e-3,
                "unit": msg.astype(str)}))
        elif name in TABLE_COLUMNS:
            parts.append(read_table_keyed(df, name, system, excl))
        elif name == "pointwise":
            bad = ~df.kernel.isin(["norm", "elementwise", "embedding", "sampling"])
            if bad.any():
                row = int(np.flatnonzero(bad.to_numpy())[0])
                raise ConfigError(source=f"{path} row {row + 1}", key="kernel", value=df.kernel.iloc[row],
                                  rule="must be norm, elementwise, embedding or sampling")
            p = pd.DataFrame({"kernel": df.kernel, "backend": df.backend if "backend" in df else "",
                              "variant": df.variant.fillna("").astype(str), "dtype": df.dtype,
                              "m": df.m, "n": df.n, "latency_s": df.latency_ms * 1e-3})
            for optional in ("backend_version", "kernel_source"):
                if optional in df:
                    p[optional] = df[optional].astype(str)
            p["unit"] = df.n.astype(str)
            parts.append(p)
        else:
            msg = df.message_elems * 2
            parts.append(pd.DataFrame({
                "kernel": "custom_allreduce", "backend": df.backend,
                "backend_version": df.backend_version.astype(str), "kernel_source": df.kernel_source,
                "variant": df.variant, "message_bytes": msg, "num_gpus": df.num_gpus,
                "latency_s": df.latency_ms * 1e-3, "unit": msg.astype(str)}))
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"kernel": []})
    rows = rows[rows.latency_s > 0] if len(rows) else rows
    return rows, excl, file_sha256(found)


def read_vidur_pointwise(path: Path) -> pd.DataFrame:
    """Vidur's small memory-bound ops as pointwise rows, with a `gpu` column (catalog names).

    What each Vidur op times (vidur/profiling/mlp/mlp_impl.py, Sarathi layers, fp16): the norms are
    Sarathi's RMSNorm kernel (torch LayerNorm for phi-2), 2 passes over tokens x hidden; `mlp_act`
    is SiluAndMul over 2 x width in, width out (3 passes, width = intermediate / tp) for gated MLPs
    and torch GELU (2 passes) otherwise; `attn_rope` rotates q and k in place ((q + kv heads) / tp x
    head_dim, 2 passes); `add` is residual + hidden (3 passes), or for parallel-block models
    (no post-attention norm: phi-2) attn + mlp + residual as two adds (6 passes); `emb` is the
    vocab-parallel lookup (2 passes; masking at tp > 1 is part of the timed region).
    """
    v = pd.read_csv(resolve(path))
    v = v[v.gpu.isin(list(VIDUR_GPUS))]
    head_dim = v.n_embd // v.n_head
    q = np.maximum(v.n_head // v.tp, 1)
    kvh = np.maximum(v.n_kv_head // v.tp, 1)
    has_post_norm = v.groupby(["gpu", "model"]).op.transform(lambda s: (s == "post_attention_layernorm").any())
    gated = v.use_gated_mlp.astype(str).str.lower().eq("true")
    width_mlp = v.n_expanded_embd // v.tp
    spec: dict[str, tuple[str, pd.Series, Any]] = {
        "emb": ("embedding", pd.Series("", index=v.index), v.n_embd),
        "input_layernorm": ("norm", pd.Series(np.where(has_post_norm, "rms_norm", "layer_norm"), index=v.index),
                            v.n_embd),
        "post_attention_layernorm": ("norm", pd.Series("rms_norm", index=v.index), v.n_embd),
        "attn_rope": ("elementwise", pd.Series("rope", index=v.index), (q + kvh) * head_dim),
        "mlp_act": ("elementwise", pd.Series(np.where(gated, "silu_and_mul", "gelu"), index=v.index), width_mlp),
        "add": ("elementwise", pd.Series(np.where(has_post_norm, "add", "add3"), index=v.index), v.n_embd),
    }
    parts = []
    for op, (kernel, variant, width) in spec.items():
        sel = (v.op == op).to_numpy()
        sub = v[sel]
        parts.append(pd.DataFrame({
            "gpu": sub.gpu.map(VIDUR_GPUS), "kernel": kernel, "backend": "vidur",
            "variant": variant[sel].to_numpy(), "dtype": "float16", "m": sub.num_tokens,
            "n": np.asarray(width)[sel], "latency_s": sub.median_ms * 1e-3}))
    out = pd.concat(parts, ignore_index=True)
    out["unit"] = out.n.astype(str)
    out = out.groupby(["gpu", "kernel", "variant", "m", "n"], as_index=False).agg(
        latency_s=("latency_s", "median"), backend=("backend", "first"), dtype=("dtype", "first"),
        unit=("unit", "first"))
    return out[out.latency_s > 0]


def columns_of(rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """Row-schema columns as numpy arrays (blank cells as empty strings) for `family_batches`."""
    cols: dict[str, np.ndarray] = {}
    for c in rows.columns:
        s = rows[c]
        cols[c] = s.to_numpy() if s.dtype.kind in "fiu" else s.fillna("").astype(str).to_numpy(dtype=object)
    return cols
