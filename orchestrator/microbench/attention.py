"""Attention benchmarks: prefill over a fresh prompt and one decode step over a paged KV cache.

Implementations, in `auto` order (the first that runs a shape wins; each row names its kernel):
- `fa3`: FlashAttention 3 (`flash_attn_interface`, Hopper): varlen prefill, paged decode;
- `fa2`: FlashAttention 2 (`flash_attn`): varlen prefill, paged decode (page size 256, its minimum);
- `flashinfer`: FlashInfer paged prefill and decode (page size 16, vLLM's default block size), the
  only one here that reads an FP8 (e4m3) KV cache with bf16 queries;
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention` on contiguous K/V (no paging; GQA via
  `enable_gqa` where torch has it, else K/V expanded to all query heads).
Decode: one query token per sequence attends to `kv_len + 1` cached tokens. Prefill: causal over
`seq_len` tokens, nothing cached. The KV cache rotates over copies spanning 3 x L2, as a real
forward pass reads a layer's KV from DRAM. Units: tokens, bytes.
"""

from __future__ import annotations

import inspect
import math
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
from orchestrator.microbench.points import AttentionShape

Builder = Callable[[AttentionShape, BenchContext], Prepared]
ATTENTION_BACKENDS: Final = ("auto", "fa3", "fa2", "flashinfer", "sdpa")
FLASHINFER_PAGE: Final = 16
FLASH_ATTN_PAGE: Final = 256
FLASHINFER_WORKSPACE_BYTES: Final = 128 * 2**20


def _kv_bytes_per_token(s: AttentionShape) -> float:
    return 2.0 * s.num_kv_heads * s.head_dim * (1 if s.kv_cache_dtype == "fp8" else 2)


def _sixteen_bit(s: AttentionShape, name: str) -> None:
    if s.attn_dtype not in ("bfloat16", "float16"):
        raise Unsupported(f"{name} benchmark runs 16-bit queries only (attn_dtype={s.attn_dtype})")


def _pages(s: AttentionShape, page: int) -> tuple[int, int]:
    """(pages per sequence, tokens in the last page)."""
    per_seq = math.ceil(s.kv_tokens / page)
    return per_seq, s.kv_tokens - (per_seq - 1) * page


def _library(ctx: BenchContext, name: str) -> Any:
    lib = ctx.libraries.get(name)
    if lib is None:
        raise Unsupported(f"{name} is not installed")
    if not ctx.is_cuda():
        raise Unsupported(f"{name} needs a CUDA device")
    return lib


def _flashinfer(s: AttentionShape, ctx: BenchContext) -> Prepared:
    fi = _library(ctx, "flashinfer")
    torch = ctx.require_torch()
    _sixteen_bit(s, "flashinfer")
    q_dt, kv_dt = torch_dtype(torch, s.attn_dtype), torch_dtype(torch, s.kv_cache_dtype)
    per_seq, last = _pages(s, FLASHINFER_PAGE)
    num_pages = s.batch_size * per_seq
    copies = copies_for(num_pages * FLASHINFER_PAGE * _kv_bytes_per_token(s), ctx)
    dev = ctx.device
    caches = [random_tensor(torch, (num_pages, 2, FLASHINFER_PAGE, s.num_kv_heads, s.head_dim), kv_dt, dev)
              for _ in range(copies)]
    i32 = torch.int32
    kv_indptr = torch.arange(s.batch_size + 1, dtype=i32, device=dev) * per_seq
    kv_indices = torch.arange(num_pages, dtype=i32, device=dev)
    last_len = torch.full((s.batch_size,), last, dtype=i32, device=dev)
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    window_left = s.window_size - 1 if s.window_size > 0 else -1
    dtypes = {"q_data_type": q_dt, "kv_data_type": kv_dt}
    try:
        if s.decode:
            group = s.num_heads // s.num_kv_heads
            wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=group > 4)
            wrapper.plan(kv_indptr, kv_indices, last_len, s.num_heads, s.num_kv_heads, s.head_dim,
                         FLASHINFER_PAGE, window_left=window_left, **dtypes)
            q = random_tensor(torch, (s.batch_size, s.num_heads, s.head_dim), q_dt, dev)
        else:
            qo_indptr = torch.arange(s.batch_size + 1, dtype=i32, device=dev) * s.q_tokens
            wrapper = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
            wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_len, s.num_heads, s.num_kv_heads, s.head_dim,
                         FLASHINFER_PAGE, causal=True, window_left=window_left, **dtypes)
            q = random_tensor(torch, (s.batch_size * s.q_tokens, s.num_heads, s.head_dim), q_dt, dev)
    except TypeError as exc:
        raise Unsupported(f"flashinfer {getattr(fi, '__version__', '?')} plan() API differs: {exc}") from None

    def run(i: int) -> None:
        wrapper.run(q, caches[i % copies])

    kind = "paged_decode" if s.decode else "paged_prefill"
    return probe(Prepared(run=run, copies=copies, backend="flashinfer",
                          backend_version=str(getattr(fi, "__version__", "unknown")),
                          kernel_source=f"flashinfer_{kind}"), ctx, "flashinfer")


