"""The SGLang launch line: GPU counting under DP attention, EP with DeepEP, per-rank limits."""

from __future__ import annotations

import shlex

from conftest import REPO

from orchestrator.sweep.sglang_command import sglang_launch_command
from sim.api import load_scenario


def _flags(line: str) -> dict[str, str | None]:
    words = shlex.split(line)
    out: dict[str, str | None] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            out[word] = nxt if nxt is not None and not nxt.startswith("--") else None
    return out


def test_dp_attention_with_expert_parallel_counts_every_gpu_in_tp() -> None:
    sc = load_scenario(REPO / "scenarios" / "deepseek_r1-h200-dp8ep8.toml",
                       {"engine.max_num_seqs": 64, "engine.max_num_batched_tokens": 4096})
    f = _flags(sglang_launch_command(sc))
    assert f["--model-path"] == "deepseek-ai/DeepSeek-R1"
    assert (f["--tp-size"], f["--dp-size"], f["--ep-size"]) == ("8", "8", "8")
    assert "--enable-dp-attention" in f and f["--moe-a2a-backend"] == "deepep"
    # SGLang splits these among the 8 attention-DP ranks; the scenario's values are per rank.
    assert f["--max-running-requests"] == str(64 * 8)
    assert f["--chunked-prefill-size"] == str(4096 * 8)
    assert f["--kv-cache-dtype"] == "fp8_e4m3"


def test_tensor_parallel_moe_has_no_dp_attention_or_deepep() -> None:
    sc = load_scenario(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml", {"engine.max_num_seqs": 64})
    f = _flags(sglang_launch_command(sc))
    assert f["--tp-size"] == "8"
    assert "--dp-size" not in f and "--enable-dp-attention" not in f and "--ep-size" not in f
    assert f["--max-running-requests"] == "64"


def test_hybrid_linear_attention_model_carries_its_state_memory_split() -> None:
    sc = load_scenario(REPO / "scenarios" / "qwen3_5-h200-tp8.toml", {"engine.mamba_full_memory_ratio": 0.5})
    f = _flags(sglang_launch_command(sc))
    assert f["--model-path"] == "Qwen/Qwen3.5-397B-A17B" and f["--mamba-full-memory-ratio"] == "0.5"
    assert (f["--tp-size"], f["--ep-size"]) == ("8", "8")
    # Expert parallelism without attention DP moves no tokens: SGLang's default, no DeepEP.
    assert "--moe-a2a-backend" not in f and "--enable-dp-attention" not in f
    dense = _flags(sglang_launch_command(load_scenario(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml")))
    assert "--mamba-full-memory-ratio" not in dense


def test_dense_model_data_parallel_is_replication() -> None:
    sc = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml",
                       {"engine.data_parallel_size": 2, "engine.enable_prefix_caching": False})
    f = _flags(sglang_launch_command(sc))
    assert (f["--tp-size"], f["--dp-size"]) == ("1", "2")
    assert "--enable-dp-attention" not in f and "--disable-radix-cache" in f


def test_launch_lines_carry_speculation_and_vllm_quantization_names() -> None:
    """A best trial's launch lines deploy what was simulated: the speculative config (vLLM's JSON,
    SGLang's chain flags) and quantization methods the engines accept (vLLM has no `nvfp4` or
    `fp8_block` method: ModelOpt's `modelopt_fp4`, block FP8 through `fp8`)."""
    import json

    from orchestrator.sweep.vllm_command import vllm_serve_command
    eagle = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    sc = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml",
                       {"engine.speculative_config": eagle, "engine.quantization": "fp8_block"})
    v = _flags(vllm_serve_command(sc))
    assert json.loads(str(v["--speculative-config"])) == eagle and v["--quantization"] == "fp8"
    s = _flags(sglang_launch_command(sc))
    assert (s["--speculative-algorithm"], s["--speculative-draft-model-path"]) == (
        "EAGLE3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert (s["--speculative-num-steps"], s["--speculative-eagle-topk"], s["--speculative-num-draft-tokens"]) == (
        "3", "1", "4")
    mtp = load_scenario(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml",
                        {"engine.speculative_config": {"method": "mtp", "num_speculative_tokens": 1}})
    assert json.loads(str(_flags(vllm_serve_command(mtp))["--speculative-config"])) == {
        "method": "mtp", "num_speculative_tokens": 1}
    assert _flags(sglang_launch_command(mtp))["--speculative-algorithm"] == "NEXTN"
    fp4 = load_scenario(REPO / "scenarios" / "llama3_8b-h100.toml",
                        {"hardware.name": "b200_sxm", "engine.quantization": "nvfp4"})
    assert _flags(vllm_serve_command(fp4))["--quantization"] == "modelopt_fp4"
    assert "--speculative-config" not in _flags(vllm_serve_command(fp4))
