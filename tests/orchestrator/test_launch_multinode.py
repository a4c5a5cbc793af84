"""Launch lines of engines wider than one node: one line per node, with that node's role and rank."""

from __future__ import annotations

import shlex
from pathlib import Path

from conftest import REPO

from orchestrator.sweep.launch import launch_commands
from orchestrator.sweep.sglang_command import sglang_launch_command
from orchestrator.sweep.vllm_command import vllm_serve_command
from sim.api import load_scenario

DP8EP8 = REPO / "scenarios" / "deepseek_r1-h200-dp8ep8.toml"
TP4_70B = REPO / "scenarios" / "llama3_70b-h100-tp4.toml"
DISAGG = REPO / "scenarios" / "deepseek_r1-h200-disagg-4p8d.toml"


def _commands(text: str) -> list[list[str]]:
    """The command lines of a launch text, each split into words (comments dropped)."""
    return [shlex.split(line) for line in text.splitlines() if not line.startswith("#")]


def _flag(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words else None


def test_data_parallel_ranks_over_two_nodes_get_a_head_line_and_a_headless_line() -> None:
    """vLLM's data-parallel deployment guide: node 0 serves the API with its local ranks, node 1
    runs headless from start rank 8; both name node 0's address and the same RPC port."""
    text = vllm_serve_command(load_scenario(DP8EP8, {"engine.data_parallel_size": 16}))
    head, worker = _commands(text)
    assert text.startswith("# 16 GPUs over 2 nodes of 8 (h200_sxm)") and "HEAD_NODE_IP" in text.splitlines()[0]
    for words in (head, worker):
        assert _flag(words, "--data-parallel-size") == "16" and _flag(words, "--data-parallel-size-local") == "8"
        assert _flag(words, "--data-parallel-address") == "$HEAD_NODE_IP"
        assert _flag(words, "--data-parallel-rpc-port") == "13345"
        assert "--enable-expert-parallel" in words
    assert "--headless" not in head and "--data-parallel-start-rank" not in head
    assert "--headless" in worker and _flag(worker, "--data-parallel-start-rank") == "8"
    assert "'$HEAD_NODE_IP'" not in text  # a shell variable the shell expands, not a quoted string


def test_a_last_node_with_fewer_ranks_starts_only_those() -> None:
    head, worker = _commands(vllm_serve_command(load_scenario(DP8EP8, {"engine.data_parallel_size": 12})))
    assert _flag(head, "--data-parallel-size-local") == "8"
    assert (_flag(worker, "--data-parallel-size-local"), _flag(worker, "--data-parallel-start-rank")) == ("4", "8")


def test_a_gb200_tray_is_a_node_of_four() -> None:
    """An NVL72 rack is one NVLink domain but 18 hosts of 4 GPUs: DP 8 starts on two of them."""
    lines = _commands(vllm_serve_command(load_scenario(DP8EP8, {"hardware.name": "gb200"})))
    assert [_flag(w, "--data-parallel-size-local") for w in lines] == ["4", "4"]
    assert _flag(lines[1], "--data-parallel-start-rank") == "4"


def test_tensor_x_pipeline_wider_than_a_node_uses_the_multinode_executor() -> None:
    """TP 8 x PP 2 on 8-GPU nodes: vLLM's multiprocessing executor over `--nnodes 2`, node 1 headless."""
    lines = _commands(vllm_serve_command(load_scenario(TP4_70B, {"engine.tensor_parallel_size": 8,
                                                                 "engine.pipeline_parallel_size": 2})))
    assert len(lines) == 2
    for rank, words in enumerate(lines):
        assert (_flag(words, "--nnodes"), _flag(words, "--node-rank")) == ("2", str(rank))
        assert _flag(words, "--master-addr") == "$HEAD_NODE_IP"
        assert ("--headless" in words) == (rank > 0)
        assert "--data-parallel-size-local" not in words


def test_data_parallel_replicas_each_wider_than_a_node() -> None:
    """TP 16 x DP 2: four nodes; vLLM infers each node's DP rank from its node rank (world 32 / 4)."""
    lines = _commands(vllm_serve_command(load_scenario(TP4_70B, {"engine.tensor_parallel_size": 16,
                                                                 "engine.data_parallel_size": 2})))
    assert [_flag(w, "--node-rank") for w in lines] == ["0", "1", "2", "3"]
    assert {_flag(w, "--nnodes") for w in lines} == {"4"}
    assert ["--headless" in w for w in lines] == [False, True, True, True]


def test_single_node_lines_carry_no_node_flags() -> None:
    for text in (vllm_serve_command(load_scenario(DP8EP8)), sglang_launch_command(load_scenario(DP8EP8))):
        assert "\n" not in text and "#" not in text
        assert not {"--headless", "--nnodes", "--data-parallel-size-local", "--dist-init-addr"} & set(shlex.split(text))


def test_sglang_one_engine_over_two_nodes_runs_the_same_line_at_each_node_rank() -> None:
    lines = _commands(sglang_launch_command(load_scenario(DP8EP8, {"engine.data_parallel_size": 16})))
    assert len(lines) == 2
    for rank, words in enumerate(lines):
        assert (_flag(words, "--tp-size"), _flag(words, "--dp-size")) == ("16", "16")
        assert (_flag(words, "--nnodes"), _flag(words, "--node-rank")) == ("2", str(rank))
        assert _flag(words, "--dist-init-addr") == "$HEAD_NODE_IP:50000"


def test_sglang_dense_replicas_over_nodes_are_servers_behind_its_router() -> None:
    """SGLang splits every dense replica over all `--nnodes` (tp / nnodes ranks a node), so replicas
    that each fit a node run as one server a node with its own `--dp-size`, behind sglang_router."""
    text = sglang_launch_command(load_scenario(TP4_70B, {"engine.data_parallel_size": 3}))
    node0, node1, router = _commands(text)
    assert (_flag(node0, "--tp-size"), _flag(node0, "--dp-size")) == ("4", "2")
    assert _flag(node1, "--tp-size") == "4" and "--dp-size" not in node1
    assert "--nnodes" not in node0 + node1
    assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert router[router.index("--worker-urls") + 1:] == ["http://$NODE_0_IP:30000", "http://$NODE_1_IP:30000"]


def test_a_pool_worker_wider_than_a_node_gets_node_lines_in_every_engine() -> None:
    """A decode worker of DP 16 on 8-GPU nodes: vLLM, SGLang and Dynamo each start it on two nodes,
    every line keeping the pool's transfer flags."""
    out = launch_commands(load_scenario(DISAGG, {"disaggregation.decode.engine.data_parallel_size": 16}))
    decode = _commands(out["vllm_serve_decode"])
    assert len(decode) == 2 and all(_flag(w, "--kv-transfer-config") for w in decode)
    assert "--headless" in decode[1]
    assert len(_commands(out["vllm_serve_prefill"])) == 1  # TP 8: one node
    sglang = _commands(out["sglang_launch_decode"])
    assert [_flag(w, "--node-rank") for w in sglang] == ["0", "1"]
    assert all(_flag(w, "--disaggregation-mode") == "decode" for w in sglang)
    dynamo = _commands(out["dynamo_vllm_decode"])
    assert [w[:3] for w in dynamo] == [["python", "-m", "dynamo.vllm"]] * 2 and "--headless" in dynamo[1]
    assert all(_flag(w, "--disaggregation-mode") == "decode" for w in dynamo)
    assert [_flag(w, "--node-rank") for w in _commands(out["dynamo_sglang_decode"])] == ["0", "1"]
    assert out["vllm_serve"].count("vllm serve ") == 3 and "# decode pool: 8 workers x 16 GPUs" in out["vllm_serve"]


def test_a_longer_context_than_the_config_reaches_every_engine(tmp_path: Path) -> None:
    """`[model] max_position_embeddings`: vLLM and SGLang each need their override, and the Dynamo
    lines keep vLLM's (until 2026-12-05 building them raised an AssertionError on the `VAR=1` prefix,
    which no sweep report survived)."""
    path = tmp_path / "s.toml"
    path.write_text((REPO / "scenarios" / "llama3_8b-h100-disagg-1p1d.toml").read_text()
                    .replace('name = "meta-llama/Llama-3.1-8B"\n',
                             'name = "meta-llama/Llama-3.1-8B"\nmax_position_embeddings = 262144\n')
                    .replace("max_model_len = 8192", "max_model_len = 200000"))
    out = launch_commands(load_scenario(path))
    assert out["vllm_serve_decode"].startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve ")
    assert out["dynamo_vllm_decode"].startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 python -m dynamo.vllm ")
    assert out["sglang_launch_decode"].startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m sglang")
    assert out["dynamo_sglang_decode"].startswith("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 python -m dynamo")


def test_a_set_cuda_graph_capture_size_reaches_both_engines_in_their_units() -> None:
    """`[engine] max_cudagraph_capture_size` changes which decode steps the simulation replays as a
    graph; both lines carry it (before 2026-12-05 neither did): vLLM in scheduled tokens, SGLang's
    `--cuda-graph-max-bs` in requests (a vLLM profile's tokens / (1 + k))."""
    plain = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml", {"engine.max_cudagraph_capture_size": 128})
    assert _flag(shlex.split(vllm_serve_command(plain)), "--max-cudagraph-capture-size") == "128"
    assert _flag(shlex.split(sglang_launch_command(plain)), "--cuda-graph-max-bs") == "128"
    sglang = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml",
                           {"engine.max_cudagraph_capture_size": 64, "engine.backend": "sglang"})
    assert _flag(shlex.split(sglang_launch_command(sglang)), "--cuda-graph-max-bs") == "64"
    unset = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml")
    assert "--max-cudagraph-capture-size" not in vllm_serve_command(unset)
    assert "--cuda-graph-max-bs" not in sglang_launch_command(unset)
