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

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Final, Literal

from sim.errors import ConfigError
from sim.serde import FieldError, apply_overrides, build, config_hash, require, to_jsonable
from sim.specs.autoscaling import AutoscalingSpec
from sim.specs.catalog import load_hardware, load_model, read_toml
from sim.specs.disaggregation import Connector, DisaggregationSection, PoolName, PoolSection, TransferLink
from sim.specs.engine import MAX_REPLICAS, EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec, resolve_precision
from sim.specs.slo import SloSpec
from sim.specs.speculative import draft_model_spec
from sim.specs.workload import DIURNAL, FLEET_DAY_KEYS, WorkloadSpec, length_bounds


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSection:
    name: str
    """Catalog name (`kernelsight list hardware`) or a path to a hardware TOML."""
    price_per_gpu_hour_usd: float | None = None
    """Overrides the shipped price table for cost metrics."""
    pcie_peer_group_size: int | None = None
    """Overrides the hardware spec's `pcie_peer_group_size`: how the node you run on wires its
    PCIe GPUs (`nvidia-smi topo -p2p r`); None = the spec's."""

    def __post_init__(self) -> None:
        price = self.price_per_gpu_hour_usd
        require(price is None or (math.isfinite(price) and price >= 0), "price_per_gpu_hour_usd", price,
                "must be a finite number >= 0")
        peers = self.pcie_peer_group_size
        require(peers is None or peers >= 1, "pcie_peer_group_size", peers, "must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSection:
    name: str
    """Hugging Face id from `kernelsight list models`, a path to a `config.json`, or a checkpoint
    directory holding one."""
    max_position_embeddings: int | None = None
    """kernelsight: serve past the config's positions (vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1`; a
    TensorRT-LLM engine built with a longer max sequence length); None = the config's."""

    def __post_init__(self) -> None:
        require(self.max_position_embeddings is None or self.max_position_embeddings > 0,
                "max_position_embeddings", self.max_position_embeddings, "must be > 0")


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
    disaggregation: DisaggregationSection | None = None
    autoscaling: AutoscalingSpec | None = None

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
    draft_model: ModelSpec | None = None
    """What the speculative drafter runs (`sim.specs.speculative.draft_model_spec`); None without
    speculative decoding or for ngram."""
    sections_json: str
    """Canonical JSON of the user's sections, for re-deriving with overrides."""
    disaggregation: Disaggregation | None = None
    """The prefill and decode pools when `[disaggregation]` is given (the top-level `hardware` and
    `engine` are then only the base the pools' keys are laid over)."""
    autoscaling: AutoscalingSpec | None = None
    """`[autoscaling]` with `max_replicas` and `initial_replicas` resolved; None without it (a
    fixed fleet of `engine.data_parallel_size` replicas)."""

    def sections(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.sections_json)
        return result

    def with_overrides(self, overrides: Mapping[str, Any]) -> Scenario:
        return scenario_from_dict(apply_overrides(self.sections(), overrides), source=self.source)

    def _perf_identity(self) -> Any:
        """`[perf]` as hashed: a calibration file by its content (`file_identity`)."""
        if self.perf.calibration is None:
            return self.perf
        return {**to_jsonable(self.perf), "calibration": file_identity(self.perf.calibration)}

    def scenario_hash(self, *extra: str) -> str:
        parts: dict[str, Any] = {
            "seed": self.seed, "hardware": stable_identity("hardware", self.hardware),
            "model": stable_identity("model", self.model),
            "engine": stable_identity("engine", self.engine), "workload": workload_identity(self.workload),
            "slo": self.slo, "price": self.price_per_gpu_hour_usd, "perf": self._perf_identity()}
        if self.disaggregation is not None:  # aggregated scenarios keep their hashes
            parts["disaggregation"] = {pool.name: {"num_workers": pool.num_workers,
                                                   "hash": pool.scenario.scenario_hash()}
                                       for pool in self.disaggregation.pools()}
            parts["transfer"] = self.sections()["disaggregation"]
        if self.autoscaling is not None:  # scenarios without it keep their hashes
            parts["autoscaling"] = stable_identity("autoscaling", self.autoscaling)
        return config_hash(parts, *extra)


@dataclass(frozen=True, slots=True, kw_only=True)
class Pool:
    name: PoolName
    num_workers: int
    scenario: Scenario
    """The pool's resolved scenario (aggregated, one worker)."""

    def num_ranks(self) -> int:
        """Schedulers in the pool: workers x attention-DP ranks."""
        return self.num_workers * self.scenario.engine.data_parallel_size

    def num_gpus(self) -> int:
        return self.num_workers * self.scenario.engine.num_gpus()


@dataclass(frozen=True, slots=True, kw_only=True)
class Disaggregation:
    prefill: Pool
    decode: Pool
    connector: Connector
    transfer_link: TransferLink
    transfer_latency_s: float | None

    def pools(self) -> tuple[Pool, Pool]:
        return self.prefill, self.decode

    def num_gpus(self) -> int:
        return self.prefill.num_gpus() + self.decode.num_gpus()


LATER_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "engine": ("enable_eplb", "num_redundant_experts", "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio",
               "speculative_config", "attention_dp_enable_balance", "attention_dp_timeout_iters",
               "attention_dp_batching_wait_iters", "mamba_full_memory_ratio", "max_attention_window",
               "api_server_latency_s"),
    "hardware": ("nvlink_domain_size", "nvlink", "pcie_peer_group_size", "tables_pcie_peer_group_size"),
    "model": ("linear_attention", "linear_layers", "attn_output_gate", "shared_expert_gate", "mlp_gated",
              "mlp_bias", "parallel_attention", "layer_norms_per_layer", "int4_group_size", "qk_norm_across_heads"),
    "workload": ("spec_acceptance_rates", "spec_mean_acceptance_length", *FLEET_DAY_KEYS),
    "autoscaling": ("look_back_period_s", "metrics_record_interval_s", "upscaling_factor", "downscaling_factor"),
}
"""Keys added after scenario hashes were first kept (sweep caches, study identities, MLflow runs):
a scenario's hash leaves each out while it holds its default, so scenarios written before it existed
keep their hashes. A new key with a default joins this list."""

