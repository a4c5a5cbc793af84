"""Synthetic workloads: exact small cases, vLLM length bounds, arrival statistics, determinism."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.specs.workload import WorkloadSpec, length_bounds
from sim.workload.arrivals import sample_arrivals_s
from sim.workload.generate import generate
from sim.workload.requests import UNIQUE_CONTENT_BASE, RequestSpec, Segment

REPO = Path(__file__).resolve().parents[3]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def _gaps_s(requests: tuple[RequestSpec, ...]) -> np.ndarray:
    return np.diff(np.array([0.0] + [r.arrival_s for r in requests]))


def test_fixed_lengths_at_infinite_rate_are_exact() -> None:
    spec = WorkloadSpec(dataset_name="fixed", num_prompts=4, random_input_len=100,
                        random_output_len=10)
    requests = generate(spec, _rng())
    assert requests == tuple(
        RequestSpec(request_id=i, arrival_s=0.0, prompt_tokens=100, output_tokens=10,
                    segments=(Segment(content_id=UNIQUE_CONTENT_BASE + i, num_tokens=100),))
        for i in range(4)
    )


def test_infinite_rate_sends_everything_at_zero() -> None:
    spec = WorkloadSpec(num_prompts=50, random_range_ratio=0.5)
    assert {r.arrival_s for r in generate(spec, _rng())} == {0.0}


def test_length_bounds_follow_vllm_floor_and_ceil() -> None:
    assert length_bounds(100, 0.25, min_tokens=0) == (75, 125)
    assert length_bounds(10, 0.25, min_tokens=1) == (7, 13)
    assert length_bounds(1024, 0.1, min_tokens=0) == (921, 1127)
    # vLLM computes in float: 100 * 1.1 = 110.00000000000001, so the top is 111.
    assert length_bounds(100, 0.1, min_tokens=0) == (90, 111)
    assert length_bounds(1, 0.5, min_tokens=1) == (1, 2)


def test_longest_synthetic_request_uses_the_same_bounds_as_sampling() -> None:
    # 1024 x 1.9 = 1945.6: the sampler can draw 1946, so the scenario checks must allow for it.
    spec = WorkloadSpec(num_prompts=20_000, random_input_len=1024, random_output_len=256,
                        random_range_ratio=0.9, random_prefix_len=10)
    assert (spec.max_input_tokens(), spec.max_output_tokens()) == (10 + 1946, 487)
    requests = generate(spec, _rng())
    assert max(r.prompt_tokens for r in requests) == spec.max_input_tokens()
    assert max(r.output_tokens for r in requests) == spec.max_output_tokens()


def test_fixed_lengths_ignore_the_range_ratio_in_the_longest_request() -> None:
    spec = WorkloadSpec(dataset_name="fixed", random_input_len=100, random_output_len=10,
                        random_range_ratio=0.5)
    assert (spec.max_input_tokens(), spec.max_output_tokens()) == (100, 10)


def test_random_lengths_cover_exactly_the_inclusive_range() -> None:
    spec = WorkloadSpec(num_prompts=20_000, random_input_len=100, random_output_len=10,
                        random_range_ratio=0.25)
    requests = generate(spec, _rng())
    inputs = np.array([r.prompt_tokens for r in requests])
    outputs = np.array([r.output_tokens for r in requests])
    assert (inputs.min(), inputs.max()) == (75, 125)
    assert (outputs.min(), outputs.max()) == (7, 13)
    assert abs(inputs.mean() - 100) < 1.0


def test_zero_ratio_random_equals_the_set_length() -> None:
    spec = WorkloadSpec(num_prompts=10, random_input_len=64, random_output_len=8)
    assert {(r.prompt_tokens, r.output_tokens) for r in generate(spec, _rng())} == {(64, 8)}


def test_a_possible_empty_prompt_is_rejected() -> None:
    spec = WorkloadSpec(num_prompts=10, random_input_len=1, random_range_ratio=0.5)
    with pytest.raises(ConfigError) as info:
        generate(spec, _rng())
    assert info.value.key == "random_input_len"


def test_prefix_groups_share_the_first_segment_round_robin() -> None:
    spec = WorkloadSpec(dataset_name="fixed", num_prompts=7, random_input_len=8,
                        random_output_len=2, random_prefix_len=16, num_prefix_groups=3)
    requests = generate(spec, _rng())
    for r in requests:
        group = r.request_id % 3
        assert r.prefix_group == group
        assert r.prompt_tokens == 24 and r.prefix_tokens() == 16
        assert r.segments == (Segment(content_id=group + 1, num_tokens=16),
                              Segment(content_id=(1 << 32) + r.request_id, num_tokens=8))
    assert requests[0].segments[0] is requests[3].segments[0] is requests[6].segments[0]
    assert requests[0].segments[0] != requests[1].segments[0]


def test_no_prefix_means_one_unique_segment() -> None:
    spec = WorkloadSpec(num_prompts=3, random_input_len=32, num_prefix_groups=4)
    for r in generate(spec, _rng()):
        assert r.prefix_group == -1 and r.prefix_tokens() == 0
        assert r.segments == (Segment(content_id=UNIQUE_CONTENT_BASE + r.request_id,
                                      num_tokens=32),)


def test_poisson_mean_gap_is_one_over_rate() -> None:
    spec = WorkloadSpec(num_prompts=20_000, request_rate=5.0, random_input_len=16,
                        random_output_len=4)
    requests = generate(spec, _rng())
    gaps_s = _gaps_s(requests)
    assert gaps_s.min() > 0.0  # the first request waits one gap, as in vLLM
    assert gaps_s.mean() == pytest.approx(1 / 5.0, rel=0.03)
    # vLLM rescales the cumulative delays so the last request lands at num_prompts / rate.
    assert requests[-1].arrival_s == pytest.approx(20_000 / 5.0, rel=1e-12)
    cv = gaps_s.std() / gaps_s.mean()
    assert cv == pytest.approx(1.0, abs=0.05)


def test_burstiness_below_one_raises_the_gap_cv() -> None:
    n = 20_000
    poisson = np.diff(sample_arrivals_s(n, 10.0, 1.0, _rng(1)), prepend=0.0)
    bursty = np.diff(sample_arrivals_s(n, 10.0, 0.25, _rng(1)), prepend=0.0)
    cv_poisson = poisson.std() / poisson.mean()
    cv_bursty = bursty.std() / bursty.mean()
    assert cv_bursty == pytest.approx(math.sqrt(1 / 0.25), rel=0.1)  # gamma CV = 1/sqrt(shape)
    assert cv_bursty > 1.5 * cv_poisson
    assert bursty.mean() == pytest.approx(0.1, rel=0.03)


def test_same_seed_same_requests_and_other_seed_differs() -> None:
    spec = WorkloadSpec(num_prompts=500, request_rate=20.0, burstiness=0.5,
                        random_range_ratio=0.3, random_prefix_len=10, num_prefix_groups=2)
    assert generate(spec, _rng(7)) == generate(spec, _rng(7))
    assert generate(spec, _rng(7)) != generate(spec, _rng(8))


_DIGEST_SNIPPET = """
import hashlib, numpy as np
from sim.specs.workload import WorkloadSpec
from sim.workload.generate import generate
spec = WorkloadSpec(num_prompts=2000, request_rate=20.0, burstiness=0.5,
                    random_range_ratio=0.3, random_prefix_len=10, num_prefix_groups=2)
