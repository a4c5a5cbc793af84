"""Launch lines for an engine that needs more GPUs than one node of its hardware holds.

A node is `hardware.num_gpus_per_node` GPUs under one operating system: 8 on an HGX H100 / H200 /
B200, 4 on a GB200 / GB300 NVL72 compute tray (one NVLink domain of 72 GPUs spans 18 such hosts, and
each runs its own engine processes). An engine over more GPUs than that starts one process per node,
each with its node's role: the head (node 0, which serves the HTTP API and where every node
rendezvouses) and the other nodes, by rank. The lines carry `$HEAD_NODE_IP` (and for replicas behind
SGLang's router `$NODE_<k>_IP`) unquoted, as shell variables a user sets on each node to the
addresses of their cluster; a comment above the lines says so.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Final

from sim.specs.scenario import Scenario

HEAD_NODE_IP: Final = "$HEAD_NODE_IP"
"""Node 0's address as the other nodes reach it: a shell variable the user sets on every node."""

HEAD_NODE_NOTE: Final = "set HEAD_NODE_IP to node 0's address (reachable from every node) on each node"


def node_ip(k: int) -> str:
    """Node k's address, a shell variable the user sets (replicas behind a router)."""
    return f"$NODE_{k}_IP"


@dataclass(frozen=True, slots=True)
class NodeLine:
    """One node's launch line: `env` (`VAR=1 ` prefixes, or ""), the command's words and what the node does."""

    args: tuple[str, ...]
    role: str
    env: str = ""

    def text(self) -> str:
        return self.env + join(self.args)


def join(args: tuple[str, ...] | list[str]) -> str:
    """`shlex.join`, but the address placeholders stay unquoted, so that the shell expands them."""
    return " ".join(a if _PLACEHOLDER.fullmatch(a) else shlex.quote(a) for a in args)


_PLACEHOLDER: Final = re.compile(r"(http://)?\$(HEAD_NODE_IP|NODE_[0-9]+_IP)(:[0-9]+)?")


def render(header: str, nodes: list[NodeLine]) -> str:
    """One node's line as is; several under a `# header` comment, each under `# node k: role`."""
    if len(nodes) == 1:
        return nodes[0].text()
    return "\n".join([f"# {header}", *(f"# node {k}: {n.role}\n{n.text()}" for k, n in enumerate(nodes))])


def nodes_header(scenario: Scenario, num_gpus: int, num_nodes: int, *, note: str | None = None) -> str:
    """The comment above one engine's node lines: its GPUs, nodes and the addresses to set (`note`,
    by default `HEAD_NODE_NOTE`)."""
    per_node = scenario.hardware.num_gpus_per_node
    return (f"{num_gpus} GPUs over {num_nodes} nodes of {per_node} ({scenario.hardware.name}): run each line on "
            f"its own node; {HEAD_NODE_NOTE if note is None else note}")


def nodes_per_group(group_gpus: int, gpus_per_node: int) -> int:
    """Nodes one group of `group_gpus` ranks (a replica's TP x PP) spans when split evenly: the
    fewest k that divides it into node-sized shares (engines lay out the same number of ranks on
    every node of a group)."""
    return next(k for k in range(-(-group_gpus // gpus_per_node), group_gpus + 1)
                if group_gpus % k == 0 and group_gpus // k <= gpus_per_node)
