"""Composition root: load a scenario, check it can run, price a step.

This is the public entry point the CLI and the orchestrator call; file access for scenarios
happens here and in `sim.specs.catalog`, never inside the simulation loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.calibration.select import EfficiencyModels, efficiency_model_for
from sim.engine.autoscaled import AutoscaledSimulation
from sim.engine.disaggregated import PREFILL_TOKEN, DisaggregatedSimulation
from sim.engine.micro_batches import pipeline_micro_batches
from sim.engine.part_prices import PriceCache
from sim.engine.pricer import StepPricer
from sim.engine.records import RequestRecord, StepRecord
from sim.engine.simulation import SimLimits, Simulation, gc_paused, request_states
from sim.engine.step_log import StepLog
from sim.errors import ConfigError, InfeasibleScenario
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelGraph
from sim.graph.memory import MemoryBreakdown, memory_breakdown
from sim.graph.transformer import build_step_graph
from sim.metrics.autoscaling import AutoscalingSummary, autoscaling_summary, provisioned_cost
from sim.metrics.classes import ClassSummary, class_summaries
from sim.metrics.pools import PoolSummary, TransferSummary, pool_summary, transfer_summary
from sim.metrics.summary import KernelBreakdown, SimSummary, summarize
from sim.perf.efficiency import EfficiencyModel
from sim.perf.host import HostOverheadParams
from sim.perf.profile import EngineProfile
from sim.perf.profile import load_engine_profile as load_engine_profile
from sim.perf.profile import resolved_async_scheduling as resolved_async_scheduling
from sim.perf.step import StepCostModel, StepTiming
from sim.serving.adp_balance import AdpBalance
from sim.serving.dp_group import DataParallelGroup
from sim.serving.kv_cache import kv_cache_for
from sim.serving.kv_transfer import transfer_path
from sim.serving.request import RequestState
from sim.serving.speculative import AcceptanceSampler
from sim.serving.vllm_v1 import SGLANG_DP_ATTENTION_CONSERVATIVENESS, VllmV1Scheduler
from sim.specs.engine import EngineParams
from sim.specs.prices import find_price_per_gpu_hour_usd, load_prices
from sim.specs.scenario import Pool, Scenario, load_scenario_file, ranks_in_lockstep
from sim.specs.speculative import acceptance_rates
from sim.workload.generate import generate, generate_fleet
from sim.workload.requests import RequestSpec

__version__ = "0.6.7"

_GIB = float(1 << 30)


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read, override, resolve and validate a scenario; raise `ConfigError` or `InfeasibleScenario`."""
    scenario = load_scenario_file(path, overrides)
    check_feasible(scenario)
    return scenario


def scenario_memory(scenario: Scenario) -> MemoryBreakdown:
    return memory_breakdown(scenario.model, scenario.engine, scenario.precision, scenario.hardware,
                            draft=scenario.draft_model)