LATER_NESTED_KEYS: Final[dict[tuple[str, str], tuple[str, ...]]] = {
    ("engine", "speculative_config"): ("quantization",),
}
"""The same for keys of a table inside a section (each left out of the hash while it is None)."""


def ranks_in_lockstep(model: ModelSpec, engine: EngineParams) -> bool:
    """An MoE model's data-parallel ranks are one engine that meets at every MoE layer (lockstep
    steps at the slowest rank's time, `sim.serving.dp_group`); a dense model's are independent
    replicas."""
    return model.moe is not None and engine.data_parallel_size > 1


def stable_identity(section: str, value: Any) -> Any:
    """`value` (a section's spec) as hashed: its `LATER_KEYS` left out at their defaults."""
    data = to_jsonable(value)
    later = LATER_KEYS.get(section, ())
    if not later or not isinstance(data, dict):
        return data
    defaults = {f.name: f.default for f in fields(value) if f.name in later}
    if "nvlink_domain_size" in defaults:  # resolved on load: the default domain is one node
        defaults["nvlink_domain_size"] = value.num_gpus_per_node
    out = {k: v for k, v in data.items() if k not in defaults or v != to_jsonable(defaults[k])}
    for (owner, table), keys in LATER_NESTED_KEYS.items():
        inner = out.get(table)
        if owner == section and isinstance(inner, dict):
            out[table] = {k: v for k, v in inner.items() if k not in keys or v is not None}
    if section == "hardware" and value.tables_pcie_peer_group_size in (None, value.pcie_peer_group_size):
        # Wired as its tables' host (or the whole node): priced as before the keys existed.
        out.pop("pcie_peer_group_size", None)
        out.pop("tables_pcie_peer_group_size", None)
    return out


def workload_identity(workload: WorkloadSpec) -> Any:
    """The workload as hashed: its files (a dataset or trace, a rate profile) by their content, so an
    edited file changes the hash and the same file in another directory does not."""
    identity = stable_identity("workload", workload)
    for key in ("dataset_path", "request_rate_profile"):
        if isinstance(identity, dict) and identity.get(key):
            identity[key] = file_identity(str(identity[key]))
    return identity


