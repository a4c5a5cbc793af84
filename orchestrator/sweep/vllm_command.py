"""The `vllm serve` command line for a scenario's engine settings, and the `kernelsight run` line.

The model is the one the scenario names (`sim.specs.catalog.serve_model_id`): its id or alias as
written (the current name of a renamed Hub repo), or the checkpoint directory of a local config.

Only settings that differ from vLLM's defaults are written, plus the model, the parallelism and
`--max-model-len`. kernelsight's own keys (`launch_mode`, `scheduler`, `router`, `backend`) have
no vLLM flag and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any, Final

from orchestrator.sweep.multinode import HEAD_NODE_IP, NodeLine, nodes_header, nodes_per_group, render
from sim.api import load_host_params
from sim.graph.moe import uses_expert_all_to_all
from sim.specs.catalog import serve_model_id
from sim.specs.engine import EngineParams
from sim.specs.scenario import Scenario

QUANTIZATION_FLAG: Final[dict[str, str]] = {"fp8": "fp8", "fp8_block": "fp8", "mxfp4": "mxfp4",
                                             "nvfp4": "modelopt_fp4"}
"""`[engine] quantization` -> the `--quantization` method of vLLM and SGLang: block-scaled FP8
checkpoints load through `fp8` (the block size is in their config), NVFP4 is ModelOpt's `modelopt_fp4`."""