def check_feasible(scenario: Scenario) -> MemoryBreakdown:
    """Raise `InfeasibleScenario` when weights do not fit or one max-length request has no room
    (disaggregated: in either pool; returns the decode pool's memory)."""
    if scenario.disaggregation is not None:
        mems = [_check_pool(pool) for pool in scenario.disaggregation.pools()]
        return mems[1]
    mem = scenario_memory(scenario)
    engine = scenario.engine
    # An MoE engine's attention-DP ranks are one engine over data_parallel_size x the replica's GPUs.
    lockstep = ranks_in_lockstep(scenario.model, engine)
    gpus = engine.num_gpus() if lockstep else engine.world_size()
    if mem.static_bytes(cuda_graphs=False) > mem.requested_bytes:
        # SGLang counts weights only against its mem_fraction_static (`MemoryBreakdown.overheads_in_budget`).
        overheads = mem.static_bytes(cuda_graphs=False) - mem.weight_bytes
        plus = f" plus {overheads / _GIB:.2f} GiB of activations and runtime" if mem.overheads_in_budget else ""
        raise InfeasibleScenario(
            source=scenario.source, key="engine.data_parallel_size" if lockstep else "engine.tensor_parallel_size",
            value=engine.data_parallel_size if lockstep else engine.tensor_parallel_size,
            rule=(f"{scenario.model.name} needs {mem.weight_bytes / _GIB:.2f} GiB of weights per GPU "
                  f"({mem.weight_bytes * gpus / 1e9:.0f} GB over the {gpus} GPUs "
                  f"of {'the engine' if lockstep else 'a replica'} with {mem.total_bytes * gpus / 1e9:.0f} GB "
                  f"of HBM){plus}, over the {mem.requested_bytes / _GIB:.2f} GiB that "
                  f"gpu_memory_utilization={engine.gpu_memory_utilization} allows on {scenario.hardware.name}; "
                  + ("raise data x expert parallelism (experts over more GPUs), tensor/pipeline parallelism "
                     "or quantize" if lockstep else "raise tensor/pipeline parallelism or quantize")))
    fixed, graphs = mem.static_bytes(), mem.static_bytes() - mem.static_bytes(cuda_graphs=False)
    if fixed >= mem.requested_bytes:
        # Only the CUDA graphs are left to blame: the cache gets nothing whatever max_model_len is.
        raise InfeasibleScenario(
            source=scenario.source, key="engine.gpu_memory_utilization", value=engine.gpu_memory_utilization,
            rule=(f"no memory is left for the KV cache: weights, activations and runtime take "
                  f"{(fixed - graphs) / _GIB:.2f} GiB and the CUDA graphs "
                  f"{graphs / _GIB:.2f} GiB of the {mem.requested_bytes / _GIB:.2f} GiB allowed "
                  f"on {scenario.hardware.name}; raise gpu_memory_utilization or parallelism, or set "
                  "enforce_eager = true (no graphs)"))
    assert engine.max_model_len is not None
    if mem.max_state_requests is not None and mem.max_state_requests < 1:
        raise InfeasibleScenario(
            source=scenario.source, key="engine.mamba_full_memory_ratio", value=engine.mamba_full_memory_ratio,
            rule=(f"the linear-attention state pool holds no request: one request's state is "
                  f"{mem.state_bytes_per_request / _GIB:.3f} GiB per GPU; raise gpu_memory_utilization, "
                  "parallelism or mamba_full_memory_ratio"))
    # With speculation the last verification of the longest request also holds its drafts' and
    # lookahead slots (both stop at max_model_len, `VllmV1Scheduler`).
    extra = engine.num_speculative_tokens() + vllm_lookahead_tokens(scenario)
    if mem.kv_capacity_tokens() < min(engine.max_model_len, _longest_request(scenario) + extra):
        raise InfeasibleScenario(
            source=scenario.source, key="engine.max_model_len", value=engine.max_model_len,
            rule=(f"the KV cache holds {mem.kv_capacity_tokens()} tokens per GPU "
                  f"({mem.kv_cache_bytes / _GIB:.2f} GiB), less than one request needs; lower "
                  "max_model_len or raise gpu_memory_utilization or parallelism"))
    return mem


def _check_pool(pool: Pool) -> MemoryBreakdown:
    try:
        return check_feasible(pool.scenario)
    except InfeasibleScenario as exc:
        raise InfeasibleScenario(source=exc.source, key=f"disaggregation.{pool.name}.{exc.key}", value=exc.value,
                                 rule=f"{exc.rule} (in the {pool.name} pool)") from None


def _longest_request(scenario: Scenario) -> int:
    """Upper bound on one request's tokens: exact for synthetic lengths; `max_model_len` for a
    dataset file, whose rows `generate` checks against it (a longer row is a `ConfigError`)."""
    w = scenario.workload
    if w.dataset_name in ("random", "fixed"):
        return w.max_request_tokens()
    assert scenario.engine.max_model_len is not None
    return scenario.engine.max_model_len


def scenario_price_per_gpu_hour_usd(scenario: Scenario) -> float | None:
    """`[hardware] price_per_gpu_hour_usd`, else the shipped price table's entry for the hardware;
    None when neither has one (the run's cost metrics are None then; see `missing_price_message`)."""
    if scenario.price_per_gpu_hour_usd is not None:
        return scenario.price_per_gpu_hour_usd
    return find_price_per_gpu_hour_usd(scenario.hardware.name, load_prices())


def missing_price_message(scenario: Scenario) -> str | None:
    """Why a scenario's cost metrics are None, naming the file and key that would set a price;
    None when the scenario has a price."""
    if scenario_price_per_gpu_hour_usd(scenario) is not None:
        return None
    return (f"{scenario.source}: no GPU price for hardware {scenario.hardware.name!r} (not in the shipped "
            f"price table sim/data/prices.toml); set hardware.price_per_gpu_hour_usd in the scenario "
            "(USD per GPU-hour) to get cost metrics; cost_per_hour_usd and "
            "cost_per_million_output_tokens_usd are null until then")


def step_graph(scenario: Scenario, batch: BatchShape) -> KernelGraph:
    return build_step_graph(scenario.model, scenario.engine, scenario.precision, scenario.hardware, batch)


EfficiencyWrapper = Callable[[EfficiencyModel, Scenario], EfficiencyModel]
"""`simulate(efficiency_wrapper=...)`: the kernel model a run (or a disaggregated run's pool, with its
scenario) prices with, given the one it selected."""