requests = generate(spec, np.random.default_rng(np.random.SeedSequence(11)))
print(hashlib.sha256(repr(requests).encode()).hexdigest())
"""


def test_same_seed_is_identical_in_fresh_processes() -> None:
    digests = {
        subprocess.run([sys.executable, "-c", _DIGEST_SNIPPET], cwd=REPO, check=True,
                       capture_output=True, text=True).stdout.strip()
        for _ in range(2)
    }
    spec = WorkloadSpec(num_prompts=2000, request_rate=20.0, burstiness=0.5,
                        random_range_ratio=0.3, random_prefix_len=10, num_prefix_groups=2)
    here = hashlib.sha256(repr(generate(spec, _rng(11))).encode()).hexdigest()
    assert digests == {here}


def test_request_spec_rejects_inconsistent_segments() -> None:
    with pytest.raises(ValueError, match="segments"):
        RequestSpec(request_id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=1,
                    segments=(Segment(content_id=5, num_tokens=9),))
    with pytest.raises(ValueError, match="segments"):
        RequestSpec(request_id=0, arrival_s=0.0, prompt_tokens=10, output_tokens=1,
                    segments=(Segment(content_id=5, num_tokens=10),), prefix_group=0)
    with pytest.raises(ValueError, match="arrival_s"):
        RequestSpec(request_id=0, arrival_s=math.inf, prompt_tokens=10, output_tokens=1,
                    segments=(Segment(content_id=5, num_tokens=10),))
