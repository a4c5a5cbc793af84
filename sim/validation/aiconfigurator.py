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

Parallel layout (`layout_of`): the row's TP / attention-DP / MoE-TP x MoE-EP become the `[engine]`
keys one to one, except where the file's own encoding is known to differ from the deployment:
- the `2026-04-06.csv` and `db-dump/...` exports write an InferenceX `tpN_epM` deployment (N GPUs:
  attention TP N, or attention DP N with `dp-attn`; experts over EP M, MoE-TP N / M) as if it had
  N x M GPUs (DeepSeek-R1 `tp8_ep8`: tp_size 64 or attention_dp 64, moe 8 x 8; vLLM Kimi-K2.5
  `tp4_ep4`: tp 4 x attention_dp 4, moe_ep 16); the `2026-03-25.csv` and `kimi-k2.5-ga` exports
  write the same deployments as N GPUs. These rows are read back as N GPUs;
- NVIDIA's collection leaves `attention_dp_size` empty: a MoE split over k x tp GPUs is vLLM's
  data parallelism (experts over TP x DP), so DP = k; a TensorRT-LLM row whose `batch_size` is
  concurrency / tp ran attention DP over its tp GPUs.
Each such reading is noted on the row. The client concurrency C is spread over the DP ranks
(each a replica of the simulator's router; `max_num_seqs` is the per-rank batch C / DP).

Weight formats: `engine.quantization` is the row's expert format (`moe_quant_mode`; dense models:
`gemm_quant_mode`), except where the catalog checkpoint already ships that family (DeepSeek
block FP8, MiniMax-M2.5 block FP8, Kimi-K2.5 int4 W4A16 experts, gpt-oss MXFP4 experts): the
checkpoint's own format stands (a block-scaled checkpoint is served block-scaled whatever the label).
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sim.errors import ConfigError
from sim.measured import open_text
from sim.perf.profile import EngineProfile
from sim.validation.engine_args import memory_utilization_for, profile_engine
from sim.validation.names import CHECKPOINT_QUANTIZED, GPU_NAMES, MODEL_NAMES, QUANTIZATION
from sim.validation.rows import DUPLICATE_PREFIX, Family, Replay, ValidationRow, suite_of
from sim.validation.specs_cache import SpecCache

FILE = "aiconfigurator_silicon_sample.csv"
REQUESTS_PER_CONCURRENCY = 10
"""Both protocols send 10 x C requests (InferenceX: `--num-prompts $((CONC * 10))`)."""
INFLATING_EXPORTS: Final = ("2026-04-06.csv", "db-dump/")
"""InferenceX exports whose layout columns count an N-GPU `tpN_epM` deployment as N x M GPUs."""
_ID_LAYOUT = re.compile(r"_tp(\d+)_ep(\d+)_\d+$")
TRTLLM_LLAMA70B_1K_BATCH_WAIT: Final = {"batch_wait_timeout_iters": 20, "batch_wait_max_tokens_ratio": 0.9}
"""InferenceX's TensorRT-LLM Llama-3.1-70B recipes (`benchmarks/70b_fp8_{h200,b200}_trt_slurm.sh`,
SemiAnalysisAI/InferenceX) turn on TRT-LLM batch waiting for ISL = OSL = 1024 below TP 8 ("will
improve the performance"): a prompt that arrives while decodes run waits up to 20 iterations. It is
part of the measured deployment, not a fitted number; without it those rows' TTFT is under-predicted
by about 20 decode steps."""
TRTLLM_DEEPSEEK_ADP_BALANCE: Final = {"attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
                                      "attention_dp_batching_wait_iters": 0}
"""InferenceX's TensorRT-LLM DeepSeek-R1 recipes (`benchmarks/dsr1_fp8_{h200,b200}_trt.sh`,
`dsr1_fp4_b200_trt.sh` and their `_slurm` / `_mtp` variants, SemiAnalysisAI/InferenceX) write
`attention_dp_config: {batching_wait_iters: 0, enable_balance: true, timeout_iters: 60}` whenever
`DP_ATTENTION` is true: a context request waits until every attention-DP rank has one, 60
iterations pass, or a rank has no generation request (`sim.serving.adp_balance`). Part of the
measured deployment, not a fitted number."""
_DEEPSEEK: Final = ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3")
DP_ROUTER: Final = {"vllm": "least_outstanding", "sglang": "round_robin", "trtllm": "least_outstanding"}
"""How each engine spreads requests over attention-DP ranks: vLLM's DP coordinator and TensorRT-LLM's
attention-DP scheduler send a request to the least-loaded rank; SGLang's default
`--load-balance-method` is round robin."""
_FORMAT_FAMILY: Final = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "int4_wo": "int4_wo"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """A deployment's parallel layout as the simulator's `[engine]` keys take it."""

    tp: int
    pp: int
    dp: int
    """Attention data-parallel ranks (replicas behind the router)."""
    moe_tp: int
    moe_ep: int
    note: str = ""
    """How the layout was read where the row's columns do not say it directly."""


