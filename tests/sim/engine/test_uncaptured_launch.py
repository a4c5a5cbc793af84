"""Engines that capture CUDA graphs for decode batches only launch their other steps kernel by kernel."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import scenario_dict

from sim.api import load_host_params, scenario_efficiency, simulate
from sim.engine.pricer import StepPricer
from sim.perf.host import HostOverheadParams
from sim.perf.step import StepCostModel
from sim.specs.scenario import Scenario, scenario_from_dict

PREFILL = (((700, 0, True),), 0, 0)
"""A step key: one 700-token prompt chunk, no decodes."""
MIXED = (((300, 0, True),), 6, 512)
DECODE = ((), 6, 512)


def _scenario(launch_mode: str) -> Scenario:
    return scenario_from_dict(scenario_dict(engine={"launch_mode": launch_mode, "max_cudagraph_capture_size": 8}),
                              source="t")


def _step_s(launch_mode: str, host: HostOverheadParams, key: object) -> float:
    sc = _scenario(launch_mode)
    return StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), host).step_s(key)  # type: ignore[arg-type]


def _hosts() -> tuple[HostOverheadParams, HostOverheadParams]:
    # A launch cost large enough to show: 60 us a kernel, piecewise graphs 20 us a piece.
    piecewise = dataclasses.replace(load_host_params("vllm"), eager_launch_s=60e-6, graph_launch_s=20e-6)
    return piecewise, dataclasses.replace(piecewise, uncaptured_launch="eager")


@pytest.mark.parametrize("key", [PREFILL, MIXED, ((), 9, 512)])  # 9 decodes: over the capture size of 8
def test_uncaptured_steps_cost_what_an_eager_engine_pays(key: object) -> None:
    piecewise, eager_rest = _hosts()
    uncaptured = _step_s("cuda_graph", eager_rest, key)
    assert uncaptured == _step_s("eager", eager_rest, key)
    assert uncaptured > _step_s("cuda_graph", piecewise, key)


def test_captured_decode_steps_replay_their_graph_either_way() -> None:
    piecewise, eager_rest = _hosts()
    assert _step_s("cuda_graph", eager_rest, DECODE) == _step_s("cuda_graph", piecewise, DECODE)
    assert _step_s("cuda_graph", eager_rest, DECODE) < _step_s("eager", eager_rest, DECODE)


def test_an_eager_prefill_delays_the_first_token() -> None:
    sc = scenario_from_dict(scenario_dict(workload={"dataset_name": "fixed", "num_prompts": 1, "random_input_len": 700,
                                                    "random_output_len": 4}), source="t")
    piecewise, eager_rest = _hosts()
    ttft = {name: simulate(sc, host=h).summary.ttft_mean_s for name, h in (("piecewise", piecewise),
                                                                           ("eager", eager_rest))}
    # The API server's latency (outside the engine) is on top of the eager prefill step.
    assert ttft["eager"] == pytest.approx(_step_s("cuda_graph", eager_rest, PREFILL) + eager_rest.api_server_latency_s,
                                          rel=1e-12)
    assert ttft["eager"] > ttft["piecewise"]


def test_sglang_verification_steps_replay_the_graph_of_their_batch_size() -> None:
    # 65 decodes verifying 3 drafts: 260 tokens over SGLang's cap of 256, but 65 requests within it,
    # and SGLang keys its decode graphs by batch size: the step costs what a larger cap would give.
    def step(capture: int) -> float:
        engine = {"backend": "sglang", "max_cudagraph_capture_size": capture,
                  "speculative_config": {"method": "eagle3", "num_speculative_tokens": 3,
                                         "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}
        sc = scenario_from_dict(scenario_dict(engine=engine), source="t")
        pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("sglang"))
        return pricer.step_s(((), 65, 512))  # type: ignore[arg-type]

    assert step(256) == step(4096)
    assert step(64) > step(256)  # 65 requests over a cap of 64: every kernel launched
