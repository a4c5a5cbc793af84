"""Measured end-to-end rows, their suite (dev / eval), and the hold-out guard for fitting code.

A `ValidationRow` is one measured point turned into what the simulator needs: the scenario
sections (`sections`, a plain dict for `scenario_from_dict`, without `[perf]`), the measured
metrics in SI units (`measured`, keys named like `SimSummary` fields), and how the simulated run
relates to the measured one (`replay`). A row the simulator cannot represent keeps its measured
values and carries `skip_reason` instead of sections; it is reported, never dropped.

Suites: `eval` holds every Llama-3.1-70B row (any checkpoint of that architecture: Llama 3 / 3.1
/ 3.3 70B, their FP8/FP4 builds, and the Llama-2 70B rows of the old static-batch table), every
Kimi-K2.5 and GLM-5 row, and every row measured on b200_sxm; `dev` is everything else. Nothing may
be fitted or chosen on `eval`:
`require_dev` raises `EvalRowRefused` for any evaluation row and is called by every fitting entry
point (it re-derives the suite from model and GPU, not trusting the `suite` field).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from sim.errors import ConfigError
from sim.specs.model import ModelSpec

Source = Literal["aiconfigurator", "llmservingsim", "trtllm_throughput", "trtllm_static"]
SOURCES: Final[tuple[Source, ...]] = ("aiconfigurator", "llmservingsim", "trtllm_throughput", "trtllm_static")
Suite = Literal["dev", "eval"]
Family = Literal["dense", "moe", "mla", "unknown"]
FAMILIES: Final[tuple[Family, ...]] = ("dense", "moe", "mla", "unknown")
ReplayKind = Literal["closed_loop", "trace", "offline", "static_batch", "single_request"]

EVAL_HARDWARE: Final = "b200_sxm"
_LLAMA_70B = re.compile(r"llama[^0-9]*(2|3|3\.1|3\.3|v3|v3\.1)?[^0-9]*70b", re.IGNORECASE)
_B200_LABEL = re.compile(r"^b200", re.IGNORECASE)
_EVAL_MODELS = re.compile(r"kimi[-_ ]?k2\.5|glm[-_ ]?5", re.IGNORECASE)

HEADLINE_METRICS: Final = {
    "ttft": "ttft_mean_s",
    "tpot": "tpot_mean_s",
    "throughput": "output_throughput_tokens_per_s",
}
"""Per-row headline metric -> measured/predicted key."""


class EvalRowRefused(ConfigError):
    """Fitting or choosing was asked to look at an evaluation row."""


def is_eval(model: str, hardware: str) -> bool:
    """Evaluation-only: a Llama 70B checkpoint (Llama-3.1-70B architecture), Kimi-K2.5, GLM-5, or a b200_sxm GPU."""
    return (bool(_LLAMA_70B.search(model)) or bool(_EVAL_MODELS.search(model)) or hardware == EVAL_HARDWARE
            or bool(_B200_LABEL.match(hardware)))


def suite_of(model: str, hardware: str) -> Suite:
    return "eval" if is_eval(model, hardware) else "dev"


DUPLICATE_PREFIX: Final = "duplicate of "
"""Skip reason of a row that repeats another row's measurement: `duplicate of <row id>: <why>`."""

@dataclass(frozen=True, slots=True, kw_only=True)
class TraceRequest:
    arrival_s: float
    """Seconds after the first request of the run (server-side queue time)."""
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Replay:
    """How the simulated run stands for the measured one."""

    kind: ReplayKind
    num_requests: int
    """Requests of the measured run; every one is simulated."""
    concurrency: int = 0
    """Client concurrency of a closed loop, batch size of a static batch, estimated steady batch of an
    offline run (used only to estimate simulation cost)."""
    trace: tuple[TraceRequest, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    row_id: str
    """`<source>:<key>`, stable across runs."""
    source: Source
    suite: Suite
    model: str
    """Model as the source names it."""
    hardware: str
    """Catalog GPU name, or the source's label when no spec ships."""
    backend: str
    backend_version: str
    label: str
    """Short description for tables (model, GPU, parallelism, lengths, load)."""
    measured: Mapping[str, float]
    """Measured metrics in SI units, keyed like `SimSummary` fields."""
    sections: Mapping[str, Any] | None = None
    """Scenario sections without `[perf]`; None when skipped."""
    replay: Replay | None = None
    skip_reason: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Assumptions made when converting the row (engine defaults, length protocol)."""
    family: Family = "unknown"
    """Architecture class of the model: `mla` (multi-head latent attention, MoE), `moe`, `dense`;
    `unknown` when no model config ships."""
    disaggregated: bool = False
    """Prefill/decode disaggregated deployment (AIConfigurator `mode=disagg`)."""

    def __post_init__(self) -> None:
        if (self.sections is None) == (self.skip_reason is None):
            raise ValueError(f"{self.row_id}: a row has either sections or a skip reason")

    @property
    def skipped(self) -> bool:
        return self.skip_reason is not None

    @property
    def simulation_key(self) -> str:
        """What the row's simulation reads: its scenario sections and replay. Rows with the same key
        (the same configuration measured twice, e.g. by two releases' performance tables that the
        simulator models alike) get the same simulated results under each tier, so `validate`
        simulates them once. Empty for a skipped row."""
        if self.sections is None:
            return ""
        return json.dumps([self.sections, repr(self.replay)], sort_keys=True, default=repr)

    def with_skip(self, reason: str) -> ValidationRow:
        return ValidationRow(row_id=self.row_id, source=self.source, suite=self.suite, model=self.model,
                             hardware=self.hardware, backend=self.backend, backend_version=self.backend_version,
                             label=self.label, measured=self.measured, skip_reason=reason, notes=self.notes,
                             family=self.family, disaggregated=self.disaggregated)


def family_of(spec: ModelSpec | None) -> Family:
    """`mla`, `moe` or `dense` from the catalog spec; `unknown` without one."""
    if spec is None:
        return "unknown"
    if spec.mla is not None:
        return "mla"
    return "moe" if spec.moe is not None else "dense"


def require_dev(rows: Iterable[ValidationRow], *, purpose: str) -> list[ValidationRow]:
    """The rows, if none is an evaluation row; else `EvalRowRefused` naming the first one."""
    out = list(rows)
    for row in out:
        if row.suite != "dev" or is_eval(row.model, row.hardware):
            raise EvalRowRefused(source=row.source, key="row", value=row.row_id,
                                 rule=f"is an evaluation row ({row.model} on {row.hardware}); "
                                 f"{purpose} may use dev rows only")
    return out