def _num(raw: str) -> float:
    try:
        return float(raw) if raw.strip() else math.nan
    except ValueError:
        return math.nan


def _int(raw: str, default: int) -> int:
    x = _num(raw)
    return default if math.isnan(x) or x <= 0 else int(x)


def layout_of(r: Mapping[str, str], *, moe: bool) -> Layout | str:
    """The row's parallel layout, or the exact reason it cannot be read."""
    tp, pp = _int(r["tp_size"], 1), _int(r["pp_size"], 1)
    dp_recorded = bool(r["attention_dp_size"].strip())
    dp = _int(r["attention_dp_size"], 1)
    conc = _int(r["src_concurrency"], 0)
    ratio = _num(r["conc_over_bs_x_dp"])
    unknown_load = (f"client concurrency {conc} is not batch_size x attention_dp (ratio "
                    f"{r['conc_over_bs_x_dp'] or 'n/a'}): the load the engine saw is unknown")
    if not moe:
        return unknown_load if ratio != 1.0 else Layout(tp=tp, pp=pp, dp=dp, moe_tp=1, moe_ep=1)
    moe_tp, moe_ep = _int(r["moe_tp_size"], 1), _int(r["moe_ep_size"], 1)
    src = r["src_file"]
    if src.startswith(INFLATING_EXPORTS) and moe_ep > 1 and moe_tp * moe_ep == tp * dp and ratio == 1.0:
        if moe_tp > 1 and min(tp, dp) == 1:  # TensorRT-LLM / SGLang: tp (or dp) = N x M, moe N x M
            gpus, ep, attn_dp = moe_tp, moe_ep, dp > 1
        elif moe_tp == 1 and tp > 1 and dp > 1:  # vLLM: tp N, dp M, moe_ep N x M
            gpus, ep, attn_dp = tp, dp, False
        else:
            gpus, ep, attn_dp = 0, 0, False
        named = _ID_LAYOUT.search(r["id"])
        if gpus and named is not None and (int(named[1]), int(named[2])) != (gpus, ep):
            return (f"{src} layout columns (tp {tp} x dp {dp}, moe {moe_tp} x {moe_ep}) disagree with the row id's "
                    f"tp{named[1]}_ep{named[2]}: the deployment is unknown")
        if gpus and gpus % ep == 0:
            return Layout(tp=1 if attn_dp else gpus, pp=pp, dp=gpus if attn_dp else 1, moe_tp=gpus // ep, moe_ep=ep,
                          note=f"{src} writes the InferenceX tp{gpus}_ep{ep} deployment as tp {tp} x dp {dp} "
                          f"(moe {moe_tp} x {moe_ep}) GPUs; simulated on its {gpus} GPUs"
                          + (" with attention DP" if attn_dp else ""))
    if not dp_recorded and ratio == 1.0 and moe_tp * moe_ep > tp and (moe_tp * moe_ep) % tp == 0:
        k = moe_tp * moe_ep // tp
        return Layout(tp=tp, pp=pp, dp=k, moe_tp=moe_tp, moe_ep=moe_ep,
                      note=f"attention_dp_size not recorded; experts over moe_tp {moe_tp} x moe_ep {moe_ep} = {k} x tp "
                      f"GPUs read as data parallelism {k} (the experts run over TP x DP GPUs)")
    if not dp_recorded and tp > 1 and ratio == float(tp) and moe_tp * moe_ep == tp and r["backend"] == "trtllm":
        return Layout(tp=1, pp=pp, dp=tp, moe_tp=moe_tp, moe_ep=moe_ep,
                      note=f"attention_dp_size not recorded; batch_size = concurrency / tp read as TensorRT-LLM "
                      f"attention DP over the {tp} GPUs")
    if ratio != 1.0:
        return unknown_load
    if moe_tp * moe_ep != tp * dp:
        return (f"experts split as moe_tp={moe_tp} x moe_ep={moe_ep} over tp={tp} x dp={dp} GPUs: the columns do not "
                "give one GPU count")
    return Layout(tp=tp, pp=pp, dp=dp, moe_tp=moe_tp, moe_ep=moe_ep)