def _flash_attn(s: AttentionShape, ctx: BenchContext, module: str, label: str) -> Prepared:
    fa = _library(ctx, module)
    torch = ctx.require_torch()
    _sixteen_bit(s, label)
    if s.kv_cache_dtype != s.attn_dtype:
        raise Unsupported(f"{label} needs the KV cache in the query dtype (kv_cache_dtype={s.kv_cache_dtype})")
    cc = ctx.compute_capability or (0, 0)
    if label == "fa3" and cc[0] != 9:
        raise Unsupported(f"FlashAttention 3 runs on Hopper (sm90) only, device is sm{cc[0]}{cc[1]}")
    if cc < (8, 0):
        raise Unsupported(f"FlashAttention needs compute capability >= 8.0, device has {cc}")
    dt, dev = torch_dtype(torch, s.attn_dtype), ctx.device
    window = {"window_size": (s.window_size - 1, 0)} if s.window_size > 0 else {}
    if s.decode:
        per_seq, _ = _pages(s, FLASH_ATTN_PAGE)
        num_pages = s.batch_size * per_seq
        copies = copies_for(num_pages * FLASH_ATTN_PAGE * _kv_bytes_per_token(s), ctx)
        shape = (num_pages, FLASH_ATTN_PAGE, s.num_kv_heads, s.head_dim)
        k_caches = [random_tensor(torch, shape, dt, dev) for _ in range(copies)]
        v_caches = [random_tensor(torch, shape, dt, dev) for _ in range(copies)]
        params = inspect.signature(fa.flash_attn_with_kvcache).parameters
        table_arg = next((p for p in ("block_table", "page_table") if p in params), None)
        if table_arg is None:
            raise Unsupported(f"{module}.flash_attn_with_kvcache takes no block table")
        kwargs = {table_arg: torch.arange(num_pages, dtype=torch.int32, device=dev).view(s.batch_size, per_seq),
                  "cache_seqlens": torch.full((s.batch_size,), s.kv_tokens, dtype=torch.int32, device=dev),
                  "causal": True, **window}
        q = random_tensor(torch, (s.batch_size, 1, s.num_heads, s.head_dim), dt, dev)

        def run(i: int) -> None:
            fa.flash_attn_with_kvcache(q, k_caches[i % copies], v_caches[i % copies], **kwargs)

        source = f"{label}_paged_decode"
    else:
        tokens = s.batch_size * s.q_tokens
        copies = copies_for(tokens * _kv_bytes_per_token(s), ctx)
        ks = [random_tensor(torch, (tokens, s.num_kv_heads, s.head_dim), dt, dev) for _ in range(copies)]
        vs = [random_tensor(torch, (tokens, s.num_kv_heads, s.head_dim), dt, dev) for _ in range(copies)]
        q = random_tensor(torch, (tokens, s.num_heads, s.head_dim), dt, dev)
        cu = torch.arange(s.batch_size + 1, dtype=torch.int32, device=dev) * s.q_tokens

        def run(i: int) -> None:
            fa.flash_attn_varlen_func(q, ks[i % copies], vs[i % copies], cu, cu, s.q_tokens, s.q_tokens,
                                      causal=True, **window)

        source = f"{label}_varlen_prefill"
    version = getattr(fa, "__version__", None) or getattr(ctx.libraries.get("flash_attn"), "__version__", "unknown")
    return probe(Prepared(run=run, copies=copies, backend="flash_attn", backend_version=str(version),
                          kernel_source=source), ctx, label)


def _fa3(s: AttentionShape, ctx: BenchContext) -> Prepared:
    return _flash_attn(s, ctx, "flash_attn_interface", "fa3")


def _fa2(s: AttentionShape, ctx: BenchContext) -> Prepared:
    return _flash_attn(s, ctx, "flash_attn", "fa2")


def _sdpa(s: AttentionShape, ctx: BenchContext) -> Prepared:
    torch = ctx.require_torch()
    _sixteen_bit(s, "sdpa")
    if s.kv_cache_dtype != s.attn_dtype:
        raise Unsupported(f"torch SDPA needs the KV cache in the query dtype (kv_cache_dtype={s.kv_cache_dtype}); "
                          "install flashinfer for FP8 KV")
    if s.window_size > 0:
        raise Unsupported("torch SDPA benchmark has no sliding window")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dt, dev = torch_dtype(torch, s.attn_dtype), ctx.device
    group = s.num_heads // s.num_kv_heads
    q = random_tensor(torch, (s.batch_size, s.num_heads, s.q_tokens, s.head_dim), dt, dev)
    kv_shape = (s.batch_size, s.num_kv_heads, s.kv_tokens, s.head_dim)
    try:
        probe_k = random_tensor(torch, kv_shape, dt, dev)
        sdpa(q, probe_k, probe_k, is_causal=not s.decode, enable_gqa=True)
        expand, source = 1, "torch_sdpa"
    except TypeError:  # torch < 2.5: no enable_gqa; K/V are materialized for every query head
        expand, source = group, "torch_sdpa_expanded_kv"
    copies = copies_for(s.batch_size * s.kv_tokens * _kv_bytes_per_token(s) * expand, ctx)

    def kv() -> Any:
        t = random_tensor(torch, kv_shape, dt, dev)
        return t.repeat_interleave(group, dim=1) if expand > 1 else t

    ks = [kv() for _ in range(copies)]
    vs = [kv() for _ in range(copies)]
    extra = {"enable_gqa": True} if expand == 1 and group > 1 else {}

    def run(i: int) -> None:
        sdpa(q, ks[i % copies], vs[i % copies], is_causal=not s.decode, **extra)

    return Prepared(run=run, copies=copies, backend="torch", backend_version=ctx.torch_version(),
                    kernel_source=source + ("_decode" if s.decode else "_prefill"))


_BUILDERS: Final[dict[str, Builder]] = {"fa3": _fa3, "fa2": _fa2, "flashinfer": _flashinfer, "sdpa": _sdpa}


def candidates(s: AttentionShape, backend: str = "auto") -> list[tuple[str, Builder]]:
    """Implementations to try for `s`: all in `auto` order, or only the one asked for."""
    if s.num_kv_heads <= 0 or s.num_heads % s.num_kv_heads:
        return []
    names = list(_BUILDERS) if backend == "auto" else [backend]
    return [(n, _BUILDERS[n]) for n in names]
