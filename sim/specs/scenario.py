"""A scenario: hardware x model x engine settings x workload x SLOs x seed, from one TOML file.

```toml
seed = 0
[hardware]
name = "h100_sxm"
[model]
name = "meta-llama/Llama-3.1-70B"
[engine]
tensor_parallel_size = 4
[workload]
request_rate = 8.0
[slo]
ttft_s = 0.5
```

Names resolve through the catalog; `[engine]` defaults that vLLM picks per device are filled in;
cross-section rules (heads divisible by TP, lengths within `max_model_len`, ...) are checked here
and broken ones raise `ConfigError` with the file, dotted key, value and rule. The user's sections
(after `--set` overrides) are kept as canonical JSON so a scenario can be re-derived with more
overrides (`with_overrides`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.errors import ConfigError
from sim.serde import apply_overrides, build, config_hash, require, to_jsonable
from sim.specs.catalog import load_hardware, load_model, read_toml
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec, resolve_precision
from sim.specs.slo import SloSpec
from sim.specs.workload import DIURNAL, FLEET_DAY_KEYS, WorkloadSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSection:
    name: str
    """Catalog name (`kernelsight list hardware`) or a path to a hardware TOML."""
    price_per_gpu_hour_usd: float | None = None
    """Overrides the shipped price table for cost metrics."""

    def __post_init__(self) -> None:
        price = self.price_per_gpu_hour_usd
        require(price is None or price >= 0, "price_per_gpu_hour_usd", price, "must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSection:
    name: str
    """Hugging Face id from `kernelsight list models`, a path to a `config.json`, or a checkpoint
    directory holding one."""


PerfTier = Literal["auto", "roofline", "cross-generation", "target-measured"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfSection:
    """Which kernel model prices the steps (docs/kernel-model.md)."""

    tier: PerfTier = "auto"
    """auto = target-measured where a calibration ships for the GPU, else cross-generation."""
    calibration: str | None = None
    """A `kernelsight calibrate` artifact (target-measured tier); relative to the scenario file."""

    def __post_init__(self) -> None:
        require(self.calibration is None or self.tier in ("auto", "target-measured"), "calibration",
                self.calibration, "only the auto and target-measured tiers read a calibration")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioSections:
    """The file's sections as written (after overrides), validated key by key."""

    seed: int = 0
    hardware: HardwareSection
    model: ModelSection
    engine: EngineParams = field(default_factory=EngineParams)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    slo: SloSpec = field(default_factory=SloSpec)
    perf: PerfSection = field(default_factory=PerfSection)

    def __post_init__(self) -> None:
        require(self.seed >= 0, "seed", self.seed, "must be >= 0 (it seeds numpy's SeedSequence)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """Everything one simulation needs, resolved and validated."""

    source: str
    """File the scenario came from (for messages)."""
    seed: int
    hardware: HardwareSpec
    model: ModelSpec
    engine: EngineParams
    """With vLLM's device defaults filled in (no `None` caps)."""
    workload: WorkloadSpec
    slo: SloSpec
    precision: PrecisionSpec
    price_per_gpu_hour_usd: float | None
    perf: PerfSection = field(default_factory=PerfSection)
    sections_json: str
    """Canonical JSON of the user's sections, for re-deriving with overrides."""

    def sections(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.sections_json)
        return result

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        return scenario_from_dict(apply_overrides(self.sections(), overrides), source=self.source)

    def scenario_hash(self, *extra: str) -> str:
        return config_hash(
            {"seed": self.seed, "hardware": self.hardware, "model": self.model, "engine": self.engine,
             "workload": workload_identity(self.workload), "slo": self.slo, "price": self.price_per_gpu_hour_usd,
             "perf": self.perf},
            *extra,
        )


def workload_identity(workload: WorkloadSpec) -> dict[str, Any]:
    """The workload as hashed: fleet-day keys left out at their defaults, so every scenario written
    before they existed keeps its hash (sweep caches, study identities)."""
    data = to_jsonable(workload)
    defaults = to_jsonable(WorkloadSpec())
    return {k: v for k, v in data.items() if k not in FLEET_DAY_KEYS or v != defaults[k]}


def load_scenario_file(path: str | Path, overrides: Mapping[str, Any] | None = None) -> Scenario:
    path = Path(path)
    data = apply_overrides(read_toml(path), overrides or {})
    base = path.parent
    # Relative file paths inside a scenario are relative to the scenario file.
    for section, key in (("model", "name"), ("hardware", "name"), ("workload", "dataset_path"),
                         ("workload", "request_rate_profile"), ("perf", "calibration")):
        value = data.get(section, {}).get(key) if isinstance(data.get(section), dict) else None
        is_file = isinstance(value, str) and value.endswith((".json", ".toml", ".csv", ".jsonl"))
        # A model directory holding a config.json is a path too (as Hugging Face tools read it).
        is_model_dir = section == "model" and isinstance(value, str) and (base / value / "config.json").is_file()
        if (is_file or is_model_dir) and isinstance(value, str) and not Path(value).is_absolute():
            candidate = base / value
            if candidate.exists():
                data[section][key] = str(candidate.resolve())
    return scenario_from_dict(data, source=str(path))


def scenario_from_dict(data: Mapping[str, Any], *, source: str) -> Scenario:
    sections = build(ScenarioSections, data, source=source)
    profile = sections.workload.request_rate_profile
    for key, value in (("workload.dataset_path", sections.workload.dataset_path),
                       ("workload.request_rate_profile", profile if profile != DIURNAL else None),
                       ("perf.calibration", sections.perf.calibration)):
        if value is not None and not Path(value).exists():
            raise ConfigError(source=source, key=key, value=value,
                              rule="file not found (a relative path is relative to the scenario file)")
    hardware = _resolve(load_hardware, sections.hardware.name, source, "hardware.name")
    model = _resolve(load_model, sections.model.name, source, "model.name")
    engine = sections.engine.resolve(
        hbm_capacity_bytes=hardware.hbm_capacity_bytes,
        hardware_name=hardware.name,
        max_position_embeddings=model.max_position_embeddings,
    )
    _check_combination(source, model, sections.engine, engine, sections.workload)
    return Scenario(
        source=source,
        seed=sections.seed,
        hardware=hardware,
        model=model,
        engine=engine,
        workload=sections.workload,
        slo=sections.slo,
        precision=resolve_precision(model, engine),
        price_per_gpu_hour_usd=sections.hardware.price_per_gpu_hour_usd,
        perf=sections.perf,
        sections_json=json.dumps(to_jsonable(sections), sort_keys=True),
    )


def _resolve(loader: Any, name: str, source: str, key: str) -> Any:
    try:
        return loader(name)
    except ConfigError as exc:
        if exc.source:
            raise
        raise ConfigError(source=source, key=key, value=name, rule=exc.rule) from None


def _check_combination(
    source: str, model: ModelSpec, asked: EngineParams, engine: EngineParams, workload: WorkloadSpec
) -> None:
    def fail(key: str, value: object, rule: str) -> None:
        raise ConfigError(source=source, key=key, value=value, rule=rule)

    tp = engine.tensor_parallel_size
    if model.num_attention_heads % tp:
        fail("engine.tensor_parallel_size", tp,
             f"must divide the model's num_attention_heads={model.num_attention_heads}")
    kv = model.num_kv_heads
    if model.mla is None and ((kv >= tp and kv % tp) or (kv < tp and tp % kv)):
        fail("engine.tensor_parallel_size", tp,
             f"must divide num_key_value_heads={kv} or be a multiple of it (KV heads are replicated)")
    if model.intermediate_size % tp:
        fail("engine.tensor_parallel_size", tp, f"must divide intermediate_size={model.intermediate_size}")
    if engine.pipeline_parallel_size > model.num_layers:
        fail("engine.pipeline_parallel_size", engine.pipeline_parallel_size,
             f"must be <= num_hidden_layers={model.num_layers}")
    if model.moe is not None:
        ep, moe_tp = engine.expert_parallel_size(), engine.moe_tp_size()
        key = "engine.moe_expert_parallel_size" if engine.moe_expert_parallel_size else "engine.enable_expert_parallel"
        if model.moe.num_experts % ep:
            fail(key, engine.moe_expert_parallel_size or True,
                 f"expert-parallel size {ep} (TP x DP = {tp} x {engine.data_parallel_size} with expert "
                 f"parallelism, or moe_expert_parallel_size) must divide num_experts={model.moe.num_experts}")
        if model.moe.expert_intermediate_size % moe_tp:
            fail("engine.moe_tensor_parallel_size", moe_tp,
                 f"MoE tensor-parallel size {moe_tp} (TP x DP without expert parallelism, or "
                 f"moe_tensor_parallel_size) must divide the expert intermediate size "
                 f"{model.moe.expert_intermediate_size}")
        if model.moe.shared_expert_intermediate_size % tp:
            fail("engine.tensor_parallel_size", tp,
                 f"must divide the shared-expert intermediate size {model.moe.shared_expert_intermediate_size}")
    elif engine.enable_expert_parallel or engine.moe_expert_parallel_size or engine.moe_tensor_parallel_size:
        fail("engine.enable_expert_parallel", True, f"{model.name} has no experts")
    assert engine.max_model_len is not None and engine.max_num_batched_tokens is not None
    assert engine.max_num_seqs is not None
    if engine.max_model_len > model.max_position_embeddings:
        fail("engine.max_model_len", engine.max_model_len,
             f"must be <= the model's max_position_embeddings={model.max_position_embeddings}")
    if not asked.enable_chunked_prefill and asked.max_num_batched_tokens is not None \
            and asked.max_num_batched_tokens < engine.max_model_len:
        fail("engine.max_num_batched_tokens", asked.max_num_batched_tokens,
             f"must be >= max_model_len={engine.max_model_len} when enable_chunked_prefill=false")
    if engine.max_num_batched_tokens < engine.max_num_seqs:
        fail("engine.max_num_batched_tokens", engine.max_num_batched_tokens,
             f"must be >= max_num_seqs={engine.max_num_seqs}")
    if workload.dataset_name in ("random", "fixed"):
        longest = workload.max_input_tokens() + workload.max_output_tokens()
        if longest > engine.max_model_len:
            fail("workload.random_input_len", workload.random_input_len,
                 f"prompt plus output can reach {longest} tokens, over max_model_len={engine.max_model_len}")
