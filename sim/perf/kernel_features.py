"""Device-normalised kernel features for the learned efficiency model.

Each kernel family maps its work (roofline compute/memory/network times, shape) and the device's
datasheet (SM count, L2 size, link) to a fixed list of continuous features that transfer across
GPU generations: log roofline time, log arithmetic intensity relative to the ridge point, a
launch-floor hinge, wave quantisation (tiles per wave for a typical tile, tail-wave fill), L2
footprint, and log shape terms. The target is log(measured / roofline) = -log(efficiency).

One implementation serves scalars (one `KernelWork` per call, math module) and numpy arrays
(vectorised `predict-kernels`) through the `Ops` namespace, so both paths compute the same
numbers. Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import math
from typing import Any, Final, Literal

import numpy as np

Family = Literal["gemm", "attn_prefill", "attn_decode", "pointwise", "nccl", "custom_allreduce", "moe",
                 "mla_prefill", "mla_decode", "mla_bmm", "ep_a2a"]
FAMILIES: Final[tuple[Family, ...]] = (
    "gemm", "attn_prefill", "attn_decode", "pointwise", "nccl", "custom_allreduce", "moe", "mla_prefill",
    "mla_decode", "mla_bmm", "ep_a2a")
COLLECTIVE_FAMILIES: Final[frozenset[str]] = frozenset({"nccl", "custom_allreduce", "ep_a2a"})
PHYSICS_FAMILIES: Final[frozenset[str]] = frozenset({"nccl", "custom_allreduce"})
"""Families whose learner predicts the residual over the alpha-beta physics baseline
(`sim.perf.collective_model`) instead of the whole log slowdown over the link roofline."""

LIBRARY_WAVES: Final[frozenset[str]] = frozenset()
"""Families whose second wave-quantisation pair (occ_b, tail_b) counts the CTAs of the kernel the
library picks on the GPU's SM generation (`library_units`) instead of a fixed second tile."""
WAVE_PRIOR: Final[frozenset[str]] = frozenset()
"""Families whose learner fits the residual over a wave-quantised roofline (`physics_offset`)."""
_TIME_SCALE_S: Final = 1e-5
_LAUNCH_FLOOR_S: Final = 5e-6
_TINY: Final = 1e-30
_MSG_KNEES_BYTES: Final = (16e3, 256e3, 4e6, 64e6)
"""Message sizes where NCCL's protocol/algorithm regime typically changes (LL, LL128, Simple)."""


class Ops:
    """Elementwise functions for one numeric backend (python floats or numpy arrays)."""

    def __init__(self, vectorised: bool) -> None:
        self.vectorised = vectorised

    def log(self, x: Any) -> Any:
        return np.log(np.maximum(x, _TINY)) if self.vectorised else math.log(max(x, _TINY))

    def ceil(self, x: Any) -> Any:
        return np.ceil(x) if self.vectorised else float(math.ceil(x))

    def maximum(self, a: Any, b: Any) -> Any:
        return np.maximum(a, b) if self.vectorised else max(a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        return np.minimum(a, b) if self.vectorised else min(a, b)

    def clip(self, x: Any, lo: float, hi: float) -> Any:
        return np.clip(x, lo, hi) if self.vectorised else min(max(x, lo), hi)

    def clip_array(self, x: Any, lo: Any, hi: Any) -> Any:
        """clip with array bounds (hi wins over lo where they cross)."""
        return np.minimum(np.maximum(x, lo), hi) if self.vectorised else min(max(x, lo), hi)

    def floor(self, x: Any) -> Any:
        return np.floor(x) if self.vectorised else float(math.floor(x))

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        if self.vectorised:
            return np.where(cond, a, b)
        return a if cond else b


SCALAR: Final = Ops(False)
VECTOR: Final = Ops(True)


def _waves(xp: Ops, tiles: Any, num_sms: float) -> tuple[Any, Any]:
    """(log occupancy of the first wave, log fill of all waves beyond it)."""
    waves = tiles / num_sms
    occ = xp.log(xp.minimum(waves, 1.0))
    fill = tiles / (xp.ceil(xp.maximum(waves, 1e-9)) * num_sms)
    return occ, xp.log(fill) - occ


COMPUTE_BASE: Final[tuple[str, ...]] = (
    "log_time", "log_intensity_vs_ridge", "launch_floor", "log_l2_footprint",
    "occ_a", "tail_a", "occ_b", "tail_b",
    "log_time_sq", "intensity_sq", "time_x_intensity", "floor_sq", "time_x_occ", "intensity_x_occ",
    "time_x_l2",
)
SHAPE_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("log_m", "log_n", "log_k", "log_m_small"),
    "attn_prefill": ("log_seq", "log_batch", "log_head_dim", "log_gqa", "windowed"),
    "attn_decode": ("log_kv", "log_batch", "log_head_dim", "log_gqa", "windowed"),
    "pointwise": ("log_tokens", "log_width"),
    "moe": ("log_tokens", "log_per_expert", "log_skew", "log_active", "log_local", "log_hidden", "log_width",
            "log_topk", "gated"),
    "mla_prefill": ("log_batch", "log_heads", "log_length", "module"),
    "mla_decode": ("log_batch", "log_heads", "log_length", "module", "serial_kv", "log_serial_vs_roofline"),
    "mla_bmm": ("log_tokens", "log_heads"),
}
COLLECTIVE_NAMES: Final[tuple[str, ...]] = (
    "log_time", "log_msg", "knee_16k", "knee_256k", "knee_4m", "knee_64m", "log_group",
    "nvlink", "log_link_bw", "group_x_msg", "nvlink_x_msg", "log_time_sq", "launch_floor",
)


