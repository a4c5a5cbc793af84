"""What the client sends: TOML section `[workload]`, with `vllm bench serve` meanings.

Arrivals: `request_rate` requests/s (`inf` sends everything at t=0), Poisson when `burstiness`
is 1, gamma-distributed gaps otherwise; `max_concurrency` caps in-flight requests (closed loop
when the rate is `inf`). Lengths: `random` (uniform over the integers [floor(len x (1 - ratio)),
ceil(len x (1 + ratio))], as `vllm bench serve`), `fixed`, or a dataset/trace file
(`dataset_path`, one run of it chosen by `dataset_run_id`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from sim.serde import require
from sim.specs.traffic import Burst, TrafficClass

DatasetName = Literal["random", "fixed", "sharegpt", "custom", "trace"]

DIURNAL: Final = "diurnal"
FLEET_DAY_KEYS: Final = ("request_rate_profile", "diurnal_peak_rate", "diurnal_trough_rate", "diurnal_peak_hour",
                         "profile_duration_s", "bursts", "classes")
"""Keys added for fleet-day workloads; a scenario's hash leaves them out while they hold their defaults."""

MAX_PROFILE_S: Final = 7 * 86_400.0
DAY_S: Final = 86_400.0
"""Length of a diurnal profile without `profile_duration_s`."""
"""Longest rate profile: the simulation stops at a week of simulated time (`SimLimits.max_sim_time_s`),
and the profile holds a rate per second in memory."""
MAX_NUM_PROMPTS: Final = 10_000_000
"""Largest `num_prompts`: every request is generated up front and simulated one by one (about a
kilobyte each), so 10^7 requests already take gigabytes and hours; a larger count is a typo."""


