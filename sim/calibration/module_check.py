"""MLA module check: the simulator's kernels of an MLA attention module, summed, against each engine's
own measured module (`mla_module_context`, `mla_module_generation`).

The module tables time the whole attention block as the engine's DeepSeek code runs it (projections,
norms, RoPE, the absorb batched matmuls, attention, `o_proj`), so they say which bare kernel series
are the engine's serving path: a bare series slower than the whole module is not. Each measured row
(FP8 block-scaled GEMMs, the row's KV-cache format, DeepSeek-V3 geometry at the row's heads per
GPU) becomes one step of the simulator with that engine's shipped profile (its kernel sources
included) and the chosen kernel-model tier; the module's kernels of one layer are summed and
compared. Prefill rows under `MIN_PREFILL_TOKENS` are left out: there the engines' eager module
timing shows a host floor (SGLang ~0.62 ms), which the engine profile prices as launch cost, not
kernel time. A sample is drawn per (GPU, engine, phase) in a fixed hash order of the rows' keys.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import pandas as pd

from sim.api import load_engine_profile, predict_step, scenario_efficiency
from sim.calibration.select import efficiency_model_for
from sim.graph.batch import BatchShape, PrefillChunk
from sim.measured.files import resolve
from sim.perf.efficiency import EfficiencyModel
from sim.perf.profile import TABLE_SOURCE_KEYS, EngineProfile
from sim.specs.scenario import Scenario, scenario_from_dict

MODULE_KERNELS: Final[dict[str, frozenset[str]]] = {
    "prefill": frozenset({"fused_qkv_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_layernorm", "rotary_emb",
                          "mla_kv_b_proj", "mla_prefill", "o_proj"}),
    "decode": frozenset({"fused_qkv_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_layernorm", "rotary_emb",
                         "mla_gen_pre", "mla_decode", "mla_gen_post", "o_proj"}),
}
"""The simulator's kernels of one MLA attention module, per phase (`sim.graph.mla`)."""
TABLES: Final = {"prefill": "mla_module_context", "decode": "mla_module_generation"}
ATTENTION: Final = {"prefill": "mla_prefill", "decode": "mla_decode"}
"""The attention kernel of the module per phase; also its `[kernel_sources]` key (`TABLE_SOURCE_KEYS`)."""
MIN_PREFILL_TOKENS: Final = 4096
MODEL: Final = "deepseek-ai/DeepSeek-V3"
TOTAL_HEADS: Final = 128
BACKENDS: Final = ("sglang", "trtllm", "vllm")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModuleScore:
    gpu: str
    backend: str
    phase: str
    rows: int
    median_ratio: float
    """Median of simulated / measured module latency."""
    p10_ratio: float
    p90_ratio: float
    median_abs_log: float
    """Median of |log(simulated / measured)|."""
    attention_share: float
    """Median share of the attention kernel (`mla_prefill` / `mla_decode`) in the simulated module."""
    by_attention_source: tuple[tuple[str, float, float], ...] = ()
    """With candidates: (backend, median ratio, median abs log ratio) of the module with its attention
    kernel priced by that backend's rows instead (the engine's other kernels unchanged)."""


