"""Small memory-bound kernels: norms, activations, residual adds, RoPE, embedding lookup, sampling.

Rows follow `sim.calibration.rows`: `m` = tokens, `n` = width (the output width; SiLU-and-mul
reads 2n), `variant` names the operation. FlashInfer's fused kernels are used where installed
(the kernels vLLM and SGLang call); otherwise torch's (`F.rms_norm`, or an eager sequence of
torch ops, labelled `torch_eager`, which is slower than a fused kernel). Inputs rotate over copies
spanning 3 x L2, so the rows measure DRAM traffic, not L2-resident reruns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from orchestrator.microbench.bench import (
    BenchContext,
    Prepared,
    Unsupported,
    copies_for,
    probe,
    random_tensor,
    torch_dtype,
)
from orchestrator.microbench.points import PointwiseShape

Builder = Callable[[PointwiseShape, BenchContext], Prepared]
EPS: Final = 1e-6
FUSED_ADD_NORM: Final = ("fused_add_rms_norm", "fused_add_rmsnorm")
"""The residual add + RMSNorm variant: vLLM's name (which the kernel model prices, 4 passes) and
FlashInfer's; the runner measures either."""
EMBEDDING_VOCAB: Final = 32768
"""Rows of the embedding table (the lookup reads only `m` of them, so the size barely matters)."""
ROPE_HEAD_DIM: Final = 128


def _label(ctx: BenchContext, run: Callable[[int], None], copies: int, source: str, variant: str,
            library: str = "torch") -> Prepared:
    if library == "flashinfer":
        fi = ctx.libraries["flashinfer"]
        return Prepared(run=run, copies=copies, backend="flashinfer",
                        backend_version=str(getattr(fi, "__version__", "unknown")), kernel_source=source,
                        variant=variant)
    return Prepared(run=run, copies=copies, backend="torch", backend_version=ctx.torch_version(),
                    kernel_source=source, variant=variant)


def _inputs(s: PointwiseShape, ctx: BenchContext, width: int, passes: float,
            count: int = 1) -> tuple[Any, int, list[list[Any]]]:
    torch = ctx.require_torch()
    dt = torch_dtype(torch, s.dtype)
    per_copy = passes * s.tokens * s.width * dt.itemsize
    copies = copies_for(per_copy, ctx)
    xs = [[random_tensor(torch, (s.tokens, width), dt, ctx.device) for _ in range(count)] for _ in range(copies)]
    return torch, copies, xs


def _rmsnorm(s: PointwiseShape, ctx: BenchContext, fused: bool) -> Prepared:
    torch, copies, xs = _inputs(s, ctx, s.width, 4.0 if s.variant in FUSED_ADD_NORM else 2.0,
                                count=2 if s.variant in FUSED_ADD_NORM else 1)
    weight = random_tensor(torch, (s.width,), xs[0][0].dtype, ctx.device)
    out = torch.empty_like(xs[0][0])
    residual_add = s.variant in FUSED_ADD_NORM
    if fused:
        norm = _library(ctx, "flashinfer").norm

        def run(i: int) -> None:
            x = xs[i % copies]
            if residual_add:
                norm.fused_add_rmsnorm(x[0], x[1], weight, EPS)
            else:
                norm.rmsnorm(x[0], weight, EPS, out=out)

        return probe(_label(ctx, run, copies, f"flashinfer_{s.variant or 'rmsnorm'}", s.variant, "flashinfer"),
                     ctx, "flashinfer norm")
    functional = torch.nn.functional
    if not hasattr(functional, "rms_norm"):
        raise Unsupported(f"torch {torch.__version__} has no F.rms_norm")

    def run_torch(i: int) -> None:
        x = xs[i % copies]
        if residual_add:
            x[1].add_(x[0])
            functional.rms_norm(x[1], (s.width,), weight, EPS)
        else:
            functional.rms_norm(x[0], (s.width,), weight, EPS)

    return _label(ctx, run_torch, copies, "torch_eager" if residual_add else "torch_rms_norm", s.variant)


def _library(ctx: BenchContext, name: str) -> Any:
    lib = ctx.libraries.get(name)
    if lib is None or not ctx.is_cuda():
        raise Unsupported(f"{name} is not installed or the device is not CUDA")
    return lib


