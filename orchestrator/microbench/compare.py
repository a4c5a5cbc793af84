"""`kernelsight microbench compare`: our measured tables against another table set of the same GPU.

Both directories are read with the calibration reader (`sim.calibration.tables.read_microbench_dir`,
so the data README's exclusions apply to both). Points are matched on their shape columns (the
`microbench plan` identity: GEMM dtype/m/n/k; attention dtypes, batch, length, heads, head_dim,
window; collectives op, group size, message bytes; pointwise kernel, variant, dtype, m, n). For each
kernel family and each series of theirs (backend, version, kernel source), the report gives the
matched points and the median, p10 and p90 of ours/theirs latency, plus which of our kernels were
compared. Ratios > 1 mean our measurement is slower. Needs pandas (the `calibrate` extra).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from sim.calibration.plan import PLAN_KEYS
from sim.calibration.tables import FAMILY_OF_KERNEL
from sim.errors import ConfigError

POINTWISE_KEY: Final = ("kernel", "variant", "dtype", "m", "n")
FAMILY_ORDER: Final = ("gemm", "attn_prefill", "attn_decode", "pointwise", "nccl", "custom_allreduce")
SERIES_COLUMNS: Final = ("backend", "backend_version", "kernel_source", "variant")


@dataclass(frozen=True, slots=True, kw_only=True)
class SeriesComparison:
    family: str
    series: str
    """Their backend / version / kernel source (and variant for custom all-reduce)."""
    num_matched: int
    median_ratio: float
    p10_ratio: float
    p90_ratio: float
    ours: str
    """Our kernel sources on the matched points."""


def _key_columns(kernel: str) -> tuple[str, ...]:
    family = FAMILY_OF_KERNEL.get(kernel, "pointwise")
    if family == "pointwise":
        return POINTWISE_KEY
    if kernel in PLAN_KEYS:
        return PLAN_KEYS[kernel]
    return PLAN_KEYS["collective"]


def _text(col: Any) -> Any:
    """A column as strings: integral floats without '.0', blanks for missing (vectorised)."""
    import pandas as pd

    if col.dtype.kind in "iub":
        return col.astype(str)
    if col.dtype.kind == "f":
        out = pd.Series("", index=col.index, dtype=object)
        integral = col.notna() & (col == col.round())
        out[integral] = col[integral].astype("int64").astype(str)
        other = col.notna() & ~integral
        out[other] = col[other].astype(str)
        return out
    return col.fillna("").astype(str)


def _join(df: Any, cols: tuple[str, ...]) -> Any:
    out = _text(df[cols[0]])
    for c in cols[1:]:
        out = out.str.cat(_text(df[c]), sep="|")
    return out


def _keyed(df: Any) -> Any:
    """`df` with `family`, `key` and `series` columns (pandas)."""
    import pandas as pd

    df = df.copy()
    for c in ("kernel_source", "variant", "dtype", "attn_dtype", "kv_cache_dtype", *SERIES_COLUMNS):
        if c not in df:
            df[c] = ""
    df["family"] = df.kernel.map(FAMILY_OF_KERNEL).fillna("pointwise")
    df["key"] = pd.Series("", index=df.index, dtype=object)
    for kernel, idx in df.groupby("kernel").groups.items():
        cols = tuple(c for c in _key_columns(str(kernel)) if c in df)
        df.loc[idx, "key"] = _join(df.loc[idx], cols)
    df["series"] = _join(df, SERIES_COLUMNS).str.replace("|", " ").str.strip()
    return df


def _read(directory: Path, system: str) -> Any:
    from sim.calibration.tables import read_microbench_dir

    if not directory.is_dir():
        raise ConfigError(source="microbench compare", key="dir", value=str(directory), rule="must be a directory")
    rows, _, _ = read_microbench_dir(directory, system)
    if not len(rows):
        raise ConfigError(source="microbench compare", key="dir", value=str(directory),
                          rule="holds no microbenchmark tables")
    return _keyed(rows)


def compare_dirs(ours_dir: Path, theirs_dir: Path, system: str | None = None) -> list[SeriesComparison]:
    """Per (family, their series) ratio statistics over shapes both directories measured."""
    system = system or theirs_dir.name
    ours, theirs = _read(ours_dir, system), _read(theirs_dir, system)
    ours_med = ours.groupby(["family", "key"]).agg(ours_s=("latency_s", "median"),
                                                   ours_src=("kernel_source", "first"),
                                                   ours_backend=("backend", "first")).reset_index()
    theirs_med = theirs.groupby(["family", "series", "key"], as_index=False).agg(theirs_s=("latency_s", "median"))
    both = theirs_med.merge(ours_med, on=["family", "key"], how="inner")
    out: list[SeriesComparison] = []
    for (family, series), g in both.groupby(["family", "series"], sort=False):
        ratio = np.sort((g.ours_s / g.theirs_s).to_numpy(dtype=float))
        sources = sorted({s or b for s, b in zip(g.ours_src.fillna(""), g.ours_backend.fillna(""), strict=True)})
        out.append(SeriesComparison(family=str(family), series=str(series), num_matched=len(ratio),
                                    median_ratio=float(np.median(ratio)), p10_ratio=float(np.quantile(ratio, 0.1)),
                                    p90_ratio=float(np.quantile(ratio, 0.9)), ours=", ".join(sources)))
    order = {f: i for i, f in enumerate(FAMILY_ORDER)}
    return sorted(out, key=lambda c: (order.get(c.family, len(order)), c.series))


def _device_line(ours_dir: Path) -> str:
    path = ours_dir / "device.json"
    if not path.is_file():
        return "ours: no device.json"
    info = json.loads(path.read_text())
    gpu = (info.get("gpu") or {}).get("name") or info.get("device", "?")
    dry = " — **dry run: times are meaningless**" if info.get("dry_run") else ""
    return f"ours: {gpu}, torch {info.get('torch')}, CUDA {info.get('cuda_runtime')}, {info.get('date_utc')}{dry}"


def render_markdown(comparisons: list[SeriesComparison], ours_dir: Path, theirs_dir: Path) -> str:
    lines = [f"# Microbenchmark comparison: `{ours_dir}` vs `{theirs_dir}`", "",
             _device_line(ours_dir), "",
             "Ratio = our latency / theirs on the same shape (median over matched shapes; > 1: ours slower).", "",
             "| family | their series | matched | median | p10 | p90 | our kernels |",
             "|---|---|---:|---:|---:|---:|---|"]
    for c in comparisons:
        lines.append(f"| {c.family} | {c.series} | {c.num_matched} | {c.median_ratio:.3f} | {c.p10_ratio:.3f} | "
                     f"{c.p90_ratio:.3f} | {c.ours} |")
    if not comparisons:
        lines.append("| (no shape measured in both) | | 0 | | | | |")
    return "\n".join(lines) + "\n"
