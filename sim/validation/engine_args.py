"""Engine sections for measured rows: the backend profile's defaults plus what the row records.

The KV-cache memory fraction is counted the way each engine counts it: vLLM's
`gpu_memory_utilization` and SGLang's `mem_fraction_static` are fractions of the whole GPU
(weights included); TensorRT-LLM's `free_gpu_memory_fraction` is a fraction of what is left
after weights and activations. `memory_utilization_for` converts the latter to the former with
the simulator's own memory model, so every backend is simulated with the KV capacity it had.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sim.perf.profile import EngineProfile
from sim.validation.specs_cache import SpecCache

_QUANTIZED = ("fp8", "fp8_block", "nvfp4", "mxfp4")

OFFLINE: Mapping[str, Any] = {"api_server_latency_s": 0.0}
"""Engine keys of rows measured without an API server in the path (trtllm-bench, gptSessionBenchmark,
engine-side trace timestamps): their latencies have no request or response path outside the engine.
Rows measured by a benchmark client against the OpenAI-compatible server keep the profile's value."""


def profile_engine(profile: EngineProfile, *, quantization: str | None, max_num_seqs: int,
                   version: str = "", weight_format: str | None = None) -> dict[str, Any]:
    """Engine keys a benchmark leaves at the defaults of the engine release `version`.

    `weight_format` is the format the weights are served in when the checkpoint fixes it
    (`quantization` None); the profile's FP8-KV rule looks at it as at `quantization`.
    """
    d = profile.defaults
    engine: dict[str, Any] = {
        "backend": profile.backend,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max(d.max_num_batched_tokens, max_num_seqs),
        "enable_chunked_prefill": d.enable_chunked_prefill,
        "enable_prefix_caching": False,
        "async_scheduling": d.async_for(version),
    }
    if d.max_cudagraph_capture_size is not None:
        engine["max_cudagraph_capture_size"] = d.max_cudagraph_capture_size
    if d.block_size is not None:
        engine["block_size"] = d.block_size
    if quantization is not None:
        engine["quantization"] = quantization
    if d.kv_cache_fp8_with_quantized_weights and (quantization or weight_format) in _QUANTIZED:
        engine["kv_cache_dtype"] = "fp8"
    if d.kv_memory_basis == "total":
        engine["gpu_memory_utilization"] = d.kv_memory_fraction
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
