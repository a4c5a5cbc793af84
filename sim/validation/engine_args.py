"""Engine sections for measured rows: the backend profile's defaults plus what the row records.

The KV-cache memory fraction is counted the way each engine counts it: vLLM's
`gpu_memory_utilization` and SGLang's `mem_fraction_static` are fractions of the whole GPU
(weights included); TensorRT-LLM's `free_gpu_memory_fraction` is a fraction of what is left
after weights and activations. `memory_utilization_for` converts the latter to the former with
the simulator's own memory model, so every backend is simulated with the KV capacity it had.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from sim.perf.profile import EngineProfile
from sim.validation.specs_cache import SpecCache

_QUANTIZED = ("fp8", "fp8_block", "nvfp4", "mxfp4")

OFFLINE: Mapping[str, Any] = {"api_server_latency_s": 0.0}
"""Engine keys of rows measured without an API server in the path (trtllm-bench, gptSessionBenchmark,
engine-side trace timestamps): their latencies have no request or response path outside the engine.
Rows measured by a benchmark client against the OpenAI-compatible server keep the profile's value."""


SGLANG_MEMORY_TIERS_SINCE: Final = (0, 5, 3)
"""SGLang release whose `ServerArgs._handle_gpu_memory_settings` (sgl-project/sglang#10372) sets
`cuda_graph_max_bs` and `chunked_prefill_size` by GPU memory tier and TP size; before it they were
160 and 8,192 on every GPU of 25 GB or more."""
_MIB = 1 << 20