def file_identity(path: str) -> str:
    """`sha256:<hex>` of a file's bytes (kept per path, size and modification time: a sweep hashes its
    scenario per trial); the path itself when it cannot be read (the run then fails on it anyway)."""
    try:
        stat = Path(path).stat()
    except OSError:
        return path
    key = (path, stat.st_size, stat.st_mtime_ns)
    digest = _FILE_DIGESTS.get(key)
    if digest is None:
        try:
            digest = "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return path
        _FILE_DIGESTS[key] = digest
    return digest


_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}


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
    # Built on its own so that errors inside it keep their full dotted key (an optional table's
    # errors would be reported at the table).
    disaggregation_data = data.get("disaggregation")
    autoscaling_data = data.get("autoscaling")
    sections = build(ScenarioSections, {k: v for k, v in data.items() if k not in ("disaggregation", "autoscaling")},
                     source=source)
    if disaggregation_data is not None:
        sections = replace(sections, disaggregation=build(DisaggregationSection, disaggregation_data, source=source,
                                                          prefix="disaggregation"))
    if autoscaling_data is not None:
        sections = replace(sections, autoscaling=build(AutoscalingSpec, autoscaling_data, source=source,
                                                       prefix="autoscaling"))
    profile = sections.workload.request_rate_profile
    for key, value in (("workload.dataset_path", sections.workload.dataset_path),
                       ("workload.request_rate_profile", profile if profile != DIURNAL else None),
                       ("perf.calibration", sections.perf.calibration)):
        if value is not None and not Path(value).exists():
            raise ConfigError(source=source, key=key, value=value,
                              rule="file not found (a relative path is relative to the scenario file)")
    hardware = _resolve(load_hardware, sections.hardware.name, source, "hardware.name")
    peers = sections.hardware.pcie_peer_group_size
    if peers is not None:
        # The spec's tables_pcie_peer_group_size (resolved) keeps the host its tables describe.
        try:
            hardware = replace(hardware, pcie_peer_group_size=peers)
        except FieldError as exc:
            raise ConfigError(source=source, key="hardware.pcie_peer_group_size", value=peers,
                              rule=f"{exc.rule} ({hardware.name})") from None
    model = _resolve(load_model, sections.model.name, source, "model.name")
    if sections.model.max_position_embeddings is not None:
        model = replace(model, max_position_embeddings=sections.model.max_position_embeddings)
    engine = sections.engine.resolve(
        hbm_capacity_bytes=hardware.hbm_capacity_bytes,
        hardware_name=hardware.name,
        max_position_embeddings=model.max_position_embeddings,
    )
    if engine.max_attention_window is not None:
        model = model.with_attention_window(engine.max_attention_window)
    _check_combination(source, model, sections.engine, engine, sections.workload)
    disaggregation = None
    if sections.disaggregation is not None:
        if model.linear_attention is not None:
            raise ConfigError(source=source, key="disaggregation", value="{...}",
                              rule=f"{model.name} has linear-attention layers: moving their per-request state "
                              "between pools is not modelled yet; simulate it aggregated")
        disaggregation = _resolve_disaggregation(data, sections.disaggregation, source)
    draft = None
    if engine.speculative_config is not None:
        draft = _resolve(lambda name: draft_model_spec(model, engine.speculative_config, load_model),
                         engine.speculative_config.model or "", source, "engine.speculative_config.model")
        _check_speculation(source, model, draft, engine, sections.workload)
    elif ((sections.workload.spec_acceptance_rates is not None or sections.workload.spec_mean_acceptance_length)
          and not (disaggregation is not None
                   and any(p.scenario.engine.speculative_config is not None for p in disaggregation.pools()))):
        # (A pool's own speculative_config takes the rates: the decode pool alone may speculate.)
        key = "spec_acceptance_rates" if sections.workload.spec_acceptance_rates is not None \
            else "spec_mean_acceptance_length"
        raise ConfigError(source=source, key=f"workload.{key}", value=getattr(sections.workload, key),
                          rule="applies only with [engine] speculative_config")
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
        draft_model=draft,
        sections_json=json.dumps(to_jsonable(sections), sort_keys=True),
        disaggregation=disaggregation,
        autoscaling=_resolve_autoscaling(sections, model, engine, source),
    )