PHYSICS_NAMES: Final[tuple[str, ...]] = (
    "log_phys_time", "latency_share", "log_msg", "knee_16k", "knee_256k", "knee_4m", "knee_64m", "log_group",
    "nvlink", "group_x_msg", "nvlink_x_msg", "nvlink_x_group", "nvls", "proto_ll", "proto_ll128",
)
"""Residual features of the physics families: quantities of the algorithm and the message. NCCL's
residual also takes log link bandwidth (`log_link_bw`, last): it separates Ampere's NVLink 3 (lower
achieved share of the link, higher LL latency) from Hopper's NVLink 4 by leave-one-GPU-out (mean
median APE 25.5% without, 20.8% with); a faster link than any measured is held at the range edge,
i.e. gets the newest measured generation's residual. The custom all-reduce residual is better
without it (29.7% vs 34.2%)."""


def feature_names(family: str) -> tuple[str, ...]:
    if family == "nccl":
        return (*PHYSICS_NAMES, "log_link_bw")
    if family in PHYSICS_FAMILIES:
        return PHYSICS_NAMES
    if family == "ep_a2a":
        return (*COLLECTIVE_NAMES, "log_sms_frac")
    if family in COLLECTIVE_FAMILIES:
        return COLLECTIVE_NAMES
    return (*COMPUTE_BASE, *SHAPE_NAMES[family])


def gemm_work_units(xp: Ops, m: Any, n: Any, k: Any, num_sms: float, sm_version: int) -> Any:
    """CTAs (output tiles x K splits) of the GEMM kernel the libraries pick on an SM generation.

    Output tile: 64 rows at m <= 64 (the smallest WGMMA/UMMA M, and what cuBLAS/CUTLASS pick for
    small m on Ampere/Ada too), else 128; 256 columns on Hopper/datacenter Blackwell at m > 128
    (CUTLASS 3 / cuBLAS 128x256 warp-specialised tiles; Blackwell's 2-SM 256x256 UMMA is 128x256
    per SM), else 128 (Ampere/Ada mma.sync 128x128; sm120 has no 2-SM MMA or clusters). When the
    tiles fill less than one wave, split-K / stream-K spreads K over the idle SMs (at least 256 of K
    per split)."""
    wide = 90 <= sm_version < 120
    tile_m = xp.where(m <= 64.0, 64.0, 128.0)
    tile_n = xp.where(m > 128.0, 256.0, 128.0) if wide else 128.0
    tiles = xp.ceil(m / tile_m) * xp.ceil(n / tile_n)
    splits = xp.clip_array(xp.floor(num_sms / tiles), 1.0, xp.maximum(xp.floor(k / 256.0), 1.0))
    return tiles * splits


