"""CLI verbs that need only the simulator: step, check, list, predict-kernels."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.render import si, table
from sim.api import (
    client_latency_s,
    context_chunk_unit,
    load_engine_profile,
    load_scenario,
    missing_price_message,
    predict_step,
    scenario_efficiency,
    scenario_memory,
)
from sim.errors import ConfigError, InfeasibleScenario, file_error
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.memory import MemoryBreakdown
from sim.perf.profile import TABLE_SOURCE_KEYS
from sim.serde import build, json_text, parse_override
from sim.specs.catalog import list_hardware, list_models, load_hardware, load_model, model_aliases, read_toml
from sim.specs.hardware import HardwareSpec
from sim.specs.prices import find_price_per_gpu_hour_usd, load_prices
from sim.specs.scenario import Scenario, ranks_in_lockstep
from sim.workload.generate import generate


def overrides_from(args: Namespace) -> dict[str, Any]:
    return dict(parse_override(text) for text in (args.set or []))


def parse_batch(prefill: list[str], decode: list[str]) -> BatchShape:
    """`--prefill [COUNTx]TOKENS[:CACHED]` and `--decode COUNTxCONTEXT`, each repeatable."""
    chunks: list[PrefillChunk] = []
    for text in prefill:
        count, tokens, cached = _count_and_value(text, "--prefill")
        chunks += [PrefillChunk(new_tokens=tokens, context_tokens=cached)] * count
    contexts: list[int] = []
    for text in decode:
        count, context, cached = _count_and_value(text, "--decode")
        if cached or "x" not in text:
            raise ConfigError(source="step", key="--decode", value=text,
                              rule="must be COUNTxCONTEXT, e.g. 64x1024 (64 requests with 1024 cached tokens)")
        contexts += [context] * count
    if not chunks and not contexts:
        raise ConfigError(source="step", key="--prefill/--decode", value=None, rule="give at least one")
    return BatchShape(prefills=tuple(chunks), decode_context_tokens=tuple(contexts))


def _count_and_value(text: str, flag: str) -> tuple[int, int, int]:
    try:
        head, _, cached = text.partition(":")
        count, sep, value = head.partition("x")
        if not sep:
            count, value = "1", head
        result = int(count), int(value), int(cached or 0)
    except ValueError:
        raise ConfigError(source="step", key=flag, value=text,
                          rule="must be [COUNTx]TOKENS[:CACHED], e.g. 4x512:1024") from None
    if result[0] < 1 or result[1] < 1 or result[2] < 0:
        raise ConfigError(source="step", key=flag, value=text, rule="counts and tokens must be >= 1")
    if result[0] > MAX_STEP_REQUESTS:
        raise ConfigError(source="step", key=flag, value=text,
                          rule=f"COUNT must be <= {MAX_STEP_REQUESTS:_} requests in one step")
    return result


MAX_STEP_REQUESTS = 1_000_000
"""Most requests `step` accepts per flag: far above any engine's `max_num_seqs`, low enough that
the batch fits in memory."""


def check_batch_fits(batch: BatchShape, max_model_len: int, source: str) -> None:
    """Each request of the step (cached plus new tokens, or decode context plus the sampled one)
    must fit in `max_model_len`, as in the engine."""
    for chunk in batch.prefills:
        total = chunk.context_tokens + chunk.new_tokens
        if total > max_model_len:
            raise ConfigError(source=source, key="--prefill",
                              value=f"{chunk.new_tokens}:{chunk.context_tokens}" if chunk.context_tokens
                              else chunk.new_tokens,
                              rule=f"a request of {total} tokens exceeds engine.max_model_len={max_model_len}")
    for context in batch.decode_context_tokens:
        if context + 1 > max_model_len:
            raise ConfigError(source=source, key="--decode", value=context,
                              rule=f"context plus the sampled token ({context + 1}) exceeds "
                                   f"engine.max_model_len={max_model_len}")


def step_scenario(scenario: Scenario, batch: BatchShape, pool: str | None) -> tuple[Scenario, str | None]:
    """The scenario whose hardware and engine run the step, and its pool's name: a disaggregated
    scenario's top-level `[engine]` / `[hardware]` run nothing, its pools do (`--pool`; default the
    decode pool for a decode-only batch, else the prefill pool)."""
    disaggregation = scenario.disaggregation
    if disaggregation is None:
        if pool is not None:
            raise ConfigError(source=scenario.source, key="--pool", value=pool,
                              rule="applies to disaggregated scenarios only (this one has no [disaggregation])")
        return scenario, None
    name = pool or ("decode" if not batch.prefills else "prefill")
    chosen = disaggregation.decode if name == "decode" else disaggregation.prefill
    return chosen.scenario, name


def cmd_step(args: Namespace) -> int:
    loaded = load_scenario(args.scenario, overrides_from(args))
    batch = parse_batch(args.prefill or [], args.decode or [])
    scenario, pool = step_scenario(loaded, batch, args.pool)
    assert scenario.engine.max_model_len is not None
    check_batch_fits(batch, scenario.engine.max_model_len, scenario.source)
    timing = predict_step(scenario, batch)
    total = timing.device_s()
    sources = _kernel_sources(scenario.engine.backend)
    if args.json:
        payload = {
            "scenario": loaded.source,
            "pool": pool,
            "hardware": scenario.hardware.name,
            "model": scenario.model.name,
            "kernel_sources": sources,
            "batch": {"num_tokens": batch.num_tokens(), "num_sampled": batch.num_sampled()},
            "step_time_s": total,
            "gpu_s": timing.gpu_s,
            "comm_s": timing.comm_s,
            "worst_provenance": timing.worst_provenance.label(),
            "seconds_by_kind": {k.value: v for k, v in timing.seconds_by_kind().items()},
            "kernels": [
                {
                    "name": k.estimate.work.name, "kind": k.estimate.work.kind.value,
                    "shape": list(k.estimate.work.shape), "repeat": k.repeat,
                    "flops": k.estimate.work.flops, "bytes": k.estimate.work.bytes_moved(),
                    "comm_bytes": k.estimate.work.comm_bytes,
                    "bound": k.estimate.roofline.bound().value, "time_s": k.estimate.time_s,
                    "total_s": k.total_s(), "provenance": k.estimate.provenance.label(),
                }
                for k in timing.kernels
            ],
        }
        sys.stdout.write(json_text(payload) + "\n")
        return 0
    rows = [
        (k.estimate.work.name, k.estimate.work.kind.value, "x".join(map(str, k.estimate.work.shape)),
         k.repeat, si(k.estimate.work.flops), si(k.estimate.work.bytes_moved() or k.estimate.work.comm_bytes, "B"),
         k.estimate.roofline.bound().value, f"{k.estimate.time_s * 1e6:.2f}", f"{k.total_s() * 1e6:.1f}",
         k.estimate.provenance.label())
        for k in timing.kernels
    ]
    where = "" if pool is None else f" ({pool} pool)"
    engine = scenario.engine
    layout = f"TP{engine.tensor_parallel_size} PP{engine.pipeline_parallel_size}"
    if engine.data_parallel_size > 1:
        layout += f" DP{engine.data_parallel_size}"
    if scenario.model.moe is not None and engine.expert_parallel_size() > 1:
        layout += f" EP{engine.expert_parallel_size()}"
    out = [f"{scenario.model.name} on {scenario.hardware.name}{where}, {layout}: {batch.num_tokens()} tokens, "
           f"{batch.num_sampled()} sampled\n",
           table(("kernel", "kind", "shape", "x", "flops", "bytes", "bound", "us/launch", "us total",
                  "provenance"), rows),
           "\n",
           table(("kind", "ms", "share"), [
               (kind.value, f"{sec * 1e3:.3f}", f"{sec / total:.1%}")
               for kind, sec in sorted(timing.seconds_by_kind().items(), key=lambda kv: -kv[1])]),
           f"\nstep {total * 1e3:.3f} ms (kernels {timing.gpu_s * 1e3:.3f} ms, collectives "
           f"{timing.comm_s * 1e3:.3f} ms), worst provenance {timing.worst_provenance.label()}\n"]
    if sources:
        named = ", ".join(f"{k}={v}" for k, v in sources.items())
        out.append(f"kernel sources of the {scenario.engine.backend} profile (priced by another engine's "
                   f"measured rows): {named}\n")
    sys.stdout.write("".join(out))
    return 0


def _kernel_sources(backend: str) -> dict[str, str]:
    """The engine profile's `[kernel_sources]`, flattened (`gemm.fp8`, `mla_prefill`, ...): which of its
    kernels another engine's measured rows price."""
    ks = load_engine_profile(backend).kernel_sources
    out = {f"gemm.{dtype}": src for dtype, src in sorted(ks.gemm.items())}
    out.update({key: getattr(ks, key) for key in TABLE_SOURCE_KEYS if getattr(ks, key) is not None})
    return out


