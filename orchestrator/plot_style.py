"""What every plot shares: one colour per GPU type, axis labels with units, short configuration
labels. Plain data and functions (no matplotlib import), so tests can check them cheaply.
"""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Mapping
from typing import Final

GPU_COLORS: Final[Mapping[str, str]] = {
    # Hopper GPUs are blues, Ampere oranges and olive, Blackwell datacenter greens,
    # Ada and workstation parts reds, pinks and purple, Intel brown.
    "h100_sxm": "#1f77b4", "h100_pcie": "#6baed6", "h200_sxm": "#17becf", "gh200": "#08306b",
    "a100_sxm": "#ff7f0e", "a100_pcie": "#fdae6b", "a30": "#bcbd22",
    "b200_sxm": "#2ca02c", "b300_sxm": "#98df8a", "gb200": "#005a32", "gb300": "#41ab5d",
    "l4": "#d62728", "l40s": "#ff9896", "rtx_4090": "#e377c2", "rtx_pro_6000_server": "#9467bd",
    "b60": "#8c564b",
}
"""The colour of each catalog GPU in every kernelsight plot (sweep Pareto fronts, validation
scatters), so one GPU looks the same everywhere."""

_OTHER_COLORS: Final = ("#7f7f7f", "#c49c94", "#f7b6d2", "#c5b0d5", "#dbdb8d", "#9edae5", "#393b79", "#843c39")

DEFAULT_COLOR: Final = "#4c72b0"
"""Points with no known GPU."""


def gpu_color(name: str | None) -> str:
    """The catalog colour of GPU `name`; other names (a hardware TOML of your own) get a fixed
    colour from their name, the same in every plot and run."""
    if name is None:
        return DEFAULT_COLOR
    stem = name.rsplit("/", 1)[-1].removesuffix(".toml")
    if stem in GPU_COLORS:
        return GPU_COLORS[stem]
    digest = int(hashlib.sha256(stem.encode()).hexdigest(), 16)
    return _OTHER_COLORS[digest % len(_OTHER_COLORS)]


def unit_of(metric: str) -> str:
    """The unit a metric name ends with (the project names carry their units)."""
    suffixes = (("_tokens_per_s_per_gpu", "tokens/s/GPU"), ("_tokens_per_s", "tokens/s"),
                ("_requests_per_s", "requests/s"), ("_per_s", "1/s"), ("_usd", "USD"), ("_s", "s"),
                ("_frac", "fraction"), ("_bytes", "bytes"))
    for suffix, unit in suffixes:
        if metric.endswith(suffix):
            return unit
    return "count" if metric.startswith("num_") else ""


def axis_label(metric: str, note: str = "") -> str:
    """`ttft_p90_s [s]`, plus `note` (e.g. the objective's direction)."""
    unit = unit_of(metric)
    text = f"{metric} [{unit}]" if unit else metric
    return f"{text}, {note}" if note else text


_SHORT_KEYS: Final[Mapping[str, str]] = {
    "engine.tensor_parallel_size": "tp", "engine.pipeline_parallel_size": "pp",
    "engine.data_parallel_size": "dp", "engine.max_num_seqs": "seqs", "engine.max_num_batched_tokens": "mbt",
    "engine.kv_cache_dtype": "kv", "engine.quantization": "q", "engine.block_size": "bs",
    "engine.gpu_memory_utilization": "mem", "engine.long_prefill_token_threshold": "lpt",
}
_FLAGS: Final[Mapping[str, str]] = {"engine.enable_chunked_prefill": "chunk", "engine.enable_prefix_caching": "pc",
                                     "engine.enable_expert_parallel": "ep", "engine.enforce_eager": "eager"}


def short_gpu(name: str) -> str:
    """`h100_sxm` -> `h100`; other names as they are (`h100_pcie`, `l40s`)."""
    stem = name.rsplit("/", 1)[-1].removesuffix(".toml")
    return stem.removesuffix("_sxm")


def config_label(params: Mapping[str, object]) -> str:
    """A short label of a trial's parameters, e.g. `h100 tp2 seqs64 nochunk`."""
    parts: list[str] = []
    for key, value in params.items():
        pool = key.split(".")
        if key == "serving":
            parts.append("agg" if value == "aggregated" else "disagg")
        elif pool[0] == "disaggregation" and len(pool) > 2:
            tag = pool[1][0].upper()  # P (prefill) or D (decode)
            if pool[2] == "num_workers":
                parts.append(f"{value}{tag}")
            elif pool[2] == "hardware":
                parts.append(f"{tag}:{short_gpu(str(value))}")
            else:
                parts.append(f"{tag}:{config_label({'.'.join(pool[2:]): value})}")
        elif key == "hardware.name":
            parts.insert(0, short_gpu(str(value)))
        elif key in _FLAGS:
            parts.append(_FLAGS[key] if value else f"no{_FLAGS[key]}")
        elif key in _SHORT_KEYS:
            parts.append(f"{_SHORT_KEYS[key]}{'-' if value is None else value}")
        else:
            parts.append(f"{key.rsplit('.', 1)[-1]}={value}")
    return " ".join(parts)


def wrap_title(title: str, width: int = 70) -> str:
    """Long titles on several lines instead of cut off at the figure edge."""
    return "\n".join(textwrap.wrap(title, width)) or title
