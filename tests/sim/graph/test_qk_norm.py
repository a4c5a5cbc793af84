"""MiniMax-M2's q/k norms run over all heads: with tensor parallelism the ranks all-reduce them."""

from __future__ import annotations

import pytest
from conftest import scenario_dict

from sim.api import step_graph
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelKind
from sim.specs.scenario import scenario_from_dict


@pytest.mark.parametrize(("model", "tp", "expected"), [
    ("MiniMaxAI/MiniMax-M2.5", 4, 62),  # qk_norm_type = "per_layer": one all-reduce per layer
    ("MiniMaxAI/MiniMax-M2.5", 1, 0),
    ("Qwen/Qwen3-32B", 4, 0),  # per-head norms: each rank normalises its own heads
])
def test_norms_over_all_heads_all_reduce_their_variances(model: str, tp: int, expected: int) -> None:
    """vLLM's `MiniMaxText01RMSNormTP.forward_qk` sums each token's q and k variances over the TP ranks
    before it normalises (before 2026-12-02 priced as a local norm: ~0.6 ms a step short at TP4 on H200)."""
    sc = scenario_from_dict(scenario_dict(hardware={"name": "h200_sxm"}, model={"name": model},
                                          engine={"tensor_parallel_size": tp, "max_model_len": 8192}), source="t")
    nodes = [n for n in step_graph(sc, BatchShape(decode_context_tokens=(1000,) * 32)).nodes
             if n.work.name == "qk_norm_all_reduce"]
    assert sum(n.repeat for n in nodes) == expected
    for n in nodes:
        assert n.work.kind is KernelKind.ALL_REDUCE and n.work.comm_bytes == 32 * 2 * 4 and n.work.group_size == tp
