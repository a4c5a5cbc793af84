"""Roofline work and model primitives of the table-keyed kernel families: fused MoE, MLA, expert
all-to-all (DeepEP).

These kernels are described by the key columns of their measured tables (shared/data/README.md
section 4), not by (m, n, k): one function per family turns columns of such rows (numpy arrays,
blank = default) into the roofline time, the shape primitives the learned efficiency reads and
its categoricals. The same functions serve fitting, `predict-kernels` and the simulator (which
converts a `KernelWork` of kind MOE / MLA_* / EP_ALL_TO_ALL into one such row, see
`work_columns`), so all three price a kernel identically.

MoE routing: the measured layer is what EP rank 0 runs, so the work is rank 0's share under the
row's routing distribution. `moe_rank0_load` reproduces AIConfigurator's collector
(`collector/helper.py`: `balanced_logits`, and `_generate_power_law_distribution` behind
`power_law_logits_v3`): balanced = round-robin top-k with stride ceil(E / topk); power_law_<a> =
per-expert counts drawn from a truncated power law (x_min 1, x_max 0.8 x tokens, or 0.01..2 when
tokens x topk <= experts), rescaled to tokens x topk, rounded, with the heaviest EP group swapped
onto rank 0. It returns rank 0's routed token-expert pairs, its active experts and its heaviest
expert's tokens, averaged over 5 seeded draws (the collector averages its latency over 5 routings).
A simulated MoE node's row carries its routing as a router meets it (`moe_routing.served`): the
collector's load wherever its draw spreads the tokens, its draws with the experts shuffled over the
ranks where a few tokens meet many experts. numpy only; pure (seeded generators per call).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.moe_routing import load_distribution, moe_rank0_loads, served
from sim.specs.hardware import HardwareSpec

TABLE_FAMILY: Final[dict[str, str]] = {
    "moe": "moe", "wideep_moe": "moe", "wideep_mlp": "moe",
    "mla_context": "mla_prefill", "mla_module_context": "mla_prefill",
    "mla_generation": "mla_decode", "mla_module_generation": "mla_decode",
    "mla_bmm": "mla_bmm", "deepep_ll": "ep_a2a", "deepep_normal": "ep_a2a",
}
"""Table name (the `kernel` of a row) -> kernel family."""
TABLE_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "moe": ("backend", "backend_version", "backend_version_reported", "kernel_source", "moe_dtype", "num_tokens",
            "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size", "distribution"),
    "wideep_moe": ("backend", "backend_version", "backend_version_reported", "aic_table", "phase", "op_name",
                   "kernel_source", "moe_dtype", "moe_kernel", "num_tokens", "dp_num_tokens", "rank0_num_tokens",
                   "hidden_size", "inter_size", "topk", "num_experts", "num_slots", "moe_tp_size", "moe_ep_size",
                   "distribution", "simulation_mode"),
    "wideep_mlp": ("backend", "backend_version", "backend_version_reported", "phase", "op_name", "kernel_source",
                   "quant_type", "num_tokens", "hidden_size", "intermediate_size"),
    "mla_context": ("backend", "backend_version", "backend_version_reported", "op_name", "kernel_source",
                    "mla_dtype", "kv_cache_dtype", "num_heads", "tp_size", "batch_size", "seq_len", "prefix_len"),
    "mla_generation": ("backend", "backend_version", "backend_version_reported", "op_name", "kernel_source",
                       "mla_dtype", "kv_cache_dtype", "num_heads", "tp_size", "batch_size", "aic_isl", "aic_step",
                       "kv_len"),
    "mla_module_context": ("backend", "backend_version", "backend_version_reported", "aic_table", "op_name",
                           "kernel_source", "model", "architecture", "gemm_type", "mla_dtype", "kv_cache_dtype",
                           "num_heads", "tp_size", "batch_size", "seq_len", "prefix_len"),
    "mla_module_generation": ("backend", "backend_version", "backend_version_reported", "aic_table", "op_name",
                              "kernel_source", "model", "architecture", "gemm_type", "mla_dtype", "kv_cache_dtype",
                              "num_heads", "tp_size", "batch_size", "aic_isl", "aic_step", "kv_len"),
    "mla_bmm": ("backend", "backend_version", "backend_version_reported", "op_name", "kernel_source", "bmm_dtype",
                "num_tokens", "num_heads"),
    "deepep_ll": ("backend", "backend_version", "backend_version_reported", "op_name", "kernel_source", "node_num",
                  "num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts"),
    "deepep_normal": ("backend", "backend_version", "backend_version_reported", "op_name", "kernel_source",
                      "node_num", "num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts",
                      "dispatch_sms", "combine_sms"),
}
"""Query columns of each table: its own columns (data README) except measured ones and flags."""
REQUIRED: Final[dict[str, tuple[str, ...]]] = {
    "moe": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
            "moe_ep_size", "distribution"),
    "wideep_moe": ("moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_ep_size",
                   "distribution"),
    "wideep_mlp": ("num_tokens", "hidden_size", "intermediate_size"),
    "mla_context": ("num_heads", "batch_size", "seq_len"),
    "mla_module_context": ("num_heads", "batch_size", "seq_len"),
    "mla_generation": ("num_heads", "batch_size", "kv_len"),
    "mla_module_generation": ("num_heads", "batch_size", "kv_len"),
    "mla_bmm": ("op_name", "bmm_dtype", "num_tokens", "num_heads"),
    "deepep_ll": ("num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts"),
    "deepep_normal": ("num_gpus", "hidden_size", "num_tokens_per_rank", "topk", "num_experts"),
}
"""Cells a `predict-kernels` row of each table must fill."""
NUMERIC: Final[frozenset[str]] = frozenset({
    "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
    "dp_num_tokens", "rank0_num_tokens", "num_slots", "intermediate_size", "tp_size", "prefix_len", "aic_isl",
    "aic_step", "node_num", "num_tokens_per_rank", "dispatch_sms", "combine_sms"})
"""Numeric columns the tables add to the row schema (beyond the existing ones)."""

MOE_DTYPES: Final[dict[str, tuple[float, DType]]] = {
    "bfloat16": (2.0, DType.BFLOAT16), "fp8": (1.0, DType.FP8), "fp8_block": (1.0, DType.FP8_BLOCK),
    "nvfp4": (0.5 + 1 / 16, DType.NVFP4), "int4_wo": (0.5 + 2 / 128, DType.INT4_WO),
    "w4afp8": (0.5 + 2 / 128, DType.FP8), "w4a16_mxfp4": (0.5 + 1 / 32, DType.BFLOAT16),
    "w4a8_mxfp4_mxfp8": (0.5 + 1 / 32, DType.FP8),
}
"""MoE weight format -> (bytes per weight incl. scales, the tensor-core rate it computes at)."""
SIM_MOE_DTYPE: Final[dict[DType, str]] = {
    DType.BFLOAT16: "bfloat16", DType.FLOAT16: "bfloat16", DType.FP8: "fp8", DType.FP8_BLOCK: "fp8_block",
    DType.NVFP4: "nvfp4", DType.MXFP4: "w4a16_mxfp4", DType.INT4_WO: "int4_wo", DType.INT8_WO: "bfloat16",
    DType.INT8: "fp8", DType.FLOAT32: "bfloat16",
}
"""A `KernelWork` dtype of kind MOE -> the `moe_dtype` level (gpt-oss mxfp4 runs w4a16 kernels)."""
_GEMM_BYTES: Final[dict[str, float]] = {"bfloat16": 2.0, "fp8_block": 1.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}
_GEMM_PEAK: Final[dict[str, DType]] = {"bfloat16": DType.BFLOAT16, "fp8_block": DType.FP8_BLOCK,
                                       "fp8": DType.FP8, "nvfp4": DType.NVFP4}
DEEPEP_DEFAULT_SMS: Final = 20
"""DeepEP's default SM count for normal-mode kernels (`deep_ep.Buffer.num_sms`)."""