def scenario_efficiency(scenario: Scenario, profile: EngineProfile | None = None, *,
                        models: EfficiencyModels | None = None) -> EfficiencyModel:
    """The kernel model the scenario's `[perf]` section selects (default: best shipped tier), with
    the kernel sources of the engine profile (default: the shipped profile of `engine.backend`);
    `models` reuses the models a long-lived caller (a sweep worker) has built before."""
    profile = profile or load_engine_profile(scenario.engine.backend)
    select = efficiency_model_for if models is None else models.get
    return select(scenario.hardware, tier=scenario.perf.tier, calibration_path=scenario.perf.calibration,
                  backend=scenario.engine.backend, gemm_backends=profile.kernel_sources.gemm,
                  table_backends=profile.kernel_sources.table_backends())


def predict_step(scenario: Scenario, batch: BatchShape, *, efficiency: EfficiencyModel | None = None) -> StepTiming:
    """Per-kernel prices of one step of `batch` on the scenario's hardware."""
    model = StepCostModel(scenario.hardware, efficiency or scenario_efficiency(scenario))
    return model.cost(step_graph(scenario, batch))


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    summary: SimSummary
    breakdown: KernelBreakdown
    records: tuple[RequestRecord, ...]
    kv_usage: tuple[tuple[float, float], ...]
    """(time_s, used fraction of the KV blocks of the replica that ran the step) after each step,
    in time order; for long runs (over `sim.metrics.kv_usage.MAX_SAMPLES` steps) one pair per time
    bucket of `kv_usage_bucket_s` seconds instead: its last step's end and its steps' mean
    fraction (disaggregated runs: the prefill ranks' pairs, then the decode ranks')."""
    kv_usage_bucket_s: float = 0.0
    """Width of the time buckets of `kv_usage`; 0.0 when it holds one pair per step."""
    kv_usage_prefill_pairs: int = 0
    """Disaggregated runs: how many leading pairs of `kv_usage` are the prefill pool's (the rest are
    the decode pool's); 0 otherwise."""
    memory: MemoryBreakdown
    scenario_hash: str
    sim_version: str
    steps: tuple[StepRecord, ...] = ()
    """The steps run, when `simulate(max_step_events=...)` asked for them (runs of identical
    steps are one record); empty otherwise."""
    num_steps_not_logged: int = 0
    """Steps left out of `steps` because the log reached `max_step_events`."""
    pools: tuple[PoolSummary, ...] = ()
    """Disaggregated runs: the prefill and the decode pool's metrics; empty for aggregated runs."""
    pool_breakdowns: tuple[tuple[str, KernelBreakdown], ...] = ()
    """Disaggregated runs: each pool's kernel breakdown (`breakdown` is their sum)."""
    transfer: TransferSummary | None = None
    replica_pools: tuple[str, ...] = ()
    """Disaggregated runs: the pool of each replica index (step records' `replica`)."""
    classes: tuple[ClassSummary, ...] = ()
    """Per traffic class (`[[workload.classes]]`): latencies and goodput under the class's SLOs."""
    autoscaling: AutoscalingSummary | None = None
    """With `[autoscaling]`: replicas over time, peak, GPU-hours, SLO attainment (the summary's
    cost metrics are then the provisioned GPU-hours'); None for a fixed fleet."""
    api_server_latency_s: float = 0.0
    """The API server's latency outside the engine that every TTFT and E2E includes (the engine
    profile's, or `[engine] api_server_latency_s`; docs/serving.md, Metrics)."""


def load_host_params(backend: str) -> HostOverheadParams:
    """Shipped host-overhead parameters of an engine profile (`sim/data/host/<backend>.toml`)."""
    return load_engine_profile(backend).host


def client_latency_s(engine: EngineParams, host: HostOverheadParams) -> float:
    """Seconds a request spends outside the engine as its client sees it: the scenario's
    `[engine] api_server_latency_s`, else the engine profile's fitted value (a disaggregated
    deployment's requests enter through the prefill pool's server)."""
    return host.api_server_latency_s if engine.api_server_latency_s is None else engine.api_server_latency_s