def prefill_ctas(xp: Ops, p: dict[str, Any], sm_version: int) -> Any:
    """CTAs of the prefill attention kernel: batch x heads x query blocks (FlashAttention 2/3,
    TRT-LLM FMHA, FlashInfer and Triton all tile queries per (sequence, head)). Query block 128,
    except FA3 on Hopper at head_dim <= 64 (192) and Ada's FA2 at head_dim >= 256 (64: 100 KB of
    shared memory per SM)."""
    d = p["head_dim"]
    block = xp.where((d <= 64.0) & (90 <= sm_version < 100), 192.0,
                     xp.where((d >= 256.0) & (sm_version in (86, 89)), 64.0, 128.0))
    return p["batch"] * p["heads"] * xp.ceil(p["seq"] / block)


def decode_ctas(xp: Ops, p: dict[str, Any], num_sms: float) -> Any:
    """CTAs of the split-KV decode kernel: batch x KV heads (query heads of a group share a CTA),
    times the KV splits FlashAttention's `num_splits_heuristic` (FlashInfer's and TRT-LLM XQA's
    multi-block mode follow the same rule) picks: none when batch x KV heads reach 0.8 of the SMs,
    else about enough to fill one wave, at most 128 and at most one per KV block (128 tokens at
    head_dim <= 128, else 64)."""
    units = p["batch"] * p["kv_heads"]
    blocks = xp.ceil(p["kv"] / xp.where(p["head_dim"] <= 128.0, 128.0, 64.0))
    splits = xp.clip_array(xp.floor(num_sms / units), 1.0, xp.minimum(blocks, 128.0))
    splits = xp.where(units >= 0.8 * num_sms, 1.0, splits)
    return units * splits


def wave_efficiency(xp: Ops, units: Any, num_sms: float) -> Any:
    """units / (waves x SMs): the share of SM-time of the kernel's waves that does work."""
    return units / (xp.ceil(xp.maximum(units / num_sms, 1e-9)) * num_sms)


def _tiles(xp: Ops, family: str, p: dict[str, Any]) -> tuple[Any, Any]:
    if family == "gemm":
        m, n = p["m"], p["n"]
        return (xp.ceil(m / 128.0) * xp.ceil(n / 128.0), xp.ceil(m / 256.0) * xp.ceil(n / 128.0))
    if family == "attn_prefill":
        return (p["batch"] * p["heads"] * xp.ceil(p["seq"] / 128.0),
                p["batch"] * p["kv_heads"] * xp.ceil(p["seq"] / 64.0))
    if family == "attn_decode":
        return (p["batch"] * p["kv_heads"], p["batch"] * p["heads"] * xp.ceil(p["kv"] / 1024.0))
    if family == "moe":
        return (p["active"] * xp.ceil(p["per_expert"] / 128.0) * xp.ceil(2.0 * p["width"] / 128.0),
                p["active"] * xp.ceil(p["per_expert"] * p["skew"] / 64.0) * xp.ceil(p["hidden"] / 128.0))
    if family == "mla_prefill":
        return (p["batch"] * p["heads"] * xp.ceil(p["length"] / 128.0),
                p["batch"] * p["heads"] * xp.ceil(p["length"] / 64.0))
    if family == "mla_decode":
        return (p["batch"] * xp.ceil(p["heads"] / 64.0), p["batch"] * p["heads"] * xp.ceil(p["length"] / 1024.0))
    if family == "mla_bmm":
        return (p["heads"] * xp.ceil(p["tokens"] / 128.0) * 4.0, p["heads"] * xp.ceil(p["tokens"] / 64.0))
    return (p["tokens"], xp.ceil(p["tokens"] * p["width"] / 8192.0))


def _shape(xp: Ops, family: str, p: dict[str, Any]) -> list[Any]:
    if family == "gemm":
        lm = xp.log(p["m"])
        return [lm, xp.log(p["n"]), xp.log(p["k"]), xp.minimum(lm, math.log(64.0))]
    if family in ("attn_prefill", "attn_decode"):
        length = p["seq"] if family == "attn_prefill" else p["kv"]
        return [xp.log(length), xp.log(p["batch"]), xp.log(p["head_dim"]),
                xp.log(p["heads"] / p["kv_heads"]), p["windowed"]]
    if family == "moe":
        return [xp.log(p["tokens"]), xp.log(p["per_expert"]), xp.log(p["skew"]), xp.log(p["active"]),
                xp.log(p["local"]), xp.log(p["hidden"]), xp.log(p["width"]), xp.log(p["topk"]), p["gated"]]
    if family == "mla_prefill":
        return [xp.log(p["batch"]), xp.log(p["heads"]), xp.log(p["length"]), p["module"]]
    if family == "mla_decode":
        # The serial KV walk (`table_kernels.trtllm_serial_mla`): its time at one clock cycle per
        # cached token over the roofline. That time scales with the GPU's clock, not its memory
        # bandwidth; the learner scales it (~160-210 cycles a token measured) and its occupancy
        # features (`_tiles`: one CTA per sequence and 64 heads) say when the CTAs stop fitting in
        # one wave.
        serial = p["serial"]
        tr = xp.maximum(xp.maximum(p["compute_s"], p["memory_s"]), _TINY)
        return [xp.log(p["batch"]), xp.log(p["heads"]), xp.log(p["length"]), p["module"], serial,
                serial * xp.log(p["length"] * p["cycle_s"] / tr)]
    if family == "mla_bmm":
        return [xp.log(p["tokens"]), xp.log(p["heads"])]
    return [xp.log(p["tokens"]), xp.log(p["width"])]