# DeepSeek-V3 MLA geometry (every MLA table measures it): per-head q/k nope 128 + rope 64, v 128,
# latent 512 + rope 64; projections hidden 7168 -> q_lora 1536 / kv 576, o_proj heads x 128 -> 7168.
MLA_NOPE: Final = 128
MLA_ROPE: Final = 64
MLA_V: Final = 128
MLA_LORA: Final = 512
MLA_HIDDEN: Final = 7168
MLA_Q_LORA: Final = 1536


@dataclass(frozen=True, slots=True)
class TableBatch:
    family: str
    roofline_s: np.ndarray
    prims: dict[str, np.ndarray]
    cats: dict[str, np.ndarray]
    flops: np.ndarray
    bytes: np.ndarray
    """HBM bytes (compute families) or per-rank bytes sent (all-to-all)."""


# -- columns -----------------------------------------------------------------------------------
def num(cols: Mapping[str, np.ndarray], name: str, idx: np.ndarray, default: float) -> np.ndarray:
    col = cols.get(name)
    if col is None:
        return np.full(len(idx), float(default))
    raw = col[idx]
    if raw.dtype.kind in "fiu":
        out = raw.astype(float)
    else:
        out = np.array([float(v) if v not in ("", None) else np.nan for v in raw.tolist()], dtype=float)
    result: np.ndarray = np.where(np.isnan(out), default, out)
    return result