def _release3(version: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of '0.5.6.post2'; None when the string names no release."""
    parts = re.findall(r"\d+", version.split("-")[0])
    return tuple(int(p) for p in parts[:3]) if len(parts) >= 2 else None


def sglang_memory_defaults(version: str, *, tp_size: int, hbm_capacity_bytes: int) -> tuple[int, int | None]:
    """(`cuda_graph_max_bs`, `chunked_prefill_size` or None for the profile's) that SGLang release
    `version` picks when the launch sets neither, on a GPU of `hbm_capacity_bytes` with `--tp
    tp_size` (with attention DP: all the ranks). From 0.5.3 (`_handle_gpu_memory_settings`; tiers in
    MiB as SGLang reads the device): < 20 GB 8 / 2,048; < 35 GB 24 (80 from TP 4) / 2,048; < 60 GB 32
    (160) / 4,096; < 160 GB (H100, H200, A100-80GB) 256 (512 from TP 4) / 8,192; else (B200) 512 /
    16,384. Earlier releases: 160 graphs from 25 GB (8, or 80 from TP 4, below), the profile's chunk.
    An unknown version takes the newest rule, as `async_for` does."""
    mib = hbm_capacity_bytes / _MIB
    release = _release3(version)
    if release is not None and release < SGLANG_MEMORY_TIERS_SINCE:
        if mib < 25_000:
            return (8 if tp_size < 4 else 80), 2048
        return 160, None
    small = tp_size < 4
    if mib < 20 * 1024:
        return 8, 2048
    if mib < 35 * 1024:
        return (24 if small else 80), 2048
    if mib < 60 * 1024:
        return (32 if small else 160), 4096
    if mib < 160 * 1024:
        return (256 if small else 512), 8192
    return 512, 16384


def sglang_mem_fraction_static(version: str, *, tp_size: int, dp_size: int = 1, pp_size: int = 1,
                               hbm_capacity_bytes: int, chunked_prefill_size: int,
                               cuda_graph_max_bs: int) -> float | None:
    """`mem_fraction_static` SGLang release `version` picks when the launch leaves it unset; None before
    0.5.3 (the profile's fraction). From 0.5.3 (`_handle_gpu_memory_settings`) it reserves, in MiB,
    512 + 1.5 x max(chunk, 2,048) + 2 x `cuda_graph_max_bs` + TP x PP / 8 x 1,024 (with attention DP
    also 3, and above 300 graphs 4.5, x `cuda_graph_max_bs` x DP), at least 10 GiB on GPUs over 60 GB,
    and keeps round((memory - reserved) / memory, 3): 0.836 on an 80 GB H100 at TP 1, not 0.88.
    `chunked_prefill_size` is the one before attention DP divides it (`_handle_data_parallelism` runs
    after). Speculative decoding's extra reserve (2 GiB for EAGLE) is not added."""
    release = _release3(version)
    if release is not None and release < SGLANG_MEMORY_TIERS_SINCE:
        return None
    mib = hbm_capacity_bytes / _MIB
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp_size * pp_size / 8 * 1024
    if dp_size > 1:
        reserved += cuda_graph_max_bs * dp_size * 3
        if cuda_graph_max_bs > 300:
            reserved += cuda_graph_max_bs * dp_size * 1.5
    if mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((mib - reserved) / mib, 3)


def profile_engine(profile: EngineProfile, *, quantization: str | None, max_num_seqs: int,
                   version: str = "", weight_format: str | None = None,
                   hbm_capacity_bytes: int | None = None, tp_size: int = 1, dp_size: int = 1,
                   pp_size: int = 1) -> dict[str, Any]:
    """Engine keys a benchmark leaves at the defaults of the engine release `version`.

    `weight_format` is the format the weights are served in when the checkpoint fixes it
    (`quantization` None); the profile's FP8-KV rule looks at it as at `quantization`.
    With `hbm_capacity_bytes` (the GPU's memory) an SGLang engine takes the CUDA-graph batch cap and
    chunk size its release picks for that GPU and `tp_size` (`sglang_memory_defaults`) instead of the
    profile's fixed ones, and from 0.5.3 the `mem_fraction_static` it derives from them, `tp_size`,
    `pp_size` and the attention-DP `dp_size` (`sglang_mem_fraction_static`). An SGLang engine with
    attention DP (`dp_size` > 1) gets each rank's token budget: the chunk size // `dp_size`, as SGLang
    divides it (`ServerArgs._handle_data_parallelism`).
    """
    d = profile.defaults
    batched = d.max_num_batched_tokens
    capture = d.max_cudagraph_capture_size
    fraction = d.kv_memory_fraction if d.kv_memory_basis == "total" else None
    if profile.backend == "sglang" and hbm_capacity_bytes is not None:
        capture, chunk = sglang_memory_defaults(version, tp_size=tp_size, hbm_capacity_bytes=hbm_capacity_bytes)
        batched = chunk or batched
        if fraction is not None:
            fraction = sglang_mem_fraction_static(
                version, tp_size=tp_size, dp_size=dp_size, pp_size=pp_size, hbm_capacity_bytes=hbm_capacity_bytes,
                chunked_prefill_size=batched, cuda_graph_max_bs=capture) or fraction
    if profile.backend == "sglang" and dp_size > 1:
        # SGLang's `chunked_prefill_size` is the engine's: under attention DP `_handle_data_parallelism`
        # gives each DP rank chunked_prefill_size // dp_size (after the memory settings above read it).
        batched = max(batched // dp_size, 1)
    engine: dict[str, Any] = {
        "backend": profile.backend,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max(batched, max_num_seqs),
        "enable_chunked_prefill": d.enable_chunked_prefill,
        "enable_prefix_caching": False,
        "async_scheduling": d.async_for(version),
    }
    if capture is not None:
        engine["max_cudagraph_capture_size"] = capture
    if d.block_size is not None:
        engine["block_size"] = d.block_size
    if quantization is not None:
        engine["quantization"] = quantization
    if d.kv_cache_fp8_with_quantized_weights and (quantization or weight_format) in _QUANTIZED:
        engine["kv_cache_dtype"] = "fp8"
    if fraction is not None:
        engine["gpu_memory_utilization"] = fraction
    return engine


def memory_utilization_for(sections: Mapping[str, Any], profile: EngineProfile, cache: SpecCache) -> float:
    """`gpu_memory_utilization` giving the KV cache the profile's engine would have.

    For a `free_after_weights` profile: weights + activations + runtime + fraction x the rest.
    """
    d = profile.defaults
    if d.kv_memory_basis == "total":
        return d.kv_memory_fraction
    mem = cache.memory(sections["model"]["name"], sections["hardware"]["name"],
                       {**sections["engine"], "gpu_memory_utilization": 1.0})
    fixed = mem.weight_bytes + mem.activation_peak_bytes + mem.runtime_overhead_bytes + mem.cuda_graph_bytes
    free = max(mem.total_bytes - fixed, 0)
    return min(1.0, (fixed + d.kv_memory_fraction * free) / mem.total_bytes)


def trtllm_bench_settings(*, total_memory_bytes_per_gpu: int, weight_bytes_total: int, kv_bytes_per_token_total: int,
                          num_gpus: int, pp: int, isl: int, osl: int) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) as `trtllm-bench` picks them for a dataset.

    Re-derived from TensorRT-LLM's `bench/build/tuning.py` (calc_engine_setting, finetune_setting):
    KV room = 0.95 x (GPU memory - weights); requests = room / ((isl + osl) x KV bytes per token),
    capped at 4096 and divided by PP; the batch is rounded up (to 32 below 256, 128 below 1024,
    else 256, at least 64) and the token budget is batch x (1 + isl / osl), capped at 32768 and
    rounded up (256 below 4096, 512 below 8192, else 1024; at least 2048).
    """
    room = 0.95 * max(total_memory_bytes_per_gpu * num_gpus - weight_bytes_total, 0)
    requests = room / max(kv_bytes_per_token_total * (isl + osl), 1)
    raw_bs = min(requests, 4096.0) / pp
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768.0)
    if raw_bs < 256:
        max_bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        max_bs = 128 * math.ceil(raw_bs / 128)
    else:
        max_bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        max_tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        max_tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        max_tokens = 1024 * math.ceil(raw_tokens / 1024)
    return max_bs, max_tokens