def weight_format(r: Mapping[str, str], *, arch: str, checkpoint: str | None,
                  moe: bool) -> tuple[str | None, str | None] | str:
    """(`engine.quantization`, format the weights are served in), or why the format is not modelled."""
    label = ((r["moe_quant_mode"] if moe else "") or r["gemm_quant_mode"] or "").strip()
    if arch in CHECKPOINT_QUANTIZED:
        return None, checkpoint
    if label == "int4_wo":
        if checkpoint == "int4_wo":
            return None, checkpoint
        return f"weight format int4_wo (W4A16) is modelled only for checkpoints that ship it; {arch} does not"
    if label not in QUANTIZATION:
        return f"weight format {label} is not modelled"
    asked = QUANTIZATION[label]
    if asked is not None and checkpoint is not None and _FORMAT_FAMILY[asked] == _FORMAT_FAMILY[checkpoint]:
        return None, checkpoint
    return asked, asked or checkpoint


def read_aiconfigurator(path: Path, profiles: Mapping[str, EngineProfile], cache: SpecCache) -> list[ValidationRow]:
    with open_text(path) as f:
        raw = list(csv.DictReader(f))
    twins = recorded_twins(raw)
    rows = [twins.get(r["id"], r) for r in raw]
    return drop_duplicates(rows, [_row(r, profiles, cache) for r in rows])


_TWIN_KEY: Final = ("system", "backend", "isl", "osl", "src_concurrency", "silicon_ttft_ms", "silicon_tpot_ms")
_POOL_COLUMNS: Final = tuple(f"{pool}_{k}" for pool in ("prefill", "decode")
                             for k in ("batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size",
                                       "moe_tp_size", "moe_ep_size"))
TWIN_FIELD: Final = "_twin_id"
"""Set on a disaggregated row whose pool columns come from its db-dump twin (the twin's id)."""


