"""TensorRT-LLM's published tables -> validation rows.

`trtllm_perf_overview_throughput.csv`: `trtllm-bench throughput`, every request queued at t=0,
fixed ISL/OSL, measured total output tokens/s. The engine's max batch size and token budget are
what `trtllm-bench` derives from the dataset (`engine_args.trtllm_bench_settings`; in the PyTorch flow of
the 0.19+ tables the budget is at least the prompt + that batch, `_pytorch_flow`); the KV cache
takes the profile's fraction of the memory left after weights. Every request of the dataset is
simulated.

`trtllm_static_batch_v0.9.csv` (gptSessionBenchmark, static batching): `peak_throughput` rows
run one batch of `batch_size` requests (all prompts in one context step, then every output in
lockstep) -> output tokens/s (the table's per-GPU value x TP); `first_token_latency_bs1` rows
time one request's context phase -> TTFT.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.graph.memory import MemoryBreakdown
from sim.measured import open_text
from sim.perf.profile import EngineProfile, release_tuple
from sim.specs.model import ModelSpec
from sim.validation.engine_args import OFFLINE, profile_engine, trtllm_bench_settings
from sim.validation.names import GPU_NAMES, MODEL_NAMES, QUANTIZATION
from sim.validation.rows import Replay, ValidationRow, suite_of
from sim.validation.specs_cache import SpecCache

THROUGHPUT_FILE = "trtllm_perf_overview_throughput.csv"
STATIC_FILE = "trtllm_static_batch_v0.9.csv"


def _resolve(model: str, gpu: str, cache: SpecCache) -> tuple[str | None, str | None, str | None]:
    """(catalog model, catalog GPU, skip reason)."""
    arch = MODEL_NAMES.get(model)
    if arch is None:
        return None, None, f"no model config ships for {model}"
    try:
        cache.model(arch)
    except ConfigError as exc:
        return None, None, f"model not supported: {exc.rule}"
    hw = GPU_NAMES.get(gpu)
    if hw is None:
        return None, None, f"no hardware spec for {gpu}"
    try:
        cache.hardware(hw)
    except ConfigError as exc:
        return None, None, f"no hardware spec for {gpu}: {exc.rule}"
    return arch, hw, None


def read_trtllm_throughput(path: Path, profiles: Mapping[str, EngineProfile],
                           cache: SpecCache) -> list[ValidationRow]:
    with open_text(path) as f:
        rows = list(csv.DictReader(f))
    out: list[ValidationRow] = []
    seen: dict[str, int] = {}
    for r in rows:
        key = (f"{r['doc_version']}:{r['gpu']}:{r['model']}:{r['precision']}:tp{r['tp']}pp{r['pp']}:"
               f"{r['isl']}/{r['osl']}")
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1:
            key += f"#{seen[key]}"
        out.append(_throughput_row(r, key, profiles["trtllm"], cache))
    return out


def _throughput_row(r: dict[str, str], key: str, profile: EngineProfile, cache: SpecCache) -> ValidationRow:
    tp, pp, isl, osl = int(r["tp"]), int(r["pp"]), int(r["isl"]), int(r["osl"])
    n = int(float(r["num_requests"])) if r["num_requests"].strip() else 0
    arch, hw, reason = _resolve(r["model"], r["gpu"], cache)
    if reason is None and n == 0:
        reason = "the table's dataset size (number of requests) is not recorded for this ISL/OSL"
    base: dict[str, Any] = {
        "row_id": f"trtllm_throughput:{key}", "source": "trtllm_throughput",
        "suite": suite_of(r["model"], hw or r["gpu"]), "model": r["model"], "hardware": hw or r["gpu"],
        "backend": "trtllm", "family": cache.family(MODEL_NAMES.get(r["model"])),
        "backend_version": r["doc_version"],
        "label": f"{r['model']} {r['gpu']} {r['precision']} tp{tp}pp{pp} {isl}/{osl} x{n} (doc {r['doc_version']})",
        "measured": {"output_throughput_tokens_per_s": float(r["output_tok_per_s"])},
        "notes": ("trtllm-bench max batch size / token budget re-derived from its dataset heuristic",)}
    if reason is not None:
        return ValidationRow(**base, skip_reason=reason)
    assert arch is not None and hw is not None
    quantization = QUANTIZATION.get(r["precision"])
    engine: dict[str, Any] = {**profile_engine(profile, quantization=quantization, max_num_seqs=1),
                              "tensor_parallel_size": tp, "pipeline_parallel_size": pp,
                              "max_model_len": isl + osl, **OFFLINE}
    if r["precision"] == "FP16":
        engine["dtype"] = "float16"
    base["notes"] += _engine_flow_attention(engine, cache.model(arch), r["doc_version"])
    hardware, base["notes"] = _benchmark_host(hw, cache, base["notes"])
    sections: dict[str, Any] = {"seed": 0, "hardware": hardware, "model": {"name": arch}, "engine": engine,
                                "workload": {"dataset_name": "fixed", "random_input_len": isl,
                                             "random_output_len": osl, "num_prompts": n,
                                             "request_rate": math.inf, "ignore_eos": True}}
    try:
        mem = cache.memory(arch, hw, {**engine, "gpu_memory_utilization": 0.9})
    except (ConfigError, ValueError) as exc:
        return ValidationRow(**base, skip_reason=str(exc))
    max_bs, max_tokens = trtllm_bench_settings(
        total_memory_bytes_per_gpu=mem.total_bytes, weight_bytes_total=mem.weight_bytes * tp * pp,
        kv_bytes_per_token_total=mem.kv_bytes_per_token * tp * pp, num_gpus=tp * pp, pp=pp, isl=isl, osl=osl)
    if _pytorch_flow(r["doc_version"]):
        # trtllm-bench's PyTorch path (`bench/benchmark/utils/general.py:get_settings`, since
        # NVIDIA/TensorRT-LLM#5625) raises the heuristic's token budget to the longest prompt plus a full
        # batch of decodes unless `enable_chunked_prefill` is set, a key it reads from the
        # extra_llm_api_options YAML only (the documents' llm_options.yml does not set it). Chunked
        # prefill stays the profile's: with such a budget a whole prompt fits beside every decode.
        max_tokens = max(max_tokens, isl + max_bs)
        base["notes"] += ("trtllm-bench PyTorch flow: max_num_tokens raised to ISL + max_batch_size",)
    max_bs = min(max_bs, max_tokens)
    engine.update(max_num_seqs=max_bs, max_num_batched_tokens=max_tokens)
    # max_batch_size bounds each of the pp micro-batches in flight (sim.engine.micro_batches).
    steady = max(1, min(max_bs * pp, _kv_requests(mem, isl, osl)))
    replay = Replay(kind="offline", num_requests=n, concurrency=steady)
    return ValidationRow(**base, sections=sections, replay=replay)


PYTORCH_FLOW_SINCE = (0, 19)
"""TensorRT-LLM release from which NVIDIA's perf-overview tables were measured with trtllm-bench's PyTorch
backend ("Starting with v0.19, testing was performed using the PyTorch backend"); before it, a TensorRT
engine built by `trtllm-bench build`."""


def _pytorch_flow(version: str) -> bool:
    release = release_tuple(version)
    return release is not None and release >= PYTORCH_FLOW_SINCE


def _benchmark_host(hw: str, cache: SpecCache, notes: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The `[hardware]` section of a row measured on NVIDIA's benchmark hosts, and its notes. Where
    the catalog spec describes AIConfigurator's collection host, whose PCIe GPUs reach each other
    peer-to-peer only in groups (`pcie_peer_group_size`), the row's host has P2P across the node:
    NVIDIA's published tables scale with TP as such a host does (docs/kernel-model.md, "PCIe peer
    groups"); the documents do not name their PCIe servers."""
    spec = cache.hardware(hw)
    if spec.pcie_peer_group_size is None or spec.pcie_peer_group_size >= spec.num_gpus_per_node:
        return {"name": hw}, notes
    note = (f"NVIDIA's benchmark host: PCIe peer-to-peer across its {spec.num_gpus_per_node} GPUs "
            f"(hardware.pcie_peer_group_size = {spec.num_gpus_per_node}; the {hw} spec's "
            f"{spec.pcie_peer_group_size} is AIConfigurator's collection host)")
    return {"name": hw, "pcie_peer_group_size": spec.num_gpus_per_node}, (*notes, note)