def check_file(path: Path, overrides: dict[str, Any] | None = None) -> str:
    """Validate one TOML file by what it holds; return a one-line description. `overrides`
    (`--set SECTION.KEY=VALUE`) apply to scenario files only, exactly as `run --set` applies them."""
    data = read_toml(path)
    is_scenario = "study" not in data and "peak_flops_per_s" not in data and (
        "hardware" in data or ("model" in data and not isinstance(data["model"], list)))
    if overrides and not is_scenario:
        key = next(iter(overrides))
        raise ConfigError(source=str(path), key=key, value=overrides[key],
                          rule="--set overrides apply to scenario files only (this file is not a scenario)")
    if "peak_flops_per_s" in data:
        spec = build(HardwareSpec, data, source=str(path))
        if find_price_per_gpu_hour_usd(spec.name, load_prices()) is None:
            sys.stderr.write(f"warning: {path}: no GPU price for hardware {spec.name!r} in sim/data/prices.toml; "
                             "scenarios on it need hardware.price_per_gpu_hour_usd (USD per GPU-hour) for cost "
                             "metrics, which are null without it\n")
        return f"hardware {spec.name}"
    if "study" in data:
        from orchestrator.sweep.parse import load_sweep

        sweep = load_sweep(path)
        what = (f"capacity plan for {sweep.capacity.target_request_rate:g} requests/s" if sweep.capacity
                else f"{sweep.n_trials} trials, {sweep.sampler}, {len(sweep.objectives)} objective(s)")
        base = Path(sweep.base_scenario).name
        return f"sweep {sweep.name}: {what}, {len(sweep.space)} parameter(s), base {base}"
    if "model" in data and isinstance(data["model"], list):
        return f"model index with {len(data['model'])} entries"
    if "hardware" in data or "model" in data:
        scenario = load_scenario(path, overrides or None)
        warn_about_scenario(scenario)
        mem = scenario_memory(scenario)
        parts = [pool.scenario for pool in scenario.disaggregation.pools()] if scenario.disaggregation else []
        for part in [scenario, *parts]:
            context_chunk_unit(part, load_engine_profile(part.engine.backend))
        # What `run` reads besides the scenario: the kernel model (calibration file) and the
        # dataset's rows (lengths, arrival times, run selection).
        scenario_efficiency(scenario)
        if scenario.workload.dataset_name not in ("random", "fixed"):
            generate(scenario.workload, np.random.default_rng(scenario.seed),
                     max_model_len=scenario.engine.max_model_len)
        if scenario.disaggregation is not None:
            pools = []
            for pool in scenario.disaggregation.pools():
                scenario_efficiency(pool.scenario)
                pm = scenario_memory(pool.scenario)
                pools.append(f"{pool.name} {pool.num_workers} x {pool.scenario.engine.num_gpus()} GPUs on "
                             f"{pool.scenario.hardware.name}, {_kv_blocks(pm)}")
            latency = _latency_note(scenario.disaggregation.prefill.scenario)
            return f"disaggregated scenario {scenario.model.name}: " + "; ".join(pools) + latency
        states = ""
        if mem.max_state_requests is not None:
            states = (f", linear-attention states for {mem.max_state_requests} requests "
                      f"({mem.state_bytes_per_request / 2**20:.1f} MiB each)")
        return (f"scenario {scenario.model.name} on {scenario.hardware.name}: "
                f"{_kv_blocks(mem)}{states}{_latency_note(scenario)}")
    raise ConfigError(source=str(path), key="<root>", value=sorted(data),
                      rule="not a scenario ([hardware], [model]), sweep ([study]) "
                           "or hardware spec ([peak_flops_per_s])")