def recorded_twins(raw: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """Disaggregated InferenceX rows (`<date>.csv` exports) with their pool columns taken from the
    `db-dump/...` row of the same measurement, by row id.

    The date exports record neither worker counts nor per-rank batch sizes, and write every pool
    as `tpN epM`, attention DP or not; NVIDIA's db-dump holds many of the same runs (the same
    system, backend, lengths and concurrency, and TTFT and TPOT equal to the last digit) with the
    deployment's `prefill_*` / `decode_*` columns: workers, batch, TP, attention DP, MoE split.
    Such a row takes its twin's columns (the twin's model label can differ: the db-dump files
    DeepSeek-R1 runs, `dsr1_...` ids, as DeepSeek-V3; the architecture is the same)."""
    dumps: dict[tuple[str, ...], dict[str, str]] = {}
    for r in raw:
        if r["mode"] == "disagg" and r["src_file"].startswith("db-dump/") and r.get("decode_num_workers"):
            dumps.setdefault(_twin_key(r), r)
    out: dict[str, dict[str, str]] = {}
    for r in raw:
        if r["mode"] != "disagg" or r["src_file"].startswith(("/", "db-dump/")) or r.get("decode_num_workers"):
            continue
        twin = dumps.get(_twin_key(r))
        if twin is not None:
            out[r["id"]] = {**r, **{c: twin[c] for c in _POOL_COLUMNS}, TWIN_FIELD: twin["id"]}
    return out


def _twin_key(r: Mapping[str, str]) -> tuple[str, ...]:
    """`_TWIN_KEY`'s columns, the measured ones as numbers to 10 significant digits (the exports
    write the same float with different last digits: 978.2979881643164 and ...163)."""
    return tuple(f"{_num(r[k]):.10g}" if k.startswith("silicon_") else r[k] for k in _TWIN_KEY)


_VERSION_BUILD: Final = re.compile(r"^(.+?)-\d{8}-[0-9a-f]{6,}$")
"""A nightly build's date and commit after its version (`nightly-dev-20260216-d3bae71e`): the db-dump
export writes them where the dated exports write `nightly-dev` for the same runs."""


def _version(text: str) -> str:
    found = _VERSION_BUILD.match(text)
    return found.group(1) if found else text


_ID_MODEL: Final = {"dsr1": "deepseek-ai/DeepSeek-R1"}
"""InferenceX short model names that start `db-dump` row ids: that export labels its `dsr1_*` runs
(InferenceX's DeepSeek-R1 recipes, the same measurements as the R1 rows of the dated exports) as
DeepSeek-V3."""


def _measurement(r: Mapping[str, str], row: ValidationRow) -> tuple[str, ...]:
    """What identifies one measurement: the deployment (system, backend and version, a nightly's
    build suffix dropped (`_version`), precision and weight formats, mode, lengths, client
    concurrency; the parallel layout as simulated where the row is an aggregated one that could be
    read) and the measured mean TTFT and TPOT to 0.01 ms (exports differ in the last bits of the same
    float, and the gap-analysis exports round it to 0.01 ms). The layout columns themselves are left
    out: the exports encode one deployment differently (`layout_of`; the db-dump export writes
    disaggregated pools as attention DP where the dated exports write TP)."""
    measured = tuple(f"{_num(r[k]):.2f}" for k in ("silicon_ttft_ms", "silicon_tpot_ms"))
    layout: tuple[str, ...] = ()
    if row.sections is not None and "disaggregation" not in row.sections:
        engine = row.sections["engine"]
        layout = tuple(str(engine.get(k, 1)) for k in ("tensor_parallel_size", "pipeline_parallel_size",
                                                       "data_parallel_size", "moe_tensor_parallel_size",
                                                       "moe_expert_parallel_size"))
    return (r["system"], r["backend"], _version(r["backend_version"]), r["precision"], r["gemm_quant_mode"],
            r["moe_quant_mode"], r["mode"], r["isl"], r["osl"], r["src_concurrency"], *layout, *measured)


def _label_disagrees(r: Mapping[str, str]) -> bool:
    named = _ID_MODEL.get(r["id"].split("_", 1)[0])
    return named is not None and named != r["model_path"]


def drop_duplicates(raw: list[dict[str, str]], rows: list[ValidationRow]) -> list[ValidationRow]:
    """Score each measurement once: the InferenceX exports (`2026-03-25.csv`, `2026-04-06.csv`,
    `db-dump/...`) carry many runs two or three times (and one export some twice). Of each set of
    rows with the same `_measurement` one is kept: one that can be simulated, then the one whose model
    label agrees with its id, then the first in the file; the others are skipped, naming it."""
    first: dict[tuple[str, ...], list[int]] = {}
    for i, r in enumerate(raw):
        if not any(math.isnan(_num(r[k])) for k in ("silicon_ttft_ms", "silicon_tpot_ms")):
            first.setdefault(_measurement(r, rows[i]), []).append(i)
    out = list(rows)
    for same in first.values():
        if len(same) < 2:
            continue
        keep = min(same, key=lambda i: (rows[i].skipped, _label_disagrees(raw[i]), i))
        for i in same:
            if i != keep:
                why = ("same measurement, model label disagrees with the row id" if _label_disagrees(raw[i])
                       else "same deployment, concurrency and measured TTFT / TPOT")
                out[i] = rows[i].with_skip(f"{DUPLICATE_PREFIX}{rows[keep].row_id}: {why}")
    return out


def _row(r: dict[str, str], profiles: Mapping[str, EngineProfile], cache: SpecCache) -> ValidationRow:
    model, system, backend = r["model_path"], r["system"], r["backend"]
    conc = _int(r["src_concurrency"], 0)
    isl, osl = _int(r["isl"], 0), _int(r["osl"], 0)
    precision = r["precision"] or "bf16"
    inferencex = not r["src_file"].startswith("/")
    arch = MODEL_NAMES.get(model)
    family: Family = cache.family(arch)
    if family == "unknown" and r.get("model_is_dense", "") in ("True", "False"):
        family = "dense" if r["model_is_dense"] == "True" else "moe"
    moe = family in ("moe", "mla")
    layout = layout_of(r, moe=moe) if r["mode"] == "agg" else None
    if isinstance(layout, Layout):
        parallel = (f"tp{layout.tp}" + (f"xdp{layout.dp}" if layout.dp > 1 else "")
                    + (f"pp{layout.pp}" if layout.pp > 1 else "")
                    + (f" moe{layout.moe_tp}x{layout.moe_ep}" if moe else ""))
    else:
        tp, dp = _int(r["tp_size"], 1), _int(r["attention_dp_size"], 1)
        parallel = f"tp{tp}" + (f"xdp{dp}" if dp > 1 else "")
    disagg = r["mode"] == "disagg"
    if disagg:
        parallel = " ".join(_pool_label(r, pool) for pool in ("prefill", "decode"))
    label = (f"{model.split('/')[-1]} {system} {backend} {r['backend_version'] or '?'} {precision} {parallel} "
             f"{isl}/{osl} c{conc}")
    notes = ["InferenceX protocol: lengths in [0.8 L, L], 10 x C requests" if inferencex else
             "NVIDIA collection: protocol not recorded; fixed lengths and 10 x C requests assumed"]
    if isinstance(layout, Layout) and layout.note:
        notes.append(layout.note)
    if r.get(TWIN_FIELD):
        notes.append(f"pool layouts, worker counts and batch sizes from {r[TWIN_FIELD]}, the same "
                     "measurement in the db-dump export (equal concurrency, TTFT and TPOT)")
    base: dict[str, Any] = {
        "row_id": f"aiconfigurator:{r['id']}", "source": "aiconfigurator", "suite": suite_of(model, system),
        "model": model, "hardware": GPU_NAMES.get(system, system), "backend": backend,
        "backend_version": r["backend_version"] or "unknown", "label": label, "family": family,
        "measured": {"ttft_mean_s": _num(r["silicon_ttft_ms"]) * 1e-3,
                     "tpot_mean_s": _num(r["silicon_tpot_ms"]) * 1e-3},
        "notes": tuple(notes), "disaggregated": disagg,
    }

    def skip(reason: str) -> ValidationRow:
        return ValidationRow(**base, skip_reason=reason)

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
    if r["mode"] not in ("agg", "disagg"):
        return skip(f"serving mode {r['mode']!r} is not modelled")
    formats = weight_format(r, arch=arch, checkpoint=spec.weight_quantization, moe=moe)
    if isinstance(formats, str):
        return skip(formats)
    quantization, served = formats
    if disagg:
        pools = _disagg_pools(r, moe=moe, conc=conc, profile=profiles[backend], quantization=quantization,
                              served=served, hw=hw, arch=arch, cache=cache)
        if isinstance(pools, str):
            return skip(pools)
        layout, pool_sections = pools
    if not isinstance(layout, Layout):
        return skip(str(layout))
    engine_extra: dict[str, Any] = {"tensor_parallel_size": layout.tp, "pipeline_parallel_size": layout.pp,
                                    "data_parallel_size": layout.dp}
    if moe:
        engine_extra.update(moe_tensor_parallel_size=layout.moe_tp, moe_expert_parallel_size=layout.moe_ep)
    if layout.dp > 1:
        engine_extra["router"] = DP_ROUTER.get(backend, "round_robin")
    per_rank = math.ceil(conc / layout.dp)
    profile = profiles[backend]
    engine = {**profile_engine(profile, quantization=quantization, max_num_seqs=per_rank, version=r["backend_version"],
                               weight_format=served, hbm_capacity_bytes=cache.hardware(hw).hbm_capacity_bytes,
                               tp_size=layout.tp * layout.dp, dp_size=layout.dp, pp_size=layout.pp),
              **engine_extra}
    if inferencex and backend == "vllm":
        engine["async_scheduling"] = True  # InferenceX vLLM recipes pass --async-scheduling
    engine["max_model_len"] = min(isl + osl + 16, spec.max_position_embeddings)
    if inferencex and backend == "trtllm" and "Llama-3.1-70B" in model and isl == osl == 1024 and layout.tp < 8:
        engine.update(TRTLLM_LLAMA70B_1K_BATCH_WAIT)
        engine["max_num_batched_tokens"] = 16384 if hw == "b200_sxm" else engine["max_model_len"]
        base["notes"] = (*base["notes"], "InferenceX TensorRT-LLM Llama-70B 1k/1k TP<8 recipe: "
                         "batch_wait_timeout_iters 20, batch_wait_max_tokens_ratio 0.9, max_num_tokens 16384 "
                         "(B200) / max_model_len (H100, H200)")
    if inferencex and backend == "trtllm" and arch in _DEEPSEEK and layout.dp > 1 and not disagg:
        engine.update(TRTLLM_DEEPSEEK_ADP_BALANCE)
        base["notes"] = (*base["notes"], "InferenceX TensorRT-LLM DeepSeek-R1 attention-DP recipe: attention_dp_config "
                         "enable_balance true, timeout_iters 60, batching_wait_iters 0")
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
    if disagg:
        for pool in pool_sections.values():
            pool["engine"]["max_model_len"] = engine["max_model_len"]
            if "async_scheduling" in engine:
                pool["engine"]["async_scheduling"] = engine["async_scheduling"]
        sections["disaggregation"] = {"connector": "nixl", **pool_sections}
    replay = Replay(kind="closed_loop", num_requests=num_requests, concurrency=conc)
    return ValidationRow(**base, sections=sections, replay=replay)


_POOL_KEYS: Final = ("num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")


def _pool_label(r: Mapping[str, str], pool: str) -> str:
    n, tp, pp, dp, mtp, mep = (r.get(f"{pool}_{k}") or "?" for k in _POOL_KEYS)
    dp_pp = (f"dp{dp}" if dp not in ("1", "?") else "") + (f"pp{pp}" if pp not in ("1", "?") else "")
    return f"{pool[0]}{n}x(tp{tp}{dp_pp} moe{mtp}x{mep})"


def _disagg_pools(r: Mapping[str, str], *, moe: bool, conc: int, profile: EngineProfile, quantization: str | None,
                  served: str | None, hw: str, arch: str,
                  cache: SpecCache) -> tuple[Layout, dict[str, dict[str, Any]]] | str:
    """The decode pool's layout (the scenario's base engine) and both pools' sections; or why not.

    Each pool: the row's `<pool>_*` layout columns as `[engine]` keys, `<pool>_num_workers` workers
    (a row that records none is not simulated: the InferenceX date exports keep neither worker counts
    nor speculative decoding, and the same layout and concurrency appear with TPOTs 1.5-2x apart),
    `max_num_seqs` = `<pool>_batch_size` per rank
    where recorded, else the client concurrency spread over the pool's ranks; the KV memory each
    pool's engine would have (`memory_utilization_for`). Transfer: NIXL (Dynamo's default).
    """
    pools: dict[str, dict[str, Any]] = {}
    layouts: dict[str, Layout] = {}
    for pool in ("prefill", "decode"):
        tp, pp = _int(r.get(f"{pool}_tp_size", ""), 1), _int(r.get(f"{pool}_pp_size", ""), 1)
        dp = _int(r.get(f"{pool}_attention_dp_size", ""), 1)
        moe_tp, moe_ep = _int(r.get(f"{pool}_moe_tp_size", ""), 1), _int(r.get(f"{pool}_moe_ep_size", ""), 1)
        if moe and moe_tp * moe_ep != tp * dp:
            return (f"{pool} pool experts split as moe_tp={moe_tp} x moe_ep={moe_ep} over tp={tp} x dp={dp} GPUs: "
                    "the columns do not give one GPU count")
        workers = _int(r.get(f"{pool}_num_workers", ""), 0)
        if workers == 0:
            return (f"{pool}_num_workers not recorded by {r['src_file']} and no db-dump twin of the measurement: "
                    "the deployment's worker counts (and whether it ran MTP) are not pinned down")
        batch = _int(r.get(f"{pool}_batch_size", ""), 0)
        per_rank = batch or math.ceil(conc / (workers * dp))
        engine = {**profile_engine(profile, quantization=quantization, max_num_seqs=per_rank,
                                   version=r["backend_version"], weight_format=served,
                                   hbm_capacity_bytes=cache.hardware(hw).hbm_capacity_bytes, tp_size=tp * dp,
                                   dp_size=dp, pp_size=pp),
                  "tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp}
        if moe:
            engine.update(moe_tensor_parallel_size=moe_tp, moe_expert_parallel_size=moe_ep)
        if dp > 1 or workers > 1:
            engine["router"] = DP_ROUTER.get(r["backend"], "round_robin")
        if "gpu_memory_utilization" not in engine:
            try:
                engine["gpu_memory_utilization"] = round(memory_utilization_for(
                    {"model": {"name": arch}, "hardware": {"name": hw}, "engine": engine}, profile, cache), 6)
            except (ConfigError, ValueError) as exc:
                return f"{pool} pool: {exc}"
        pools[pool] = {"num_workers": workers, "engine": engine}
        layouts[pool] = Layout(tp=tp, pp=pp, dp=dp, moe_tp=moe_tp, moe_ep=moe_ep)
    return layouts["decode"], pools