def _order(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def module_rows(root: Path, gpu: str, backend: str, phase: str, sample: int | None) -> pd.DataFrame:
    """The engine's measured module rows of `phase` the check scores (FP8 block GEMMs; prefill rows
    of at least `MIN_PREFILL_TOKENS` tokens), at most `sample` of them in a fixed hash order."""
    path = resolve(root / "aiconfigurator" / gpu / f"{TABLES[phase]}.csv.gz")
    if not path.is_file():
        return pd.DataFrame()
    df = pd.read_csv(path)
    df = df[(df["backend"] == backend) & (df["gemm_type"] == "fp8_block")]
    if phase == "prefill":
        df = df[df["batch_size"] * df["seq_len"] >= MIN_PREFILL_TOKENS]
    length = "seq_len" if phase == "prefill" else "kv_len"
    keys = ["|".join(map(str, k)) for k in zip(df["kernel_source"], df["kv_cache_dtype"], df["num_heads"],
                                               df["batch_size"], df[length], strict=True)]
    df = df.assign(_order=[_order(k) for k in keys]).sort_values("_order").drop(columns="_order")
    return df if sample is None else df.head(sample)


def module_scenario(gpu: str, backend: str, heads: int, kv_cache_dtype: str, tier: str) -> Scenario:
    """DeepSeek-V3 on `gpu` with `TOTAL_HEADS / heads`-way tensor parallelism, `backend`'s profile."""
    return scenario_from_dict({
        "hardware": {"name": gpu}, "model": {"name": MODEL},
        "engine": {"backend": backend, "tensor_parallel_size": TOTAL_HEADS // heads,
                   "kv_cache_dtype": "fp8" if kv_cache_dtype == "fp8" else "auto", "max_model_len": 163840},
        "perf": {"tier": tier},
        "workload": {"num_prompts": 1, "random_input_len": 16, "random_output_len": 4},
    }, source=f"module check {gpu} {backend}")


def simulated_module_s(scenario: Scenario, efficiency: EfficiencyModel, phase: str, batch: int,
                       length: int) -> tuple[float, float]:
    """(module seconds, attention seconds) of one layer: the module's kernels of a step of `batch`
    prompts of `length` tokens (prefill) or `batch` decodes at `length` tokens of KV (decode)."""
    if phase == "prefill":
        shape = BatchShape(prefills=(PrefillChunk(new_tokens=length),) * batch)
    else:
        shape = BatchShape(decode_context_tokens=(max(length - 1, 1),) * batch)
    timing = predict_step(scenario, shape, efficiency=efficiency)
    names = MODULE_KERNELS[phase]
    attention = ATTENTION[phase]
    total = attn = 0.0
    for k in timing.kernels:
        if k.estimate.work.name in names:
            total += k.estimate.time_s
            if k.estimate.work.name == attention:
                attn += k.estimate.time_s
    return total, attn


def _models(scenario: Scenario, profile: EngineProfile, table: str, sources: Sequence[str]) -> list[EfficiencyModel]:
    """The engine's kernel model, then one per candidate backend pricing `table`'s kernels."""
    own = scenario_efficiency(scenario, profile)
    table_backends = profile.kernel_sources.table_backends()
    return [own, *(efficiency_model_for(scenario.hardware, tier=scenario.perf.tier, backend=profile.backend,
                                        gemm_backends=profile.kernel_sources.gemm,
                                        table_backends={**table_backends, table: source})
                   for source in sources)]


def check_modules(root: Path, gpus: Sequence[str], backends: Sequence[str] = BACKENDS, *,
                  tier: str = "cross-generation", sample: int | None = None, candidates: bool = False,
                  progress: Callable[[str], None] | None = None) -> list[ModuleScore]:
    """Scores per (GPU, engine, phase) that has measured module rows; `candidates`: also with the
    attention kernel priced by each backend's rows (how `[kernel_sources] mla_prefill` / `mla_decode`
    are chosen, docs/validation.md)."""
    sources = BACKENDS if candidates else ()
    out: list[ModuleScore] = []
    for gpu in gpus:
        for backend in backends:
            profile = load_engine_profile(backend)
            for phase in ("prefill", "decode"):
                rows = module_rows(root, gpu, backend, phase, sample)
                if rows.empty:
                    continue
                table = TABLE_SOURCE_KEYS[ATTENTION[phase]]
                models: dict[tuple[int, str], tuple[Scenario, list[EfficiencyModel]]] = {}
                ratios: list[float] = []
                shares: list[float] = []
                alt: list[list[float]] = [[] for _ in sources]
                length = "seq_len" if phase == "prefill" else "kv_len"
                columns = zip(rows["num_heads"].to_numpy(int), rows["kv_cache_dtype"].to_numpy(str),
                              rows["batch_size"].to_numpy(int), rows[length].to_numpy(int),
                              rows["latency_ms"].to_numpy(float), strict=True)
                for heads, kv_dtype, batch, tokens, latency_ms in columns:
                    key = (int(heads), str(kv_dtype))
                    if key not in models:
                        sc = module_scenario(gpu, backend, *key, tier)
                        models[key] = (sc, _models(sc, profile, table, sources))
                    sc, effs = models[key]
                    measured_s = float(latency_ms) * 1e-3
                    total, attn = simulated_module_s(sc, effs[0], phase, int(batch), int(tokens))
                    ratios.append(total / measured_s)
                    shares.append(attn / total if total > 0 else math.nan)
                    for i, eff in enumerate(effs[1:]):
                        alt[i].append(simulated_module_s(sc, eff, phase, int(batch), int(tokens))[0] / measured_s)
                ratio = np.asarray(ratios)
                out.append(ModuleScore(
                    gpu=gpu, backend=backend, phase=phase, rows=len(ratio), median_ratio=float(np.median(ratio)),
                    p10_ratio=float(np.quantile(ratio, 0.1)), p90_ratio=float(np.quantile(ratio, 0.9)),
                    median_abs_log=float(np.median(np.abs(np.log(ratio)))),
                    attention_share=float(np.nanmedian(np.asarray(shares))),
                    by_attention_source=tuple((src, float(np.median(a)), float(np.median(np.abs(np.log(a)))))
                                              for src, a in zip(sources, map(np.asarray, alt), strict=True))))
                if progress is not None:
                    progress(f"{gpu} {backend} {phase}: {len(ratio)} rows")
    return out


def render_module_section(scores: Sequence[ModuleScore], command: str, wall_s: float, tier: str,
                          eval_only: Sequence[str]) -> str:
    lines = [
        "## MLA modules",
        "",
        f"Regenerate with `{command}` (took {wall_s:.0f} s on the 2-core box). The simulator's kernels of one "
        "MLA attention module (projections, norms, RoPE, absorb BMMs, attention, `o_proj`), summed, against "
        "each engine's own measured module (`mla_module_context` / `mla_module_generation`: the engine's "
        f"DeepSeek code timed as a whole), {tier} tier (the shipped model, fitted on the dev GPUs' kernel "
        "tables: in sample on them, out of sample on b200_sxm), each engine's shipped profile and kernel sources, "
        f"FP8 block GEMMs; prefill rows of at least {MIN_PREFILL_TOKENS:,} tokens (below, the eager module "
        "timing is host-bound). A ratio far from 1 says a bare kernel series is not the engine's serving "
        "path (docs/validation.md, Kernel sources). GPUs marked evaluation only were not looked at for any choice.",
        "",
        "| GPU | engine | phase | rows | median simulated / measured (p10, p90) | median abs log ratio "
        "| attention share |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        gpu = f"{s.gpu} (evaluation only)" if s.gpu in eval_only else s.gpu
        lines.append(f"| {gpu} | {s.backend} | {s.phase} | {s.rows} | {s.median_ratio:.2f} ({s.p10_ratio:.2f}, "
                     f"{s.p90_ratio:.2f}) | {s.median_abs_log:.3f} | {100 * s.attention_share:.0f}% |")
    with_sources = [s for s in scores if s.by_attention_source]
    if with_sources:
        names = [src for src, _, _ in with_sources[0].by_attention_source]
        lines += ["", "Attention kernel priced by each backend's rows instead (median abs log ratio, median ratio); "
                  "the engine's other kernels as shipped:", "",
                  "| GPU | engine | phase | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
        for s in with_sources:
            gpu = f"{s.gpu} (evaluation only)" if s.gpu in eval_only else s.gpu
            cells = " | ".join(f"{lg:.3f} ({r:.2f})" for _, r, lg in s.by_attention_source)
            lines.append(f"| {gpu} | {s.backend} | {s.phase} | {cells} |")
    return "\n".join(lines) + "\n"
