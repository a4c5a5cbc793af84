"""Arrival times of a synthetic request stream, as `vllm bench serve` sends them.

Arrivals follow `vllm/benchmarks/serve.py::get_request` (vLLM main, 2026): with `request_rate`
inf every request arrives at 0; otherwise the gaps are Gamma(shape=burstiness, scale=1 / (rate x
burstiness)), so the mean gap is 1 / rate and burstiness 1 is a Poisson process. Arrival `i` is
the sum of the first `i + 1` gaps (the first request waits one gap), and the sequence is rescaled
so the last arrival is exactly `num_prompts / request_rate`, as vLLM does to remove seed-to-seed
throughput noise. Synthetic workloads and traces without arrival times both use it.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt


def sample_arrivals_s(
    num_requests: int, request_rate: float, burstiness: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Arrival times in seconds from the run start, as `vllm bench serve` sends them."""
    if math.isinf(request_rate):
        return np.zeros(num_requests, dtype=np.float64)
    if math.isinf(burstiness):
        # vLLM: a constant gap of 1 / rate (no draw); the last arrival is at num_requests / rate.
        return np.arange(1, num_requests + 1, dtype=np.float64) / request_rate
    theta_s = 1.0 / (request_rate * burstiness)
    arrivals_s = np.cumsum(rng.gamma(shape=burstiness, scale=theta_s, size=num_requests))
    if arrivals_s[-1] != 0.0:
        arrivals_s *= (num_requests / request_rate) / arrivals_s[-1]
    return arrivals_s
