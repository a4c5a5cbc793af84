"""How the measured files name GPUs, models and number formats, mapped to the catalog.

A name with no mapping is reported by the row reader as a skip reason naming it.
"""

from __future__ import annotations

from typing import Final

GPU_NAMES: Final[dict[str, str]] = {
    # aiconfigurator system names are catalog names already
    "h100_sxm": "h100_sxm", "h200_sxm": "h200_sxm", "b200_sxm": "b200_sxm", "b300_sxm": "b300_sxm",
    "gb200": "gb200", "gb300": "gb300", "a100_sxm": "a100_sxm", "l40s": "l40s",
    # TensorRT-LLM performance-overview labels
    "H100_SXM_80GB": "h100_sxm", "H200_SXM_141GB": "h200_sxm", "A100_SXM4_80GB": "a100_sxm",
    "A100_PCIE_80GB": "a100_pcie", "L40S": "l40s", "GH200_480GB": "gh200", "B200_180GB": "b200_sxm",
    "GB200_192GB": "gb200",
    "RTX_PRO_6000_Blackwell_Server": "rtx_pro_6000_server",
    # LLMServingSim hardware names
    "RTX4090": "rtx_4090", "RTXPRO6000": "rtx_pro_6000_server",
}
"""Source GPU label -> catalog hardware name (`kernelsight list hardware`)."""

MODEL_NAMES: Final[dict[str, str]] = {
    # aiconfigurator model_path (checkpoint) -> catalog architecture
    "meta-llama/Llama-3.1-70B": "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-32B": "Qwen/Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen/Qwen3-235B-A22B-FP8",
    "MiniMaxAI/MiniMax-M2.5": "MiniMaxAI/MiniMax-M2.5",
    "openai/gpt-oss-120b": "openai/gpt-oss-120b",
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "deepseek-ai/DeepSeek-V3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3",
    "moonshotai/Kimi-K2.5": "moonshotai/Kimi-K2.5",
    "zhipuai/GLM-5": "zai-org/GLM-5",
    "Qwen/Qwen3.5-397B-A17B": "Qwen/Qwen3.5-397B-A17B",
    # LLMServingSim
    "meta-llama/Llama-3.1-8B": "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "Qwen/Qwen3-30B-A3B",
    # TensorRT-LLM tables (Llama 3 / 3.3 70B share the Llama-3.1-70B architecture)
    "LLaMA v3 70B": "meta-llama/Llama-3.1-70B",
    "LLaMA v3.1 70B": "meta-llama/Llama-3.1-70B",
    "Llama 3.3 70B": "meta-llama/Llama-3.1-70B",
    "LLaMA v3.1 8B": "meta-llama/Llama-3.1-8B",
    "Llama 3.1 8B": "meta-llama/Llama-3.1-8B",
    "LLaMA v3.1 405B": "meta-llama/Llama-3.1-405B",
    "Llama 3.1 405B": "meta-llama/Llama-3.1-405B",
    "Mixtral 8x7B": "mistralai/Mixtral-8x7B-v0.1",
    "Mixtral 8x22B": "mistralai/Mixtral-8x22B-v0.1",
    "Qwen3-235B-A22B": "Qwen/Qwen3-235B-A22B",
    "Qwen3-30B-A3B": "Qwen/Qwen3-30B-A3B",
    # TensorRT-LLM 0.9 / perf-overview names of older dense checkpoints (their public HF configs ship)
    "Mistral 7B": "mistralai/Mistral-7B-v0.1",
    "LLaMA 7B": "meta-llama/Llama-2-7b-hf",
    "LLaMA 70B": "meta-llama/Llama-2-70b-hf",
    "GPT-J 6B": "EleutherAI/gpt-j-6b",
    "Falcon 180B": "tiiuae/falcon-180B",
    "Llama 4 Scout": "meta-llama/Llama-4-Scout-17B-16E",
    "Llama 4 Maverick": "meta-llama/Llama-4-Maverick-17B-128E",
}
"""Source model name -> catalog model id (a name missing here has no shipped config). "LLaMA 7B" /
"LLaMA 70B" of the TensorRT-LLM 0.9 tables are Llama-2 (Llama-1 7B has the same layers; Llama-1 had
no 70B); "LLaMA 70B" rows stay evaluation-only (rows.is_eval)."""

QUANTIZATION: Final[dict[str, str | None]] = {
    "fp8": "fp8", "FP8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4", "fp4": "nvfp4", "FP4": "nvfp4",
    "bf16": None, "FP16": None, "": None,
}
"""Source GEMM format -> `engine.quantization` (None = the checkpoint's own 16-bit weights)."""

CHECKPOINT_QUANTIZED: Final = frozenset({"openai/gpt-oss-120b"})
"""Models whose checkpoint already fixes the weight format (gpt-oss: MXFP4 experts): the row's
precision label is not applied."""
