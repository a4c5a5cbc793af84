"""vLLM's MLA backends run a one-token prompt chunk (a full prefix-cache hit, a disaggregated decode
worker's admission) with the decodes, absorbed over the latent cache, not as a decompressed prefill."""

from __future__ import annotations

from typing import Any

import pytest

from sim.api import load_host_params, step_graph
from sim.engine.pricer import StepPricer
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind
from sim.perf.efficiency import RooflineEfficiency
from sim.perf.step import StepCostModel
from sim.serving.request import RequestState
from sim.serving.scheduler import ScheduledChunk, StepPlan
from sim.specs.scenario import Scenario, scenario_from_dict
from tests.conftest import scenario_dict


def _scenario(backend: str, **engine: Any) -> Scenario:
    return scenario_from_dict(scenario_dict(
        hardware={"name": "h200_sxm"}, model={"name": "deepseek-ai/DeepSeek-R1"},
        engine={"tensor_parallel_size": 8, "kv_cache_dtype": "fp8", "backend": backend, **engine},
        perf={"tier": "roofline"}), source="test")


MIXED = BatchShape(prefills=(PrefillChunk(new_tokens=1, context_tokens=8000),) * 4,
                   decode_context_tokens=(8000,) * 32)
DECODES = BatchShape(decode_context_tokens=(8000,) * 36)


def _kinds(sc: Scenario, batch: BatchShape) -> list[tuple[str, KernelKind, int]]:
    return [(n.work.name, n.work.kind, n.repeat) for n in step_graph(sc, batch).nodes]


def test_vllm_runs_one_token_chunks_with_the_decodes() -> None:
    sc = _scenario("vllm")
    assert step_graph(sc, MIXED).nodes == step_graph(sc, DECODES).nodes
    # Before 2026-12-02 each chunk decompressed its 8,000 cached tokens (`mla_kv_b_proj`) and ran
    # the prefill kernel: the mixed step cost ~1.5x the all-decode one.
    assert not any(kind is KernelKind.MLA_PREFILL for _, kind, _ in _kinds(sc, MIXED))


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_other_engines_keep_the_prefill_path(backend: str) -> None:
    kinds = _kinds(_scenario(backend), MIXED)
    assert any(kind is KernelKind.MLA_PREFILL for _, kind, _ in kinds)
    assert any(name == "mla_kv_b_proj" for name, _, _ in kinds)


def _pricer(sc: Scenario) -> StepPricer:
    return StepPricer(sc, StepCostModel(sc.hardware, RooflineEfficiency()), load_host_params(sc.engine.backend))


def _chunk(context: int, samples: bool = True) -> ScheduledChunk:
    req = RequestState(request_id=0, prompt_tokens=context + 1, output_tokens=8, arrival_s=0.0, keys=())
    return ScheduledChunk(request=req, num_new_tokens=1, num_context_tokens=context, samples=samples)


def test_the_pricer_keys_a_sampling_one_token_chunk_as_a_decode() -> None:
    plan = StepPlan(step_id=1, chunks=(_chunk(8000),), num_prefix_hit_tokens=0, preempted=(),
                    num_bulk_decodes=3, bulk_decode_context_tokens=3 * 8000)
    assert _pricer(_scenario("vllm")).key(plan) == ((), 4, 8000)
    assert _pricer(_scenario("sglang")).key(plan) == (((1, 8000, True),), 3, 8000)
    # A one-token chunk that does not finish its prompt samples nothing: it stays a chunk (its
    # attention still priced as a decode's, `PartBook.prefill`).
    cut = plan._replace(chunks=(_chunk(8000, samples=False),))
    assert _pricer(_scenario("vllm")).key(cut) == (((1, 8000, False),), 3, 8000)