def simulate(
    scenario: Scenario,
    *,
    efficiency: EfficiencyModel | None = None,
    host: HostOverheadParams | None = None,
    limits: SimLimits | None = None,
    profile: EngineProfile | None = None,
    progress: Callable[[int], None] | None = None,
    max_step_events: int = 0,
    prices: PriceCache | None = None,
    max_requests: int | None = None,
    efficiency_wrapper: EfficiencyWrapper | None = None,
    models: EfficiencyModels | None = None,
) -> SimResult:
    """Replay the scenario's workload through its replicas; same scenario + seed, same result.

    `max_requests` simulates only the first that many requests (in arrival order) of the same
    seeded workload, a genuine prefix of the full run's requests (a sweep's low-fidelity rungs).

    `profile` defaults to the shipped profile of `engine.backend`; `host` overrides its host overheads.
    `max_step_events` > 0 logs the steps run (`SimResult.steps`, at most that many records; see
    `sim.engine.step_log`); the results are the same either way. `prices` shares priced step parts
    with earlier calls of the same pricing identity (a sweep worker's trials; see
    `sim.engine.part_prices`): same results, less pricing.
    `efficiency_wrapper(model, scenario)` replaces the kernel model each part of the run prices with
    (`efficiency` or the one the scenario selects; in a disaggregated run each pool's own, with the
    pool's scenario): how `sim.uncertainty` perturbs every pool's model by its own hardware.
    `models` is a long-lived caller's cache of kernel models (a sweep worker's): where `efficiency` is
    not given, the run (or each pool) selects its model through it instead of building it anew.
    Cyclic garbage collection is paused during the call (see `sim.engine.simulation.gc_paused`).
    """
    with gc_paused():
        return _simulate(scenario, efficiency=efficiency, host=host, limits=limits, profile=profile,
                         progress=progress, max_step_events=max_step_events, prices=prices,
                         max_requests=max_requests, wrapper=efficiency_wrapper, models=models)


def speculation_sampler(scenario: Scenario) -> AcceptanceSampler | None:
    """The acceptance model of `[engine] speculative_config` (None without it): the workload's rates
    or mean acceptance length, else the method's published default; seeded from the scenario seed
    (child 1 of its SeedSequence; the workload generator uses child 0)."""
    config = scenario.engine.speculative_config
    if config is None:
        return None
    w = scenario.workload
    rates = acceptance_rates(config.method, config.num_speculative_tokens, w.spec_acceptance_rates,
                             w.spec_mean_acceptance_length)
    return AcceptanceSampler(rates, scenario.seed)


def _simulate(scenario: Scenario, *, efficiency: EfficiencyModel | None, host: HostOverheadParams | None,
              limits: SimLimits | None, profile: EngineProfile | None,
              progress: Callable[[int], None] | None, max_step_events: int,
              prices: PriceCache | None, max_requests: int | None = None,
              wrapper: EfficiencyWrapper | None = None, models: EfficiencyModels | None = None) -> SimResult:
    if scenario.disaggregation is not None:
        return _simulate_disaggregated(scenario, efficiency=efficiency, host=host, limits=limits or SimLimits(),
                                       profile=profile, progress=progress, max_step_events=max_step_events,
                                       prices=prices, max_requests=max_requests, wrapper=wrapper, models=models)
    mem = check_feasible(scenario)
    engine = scenario.engine
    limits = limits or SimLimits()
    profile = profile or load_engine_profile(engine.backend)
    assert engine.max_num_seqs is not None and engine.max_num_batched_tokens is not None
    (workload_seq,) = np.random.SeedSequence(scenario.seed).spawn(1)
    specs, class_ids = _draw_workload(scenario, workload_seq, engine.max_model_len, max_requests)
    ranks = _rank_schedulers(scenario, mem, profile, engine.data_parallel_size, limits)
    states = request_states(specs, ranks[0].kv)
    lockstep = ranks_in_lockstep(scenario.model, engine)
    balance = (AdpBalance(timeout_iters=engine.attention_dp_timeout_iters,
                          batching_wait_iters=engine.attention_dp_batching_wait_iters)
               if engine.attention_dp_enable_balance else None)
    replicas: list[VllmV1Scheduler | DataParallelGroup] = (
        [DataParallelGroup(ranks, balance, round_robin=sglang_round_robin_ranks(scenario))] if lockstep
        else list(ranks))
    pricer = _pool_pricer(scenario, profile, efficiency, host, prices, wrapper, models, limits)
    step_log = StepLog(max_step_events) if max_step_events > 0 else None
    sim: Simulation
    latency = client_latency_s(engine, host or profile.host)
    if scenario.autoscaling is None:
        sim = Simulation(replicas=replicas, pricer=pricer, router=engine.router,
                         max_concurrency=scenario.workload.max_concurrency, limits=limits,
                         progress=progress, step_log=step_log, client_latency_s=latency)
    else:
        assert not lockstep  # rejected on load (sim.specs.scenario._resolve_autoscaling)
        sim = AutoscaledSimulation(replicas=ranks, pricer=pricer, router=engine.router,
                                   max_concurrency=scenario.workload.max_concurrency, limits=limits,
                                   spec=scenario.autoscaling, max_num_seqs=ranks[0].max_num_seqs,
                                   progress=progress, step_log=step_log, client_latency_s=latency)
    records = sim.run(states)
    by_kind, by_name, host_s, floor_s = pricer.breakdown()
    price = scenario_price_per_gpu_hour_usd(scenario)
    summary = summarize(
        records, num_requests=len(specs), itl=sim.itl, slo=scenario.slo, kv_usage=sim.kv_trace,
        num_preemptions=sim.num_preemptions(),
        prefix_query_tokens=sum(r.kv.num_prefix_queries_tokens for r in ranks),
        prefix_hit_tokens=sum(r.kv.num_prefix_hit_tokens for r in ranks),
        num_gpus=engine.num_gpus(), price_per_gpu_hour_usd=price, num_steps=sim.num_steps,
        truncated=sim.truncated, worst_provenance=pricer.worst_provenance.label(),
    )
    classes = () if class_ids is None else class_summaries(
        records, class_ids, scenario.workload.classes, slo=scenario.slo, duration_s=summary.duration_s)
    scaled = None
    if isinstance(sim, AutoscaledSimulation):
        spec = scenario.autoscaling
        assert spec is not None and spec.max_replicas is not None and spec.initial_replicas is not None
        scaled = autoscaling_summary(
            min_replicas=spec.min_replicas, max_replicas=spec.max_replicas, initial_replicas=spec.initial_replicas,
            gpus_per_replica=engine.world_size(), peak_replicas=sim.peak_replicas, window_s=sim.end_s,
            replica_s=sim.replica_s, startup_s=sim.startup_s, num_started=sim.num_started,
            num_drained=sim.num_drained, summary=summary, timeline=sim.timeline, classes=classes)
        summary = provisioned_cost(summary, scaled)
    return SimResult(
        summary=summary, classes=classes, autoscaling=scaled,
        breakdown=KernelBreakdown(seconds_by_kind=by_kind, seconds_by_name=by_name, host_s=host_s,
                                  launch_floor_s=floor_s),
        records=tuple(records), kv_usage=sim.kv_usage, kv_usage_bucket_s=sim.kv_trace.bucket_s, memory=mem,
        scenario_hash=scenario.scenario_hash(), sim_version=__version__,
        steps=step_log.records() if step_log is not None else (),
        num_steps_not_logged=step_log.num_dropped_steps if step_log is not None else 0,
        api_server_latency_s=latency,
    )