def _gated(s: PointwiseShape, ctx: BenchContext, fused: bool) -> Prepared:
    act = "silu" if s.variant == "silu_and_mul" else "gelu"
    torch, copies, xs = _inputs(s, ctx, 2 * s.width, 3.0)
    out = torch.empty((s.tokens, s.width), dtype=xs[0][0].dtype, device=ctx.device)
    if fused:
        fn = getattr(_library(ctx, "flashinfer").activation, f"{act}_and_mul")

        def run(i: int) -> None:
            fn(xs[i % copies][0], out=out)

        return probe(_label(ctx, run, copies, f"flashinfer_{s.variant}", s.variant, "flashinfer"), ctx,
                     "flashinfer activation")
    functional = torch.nn.functional
    activation = functional.silu if act == "silu" else functional.gelu

    def run_torch(i: int) -> None:
        x = xs[i % copies][0]
        torch.mul(activation(x[:, : s.width]), x[:, s.width:], out=out)

    return _label(ctx, run_torch, copies, "torch_eager", s.variant)


def _add(s: PointwiseShape, ctx: BenchContext) -> Prepared:
    torch, copies, xs = _inputs(s, ctx, s.width, 3.0, count=2)
    out = torch.empty_like(xs[0][0])

    def run(i: int) -> None:
        x = xs[i % copies]
        torch.add(x[0], x[1], out=out)

    return _label(ctx, run, copies, "torch_add", s.variant)


def _rope(s: PointwiseShape, ctx: BenchContext) -> Prepared:
    if s.width % ROPE_HEAD_DIM:
        raise Unsupported(f"RoPE benchmark needs width divisible by {ROPE_HEAD_DIM} (width={s.width})")
    torch, copies, xs = _inputs(s, ctx, s.width, 2.0)
    half = ROPE_HEAD_DIM // 2
    heads = s.width // ROPE_HEAD_DIM
    dt = xs[0][0].dtype
    cos = random_tensor(torch, (s.tokens, 1, half), dt, ctx.device)
    sin = random_tensor(torch, (s.tokens, 1, half), dt, ctx.device)

    def run(i: int) -> None:
        x = xs[i % copies][0].view(s.tokens, heads, ROPE_HEAD_DIM)
        x1, x2 = x[..., :half], x[..., half:]
        torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    return _label(ctx, run, copies, "torch_eager", s.variant)


def _embedding(s: PointwiseShape, ctx: BenchContext) -> Prepared:
    torch = ctx.require_torch()
    table = random_tensor(torch, (EMBEDDING_VOCAB, s.width), torch_dtype(torch, s.dtype), ctx.device)
    ids = torch.randint(0, EMBEDDING_VOCAB, (s.tokens,), device=ctx.device)
    embedding = torch.nn.functional.embedding

    def run(i: int) -> None:
        embedding(ids, table)

    return _label(ctx, run, 1, "torch_embedding", s.variant)


def _sampling(s: PointwiseShape, ctx: BenchContext) -> Prepared:
    if s.variant not in ("", "greedy"):
        raise Unsupported(f"sampling variant {s.variant!r}: only greedy (argmax) is benchmarked")
    torch, copies, xs = _inputs(s, ctx, s.width, 1.0)

    def run(i: int) -> None:
        torch.argmax(xs[i % copies][0], dim=-1)

    return _label(ctx, run, copies, "torch_argmax", s.variant)


def _fused(fn: Callable[[PointwiseShape, BenchContext, bool], Prepared], fused: bool) -> Builder:
    def build(s: PointwiseShape, ctx: BenchContext) -> Prepared:
        return fn(s, ctx, fused)

    return build


_BY_VARIANT: Final[dict[tuple[str, str], list[tuple[str, Builder]]]] = {
    **{("norm", v): [("flashinfer", _fused(_rmsnorm, True)), ("torch", _fused(_rmsnorm, False))]
       for v in ("", "rmsnorm", "rms_norm", *FUSED_ADD_NORM)},  # rms_norm: Vidur's name, the plan's
    **{("elementwise", v): [("flashinfer", _fused(_gated, True)), ("torch", _fused(_gated, False))]
       for v in ("silu_and_mul", "gelu_and_mul")},
    **{("elementwise", v): [("torch", _add)] for v in ("add", "residual_add")},
    ("elementwise", "rope"): [("torch", _rope)],
    ("embedding", ""): [("torch", _embedding)],
    ("sampling", ""): [("torch", _sampling)],
    ("sampling", "greedy"): [("torch", _sampling)],
}


def candidates(s: PointwiseShape) -> list[tuple[str, Builder]]:
    return list(_BY_VARIANT.get((s.kernel, s.variant), []))


def supported() -> list[str]:
    """`kernel/variant` pairs with a benchmark (blank variant shown as `-`)."""
    return [f"{k}/{v or '-'}" for k, v in _BY_VARIANT]
