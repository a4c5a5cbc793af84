"""Workload rules against `vllm bench serve`: evenly spaced arrivals (`burstiness = inf`), `ignore_eos`,
trace prefix groups, and the longest request of several traffic classes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.serde import FieldError
from sim.specs.traffic import TrafficClass
from sim.specs.workload import WorkloadSpec
from sim.workload.arrivals import sample_arrivals_s
from sim.workload.traces import read_trace


def test_infinite_burstiness_spaces_arrivals_evenly() -> None:
    """vLLM's `get_request`: with burstiness inf every gap is 1 / rate (before 2026-12-02 refused)."""
    arrivals = sample_arrivals_s(5, 2.0, math.inf, np.random.default_rng(0))
    assert arrivals.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]
    WorkloadSpec(burstiness=math.inf, request_rate=2.0)  # accepted


def test_ignore_eos_false_is_refused_not_ignored() -> None:
    with pytest.raises(FieldError, match="must be true"):
        WorkloadSpec(ignore_eos=False)


def test_a_trace_prefix_group_past_the_id_space_is_a_row_error(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("input_tokens,output_tokens,prefix_group,prefix_tokens\n100,10,5000000000,50\n")
    with pytest.raises(ConfigError) as err:
        read_trace(path)
    assert "row 1" in err.value.source and err.value.key == "prefix_group" and "4294967295" in err.value.rule


def test_the_longest_request_of_several_classes_is_one_class_long() -> None:
    """A 20,000-token prompt class and a 20,000-token output class never make a 40,000-token request
    (before 2026-12-02 the feasibility check asked the KV cache for the longest prompt of one class
    plus the longest output of another)."""
    spec = WorkloadSpec(classes=(TrafficClass(name="rag", share=1.0, input_len=20_000, output_len=16),
                                 TrafficClass(name="gen", share=1.0, input_len=16, output_len=20_000)))
    assert spec.max_request_tokens() == 20_016


def test_a_possible_empty_random_prompt_is_refused_on_load() -> None:
    # `generate` refuses it at run time; `kernelsight check` (load_scenario) must too.
    from conftest import REPO

    from sim.api import load_scenario

    with pytest.raises(ConfigError) as info:
        load_scenario(str(REPO / "scenarios" / "llama3_8b-h100.toml"),
                      {"workload.random_input_len": 1, "workload.random_range_ratio": 0.5})
    assert info.value.key == "workload.random_input_len"