def _kv_blocks(mem: MemoryBreakdown) -> str:
    """The KV blocks per GPU, as vLLM's `num_gpu_blocks` counts them (its null block among them)."""
    null = " (1 is vLLM's null block)" if mem.null_blocks else ""
    return f"{mem.num_kv_blocks} KV blocks of {mem.block_size} per GPU{null}"


def _latency_note(scenario: Scenario) -> str:
    """The API-server latency that `run`'s TTFT and E2E will include, and where it comes from."""
    engine = scenario.engine
    latency = client_latency_s(engine, load_engine_profile(engine.backend).host)
    where = "[engine]" if engine.api_server_latency_s is not None else f"{engine.backend} profile"
    return f"; TTFT/E2E include {latency * 1e3:.0f} ms of API-server latency ({where})"


def warn_about_scenario(scenario: Scenario) -> None:
    """The stderr warnings `check` and `run` both give: a scenario without a GPU price
    (`missing_price_message`); a vLLM engine that vLLM would refuse to start."""
    message = missing_price_message(scenario)
    if message is not None:
        sys.stderr.write(f"warning: {message}\n")
    warn_vllm_would_not_start(scenario)
    engine = scenario.engine
    if (engine.batch_wait_timeout_iters or engine.batch_wait_max_tokens_ratio) and \
            ranks_in_lockstep(scenario.model, engine):
        sys.stderr.write("warning: TensorRT-LLM waits for batches only without attention data parallelism "
                         "(PyExecutor._schedule): engine.batch_wait_timeout_iters and batch_wait_max_tokens_ratio "
                         f"have no effect with data_parallel_size={engine.data_parallel_size}\n")