def text(cols: Mapping[str, np.ndarray], name: str, idx: np.ndarray, default: str) -> np.ndarray:
    col = cols.get(name)
    if col is None:
        return np.full(len(idx), default, dtype=object)
    out: np.ndarray = np.array(["" if v is None or v != v else str(v) for v in col[idx].tolist()], dtype=object)
    out[out == ""] = default
    return out


def _moe_loads(tokens: np.ndarray, experts: np.ndarray, topk: np.ndarray, ep: np.ndarray,
               dist: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = list(zip(tokens.astype(np.int64).tolist(), experts.astype(np.int64).tolist(),
                    topk.astype(np.int64).tolist(), ep.astype(np.int64).tolist(), dist.tolist(), strict=True))
    out = np.array(moe_rank0_loads(keys), dtype=float).reshape(len(keys), 3)
    return out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy()


def moe_class(kernel: np.ndarray, kernel_source: np.ndarray) -> np.ndarray:
    """Kernel class of a MoE row (the `variant` categorical): the kernel paths whose cost differs
    from the framework's default fused MoE at the same format, else blank."""
    out = np.full(len(kernel), "", dtype=object)
    src = np.array([str(s) for s in kernel_source.tolist()], dtype=object)
    for token, label in (("min_latency", "min_latency"), ("marlin", "marlin"), ("deepgemm", "deepgemm"),
                         ("cutedsl", "cutedsl"), ("triton_fp8_block", "triton")):
        out[np.array([token in s for s in src.tolist()], dtype=bool)] = label
    out[kernel == "wideep_moe"] = "wideep"
    out[kernel == "wideep_mlp"] = "dense_mlp"
    return out


def moe_batch(cols: Mapping[str, np.ndarray], idx: np.ndarray, hw: HardwareSpec) -> TableBatch:
    kernel = text(cols, "kernel", idx, "moe")
    mlp = kernel == "wideep_mlp"
    wide = kernel == "wideep_moe"
    t = np.maximum(num(cols, "num_tokens", idx, 1.0), 1.0)
    h = num(cols, "hidden_size", idx, 4096.0)
    inter = np.where(mlp, num(cols, "intermediate_size", idx, 1.0), num(cols, "inter_size", idx, 1.0))
    k = np.where(mlp, 1.0, num(cols, "topk", idx, 1.0))
    e = np.where(mlp, 1.0, num(cols, "num_experts", idx, 1.0))
    tp = np.where(mlp, 1.0, np.maximum(num(cols, "moe_tp_size", idx, 1.0), 1.0))
    ep = np.where(mlp, 1.0, np.maximum(num(cols, "moe_ep_size", idx, 1.0), 1.0))
    slots = np.where(wide, np.maximum(num(cols, "num_slots", idx, 0.0), e), e)
    dist = text(cols, "distribution", idx, "balanced")
    dist = np.array([load_distribution(d) for d in dist.tolist()], dtype=object)
    dt = np.where(mlp, text(cols, "quant_type", idx, "bfloat16"), text(cols, "moe_dtype", idx, "bfloat16"))
    src = text(cols, "kernel_source", idx, "")
    routed, active, heavy = _moe_loads(t, slots, k, ep, dist)
    gated = np.where(np.array(["nongated" in s for s in src.tolist()], dtype=bool), 2.0, 3.0)
    width = inter / tp
    wbytes = np.empty(len(idx))
    peak = np.empty(len(idx))
    for label in set(dt.tolist()):
        if label not in MOE_DTYPES:
            raise ValueError(f"moe_dtype={label!r}: must be one of {', '.join(sorted(MOE_DTYPES))}")
        b, d = MOE_DTYPES[label]
        sel = dt == label
        wbytes[sel] = b
        peak[sel] = hw.peak_flops_for(d)
    flops = 2.0 * gated * routed * h * width
    nbytes = active * gated * h * width * wbytes + 4.0 * t * h + routed * (2.0 * h + gated * width) * 2.0
    tc, tm = flops / peak, nbytes / hw.hbm_bandwidth_bytes_per_s
    local = np.maximum(np.ceil(slots / ep), 1.0)  # EP rank 0's experts (every measured row divides)
    per_expert = routed / np.maximum(active, 1.0)
    prims = {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "tokens": t, "per_expert": per_expert,
             "skew": np.maximum(heavy / np.maximum(per_expert, 1e-9), 1.0), "active": np.maximum(active, 1.0),
             "local": local, "hidden": h, "width": width, "topk": k, "gated": gated}
    cats = {"dtype": dt, "backend": text(cols, "backend", idx, ""), "variant": moe_class(kernel, src)}
    return TableBatch("moe", np.maximum(tc, tm), prims, cats, flops, nbytes)


# -- MLA ---------------------------------------------------------------------------------------
def _projection_elems(heads: np.ndarray) -> np.ndarray:
    """Weights of one MLA module's projections per GPU (q_a, kv_a replicated; q_b, kv_b, o sharded)."""
    out: np.ndarray = (MLA_HIDDEN * (MLA_Q_LORA + MLA_LORA + MLA_ROPE) + MLA_Q_LORA * heads * (MLA_NOPE + MLA_ROPE)
                       + MLA_LORA * heads * (MLA_NOPE + MLA_V) + heads * MLA_V * MLA_HIDDEN)
    return out


def trtllm_serial_mla(backend: np.ndarray, sm_version: int) -> np.ndarray:
    """1.0 where the MLA decode kernel walks the KV cache serially: TensorRT-LLM outside Hopper and
    datacenter Blackwell. On SM90 it runs FlashMLA-style split-KV kernels and on SM100/103 its
    trtllm-gen kernels; elsewhere (SM80, SM86, SM89, SM120) its generation kernel gives one CTA per
    sequence and 64 heads that steps through the cache token by token. The measured tables show it:
    on a100, l40s and rtx_pro_6000 (TensorRT-LLM 1.0.0 and 1.3.0rc20) a sequence costs ~160-210
    cycles per cached token at the boost clock, flat in batch until the CTAs fill the SMs and flat
    in heads up to 64, 100-200x the memory roofline; vLLM's and SGLang's Triton MLA kernels split
    the KV cache over CTAs like the Hopper kernels."""
    split_kv_arch = 90 <= sm_version < 120
    out: np.ndarray = ((backend == "trtllm") & (not split_kv_arch)).astype(float)
    return out


def mla_batch(cols: Mapping[str, np.ndarray], idx: np.ndarray, hw: HardwareSpec) -> TableBatch:
    kernel = text(cols, "kernel", idx, "mla_context")
    module = np.array([str(x).startswith("mla_module") for x in kernel.tolist()], dtype=bool)
    prefill = np.array([str(x).endswith("context") for x in kernel.tolist()], dtype=bool)
    family = "mla_prefill" if prefill.all() else "mla_decode"
    if prefill.any() and not prefill.all():
        raise ValueError("mla_batch: one phase per batch")
    b = num(cols, "batch_size", idx, 1.0)
    heads = num(cols, "num_heads", idx, 128.0)
    kvd = text(cols, "kv_cache_dtype", idx, "bfloat16")
    kvb = np.where(kvd == "fp8", 1.0, 2.0)
    gt = text(cols, "gemm_type", idx, "bfloat16")
    gbytes = np.array([_GEMM_BYTES.get(g, 2.0) for g in gt.tolist()])
    gpeak = np.array([hw.peak_flops_for(_GEMM_PEAK.get(g, DType.BFLOAT16)) for g in gt.tolist()])
    bf16 = hw.peak_flops_for(DType.BFLOAT16)
    qk = MLA_NOPE + MLA_ROPE
    if family == "mla_prefill":
        s = np.maximum(num(cols, "seq_len", idx, 1.0), 1.0)
        prefix = num(cols, "prefix_len", idx, 0.0)
        keys = s * (s + 1.0) / 2.0 + s * prefix
        flops = 2.0 * b * heads * keys * (qk + MLA_V)
        nbytes = b * s * heads * (2.0 * qk + 2.0 * MLA_V) * 2.0 + b * prefix * heads * (qk + MLA_V) * kvb
        tokens, length = b * s, s + prefix
    else:
        kv = np.maximum(num(cols, "kv_len", idx, 1.0), 1.0)
        flops = 2.0 * b * heads * kv * (MLA_LORA + MLA_ROPE + MLA_LORA)
        nbytes = b * kv * (MLA_LORA + MLA_ROPE) * kvb + b * heads * (2 * MLA_LORA + MLA_ROPE) * 2.0
        tokens, length = b, kv
    tc = flops / bf16
    proj = _projection_elems(heads) * module
    pflops = 2.0 * tokens * proj
    pbytes = proj * gbytes + module * tokens * (MLA_HIDDEN * 4.0)
    tc = tc + pflops / gpeak
    flops = flops + pflops
    nbytes = nbytes + pbytes
    tm = nbytes / hw.hbm_bandwidth_bytes_per_s
    dtype = np.where(module, kvd + "/" + gt, kvd)
    backend = text(cols, "backend", idx, "")
    prims = {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "batch": b, "heads": heads, "length": length,
             "module": module.astype(float)}
    if family == "mla_decode":
        prims["serial"] = trtllm_serial_mla(backend, hw.sm_version or 0)
        prims["cycle_s"] = np.full(len(idx), 1.0 / hw.boost_clock_hz)
    cats = {"dtype": dtype.astype(object), "backend": backend}
    return TableBatch(family, np.maximum(tc, tm), prims, cats, flops, nbytes)


def mla_bmm_batch(cols: Mapping[str, np.ndarray], idx: np.ndarray, hw: HardwareSpec) -> TableBatch:
    t = np.maximum(num(cols, "num_tokens", idx, 1.0), 1.0)
    heads = num(cols, "num_heads", idx, 128.0)
    dt = text(cols, "bmm_dtype", idx, "bfloat16")
    fp8 = dt == "fp8"
    flops = 2.0 * t * heads * MLA_NOPE * MLA_LORA
    nbytes = heads * MLA_NOPE * MLA_LORA * np.where(fp8, 1.0, 2.0) + t * heads * (MLA_NOPE + MLA_LORA) * 2.0
    peak = np.where(fp8, hw.peak_flops_for(DType.FP8) if hw.supports(DType.FP8) else hw.peak_flops_for(DType.BFLOAT16),
                    hw.peak_flops_for(DType.BFLOAT16))
    tc, tm = flops / peak, nbytes / hw.hbm_bandwidth_bytes_per_s
    prims = {"compute_s": tc, "memory_s": tm, "bytes": nbytes, "tokens": t, "heads": heads}
    cats = {"dtype": dt, "backend": text(cols, "backend", idx, ""), "op": text(cols, "op_name", idx, "mla_gen_pre")}
    return TableBatch("mla_bmm", np.maximum(tc, tm), prims, cats, flops, nbytes)


# -- expert all-to-all -------------------------------------------------------------------------
def ep_batch(cols: Mapping[str, np.ndarray], idx: np.ndarray, hw: HardwareSpec) -> TableBatch:
    """DeepEP dispatch + combine per call. Bytes each rank sends: low-latency dispatch FP8 (hidden +
    hidden/128 x 4 scale + 16 B) per token-expert selection and BF16 combine (2 x hidden); normal
    mode sends a token once per destination rank (expected distinct ranks n (1 - (1 - 1/n)^topk)),
    BF16 both ways (the FP8 build is not recorded per row). Wire share (n - 1)/n; the link is NVLink
    inside a node and the inter-node link beyond (`HardwareSpec.link_for_group`); alpha = the
    link's per-message latency, twice (dispatch and combine)."""
    kernel = text(cols, "kernel", idx, "deepep_ll")
    ll = kernel == "deepep_ll"
    g = np.maximum(num(cols, "num_gpus", idx, 8.0), 1.0)
    nodes = np.maximum(num(cols, "node_num", idx, 1.0), 1.0)
    h = num(cols, "hidden_size", idx, 7168.0)
    t = np.maximum(num(cols, "num_tokens_per_rank", idx, 1.0), 1.0)
    k = num(cols, "topk", idx, 8.0)
    ranks = g * (1.0 - (1.0 - 1.0 / g) ** k)
    sent = np.where(ll, t * k * (h + h / 128.0 * 4.0 + 16.0) + t * k * 2.0 * h, t * ranks * h * 4.0)
    intra = (nodes <= 1) & (g <= hw.nvlink_domain())
    bw = np.where(intra, hw.intra_node_link.bandwidth_bytes_per_s, hw.inter_node_link.bandwidth_bytes_per_s)
    lat = np.where(intra, hw.intra_node_link.latency_s, hw.inter_node_link.latency_s)
    nvl = np.where(intra, float(hw.intra_node_link.kind == "nvlink"), float(hw.inter_node_link.kind == "nvlink"))
    wire = sent * np.where(g > 1, (g - 1.0) / g, 0.0)
    tn = 2.0 * lat + wire / bw
    sms = np.where(ll, float(hw.num_sms), num(cols, "dispatch_sms", idx, DEEPEP_DEFAULT_SMS))
    prims = {"network_s": tn, "msg": np.maximum(sent, 1.0), "group": np.maximum(g, 2.0), "nvlink": nvl,
             "link_bw": bw, "sms_frac": np.maximum(sms, 1.0) / hw.num_sms}
    cats = {"op": np.where(ll, "low_latency", "normal").astype(object)}
    return TableBatch("ep_a2a", tn, prims, cats, np.zeros(len(idx)), sent)


def table_batch(name: str, cols: Mapping[str, np.ndarray], idx: np.ndarray, hw: HardwareSpec) -> TableBatch:
    """The batch of rows `idx` (all of table-family `TABLE_FAMILY[name]`)."""
    family = TABLE_FAMILY[name]
    if family == "moe":
        return moe_batch(cols, idx, hw)
    if family in ("mla_prefill", "mla_decode"):
        return mla_batch(cols, idx, hw)
    if family == "mla_bmm":
        return mla_bmm_batch(cols, idx, hw)
    return ep_batch(cols, idx, hw)


# -- the simulator's KernelWork ----------------------------------------------------------------
KIND_TABLE: Final[dict[KernelKind, str]] = {
    KernelKind.MOE: "moe", KernelKind.MLA_PREFILL: "mla_context", KernelKind.MLA_DECODE: "mla_generation",
    KernelKind.MLA_BMM: "mla_bmm",
}
"""Table whose rows a kernel kind is (EP_ALL_TO_ALL picks deepep_normal / deepep_ll by variant)."""


def table_of(work_kind: KernelKind, variant: str) -> str:
    if work_kind is KernelKind.EP_ALL_TO_ALL:
        return "deepep_ll" if variant == "low_latency" else "deepep_normal"
    return KIND_TABLE[work_kind]


def work_columns(works: list[KernelWork]) -> dict[str, np.ndarray]:
    """Rows (table columns) of kernels of one table-keyed kind, per the shape contract of
    `sim.graph.kernels`."""
    kind = works[0].kind
    rows: list[dict[str, object]] = []
    for w in works:
        s = w.shape
        table = table_of(kind, w.variant)
        if kind is KernelKind.MOE:
            row: dict[str, object] = dict(zip(("num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
                                               "moe_tp_size", "moe_ep_size"), s, strict=True))
            row.update(distribution=served(w.variant or "balanced"), moe_dtype=SIM_MOE_DTYPE.get(w.dtype, "bfloat16"))
        elif kind is KernelKind.MLA_PREFILL:
            row = {"batch_size": s[0], "seq_len": s[1], "prefix_len": s[2], "num_heads": s[3]}
        elif kind is KernelKind.MLA_DECODE:
            row = {"batch_size": s[0], "kv_len": s[1], "num_heads": s[3]}
        elif kind is KernelKind.MLA_BMM:
            row = {"num_tokens": s[0], "num_heads": s[1], "op_name": w.variant or "mla_gen_pre",
                   "bmm_dtype": "fp8" if w.dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16"}
        else:
            row = dict(zip(("num_tokens_per_rank", "hidden_size", "topk", "num_experts", "num_gpus", "node_num"),
                           s, strict=True))
        if kind in (KernelKind.MLA_PREFILL, KernelKind.MLA_DECODE):
            row["kv_cache_dtype"] = "fp8" if w.dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16"
        row["kernel"] = table
        rows.append(row)
    names = sorted({c for r in rows for c in r})
    return {c: np.array([r.get(c, "") for r in rows], dtype=object) for c in names}


_SHAPE_COLUMNS: Final[dict[KernelKind, tuple[str, ...]]] = {
    KernelKind.MOE: ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size"),
    KernelKind.MLA_PREFILL: ("batch_size", "seq_len", "prefix_len", "num_heads"),
    KernelKind.MLA_DECODE: ("batch_size", "kv_len", "", "num_heads"),
    KernelKind.MLA_BMM: ("num_tokens", "num_heads"),
    KernelKind.EP_ALL_TO_ALL: ("num_tokens_per_rank", "hidden_size", "topk", "num_experts", "num_gpus", "node_num"),
}
"""Table column of each shape entry of a table-keyed kind (`work_columns`; blank: not a column)."""


def kernel_columns(kind: KernelKind, dtype: DType, shape: Sequence[np.ndarray], variants: np.ndarray,
                   table: str) -> dict[str, np.ndarray]:
    """`work_columns` of kernels of one table-keyed kind and dtype, all rows of `table`, from columns
    of their shapes (int arrays) and variants (an object array of str, blank for none): the same
    columns and values without a Python object per row (the simulator's block pricing)."""
    n = len(variants)
    cols: dict[str, np.ndarray] = {name: shape[i] for i, name in enumerate(_SHAPE_COLUMNS[kind]) if name}
    if kind is KernelKind.MOE:
        names = {v: served(v or "balanced") for v in set(variants.tolist())}
        cols["distribution"] = np.array([names[v] for v in variants.tolist()], dtype=object)
        cols["moe_dtype"] = np.full(n, SIM_MOE_DTYPE.get(dtype, "bfloat16"), dtype=object)
    elif kind is KernelKind.MLA_BMM:
        cols["op_name"] = np.where(variants == "", "mla_gen_pre", variants).astype(object)
        cols["bmm_dtype"] = np.full(n, "fp8" if dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16", dtype=object)
    if kind in (KernelKind.MLA_PREFILL, KernelKind.MLA_DECODE):
        cols["kv_cache_dtype"] = np.full(n, "fp8" if dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16",
                                         dtype=object)
    cols["kernel"] = np.full(n, table, dtype=object)
    return cols