def _engine_flow_attention(engine: dict[str, Any], model: ModelSpec, version: str) -> tuple[str, ...]:
    """TensorRT-LLM before 1.0 (the TensorRT engine flow of these tables) attends over the whole context
    unless `max_attention_window_size` is set at run time, which trtllm-bench does not do: a model
    config's sliding window (Mistral-7B-v0.1's 4,096 tokens) is not applied. Sets
    `max_attention_window = 0` for such a model and returns the note saying so."""
    release = release_tuple(version)
    if not any(model.layer_window_tokens) or (release is not None and release >= (1, 0)):
        return ()
    engine["max_attention_window"] = 0
    return ("TensorRT-LLM engine flow: full attention (the config's sliding window is not applied "
            "without max_attention_window_size)",)


def _kv_requests(mem: MemoryBreakdown, isl: int, osl: int) -> int:
    """Requests of isl + osl tokens whose KV fits at once (a first estimate of the steady batch)."""
    free = 0.9 * max(mem.total_bytes - mem.weight_bytes - mem.activation_peak_bytes - mem.runtime_overhead_bytes, 0)
    return int(free // max(mem.kv_bytes_per_token * (isl + osl), 1))


def read_trtllm_static(path: Path, profiles: Mapping[str, EngineProfile], cache: SpecCache) -> list[ValidationRow]:
    with open_text(path) as f:
        rows = list(csv.DictReader(f))
    return [_static_row(r, i, profiles["trtllm"], cache) for i, r in enumerate(rows)]


def _static_row(r: dict[str, str], index: int, profile: EngineProfile, cache: SpecCache) -> ValidationRow:
    tp, isl, batch = int(r["tp"]), int(r["isl"]), int(r["batch_size"])
    bs1 = r["kind"] == "first_token_latency_bs1"
    osl = 1 if bs1 else int(r["osl"])
    arch, hw, reason = _resolve(r["model"], r["gpu"], cache)
    measured = ({"ttft_mean_s": float(r["first_token_latency_ms"]) * 1e-3} if bs1 else
                {"output_throughput_tokens_per_s": float(r["out_tok_per_s_per_gpu"]) * tp})
    what = "first-token latency, batch 1" if bs1 else f"static batch {batch}"
    base: dict[str, Any] = {
        "row_id": f"trtllm_static:{index}:{r['gpu']}:{r['model']}:tp{tp}:{isl}/{osl}:{r['kind']}",
        "source": "trtllm_static", "suite": suite_of(r["model"], hw or r["gpu"]), "model": r["model"],
        "family": cache.family(MODEL_NAMES.get(r["model"])),
        "hardware": hw or r["gpu"], "backend": "trtllm", "backend_version": r["engine_version"],
        "label": f"{r['model']} {r['gpu']} {r['precision']} tp{tp} {isl}/{osl} {what}", "measured": measured,
        "notes": ("static batching: every prompt in one context step, outputs in lockstep",)}
    if reason is not None:
        return ValidationRow(**base, skip_reason=reason)
    assert arch is not None and hw is not None
    quantization = QUANTIZATION.get(r["precision"])
    engine: dict[str, Any] = {**profile_engine(profile, quantization=quantization, max_num_seqs=batch),
                              "tensor_parallel_size": tp, "enable_chunked_prefill": False,
                              "max_num_batched_tokens": max(batch * isl, isl + osl, batch),
                              "max_model_len": isl + osl, **OFFLINE}
    if r["precision"] == "FP16":
        engine["dtype"] = "float16"
    base["notes"] += _engine_flow_attention(engine, cache.model(arch), r["engine_version"])
    model: dict[str, Any] = {"name": arch}
    positions = cache.model(arch).max_position_embeddings
    if isl + osl > positions:
        # gptSessionBenchmark built GPT-J's and Falcon's engines past their 2,048 positions (rotary
        # position embeddings extrapolate); the scenario serves past them as that engine did.
        model["max_position_embeddings"] = isl + osl
        base["notes"] += (f"{isl} + {osl} tokens run past the config's max_position_embeddings={positions}, "
                          "as the TensorRT-LLM engine was built",)
    hardware, base["notes"] = _benchmark_host(hw, cache, base["notes"])
    sections = {"seed": 0, "hardware": hardware, "model": model, "engine": engine,
                "workload": {"dataset_name": "fixed", "random_input_len": isl, "random_output_len": osl,
                             "num_prompts": batch, "request_rate": math.inf, "ignore_eos": True}}
    replay = Replay(kind="single_request" if bs1 else "static_batch", num_requests=batch, concurrency=batch)
    return ValidationRow(**base, sections=sections, replay=replay)
