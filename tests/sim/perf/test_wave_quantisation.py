"""Library-kernel wave quantisation per SM generation (sim.perf.kernel_features), hand-computed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sim.perf.kernel_features import (
    SCALAR,
    VECTOR,
    decode_ctas,
    gemm_work_units,
    prefill_ctas,
    wave_efficiency,
)


@pytest.mark.parametrize(("m", "n", "k", "sms", "sm", "units"), [
    # Hopper, large m: 128 x 256 tiles, 4096/128 x 4096/256 = 32 x 16 = 512 (more than a wave: no split).
    (4096, 4096, 4096, 132, 90, 512.0),
    # Ampere, large m: 128 x 128 tiles, 32 x 32 = 1024.
    (4096, 4096, 4096, 108, 80, 1024.0),
    # sm120 has no 2-SM MMA: 128 x 128 like Ampere.
    (4096, 4096, 4096, 188, 120, 1024.0),
    # Small m: one 64-row tile x 4096/128 = 32 tiles; split-K floor(132 / 32) = 4 (<= 4096 / 256).
    (16, 4096, 4096, 132, 90, 128.0),
    # Split-K capped by K: 32 tiles, floor(132 / 32) = 4 but K = 512 allows only 2 splits.
    (16, 4096, 512, 132, 90, 64.0),
    # m = 128 on Hopper keeps 128-column tiles (256 only above 128 rows): 1 x 32, split 4.
    (128, 4096, 4096, 132, 90, 128.0),
])
def test_gemm_work_units(m: int, n: int, k: int, sms: int, sm: int, units: float) -> None:
    assert gemm_work_units(SCALAR, float(m), float(n), float(k), float(sms), sm) == units
    vec = gemm_work_units(VECTOR, np.array([float(m)]), np.array([float(n)]), np.array([float(k)]), float(sms), sm)
    assert vec[0] == units


def test_wave_efficiency_counts_the_tail_wave() -> None:
    # 512 CTAs on 132 SMs: 4 waves, 512 / 528 of the SM-time works.
    assert wave_efficiency(SCALAR, 512.0, 132.0) == pytest.approx(512 / 528)
    assert wave_efficiency(SCALAR, 132.0, 132.0) == 1.0
    assert wave_efficiency(SCALAR, 133.0, 132.0) == pytest.approx(133 / 264)


def test_prefill_ctas_query_blocks_per_generation() -> None:
    p = {"batch": 2.0, "heads": 32.0, "seq": 1000.0, "head_dim": 128.0}
    assert prefill_ctas(SCALAR, p, 80) == 2 * 32 * math.ceil(1000 / 128)
    # FA3 on Hopper at head_dim 64: 192-query blocks.
    assert prefill_ctas(SCALAR, {**p, "head_dim": 64.0}, 90) == 2 * 32 * math.ceil(1000 / 192)
    # Ada at head_dim 256: 64-query blocks.
    assert prefill_ctas(SCALAR, {**p, "head_dim": 256.0}, 89) == 2 * 32 * math.ceil(1000 / 64)


def test_decode_splits_fill_one_wave() -> None:
    p = {"batch": 1.0, "kv_heads": 8.0, "kv": 4096.0, "head_dim": 128.0}
    # 8 (sequence, KV head) pairs on 132 SMs: floor(132 / 8) = 16 splits (32 KV blocks allow it).
    assert decode_ctas(SCALAR, p, 132.0) == 8 * 16
    # Short KV: 300 tokens = 3 blocks of 128, so at most 3 splits.
    assert decode_ctas(SCALAR, {**p, "kv": 300.0}, 132.0) == 8 * 3
    # batch x KV heads >= 0.8 x SMs: no split.
    assert decode_ctas(SCALAR, {**p, "batch": 14.0}, 132.0) == 14 * 8
    vec = decode_ctas(VECTOR, {key: np.array([v, v]) for key, v in p.items()}, 132.0)
    assert list(vec) == [128.0, 128.0]
