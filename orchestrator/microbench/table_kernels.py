"""Collectors of the table-keyed families (MoE, MLA, MLA-BMM, DeepEP) for `microbench run`.

Each family needs a kernel library besides torch: vLLM's fused MoE Triton kernel (`vllm`;
fp8_block MoE also DeepGEMM, `deep_gemm`), FlashMLA (`flash_mla`) for MLA decode, and DeepEP
(`deep_ep`, 8 GPUs of one NVLink node) for the expert all-to-all. This version does not time them
yet: every point of these families is skipped with a reason that names the library it needs and
whether it imports here, so a run on a GPU box says exactly what to install (or that the collector
is the missing part). The plan's points and `calibrate --microbench` already accept the tables in
AIConfigurator's layout (moe.csv.gz, mla_*.csv.gz, mla_bmm.csv, deepep_*.csv), e.g. collected with
AIConfigurator's own collectors.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from orchestrator.microbench.bench import BenchContext, Prepared, Unsupported

NEEDS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "moe": (("vllm", "vLLM's fused_moe Triton kernel (vllm.model_executor.layers.fused_moe)"),
            ("deep_gemm", "DeepGEMM (fp8_block grouped GEMM)")),
    "mla": (("flash_mla", "FlashMLA (MLA decode)"), ("vllm", "vLLM's MLA attention backends")),
    "mla_bmm": (("torch", "torch.bmm"),),
    "deepep": (("deep_ep", "DeepEP (expert dispatch/combine)"),),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TableShape:
    """A table-keyed point: the table name and its plan row."""

    kernel: str
    family: str


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # absent, or built for another CUDA/torch: not usable either way
        return False
    return True


def missing_message(family: str) -> str:
    """What measuring `family` needs, and which of it is missing here."""
    parts = []
    for module, what in NEEDS[family]:
        parts.append(f"{what} [{module}: {'importable' if _importable(module) else 'not installed'}]")
    return "needs " + ", ".join(parts) + "; the kernelsight collector for this family is not implemented yet"


def candidates(shape: TableShape) -> Iterator[tuple[str, Callable[[Any, BenchContext], Prepared]]]:
    def refuse(_: Any, __: BenchContext) -> Prepared:
        raise Unsupported(f"{shape.kernel}: {missing_message(shape.family)}")

    yield shape.family, refuse
