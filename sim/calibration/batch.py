"""Vectorised prediction for columns of kernel rows (the `predict-kernels` schema).

`family_batches` turns row columns into per-family numpy arrays of roofline times and shape
primitives with the same formulas as `sim.graph.transformer` (a test checks them against
`row_to_work`); `predict_latency_s` applies an efficiency model to all rows at once. numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.calibration.rows import DEFAULT_OP, OP_ALIASES, POINTWISE_KERNELS, POINTWISE_PASSES
from sim.dtypes import DType
from sim.perf.collective_model import physics_prims
from sim.perf.fitted import FittedEfficiency
from sim.perf.table_kernels import TABLE_FAMILY, num, table_batch
from sim.provenance import Provenance
from sim.specs.hardware import HardwareSpec

_DTYPE_OF: Final[dict[str, DType]] = {
    "bfloat16": DType.BFLOAT16, "bf16": DType.BFLOAT16, "float16": DType.FLOAT16,
    "fp16": DType.FLOAT16, "fp8": DType.FP8, "fp8_block": DType.FP8_BLOCK, "nvfp4": DType.NVFP4,
    "mxfp4": DType.MXFP4, "int8_wo": DType.INT8_WO, "int4_wo": DType.INT4_WO, "sq": DType.INT8,
    "int8": DType.INT8, "float32": DType.FLOAT32,
}
_NCCL_OPS: Final[dict[str, str]] = {
    "nccl_all_reduce": "all_reduce", "nccl_all_gather": "all_gather",
    "nccl_reduce_scatter": "reduce_scatter", "nccl_alltoall": "alltoall", "custom_allreduce": "all_reduce",
}


@dataclass(frozen=True, slots=True)
class FamilyBatch:
    family: str
    index: np.ndarray
    """Row positions of this family's rows in the input."""
    roofline_s: np.ndarray
    prims: dict[str, np.ndarray]
    cats: dict[str, np.ndarray]


def _text(cols: Mapping[str, np.ndarray], name: str, idx: np.ndarray, default: str) -> np.ndarray:
    col = cols.get(name)
    if col is None:
        return np.full(len(idx), default, dtype=object)
    out: np.ndarray = col[idx].astype(object)
    out[(out == "") | (out == None)] = default  # noqa: E711 (elementwise comparison)
    return out


def _labels(values: np.ndarray) -> list[str]:
    """Distinct labels of an object array (hashing, not sorting: cheap on large batches)."""
    return sorted(set(values.tolist()))


def _per_dtype(values: np.ndarray, fn: dict[str, float]) -> np.ndarray:
    out = np.empty(len(values))
    for label in _labels(values):
        if label not in fn:
            raise ValueError(f"dtype={label!r}: must be one of {', '.join(sorted(fn))}")
        out[values == label] = fn[label]
    return out


