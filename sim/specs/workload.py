"""What the client sends: TOML section `[workload]`, with `vllm bench serve` meanings.

Arrivals: `request_rate` requests/s (`inf` sends everything at t=0), Poisson when `burstiness`
is 1, gamma-distributed gaps otherwise; `max_concurrency` caps in-flight requests (closed loop
when the rate is `inf`). Lengths: `random` (uniform in [len x (1 - ratio), len x (1 + ratio)]),
`fixed`, or a dataset/trace file (`dataset_path`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from sim.serde import require

DatasetName = Literal["random", "fixed", "sharegpt", "custom", "trace"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Request stream of one benchmark run."""

    dataset_name: DatasetName = "random"
    """`random`/`fixed`: synthetic lengths; `sharegpt`/`custom`/`trace`: read `dataset_path`."""
    dataset_path: str | None = None
    """CSV or JSONL with input/output token counts, optional arrival times and prefix groups."""
    num_prompts: int = 1000
    request_rate: float = math.inf
    """Requests per second; `inf` sends all requests at t=0."""
    burstiness: float = 1.0
    """Gamma shape of inter-arrival gaps; 1 is Poisson, < 1 burstier."""
    max_concurrency: int | None = None
    """Cap on requests in flight; a new one starts when one finishes."""
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    """Tokens of prefix shared by requests of the same prefix group, before the random part."""
    num_prefix_groups: int = 1
    """kernelsight: distinct shared prefixes (system prompts) requests are spread over."""
    ignore_eos: bool = True
    """Outputs run to their sampled length, as `vllm bench serve --ignore-eos`."""

    def __post_init__(self) -> None:
        require(self.num_prompts >= 1, "num_prompts", self.num_prompts, "must be >= 1")
        require(self.request_rate > 0, "request_rate", self.request_rate, "must be > 0 (inf for all at t=0)")
        require(self.burstiness > 0 and math.isfinite(self.burstiness), "burstiness", self.burstiness,
                "must be a finite number > 0")
        require(self.max_concurrency is None or self.max_concurrency >= 1, "max_concurrency",
                self.max_concurrency, "must be >= 1")
        require(self.random_input_len >= 1, "random_input_len", self.random_input_len, "must be >= 1")
        require(self.random_output_len >= 1, "random_output_len", self.random_output_len, "must be >= 1")
        require(0.0 <= self.random_range_ratio < 1.0, "random_range_ratio", self.random_range_ratio,
                "must be in [0, 1)")
        require(self.random_prefix_len >= 0, "random_prefix_len", self.random_prefix_len, "must be >= 0")
        require(self.num_prefix_groups >= 1, "num_prefix_groups", self.num_prefix_groups, "must be >= 1")
        needs_file = self.dataset_name in ("sharegpt", "custom", "trace")
        require(not needs_file or self.dataset_path is not None, "dataset_path", self.dataset_path,
                f"is required when dataset_name={self.dataset_name!r}")

    def max_input_tokens(self) -> int:
        """Longest synthetic prompt (prefix included); file datasets are checked on load."""
        return self.random_prefix_len + math.floor(self.random_input_len * (1 + self.random_range_ratio))

    def max_output_tokens(self) -> int:
        return math.floor(self.random_output_len * (1 + self.random_range_ratio))