def warn_vllm_would_not_start(scenario: Scenario) -> None:
    """vLLM refuses to start an engine whose KV cache cannot hold one `max_model_len` request
    (`check_enough_kv_cache_memory`), whatever the traffic; the simulator asks it to hold the
    workload's longest request only (docs/memory.md), so such a scenario runs here: say so."""
    parts = ([(f"{pool.name} pool: ", pool.scenario) for pool in scenario.disaggregation.pools()]
             if scenario.disaggregation is not None else [("", scenario)])
    for where, part in parts:
        engine = part.engine
        if engine.backend != "vllm" or engine.max_model_len is None:
            continue
        try:
            held = scenario_memory(part).kv_capacity_tokens()
        except InfeasibleScenario:
            continue  # the run's own error says why
        if held < engine.max_model_len:
            sys.stderr.write(f"warning: {where}vLLM would refuse to start this engine: its KV cache holds {held} "
                             f"tokens per GPU, less than engine.max_model_len={engine.max_model_len} (vLLM's "
                             f"check_enough_kv_cache_memory); the simulation serves the workload's requests, "
                             f"which fit; set max_model_len <= {held} to match a vLLM deployment\n")


def cmd_check(args: Namespace) -> int:
    try:
        overrides = overrides_from(args)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    failed = 0
    for name in args.files:
        try:
            sys.stdout.write(f"ok    {name}: {check_file(Path(name), overrides)}\n")
        except ConfigError as exc:
            failed += 1
            sys.stderr.write(f"error: {exc}\n")
        except OSError as exc:  # a file the checked one names (dataset, calibration) cannot be read
            failed += 1
            sys.stderr.write(f"error: {file_error(exc)}\n")
    return 2 if failed else 0


def simulable(model_id: str) -> str:
    """`yes`, or `no: <reason>` when the model loader refuses the architecture (for example an
    attention variant the kernel graph does not model)."""
    try:
        load_model(model_id)
    except ConfigError as exc:
        return f"no: {exc.rule}"
    return "yes"


def _interconnect(hw: HardwareSpec) -> str:
    """GPUs per node (or NVLink domain), the link between them, and a PCIe node's peer groups."""
    link = hw.intra_node_link
    domain = hw.nvlink_domain()
    where = f"{domain} per NVLink domain" if domain > hw.num_gpus_per_node else f"{hw.num_gpus_per_node} per node"
    text = f"{where}, {link.kind} {si(link.bandwidth_bytes_per_s, 'B/s')}"
    peers = hw.pcie_peer_group_size
    if link.kind == "pcie" and peers is not None and peers < hw.num_gpus_per_node:
        text += f", P2P in groups of {peers}"
    return text


def cmd_list(args: Namespace) -> int:
    if args.what == "hardware":
        rows = []
        for name in list_hardware():
            hw = load_hardware(name)
            rows.append((name, hw.description, si(hw.peak_flops_per_s.get("bf16", 0.0), "FLOP/s"),
                         si(hw.hbm_bandwidth_bytes_per_s, "B/s"), f"{hw.hbm_capacity_bytes / 2**30:.0f} GiB",
                         _interconnect(hw)))
        sys.stdout.write(table(("name", "description", "bf16 dense", "HBM bw", "HBM", "GPUs and links per node"),
                               rows))
    else:
        aliases = model_aliases()
        sys.stdout.write(table(("id", "aliases", "simulable"),
                               [(m, ", ".join(aliases[m]), simulable(m)) for m in list_models()]))
    return 0
