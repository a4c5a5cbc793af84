"""AIConfigurator silicon sample (`e2e/aiconfigurator_silicon_sample.csv`) -> validation rows.

One row = one deployment at one client concurrency C, fixed ISL/OSL, measured mean TTFT and
TPOT (AIConfigurator's collection stores `mean_ttft`, `mean_tpot`). Two benchmark protocols are in
the file, told apart by the row's provenance:
- InferenceX (`source_file=<date>.csv` and `db-dump/...` rows): `benchmark_serving.py` with
  `--random-range-ratio 0.8 --num-prompts C x 10 --max-concurrency C --request-rate inf
  --ignore-eos`, i.e. lengths uniform in [0.8 L, L]; simulated as `random` lengths centred at
  0.9 L with range ratio L / round(0.9 L) - 1 (the same interval to within a token);
- NVIDIA's own collection (`source_file=/Users/...aic-auto-gap-analysis...`): the protocol is not
  recorded; simulated with fixed lengths and the same C x 10 closed loop (an assumption, noted on
  each row).
Engine settings the row does not record come from the backend's profile (`[defaults]`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.errors import ConfigError
from sim.measured import open_text
from sim.perf.profile import EngineProfile
from sim.validation.engine_args import profile_engine
from sim.validation.names import CHECKPOINT_QUANTIZED, GPU_NAMES, MODEL_NAMES, QUANTIZATION
from sim.validation.rows import Replay, ValidationRow, suite_of
from sim.validation.specs_cache import SpecCache

FILE = "aiconfigurator_silicon_sample.csv"
REQUESTS_PER_CONCURRENCY = 10
"""Both protocols send 10 x C requests (InferenceX: `--num-prompts $((CONC * 10))`)."""


def _num(raw: str) -> float:
    try:
        return float(raw) if raw.strip() else math.nan
    except ValueError:
        return math.nan


def _int(raw: str, default: int) -> int:
    x = _num(raw)
    return default if math.isnan(x) or x <= 0 else int(x)


def read_aiconfigurator(path: Path, profiles: Mapping[str, EngineProfile], cache: SpecCache) -> list[ValidationRow]:
    with open_text(path) as f:
        return [_row(r, profiles, cache) for r in csv.DictReader(f)]


def _row(r: dict[str, str], profiles: Mapping[str, EngineProfile], cache: SpecCache) -> ValidationRow:
    model, system, backend = r["model_path"], r["system"], r["backend"]
    tp, pp = _int(r["tp_size"], 1), _int(r["pp_size"], 1)
    dp = _int(r["attention_dp_size"], 1)
    conc = _int(r["src_concurrency"], 0)
    isl, osl = _int(r["isl"], 0), _int(r["osl"], 0)
    precision = r["precision"] or "bf16"
    inferencex = not r["src_file"].startswith("/")
    label = (f"{model.split('/')[-1]} {system} {backend} {r['backend_version'] or '?'} {precision} tp{tp}"
             + (f"xdp{dp}" if dp > 1 else "") + (f"pp{pp}" if pp > 1 else "") + f" {isl}/{osl} c{conc}")
    base: dict[str, Any] = {
        "row_id": f"aiconfigurator:{r['id']}", "source": "aiconfigurator", "suite": suite_of(model, system),
        "model": model, "hardware": GPU_NAMES.get(system, system), "backend": backend,
        "backend_version": r["backend_version"] or "unknown", "label": label,
        "measured": {"ttft_mean_s": _num(r["silicon_ttft_ms"]) * 1e-3,
                     "tpot_mean_s": _num(r["silicon_tpot_ms"]) * 1e-3},
        "notes": ("InferenceX protocol: lengths in [0.8 L, L], 10 x C requests" if inferencex else
               "NVIDIA collection: protocol not recorded; fixed lengths and 10 x C requests assumed",),
    }

    def skip(reason: str) -> ValidationRow:
        return ValidationRow(**base, skip_reason=reason)

    if r["mode"] != "agg":
        return skip("disaggregated prefill/decode serving (separate prefill and decode workers) is not modelled")
    arch = MODEL_NAMES.get(model)
    if arch is None:
        return skip(f"no model config ships for {model}")
    try:
        spec = cache.model(arch)
    except ConfigError as exc:
        return skip(f"model not supported: {exc.key}={exc.value}: {exc.rule}")
    hw = GPU_NAMES.get(system)
    if hw is None:
        return skip(f"no hardware spec for {system}")
    try:
        cache.hardware(hw)
    except ConfigError as exc:
        return skip(f"no hardware spec for {system}: {exc.rule}")
    if math.isnan(base["measured"]["ttft_mean_s"]) or math.isnan(base["measured"]["tpot_mean_s"]):
        return skip("no measured TTFT/TPOT")
    if conc < 1 or isl < 1 or osl < 1:
        return skip("no concurrency or lengths recorded")
    if _num(r["conc_over_bs_x_dp"]) != 1.0:
        return skip(f"client concurrency {conc} is not batch_size x attention_dp "
                    f"(ratio {r['conc_over_bs_x_dp'] or 'n/a'}): the load the engine saw is unknown")
    quant_label = r["gemm_quant_mode"] or ""
    if quant_label not in QUANTIZATION:
        return skip(f"weight format {quant_label} is not modelled")
    quantization = None if arch in CHECKPOINT_QUANTIZED else QUANTIZATION[quant_label]
    engine_extra: dict[str, Any] = {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp}
    if spec.moe is not None:
        moe_tp, moe_ep = _int(r["moe_tp_size"], 1), _int(r["moe_ep_size"], 1)
        if moe_tp * moe_ep != tp * dp or (moe_ep > 1 and moe_tp > 1):
            return skip(f"experts split as moe_tp={moe_tp} x moe_ep={moe_ep} over tp={tp} x dp={dp} ranks: the "
                        "simulator shards experts over all ranks (expert parallel) or slices each expert (TP)")
        engine_extra["enable_expert_parallel"] = moe_ep > 1
    elif dp > 1:
        return skip(f"attention data parallelism ({dp}) for a dense model is not modelled")
    profile = profiles[backend]
    engine = {**profile_engine(profile, quantization=quantization, max_num_seqs=conc, version=r["backend_version"]),
              **engine_extra}
    if inferencex and backend == "vllm":
        engine["async_scheduling"] = True  # InferenceX vLLM recipes pass --async-scheduling
    engine["max_model_len"] = min(isl + osl + 16, spec.max_position_embeddings)
    num_requests = REQUESTS_PER_CONCURRENCY * conc
    if inferencex:
        centre = round(0.9 * isl), round(0.9 * osl)
        workload: dict[str, Any] = {
            "dataset_name": "random", "random_input_len": centre[0], "random_output_len": centre[1],
            "random_range_ratio": min(isl / centre[0] - 1, osl / centre[1] - 1) if min(centre) > 0 else 0.0}
    else:
        workload = {"dataset_name": "fixed", "random_input_len": isl, "random_output_len": osl}
    workload.update(num_prompts=num_requests, request_rate=math.inf, max_concurrency=conc, ignore_eos=True)
    sections = {"seed": 0, "hardware": {"name": hw}, "model": {"name": arch}, "engine": engine, "workload": workload}
    replay = Replay(kind="closed_loop", num_requests=num_requests, concurrency=conc)
    return ValidationRow(**base, sections=sections, replay=replay)
