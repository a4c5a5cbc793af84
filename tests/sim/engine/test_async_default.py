"""`[engine] async_scheduling` left unset runs the engine's own default (its profile's), not "off"."""

from __future__ import annotations

from typing import Any

import pytest

from sim.api import load_engine_profile, resolved_async_scheduling, simulate
from sim.perf.profile import EngineDefaults
from sim.serde import FieldError
from sim.specs.scenario import Scenario, scenario_from_dict
from tests.conftest import scenario_dict

EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 2, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}


def _scenario(**engine: Any) -> Scenario:
    return scenario_from_dict(scenario_dict(engine=engine, perf={"tier": "roofline"}), source="test")


@pytest.mark.parametrize(("engine", "expected"), [
    ({"backend": "vllm"}, True),  # on by default since vLLM 0.14 (vllm-project/vllm#27614)
    ({"backend": "sglang"}, True),  # SGLang's overlap scheduler
    ({"backend": "trtllm"}, True),  # TensorRT-LLM's overlap scheduler
    ({"backend": "vllm", "speculative_config": EAGLE3}, True),
    ({"backend": "vllm", "speculative_config": NGRAM}, False),  # vllm-project/vllm#31998
    ({"backend": "sglang", "speculative_config": EAGLE3}, False),  # overlap needs SGLang's SpecV2
    ({"backend": "trtllm", "async_scheduling": False}, False),
    ({"backend": "sglang", "speculative_config": EAGLE3, "async_scheduling": True}, True),
])
def test_unset_async_scheduling_is_the_engines_default(engine: dict[str, Any], expected: bool) -> None:
    sc = _scenario(**engine)
    assert resolved_async_scheduling(sc.engine, load_engine_profile(sc.engine.backend)) is expected


def test_a_trtllm_run_left_unset_overlaps_as_trtllm_does() -> None:
    """Before, an unset key meant synchronous steps whatever the backend: TensorRT-LLM's TPOT came out
    with every step's host work added (~15% on this run), though its overlap scheduler is on by default."""
    unset = simulate(_scenario(backend="trtllm")).summary
    on = simulate(_scenario(backend="trtllm", async_scheduling=True)).summary
    off = simulate(_scenario(backend="trtllm", async_scheduling=False)).summary
    assert unset == on
    assert unset.tpot_median_s < off.tpot_median_s


def test_a_profile_names_only_speculative_methods_that_exist() -> None:
    with pytest.raises(FieldError, match="sync_with_speculative"):
        EngineDefaults(sync_with_speculative=("medusa",))