def _resolve_autoscaling(sections: ScenarioSections, model: ModelSpec, engine: EngineParams,
                         source: str) -> AutoscalingSpec | None:
    """`[autoscaling]` checked against the fleet it scales: the replica slots are
    `engine.data_parallel_size` independent replicas of an aggregated scenario."""
    spec = sections.autoscaling
    if spec is None:
        return None

    def fail(key: str, value: object, rule: str) -> None:
        raise ConfigError(source=source, key=f"autoscaling.{key}", value=value, rule=rule)

    if sections.disaggregation is not None:
        fail("min_replicas", spec.min_replicas,
             "autoscaling scales the replicas of an aggregated scenario; with [disaggregation] the prefill "
             "and decode pools are fixed (per-pool autoscaling is not simulated yet): remove [autoscaling] "
             "or [disaggregation]")
    slots = engine.data_parallel_size
    if ranks_in_lockstep(model, engine):
        fail("min_replicas", spec.min_replicas,
             f"{model.name} is an MoE model: its data_parallel_size={slots} ranks are one lockstep engine, not "
             "independent replicas, so there is nothing to scale; use data_parallel_size = 1 per replica")
    if spec.max_replicas is not None and spec.max_replicas > slots:
        fail("max_replicas", spec.max_replicas,
             f"must be <= engine.data_parallel_size={slots} (the fleet's replica slots; raise data_parallel_size)")
    if spec.min_replicas > slots:
        fail("min_replicas", spec.min_replicas, f"must be <= engine.data_parallel_size={slots}")
    if spec.initial_replicas is not None and spec.initial_replicas > slots:
        fail("initial_replicas", spec.initial_replicas, f"must be <= engine.data_parallel_size={slots}")
    return spec.resolved(slots)


def _resolve_disaggregation(data: Mapping[str, Any], section: DisaggregationSection, source: str) -> Disaggregation:
    """Each pool's scenario: the file's sections with the pool's `hardware` / `engine` keys laid over."""
    pools: dict[PoolName, Pool] = {}
    named: tuple[tuple[PoolName, PoolSection], ...] = (("prefill", section.prefill), ("decode", section.decode))
    for name, pool in named:
        pools[name] = Pool(name=name, num_workers=pool.num_workers,
                           scenario=_pool_scenario(data, name, pool, source))
    for name, pool in named:
        if pools[name].num_ranks() > MAX_REPLICAS:
            raise ConfigError(source=source, key=f"disaggregation.{name}.num_workers", value=pool.num_workers,
                              rule=(f"num_workers x data_parallel_size = {pools[name].num_ranks():,} ranks; at most "
                                    f"{MAX_REPLICAS:,} (each keeps its own scheduler and KV pool)"))
        if pools[name].scenario.engine.attention_dp_enable_balance:
            own = "attention_dp_enable_balance" in pool.engine
            raise ConfigError(
                source=source, key=(f"disaggregation.{name}." if own else "") + "engine.attention_dp_enable_balance",
                value=True, rule=(f"attention-DP balancing is not simulated in disaggregated pools (the {name} "
                                  "pool's ranks are stepped independently)"))
    prefill, decode = pools["prefill"].scenario, pools["decode"].scenario
    where = "disaggregation.decode.engine."
    if prefill.engine.backend != decode.engine.backend:
        raise ConfigError(
            source=source, key=where + "backend", value=decode.engine.backend,
            rule=(f"must equal the prefill pool's backend={prefill.engine.backend!r}: each engine's KV "
                  "connector pairs only with its own kind (vLLM's NIXL handshake, SGLang's bootstrap "
                  "server, TensorRT-LLM's cache transceiver)"))
    if prefill.precision.kv_cache_dtype != decode.precision.kv_cache_dtype:
        raise ConfigError(
            source=source, key=where + "kv_cache_dtype", value=decode.engine.kv_cache_dtype,
            rule=(f"the decode pool's KV cache is {decode.precision.kv_cache_dtype.value} but the prefill pool "
                  f"writes {prefill.precision.kv_cache_dtype.value}: KV blocks are transferred as they are, so "
                  "both pools need the same kv_cache_dtype"))
    if prefill.engine.block_size != decode.engine.block_size:
        raise ConfigError(
            source=source, key=where + "block_size", value=decode.engine.block_size,
            rule=(f"must equal the prefill pool's block_size={prefill.engine.block_size}: the connector "
                  "transfers whole KV blocks"))
    if prefill.engine.max_model_len != decode.engine.max_model_len:
        raise ConfigError(
            source=source, key=where + "max_model_len", value=decode.engine.max_model_len,
            rule=f"must equal the prefill pool's max_model_len={prefill.engine.max_model_len}")
    if section.transfer_link == "nvlink":
        p_hw, d_hw = prefill.hardware, decode.hardware
        if p_hw.name != d_hw.name:
            raise ConfigError(
                source=source, key="disaggregation.transfer_link", value="nvlink",
                rule=(f"the prefill pool runs on {p_hw.name} and the decode pool on {d_hw.name}: NVLink joins "
                      "GPUs of one system only, so their KV moves over the inter-node link (use \"auto\" "
                      "or \"inter_node\")"))
        domain = d_hw.nvlink_domain()
        pair = prefill.engine.num_gpus() + decode.engine.num_gpus()
        if pair > domain:
            raise ConfigError(
                source=source, key="disaggregation.transfer_link", value="nvlink",
                rule=(f"one prefill worker ({prefill.engine.num_gpus()} GPUs) and one decode worker "
                      f"({decode.engine.num_gpus()} GPUs) need {pair} GPUs, more than the {domain} of one "
                      f"{d_hw.name} NVLink domain: no prefill/decode pair can share NVLink (use \"auto\" "
                      "or \"inter_node\")"))
    return Disaggregation(prefill=pools["prefill"], decode=pools["decode"], connector=section.connector,
                          transfer_link=section.transfer_link, transfer_latency_s=section.transfer_latency_s)