def length_bounds(length_tokens: int, range_ratio: float, *, min_tokens: int) -> tuple[int, int]:
    """Inclusive [low, high] of vLLM's uniform integer length sampling.

    `vllm/benchmarks/datasets/random.py::RandomDataset.get_sampling_params`: low is
    floor(L x (1 - r)), high is ceil(L x (1 + r)), both computed in float, then raised to
    `min_tokens` (1 for outputs).
    """
    low = max(math.floor(length_tokens * (1 - range_ratio)), min_tokens)
    high = max(math.ceil(length_tokens * (1 + range_ratio)), min_tokens)
    return low, high


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """Request stream of one benchmark run."""

    dataset_name: DatasetName = "random"
    """`random`/`fixed`: synthetic lengths; `sharegpt`/`custom`/`trace`: read `dataset_path`."""
    dataset_path: str | None = None
    """CSV or JSONL with input/output token counts, optional arrival times and prefix groups."""
    dataset_run_id: str | None = None
    """kernelsight: the `run_id` whose rows to replay when the file holds several runs."""
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
    """Outputs run to their sampled length, as `vllm bench serve --ignore-eos`; `false` (outputs that
    may stop early at an end-of-sequence token) is refused: nothing here models where a model stops."""
    spec_acceptance_rates: tuple[float, ...] | None = None
    """kernelsight, with `[engine] speculative_config`: per draft position, the probability that the
    draft token is accepted given the ones before it were; a list shorter than k repeats its last
    entry. None = the method's published default (docs/speculative.md)."""
    spec_mean_acceptance_length: float | None = None
    """kernelsight: instead of the rates, the mean tokens a verification step emits per request
    (1 + accepted drafts), turned into one constant rate."""
    request_rate_profile: str | None = None
    """kernelsight: `diurnal`, or a CSV file with a `requests_per_min` column (one row a minute): the
    rate over time, in place of `request_rate`. Arrivals are a time-rescaled Gamma process
    (`burstiness`), up to `num_prompts` requests or the profile's end."""
    diurnal_peak_rate: float | None = None
    """Requests/s at `diurnal_peak_hour` (`diurnal` profile)."""
    diurnal_trough_rate: float | None = None
    """Requests/s twelve hours from the peak; the rate follows a cosine between the two."""
    diurnal_peak_hour: float = 14.0
    profile_duration_s: float | None = None
    """Length of the profile: default one day for `diurnal`, the CSV's rows x 60 s for a file."""
    bursts: tuple[Burst, ...] = ()
    classes: tuple[TrafficClass, ...] = ()
    """Traffic classes; when given they replace the `random_*` lengths (`dataset_name = "random"`)."""

    def __post_init__(self) -> None:
        require(1 <= self.num_prompts <= MAX_NUM_PROMPTS, "num_prompts", self.num_prompts,
                f"must be in [1, {MAX_NUM_PROMPTS:,}] (requests are simulated one by one)")
        require(self.request_rate > 0, "request_rate", self.request_rate, "must be > 0 (inf for all at t=0)")
        require(self.burstiness > 0, "burstiness", self.burstiness,
                "must be a number > 0 (inf: evenly spaced arrivals, as vllm bench serve)")
        require(self.ignore_eos, "ignore_eos", self.ignore_eos,
                "must be true: outputs run to their drawn or recorded lengths (where a model would stop "
                "at its end-of-sequence token is not modelled; set output lengths instead)")
        require(self.max_concurrency is None or self.max_concurrency >= 1, "max_concurrency",
                self.max_concurrency, "must be >= 1")
        require(self.random_input_len >= 1, "random_input_len", self.random_input_len, "must be >= 1")
        require(self.random_output_len >= 1, "random_output_len", self.random_output_len, "must be >= 1")
        require(0.0 <= self.random_range_ratio < 1.0, "random_range_ratio", self.random_range_ratio,
                "must be in [0, 1)")
        require(self.random_prefix_len >= 0, "random_prefix_len", self.random_prefix_len, "must be >= 0")
        require(self.num_prefix_groups >= 1, "num_prefix_groups", self.num_prefix_groups, "must be >= 1")
        rates = self.spec_acceptance_rates
        for i, r in enumerate(rates or ()):
            require(0.0 <= r <= 1.0, f"spec_acceptance_rates[{i}]", r, "must be in [0, 1]")
        require(rates is None or len(rates) >= 1, "spec_acceptance_rates", rates, "must not be empty")
        mean = self.spec_mean_acceptance_length
        require(mean is None or rates is None, "spec_mean_acceptance_length", mean,
                "give spec_acceptance_rates or spec_mean_acceptance_length, not both")
        require(mean is None or (mean >= 1.0 and math.isfinite(mean)), "spec_mean_acceptance_length", mean,
                "must be a finite number >= 1 (tokens per verification step, the bonus token included)")
        needs_file = self.dataset_name in ("sharegpt", "custom", "trace")
        require(not needs_file or self.dataset_path is not None, "dataset_path", self.dataset_path,
                f"is required when dataset_name={self.dataset_name!r}")
        require(needs_file or self.dataset_path is None, "dataset_path", self.dataset_path,
                f"is read only by dataset_name='sharegpt', 'custom' or 'trace', not {self.dataset_name!r}; "
                "set dataset_name or remove dataset_path")
        require(needs_file or self.dataset_run_id is None, "dataset_run_id", self.dataset_run_id,
                f"applies to file datasets only, not dataset_name={self.dataset_name!r}")

        self._check_fleet_day()

    def _check_fleet_day(self) -> None:
        profile = self.request_rate_profile
        diurnal = profile == DIURNAL
        require(profile is None or diurnal or profile.endswith(".csv"), "request_rate_profile", profile,
                "must be 'diurnal' or a .csv file with a requests_per_min column")
        require(profile is None or math.isinf(self.request_rate), "request_rate", self.request_rate,
                "give either request_rate or request_rate_profile, not both")
        for key in ("diurnal_peak_rate", "diurnal_trough_rate"):
            value = getattr(self, key)
            require(diurnal or value is None, key, value, "applies only with request_rate_profile = 'diurnal'")
            require(not diurnal or value is not None, key, value, "is required with request_rate_profile = 'diurnal'")
            require(value is None or (math.isfinite(value) and value >= 0), key, value,
                    "must be a finite number >= 0 (requests/s)")
        if diurnal:
            assert self.diurnal_peak_rate is not None and self.diurnal_trough_rate is not None
            require(self.diurnal_peak_rate >= self.diurnal_trough_rate and self.diurnal_peak_rate > 0,
                    "diurnal_peak_rate", self.diurnal_peak_rate, "must be > 0 and >= diurnal_trough_rate")
        require(0.0 <= self.diurnal_peak_hour < 24.0, "diurnal_peak_hour", self.diurnal_peak_hour, "must be in [0, 24)")
        require(self.profile_duration_s is None or profile is not None, "profile_duration_s", self.profile_duration_s,
                "applies only with request_rate_profile")
        require(self.profile_duration_s is None or 1 <= self.profile_duration_s <= MAX_PROFILE_S,
                "profile_duration_s", self.profile_duration_s,
                f"must be a number in [1, {MAX_PROFILE_S:,.0f}] seconds (a week: the simulation's time limit)")
        require(not self.bursts or profile is not None, "bursts", len(self.bursts),
                "apply only with request_rate_profile")
        fleet = bool(self.classes) or profile is not None
        require(not fleet or self.dataset_name == "random", "dataset_name", self.dataset_name,
                "request_rate_profile and classes apply to dataset_name = 'random' only")
        names = [c.name for c in self.classes]
        require(len(set(names)) == len(names), "classes", names, "class names must be distinct")
        shares = sum(c.share for c in self.classes)  # inf when it overflows
        require(math.isfinite(shares), "classes", [c.share for c in self.classes],
                "the shares must sum to a finite number (they are normalised over the classes)")
        if diurnal and self.profile_duration_s is None:
            # (A `profile_duration_s` that cuts the day short may leave the day's bursts after it.)
            late = [b.start_s for b in self.bursts if b.start_s >= DAY_S]
            require(not late, "bursts", late, f"a burst must start before the diurnal day's end at {DAY_S:,.0f} s")
        require(not self.classes or (self.random_prefix_len == 0 and self.num_prefix_groups == 1),
                "random_prefix_len", self.random_prefix_len, "does not apply with classes")

    def max_input_tokens(self) -> int:
        """Longest synthetic prompt (prefix included); file datasets are checked on load."""
        if self.classes:
            return max(length_bounds(c.input_len, c.range_ratio, min_tokens=1)[1] for c in self.classes)
        if self.dataset_name == "fixed":
            return self.random_prefix_len + self.random_input_len
        return self.random_prefix_len + length_bounds(self.random_input_len, self.random_range_ratio,
                                                      min_tokens=0)[1]

    def max_request_tokens(self) -> int:
        """Longest synthetic request, prompt plus output (per class with `[[workload.classes]]`: the
        longest prompt and the longest output may belong to different classes)."""
        if self.classes:
            return max(length_bounds(c.input_len, c.range_ratio, min_tokens=1)[1]
                       + length_bounds(c.output_len, c.range_ratio, min_tokens=1)[1] for c in self.classes)
        return self.max_input_tokens() + self.max_output_tokens()

    def max_output_tokens(self) -> int:
        if self.classes:
            return max(length_bounds(c.output_len, c.range_ratio, min_tokens=1)[1] for c in self.classes)
        if self.dataset_name == "fixed":
            return self.random_output_len
        return length_bounds(self.random_output_len, self.random_range_ratio, min_tokens=1)[1]
