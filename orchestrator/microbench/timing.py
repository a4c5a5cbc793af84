"""Timing loops: CUDA events around a CUDA-graph-captured loop on a GPU, wall clock on a CPU.

GPU method, per point (the AIConfigurator collector's method, with full weight rotation):
1. warm-up: `warmup_calls` eager calls, and at least one pass over every rotation copy (cuBLAS
   heuristics, JIT compilation and lazy allocations happen here);
2. probe: one eager pass, timed with CUDA events, estimates the per-call time;
3. capture `calls_per_repeat` calls into one CUDA graph: enough calls for the replay to last
   `target_graph_s`, and a whole number of passes over the rotation copies, so that every call
   reads weights (or KV cache) that left L2 at least one pass ago;
4. `repeats` replays, each bracketed by CUDA events; per-call time = replay time / calls;
   the reported latency is the median over repeats (p10/p90 kept as spread).
If capture fails (a kernel that cannot be captured) the same loop runs eagerly between the events
and the point records `timing=cuda_events`. CPU (`--dry-run --device cpu`) uses perf_counter.
Units: seconds.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

TIMING_MODES: Final = ("cuda_graph", "cuda_events", "wall_clock")


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingParams:
    warmup_calls: int = 5
    repeats: int = 10
    target_graph_s: float = 2e-3
    """Replay length aimed at: long enough that event resolution (~0.5 us) and replay launch are noise."""
    max_calls_per_repeat: int = 1024
    use_cuda_graph: bool = True

    def __post_init__(self) -> None:
        if self.warmup_calls < 0 or self.repeats < 1 or self.max_calls_per_repeat < 1 or self.target_graph_s <= 0:
            raise ValueError(f"invalid timing parameters: {self!r}")


DRY_RUN_TIMING: Final = TimingParams(warmup_calls=1, repeats=3, target_graph_s=1e-6, max_calls_per_repeat=4)


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    median_s: float
    p10_s: float
    p90_s: float
    calls_per_repeat: int
    repeats: int
    timing: str
    """One of TIMING_MODES."""
    note: str = ""


def calls_per_repeat(per_call_s: float, copies: int, params: TimingParams) -> int:
    """Calls in one timed loop: fill `target_graph_s`, whole passes over `copies`, capped."""
    copies = max(copies, 1)
    wanted = params.max_calls_per_repeat if per_call_s <= 0 else math.ceil(params.target_graph_s / per_call_s)
    wanted = min(max(wanted, 1), params.max_calls_per_repeat)
    return max(copies, math.ceil(wanted / copies) * copies)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of an ascending sequence (numpy's default method)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(per_call_s: Sequence[float], *, calls: int, timing: str, note: str = "") -> Measurement:
    values = sorted(per_call_s)
    return Measurement(median_s=quantile(values, 0.5), p10_s=quantile(values, 0.1), p90_s=quantile(values, 0.9),
                       calls_per_repeat=calls, repeats=len(values), timing=timing, note=note)


def measure_wall(run: Callable[[int], None], *, copies: int, params: TimingParams,
                 before_repeat: Callable[[], None] | None = None) -> Measurement:
    """Host wall-clock timing of synchronous calls (CPU tensors or plain Python)."""
    for i in range(max(params.warmup_calls, copies)):
        run(i)
    start = time.perf_counter()
    for i in range(copies):
        run(i)
    calls = calls_per_repeat((time.perf_counter() - start) / copies, copies, params)
    times = []
    for _ in range(params.repeats):
        if before_repeat is not None:
            before_repeat()
        start = time.perf_counter()
        for i in range(calls):
            run(i)
        times.append((time.perf_counter() - start) / calls)
    return summarize(times, calls=calls, timing="wall_clock")


def measure_cuda(torch: Any, run: Callable[[int], None], *, copies: int, params: TimingParams,
                 before_repeat: Callable[[], None] | None = None,
                 agree_calls: Callable[[int], int] | None = None) -> Measurement:
    """CUDA-event timing of a graph-captured loop on the current device (see the module docstring).

    `agree_calls` maps this process's loop length to one all ranks of a collective use (their max),
    so every rank issues the same number of collectives; `before_repeat` aligns them (a barrier).
    """
    cuda = torch.cuda
    for i in range(max(params.warmup_calls, copies)):
        run(i)
    cuda.synchronize()
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    start.record()
    for i in range(copies):
        run(i)
    end.record()
    end.synchronize()
    calls = calls_per_repeat(start.elapsed_time(end) * 1e-3 / copies, copies, params)
    if agree_calls is not None:
        calls = agree_calls(calls)

    graph = None
    note = ""
    if params.use_cuda_graph:
        try:
            g = cuda.CUDAGraph()
            with cuda.graph(g):
                for i in range(calls):
                    run(i)
            graph = g
        except Exception as exc:  # a kernel that cannot be captured: time it eagerly instead
            note = f"graph capture failed ({type(exc).__name__}: {str(exc)[:120]}); eager loop"
            cuda.synchronize()

    def loop() -> None:
        if graph is not None:
            graph.replay()
        else:
            for i in range(calls):
                run(i)

    loop()
    cuda.synchronize()
    times = []
    for _ in range(params.repeats):
        if before_repeat is not None:
            before_repeat()
        start.record()
        loop()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return summarize(times, calls=calls, timing="cuda_graph" if not note and params.use_cuda_graph
                     else "cuda_events", note=note)
