"""The SGLang launch line for a scenario's parallel layout and batch settings.

SGLang counts GPUs differently from vLLM: `--tp-size` is every GPU of the engine, and attention
data parallelism (`--enable-dp-attention` with `--dp-size D`) splits those GPUs into D attention
groups of tp/D GPUs each, while the MoE layers still span all of them. Expert parallelism is
`--ep-size`; with it above 1 under attention DP the experts exchange tokens through DeepEP
(`--moe-a2a-backend deepep`, whose auto mode runs the normal kernels for prefill and the low-latency
ones for decode, as the simulator prices them); without attention DP every rank holds the whole batch
and the line keeps SGLang's default (no all-to-all), as the simulator prices it
(`sim.graph.moe.uses_expert_all_to_all`). For a dense model, data parallelism is plain replication (`--dp-size`
without attention DP). Settings without an SGLang flag (prefix caching on, the routing skew,
kernelsight's own keys) are left out; a hybrid linear-attention model's line carries
`--mamba-full-memory-ratio`. Under DP attention SGLang divides `--max-running-requests` and
`--chunked-prefill-size` among the DP ranks, so the line gives DP times the per-rank (vLLM-style)
values the scenario holds.
"""

from __future__ import annotations

import shlex

from orchestrator.sweep.vllm_command import QUANTIZATION_FLAG
from sim.graph.moe import uses_expert_all_to_all
from sim.specs.catalog import serve_model_id
from sim.specs.scenario import Scenario

_SPECULATIVE_ALGORITHM = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft_model": "STANDALONE",
                          "ngram": "NGRAM"}
"""vLLM's `speculative_config.method` -> SGLang's `--speculative-algorithm` (NEXTN: the model's own MTP
layer; STANDALONE: a separate draft model)."""


def sglang_launch_command(scenario: Scenario) -> str:
    """`python -m sglang.launch_server ...` for one engine of `scenario`."""
    engine = scenario.engine
    model = serve_model_id(str(scenario.sections()["model"]["name"]))
    tp, dp = engine.tensor_parallel_size, engine.data_parallel_size
    moe = scenario.model.moe is not None
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    dp_attention = moe and dp > 1
    per_rank = dp if dp_attention else 1
    if dp_attention:
        args += ["--tp-size", str(tp * dp), "--dp-size", str(dp), "--enable-dp-attention"]
    else:
        args += ["--tp-size", str(tp)]
        if dp > 1:
            args += ["--dp-size", str(dp)]
    if engine.pipeline_parallel_size > 1:
        args += ["--pp-size", str(engine.pipeline_parallel_size)]
    ep = engine.expert_parallel_size() if moe else 1
    if ep > 1:
        args += ["--ep-size", str(ep)]
        if uses_expert_all_to_all(engine):
            args += ["--moe-a2a-backend", "deepep"]
    if engine.max_model_len is not None:
        args += ["--context-length", str(engine.max_model_len)]
    if engine.max_num_seqs is not None:
        args += ["--max-running-requests", str(engine.max_num_seqs * per_rank)]
    if engine.max_num_batched_tokens is not None:
        chunk = engine.max_num_batched_tokens * per_rank if engine.enable_chunked_prefill else -1
        args += ["--chunked-prefill-size", str(chunk)]
    if not engine.enable_prefix_caching:
        args.append("--disable-radix-cache")
    if engine.quantization is not None:
        args += ["--quantization", QUANTIZATION_FLAG[engine.quantization]]
    if engine.kv_cache_dtype.startswith("fp8"):
        args += ["--kv-cache-dtype", "fp8_e4m3" if engine.kv_cache_dtype in ("fp8", "fp8_e4m3") else "fp8_e5m2"]
    args += ["--mem-fraction-static", f"{engine.gpu_memory_utilization:g}"]
    if scenario.model.linear_attention is not None:
        # Hybrid linear-attention models: the state pool : KV split the simulation sized memory with.
        args += ["--mamba-full-memory-ratio", f"{engine.mamba_full_memory_ratio:g}"]
    if engine.enforce_eager:
        args.append("--disable-cuda-graph")
    spec = engine.speculative_config
    if spec is not None:
        # A chain of k drafts (top-k 1), verified as k + 1 tokens, as the simulator prices it.
        k = spec.num_speculative_tokens
        args += ["--speculative-algorithm", _SPECULATIVE_ALGORITHM[spec.method]]
        if spec.model is not None:
            args += ["--speculative-draft-model-path", serve_model_id(spec.model)]
        if spec.quantization is not None:
            args += ["--speculative-draft-model-quantization", QUANTIZATION_FLAG[spec.quantization]]
        if spec.method != "ngram":
            args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        args += ["--speculative-num-draft-tokens", str(k + 1)]
    return shlex.join(args)


def sglang_pool_commands(scenario: Scenario) -> dict[str, str]:
    """One SGLang launch line per pool of a disaggregated `scenario` (`--disaggregation-mode prefill`
    / `decode`, NIXL transfer); empty when the scenario is aggregated. SGLang's router
    (`python -m sglang_router.launch_router --pd-disaggregation`) or Dynamo fronts them."""
    if scenario.disaggregation is None:
        return {}
    return {pool.name: sglang_launch_command(pool.scenario)
            + f" --disaggregation-mode {pool.name} --disaggregation-transfer-backend nixl"
            for pool in scenario.disaggregation.pools()}