def last_arrival_s(scenario: Scenario) -> float:
    """Time of the last arrival of the scenario's workload (as `simulate` draws it, from the run's
    start; 0 when every request arrives at once). No run lasts less (its duration runs from the
    start to the last finish), so a run's request rate is at most num_completed / this."""
    (workload_seq,) = np.random.SeedSequence(scenario.seed).spawn(1)
    specs, _ = _draw_workload(scenario, workload_seq, scenario.engine.max_model_len, None)
    return float(specs[-1].arrival_s) if specs else 0.0


def _draw_workload(scenario: Scenario, workload_seq: np.random.SeedSequence, max_model_len: int | None,
                   max_requests: int | None) -> tuple[tuple[RequestSpec, ...], np.ndarray | None]:
    """The scenario's requests (and each one's traffic class, with `[[workload.classes]]`); with
    `max_requests`, the first that many of the whole drawn workload, so a shorter run is its prefix."""
    class_ids: np.ndarray | None = None
    if scenario.workload.classes:
        specs, class_ids = generate_fleet(scenario.workload, np.random.default_rng(workload_seq))
    else:
        specs = generate(scenario.workload, np.random.default_rng(workload_seq), max_model_len=max_model_len)
    if max_requests is not None and max_requests < len(specs):
        specs = specs[:max(max_requests, 1)]
        class_ids = None if class_ids is None else class_ids[:len(specs)]
    return specs, class_ids


def context_chunk_unit(scenario: Scenario, profile: EngineProfile) -> int:
    """Tokens a prompt chunk cut by the token budget is a multiple of (1: any): the KV block for an
    engine whose profile cuts chunks to whole blocks (TensorRT-LLM). Raises `ConfigError` when the
    budget is below it, since a longer prompt could then never finish."""
    engine = scenario.engine
    unit = engine.block_size if profile.policy.context_chunks_in_blocks else 1
    budget = engine.max_num_batched_tokens
    if budget is not None and unit > budget and engine.enable_chunked_prefill:
        raise ConfigError(source=scenario.source, key="engine.max_num_batched_tokens", value=budget,
                          rule=(f"must be at least block_size ({unit}): {engine.backend} cuts prompt chunks "
                                "to whole KV blocks, so a smaller budget never finishes a long prompt"))
    return unit


def micro_batches(scenario: Scenario, limits: SimLimits) -> int:
    """Pipeline micro-batches a replica of `scenario` keeps in flight (`pipeline_micro_batches`; 1
    with `SimLimits.pipeline_micro_batches` off)."""
    return pipeline_micro_batches(scenario) if limits.pipeline_micro_batches else 1


