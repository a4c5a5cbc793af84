"""Roofline pricing on toy hardware, computed by hand."""

from __future__ import annotations

import pytest
from conftest import toy_hardware

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, gemm_work
from sim.graph.transformer import collective_work
from sim.perf.roofline import Bound, collective_wire_bytes, roofline


def test_square_gemm_is_compute_bound_on_toy_device() -> None:
    work = gemm_work("g", 4096, 4096, 4096, weight_dtype=DType.BFLOAT16, act_dtype=DType.BFLOAT16,
                     compute_dtype=DType.BFLOAT16)
    rf = roofline(work, toy_hardware())
    assert rf.compute_s == pytest.approx(2 * 4096**3 / 1e12)
    assert rf.memory_s == pytest.approx(2 * 3 * 4096**2 / 1e9)
    assert rf.bound() is Bound.COMPUTE  # 0.137 s of math vs 0.101 s of traffic


def test_decode_gemm_is_memory_bound_and_reads_weights_once() -> None:
    work = gemm_work("g", 1, 1000, 1000, weight_dtype=DType.BFLOAT16, act_dtype=DType.BFLOAT16,
                     compute_dtype=DType.BFLOAT16)
    assert work.weight_bytes == 2_000_000
    assert work.activation_bytes == 2 * (1000 + 1000)
    rf = roofline(work, toy_hardware())
    assert rf.memory_s == pytest.approx((2_000_000 + 4000) / 1e9)
    assert rf.bound() is Bound.MEMORY


def test_fp8_gemm_uses_fp8_peak() -> None:
    work = gemm_work("g", 8, 8, 8, weight_dtype=DType.FP8, act_dtype=DType.BFLOAT16, compute_dtype=DType.FP8)
    assert roofline(work, toy_hardware()).compute_s == pytest.approx(2 * 512 / 2e12)


def test_unsupported_format_runs_at_16_bit_rate() -> None:
    hw = toy_hardware(peak_flops_per_s={"bf16": 1e12})
    work = gemm_work("g", 8, 8, 8, weight_dtype=DType.FP8, act_dtype=DType.BFLOAT16, compute_dtype=DType.FP8)
    assert roofline(work, hw).compute_s == pytest.approx(2 * 512 / 1e12)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [(KernelKind.ALL_REDUCE, 2 * 3 / 4 * 1e6), (KernelKind.ALL_GATHER, 3 / 4 * 1e6),
     (KernelKind.ALL_TO_ALL, 3 / 4 * 1e6), (KernelKind.SEND_RECV, 1e6)],
)
def test_ring_collectives_send_textbook_bytes(kind: KernelKind, expected: float) -> None:
    assert collective_wire_bytes(kind, 1e6, 4) == pytest.approx(expected)


def test_collective_over_the_node_boundary_uses_inter_node_link() -> None:
    hw = toy_hardware()
    inside = roofline(collective_work(KernelKind.ALL_REDUCE, "ar", 1e6, 8), hw)
    across = roofline(collective_work(KernelKind.ALL_REDUCE, "ar", 1e6, 16), hw)
    assert inside.network_s == pytest.approx(2 * 7 / 8 * 1e6 / 1e9)
    assert across.network_s == pytest.approx(2 * 15 / 16 * 1e6 / 1e8)
    assert across.bound() is Bound.NETWORK


def test_roofline_is_monotone_in_flops_and_bytes() -> None:
    hw = toy_hardware()
    small = gemm_work("g", 64, 64, 64, weight_dtype=DType.BFLOAT16, act_dtype=DType.BFLOAT16,
                      compute_dtype=DType.BFLOAT16)
    big = gemm_work("g", 128, 64, 64, weight_dtype=DType.BFLOAT16, act_dtype=DType.BFLOAT16,
                    compute_dtype=DType.BFLOAT16)
    assert roofline(big, hw).time_s() > roofline(small, hw).time_s()
