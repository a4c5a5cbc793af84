"""Composition root: load a scenario, check it can run, price a step.

This is the public entry point the CLI and the orchestrator call; file access for scenarios
happens here and in `sim.specs.catalog`, never inside the simulation loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.errors import InfeasibleScenario
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelGraph
from sim.graph.memory import MemoryBreakdown, memory_breakdown
from sim.graph.transformer import build_step_graph
from sim.perf.efficiency import EfficiencyModel, RooflineEfficiency
from sim.perf.step import StepCostModel, StepTiming
from sim.specs.scenario import Scenario, load_scenario_file

_GIB = float(1 << 30)


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read, override, resolve and validate a scenario; raise `ConfigError` or `InfeasibleScenario`."""
    scenario = load_scenario_file(path, overrides)
    check_feasible(scenario)
    return scenario


def scenario_memory(scenario: Scenario) -> MemoryBreakdown:
    return memory_breakdown(scenario.model, scenario.engine, scenario.precision, scenario.hardware)


def check_feasible(scenario: Scenario) -> MemoryBreakdown:
    """Raise `InfeasibleScenario` when weights do not fit or one max-length request has no room."""
    mem = scenario_memory(scenario)
    engine = scenario.engine
    if mem.weight_bytes + mem.activation_peak_bytes + mem.runtime_overhead_bytes > mem.requested_bytes:
        raise InfeasibleScenario(
            source=scenario.source, key="engine.tensor_parallel_size", value=engine.tensor_parallel_size,
            rule=(f"{scenario.model.name} needs {mem.weight_bytes / _GIB:.2f} GiB of weights per GPU plus "
                  f"{(mem.activation_peak_bytes + mem.runtime_overhead_bytes) / _GIB:.2f} GiB of activations "
                  f"and runtime, over the {mem.requested_bytes / _GIB:.2f} GiB that "
                  f"gpu_memory_utilization={engine.gpu_memory_utilization} allows on {scenario.hardware.name}; "
                  "raise tensor/pipeline parallelism or quantize"))
    assert engine.max_model_len is not None
    if mem.kv_capacity_tokens() < min(engine.max_model_len, _longest_request(scenario)):
        raise InfeasibleScenario(
            source=scenario.source, key="engine.max_model_len", value=engine.max_model_len,
            rule=(f"the KV cache holds {mem.kv_capacity_tokens()} tokens per GPU "
                  f"({mem.kv_cache_bytes / _GIB:.2f} GiB), less than one request needs; lower "
                  "max_model_len or raise gpu_memory_utilization or parallelism"))
    return mem


def _longest_request(scenario: Scenario) -> int:
    w = scenario.workload
    if w.dataset_name in ("random", "fixed"):
        return w.max_input_tokens() + w.max_output_tokens()
    assert scenario.engine.max_model_len is not None
    return scenario.engine.max_model_len


def step_graph(scenario: Scenario, batch: BatchShape) -> KernelGraph:
    return build_step_graph(scenario.model, scenario.engine, scenario.precision, scenario.hardware, batch)


def predict_step(scenario: Scenario, batch: BatchShape, *, efficiency: EfficiencyModel | None = None) -> StepTiming:
    """Per-kernel prices of one step of `batch` on the scenario's hardware."""
    model = StepCostModel(scenario.hardware, efficiency or RooflineEfficiency())
    return model.cost(step_graph(scenario, batch))