def _rank_schedulers(scenario: Scenario, mem: MemoryBreakdown, profile: EngineProfile, num_ranks: int,
                     limits: SimLimits) -> list[VllmV1Scheduler]:
    """One scheduler per engine rank (a replica, an attention-DP rank, a pool worker's rank), each
    with its own KV cache of `mem.usable_kv_blocks()` blocks. A pipeline's scheduler plans all its
    micro-batches in flight at once (`sim.engine.micro_batches`): a token budget per micro-batch,
    a prompt chunk at most what one leaves beside its share of the running requests, running
    requests bounded together (vLLM) or, where the profile says so, per micro-batch (TensorRT-LLM:
    `max_num_seqs` each; SGLang: max(`max_num_seqs` // p, 1) each)."""
    engine = scenario.engine
    assert engine.max_num_seqs is not None and engine.max_num_batched_tokens is not None
    speculation = speculation_sampler(scenario)
    unit = context_chunk_unit(scenario, profile)
    m = micro_batches(scenario, limits)
    seqs = engine.max_num_seqs
    if profile.policy.max_num_seqs_per_micro_batch:
        seqs *= m
    elif profile.policy.max_num_seqs_split_over_micro_batches:
        seqs = m * max(seqs // m, 1)
    # TensorRT-LLM waits for batches only without attention DP (`PyExecutor._schedule`).
    batch_wait = not ranks_in_lockstep(scenario.model, engine)
    return [
        VllmV1Scheduler(
            kv=kv_cache_for(num_blocks=mem.usable_kv_blocks(), block_size=engine.block_size,
                            enable_prefix_caching=engine.enable_prefix_caching),
            max_num_seqs=mem.running_request_cap(seqs),
            max_num_batched_tokens=engine.max_num_batched_tokens * m,
            enable_chunked_prefill=engine.enable_chunked_prefill,
            long_prefill_token_threshold=engine.long_prefill_token_threshold, micro_batches=m,
            bulk_decodes=limits.bulk_decode,
            prefill_priority=profile.policy.prefill_priority,
            reserve_new_token_ratio=profile.policy.reserve_new_token_ratio,
            reserve_full_output=profile.policy.reserve_full_output,
            batch_wait_timeout_iters=engine.batch_wait_timeout_iters if batch_wait else 0,
            batch_wait_max_tokens_ratio=engine.batch_wait_max_tokens_ratio if batch_wait else 0.0,
            num_speculative_tokens=engine.num_speculative_tokens(), speculation=speculation,
            context_chunk_unit=unit, num_lookahead_tokens=vllm_lookahead_tokens(scenario),
            max_model_len=engine.max_model_len, drop_last_hit_block=vllm_drops_last_hit_block(scenario),
            schedule_conservativeness=sglang_schedule_conservativeness(scenario),
        )
        for _ in range(num_ranks)
    ]


def sglang_schedule_conservativeness(scenario: Scenario) -> float:
    """SGLang's effective `--schedule-conservativeness` (its default 1.0): times 0.3 under attention DP
    (an MoE model with `data_parallel_size` > 1, launched `--enable-dp-attention`), as
    `ServerArgs._handle_data_parallelism` sets it; it scales the new-token ratio of SGLang's admission."""
    if scenario.engine.backend == "sglang" and ranks_in_lockstep(scenario.model, scenario.engine):
        return SGLANG_DP_ATTENTION_CONSERVATIVENESS
    return 1.0


def vllm_lookahead_tokens(scenario: Scenario) -> int:
    """KV lookahead slots per running request and step: vLLM v1's scheduler allocates k past the
    scheduled tokens for the methods whose drafter runs on the GPU in the step (`use_eagle()`: eagle,
    eagle3, mtp; `uses_draft_model()`), none for ngram; other engines' schedulers are not modelled
    with lookahead."""
    config = scenario.engine.speculative_config
    if config is None or scenario.engine.backend != "vllm" or config.method == "ngram":
        return 0
    return config.num_speculative_tokens


def vllm_drops_last_hit_block(scenario: Scenario) -> bool:
    """vLLM v1 gives back the last block of a prefix-cache hit when its drafter reads the target's
    hidden states (`SpeculativeConfig.use_eagle()`: eagle, eagle3, mtp; `find_longest_cache_hit`
    pops it), so that the step recomputes the hidden states the drafter needs; not for ngram and
    draft_model, nor other engines' schedulers."""
    config = scenario.engine.speculative_config
    return config is not None and scenario.engine.backend == "vllm" and config.method in ("eagle", "eagle3", "mtp")


def _pool_replicas(scenario: Scenario, ranks: list[VllmV1Scheduler], num_workers: int, *,
                   prefill_pool: bool = False) -> list[VllmV1Scheduler | DataParallelGroup]:
    """A pool's replicas: for an MoE model with attention DP, one lockstep group per worker (its DP
    ranks meet at every MoE layer, as in an aggregated engine); else one per rank."""
    dp = scenario.engine.data_parallel_size
    if not ranks_in_lockstep(scenario.model, scenario.engine):
        return list(ranks)
    rr = sglang_round_robin_ranks(scenario, prefill_pool=prefill_pool)
    return [DataParallelGroup(ranks[w * dp:(w + 1) * dp], round_robin=rr) for w in range(num_workers)]


def sglang_round_robin_ranks(scenario: Scenario, *, prefill_pool: bool = False) -> bool:
    """Whether an engine's attention-DP ranks take requests in turn: SGLang's `DataParallelController`
    with `--load-balance-method auto` (round robin, except a disaggregated prefill server's
    `follow_bootstrap_room`, which the simulator leaves to the load balancer); vLLM and TensorRT-LLM
    send each to the least loaded rank."""
    return scenario.engine.backend == "sglang" and not prefill_pool


def _pool_pricer(scenario: Scenario, profile: EngineProfile, efficiency: EfficiencyModel | None,
                 host: HostOverheadParams | None, prices: PriceCache | None,
                 wrapper: EfficiencyWrapper | None, models: EfficiencyModels | None, limits: SimLimits
                 ) -> StepPricer:
    """The step pricer of a scenario's replicas (an aggregated engine, or one pool of a
    disaggregated fleet), sharing priced parts through `prices` when given."""
    efficiency = efficiency or scenario_efficiency(scenario, profile, models=models)
    if wrapper is not None:
        efficiency = wrapper(efficiency, scenario)
    host = host or profile.host
    m = micro_batches(scenario, limits)
    overlap = resolved_async_scheduling(scenario.engine, profile)
    if prices is None:
        return StepPricer(scenario, StepCostModel(scenario.hardware, efficiency), host, micro_batches=m,
                          async_scheduling=overlap)
    shared = prices.prices(scenario, efficiency, host.eager_launch_s)
    return StepPricer(scenario, shared.cost, host, prices=shared, micro_batches=m, async_scheduling=overlap)


def _breakdown(pricer: StepPricer) -> KernelBreakdown:
    by_kind, by_name, host_s, floor_s = pricer.breakdown()
    return KernelBreakdown(seconds_by_kind=by_kind, seconds_by_name=by_name, host_s=host_s, launch_floor_s=floor_s)


def _sum_breakdowns(parts: list[KernelBreakdown]) -> KernelBreakdown:
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for bd in parts:
        for k, v in bd.seconds_by_kind.items():
            by_kind[k] = by_kind.get(k, 0.0) + v
        for k, v in bd.seconds_by_name.items():
            by_name[k] = by_name.get(k, 0.0) + v
    return KernelBreakdown(seconds_by_kind=by_kind, seconds_by_name=by_name,
                           host_s=sum(bd.host_s for bd in parts), launch_floor_s=sum(bd.launch_floor_s for bd in parts))


def _simulate_disaggregated(scenario: Scenario, *, efficiency: EfficiencyModel | None,
                            host: HostOverheadParams | None, limits: SimLimits, profile: EngineProfile | None,
                            progress: Callable[[int], None] | None, max_step_events: int,
                            prices: PriceCache | None, max_requests: int | None,
                            wrapper: EfficiencyWrapper | None = None,
                            models: EfficiencyModels | None = None) -> SimResult:
    """Prefill pool -> KV transfer -> decode pool (`sim.engine.disaggregated`). `efficiency` and
    `host`, when given, apply to both pools (a caller's single kernel model); `wrapper` wraps each
    pool's model with the pool's scenario. `profile`, when given, is the engine profile of each pool
    whose backend it is (of both when it is neither's, as an aggregated run takes it whatever its
    backend); a pool without it takes its backend's shipped profile."""
    disagg = scenario.disaggregation
    assert disagg is not None
    prefill_mem, decode_mem = (_check_pool(pool) for pool in disagg.pools())
    p_sc, d_sc = disagg.prefill.scenario, disagg.decode.scenario
    backends = (p_sc.engine.backend, d_sc.engine.backend)
    p_profile, d_profile = (
        profile if profile is not None and (profile.backend == backend or profile.backend not in backends)
        else load_engine_profile(backend) for backend in backends)
    (workload_seq,) = np.random.SeedSequence(scenario.seed).spawn(1)
    specs, class_ids = _draw_workload(scenario, workload_seq, p_sc.engine.max_model_len, max_requests)
    prefill = _rank_schedulers(p_sc, prefill_mem, p_profile, disagg.prefill.num_ranks(), limits)
    decode = _rank_schedulers(d_sc, decode_mem, d_profile, disagg.decode.num_ranks(), limits)
    full = request_states(specs, prefill[0].kv)
    # Prefill ranks run each prompt with one output token (the proxy's max_tokens=1).
    first = [RequestState(request_id=s.request_id, prompt_tokens=s.prompt_tokens, output_tokens=1,
                          arrival_s=s.arrival_s, keys=s.keys, segments=s.segments) for s in full]
    for s in full:
        s.keys = ()  # the decode phase takes its prompt KV from the transfer, not the prefix cache
    p_pricer = _pool_pricer(p_sc, p_profile, efficiency, host, prices, wrapper, models, limits)
    d_pricer = _pool_pricer(d_sc, d_profile, efficiency, host, prices, wrapper, models, limits)
    path = transfer_path(disagg)
    step_log = StepLog(max_step_events) if max_step_events > 0 else None
    sim = DisaggregatedSimulation(
        prefill=_pool_replicas(p_sc, prefill, disagg.prefill.num_workers, prefill_pool=True),
        decode=_pool_replicas(d_sc, decode, disagg.decode.num_workers), prefill_pricer=p_pricer, decode_pricer=d_pricer,
        prefill_router=p_sc.engine.router, decode_router=d_sc.engine.router, path=path, decode_states=full,
        max_concurrency=scenario.workload.max_concurrency, limits=limits, progress=progress, step_log=step_log,
        client_latency_s=(latency := client_latency_s(p_sc.engine, host or p_profile.host)),
        prefill_token=PREFILL_TOKEN[d_sc.engine.backend])
    records = sim.run(first)
    gpu_prices = [scenario_price_per_gpu_hour_usd(pool.scenario) for pool in disagg.pools()]
    num_gpus = disagg.num_gpus()
    price = None
    if all(p is not None for p in gpu_prices):
        price = sum(p * pool.num_gpus() for p, pool in zip(gpu_prices, disagg.pools(), strict=True)
                    if p is not None) / num_gpus
    worst = max(p_pricer.worst_provenance, d_pricer.worst_provenance)
    summary = summarize(
        records, num_requests=len(specs), itl=sim.itl, slo=scenario.slo, kv_usage=sim.kv_trace,
        num_preemptions=sim.num_preemptions(),
        prefix_query_tokens=sum(r.kv.num_prefix_queries_tokens for r in prefill),
        prefix_hit_tokens=sum(r.kv.num_prefix_hit_tokens for r in prefill),
        num_gpus=num_gpus, price_per_gpu_hour_usd=price, num_steps=sim.num_steps,
        truncated=sim.truncated, worst_provenance=worst.label(),
    )
    p_busy, d_busy = sim.pool_busy_s()
    p_pre, d_pre = sim.pool_preemptions()
    engine_duration_s = max(summary.duration_s - latency, 0.0)  # the summary's ends at the client's last finish
    pools = tuple(
        pool_summary(pool=pool.name, hardware=pool.scenario.hardware.name, num_workers=pool.num_workers,
                     num_ranks=pool.num_ranks(), num_gpus=pool.num_gpus(), busy_s=busy,
                     duration_s=engine_duration_s, queue_delay_s=queue, kv_usage=usage, num_preemptions=pre)
        for pool, busy, queue, usage, pre in (
            (disagg.prefill, p_busy, sim.prefill_queue_s, sim.prefill_kv_trace, p_pre),
            (disagg.decode, d_busy, sim.decode_queue_s, sim.kv_trace, d_pre)))
    breakdowns = (("prefill", _breakdown(p_pricer)), ("decode", _breakdown(d_pricer)))
    prefill_kv = tuple(sorted(sim.prefill_kv_trace.series()))
    kv_usage = prefill_kv + sim.kv_usage
    classes = () if class_ids is None else class_summaries(
        records, class_ids, scenario.workload.classes, slo=scenario.slo, duration_s=summary.duration_s)
    return SimResult(
        summary=summary, classes=classes, breakdown=_sum_breakdowns([bd for _, bd in breakdowns]),
        records=tuple(records), kv_usage=kv_usage, memory=decode_mem,
        kv_usage_bucket_s=max(sim.prefill_kv_trace.bucket_s, sim.kv_trace.bucket_s),
        kv_usage_prefill_pairs=len(prefill_kv),
        scenario_hash=scenario.scenario_hash(), sim_version=__version__,
        steps=step_log.records() if step_log is not None else (),
        num_steps_not_logged=step_log.num_dropped_steps if step_log is not None else 0,
        pools=pools, pool_breakdowns=breakdowns,
        transfer=transfer_summary(connector=disagg.connector, link=path.link_name, transfer_s=sim.transfer_s,
                                  transfer_bytes=sim.transfer_bytes),
        replica_pools=tuple(sim.replica_pools()),
        api_server_latency_s=latency,
    )
