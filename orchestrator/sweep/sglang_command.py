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

from typing import Final

from orchestrator.sweep.multinode import HEAD_NODE_IP, NodeLine, join, node_ip, nodes_header, nodes_per_group, render
from orchestrator.sweep.vllm_command import QUANTIZATION_FLAG
from sim.api import load_host_params
from sim.graph.moe import uses_expert_all_to_all
from sim.specs.catalog import serve_model_id
from sim.specs.scenario import Scenario

_SPECULATIVE_ALGORITHM = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft_model": "STANDALONE",
                          "ngram": "NGRAM"}
"""vLLM's `speculative_config.method` -> SGLang's `--speculative-algorithm` (NEXTN: the model's own MTP
layer; STANDALONE: a separate draft model)."""


def sglang_launch_command(scenario: Scenario, *, extra: tuple[str, ...] = (), router: bool = True) -> str:
    """`python -m sglang.launch_server ...` for one engine of `scenario`, ending with `extra`; an
    engine over more GPUs than a node holds gets one line per node (`sglang_node_lines`) and, for
    dense replicas on several nodes with `router`, SGLang's router over them."""
    nodes = sglang_node_lines(scenario, extra=extra)
    out = render(sglang_nodes_header(scenario, len(nodes)), nodes)
    if router and len(nodes) > 1 and not _one_engine(scenario):
        heads = [node_ip(k) for k, n in enumerate(nodes) if n.role.startswith("HTTP server")]
        out += ("\n# SGLang's router over the replicas' servers (port 30000), on any host that reaches them\n"
                + join(["python", "-m", "sglang_router.launch_router", "--worker-urls",
                        *(f"http://{ip}:30000" for ip in heads)]))
    return out


def sglang_nodes_header(scenario: Scenario, num_nodes: int) -> str:
    """The comment above the node lines of an engine wider than a node (`multinode.nodes_header`)."""
    return nodes_header(scenario, scenario.engine.num_gpus(), num_nodes,
                        note=None if _one_engine(scenario) else "set NODE_<k>_IP to node k's address")


SGLANG_DIST_PORT: Final = 50000
"""The `--dist-init-addr` port of a multi-node SGLang engine (every node passes node 0's address and it)."""


def _dp_attention(scenario: Scenario) -> bool:
    return scenario.model.moe is not None and scenario.engine.data_parallel_size > 1


def _one_engine(scenario: Scenario) -> bool:
    """Whether SGLang runs the engine as one server (`--tp-size` over every GPU, attention DP or no DP)."""
    return _dp_attention(scenario) or scenario.engine.data_parallel_size == 1


def sglang_node_lines(scenario: Scenario, *, extra: tuple[str, ...] = ()) -> list[NodeLine]:
    """The launch line of each node the engine spans: one when its GPUs fit a node. One engine (DP
    attention or no DP) over several nodes runs the same line on each with `--dist-init-addr
    $HEAD_NODE_IP:PORT --nnodes N --node-rank R` (SGLang's multi-node serving; node 0 serves HTTP),
    over the fewest nodes SGLang splits its TP x PP ranks evenly onto (`_calculate_rank_ranges`).
    Dense replicas (`--dp-size` without attention DP) are independent servers: as many as fit a node
    run on each (its own `--dp-size`), and a replica wider than a node is its own multi-node engine
    that rendezvouses at its first node (`$NODE_<k>_IP`); SGLang's router spreads requests over them."""
    engine = scenario.engine
    per_node = scenario.hardware.num_gpus_per_node
    pp = engine.pipeline_parallel_size
    if _one_engine(scenario):
        env, words = _sglang_args(scenario)
        args = (*words, *extra)
        tp = engine.tensor_parallel_size * (engine.data_parallel_size if _dp_attention(scenario) else 1)
        if tp * pp <= per_node:
            return [NodeLine(args=args, role="", env=env)]
        n = next(n for n in range(-(-tp * pp // per_node), tp * pp + 1) if tp * pp % n == 0
                 and tp * pp // n <= per_node and (pp % n == 0 if n <= pp else n % pp == 0 and tp % (n // pp) == 0))
        return [NodeLine(args=(*args, "--dist-init-addr", f"{HEAD_NODE_IP}:{SGLANG_DIST_PORT}", "--nnodes", str(n),
                               "--node-rank", str(r)), env=env, role="HTTP server, rank 0" if r == 0 else f"rank {r}")
                for r in range(n)]
    replica, dp = engine.world_size(), engine.data_parallel_size
    if replica * dp <= per_node:
        env, words = _sglang_args(scenario)
        return [NodeLine(args=(*words, *extra), role="", env=env)]
    out = []
    if replica <= per_node:
        local = per_node // replica
        for k in range(-(-dp // local)):
            env, words = _sglang_args(scenario, replicas=min(local, dp - k * local))
            first, count = k * local, min(local, dp - k * local)
            ranks = f"replica {first}" if count == 1 else f"replicas {first}-{first + count - 1}"
            out.append(NodeLine(args=(*words, *extra), env=env, role=f"HTTP server, {ranks}"))
        return out
    group = nodes_per_group(replica, per_node)
    env, words = _sglang_args(scenario, replicas=1)
    for i in range(dp):
        for r in range(group):
            own = ("--dist-init-addr", f"{node_ip(i * group)}:{SGLANG_DIST_PORT}", "--nnodes", str(group),
                   "--node-rank", str(r))
            out.append(NodeLine(args=(*words, *extra, *own), env=env,
                                role=f"HTTP server, replica {i}" if r == 0 else f"replica {i}, rank {r}"))
    return out


def _sglang_args(scenario: Scenario, *, replicas: int | None = None) -> tuple[str, list[str]]:
    """The environment prefix and words of one SGLang line; `replicas`: the `--dp-size` of dense
    replicas in place of the engine's (1: none)."""
    engine = scenario.engine
    model = serve_model_id(str(scenario.sections()["model"]["name"]))
    tp = engine.tensor_parallel_size
    dp = engine.data_parallel_size if replicas is None else replicas
    moe = scenario.model.moe is not None
    args = ["python", "-m", "sglang.launch_server", "--model-path", model]
    dp_attention = _dp_attention(scenario)
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
    capture = scenario.sections().get("engine", {}).get("max_cudagraph_capture_size")
    if capture is not None and not engine.enforce_eager:
        # SGLang counts requests; a profile that counts scheduled tokens (vLLM's) captured decodes of
        # 1 + k tokens each.
        requests = (capture if load_host_params(engine.backend).graph_capture_unit == "requests"
                    else max(1, capture // (1 + engine.num_speculative_tokens())))
        args += ["--cuda-graph-max-bs", str(requests)]
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
    if scenario.sections()["model"].get("max_position_embeddings") is not None:
        # `[model] max_position_embeddings`: SGLang refuses a --context-length past the config's
        # positions unless told to (as vLLM does, VLLM_ALLOW_LONG_MAX_MODEL_LEN).
        return "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 ", args
    return "", args


def sglang_pool_commands(scenario: Scenario) -> dict[str, str]:
    """One SGLang launch line per pool of a disaggregated `scenario` (`--disaggregation-mode prefill`
    / `decode`, NIXL transfer); empty when the scenario is aggregated. SGLang's router
    (`python -m sglang_router.launch_router --pd-disaggregation`) or Dynamo fronts them."""
    if scenario.disaggregation is None:
        return {}
    return {pool.name: sglang_launch_command(pool.scenario, router=False, extra=(
        "--disaggregation-mode", pool.name, "--disaggregation-transfer-backend", "nixl"))
            for pool in scenario.disaggregation.pools()}