def family_batches(cols: Mapping[str, np.ndarray], hw: HardwareSpec) -> list[FamilyBatch]:
    kernel = np.asarray(cols["kernel"]).astype(object)
    bytes_of = {k: d.bytes_per_element() for k, d in _DTYPE_OF.items()}
    peak_of = {k: hw.peak_flops_for(DType.BFLOAT16 if d in (DType.INT8_WO, DType.INT4_WO) else d)
               for k, d in _DTYPE_OF.items()}
    bw = hw.hbm_bandwidth_bytes_per_s
    out: list[FamilyBatch] = []

    idx = np.flatnonzero(kernel == "gemm")
    if len(idx):
        m, n, k = (num(cols, c, idx, 1.0) for c in ("m", "n", "k"))
        dt = _text(cols, "dtype", idx, "bfloat16")
        flops = 2.0 * m * n * k
        nbytes = n * k * _per_dtype(dt, bytes_of) + (m * k + m * n) * 2.0
        tc, tm = flops / _per_dtype(dt, peak_of), nbytes / bw
        out.append(FamilyBatch("gemm", idx, np.maximum(tc, tm),
                               {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "m": m, "n": n, "k": k},
                               {"dtype": dt, "backend": _text(cols, "backend", idx, "")}))

    for name, family in (("context_attention", "attn_prefill"), ("generation_attention", "attn_decode")):
        idx = np.flatnonzero(kernel == name)
        if not len(idx):
            continue
        act = _text(cols, "attn_dtype", idx, "bfloat16")
        kvd = _text(cols, "kv_cache_dtype", idx, "")
        kvd = np.where(kvd == "", act, kvd)
        b = num(cols, "batch_size", idx, 1.0)
        h = num(cols, "num_heads", idx, 1.0)
        kvh = num(cols, "num_kv_heads", idx, np.nan)
        kvh = np.where(np.isnan(kvh), h, kvh)
        d = num(cols, "head_dim", idx, 128.0)
        win = num(cols, "window_size", idx, 0.0)
        ab, kb = _per_dtype(act, bytes_of), _per_dtype(kvd, bytes_of)
        kv_row = 2.0 * kvh * d * kb
        if family == "attn_prefill":
            s = num(cols, "seq_len", idx, 1.0)
            full = (win <= 0) | (win >= s)
            grow = np.minimum(win, s)
            keys = np.where(full, (1.0 + s) * s // 2,
                            np.where(win <= 1, win * s, (1.0 + grow) * grow // 2 + grow * (s - grow)))
            flops = 4.0 * h * d * keys * b
            nbytes = 2.0 * s * h * d * ab * b + s * kv_row * b + s * kv_row * b
            length = {"seq": s}
        else:
            kv = num(cols, "kv_len", idx, 1.0)
            span = np.where(win <= 0, kv + 1.0, np.minimum(kv + 1.0, win))
            flops = 4.0 * h * d * span * b
            nbytes = 2.0 * b * h * d * ab + span * b * kv_row + b * kv_row
            length = {"kv": np.round(span)}
        tc, tm = flops / _per_dtype(act, peak_of), nbytes / bw
        act_label = np.where((act == "fp8") | (act == "fp8_block"), "fp8", "bfloat16")
        kv_label = np.where(kb < 1.5, "fp8", "bfloat16")
        out.append(FamilyBatch(
            family, idx, np.maximum(tc, tm),
            {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "batch": b, "heads": h, "kv_heads": kvh,
             "head_dim": d, "windowed": (win > 0).astype(float), **length},
            {"dtype": np.char.add(np.char.add(act_label.astype(str), "/"), kv_label.astype(str)).astype(object),
             "backend": _text(cols, "backend", idx, "")}))

    idx = np.flatnonzero(np.isin(kernel, list(POINTWISE_KERNELS)))
    if len(idx):
        t, w = num(cols, "m", idx, 1.0), num(cols, "n", idx, 1.0)
        dt = _text(cols, "dtype", idx, "bfloat16")
        variant = _text(cols, "variant", idx, "")
        op = variant.copy()
        for name, default in DEFAULT_OP.items():
            op[(op == "") & (kernel[idx] == name)] = default
        for alias, name in OP_ALIASES.items():
            op[op == alias] = name
        passes = np.full(len(idx), 2.0)
        for name, value in POINTWISE_PASSES.items():
            passes[op == name] = value
        nbytes = passes * t * w * _per_dtype(dt, bytes_of)
        tc, tm = t * w / _per_dtype(dt, peak_of), nbytes / bw
        out.append(FamilyBatch("pointwise", idx, np.maximum(tc, tm),
                               {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "tokens": t, "width": w},
                               {"op": op, "backend": _text(cols, "backend", idx, "")}))

    for family, names in (("nccl", [k for k in _NCCL_OPS if k.startswith("nccl")]),
                          ("custom_allreduce", ["custom_allreduce"])):
        idx = np.flatnonzero(np.isin(kernel, names))
        if not len(idx):
            continue
        msg = num(cols, "message_bytes", idx, 1.0)
        g = num(cols, "num_gpus", idx, 2.0)
        op = np.array([_NCCL_OPS[str(v)] for v in kernel[idx]], dtype=object)
        frac = np.where(g <= 1, 0.0, np.where(op == "all_reduce", 2.0 * (g - 1) / g, (g - 1) / g))
        intra = g <= hw.nvlink_domain()
        link_bw = np.where(intra, hw.intra_node_link.bandwidth_bytes_per_s,
                           hw.inter_node_link.bandwidth_bytes_per_s)
        kinds = np.where(intra, hw.intra_node_link.kind, hw.inter_node_link.kind)
        tn = frac * msg / link_bw
        variant = _text(cols, "variant", idx, "")
        group = np.maximum(g, 2.0)
        out.append(FamilyBatch(family, idx, tn,
                               {"network_s": tn, "msg": np.maximum(msg, 1.0), "group": group,
                                "nvlink": (kinds == "nvlink").astype(float), "link_bw": link_bw,
                                **physics_prims(family, op, np.maximum(msg, 1.0), group, variant, hw)},
                               {"op": op, "variant": variant}))

    # Table-keyed families (MoE, MLA, expert all-to-all): `sim.perf.table_kernels`.
    for family in sorted(set(TABLE_FAMILY.values())):
        names = [t for t, f in TABLE_FAMILY.items() if f == family]
        idx = np.flatnonzero(np.isin(kernel, names))
        if len(idx):
            tb = table_batch(names[0], cols, idx, hw)
            out.append(FamilyBatch(family, idx, tb.roofline_s, tb.prims, tb.cats))
    return out


def predict_latency_s(cols: Mapping[str, np.ndarray], hw: HardwareSpec, model: FittedEfficiency | None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Latency (s) and provenance code per row; `model=None` is the roofline tier."""
    n = len(cols["kernel"])
    latency = np.full(n, np.nan)
    prov = np.full(n, int(Provenance.ROOFLINE))
    known = np.zeros(n, dtype=bool)
    for fb in family_batches(cols, hw):
        known[fb.index] = True
        if model is None or fb.family not in model.families():
            latency[fb.index] = fb.roofline_s
            continue
        y, outside, corrected = model.predict_log_slowdown(fb.family, fb.prims, fb.cats, hw)
        latency[fb.index] = fb.roofline_s * np.exp(y)
        prov[fb.index] = np.where(outside, int(Provenance.EXTRAPOLATED),
                                  np.where(corrected, int(Provenance.CALIBRATED), int(Provenance.TRANSFERRED)))
    if not known.all():
        bad = int(np.flatnonzero(~known)[0])
        raise ValueError(f"row {bad + 1}: kernel={cols['kernel'][bad]!r} is not a known kernel")
    return latency, prov