_FLAGS: Final[tuple[tuple[str, str], ...]] = (
    ("pipeline_parallel_size", "--pipeline-parallel-size"),
    ("enable_expert_parallel", "--enable-expert-parallel"),
    ("enable_eplb", "--enable-eplb"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("enable_chunked_prefill", "--enable-chunked-prefill"),
    ("enable_prefix_caching", "--enable-prefix-caching"),
    ("long_prefill_token_threshold", "--long-prefill-token-threshold"),
    ("max_num_partial_prefills", "--max-num-partial-prefills"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("block_size", "--block-size"),
    ("dtype", "--dtype"),
    ("quantization", "--quantization"),
    ("kv_cache_dtype", "--kv-cache-dtype"),
    ("enforce_eager", "--enforce-eager"),
    ("async_scheduling", "--async-scheduling"),
)


ALL2ALL_BACKEND: Final = {"aggregated": "deepep_low_latency", "prefill": "deepep_high_throughput",
                          "decode": "deepep_low_latency"}
"""vLLM's `--all2all-backend` for an engine whose experts exchange tokens over attention-DP ranks: the
simulator prices DeepEP there (`sim.graph.moe.uses_expert_all_to_all`), vLLM's default is
`allgather_reducescatter`; low-latency mode where decodes dominate, high-throughput in a prefill pool."""


def vllm_serve_command(scenario: Scenario, *, data_parallel_size: int | None = None,
                       role: str = "aggregated", extra: tuple[str, ...] = ()) -> str:
    """`vllm serve MODEL ...` for one replica group of `scenario` (`--data-parallel-size` if > 1);
    `role`: `aggregated`, or the disaggregated pool it serves (`prefill`, `decode`); `extra`: words
    every line ends with before the node's own (`--kv-transfer-config ...`). An engine over
    more GPUs than a node holds gets one line per node under `# node k: ...` comments
    (`vllm_node_lines`)."""
    nodes = vllm_node_lines(scenario, data_parallel_size=data_parallel_size, role=role, extra=extra)
    return render(vllm_nodes_header(scenario, data_parallel_size), nodes)


DP_RPC_PORT: Final = 13345
"""`--data-parallel-rpc-port` of a multi-node data-parallel engine (vLLM's docs' example; every node
passes the same one)."""


def vllm_node_lines(scenario: Scenario, *, data_parallel_size: int | None = None,
                    role: str = "aggregated", extra: tuple[str, ...] = ()) -> list[NodeLine]:
    """The `vllm serve` line of each node the engine spans: one when its TP x PP x DP GPUs fit a node
    (`hardware.num_gpus_per_node`). Data-parallel ranks that each fit a node spread over nodes as vLLM's
    data-parallel deployment guide starts them: node 0 serves the API with `--data-parallel-size-local
    L --data-parallel-address $HEAD_NODE_IP --data-parallel-rpc-port P`, the others add `--headless
    --data-parallel-start-rank R`. A replica (TP x PP) wider than a node uses vLLM's multi-node
    multiprocessing executor (vLLM >= 0.11, `--nnodes N --node-rank R --master-addr $HEAD_NODE_IP`,
    `--headless` but on node 0), which also places the data-parallel ranks by node rank."""
    env, words = _vllm_args(scenario, data_parallel_size=data_parallel_size, role=role)
    args = (*words, *extra)
    engine = scenario.engine
    per_node = scenario.hardware.num_gpus_per_node
    world = engine.world_size()
    dp = engine.data_parallel_size if data_parallel_size is None else data_parallel_size
    if world * dp <= per_node:
        return [NodeLine(args=args, role="", env=env)]
    out = []
    if world <= per_node:
        local = per_node // world
        for k in range(-(-dp // local)):
            first, n = k * local, min(local, dp - k * local)
            ranks = f"DP rank {first}" if n == 1 else f"DP ranks {first}-{first + n - 1}"
            own = (["--headless"] if k else []) + ["--data-parallel-size-local", str(n)]
            own += ["--data-parallel-start-rank", str(first)] if k else []
            own += ["--data-parallel-address", HEAD_NODE_IP, "--data-parallel-rpc-port", str(DP_RPC_PORT)]
            out.append(NodeLine(args=(*args, *own), env=env,
                                role=f"API server and {ranks}" if k == 0 else f"headless, {ranks}"))
        return out
    group = nodes_per_group(world, per_node)
    for r in range(dp * group):
        own = ["--nnodes", str(dp * group), "--node-rank", str(r), "--master-addr", HEAD_NODE_IP]
        share = f"GPUs {world // group * (r % group)}-{world // group * (r % group + 1) - 1} of DP rank {r // group}"
        out.append(NodeLine(args=(*args, *own, *(["--headless"] if r else [])), env=env,
                            role=f"API server, {share}" if r == 0 else f"headless, {share}"))
    return out


def vllm_nodes_header(scenario: Scenario, data_parallel_size: int | None = None) -> str:
    """The comment above the node lines of an engine wider than a node (`multinode.nodes_header`)."""
    engine = scenario.engine
    world = engine.world_size()
    dp = engine.data_parallel_size if data_parallel_size is None else data_parallel_size
    return nodes_header(scenario, world * dp, nodes_per_group(world, scenario.hardware.num_gpus_per_node) * dp
                        if world > scenario.hardware.num_gpus_per_node
                        else -(-dp // (scenario.hardware.num_gpus_per_node // world)))


def _vllm_args(scenario: Scenario, *, data_parallel_size: int | None, role: str) -> tuple[str, list[str]]:
    """The environment prefix ("" or `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 `) and words of one `vllm serve` line."""
    asked: Mapping[str, Any] = scenario.sections().get("engine", {})
    default = EngineParams()
    engine = scenario.engine
    model = serve_model_id(str(scenario.sections()["model"]["name"]))
    args = ["vllm", "serve", model, "--tensor-parallel-size", str(engine.tensor_parallel_size)]
    dp = engine.data_parallel_size if data_parallel_size is None else data_parallel_size
    if dp > 1:
        args += ["--data-parallel-size", str(dp)]
    args += ["--max-model-len", str(engine.max_model_len)]
    for field, flag in _FLAGS:
        value = asked.get(field, getattr(default, field))
        if value is None or value == getattr(default, field):
            continue
        if isinstance(value, bool):
            args.append(flag if value else f"--no-{flag[2:]}")
        elif field == "quantization":
            args += [flag, QUANTIZATION_FLAG[str(value)]]
        else:
            args += [flag, str(value)]
    spec = engine.speculative_config
    if spec is not None:
        # vLLM's `--speculative-config` JSON: the keys the scenario set, in vLLM's spelling.
        config = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None}
        if "model" in config:
            config["model"] = serve_model_id(config["model"])
        if "quantization" in config:
            config["quantization"] = QUANTIZATION_FLAG[config["quantization"]]
        args += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    if scenario.model.moe is not None and uses_expert_all_to_all(engine) and dp > 1:
        args += ["--all2all-backend", ALL2ALL_BACKEND[role]]
    capture = asked.get("max_cudagraph_capture_size")
    if capture is not None:
        # In scheduled tokens, vLLM's unit; a profile that counts requests (SGLang's, TensorRT-LLM's)
        # captured that many verifying decodes of 1 + k tokens each.
        in_tokens = load_host_params(engine.backend).graph_capture_unit == "tokens"
        tokens = capture if in_tokens else capture * (1 + engine.num_speculative_tokens())
        args += ["--max-cudagraph-capture-size", str(tokens)]
    redundant = asked.get("num_redundant_experts", 0)
    if redundant:
        args += ["--eplb-config", json.dumps({"num_redundant_experts": redundant})]
    if scenario.sections()["model"].get("max_position_embeddings") is not None:
        # `[model] max_position_embeddings`: vLLM serves past the config's positions only when told to.
        return "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 ", args
    return "", args


PREQUANTIZED_ONLY: Final = ("nvfp4", "mxfp4")
"""`[engine] quantization` formats neither vLLM nor SGLang quantizes to at load time (`modelopt_fp4`
and `mxfp4` read scales from the checkpoint; online quantization is FP8 only)."""


def checkpoint_note(scenario: Scenario) -> str | None:
    """Why the launch lines need another checkpoint than `[model] name`, or None: an NVFP4 / MXFP4
    `[engine] quantization` of a model whose checkpoint is not quantized to that format (a BF16 repo
    id with `--quantization modelopt_fp4` does not start)."""
    engines = ([p.scenario for p in scenario.disaggregation.pools()] if scenario.disaggregation is not None
               else [scenario])
    for s in engines:
        fmt = s.engine.quantization
        if fmt in PREQUANTIZED_ONLY and s.model.weight_quantization != fmt:
            name = serve_model_id(str(s.sections()["model"]["name"]))
            return (f"{name} is not quantized to {fmt}, and vLLM / SGLang quantize at load time to fp8 only: "
                    f"serve a checkpoint quantized to {fmt} (e.g. with NVIDIA ModelOpt) in its place, same flags")
    return None


def kernelsight_run_command(scenario_path: str, overrides: Mapping[str, Any]) -> str:
    args = ["kernelsight", "run", scenario_path]
    for key, value in overrides.items():
        text = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        args += ["--set", f"{key}={text}"]
    return shlex.join(args)


KV_TRANSFER_CONFIG: Final = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'
"""vLLM's NIXL connector, as its disaggregated-serving examples start both pools."""


def vllm_pool_commands(scenario: Scenario) -> dict[str, str]:
    """One `vllm serve` line per pool of a disaggregated `scenario` (keys `prefill`, `decode`), each
    with the pool's parallelism and engine flags and the NIXL `--kv-transfer-config`; empty when the
    scenario is aggregated. A proxy (vLLM's disaggregated proxy or Dynamo's frontend) fronts them."""
    if scenario.disaggregation is None:
        return {}
    out: dict[str, str] = {}
    for pool in scenario.disaggregation.pools():
        out[pool.name] = vllm_serve_command(pool.scenario, role=pool.name,
                                            extra=("--kv-transfer-config", KV_TRANSFER_CONFIG))
    return out


def pool_comment(scenario: Scenario, name: str) -> str:
    """`# prefill pool: 2 workers x 8 GPUs (b200_sxm)` for the lines above."""
    assert scenario.disaggregation is not None
    pool = next(p for p in scenario.disaggregation.pools() if p.name == name)
    workers = f"{pool.num_workers} worker{'s' if pool.num_workers > 1 else ''}"
    return f"# {name} pool: {workers} x {pool.scenario.engine.num_gpus()} GPUs ({pool.scenario.hardware.name})"
