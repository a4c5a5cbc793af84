"""Launch lines that need a pre-quantized checkpoint say so (orchestrator.sweep.vllm_command)."""

from __future__ import annotations

from conftest import REPO

from orchestrator.sweep.launch import launch_commands
from sim.api import load_scenario


def test_an_nvfp4_engine_on_a_bf16_checkpoint_names_the_checkpoint_it_needs() -> None:
    """`--quantization modelopt_fp4` on a BF16 repo id does not start (vLLM and SGLang quantize at
    load time to FP8 only); the lines come with a note, FP8 and a checkpoint in the format without."""
    base = str(REPO / "scenarios/llama3_8b-h100.toml")
    nvfp4 = launch_commands(load_scenario(base, {"hardware.name": "b200_sxm", "engine.quantization": "nvfp4"}))
    assert "--quantization modelopt_fp4" in nvfp4["vllm_serve"]
    assert "checkpoint_note" in nvfp4 and "nvfp4" in nvfp4["checkpoint_note"]
    assert nvfp4["checkpoint_note"].startswith("meta-llama/Llama-3.1-8B is not quantized to nvfp4")
    fp8 = launch_commands(load_scenario(base, {"engine.quantization": "fp8"}))
    assert "checkpoint_note" not in fp8
    gpt_oss = launch_commands(load_scenario(base, {"hardware.name": "b200_sxm", "model.name": "openai/gpt-oss-120b",
                                                   "engine.quantization": "mxfp4"}))
    assert "checkpoint_note" not in gpt_oss  # its checkpoint is MXFP4 already
