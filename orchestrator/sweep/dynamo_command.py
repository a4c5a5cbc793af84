"""NVIDIA Dynamo launch lines for a disaggregated scenario: the frontend and one worker line per pool.

Dynamo runs each engine as a worker under its own module (`python -m dynamo.vllm`,
`python -m dynamo.sglang`) that takes the engine's native arguments plus
`--disaggregation-mode prefill|decode` (Dynamo's `examples/backends/vllm/launch/disagg.sh` and
`examples/backends/sglang/launch/disagg.sh`; `--is-prefill-worker` is the deprecated spelling, see
`components/src/dynamo/vllm/backend_args.py`), behind `python -m dynamo.frontend`, which routes each
request to a prefill worker and streams the decode worker's output. The worker lines here are the
scenario's `vllm serve` and SGLang lines with the module swapped in: the same parallelism and
engine flags, NIXL transfer (`--kv-transfer-config` for vLLM, `--disaggregation-transfer-backend
nixl` for SGLang).
"""

from __future__ import annotations

import dataclasses
from typing import Final

from orchestrator.sweep.multinode import render
from orchestrator.sweep.sglang_command import sglang_node_lines, sglang_nodes_header
from orchestrator.sweep.vllm_command import KV_TRANSFER_CONFIG, pool_comment, vllm_node_lines, vllm_nodes_header
from sim.specs.scenario import Scenario

DYNAMO_FRONTEND: Final = "python -m dynamo.frontend"
"""Dynamo's OpenAI-compatible frontend (HTTP port 8000 by default): routes prefill, then decode."""


def _dynamo_vllm(scenario: Scenario, pool: str) -> str:
    nodes = []
    for n in vllm_node_lines(scenario, role=pool):
        assert n.args[:2] == ("vllm", "serve")
        nodes.append(dataclasses.replace(n, args=("python", "-m", "dynamo.vllm", "--model", n.args[2], *n.args[3:],
                                                  "--disaggregation-mode", pool,
                                                  "--kv-transfer-config", KV_TRANSFER_CONFIG)))
    return render(vllm_nodes_header(scenario), nodes)


def _dynamo_sglang(scenario: Scenario, pool: str) -> str:
    nodes = []
    for n in sglang_node_lines(scenario, extra=("--disaggregation-mode", pool,
                                                "--disaggregation-transfer-backend", "nixl")):
        assert n.args[:3] == ("python", "-m", "sglang.launch_server")
        nodes.append(dataclasses.replace(n, args=("python", "-m", "dynamo.sglang", *n.args[3:])))
    return render(sglang_nodes_header(scenario, len(nodes)), nodes)


def dynamo_pool_commands(scenario: Scenario) -> dict[str, dict[str, str]]:
    """Per engine (`vllm`, `sglang`), one Dynamo worker line per pool (`prefill`, `decode`); empty
    when the scenario is aggregated. Each pool's line starts once per worker of the pool."""
    if scenario.disaggregation is None:
        return {}
    pools = scenario.disaggregation.pools()
    return {"vllm": {p.name: _dynamo_vllm(p.scenario, p.name) for p in pools},
            "sglang": {p.name: _dynamo_sglang(p.scenario, p.name) for p in pools}}


def dynamo_launch(scenario: Scenario, engine: str) -> str:
    """The whole deployment for `engine` (`vllm` or `sglang`): the frontend, then each pool's worker
    line under its `# prefill pool: 2 workers x 8 GPUs (b200_sxm)` comment; "" when aggregated."""
    lines = dynamo_pool_commands(scenario).get(engine)
    if not lines:
        return ""
    return "\n".join([f"# NVIDIA Dynamo frontend\n{DYNAMO_FRONTEND}",
                      *(f"{pool_comment(scenario, pool)}\n{line}" for pool, line in lines.items())])
