"""Collectors of the table-keyed families (MoE, MLA, MLA-BMM, DeepEP) for `microbench run`.

Each point is one row of an AIConfigurator table (moe.csv.gz, mla_*.csv.gz, mla_bmm.csv,
deepep_*.csv); `orchestrator.microbench.output` writes the measured rows in exactly that layout, so
`kernelsight calibrate --microbench DIR` reads them like the shipped tables.

- `moe`: vLLM's fused MoE Triton kernel (`vllm.model_executor.layers.fused_moe.fused_experts`) on
  expert-parallel rank 0's shard (num_experts / moe_ep experts of width inter / moe_tp), the tokens
  routed as AIConfigurator's collector routes them (`sim.graph.moe_routing.rank0_expert_counts`:
  the rank's local experts get their counts, the other selections go to experts of other ranks,
  which `expert_map` skips). bfloat16 and per-tensor fp8 weights; fp8_block and the 4-bit formats
  need DeepGEMM / CUTLASS paths this collector does not drive (skipped, named).
- `mla_generation`: absorbed MLA decode over the 576-wide latent cache (512 + 64 rope), bfloat16:
  FlashMLA (`flash_mla.flash_mla_with_kvcache`, page 64), else FlashInfer's MLA paged decode
  (`flashinfer.mla.BatchMLAPagedAttentionWrapper`, page 1). fp8 caches are skipped.
- `mla_bmm`: the absorbed decode's per-head batched GEMMs (`torch.bmm`): `mla_gen_pre` q_nope (128)
  -> latent (512), `mla_gen_post` latent (512) -> v (128), heads as the batch.
- `mla_context` and the module rows are not collected here: every such point is skipped with a
  reason that names what measuring it needs.
- `deepep_*` points are measured by `orchestrator.microbench.deepep` (one spawned process per GPU);
  the runner sends them there, and a point that reaches this module is refused naming DeepEP.

A family whose library is absent is skipped with the library named and whether it imports here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from orchestrator.microbench.bench import (
    BenchContext,
    Prepared,
    Unsupported,
    copies_for,
    one_line,
    probe,
    random_tensor,
)
from sim.graph.moe_routing import rank0_expert_counts

NEEDS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "moe": (("vllm", "vLLM's fused_moe Triton kernel (vllm.model_executor.layers.fused_moe)"),),
    "mla": (("flash_mla", "FlashMLA (MLA decode)"), ("flashinfer", "FlashInfer MLA decode")),
    "mla_bmm": (("torch", "torch.bmm"),),
    "deepep": (("deep_ep", "DeepEP (expert dispatch/combine)"),),
}
MLA_LATENT: Final = 512
MLA_ROPE: Final = 64
MLA_NOPE: Final = 128
MLA_V: Final = 128
FLASH_MLA_PAGE: Final = 64

Builder = Callable[["TableShape", BenchContext], Prepared]


@dataclass(frozen=True, slots=True, kw_only=True)
class TableShape:
    """A table-keyed point: the table name, its family and its plan row."""

    kernel: str
    family: str
    row: Mapping[str, str] = field(default_factory=dict)

    def integer(self, column: str, default: int = 0) -> int:
        raw = self.row.get(column, "").strip()
        return int(float(raw)) if raw else default

    def text(self, column: str, default: str = "") -> str:
        return self.row.get(column, "").strip() or default


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # absent, or built for another CUDA/torch: not usable either way
        return False
    return True


def missing_message(family: str) -> str:
    """What measuring `family` needs, and which of it is importable here."""
    parts = [f"{what} [{module}: {'importable' if _importable(module) else 'not installed'}]"
             for module, what in NEEDS[family]]
    return "needs " + " or ".join(parts)


def _import(ctx: BenchContext, module: str, family: str) -> Any:
    """`module`, or `Unsupported` naming it (and torch) when it cannot be used here."""
    try:
        found = importlib.import_module(module)
    except Exception as exc:
        torch = "importable" if _importable("torch") else "not installed"
        raise Unsupported(f"{missing_message(family)}; torch: {torch} ({module}: {one_line(exc, 80)})") from None
    ctx.require_torch()
    return found


def _labels(backend: str, module: Any, source: str) -> dict[str, str]:
    return {"backend": backend, "backend_version": str(getattr(module, "__version__", "unknown")),
            "kernel_source": source}


# -- MoE ----------------------------------------------------------------------------------------
def routed_ids(num_tokens: int, topk: int, num_experts: int, counts: list[int]) -> list[list[int]]:
    """Top-k expert ids per token such that local expert e (ids 0..len(counts)-1) is picked by
    counts[e] tokens and every other selection goes to an expert outside the local range (another
    rank's; ids from len(counts) up, cycling). Positions fill slot by slot, token by token, so one
    token never picks a local expert twice while counts[e] <= num_tokens."""
    local = len(counts)
    total = num_tokens * topk
    assert sum(counts) <= total and all(c <= num_tokens for c in counts)
    flat: list[int] = []
    for e, c in enumerate(counts):
        flat += [e] * c
    others = max(num_experts - local, 0)
    for j in range(total - len(flat)):
        flat.append(local + j % others if others else j % max(local, 1))
    return [[flat[slot * num_tokens + t] for slot in range(topk)] for t in range(num_tokens)]


def _vllm_fused_moe(s: TableShape, ctx: BenchContext) -> Prepared:
    fused = _import(ctx, "vllm.model_executor.layers.fused_moe", "moe")
    vllm = importlib.import_module("vllm")
    torch = ctx.require_torch()
    dtype = s.text("moe_dtype", "bfloat16")
    if dtype not in ("bfloat16", "float16", "fp8"):
        raise Unsupported(f"moe_dtype={dtype!r}: the fused MoE collector runs bfloat16 and per-tensor fp8 "
                          "(fp8_block needs DeepGEMM / Triton block scales, 4-bit formats CUTLASS/Marlin paths)")
    tokens, h, inter = s.integer("num_tokens"), s.integer("hidden_size"), s.integer("inter_size")
    topk, experts = s.integer("topk"), s.integer("num_experts")
    tp, ep = max(s.integer("moe_tp_size", 1), 1), max(s.integer("moe_ep_size", 1), 1)
    local, width = experts // ep, inter // tp
    counts = [int(c) for c in rank0_expert_counts(tokens, experts, topk, ep, s.text("distribution", "balanced"))]
    ids = torch.tensor(routed_ids(tokens, topk, experts, counts), dtype=torch.int32, device=ctx.device)
    weights = torch.full((tokens, topk), 1.0 / topk, dtype=torch.float32, device=ctx.device)
    expert_map = None
    if ep > 1:
        expert_map = torch.full((experts,), -1, dtype=torch.int32, device=ctx.device)
        expert_map[:local] = torch.arange(local, dtype=torch.int32, device=ctx.device)
    act = torch.bfloat16 if dtype != "float16" else torch.float16
    wdt = torch.float8_e4m3fn if dtype == "fp8" else act
    per_copy = local * 3 * h * width * (1 if dtype == "fp8" else 2)
    copies = copies_for(per_copy, ctx)
    x = random_tensor(torch, (tokens, h), act, ctx.device)
    w1 = [random_tensor(torch, (local, 2 * width, h), wdt, ctx.device) for _ in range(copies)]
    w2 = [random_tensor(torch, (local, h, width), wdt, ctx.device) for _ in range(copies)]
    kwargs: dict[str, Any] = {"global_num_experts": experts, "expert_map": expert_map}
    if dtype == "fp8":
        one = torch.ones((local,), dtype=torch.float32, device=ctx.device)
        kwargs.update(use_fp8_w8a8=True, w1_scale=one, w2_scale=one)

    def run(i: int) -> None:
        fused.fused_experts(x, w1[i % copies], w2[i % copies], weights, ids, **kwargs)

    labels = _labels("vllm", vllm, f"vllm_{dtype}_triton_fused_moe")
    prepared = Prepared(run=run, copies=copies, **labels)
    try:
        return probe(prepared, ctx, "vLLM fused_experts")
    except TypeError as exc:  # a vLLM whose fused_experts takes a quant_config instead of these keywords
        raise Unsupported(f"vLLM {labels['backend_version']} fused_experts signature: {exc}") from None


# -- MLA decode -----------------------------------------------------------------------------------
def _mla_decode_inputs(s: TableShape, ctx: BenchContext) -> tuple[Any, int, int, int]:
    torch = ctx.require_torch()
    if s.text("kv_cache_dtype", "bfloat16") not in ("bfloat16", "bf16"):
        raise Unsupported("fp8 MLA caches: FlashMLA's FP8 path (656-byte rows, sparse kernels) is not driven here")
    return torch, s.integer("batch_size"), s.integer("kv_len") + 1, s.integer("num_heads")


def _flash_mla(s: TableShape, ctx: BenchContext) -> Prepared:
    flash_mla = _import(ctx, "flash_mla", "mla")
    torch, b, kv, heads = _mla_decode_inputs(s, ctx)
    dt = torch.bfloat16
    pages = -(-kv // FLASH_MLA_PAGE)
    per_copy = b * pages * FLASH_MLA_PAGE * (MLA_LATENT + MLA_ROPE) * 2
    copies = copies_for(per_copy, ctx)
    q = random_tensor(torch, (b, 1, heads, MLA_LATENT + MLA_ROPE), dt, ctx.device)
    caches = [random_tensor(torch, (b * pages, FLASH_MLA_PAGE, 1, MLA_LATENT + MLA_ROPE), dt, ctx.device)
              for _ in range(copies)]
    table = torch.arange(b * pages, dtype=torch.int32, device=ctx.device).view(b, pages)
    seqlens = torch.full((b,), kv, dtype=torch.int32, device=ctx.device)
    meta, splits = flash_mla.get_mla_metadata(seqlens, heads, 1)

    def run(i: int) -> None:
        flash_mla.flash_mla_with_kvcache(q, caches[i % copies], table, seqlens, MLA_LATENT, meta, splits,
                                         causal=True)

    return probe(Prepared(run=run, copies=copies, **_labels("flash_mla", flash_mla, "flash_mla")), ctx,
                 "FlashMLA decode")


def _flashinfer_mla(s: TableShape, ctx: BenchContext) -> Prepared:
    flashinfer = _import(ctx, "flashinfer", "mla")
    mla = importlib.import_module("flashinfer.mla")
    torch, b, kv, heads = _mla_decode_inputs(s, ctx)
    dt = torch.bfloat16
    per_copy = b * kv * (MLA_LATENT + MLA_ROPE) * 2
    copies = copies_for(per_copy, ctx)
    workspace = torch.empty(128 * 2**20, dtype=torch.uint8, device=ctx.device)
    wrapper = mla.BatchMLAPagedAttentionWrapper(workspace)
    qo_indptr = torch.arange(b + 1, dtype=torch.int32, device=ctx.device)
    kv_indptr = torch.arange(b + 1, dtype=torch.int32, device=ctx.device) * kv
    kv_indices = torch.arange(b * kv, dtype=torch.int32, device=ctx.device)
    kv_lens = torch.full((b,), kv, dtype=torch.int32, device=ctx.device)
    scale = (MLA_NOPE + MLA_ROPE) ** -0.5
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, heads, MLA_LATENT, MLA_ROPE, 1, False, scale, dt, dt)
    q_nope = random_tensor(torch, (b, heads, MLA_LATENT), dt, ctx.device)
    q_pe = random_tensor(torch, (b, heads, MLA_ROPE), dt, ctx.device)
    ckv = [random_tensor(torch, (b * kv, 1, MLA_LATENT), dt, ctx.device) for _ in range(copies)]
    kpe = [random_tensor(torch, (b * kv, 1, MLA_ROPE), dt, ctx.device) for _ in range(copies)]

    def run(i: int) -> None:
        wrapper.run(q_nope, q_pe, ckv[i % copies], kpe[i % copies])

    labels = _labels("flashinfer", flashinfer, "flashinfer_mla")
    return probe(Prepared(run=run, copies=copies, **labels), ctx, "FlashInfer MLA decode")


# -- MLA BMM ----------------------------------------------------------------------------------------
def _mla_bmm(s: TableShape, ctx: BenchContext) -> Prepared:
    torch = ctx.require_torch()
    if s.text("bmm_dtype", "bfloat16") not in ("bfloat16", "bf16"):
        raise Unsupported("fp8 MLA BMM (TRT-LLM's FP8 batched GEMM) is not benchmarked; vLLM runs it in bfloat16")
    tokens, heads = s.integer("num_tokens"), s.integer("num_heads")
    pre = s.text("op_name", "mla_gen_pre") == "mla_gen_pre"
    k, n = (MLA_NOPE, MLA_LATENT) if pre else (MLA_LATENT, MLA_V)
    dt = torch.bfloat16
    copies = copies_for(heads * k * n * 2, ctx)
    x = random_tensor(torch, (heads, tokens, k), dt, ctx.device)
    ws = [random_tensor(torch, (heads, k, n), dt, ctx.device) for _ in range(copies)]

    def run(i: int) -> None:
        torch.bmm(x, ws[i % copies])

    return Prepared(run=run, copies=copies, backend="torch", backend_version=ctx.torch_version(),
                    kernel_source="torch_bmm")


def _refuse(reason: str) -> Builder:
    def build(s: TableShape, ctx: BenchContext) -> Prepared:
        raise Unsupported(f"{s.kernel}: {reason}")

    return build


def candidates(shape: TableShape) -> Iterator[tuple[str, Builder]]:
    """Implementations to try, best first."""
    if shape.kernel == "moe":
        yield "vllm_fused_moe", _vllm_fused_moe
    elif shape.kernel == "mla_generation":
        yield "flash_mla", _flash_mla
        yield "flashinfer_mla", _flashinfer_mla
    elif shape.kernel == "mla_bmm":
        yield "torch_bmm", _mla_bmm
    elif shape.family == "deepep":
        yield "deep_ep", _refuse(f"{missing_message('deepep')} and one process per GPU of an NVLink node "
                                 "(measured in spawned ranks by orchestrator.microbench.deepep)")
    else:
        yield shape.kernel, _refuse("no kernelsight collector for this table yet (MLA prefill and the MLA module "
                                    f"rows); {missing_message(shape.family)}")
