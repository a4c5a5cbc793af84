"""Simulated step times against the whole forward passes measured on real GPUs (`forward_pass.py`).

Reads `sim/data/microbench/<gpu>/<date>/forward/*.csv` (no GPU needed), prices the same step with
`kernelsight step`'s model (`predict_step`) in both prediction tiers, and prints markdown tables:
per shape, the measured CUDA-graph time (kernels only) and eager time against the simulated
kernel sum; per kernel kind, each profiled step against the simulated breakdown.

    PYTHONPATH=. python benchmarks/gpu/compare_forward.py [--root sim/data/microbench]
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from pathlib import Path

from sim.api import load_scenario, predict_step
from sim.graph.batch import BatchShape, PrefillChunk

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llama3_8b-h100.toml"
MODELS = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B", "qwen3-32b": "Qwen/Qwen3-32B"}
TIERS = ("target-measured", "cross-generation")
# Profiled CUDA kernel name -> the simulator's kernel kind (torch 2.11 / cuBLAS / cuDNN names).
KINDS = (("gemm", re.compile(r"nvjet|gemm|cutlass|sm90_xmma")),
         ("attn_prefill", re.compile(r"sdpa|flash|fmha|attention")),
         ("norm", re.compile(r"layer_norm|rms_norm|rmsnorm")),
         ("embedding", re.compile(r"index|embedding|gather")),
         ("sampling", re.compile(r"argmax|reduce_kernel")))


def batch_of(phase: str, batch: int, length: int) -> BatchShape:
    if phase == "prefill":
        return BatchShape(prefills=tuple(PrefillChunk(new_tokens=length, context_tokens=0) for _ in range(batch)))
    return BatchShape(decode_context_tokens=tuple([length] * batch))


def simulate(gpu: str, model: str, phase: str, batch: int, length: int, tier: str) -> tuple[float, dict[str, float]]:
    scenario = load_scenario(SCENARIO, {"hardware.name": gpu, "model.name": MODELS[model], "perf.tier": tier,
                                        "engine.max_model_len": 32768})
    timing = predict_step(scenario, batch_of(phase, batch, length))
    return timing.device_s(), {k.value: v for k, v in timing.seconds_by_kind().items()}


def kind_of(kernel: str, phase: str) -> str:
    kind = next((kind for kind, rx in KINDS if rx.search(kernel)), "elementwise")
    return "attn_decode" if kind == "attn_prefill" and phase == "decode" else kind


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="sim/data/microbench")
    args = ap.parse_args(argv)
    runs = sorted(Path(args.root).glob("*/*/forward"))
    print("| GPU | model | shape | measured graph ms | measured eager ms | simulated TM ms | TM / graph | "
          "simulated xgen ms | xgen / graph |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        gpu = run.parent.parent.name
        for path in sorted(run.glob("*.csv")):
            if "_profile_" in path.name:
                continue
            with path.open() as f:
                for r in csv.DictReader(f):
                    b, n, graph = int(r["batch"]), int(r["length"]), float(r["graph_ms"])
                    sims = [1e3 * simulate(gpu, r["model"], r["phase"], b, n, t)[0] for t in TIERS]
                    print(f"| {gpu} | {r['model']} | {r['shape']} | {graph:.2f} | {float(r['eager_ms']):.2f} | "
                          f"{sims[0]:.2f} | {sims[0] / graph:.2f} | {sims[1]:.2f} | {sims[1] / graph:.2f} |")
    print()
    print("| GPU | model | shape | kind | profiled ms | simulated TM ms | TM / profiled | simulated xgen ms |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for run in runs:
        gpu = run.parent.parent.name
        for path in sorted(run.glob("*_profile_*.csv")):
            model = path.name.split("_profile_")[0]
            by_shape: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            with path.open() as f:
                for r in csv.DictReader(f):
                    phase = r["shape"].split(":")[0]
                    by_shape[r["shape"]][kind_of(r["kernel"], phase)] += float(r["device_us"]) / 1e3
            for shape, measured in by_shape.items():
                phase, dims = shape.split(":")
                parts = [int(x) for x in dims.split("x")]
                b, n = (parts[0], parts[1]) if len(parts) == 2 else (1, parts[0])
                sim = [simulate(gpu, model, phase, b, n, t)[1] for t in TIERS]
                for kind in sorted(set(measured) | set(sim[0]), key=lambda k: -measured.get(k, 0.0)):
                    m, tm, xg = measured.get(kind, 0.0), 1e3 * sim[0].get(kind, 0.0), 1e3 * sim[1].get(kind, 0.0)
                    ratio = f"{tm / m:.2f}" if m else "-"
                    print(f"| {gpu} | {model} | {shape} | {kind} | {m:.2f} | {tm:.2f} | {ratio} | {xg:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