def library_units(xp: Ops, family: str, p: dict[str, Any], num_sms: float, sm_version: int) -> Any:
    """CTAs of the kernel the library runs on this SM generation (GEMM, prefill, decode)."""
    if family == "gemm":
        return gemm_work_units(xp, p["m"], p["n"], p["k"], num_sms, sm_version)
    if family == "attn_prefill":
        return prefill_ctas(xp, p, sm_version)
    return decode_ctas(xp, p, num_sms)


def compute_features(xp: Ops, family: str, p: dict[str, Any], num_sms: float,
                     l2_bytes: float, sm_version: int = 0) -> list[Any]:
    """Continuous features of a compute kernel; `p` holds `compute_s`, `memory_s`, `bytes` and shape."""
    tc, tm = p["compute_s"], p["memory_s"]
    tr = xp.maximum(tc, tm)
    a = xp.log(tr / _TIME_SCALE_S)
    r = xp.clip(xp.log(tc / xp.maximum(tm, _TINY)), -10.0, 10.0)
    fl = xp.maximum(xp.log(_LAUNCH_FLOOR_S / xp.maximum(tr, _TINY)), 0.0)
    l2 = xp.clip(xp.log(p["bytes"] / l2_bytes), -8.0, 8.0)
    t_a, t_b = _tiles(xp, family, p)
    if family in LIBRARY_WAVES:
        t_b = library_units(xp, family, p, num_sms, sm_version)
    occ_a, tail_a = _waves(xp, t_a, num_sms)
    occ_b, tail_b = _waves(xp, t_b, num_sms)
    return [a, r, fl, l2, occ_a, tail_a, occ_b, tail_b,
            a * a, r * r, a * r, fl * fl, a * occ_a, r * occ_a, a * l2, *_shape(xp, family, p)]


def collective_features(xp: Ops, p: dict[str, Any]) -> list[Any]:
    """Continuous features of a collective; `p` holds `network_s`, `msg`, `group`, `nvlink`, `link_bw`."""
    a = xp.log(xp.maximum(p["network_s"], 1e-12) / _TIME_SCALE_S)
    lm = xp.log(p["msg"] / 1e6)
    knees = [xp.maximum(lm - math.log(c / 1e6), 0.0) for c in _MSG_KNEES_BYTES]
    lg = xp.log(p["group"])
    nvl = p["nvlink"]
    fl = xp.maximum(xp.log(_LAUNCH_FLOOR_S / xp.maximum(p["network_s"], 1e-12)), 0.0)
    return [a, lm, *knees, lg, nvl, xp.log(p["link_bw"] / 1e11), lg * lm, nvl * lm, a * a, fl]


def physics_features(xp: Ops, family: str, p: dict[str, Any]) -> list[Any]:
    """Residual features of a collective over its physics baseline; `p` holds `phys_s`,
    `phys_lat_s`, `msg`, `group`, `nvlink` and the algorithm/protocol indicators."""
    a = xp.log(xp.maximum(p["phys_s"], 1e-12) / _TIME_SCALE_S)
    share = p["phys_lat_s"] / xp.maximum(p["phys_s"], 1e-12)
    lm = xp.log(p["msg"] / 1e6)
    knees = [xp.maximum(lm - math.log(c / 1e6), 0.0) for c in _MSG_KNEES_BYTES]
    lg = xp.log(p["group"])
    nvl = p["nvlink"]
    out = [a, share, lm, *knees, lg, nvl, lg * lm, nvl * lm, nvl * lg, p["nvls"], p["ll"], p["ll128"]]
    if family == "nccl":
        out.append(xp.log(p["link_bw"] / 1e11))
    return out


