"""LLMServingSim's per-request vLLM 0.19 traces (`e2e/llmservingsim_vllm_traces/`) -> one row per run.

Each run is replayed exactly: every request's server-side queue time (`queued_rel_s`, the point
TTFT counts from), prompt and output length, with the engine arguments `runs.csv` records (TP,
DP, expert parallelism, max_num_seqs, max_num_batched_tokens, max_model_len, dtype, memory
fraction, prefix caching); arguments it leaves empty take vLLM's defaults (async scheduling from
the vllm profile). Measured: TTFT, TPOT
and E2E latency (mean, median, p90 over requests; TPOT over requests with more than one output
token) and output throughput (output tokens / (last token - first queue time)).
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from sim.measured import open_text
from sim.perf.profile import EngineProfile
from sim.validation.engine_args import OFFLINE
from sim.validation.finalize import TRACE_PLACEHOLDER
from sim.validation.names import GPU_NAMES, MODEL_NAMES
from sim.validation.rows import Replay, TraceRequest, ValidationRow, suite_of
from sim.validation.specs_cache import SpecCache

DIR = "llmservingsim_vllm_traces"


def _opt(raw: str) -> float | None:
    return float(raw) if raw.strip() else None


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    return {f"{prefix}_mean_s": float(values.mean()), f"{prefix}_median_s": float(np.median(values)),
            f"{prefix}_p90_s": float(np.percentile(values, 90))}


def read_llmservingsim(directory: Path, profile: EngineProfile, cache: SpecCache | None = None) -> list[ValidationRow]:
    specs = cache or SpecCache()
    with open_text(directory / "requests.csv") as f:
        by_run: dict[str, list[dict[str, str]]] = defaultdict(list)
        for r in csv.DictReader(f):
            by_run[r["run_id"]].append(r)
    with open_text(directory / "runs.csv") as f:
        return [_row(run, by_run[run["run_id"]], profile, specs) for run in csv.DictReader(f)]


def _row(run: dict[str, str], reqs: list[dict[str, str]], profile: EngineProfile, cache: SpecCache) -> ValidationRow:
    model, gpu = run["model"], run["hardware"]
    hw = GPU_NAMES.get(gpu, gpu)
    queued = np.array([float(r["queued_rel_s"]) for r in reqs])
    first = np.array([float(r["first_token_ts"]) for r in reqs])
    last = np.array([float(r["last_token_ts"]) for r in reqs])
    queued_ts = np.array([float(r["queued_ts"]) for r in reqs])
    out = np.array([int(r["output_toks"]) for r in reqs])
    ttft = (first - queued_ts)
    measured = {**_stats("ttft", ttft), **_stats("tpot", ((last - first) / np.maximum(out - 1, 1))[out > 1]),
                **_stats("e2el", last - queued_ts),
                "output_throughput_tokens_per_s": float(out.sum() / (last.max() - queued_ts.min()))}
    tp, dp = int(run["tensor_parallel_size"]), int(run["data_parallel_size"])
    label = f"{model.split('/')[-1]} {gpu} vllm {run['engine_version']} tp{tp}" + (f"xdp{dp}" if dp > 1 else "") + \
        f" {len(reqs)} ShareGPT requests"
    base: dict[str, Any] = {
        "row_id": f"llmservingsim:{run['run_id']}", "source": "llmservingsim", "suite": suite_of(model, hw),
        "model": model, "hardware": hw, "backend": run["engine"], "backend_version": run["engine_version"],
        "label": label, "measured": measured, "family": cache.family(MODEL_NAMES.get(model)),
        "notes": ("exact replay of queue times and lengths; empty engine arguments take vLLM defaults",)}
    arch = MODEL_NAMES.get(model)
    if arch is None:
        return ValidationRow(**base, skip_reason=f"no model config ships for {model}")
    order = np.argsort(queued, kind="stable")
    t0 = float(queued.min())
    trace = tuple(TraceRequest(arrival_s=float(queued[i] - t0), input_tokens=int(reqs[i]["input_toks"]),
                               output_tokens=int(reqs[i]["output_toks"])) for i in order)
    engine: dict[str, Any] = {
        "backend": "vllm", "tensor_parallel_size": tp, "data_parallel_size": dp,
        "enable_expert_parallel": run["enable_expert_parallel"] == "True",
        "max_num_seqs": int(run["max_num_seqs"]), "max_num_batched_tokens": int(run["max_num_batched_tokens"]),
        "dtype": run["dtype"] or "auto", "kv_cache_dtype": run["kv_cache_dtype"] or "auto",
        "gpu_memory_utilization": _opt(run["gpu_memory_utilization"]) or 0.9,
        "enable_prefix_caching": run["enable_prefix_caching"] != "False",
        "async_scheduling": profile.defaults.async_for(run["engine_version"]),
        **OFFLINE,  # engine timestamps (queued -> first token): no API server in the measured latencies
    }
    max_len = _opt(run["max_model_len"])
    if max_len:
        engine["max_model_len"] = int(max_len)
    sections = {"seed": 0, "hardware": {"name": hw}, "model": {"name": arch}, "engine": engine,
                "workload": {"dataset_name": "trace", "dataset_path": TRACE_PLACEHOLDER, "num_prompts": len(trace),
                             "request_rate": math.inf}}
    replay = Replay(kind="trace", num_requests=len(trace), trace=trace)
    return ValidationRow(**base, sections=sections, replay=replay)
