"""Hand-computed pieces of the microbenchmark collector: loop sizing, quantiles, rotation, flags,
plan points, progress/ETA, rank averaging and the pointwise table reader."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import toy_hardware

from orchestrator.microbench.bench import BenchContext, copies_for
from orchestrator.microbench.collectives import _average_ranks, measure_group
from orchestrator.microbench.output import exceeds_dram_bw, exceeds_peak_flops
from orchestrator.microbench.points import AttentionShape, GemmShape, PlanPoint, family_of, read_plan
from orchestrator.microbench.progress import Progress, format_duration
from orchestrator.microbench.timing import TimingParams, calls_per_repeat, measure_cuda, measure_wall, quantile
from sim.calibration.rows import ROW_COLUMNS
from sim.calibration.tables import read_microbench_dir
from sim.errors import ConfigError


def row(**values: object) -> dict[str, str]:
    return {c: str(values.get(c, "")) for c in ROW_COLUMNS}


def ctx(rotate: int, cap: int) -> BenchContext:
    return BenchContext(torch=None, device="cpu", dry_run=True, timing=TimingParams(), rotate_bytes=rotate,
                        max_rotation_bytes=cap)


def test_calls_per_repeat_fills_the_target_in_whole_rotation_passes() -> None:
    p = TimingParams(target_graph_s=2e-3, max_calls_per_repeat=1024)
    assert calls_per_repeat(1e-5, 3, p) == 201  # ceil(200 / 3) passes of 3 copies
    assert calls_per_repeat(1e-2, 3, p) == 3  # a slow kernel still cycles every copy once
    assert calls_per_repeat(1e-9, 1, p) == 1024  # capped
    assert calls_per_repeat(1e-5, 300, TimingParams(max_calls_per_repeat=100)) == 300
    assert calls_per_repeat(0.0, 1, p) == 1024


def test_quantile_interpolates_like_numpy() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.1) == pytest.approx(1.3)
    assert quantile([5.0], 0.9) == 5.0
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_measure_wall_runs_warmup_probe_and_repeats() -> None:
    seen: list[int] = []
    m = measure_wall(seen.append, copies=2, params=TimingParams(warmup_calls=3, repeats=4, target_graph_s=1.0,
                                                                 max_calls_per_repeat=6))
    assert m.calls_per_repeat == 6 and m.repeats == 4 and m.timing == "wall_clock"
    assert len(seen) == 3 + 2 + 4 * 6
    assert set(seen[-6:]) == {0, 1, 2, 3, 4, 5}
    assert 0 <= m.p10_s <= m.median_s <= m.p90_s


def test_rotation_copies_span_the_target_within_the_cap() -> None:
    assert copies_for(100, ctx(300, 10_000)) == 3
    assert copies_for(400, ctx(300, 10_000)) == 1
    assert copies_for(1, ctx(300, 10_000)) == 256  # MAX_COPIES
    assert copies_for(10, ctx(300, 50)) == 5  # memory cap
    assert copies_for(0, ctx(300, 50)) == 1


def test_sanity_flags_by_hand() -> None:
    hw = toy_hardware()  # bf16 1e12 FLOP/s, 1e9 B/s
    prefill = row(kernel="context_attention", batch_size=1, seq_len=1000, num_heads=1, num_kv_heads=1, head_dim=128,
                  attn_dtype="bfloat16", window_size=0)
    # 2*b*h*d*s*s = 2.56e8 FLOPs
    assert exceeds_peak_flops(prefill, 1e-4, hw) and not exceeds_peak_flops(prefill, 1e-3, hw)
    windowed = {**prefill, "window_size": "100"}  # 2.56e7 FLOPs
    assert not exceeds_peak_flops(windowed, 1e-4, hw) and exceeds_peak_flops(windowed, 1e-5, hw)
    assert not exceeds_peak_flops(prefill, 1e-9, None)
    decode = row(kernel="generation_attention", batch_size=1000, kv_len=999, num_heads=64, num_kv_heads=8,
                 head_dim=128, attn_dtype="bfloat16", kv_cache_dtype="bfloat16", window_size=0)
    # KV = 1000 * 1000 * 2 * 8 * 128 * 2 B = 4.096e9 B
    assert exceeds_dram_bw(decode, 1.0, hw) and not exceeds_dram_bw(decode, 10.0, hw)
    small = {**decode, "batch_size": "1"}  # 4.1 MB: below the 1 GB threshold, never flagged
    assert not exceeds_dram_bw(small, 1e-9, hw)
    fp8 = {**decode, "kv_cache_dtype": "fp8"}  # half the bytes: 2.048e9 B
    assert exceeds_dram_bw(fp8, 1.9, hw) and not exceeds_dram_bw(fp8, 2.0, hw)
    # A sliding window reads its window, not the context: 1000 x 500 keys = 2.048e9 B.
    windowed_decode = {**decode, "window_size": "500"}
    assert exceeds_dram_bw(windowed_decode, 1.9, hw) and not exceeds_dram_bw(windowed_decode, 2.0, hw)


def test_plan_points_shapes_and_shrink() -> None:
    p = PlanPoint(number=1, family="generation_attention",
                  row=row(kernel="generation_attention", batch_size=512, kv_len=4095, num_heads=64, num_kv_heads=8,
                          head_dim=128, attn_dtype="bfloat16", kv_cache_dtype="fp8", window_size=0))
    full = p.shape()
    assert isinstance(full, AttentionShape)
    assert (full.q_tokens, full.kv_tokens, full.num_heads, full.num_kv_heads) == (1, 4096, 64, 8)
    small = p.shape(shrink=True)
    assert isinstance(small, AttentionShape)
    assert (small.batch_size, small.kv_tokens, small.num_heads, small.num_kv_heads) == (2, 64, 8, 2)
    assert small.kv_cache_dtype == "fp8"
    g = PlanPoint(number=2, family="gemm", row=row(kernel="gemm", dtype="fp8_block", m=8192, n=16384, k=4096))
    assert g.shape(shrink=True) == GemmShape(dtype="fp8_block", m=16, n=64, k=128)
    assert family_of("nccl_alltoall") == "nccl" and family_of("norm") == "pointwise"


def test_read_plan_validates_and_drops_duplicates(tmp_path: Path) -> None:
    header = ",".join(ROW_COLUMNS)
    good = ",".join(row(kernel="gemm", dtype="bfloat16", m=4, n=128, k=128).values())
    path = tmp_path / "plan.csv"
    path.write_text("\n".join([header, good, good.replace(",4,", ",4.0,")]) + "\n")
    plan = read_plan(path)
    assert len(plan.points) == 1 and plan.num_duplicates == 1
    bad = ",".join(row(kernel="gemm", dtype="int3", m=4, n=128, k=128).values())
    path.write_text("\n".join([header, good, bad]) + "\n")
    with pytest.raises(ConfigError, match="row 2") as exc:
        read_plan(path)
    assert exc.value.key == "dtype"
    with pytest.raises(ConfigError, match="plan CSV"):
        read_plan(tmp_path / "missing.csv")


def test_progress_eta_uses_the_budget_then_the_observed_rate() -> None:
    out = io.StringIO()
    prog = Progress(100.0, 4, 600.0, out, tty=False, interval_s=0.0)
    assert prog.eta_s(0.0) == 600.0
    prog.advance(25.0, "first")
    assert "1/4" in out.getvalue() and "plan budget 10.0 GPU-min" in out.getvalue()
    assert prog.eta_s(10.0) == pytest.approx(30.0)  # 10 s for 25 of 100 planned seconds
    assert format_duration(3725) == "1:02:05" and format_duration(65) == "1:05"


def test_rank_average_is_the_mean_of_rank_medians() -> None:
    base = {"key": "k", "status": "measured", "p10_s": 1.0, "p90_s": 3.0, "calls_per_repeat": 1, "repeats": 3,
            "timing": "cuda_graph"}
    out = _average_ranks([[{**base, "median_s": 2.0}], [{**base, "median_s": 3.0}]])
    assert out[0]["median_s"] == 2.5 and "1.50x" in out[0]["note"]
    skipped = _average_ranks([[{"key": "k", "status": "skipped"}], [{"key": "k", "status": "skipped"}]])
    assert skipped == [{"key": "k", "status": "skipped"}]


def test_collectives_dry_run_without_torch_measures_every_point() -> None:
    pts = [PlanPoint(number=i, family="nccl" if k != "custom_allreduce" else "custom_allreduce",
                     row=row(kernel=k, num_gpus=8, message_bytes=1 << 20))
           for i, k in enumerate(("nccl_all_reduce", "nccl_all_gather", "custom_allreduce"), start=1)]
    res = measure_group(None, None, pts, 8, "cpu", TimingParams(warmup_calls=0, repeats=2, max_calls_per_repeat=2),
                        None)
    assert [r["status"] for r in res] == ["measured"] * 3
    assert [r["backend"] for r in res] == ["nccl", "nccl", "torch"]
    assert all(math.isfinite(r["median_s"]) for r in res)


def test_reader_accepts_pointwise_csv(tmp_path: Path) -> None:
    (tmp_path / "pointwise.csv").write_text(
        "backend,backend_version,kernel_source,kernel,variant,dtype,m,n,latency_ms\n"
        "torch,2.6.0,torch_rms_norm,norm,rmsnorm,bfloat16,128,4096,0.004\n"
        "flashinfer,0.2.5,flashinfer_silu_and_mul,elementwise,silu_and_mul,bfloat16,128,14336,0.01\n")
    rows, excluded, digest = read_microbench_dir(tmp_path, "h100_sxm")
    assert list(rows.kernel) == ["norm", "elementwise"] and not excluded and len(digest) == 64
    assert list(rows.latency_s) == pytest.approx([4e-6, 1e-5])
    assert list(rows.unit) == ["4096", "14336"] and list(rows.variant) == ["rmsnorm", "silu_and_mul"]


class _FakeCuda:
    """Stands in for `torch.cuda` (no GPU here): events report a fixed 1 ms; a graph counts captured calls."""

    def __init__(self, fail_capture: bool) -> None:
        self.fail_capture, self.capturing, self.replays, self.syncs = fail_capture, False, 0, 0

    def synchronize(self) -> None:
        self.syncs += 1

    def Event(self, enable_timing: bool) -> Any:  # noqa: N802 (torch's name)
        class Event:
            def record(self) -> None: ...
            def synchronize(self) -> None: ...
            def elapsed_time(self, other: Any) -> float:
                return 1.0

        return Event()

    def CUDAGraph(self) -> Any:  # noqa: N802 (torch's name)
        cuda = self

        class Graph:
            def replay(self) -> None:
                cuda.replays += 1

        return Graph()

    @contextlib.contextmanager
    def graph(self, g: Any) -> Iterator[None]:
        self.capturing = True
        try:
            yield
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
        finally:
            self.capturing = False


@pytest.mark.parametrize("fail_capture", [False, True])
def test_measure_cuda_control_flow(fail_capture: bool) -> None:
    cuda = _FakeCuda(fail_capture)
    eager: list[int] = []
    captured: list[int] = []

    def run(i: int) -> None:
        (captured if cuda.capturing else eager).append(i)

    barriers: list[int] = []
    agreed: list[int] = []

    def agree(n: int) -> int:
        agreed.append(n)
        return n + 2

    params = TimingParams(warmup_calls=3, repeats=5, target_graph_s=5e-3, max_calls_per_repeat=100)
    m = measure_cuda(SimpleNamespace(cuda=cuda), run, copies=2, params=params,
                     before_repeat=lambda: barriers.append(1), agree_calls=agree)
    # probe: 1 ms over 2 copies = 0.5 ms per call -> 10 calls for 5 ms; the group agrees on 12
    assert agreed == [10] and m.calls_per_repeat == 12 and m.repeats == 5 and len(barriers) == 5
    assert captured == list(range(12))
    assert m.median_s == pytest.approx(1e-3 / 12)
    if fail_capture:
        assert m.timing == "cuda_events" and "capture failed" in m.note and cuda.replays == 0
        assert len(eager) == 3 + 2 + 6 * 12  # warm-up, probe, then 1 + 5 eager loops
    else:
        assert m.timing == "cuda_graph" and not m.note and cuda.replays == 6
        assert len(eager) == 3 + 2


def test_every_pointwise_kernel_the_shipped_plan_lists_has_a_benchmark() -> None:
    """The plan names norms as Vidur does (`rms_norm`); on the H200 run of 2026-11-28 its 12 norm
    points were skipped as 'no benchmark' until the collector accepted that name."""
    from orchestrator.microbench import pointwise
    from orchestrator.microbench.points import PointwiseShape
    from sim.calibration.plan import microbench_plan
    from sim.specs.catalog import load_hardware

    rows = [r for r in microbench_plan(load_hardware("h200_sxm")) if family_of(str(r["kernel"])) == "pointwise"]
    assert rows
    for r in rows:
        shape = PointwiseShape(kernel=str(r["kernel"]), variant=str(r.get("variant") or ""), dtype="bfloat16",
                               tokens=16, width=256)
        assert pointwise.candidates(shape), (r["kernel"], r.get("variant"))


def test_flashinfers_name_of_the_fused_add_norm_is_vllms_op() -> None:
    """The runner measures `fused_add_rmsnorm` (FlashInfer's name); the kernel model knows vLLM's
    `fused_add_rms_norm` (4 passes). Until 2026-12-02 such a row was another op, priced at 2 passes."""
    import numpy as np

    from sim.calibration.batch import family_batches
    from sim.calibration.rows import pointwise_op

    assert pointwise_op("norm", "fused_add_rmsnorm") == pointwise_op("norm", "fused_add_rms_norm")
    cols = {"kernel": np.array(["norm", "norm"], dtype=object),
            "variant": np.array(["fused_add_rmsnorm", "fused_add_rms_norm"], dtype=object),
            "dtype": np.array(["bfloat16"] * 2, dtype=object), "m": np.array([1024.0] * 2), "n": np.array([4096.0] * 2)}
    (batch,) = family_batches(cols, toy_hardware())
    assert list(batch.cats["op"]) == ["fused_add_rms_norm"] * 2
    assert batch.prims["bytes"][0] == batch.prims["bytes"][1] == 4 * 1024 * 4096 * 2