def _pool_scenario(data: Mapping[str, Any], name: str, pool: PoolSection, source: str) -> Scenario:
    if "api_server_latency_s" in pool.engine:
        # The client talks to one frontend: its latency is the deployment's, not a pool's.
        raise ConfigError(source=source, key=f"disaggregation.{name}.engine.api_server_latency_s",
                          value=pool.engine["api_server_latency_s"],
                          rule="set it in [engine]: one API server fronts both pools of a deployment")
    pool_data = {k: v for k, v in data.items() if k not in ("disaggregation", "autoscaling")}
    hardware = dict(pool_data.get("hardware", {}))
    if pool.hardware is not None:
        # The file's wiring stays with the file's hardware; another GPU's is its spec's.
        same = pool.hardware == hardware.get("name") and "pcie_peer_group_size" in hardware
        hardware = {"name": pool.hardware, **({"pcie_peer_group_size": hardware["pcie_peer_group_size"]}
                                               if same else {})}
    if pool.pcie_peer_group_size is not None:
        hardware["pcie_peer_group_size"] = pool.pcie_peer_group_size
    if pool.price_per_gpu_hour_usd is not None:
        hardware["price_per_gpu_hour_usd"] = pool.price_per_gpu_hour_usd
    pool_data["hardware"] = hardware
    pool_data["engine"] = {**dict(pool_data.get("engine", {})), **dict(pool.engine)}
    if pool_data["engine"].get("speculative_config") is None:
        # Acceptance rates are the speculating pool's (the whole scenario checks that one does).
        pool_data["workload"] = {k: v for k, v in dict(pool_data.get("workload", {})).items()
                                 if k not in ("spec_acceptance_rates", "spec_mean_acceptance_length")}
    try:
        return scenario_from_dict(pool_data, source=source)
    except ConfigError as exc:
        section, _, rest = exc.key.partition(".")
        own = ((section == "engine" and rest.split(".")[0] in pool.engine)
               or (section == "hardware" and pool.hardware is not None))
        key = f"disaggregation.{name}.{exc.key}" if own else exc.key
        if exc.key == "hardware.pcie_peer_group_size" and pool.pcie_peer_group_size is not None:
            key = f"disaggregation.{name}.pcie_peer_group_size"
        raise type(exc)(source=exc.source, key=key, value=exc.value,
                        rule=f"{exc.rule} (in the {name} pool)") from None


