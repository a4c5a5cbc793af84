"""Last step of every row reader: size the KV memory as the row's engine would, check it fits.

The checks are the simulator's memory rules (`sim.api.check_feasible`) on cached specs; rules
that need the whole scenario (TP dividing the heads, ...) are checked when the row is simulated
and reported the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from sim.errors import ConfigError
from sim.perf.profile import EngineProfile
from sim.validation.engine_args import memory_utilization_for
from sim.validation.rows import ValidationRow
from sim.validation.specs_cache import SpecCache

TRACE_PLACEHOLDER = "<trace written at run time>.csv"
_GIB = float(1 << 30)


def finalize(row: ValidationRow, profiles: Mapping[str, EngineProfile], cache: SpecCache) -> ValidationRow:
    if row.sections is None or row.replay is None:
        return row
    sections: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in row.sections.items()}
    if "disaggregation" in sections:
        return replace(row, sections=sections)  # each pool is sized by its reader; checked when simulated
    engine = sections["engine"]
    try:
        if "gpu_memory_utilization" not in engine:
            engine["gpu_memory_utilization"] = round(memory_utilization_for(sections, profiles[row.backend], cache), 6)
        mem = cache.memory(sections["model"]["name"], sections["hardware"]["name"], engine)
    except (ConfigError, ValueError) as exc:
        return row.with_skip(str(exc))
    if mem.static_bytes(cuda_graphs=False) > mem.requested_bytes:
        return row.with_skip(f"does not fit: {mem.weight_bytes / _GIB:.1f} GiB of weights per GPU plus activations "
                             f"over {mem.requested_bytes / _GIB:.1f} GiB usable on {row.hardware}")
    longest = max((t.input_tokens + t.output_tokens for t in row.replay.trace), default=0)
    work = sections["workload"]
    if work["dataset_name"] in ("fixed", "random"):
        ratio = work.get("random_range_ratio", 0.0)
        longest = int(work["random_input_len"] * (1 + ratio)) + int(work["random_output_len"] * (1 + ratio))
    if mem.kv_capacity_tokens() < longest:
        return row.with_skip(f"the KV cache holds {mem.kv_capacity_tokens()} tokens per GPU, less than one "
                             f"request's {longest}")
    return replace(row, sections=sections)
