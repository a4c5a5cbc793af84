"""Engine profiles: how vLLM, SGLang and TensorRT-LLM differ, as data (`sim/data/host/<backend>.toml`).

A profile has three parts:
- host overheads (`HostOverheadParams`, the file's top-level keys and phase tables);
- the scheduling policy (`[policy]`), passed to the replica scheduler:
  `prefill_priority` (SGLang: a step that can admit or continue a prefill runs prefill chunks
  only, decodes wait) and `reserve_full_output` (TensorRT-LLM's GUARANTEED_NO_EVICT capacity
  scheduler: a request is admitted only when KV blocks for its prompt and all its output tokens
  are free, so nothing is ever preempted) and `context_chunks_in_blocks` (TensorRT-LLM: a prompt
  chunk cut by the token budget is cut to whole KV blocks) and `max_num_seqs_per_micro_batch`
  (TensorRT-LLM: with pipeline parallelism `max_batch_size` bounds each micro-batch in flight) and
  `max_num_seqs_split_over_micro_batches` (SGLang: each micro-batch holds max(`max_num_seqs` // p, 1));
- kernel sources (`[kernel_sources]`): which framework's measured kernel series prices this
  engine's kernels where its own microbenchmark series is not what it runs when serving
  (`gemm`: weight format -> backend level of the GEMM model; `mla_prefill`, `mla_decode`: the
  backend whose MLA attention series prices it), passed to the kernel model;
- engine defaults (`[defaults]`): what the engine does where a benchmark does not say (token
  budget, CPU/GPU overlap, KV-cache format, how the KV-cache memory fraction is counted, CUDA-graph
  batch sizes). `sim.validation` uses them to turn measured rows into scenarios; `simulate` does
  not read them (a scenario states its engine settings).

`[fit]` records what the host numbers were fitted on (suite, rows, data hash, method).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal, get_args

from sim.dtypes import DType
from sim.perf.host import HostOverheadParams
from sim.serde import build, require
from sim.specs.catalog import read_toml
from sim.specs.engine import BLOCK_SIZES, EngineParams
from sim.specs.speculative import SpecMethod

KvMemoryBasis = Literal["total", "free_after_weights"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulingPolicy:
    prefill_priority: bool = False
    """SGLang: prefill chunks run in steps of their own and decodes wait (no mixed batches)."""
    reserve_full_output: bool = False
    """TensorRT-LLM GUARANTEED_NO_EVICT: admit only with KV room for prompt + all outputs beside what the
    running requests still need to theirs (blocks shared with them counted once); no preemption."""
    reserve_new_token_ratio: bool = False
    """SGLang: admit a request only with KV room for its prompt and output beside the running requests'
    remaining outputs times the decaying new-token ratio; retract the fewest-output request to the back
    of the queue when the KV runs out (`sim.serving.vllm_v1`, `SGLANG_*`)."""
    max_num_seqs_per_micro_batch: bool = False
    """TensorRT-LLM: with pipeline parallelism `max_num_seqs` (its `max_batch_size`) bounds each of the
    `pipeline_parallel_size` micro-batches in flight, not all of them together (vLLM's bounds the
    scheduler's running requests, which the micro-batches share)."""
    max_num_seqs_split_over_micro_batches: bool = False
    """SGLang: with pipeline parallelism p, each micro-batch holds at most max(`max_num_seqs` // p, 1)
    running requests (`pp_max_micro_batch_size`'s default, from `--max-running-requests`), so
    p x that in all: fewer than `max_num_seqs` when p does not divide it, more when it is below p."""
    context_chunks_in_blocks: bool = False
    """TensorRT-LLM: a context chunk that does not finish its prompt is cut down to whole KV blocks
    (`MicroBatchScheduler::setCtxRequestsChunkSize`, chunk unit = `tokens_per_block`); a chunk that
    would be empty waits for the next step."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineDefaults:
    """Engine settings a benchmark leaves at the engine's default (per backend and release line)."""

    max_num_batched_tokens: int = 8192
    """vLLM max_num_batched_tokens, SGLang chunked_prefill_size, TensorRT-LLM max_num_tokens."""
    enable_chunked_prefill: bool = True
    async_scheduling: bool = False
    """CPU work of step n+1 overlaps GPU work of step n (vLLM --async-scheduling, SGLang and
    TensorRT-LLM overlap schedulers)."""
    async_scheduling_since: str | None = None
    """First engine release with `async_scheduling` on by default; older releases run synchronously."""
    sync_with_speculative: tuple[str, ...] = ()
    """Speculative methods (`speculative_config.method`) under which the engine's default turns the
    overlap off (vLLM: `ngram` and `draft_model`, vllm-project/vllm#31998; SGLang: every method
    unless SpecV2 is switched on by environment)."""
    kv_cache_fp8_with_quantized_weights: bool = False
    """The KV cache is FP8 when the checkpoint's weights are FP8/FP4 (TensorRT-LLM reads the
    checkpoint's kv_cache_quant_algo)."""
    kv_memory_fraction: float = 0.9
    kv_memory_basis: KvMemoryBasis = "total"
    """`total`: fraction of GPU memory for weights + activations + KV (vLLM gpu_memory_utilization,
    SGLang mem_fraction_static); `free_after_weights`: fraction of the memory left after weights
    and activations (TensorRT-LLM free_gpu_memory_fraction)."""
    max_cudagraph_capture_size: int | None = None
    """Largest decode batch replayed from a CUDA graph (in the host's `graph_capture_unit`); None = the
    scenario's default (`sim.specs.engine.default_capture_size`)."""
    block_size: int | None = None
    """Tokens per KV-cache block (TensorRT-LLM `tokens_per_block`, 32); None = the scenario default (16, vLLM's)."""

    def async_for(self, version: str) -> bool:
        """`async_scheduling` of engine release `version` (unknown versions count as recent)."""
        if not self.async_scheduling or self.async_scheduling_since is None:
            return self.async_scheduling
        since, got = release_tuple(self.async_scheduling_since), release_tuple(version)
        return got is None or since is None or got >= since

    def async_default(self, speculative_method: str | None) -> bool:
        """`async_scheduling` an engine of a recent release runs when the scenario leaves it unset
        (`[engine] async_scheduling` absent): its default, off under the speculative methods that
        turn it off."""
        if speculative_method is not None and speculative_method in self.sync_with_speculative:
            return False
        return self.async_for("")

    def __post_init__(self) -> None:
        require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens", self.max_num_batched_tokens, "must be >= 1")
        require(0.0 < self.kv_memory_fraction <= 1.0, "kv_memory_fraction", self.kv_memory_fraction,
                "must be in (0, 1]")
        cap = self.max_cudagraph_capture_size
        require(cap is None or cap >= 1, "max_cudagraph_capture_size", cap, "must be >= 1")
        methods = get_args(SpecMethod)
        for method in self.sync_with_speculative:
            require(method in methods, "sync_with_speculative", method, f"must be one of {', '.join(methods)}")
        require(self.block_size is None or self.block_size in BLOCK_SIZES, "block_size", self.block_size,
                f"must be one of {', '.join(map(str, BLOCK_SIZES))} (as [engine] block_size)")


def release_tuple(version: str) -> tuple[int, ...] | None:
    """(major, minor) of '0.12.0', 'v0.19.0-cu130'; None when the string names no release."""
    parts = re.findall(r"\d+", version.split("-")[0])
    return tuple(int(p) for p in parts[:2]) if len(parts) >= 2 else None


KNOWN_KERNEL_BACKENDS = ("vllm", "sglang", "trtllm")
"""Backend levels the shipped kernel model has measurements for."""
TABLE_SOURCE_KEYS = {"mla_prefill": "mla_context", "mla_decode": "mla_generation"}
"""`[kernel_sources]` key -> the measured table whose backend level it names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelSources:
    """Which measured framework's kernels price an engine's kernels, where it is not the engine's own."""

    gemm: Mapping[str, str] = field(default_factory=dict, hash=False)
    """GEMM weight format (`fp8`, `fp8_block`, `bfloat16`, `nvfp4`) -> backend whose GEMM
    measurements price it; formats not named use the engine's own backend. (Left out of the hash:
    a mapping is not hashable; equality still compares it.)"""
    mla_prefill: str | None = None
    """Backend whose `mla_context` measurements price the engine's MLA prefill attention
    (`mla_prefill` kernels); None: the engine's own series."""
    mla_decode: str | None = None
    """Backend whose `mla_generation` measurements price the engine's absorbed MLA decode
    attention (`mla_decode` kernels); None: the engine's own series."""

    def __post_init__(self) -> None:
        formats = sorted(d.value for d in DType)
        for dtype, backend in self.gemm.items():
            require(dtype in formats, f"gemm.{dtype}", dtype, f"must be a weight format: {', '.join(formats)}")
            require(backend in KNOWN_KERNEL_BACKENDS, f"gemm.{dtype}", backend,
                    f"must be one of {', '.join(KNOWN_KERNEL_BACKENDS)}")
        for key in TABLE_SOURCE_KEYS:
            backend = getattr(self, key)
            if backend is not None:
                require(backend in KNOWN_KERNEL_BACKENDS, key, backend,
                        f"must be one of {', '.join(KNOWN_KERNEL_BACKENDS)}")

    def table_backends(self) -> dict[str, str]:
        """Measured table -> the backend whose rows of it price this engine's kernels (the keys named)."""
        return {table: getattr(self, key) for key, table in TABLE_SOURCE_KEYS.items() if getattr(self, key) is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class FitRecord:
    """Provenance of fitted numbers: never empty for a fitted profile."""

    suite: Literal["dev"]
    """Only the dev suite may be fitted on (sim.validation refuses evaluation rows)."""
    method: str
    data_sha256: str
    """SHA-256 over the measured files the rows came from."""
    num_rows: int
    rows: str
    """Which rows, in words (source, models, GPUs)."""
    metrics: str
    """Fit quality on the rows it was fitted on."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineProfile:
    backend: str
    host: HostOverheadParams
    policy: SchedulingPolicy = field(default_factory=SchedulingPolicy)
    defaults: EngineDefaults = field(default_factory=EngineDefaults)
    kernel_sources: KernelSources = field(default_factory=KernelSources)
    fit: FitRecord | None = None


PROFILE_TABLES = ("policy", "defaults", "kernel_sources", "fit")
"""Tables of a profile TOML that are not host-overhead parameters."""


def load_engine_profile(backend: str, path: str | Path | None = None) -> EngineProfile:
    """An engine profile: `path`, else the shipped `sim/data/host/<backend>.toml` (vllm.toml if none ships)."""
    if path is None:
        path = Path(str(resources.files("sim") / "data" / "host" / f"{backend}.toml"))
        if not path.exists():
            path = Path(str(resources.files("sim") / "data" / "host" / "vllm.toml"))
    path = Path(path)
    data = read_toml(path)
    src = str(path)
    host = build(HostOverheadParams, {k: v for k, v in data.items() if k not in PROFILE_TABLES}, source=src)
    fit = build(FitRecord, data["fit"], source=src, prefix="fit") if "fit" in data else None
    return EngineProfile(
        backend=backend, host=host,
        policy=build(SchedulingPolicy, data.get("policy", {}), source=src, prefix="policy"),
        defaults=build(EngineDefaults, data.get("defaults", {}), source=src, prefix="defaults"),
        kernel_sources=build(KernelSources, data.get("kernel_sources", {}), source=src, prefix="kernel_sources"),
        fit=fit,
    )


def resolved_async_scheduling(engine: EngineParams, profile: EngineProfile) -> bool:
    """`[engine] async_scheduling`, else the engine's default for a recent release (the profile's
    `[defaults]`: on for vLLM, SGLang and TensorRT-LLM, off under the speculative methods that turn
    it off)."""
    if engine.async_scheduling is not None:
        return engine.async_scheduling
    spec = engine.speculative_config
    return profile.defaults.async_default(None if spec is None else spec.method)