def _resolve(loader: Any, name: str, source: str, key: str) -> Any:
    try:
        return loader(name)
    except ConfigError as exc:
        if exc.source:
            raise
        raise ConfigError(source=source, key=key, value=name, rule=exc.rule) from None


_ADP_BALANCE_KEYS: Final = ("attention_dp_enable_balance", "attention_dp_timeout_iters",
                             "attention_dp_batching_wait_iters")


def _check_adp_balance(fail: Callable[[str, object, str], None], model: ModelSpec, engine: EngineParams) -> None:
    """TensorRT-LLM's attention-DP balance: its backend, and an engine whose DP ranks step together."""
    defaults = EngineParams()
    for key in _ADP_BALANCE_KEYS:
        value = getattr(engine, key)
        if engine.backend != "trtllm" and value != getattr(defaults, key):
            fail(f"engine.{key}", value, f"attention-DP balancing is TensorRT-LLM's scheduler feature "
                 f"(attention_dp_config): needs backend = \"trtllm\" (backend is {engine.backend!r})")
    if not engine.attention_dp_enable_balance:
        return
    if engine.data_parallel_size < 2:
        fail("engine.attention_dp_enable_balance", True,
             f"balances context requests over attention-DP ranks: needs data_parallel_size >= 2 "
             f"(is {engine.data_parallel_size})")
    if model.moe is None:
        fail("engine.attention_dp_enable_balance", True,
             "needs a MoE model: the simulator steps attention-DP ranks together only where they meet at "
             "the MoE layers (a dense model's DP ranks are independent replicas)")


def _check_combination(
    source: str, model: ModelSpec, asked: EngineParams, engine: EngineParams, workload: WorkloadSpec
) -> None:
    def fail(key: str, value: object, rule: str) -> None:
        raise ConfigError(source=source, key=key, value=value, rule=rule)

    if engine.backend != "trtllm" and (engine.batch_wait_timeout_iters or engine.batch_wait_max_tokens_ratio):
        fail("engine.batch_wait_timeout_iters", engine.batch_wait_timeout_iters,
             f"batch waiting is TensorRT-LLM's scheduler feature: needs backend = \"trtllm\" (backend is "
             f"{engine.backend!r})")
    _check_adp_balance(fail, model, engine)
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
    la = model.linear_attention
    if la is not None and (la.num_key_heads % tp or la.num_value_heads % tp):
        fail("engine.tensor_parallel_size", tp,
             f"must divide the Gated DeltaNet heads (linear_num_key_heads={la.num_key_heads}, "
             f"linear_num_value_heads={la.num_value_heads}): the linear layers split their heads over TP")
    if engine.pipeline_parallel_size > model.num_layers:
        fail("engine.pipeline_parallel_size", engine.pipeline_parallel_size,
             f"must be <= num_hidden_layers={model.num_layers}")
    if model.moe is not None:
        ep, moe_tp = engine.expert_parallel_size(), engine.moe_tp_size()
        key = "engine.moe_expert_parallel_size" if engine.moe_expert_parallel_size else "engine.enable_expert_parallel"
        slots = engine.physical_experts(model.moe.num_experts)
        if engine.enable_eplb and ep == 1:
            fail("engine.enable_eplb", True, "EPLB balances experts over expert-parallel ranks: set "
                 "enable_expert_parallel (or moe_expert_parallel_size > 1)")
        if engine.enable_eplb and slots % ep:
            fail("engine.num_redundant_experts", engine.num_redundant_experts,
                 f"num_experts={model.moe.num_experts} + num_redundant_experts={engine.num_redundant_experts} "
                 f"= {slots} expert slots must divide over the {ep} expert-parallel ranks")
        if ep > model.moe.num_experts:
            fail(key, engine.moe_expert_parallel_size or True,
                 f"expert-parallel size {ep} (TP x DP = {tp} x {engine.data_parallel_size} with expert "
                 f"parallelism, or moe_expert_parallel_size) must be <= num_experts={model.moe.num_experts}: "
                 "a rank without an expert")
        if model.moe.expert_intermediate_size % moe_tp:
            fail("engine.moe_tensor_parallel_size", moe_tp,
                 f"MoE tensor-parallel size {moe_tp} (TP x DP without expert parallelism, or "
                 f"moe_tensor_parallel_size) must divide the expert intermediate size "
                 f"{model.moe.expert_intermediate_size}")
        if model.moe.shared_expert_intermediate_size % tp:
            fail("engine.tensor_parallel_size", tp,
                 f"must divide the shared-expert intermediate size {model.moe.shared_expert_intermediate_size}")
    elif (engine.enable_expert_parallel or engine.moe_expert_parallel_size or engine.moe_tensor_parallel_size
          or engine.enable_eplb):
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
    if workload.classes:
        # Each class's own lengths: the random_* keys do not apply to class traffic.
        for i, c in enumerate(workload.classes):
            longest = (length_bounds(c.input_len, c.range_ratio, min_tokens=1)[1]
                       + length_bounds(c.output_len, c.range_ratio, min_tokens=1)[1])
            if longest > engine.max_model_len:
                fail(f"workload.classes[{i}].input_len", c.input_len,
                     f"class {c.name!r}: prompt plus output can reach {longest} tokens, over "
                     f"max_model_len={engine.max_model_len}")
    elif workload.dataset_name in ("random", "fixed"):
        if workload.dataset_name == "random":
            # The rule `generate` enforces (as vLLM's RandomDataset does; a rate profile's requests too),
            # caught on load so that `kernelsight check` and a sweep's grid see it before anything runs.
            low = length_bounds(workload.random_input_len, workload.random_range_ratio, min_tokens=0)[0]
            if workload.random_prefix_len + low < 1:
                fail("workload.random_input_len", workload.random_input_len,
                     f"with random_range_ratio={workload.random_range_ratio} and random_prefix_len=0 a prompt "
                     "can have 0 tokens; raise random_input_len or random_prefix_len, or lower the ratio")
        longest = workload.max_request_tokens()
        if longest > engine.max_model_len:
            fail("workload.random_input_len", workload.random_input_len,
                 f"prompt plus output can reach {longest} tokens, over max_model_len={engine.max_model_len}")


