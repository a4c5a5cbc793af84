"""Host overhead by launch mode and async scheduling: the pure functions, with numbers by hand."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sim.perf.host import HostCost, HostOverheadParams, LinearCost, host_cost, launches_eagerly, step_time_s

PARAMS = HostOverheadParams(
    schedule=LinearCost(base_s=1e-3, per_item_s=1e-5),
    prepare_inputs=LinearCost(base_s=2e-3, per_item_s=2e-5),
    sampler=LinearCost(base_s=5e-4, per_item_s=1e-5),
    process_outputs=LinearCost(base_s=1e-4, per_item_s=1e-6),
    graph_launch_s=2e-5, eager_launch_s=5e-6, source="test",
)
# 10 sequences, 8 sampled: (1 + 0.1) + (2 + 0.2) + (0.5 + 0.08) + (0.1 + 0.01) ms
CPU_S = 3.99e-3


def _cost(mode: Any, *, num_seqs: int = 10, is_decode_only: bool = True) -> HostCost:
    return host_cost(params=PARAMS, mode=mode, num_seqs=num_seqs, num_sampled=8, is_decode_only=is_decode_only,
                     max_cudagraph_capture_size=16, num_launches=1000, num_layers=32, short_kernel_gap_s=4e-4)


def test_cpu_work_is_linear_in_sequences_and_sampled_tokens_in_every_mode() -> None:
    for mode in ("eager", "cuda_graph", "megakernel"):
        assert _cost(mode).cpu_s == pytest.approx(CPU_S, rel=1e-12)


def test_eager_pays_every_kernel_launch_and_the_gpu_idles_behind_short_kernels() -> None:
    cost = _cost("eager")
    assert cost.launch_s == pytest.approx(1000 * 5e-6, rel=1e-12)
    assert cost.launch_floor_s == 4e-4
    assert _cost("eager", is_decode_only=False) == cost  # whatever the batch


def test_cuda_graph_replays_one_graph_for_captured_decode_batches() -> None:
    at_capture = _cost("cuda_graph", num_seqs=16)  # 6 more sequences than CPU_S: 6 x (10 + 20 + 1) us
    assert at_capture.cpu_s == pytest.approx(CPU_S + 6 * 3.1e-5, rel=1e-12)
    assert (at_capture.launch_s, at_capture.launch_floor_s) == (2e-5, 0.0)
    assert (_cost("cuda_graph").launch_s, _cost("cuda_graph").launch_floor_s) == (2e-5, 0.0)


def test_cuda_graph_uncaptured_steps_launch_two_pieces_per_layer() -> None:
    # Decode batches over the capture size and steps with prefill chunks: piecewise graphs around
    # attention, 2 launches per layer, no eager launch gaps (sim/perf/host.py).
    for cost in (_cost("cuda_graph", num_seqs=17), _cost("cuda_graph", is_decode_only=False)):
        assert cost.launch_s == pytest.approx(2 * 32 * 2e-5, rel=1e-12)
        assert cost.launch_floor_s == 0.0


def test_megakernel_has_one_launch_and_no_gaps() -> None:
    for decode_only in (True, False):
        cost = _cost("megakernel", num_seqs=500, is_decode_only=decode_only)
        assert (cost.launch_s, cost.launch_floor_s) == (2e-5, 0.0)


def test_async_scheduling_hides_cpu_behind_the_gpu_and_sync_adds_it() -> None:
    host = _cost("eager")  # CPU 3.99 + 5 launch ms; GPU idles 0.4 ms behind launches
    assert step_time_s(device_s=10e-3, host=host, async_scheduling=True) == pytest.approx(10.4e-3, rel=1e-12)
    # Sync: the CPU's 3.99 ms, the first launch, then the GPU, the other launches overlapping it.
    assert step_time_s(device_s=10e-3, host=host, async_scheduling=False) == pytest.approx(
        3.99e-3 + 5e-6 + 10.4e-3, rel=1e-12)
    # A short GPU step: async costs the CPU side; sync the CPU work and the launches it waits for.
    assert step_time_s(device_s=1e-3, host=host, async_scheduling=True) == pytest.approx(8.99e-3, rel=1e-12)
    assert step_time_s(device_s=1e-3, host=host, async_scheduling=False) == pytest.approx(
        3.99e-3 + 5e-6 + (5e-3 - 5e-6), rel=1e-12)
    graph = _cost("cuda_graph")
    assert step_time_s(device_s=1e-3, host=graph, async_scheduling=False) == pytest.approx(
        1e-3 + 3.99e-3 + 2e-5, rel=1e-12)


def test_engines_that_capture_decode_only_launch_uncaptured_steps_kernel_by_kernel() -> None:
    # SGLang and TensorRT-LLM's PyTorch flow (`uncaptured_launch = "eager"`): a step with a prompt
    # chunk, or more decodes than the largest capture, launches each kernel; captured decodes replay.
    eager_rest = dataclasses.replace(PARAMS, uncaptured_launch="eager")

    def cost(**kw: Any) -> HostCost:
        return host_cost(params=eager_rest, mode="cuda_graph", num_sampled=8, max_cudagraph_capture_size=16,
                         num_launches=1000, num_layers=32, short_kernel_gap_s=4e-4, **kw)

    for uncaptured in (cost(num_seqs=10, is_decode_only=False), cost(num_seqs=17, is_decode_only=True)):
        assert uncaptured.launch_s == pytest.approx(1000 * 5e-6, rel=1e-12)
        assert uncaptured.launch_floor_s == 4e-4
    captured = cost(num_seqs=16, is_decode_only=True)
    assert (captured.launch_s, captured.launch_floor_s) == (2e-5, 0.0)
    for decode_only, seqs, expected in ((False, 10, True), (True, 17, True), (True, 16, False)):
        assert launches_eagerly(params=eager_rest, mode="cuda_graph", is_decode_only=decode_only, num_seqs=seqs,
                                max_cudagraph_capture_size=16) is expected
        assert launches_eagerly(params=PARAMS, mode="cuda_graph", is_decode_only=decode_only, num_seqs=seqs,
                                max_cudagraph_capture_size=16) is False
    assert launches_eagerly(params=PARAMS, mode="eager", is_decode_only=True, num_seqs=1, max_cudagraph_capture_size=16)
    assert not launches_eagerly(params=eager_rest, mode="megakernel", is_decode_only=False, num_seqs=1,
                                max_cudagraph_capture_size=16)


def test_shipped_profiles_launch_uncaptured_steps_as_their_engines_do() -> None:
    from sim.api import load_engine_profile

    launch = {b: load_engine_profile(b).host.uncaptured_launch for b in ("vllm", "sglang", "trtllm")}
    assert launch == {"vllm": "piecewise_graph", "sglang": "eager", "trtllm": "eager"}


def test_capture_size_bounds_tokens_in_vllm_and_requests_in_sglang_and_trtllm() -> None:
    # A decode-only step of 10 requests verifying 3 drafts each: 40 scheduled tokens, capture size 16.
    # vLLM pads tokens to a capture size (over it: not captured); SGLang's `CudaGraphRunner.can_run`
    # and TensorRT-LLM's graph key compare the batch size (10 <= 16: the graph replays).
    per_request = dataclasses.replace(PARAMS, uncaptured_launch="eager", graph_capture_unit="requests")
    per_token = dataclasses.replace(PARAMS, uncaptured_launch="eager")
    kw: dict[str, Any] = dict(mode="cuda_graph", is_decode_only=True, num_seqs=10, max_cudagraph_capture_size=16,
                              num_tokens=40)
    assert launches_eagerly(params=per_token, **kw)
    assert not launches_eagerly(params=per_request, **kw)
    cost = host_cost(params=per_request, num_sampled=10, num_launches=1000, num_layers=32, short_kernel_gap_s=4e-4,
                     **kw)
    assert (cost.launch_s, cost.launch_floor_s) == (2e-5, 0.0)
    assert launches_eagerly(params=per_request, **{**kw, "num_seqs": 17, "num_tokens": 68})


def test_shipped_profiles_count_graph_captures_as_their_engines_do() -> None:
    from sim.api import load_engine_profile

    unit = {b: load_engine_profile(b).host.graph_capture_unit for b in ("vllm", "sglang", "trtllm")}
    assert unit == {"vllm": "tokens", "sglang": "requests", "trtllm": "requests"}