def physics_offset(xp: Ops, family: str, p: dict[str, Any], num_sms: float = 1.0, sm_version: int = 0) -> Any:
    """log(physics time / roofline) (>= 0): the collectives' alpha-beta baseline over the link
    roofline; for the wave-prior families, the compute time stretched by the wave quantisation of
    the library's kernel (`library_units`) over the roofline; 0 for other families."""
    if family in WAVE_PRIOR:
        tc, tm = p["compute_s"], p["memory_s"]
        eff = wave_efficiency(xp, library_units(xp, family, p, num_sms, sm_version), num_sms)
        return xp.log(xp.maximum(tc / eff, tm) / xp.maximum(xp.maximum(tc, tm), _TINY))
    if family not in PHYSICS_FAMILIES:
        return 0.0
    return xp.maximum(xp.log(p["phys_s"] / xp.maximum(p["network_s"], 1e-15)), 0.0)


CORRECTION_COORDINATES: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("log_m", "log_n", "log_k"),
    "attn_prefill": ("log_batch", "log_seq", "log_heads", "log_kv_heads", "log_head_dim", "windowed"),
    "attn_decode": ("log_batch", "log_kv", "log_kv_width", "log_gqa", "windowed"),
    "pointwise": ("log_tokens", "log_width"),
    "nccl": ("log_msg", "log_group"),
    "custom_allreduce": ("log_msg", "log_group"),
    "moe": ("log_tokens", "log_expert_size", "log_local", "log_topk", "log_skew"),
    "mla_prefill": ("log_batch", "log_length", "log_heads", "module"),
    "mla_decode": ("log_batch", "log_length", "log_heads", "module"),
    "mla_bmm": ("log_tokens", "log_heads"),
    "ep_a2a": ("log_msg", "log_group", "log_sms_frac"),
}
"""Shape coordinates over which the target-measured correction interpolates, per family."""


def correction_coordinates(family: str, p: dict[str, Any], xp: Ops = VECTOR) -> Any:
    """The family's correction coordinates: (n x d) from array primitives, or a list of d floats
    from scalar ones (`xp=SCALAR`)."""
    lg = xp.log
    if family == "gemm":
        cols = [lg(p["m"]), lg(p["n"]), lg(p["k"])]
    elif family == "attn_prefill":
        cols = [lg(p["batch"]), lg(p["seq"]), lg(p["heads"]), lg(p["kv_heads"]), lg(p["head_dim"]), p["windowed"]]
    elif family == "attn_decode":
        cols = [lg(p["batch"]), lg(p["kv"]), lg(p["kv_heads"] * p["head_dim"]), lg(p["heads"] / p["kv_heads"]),
                p["windowed"]]
    elif family == "pointwise":
        cols = [lg(p["tokens"]), lg(p["width"])]
    elif family == "moe":
        cols = [lg(p["tokens"]), lg(p["hidden"] * p["width"]), lg(p["local"]), lg(p["topk"]), lg(p["skew"])]
    elif family in ("mla_prefill", "mla_decode"):
        cols = [lg(p["batch"]), lg(p["length"]), lg(p["heads"]), p["module"]]
    elif family == "mla_bmm":
        cols = [lg(p["tokens"]), lg(p["heads"])]
    elif family == "ep_a2a":
        cols = [lg(p["msg"]), lg(p["group"]), lg(p["sms_frac"])]
    else:
        cols = [lg(p["msg"]), lg(p["group"])]
    if not xp.vectorised:
        return [float(c) for c in cols]
    n = len(next(iter(p.values())))
    return np.column_stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in cols])


def features(xp: Ops, family: str, p: dict[str, Any], num_sms: float, l2_bytes: float,
             sm_version: int = 0) -> list[Any]:
    if family in PHYSICS_FAMILIES:
        return physics_features(xp, family, p)
    if family == "ep_a2a":
        return [*collective_features(xp, p), xp.log(p["sms_frac"])]
    if family in COLLECTIVE_FAMILIES:
        return collective_features(xp, p)
    return compute_features(xp, family, p, num_sms, l2_bytes, sm_version)