def _check_speculation(source: str, model: ModelSpec, draft: ModelSpec | None, engine: EngineParams,
                       workload: WorkloadSpec) -> None:
    """Rules of `[engine] speculative_config` against the model and the other engine keys."""
    config = engine.speculative_config
    assert config is not None

    def fail(key: str, value: object, rule: str) -> None:
        raise ConfigError(source=source, key=f"engine.speculative_config.{key}", value=value, rule=rule)

    if model.linear_attention is not None:
        fail("method", config.method, f"{model.name} has linear-attention layers: verifying draft tokens needs "
             "their per-token state checkpoints, which are not modelled yet; simulate it without speculation")
    if config.method == "mtp" and not model.num_nextn_predict_layers:
        fail("method", config.method, f"{model.name} has no multi-token-prediction layers "
             "(config.json num_nextn_predict_layers = 0); use eagle, eagle3, ngram or draft_model")
    if engine.pipeline_parallel_size > 1:
        fail("method", config.method, "vLLM does not run speculative decoding with pipeline_parallel_size > 1")
    k = config.num_speculative_tokens
    mean = workload.spec_mean_acceptance_length
    if mean is not None and mean > k + 1:
        raise ConfigError(source=source, key="workload.spec_mean_acceptance_length", value=mean,
                          rule=f"must be <= num_speculative_tokens + 1 = {k + 1} (a step emits at most k + 1 tokens)")
    if draft is not None:
        tp = engine.tensor_parallel_size
        if draft.num_attention_heads % tp or draft.intermediate_size % tp:
            fail("model", config.model or config.method,
                 f"the draft runs at tensor_parallel_size={tp}, which must divide its "
                 f"num_attention_heads={draft.num_attention_heads} and intermediate_size={draft.intermediate_size}")
        if config.method == "draft_model" and draft.vocab_size != model.vocab_size:
            fail("model", config.model, f"the draft's vocab_size={draft.vocab_size} must equal the target's "
                 f"{model.vocab_size} (vLLM verifies draft tokens by id)")
