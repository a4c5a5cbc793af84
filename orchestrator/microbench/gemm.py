"""GEMM benchmarks: Y[m, n] = X[m, k] . W[n, k]^T as a serving engine's linear layer runs it.

- `bfloat16`: `torch.matmul(x, w.t())` (cuBLAS; what vLLM's unquantized linear layer calls).
- `fp8`: `torch._scaled_mm` with per-tensor float32 scales, e4m3 operands, bf16 output
  (compute capability >= 8.9; vLLM's per-tensor FP8 path). Activation quantization is a
  separate kernel in the engine and is not timed here.
- `fp8_block`: 1x128 activation / 128x128 weight block scales (DeepSeek recipe) through
  `torch.nn.functional.scaled_mm` or `torch._scaled_mm` (cuBLAS blockwise scaling: sm90 with
  CUDA >= 12.9); unsupported elsewhere.
Weights rotate over enough copies to span 3 x L2 (see `bench.copies_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.microbench.bench import BenchContext, Prepared, Unsupported, copies_for, probe, random_tensor
from orchestrator.microbench.points import GemmShape

Builder = Callable[[GemmShape, BenchContext], Prepared]


def _prepared(ctx: BenchContext, run: Callable[[int], None], copies: int, source: str) -> Prepared:
    return Prepared(run=run, copies=copies, backend="torch", backend_version=ctx.torch_version(),
                    kernel_source=source)


def _bf16(s: GemmShape, ctx: BenchContext) -> Prepared:
    torch = ctx.require_torch()
    dt = torch.bfloat16
    copies = copies_for(s.n * s.k * 2, ctx)
    x = random_tensor(torch, (s.m, s.k), dt, ctx.device)
    ws = [random_tensor(torch, (s.n, s.k), dt, ctx.device) for _ in range(copies)]
    out = torch.empty((s.m, s.n), dtype=dt, device=ctx.device)

    def run(i: int) -> None:
        torch.matmul(x, ws[i % copies].t(), out=out)

    return _prepared(ctx, run, copies, "torch_matmul")


def _fp8_operands(s: GemmShape, ctx: BenchContext, extra_bytes_per_copy: float) -> tuple[Any, Any, list[Any], int]:
    torch = ctx.require_torch()
    if ctx.is_cuda() and (ctx.compute_capability or (0, 0)) < (8, 9):
        raise Unsupported(f"FP8 GEMM needs compute capability >= 8.9, device has {ctx.compute_capability}")
    if s.k % 16 or s.n % 16:
        raise Unsupported(f"FP8 GEMM needs n and k divisible by 16 (n={s.n}, k={s.k})")
    f8 = torch.float8_e4m3fn
    copies = copies_for(s.n * s.k + extra_bytes_per_copy, ctx)
    x = random_tensor(torch, (s.m, s.k), f8, ctx.device)
    ws = [random_tensor(torch, (s.n, s.k), f8, ctx.device) for _ in range(copies)]
    return torch, x, ws, copies


def _fp8_tensorwise(s: GemmShape, ctx: BenchContext) -> Prepared:
    torch, x, ws, copies = _fp8_operands(s, ctx, 0.0)
    one = torch.ones((), dtype=torch.float32, device=ctx.device)

    def run(i: int) -> None:
        torch._scaled_mm(x, ws[i % copies].t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return probe(_prepared(ctx, run, copies, "torch_scaled_mm"), ctx, "torch._scaled_mm (per-tensor FP8)")


def _block_scales(torch: Any, s: GemmShape, ctx: BenchContext, padded: bool) -> tuple[Any, Any]:
    """Activation 1x128 scales (m, k/128) outer-dim-major; weight 128x128 scales (k/128[, padded to 4], n/128)."""
    if s.k % 128:
        raise Unsupported(f"block-scaled FP8 GEMM needs k divisible by 128 (k={s.k})")
    kb, nb = s.k // 128, -(-s.n // 128)
    scale_a = torch.ones((kb, s.m), dtype=torch.float32, device=ctx.device).t()
    rows = -(-kb // 4) * 4 if padded else kb
    scale_b = torch.ones((nb, rows), dtype=torch.float32, device=ctx.device).t()
    return scale_a, scale_b


def _fp8_block_v2(s: GemmShape, ctx: BenchContext) -> Prepared:
    torch, x, ws, copies = _fp8_operands(s, ctx, s.n * s.k / 128**2 * 4)
    functional = torch.nn.functional
    if not hasattr(functional, "scaled_mm") or not hasattr(functional, "ScalingType"):
        raise Unsupported(f"torch {torch.__version__} has no torch.nn.functional.scaled_mm")
    recipe = functional.ScalingType
    scale_a, scale_b = _block_scales(torch, s, ctx, padded=True)

    def run(i: int) -> None:
        functional.scaled_mm(x, ws[i % copies].t(), scale_a, recipe.BlockWise1x128, scale_b,
                             recipe.BlockWise128x128, output_dtype=torch.bfloat16)

    return probe(_prepared(ctx, run, copies, "torch_scaled_mm_blockwise"), ctx, "F.scaled_mm (block FP8)")


def _fp8_block_v1(s: GemmShape, ctx: BenchContext) -> Prepared:
    torch, x, ws, copies = _fp8_operands(s, ctx, s.n * s.k / 128**2 * 4)
    scale_a, scale_b = _block_scales(torch, s, ctx, padded=False)

    def run(i: int) -> None:
        torch._scaled_mm(x, ws[i % copies].t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

    return probe(_prepared(ctx, run, copies, "torch_scaled_mm_blockwise"), ctx, "torch._scaled_mm (block FP8)")


def candidates(s: GemmShape) -> list[tuple[str, Builder]]:
    """Implementations to try, best first; empty when the format is not benchmarked."""
    if s.dtype in ("bfloat16", "bf16"):
        return [("torch_matmul", _bf16)]
    if s.dtype == "fp8":
        return [("torch_scaled_mm", _fp8_tensorwise)]
    if s.dtype == "fp8_block":
        return [("scaled_mm_v2", _fp8_block_v2), ("scaled_mm_v1", _fp8_block_v1)]
    return []
