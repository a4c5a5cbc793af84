"""Decode attention nodes from contexts counted per value ({context: requests}) are the sum of the
requests' own nodes: the counted form's batch, KV rows read, FLOPs and bytes add up request by
request, and its longest span is the longest request's (the block pricer builds a decode family's
nodes at a batch size without a tuple of that many contexts)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from conftest import scenario_dict

from sim.graph.kernels import KernelKind
from sim.graph.transformer import decode_attention_nodes
from sim.specs.scenario import scenario_from_dict

MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": {},
    "mistralai/Mistral-7B-v0.1": {"max_attention_window": 4096},  # sliding window: spans capped
    "openai/gpt-oss-120b": {},  # alternating windowed and full layers
    "deepseek-ai/DeepSeek-R1": {"tensor_parallel_size": 8},  # MLA
    "zai-org/GLM-5": {"tensor_parallel_size": 8},  # MLA with DSA's top-k cap
    "Qwen/Qwen3.5-397B-A17B": {"tensor_parallel_size": 8},  # linear attention layers
}
ADDITIVE = ("flops", "activation_bytes", "kv_read_bytes", "kv_write_bytes")
ATTENTION = (KernelKind.ATTN_DECODE, KernelKind.MLA_DECODE)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_counted_contexts_add_up_request_by_request(model: str) -> None:
    d = scenario_dict(hardware={"name": "h200_sxm"}, model={"name": model},
                      engine={"max_model_len": 16384, **MODELS[model]},
                      workload={"num_prompts": 4, "request_rate": 1.0, "random_input_len": 64,
                                "random_output_len": 8})
    sc = scenario_from_dict(d, source="t")
    rng = random.Random(7)
    cases = [(c,) * n for c, n in ((0, 1), (1, 3), (700, 5), (4095, 2), (4096, 9), (12000, 64))]
    cases += [tuple(rng.choice((5, 300, 2047, 4100, 9000, 15000)) for _ in range(rng.randint(1, 40)))
              for _ in range(20)]
    for contexts in cases:
        counted = decode_attention_nodes(sc.model, sc.engine, sc.precision, dict(Counter(contexts)))
        assert counted == decode_attention_nodes(sc.model, sc.engine, sc.precision, contexts)
        alone = [decode_attention_nodes(sc.model, sc.engine, sc.precision, {c: 1}) for c in contexts]
        for i, (work, repeat) in enumerate(counted):
            if work.kind not in ATTENTION:
                continue
            singles = [nodes[i][0] for nodes in alone]
            assert all(nodes[i][1] == repeat for nodes in alone)
            for name in ADDITIVE:
                assert getattr(work, name) == sum(getattr(w, name) for w in singles), (contexts, name)
            assert work.shape[0] == len(contexts)
            assert work.shape[2] == max(w.shape[2] for w in singles)
