"""vLLM v1 keeps one of its `num_gpu_blocks` KV blocks as the null block; requests hold the others."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import check_feasible, simulate
from sim.errors import InfeasibleScenario
from sim.specs.scenario import scenario_from_dict


def _scenario(backend: str, prompt_tokens: int, output_tokens: int) -> Any:
    return scenario_from_dict(scenario_dict(
        engine={"max_model_len": 65536, "backend": backend, "gpu_memory_utilization": 0.24,
                "enable_prefix_caching": False},
        workload={"num_prompts": 2, "random_input_len": prompt_tokens, "random_output_len": output_tokens},
        perf={"tier": "roofline"}), source="t")


def test_vllm_requests_hold_all_blocks_but_the_null_block() -> None:
    mem = check_feasible(_scenario("vllm", 100, 100))
    assert mem.null_blocks == 1 and mem.usable_kv_blocks() == mem.num_kv_blocks - 1
    capacity = mem.kv_capacity_tokens()
    assert capacity == (mem.num_kv_blocks - 1) * mem.block_size < 65536
    # A request as large as the blocks left beside the null block runs; one that needs the null
    # block as well never fits, so the scenario check refuses it.
    result = simulate(_scenario("vllm", capacity - 1024, 1024))
    assert result.summary.num_completed == 2 and not result.summary.truncated
    with pytest.raises(InfeasibleScenario) as info:
        check_feasible(_scenario("vllm", capacity + mem.block_size - 1024, 1024))
    assert info.value.key == "engine.max_model_len"


def test_other_engines_hold_every_block() -> None:
    mem = check_feasible(_scenario("sglang", 100, 100))
    assert mem.null_blocks == 0 and mem.kv_capacity_tokens() == mem.num_kv_blocks * mem.block_size
