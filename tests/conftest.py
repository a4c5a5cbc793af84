"""Shared builders for tests: toy hardware with round numbers and small scenarios."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sim.measured import measured_data_root
from sim.specs.hardware import HardwareSpec, LinkSpec

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
"""The upstream snapshot the vendored copy comes from; absent on a fresh clone (tests needing it skip)."""
MEASURED_DATA = measured_data_root()
"""The measured data shipped in the package (sim/data/measured, upstream layout, tables as .csv.xz)."""


def toy_hardware(**overrides: Any) -> HardwareSpec:
    """1 TFLOP/s bf16, 1 GB/s HBM, 1 GB/s links: times are easy to compute by hand."""
    fields: dict[str, Any] = dict(
        name="toy", description="toy", vendor="toy", num_sms=100, l2_cache_bytes=1 << 20,
        boost_clock_hz=1e9, hbm_bandwidth_bytes_per_s=1e9, hbm_capacity_bytes=80 << 30, power_w=100.0,
        num_gpus_per_node=8, pcie_bandwidth_bytes_per_s=1e9,
        peak_flops_per_s={"bf16": 1e12, "fp16": 1e12, "fp8": 2e12},
        intra_node_link=LinkSpec(kind="nvlink", bandwidth_bytes_per_s=1e9, latency_s=0.0),
        inter_node_link=LinkSpec(kind="infiniband", bandwidth_bytes_per_s=1e8, latency_s=0.0),
    )
    fields.update(overrides)
    return HardwareSpec(**fields)


def scenario_dict(**sections: Mapping[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "seed": 0,
        "hardware": {"name": "h100_sxm"},
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "engine": {"max_model_len": 8192},
        "workload": {"num_prompts": 10, "random_input_len": 128, "random_output_len": 16},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return base


@pytest.fixture
def repo() -> Path:
    return REPO
