"""Time whole forward passes of a dense Llama-style model on a CUDA GPU, to hold the simulator's
per-step kernel sum (`kernelsight step`) against a real GPU.

Not a CPU benchmark: it needs torch with a CUDA device (run on the lent H200 of 2026-11-28; see
docs/microbench.md#whole-forward-passes). The model is built from random bf16 weights with the
checkpoint's shapes (every layer its own weights, so weights stream from DRAM as in serving); the
kernels are those of the microbenchmark collector (`torch.matmul` = cuBLAS, `F.rms_norm`,
`scaled_dot_product_attention` on contiguous K/V, eager rotary and SiLU-and-mul), so a step's
time is the sum of the same kernel kinds the simulator prices, without a serving engine's fusion.

Shapes: `prefill:N` = one N-token prompt (causal, nothing cached); `prefill:BxN` = B prompts of N;
`decode:BxC` = B sequences, one new token each over C cached tokens. Each shape is timed eagerly
(host launch gaps included) and as one CUDA-graph replay (kernels only), median of `--repeats`.
Output: CSV on stdout and in `--out`, one row per shape.

    python3 benchmarks/gpu/forward_pass.py --model llama-3.1-8b --out forward.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812


@dataclass(frozen=True)
class Dense:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    rope_theta: float = 500_000.0
    eps: float = 1e-5


MODELS = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": Dense(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256),
    # Qwen/Qwen3-32B config.json (q/k norms omitted: two small norms per layer)
    "qwen3-32b": Dense(hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128, inter=25600, vocab=151936,
                       rope_theta=1_000_000.0, eps=1e-6),
    "tiny": Dense(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=256),
}
SHAPES = ("prefill:512", "prefill:1024", "prefill:2048", "prefill:4096", "prefill:8192", "prefill:16384",
          "prefill:4x2048", "decode:1x1024", "decode:8x1024", "decode:32x1024", "decode:64x1024",
          "decode:128x1024", "decode:256x1024", "decode:64x4096")


class Model:
    def __init__(self, cfg: Dense, device: str, dtype: Any) -> None:
        def w(*shape: int) -> Any:
            return torch.randn(*shape, device=device, dtype=dtype) * (1.0 / math.sqrt(shape[-1]))

        c = cfg
        self.cfg, self.device, self.dtype = c, device, dtype
        qkv = (c.heads + 2 * c.kv_heads) * c.head_dim
        self.embed = w(c.vocab, c.hidden)
        self.layers = [{"in_norm": torch.ones(c.hidden, device=device, dtype=dtype), "qkv": w(qkv, c.hidden),
                        "o": w(c.hidden, c.heads * c.head_dim),
                        "post_norm": torch.ones(c.hidden, device=device, dtype=dtype),
                        "gate_up": w(2 * c.inter, c.hidden), "down": w(c.hidden, c.inter)} for _ in range(c.layers)]
        self.final_norm = torch.ones(c.hidden, device=device, dtype=dtype)
        self.lm_head = w(c.vocab, c.hidden)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=device, dtype=torch.float32) / c.head_dim))
        self.inv_freq = inv

    def rope(self, x: Any, pos: Any) -> Any:
        """Neox-style rotary on [B, H, T, D] at positions `pos` [T] (or [B, 1])."""
        f = pos.to(torch.float32)[..., None] * self.inv_freq
        cos, sin = f.cos().to(x.dtype), f.sin().to(x.dtype)
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def forward(self, ids: Any, pos: Any, kv: list[tuple[Any, Any]] | None) -> Any:
        """ids [B, T]; `kv` = per-layer cached (K, V) [B, Hkv, C, D] for decode (T = 1), None for prefill."""
        c = self.cfg
        b, t = ids.shape
        h = F.embedding(ids, self.embed).view(b * t, c.hidden)
        for i, lw in enumerate(self.layers):
            x = F.rms_norm(h, (c.hidden,), lw["in_norm"], c.eps)
            qkv = torch.matmul(x, lw["qkv"].t()).view(b, t, c.heads + 2 * c.kv_heads, c.head_dim).transpose(1, 2)
            q, k, v = qkv.split((c.heads, c.kv_heads, c.kv_heads), dim=1)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if kv is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                a = F.scaled_dot_product_attention(q, kv[i][0], kv[i][1], enable_gqa=True)
            a = a.transpose(1, 2).reshape(b * t, c.heads * c.head_dim)
            h = h + torch.matmul(a, lw["o"].t())
            x = F.rms_norm(h, (c.hidden,), lw["post_norm"], c.eps)
            gu = torch.matmul(x, lw["gate_up"].t())
            g, u = gu.split(c.inter, dim=-1)
            h = h + torch.matmul(F.silu(g) * u, lw["down"].t())
        last = h.view(b, t, c.hidden)[:, -1]
        logits = torch.matmul(F.rms_norm(last, (c.hidden,), self.final_norm, c.eps), self.lm_head.t())
        return torch.argmax(logits, dim=-1)


def _median_ms(fn: Any, repeats: int, sync: Any) -> float:
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def time_shape(model: Model, shape: str, repeats: int) -> dict[str, Any]:
    ids, pos, kv, batch, length, kind = _inputs(model, shape)
    cuda = model.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.inference_mode():
        for _ in range(3):
            model.forward(ids, pos, kv)
        sync()
        eager = _median_ms(lambda: model.forward(ids, pos, kv), repeats, sync)
        graph_ms, note = float("nan"), ""
        if cuda:
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    model.forward(ids, pos, kv)
                g.replay()
                sync()
                graph_ms = _median_ms(g.replay, repeats, sync)
            except Exception as exc:  # a kernel that cannot be captured: eager only, said in the row
                note = f"graph capture failed: {type(exc).__name__}: {str(exc)[:100]}"
                sync()
    kv = None  # frees the cache before the next shape allocates its own
    if cuda:
        torch.cuda.empty_cache()
    tokens = batch * (length if kind == "prefill" else 1)
    return {"shape": shape, "phase": kind, "batch": batch, "length": length, "tokens": tokens,
            "eager_ms": round(eager, 4), "graph_ms": round(graph_ms, 4), "note": note}


def _inputs(model: Model, shape: str) -> tuple[Any, Any, list[tuple[Any, Any]] | None, int, int, str]:
    """(ids, positions, per-layer KV cache or None, batch, length, phase) of a `phase:[BxN]` shape."""
    c, dev = model.cfg, model.device
    kind, dims = shape.split(":")
    parts = [int(x) for x in dims.split("x")]
    batch, length = (parts[0], parts[1]) if len(parts) == 2 else (1, parts[0])
    if kind == "prefill":
        return (torch.randint(0, c.vocab, (batch, length), device=dev), torch.arange(length, device=dev), None,
                batch, length, kind)
    kv = [(torch.randn(batch, c.kv_heads, length + 1, c.head_dim, device=dev, dtype=model.dtype),
           torch.randn(batch, c.kv_heads, length + 1, c.head_dim, device=dev, dtype=model.dtype))
          for _ in range(c.layers)]
    return (torch.randint(0, c.vocab, (batch, 1), device=dev), torch.full((batch, 1), length, device=dev)[:, None],
            kv, batch, length, kind)


def profile_shape(model: Model, shape: str) -> list[dict[str, Any]]:
    """Per CUDA kernel name: launches and total device time of one eager forward pass of `shape`."""
    ids, pos, kv, _, _, _ = _inputs(model, shape)
    with torch.inference_mode():
        model.forward(ids, pos, kv)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            model.forward(ids, pos, kv)
            torch.cuda.synchronize()
    out = []
    for ev in prof.key_averages():
        us = float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0))
        if us > 0:
            out.append({"shape": shape, "kernel": ev.key[:160], "launches": ev.count, "device_us": round(us, 1)})
    kv = None  # frees the cache before the next shape allocates its own
    torch.cuda.empty_cache()
    return sorted(out, key=lambda r: -r["device_us"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out")
    ap.add_argument("--profile", help="also profile these shapes (comma-separated) per CUDA kernel")
    ap.add_argument("--profile-out", help="profile CSV (default profile.csv); one file for every profiled shape")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = Model(MODELS[args.model], args.device, torch.bfloat16)
    if torch.cuda.is_available():
        b = torch.backends.cuda
        print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}; sdpa enabled: flash "
              f"{b.flash_sdp_enabled()}, cudnn {b.cudnn_sdp_enabled()}, mem_efficient {b.mem_efficient_sdp_enabled()}",
              file=sys.stderr, flush=True)
    if args.profile:
        prof = [r for shape in args.profile.split(",") for r in profile_shape(model, shape)]
        with open(args.profile_out or "profile.csv", "w", newline="") as f:
            _write_csv(f, prof)
        for r in prof[:12]:
            print(r, file=sys.stderr, flush=True)
    rows = []
    for shape in args.shapes.split(","):
        r = {"model": args.model, **time_shape(model, shape, args.repeats)}
        rows.append(r)
        print(",".join(str(v) for v in r.values()), file=sys.stderr, flush=True)
    _write_csv(sys.stdout, rows)
    if args.out:
        with open(args.out, "w", newline="") as f:
            _write_csv(f, rows)
    return 0


def _write_csv(f: Any, rows: list[dict[str, Any]]) -> None:
    wr = csv.DictWriter(f, fieldnames=list(rows[0]))
    wr.writeheader()
    wr.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
