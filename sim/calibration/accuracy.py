"""Leave-one-GPU-out accuracy of the kernel model (`kernelsight accuracy kernels`).

For each GPU with data: the cross-generation model is refitted on the other non-b200 GPUs and
scored on the held-out GPU; the target-measured tier adds a correction fitted on the held-out
GPU's rows at the microbenchmark plan's points only and is scored on whole units the plan does
not touch (GEMM (n, k) sites, attention head configurations, collective message sizes). Baselines:
roofline, and naive transfer (mean log-efficiency of the same shape on the training GPUs,
family median where no GPU has it). b200_sxm is never in a training set and is reported as its
own row, cross-generation only: a target-measured score would need a correction fitted on its
rows. Rows are subsampled deterministically by a hash of the shape (same shapes on every GPU).
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sim.calibration.batch import family_batches, predict_latency_s
from sim.calibration.families import FAMILIES_REPORTED, KEEP_FRAC
from sim.calibration.fit import fit_correction, fit_cross_generation
from sim.calibration.plan import DEFAULT_GRID, KEY_OFFSETS, PLAN_KEYS, PlanGrid, microbench_plan, plan_key_family
from sim.calibration.tables import (
    FAMILY_OF_KERNEL,
    Exclusion,
    columns_of,
    file_sha256,
    read_microbench_dir,
    read_vidur_pointwise,
)
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec

TRAIN_GPUS: Final = ("a100_sxm", "l40s", "h100_sxm", "h200_sxm", "rtx_pro_6000_server")
EVAL_ONLY: Final = ("b200_sxm",)
SHAPE_COLS: Final = ("kernel", "backend", "dtype", "variant", "attn_dtype", "kv_cache_dtype", "m", "n",
                     "k", "batch_size", "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim",
                     "window_size", "message_bytes", "num_gpus")
TABLE_SHAPE_COLS: Final = ("moe_dtype", "num_tokens", "hidden_size",
                     "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution",
                     "kernel_source", "gemm_type", "bmm_dtype", "op_name", "prefix_len", "num_tokens_per_rank",
                     "node_num", "dispatch_sms", "intermediate_size", "num_slots", "dp_num_tokens",
                     "rank0_num_tokens", "aic_table", "phase", "simulation_mode", "quant_type")
"""Shape columns of the table-keyed families (blank on the other rows, so adding them to a key leaves
the other families' keys equivalent)."""
SUBSAMPLE_TABLE_COLS: Final = tuple(c for c in TABLE_SHAPE_COLS if c != "kernel_source")
"""The table-keyed shape columns the subsample hashes: not `kernel_source`, which names the kernel a
backend runs on that GPU (vLLM's MLA decode is `vllm_triton_mla` on A100, `vllm_flash_attn_mla` on H100),
so that the same shapes are kept on every GPU."""
TIERS: Final = ("roofline", "naive", "cross-generation", "target-measured")
VIDUR_KEY: Final = "vidur/compute_mlp_ops.csv.gz"
"""`Loaded.sha256` key of the Vidur table the pointwise rows come from (the others are GPU names)."""


@dataclass(frozen=True, slots=True)
class Loaded:
    rows: dict[str, pd.DataFrame]
    """Per GPU, the rows scored (shape-hash subsample) with their roofline time."""
    exclusions: list[Exclusion]
    sha256: dict[str, str]
    plan_rows: dict[str, pd.DataFrame]
    """Per training GPU, every measured row at a microbenchmark-plan point (the calibration data)."""


def _keys(df: pd.DataFrame, cols: tuple[str, ...]) -> pd.Series:
    parts = []
    for c in cols:
        if c not in df:
            parts.append(pd.Series("", index=df.index))
            continue
        s = df[c]
        if s.dtype.kind == "f":
            parts.append(s.map(lambda v: "" if v != v else str(int(v)) if v == int(v) else repr(v)))
        else:
            parts.append(s.fillna("").astype(str))
    out = parts[0]
    for p in parts[1:]:
        out = out + "|" + p
    return out


def plan_mask(rows: pd.DataFrame, hw: HardwareSpec, grid: PlanGrid = DEFAULT_GRID) -> tuple[np.ndarray, np.ndarray]:
    """(rows at plan points, rows in a plan unit) for one GPU's rows."""
    plan = pd.DataFrame(microbench_plan(hw, grid))
    at = np.zeros(len(rows), dtype=bool)
    kfam = rows.kernel.map(plan_key_family)
    for fam, cols in PLAN_KEYS.items():
        sel = (kfam == fam).to_numpy()
        psel = plan.kernel.map(plan_key_family) == fam
        if not sel.any() or not psel.any():
            continue
        pk = set(_keys(plan[psel], cols))
        at[sel] = _keys(rows[sel], cols).isin(pk).to_numpy()
        for kernel, (col, offset) in KEY_OFFSETS.items():
            pos = np.flatnonzero(sel & (rows.kernel == kernel).to_numpy())
            if len(pos) and col in rows:
                shifted = rows.iloc[pos]
                shifted = shifted.assign(**{col: pd.to_numeric(shifted[col], errors="coerce") - offset})
                at[pos] |= _keys(shifted, cols).isin(pk).to_numpy()
    units = set(rows.loc[at, "kernel"].map(FAMILY_OF_KERNEL) + ":" + rows.loc[at, "unit"].astype(str))
    in_unit = (rows.kernel.map(FAMILY_OF_KERNEL) + ":" + rows.unit.astype(str)).isin(units).to_numpy()
    return at, in_unit


def unit_labels(rows: pd.DataFrame) -> pd.Series:
    """`<family>:<unit>` of each row (the unit a plan point touches: GEMM (n, k) site, head
    configuration, message size, ...)."""
    labels: pd.Series = rows.kernel.map(FAMILY_OF_KERNEL) + ":" + rows.unit.astype(str)
    return labels


def in_units_of(rows: pd.DataFrame, calibration_rows: pd.DataFrame) -> np.ndarray:
    """Rows in a unit that any calibration row touches. The units come from the calibration rows
    themselves (the full table's plan points), not from the plan points that a scored subsample
    kept: a unit whose plan rows the subsample dropped is still one the correction was fitted on."""
    return unit_labels(rows).isin(set(unit_labels(calibration_rows))).to_numpy()


def full_rows(data_root: Path, gpu: str) -> pd.DataFrame:
    """Every usable measured row of one GPU: its AIConfigurator tables plus its Vidur small kernels
    (as the pointwise.csv a sweep would write)."""
    df, _, _ = read_microbench_dir(data_root / "aiconfigurator" / gpu, gpu)
    vidur = read_vidur_pointwise(data_root / "vidur" / "compute_mlp_ops.csv.gz")
    return pd.concat([df, vidur[vidur.gpu == gpu].drop(columns="gpu")], ignore_index=True)


def load(data_root: Path, gpus: tuple[str, ...], *, subsample: bool = True,
         on_gpu_loaded: Callable[[str], None] | None = None,
         families: tuple[str, ...] | None = None) -> Loaded:
    """`families`: keep only these families' rows (None: all)."""
    rows: dict[str, pd.DataFrame] = {}
    excl: list[Exclusion] = []
    sha: dict[str, str] = {}
    plan_rows: dict[str, pd.DataFrame] = {}
    vidur_path = data_root / "vidur" / "compute_mlp_ops.csv.gz"
    vidur = read_vidur_pointwise(vidur_path)
    sha[VIDUR_KEY] = file_sha256([vidur_path])  # the pointwise rows of every GPU come from it
    for gpu in gpus:
        df, ex, digest = read_microbench_dir(data_root / "aiconfigurator" / gpu, gpu)
        df = pd.concat([df, vidur[vidur.gpu == gpu].drop(columns="gpu")], ignore_index=True)
        if families is not None:
            df = df[df.kernel.map(FAMILY_OF_KERNEL).isin(families)].reset_index(drop=True)
        if gpu in TRAIN_GPUS:
            at_plan, _ = plan_mask(df, load_hardware(gpu))
            plan_rows[gpu] = df[at_plan].reset_index(drop=True)
        df["family"] = df.kernel.map(FAMILY_OF_KERNEL)
        if subsample:
            h = pd.util.hash_pandas_object(_keys(df, SHAPE_COLS), index=False).to_numpy().copy()
            table = df.family.isin(FAMILIES_REPORTED[6:]).to_numpy()
            if table.any():  # table-keyed rows: hash their own key columns too (old families unchanged)
                h[table] = pd.util.hash_pandas_object(_keys(df[table], (*SHAPE_COLS, *SUBSAMPLE_TABLE_COLS)),
                                                      index=False).to_numpy()
            frac = df.family.map(KEEP_FRAC).fillna(1.0).to_numpy()
            df = df[(h % 10_000) < frac * 10_000].reset_index(drop=True)
        hw = load_hardware(gpu)
        roof = np.zeros(len(df))
        for fb in family_batches(columns_of(df), hw):
            roof[fb.index] = fb.roofline_s
        df["roofline_s"] = roof
        rows[gpu], sha[gpu] = df, digest
        excl += ex
        if on_gpu_loaded is not None:
            on_gpu_loaded(gpu)
    return Loaded(rows, excl, sha, plan_rows)


def _naive(train: Mapping[str, pd.DataFrame], held: pd.DataFrame) -> np.ndarray:
    cols = tuple(c for c in (*SHAPE_COLS, *TABLE_SHAPE_COLS) if c not in ("backend", "kernel_source"))
    both = pd.concat([df.assign(_le=np.log(df.roofline_s / df.latency_s)) for df in train.values()])
    by_key = both.groupby(_keys(both, cols))["_le"].mean()
    fam_med = both.groupby("family")["_le"].median()
    matched = _keys(held, cols).map(by_key)
    le = matched.fillna(held.family.map(fam_med)).fillna(0.0).to_numpy(dtype=float)
    pred: np.ndarray = held.roofline_s.to_numpy() / np.exp(np.minimum(le, 0.0))
    return pred


def family_scores(held: pd.DataFrame, pred: np.ndarray, mask: np.ndarray) -> dict[str, dict[str, float]]:
    ape = np.abs(pred - held.latency_s.to_numpy()) / held.latency_s.to_numpy()
    out: dict[str, dict[str, float]] = {}
    for fam in FAMILIES_REPORTED:
        sel = mask & (held.family == fam).to_numpy()
        if sel.sum() >= 5:
            out[fam] = {"median_ape": float(np.median(ape[sel])),
                        "p90_ape": float(np.quantile(ape[sel], 0.9)), "rows": int(sel.sum())}
            out[fam]["median_ratio"] = float(np.median(pred[sel] / held.latency_s.to_numpy()[sel]))
    return out


def _residuals(held: pd.DataFrame, pred: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Family -> log(measured / predicted) of the scored rows (float32; the intervals' calibration data)."""
    r = np.log(held.latency_s.to_numpy() / pred)
    fam = held.family.to_numpy()
    return {f: r[mask & (fam == f)].astype(np.float32) for f in FAMILIES_REPORTED
            if (mask & (fam == f)).sum() >= 5}


def evaluate_gpu(held_gpu: str, loaded: Loaded, data_root: Path) -> dict[str, Any]:
    train = {g: df for g, df in loaded.rows.items() if g in TRAIN_GPUS and g != held_gpu}
    hws = {g: load_hardware(g) for g in train}
    hw = load_hardware(held_gpu)
    held = loaded.rows[held_gpu]
    base = fit_cross_generation(train, hws)
    cols = columns_of(held)
    everything = np.ones(len(held), dtype=bool)
    result: dict[str, Any] = {"gpu": held_gpu, "tiers": {}}
    result["tiers"]["roofline"] = family_scores(held, held.roofline_s.to_numpy(), everything)
    result["tiers"]["naive"] = family_scores(held, _naive(train, held), everything)
    cross, _ = predict_latency_s(cols, hw, FittedEfficiency(base))
    result["tiers"]["cross-generation"] = family_scores(held, cross, everything)
    # Residuals of the scored rows per tier (popped before the result is written as JSON).
    result["residuals"] = {"roofline": _residuals(held, held.roofline_s.to_numpy(), everything),
                           "cross-generation": _residuals(held, cross, everything)}
    if held_gpu in EVAL_ONLY:
        # Calibrating would fit a correction on the evaluation GPU's own rows: not allowed.
        result["tiers"]["target-measured"] = {}
        result["tiers"]["cross-generation (same rows as target)"] = {}
        result["calibration_points"] = 0
        return result
    # Target-measured: calibrate on the plan's points of the full table, score outside plan units.
    calibrated = fit_correction(base, loaded.plan_rows[held_gpu], hw)
    in_unit = in_units_of(held, loaded.plan_rows[held_gpu])
    target, _ = predict_latency_s(cols, hw, FittedEfficiency(calibrated))
    result["tiers"]["target-measured"] = family_scores(held, target, ~in_unit)
    result["tiers"]["cross-generation (same rows as target)"] = family_scores(held, cross, ~in_unit)
    result["residuals"]["target-measured"] = _residuals(held, target, ~in_unit)
    result["calibration_points"] = len(loaded.plan_rows[held_gpu])
    result["plan_points"] = len(microbench_plan(hw))
    return result


def _work(args: tuple[str, Path, Loaded]) -> dict[str, Any]:
    return evaluate_gpu(args[0], args[2], args[1])


def run_logo(data_root: Path, *, workers: int = 2,
             progress: Callable[[int, int], None] | None = None,
             families: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Leave-one-GPU-out accuracy; `progress(done, total)` counts GPUs loaded, then GPUs evaluated.
    `families` restricts loading, fitting and scoring to those families (None: all). Each GPU's
    result carries `residuals` (tier -> family -> log(measured / predicted) arrays) for the intervals."""
    gpus = (*TRAIN_GPUS, *EVAL_ONLY)
    total = 2 * len(gpus)
    steps = iter(range(1, total + 1))

    def tick(_: object = None) -> None:
        if progress is not None:
            progress(next(steps), total)

    loaded = load(data_root, gpus, on_gpu_loaded=tick, families=families)
    jobs = [(g, data_root, loaded) for g in gpus]
    results: list[dict[str, Any]] = []
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork")) as ex:
            for r in ex.map(_work, jobs):
                results.append(r)
                tick()
    else:
        for j in jobs:
            results.append(_work(j))
            tick()
    return {
        "gpus": results,
        "exclusions": [{"system": e.system, "table": e.table, "what": e.what, "rows": e.num_rows}
                       for e in loaded.exclusions],
        "rows_scored": {g: len(df) for g, df in loaded.rows.items()},
        "data_sha256": loaded.sha256,
    }
