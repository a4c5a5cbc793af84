"""Synthetic request streams with `vllm bench serve` semantics.

Arrivals follow `vllm/benchmarks/serve.py::get_request` (`sim.workload.arrivals` documents the
process). File datasets are read and turned into requests by `sim.workload.traces`.

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

import numpy as np

from sim.errors import ConfigError
from sim.specs.workload import WorkloadSpec, length_bounds
from sim.workload.arrivals import sample_arrivals_s
from sim.workload.profile import last_bin_s, profile_arrivals_s, rate_per_s
from sim.workload.requests import RequestSpec, build_requests
from sim.workload.traces import read_trace, requests_from_trace

_SOURCE = "[workload]"


def generate(spec: WorkloadSpec, rng: np.random.Generator, *,
             max_model_len: int | None = None) -> tuple[RequestSpec, ...]:
    """The `spec.num_prompts` requests of one run, in arrival order; pure given `rng`'s state.

    `max_model_len` checks the rows of a dataset file (a longer request raises `ConfigError`);
    synthetic lengths are checked when the scenario is built.
    """
    if spec.request_rate_profile is not None or spec.classes:
        return generate_fleet(spec, rng)[0]
    if spec.dataset_name in ("random", "fixed"):
        return _synthetic(spec, rng)
    assert spec.dataset_path is not None  # WorkloadSpec requires it for file datasets
    return requests_from_trace(read_trace(spec.dataset_path, run_id=spec.dataset_run_id), spec, rng,
                               max_model_len=max_model_len)


def _synthetic(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[RequestSpec, ...]:
    n = spec.num_prompts
    if spec.dataset_name == "fixed":
        input_tokens = np.full(n, spec.random_input_len, dtype=np.int64)
        output_tokens = np.full(n, spec.random_output_len, dtype=np.int64)
    else:
        input_tokens, output_tokens = _random_lengths(spec, rng, n)
    arrivals_s = sample_arrivals_s(n, spec.request_rate, spec.burstiness, rng)
    prefix_len = spec.random_prefix_len
    return build_requests(
        arrivals_s=arrivals_s,
        prompt_tokens=input_tokens + prefix_len,
        output_tokens=output_tokens,
        prefix_groups=np.arange(n, dtype=np.int64) % spec.num_prefix_groups,
        prefix_tokens=np.full(n, prefix_len, dtype=np.int64),
    )


def _random_lengths(spec: WorkloadSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The `random_*` input (before the shared prefix) and output lengths of `n` requests, as vLLM's
    `RandomDataset` draws them (module docstring); a workload that could draw an empty prompt raises."""
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
    return input_tokens, output_tokens


def generate_fleet(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[tuple[RequestSpec, ...], np.ndarray]:
    """(requests, class index of each) of a fleet-day workload: a rate profile and/or traffic classes.

    Draw order: arrivals (the profile's, or `request_rate`'s), then each request's class
    (categorical over the normalised shares), then per class in file order its input and output
    lengths. Without classes the `random_*` lengths apply and every request is class 0.
    """
    if spec.request_rate_profile is not None:
        arrivals_s = profile_arrivals_s(rate_per_s(spec), spec.num_prompts, spec.burstiness, rng,
                                        last_bin=last_bin_s(spec))
    else:
        arrivals_s = sample_arrivals_s(spec.num_prompts, spec.request_rate, spec.burstiness, rng)
    n = arrivals_s.size
    if not spec.classes:
        input_tokens, output_tokens = _random_lengths(spec, rng, n)
        class_ids = np.zeros(n, dtype=np.int64)
        prefix_len = spec.random_prefix_len
    else:
        shares = np.array([c.share for c in spec.classes], dtype=np.float64)
        class_ids = rng.choice(len(spec.classes), size=n, p=shares / shares.sum()).astype(np.int64)
        input_tokens = np.empty(n, dtype=np.int64)
        output_tokens = np.empty(n, dtype=np.int64)
        for index, cls in enumerate(spec.classes):
            mask = class_ids == index
            m = int(mask.sum())
            in_low, in_high = length_bounds(cls.input_len, cls.range_ratio, min_tokens=1)
            out_low, out_high = length_bounds(cls.output_len, cls.range_ratio, min_tokens=1)
            input_tokens[mask] = rng.integers(in_low, in_high + 1, size=m, dtype=np.int64)
            output_tokens[mask] = rng.integers(out_low, out_high + 1, size=m, dtype=np.int64)
        prefix_len = 0
    requests = build_requests(
        arrivals_s=arrivals_s,
        prompt_tokens=input_tokens + prefix_len,
        output_tokens=output_tokens,
        prefix_groups=np.arange(n, dtype=np.int64) % spec.num_prefix_groups,
        prefix_tokens=np.full(n, prefix_len, dtype=np.int64),
    )
    return requests, class_ids
