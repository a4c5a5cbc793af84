"""Synthetic request streams with `vllm bench serve` semantics.

Arrivals follow `vllm/benchmarks/serve.py::get_request` (vLLM main, 2026): with `request_rate`
inf every request arrives at 0; otherwise the gaps are Gamma(shape=burstiness, scale=1 / (rate x
burstiness)), so the mean gap is 1 / rate and burstiness 1 is a Poisson process. Arrival `i` is
the sum of the first `i + 1` gaps (the first request waits one gap), and the sequence is rescaled
so the last arrival is exactly `num_prompts / request_rate`, as vLLM does to remove seed-to-seed
throughput noise.

Lengths follow `vllm/benchmarks/datasets/random.py::RandomDataset.get_sampling_params`: input length is
uniform over the integers [floor(L x (1 - r)), ceil(L x (1 + r))], output length over
[max(floor(O x (1 - r)), 1), max(ceil(O x (1 + r)), 1)], both ends included, computed in float
as vLLM does. vLLM subtracts the tokenizer's special-token count from L; there is no tokenizer
here, so L is used as given. `fixed` uses L and O exactly. `random_prefix_len` shared tokens
come before the sampled part; request `i` belongs to prefix group `i mod num_prefix_groups`
(round robin, so groups are balanced and the assignment is exact; vLLM has one prefix, which is
`num_prefix_groups = 1`).

Draw order from the generator: input lengths, output lengths, then arrival gaps.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from sim.errors import ConfigError
from sim.specs.workload import WorkloadSpec, length_bounds
from sim.workload.requests import UNIQUE_CONTENT_BASE, RequestSpec, Segment, prefix_content_id

_SOURCE = "[workload]"


def generate(spec: WorkloadSpec, rng: np.random.Generator, *,
             max_model_len: int | None = None) -> tuple[RequestSpec, ...]:
    """The `spec.num_prompts` requests of one run, in arrival order; pure given `rng`'s state.

    `max_model_len` checks the rows of a dataset file (a longer request raises `ConfigError`);
    synthetic lengths are checked when the scenario is built.
    """
    if spec.dataset_name in ("random", "fixed"):
        return _synthetic(spec, rng)
    # traces.py imports this module's arrival sampler, so the import goes here.
    from sim.workload.traces import read_trace, requests_from_trace

    assert spec.dataset_path is not None  # WorkloadSpec requires it for file datasets
    return requests_from_trace(read_trace(spec.dataset_path, run_id=spec.dataset_run_id), spec, rng,
                               max_model_len=max_model_len)


def sample_arrivals_s(
    num_requests: int, request_rate: float, burstiness: float, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """Arrival times in seconds from the run start, as `vllm bench serve` sends them."""
    if math.isinf(request_rate):
        return np.zeros(num_requests, dtype=np.float64)
    theta_s = 1.0 / (request_rate * burstiness)
    arrivals_s = np.cumsum(rng.gamma(shape=burstiness, scale=theta_s, size=num_requests))
    if arrivals_s[-1] != 0.0:
        arrivals_s *= (num_requests / request_rate) / arrivals_s[-1]
    return arrivals_s


def build_requests(
    *,
    arrivals_s: npt.NDArray[np.float64],
    prompt_tokens: npt.NDArray[np.int64],
    output_tokens: npt.NDArray[np.int64],
    prefix_groups: npt.NDArray[np.int64],
    prefix_tokens: npt.NDArray[np.int64],
) -> tuple[RequestSpec, ...]:
    """Requests 0..n-1 from column arrays; a prefix segment exists where prefix_tokens > 0.

    Segments with equal (group, length) are one shared object. The loop is the cost of
    generation (about 1-3 us a request); everything before it is vectorised.
    """
    shared: dict[tuple[int, int], Segment] = {}
    requests: list[RequestSpec] = []
    append = requests.append
    columns = zip(
        arrivals_s.tolist(), prompt_tokens.tolist(), output_tokens.tolist(),
        prefix_groups.tolist(), prefix_tokens.tolist(), strict=True,
    )
    for request_id, (arrival_s, prompt, output, group, prefix) in enumerate(columns):
        segments: tuple[Segment, ...]
        if prefix > 0:
            head = shared.get((group, prefix))
            if head is None:
                head = Segment(content_id=prefix_content_id(group), num_tokens=prefix)
                shared[(group, prefix)] = head
            if prompt > prefix:
                segments = (head, Segment(content_id=UNIQUE_CONTENT_BASE + request_id,
                                          num_tokens=prompt - prefix))
            else:
                segments = (head,)
        else:
            group = -1
            segments = (Segment(content_id=UNIQUE_CONTENT_BASE + request_id, num_tokens=prompt),)
        append(RequestSpec(request_id=request_id, arrival_s=arrival_s, prompt_tokens=prompt,
                           output_tokens=output, segments=segments, prefix_group=group))
    return tuple(requests)


def _synthetic(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[RequestSpec, ...]:
    n = spec.num_prompts
    if spec.dataset_name == "fixed":
        input_tokens = np.full(n, spec.random_input_len, dtype=np.int64)
        output_tokens = np.full(n, spec.random_output_len, dtype=np.int64)
    else:
        ratio = spec.random_range_ratio
        in_low, in_high = length_bounds(spec.random_input_len, ratio, min_tokens=0)
        out_low, out_high = length_bounds(spec.random_output_len, ratio, min_tokens=1)
        if spec.random_prefix_len + in_low < 1:
            raise ConfigError(
                source=_SOURCE, key="random_input_len", value=spec.random_input_len,
                rule=f"with random_range_ratio={ratio} and random_prefix_len=0 a prompt can have "
                "0 tokens; raise random_input_len or random_prefix_len, or lower the ratio",
            )
        input_tokens = rng.integers(in_low, in_high + 1, size=n, dtype=np.int64)
        output_tokens = rng.integers(out_low, out_high + 1, size=n, dtype=np.int64)
    arrivals_s = sample_arrivals_s(n, spec.request_rate, spec.burstiness, rng)
    prefix_len = spec.random_prefix_len
    return build_requests(
        arrivals_s=arrivals_s,
        prompt_tokens=input_tokens + prefix_len,
        output_tokens=output_tokens,
        prefix_groups=np.arange(n, dtype=np.int64) % spec.num_prefix_groups,
        prefix_tokens=np.full(n, prefix_len, dtype=np.int64),
    )
