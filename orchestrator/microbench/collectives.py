"""Collective benchmarks: NCCL through torch.distributed, and a custom (non-NCCL) all-reduce.

For each group size in the plan that fits the visible GPUs, `num_gpus` processes are spawned
(one per GPU, NCCL backend, rendezvous on a free 127.0.0.1 port). Each point is timed on every
rank with the graph-captured loop of `timing.measure_cuda` (NCCL supports capture), a barrier
before every repeat; the reported latency is the mean over ranks of each rank's median, as
nccl-tests reports by default. Message sizes follow nccl-tests: all_gather's size is the gathered
output, reduce_scatter's the scattered input, all_reduce and alltoall the buffer; fp16 elements.
The custom all-reduce is torch's symmetric-memory one-shot (<= 1 MiB) or two-shot all-reduce,
the closest in-tree analogue of vLLM's custom all-reduce; it is skipped where torch lacks it.
Dry runs call the same per-point code in-process against a local stand-in for the group.
"""

from __future__ import annotations

import importlib
import json
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from orchestrator.microbench.bench import BenchContext, Unsupported, one_line
from orchestrator.microbench.points import CollectiveShape, PlanPoint
from orchestrator.microbench.timing import Measurement, TimingParams, measure_cuda, measure_wall

ONE_SHOT_MAX_BYTES: Final = 1 << 20
ELEMENT_BYTES: Final = 2
Op = Callable[[int], None]


def nccl_version(torch: Any) -> str:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # torch without NCCL
        return "unknown"
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def _elements(s: CollectiveShape, group: int) -> int:
    """fp16 elements of the message, rounded down to a multiple of the group size (at least one per rank)."""
    return max(s.message_bytes // ELEMENT_BYTES // group, 1) * group


def _nccl_op(torch: Any, dist: Any, s: CollectiveShape, group: int, device: str) -> Op:
    n = _elements(s, group)
    big = torch.empty(n, dtype=torch.float16, device=device).uniform_(-1, 1)
    small = torch.empty(n // group, dtype=torch.float16, device=device).uniform_(-1, 1)
    big_out = torch.empty_like(big)
    if s.op == "all_reduce":
        return lambda i: dist.all_reduce(big)
    if s.op == "all_gather":
        return lambda i: dist.all_gather_into_tensor(big, small)
    if s.op == "reduce_scatter":
        return lambda i: dist.reduce_scatter_tensor(small, big)
    if s.op == "alltoall":
        return lambda i: dist.all_to_all_single(big_out, big)
    raise Unsupported(f"collective {s.op!r}")


def _custom_op(torch: Any, dist: Any, s: CollectiveShape, group: int, device: str) -> tuple[Op, str]:
    try:
        symm_mem: Any = importlib.import_module("torch.distributed._symmetric_memory")
    except ImportError:
        raise Unsupported(f"torch {torch.__version__} has no symmetric memory (custom all-reduce)") from None
    ops = getattr(torch.ops, "symm_mem", None)
    one_shot = getattr(ops, "one_shot_all_reduce", None) if ops is not None else None
    two_shot = getattr(ops, "two_shot_all_reduce_", None) if ops is not None else None
    if one_shot is None or two_shot is None:
        raise Unsupported(f"torch {torch.__version__} lacks symm_mem one/two-shot all-reduce")
    name = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(name)
    buf = symm_mem.empty(_elements(s, group), dtype=torch.bfloat16, device=device)
    symm_mem.rendezvous(buf, name)
    buf.uniform_(-1, 1)
    if s.message_bytes <= ONE_SHOT_MAX_BYTES:
        return (lambda i: one_shot(buf, "sum", name)), "torch_symm_mem_one_shot"
    return (lambda i: two_shot(buf, "sum", name)), "torch_symm_mem_two_shot"


def _result(point: PlanPoint, status: str, reason: str, **labels: Any) -> dict[str, Any]:
    return {"key": point.key(), "status": status, "reason": reason, **labels}


def _build(torch: Any, dist: Any, s: CollectiveShape, group: int, device: str) -> tuple[Op, dict[str, str]]:
    if dist is None:
        return _local_op(torch, s, group, device)
    if s.custom:
        op, source = _custom_op(torch, dist, s, group, device)
        return op, {"backend": "torch", "backend_version": str(torch.__version__), "kernel_source": source,
                    "variant": "torch_symm_mem_graph"}
    return _nccl_op(torch, dist, s, group, device), {"backend": "nccl", "backend_version": nccl_version(torch),
                                                      "kernel_source": "", "variant": ""}


def _all_ok(dist: Any, group: int, ok: bool, reason: str) -> tuple[bool, str]:
    """Every rank's verdict: a point runs only if it runs on all ranks (else collectives would hang)."""
    if dist is None:
        return ok, reason
    flags: list[Any] = [None] * group
    dist.all_gather_object(flags, (ok, reason))
    bad = [f[1] for f in flags if not f[0]]
    return (not bad), (bad[0] if bad else "")


def measure_group(torch: Any, dist: Any, points: Sequence[PlanPoint], group: int, device: str,
                  timing: TimingParams, barrier: Callable[[], None] | None) -> list[dict[str, Any]]:
    """Time `points` on one rank of a process group (or in-process for a dry run when dist is None).

    Every collective step is entered by all ranks or by none: build, then agree; one trial call,
    then agree; then the timed loop with a call count agreed across ranks. Returns one result dict
    per point (JSON-serialisable): status, reason, labels and the `Measurement` fields of this rank.
    """
    out: list[dict[str, Any]] = []
    on_gpu = torch is not None and device.startswith("cuda")
    agree = None if dist is None else (lambda n: _max_over_ranks(torch, dist, n, device))
    for point in points:
        start = time.perf_counter()
        s = point.shape(shrink=dist is None)
        assert isinstance(s, CollectiveShape)
        op: Op | None = None
        labels: dict[str, str] = {}
        try:
            op, labels = _build(torch, dist, s, group, device)
            ok, reason = True, ""
        except Exception as exc:  # Unsupported, or a library error on this rank: every rank skips the point
            ok, reason = False, str(exc) if isinstance(exc, Unsupported) else one_line(exc)
        ok, reason = _all_ok(dist, group, ok, reason)
        if ok and op is not None:
            try:
                op(0)
                if on_gpu:
                    torch.cuda.synchronize()
            except Exception as exc:
                ok, reason = False, f"first call: {one_line(exc)}"
            ok, reason = _all_ok(dist, group, ok, reason)
        if not ok or op is None:
            out.append(_result(point, "skipped", reason, wall_s=time.perf_counter() - start))
            continue
        if on_gpu:
            m = measure_cuda(torch, op, copies=1, params=timing, before_repeat=barrier, agree_calls=agree)
        else:
            m = measure_wall(op, copies=1, params=timing, before_repeat=barrier)
        if s.custom and dist is not None and m.timing != "cuda_graph":
            labels["variant"] = "torch_symm_mem_eager"
        out.append(_result(point, "measured", "", **labels, **asdict(m), wall_s=time.perf_counter() - start))
    return out


def _max_over_ranks(torch: Any, dist: Any, n: int, device: str) -> int:
    t = torch.tensor([n], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _local_op(torch: Any, s: CollectiveShape, group: int, device: str) -> tuple[Op, dict[str, str]]:
    """Dry-run stand-in for a group: the same buffers, local copies instead of communication."""
    labels = {"backend": "nccl" if not s.custom else "torch", "backend_version": "dry-run",
              "kernel_source": "dry_run_local" if s.custom else "", "variant": "dry_run" if s.custom else ""}
    if torch is None:
        return (lambda i: None), labels
    n = _elements(s, group)
    big = torch.empty(n, dtype=torch.float16, device=device).uniform_(-1, 1)
    small = torch.empty(n // group, dtype=torch.float16, device=device)
    return (lambda i: torch.sum(big.view(group, -1), dim=0, out=small)), labels


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _worker(rank: int, world: int, port: int, payload_path: str, result_path: str) -> None:
    """Entry point of one spawned rank (module level so `spawn` can pickle it)."""
    from orchestrator.microbench.points import read_plan

    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")

    payload = json.loads(Path(payload_path).read_text())
    plan = read_plan(Path(payload["plan"]))
    keys = set(payload["keys"])
    points = [p for p in plan.points if p.key() in keys]
    timing = TimingParams(**payload["timing"])
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
    init: dict[str, Any] = {"backend": "nccl", "init_method": f"tcp://127.0.0.1:{port}", "rank": rank,
                            "world_size": world, "timeout": timedelta(minutes=5)}
    try:
        dist.init_process_group(**init, device_id=torch.device(device))
    except TypeError:  # torch < 2.3 has no device_id
        dist.init_process_group(**init)
    try:
        def barrier() -> None:
            dist.barrier()
            torch.cuda.synchronize()

        mine = measure_group(torch, dist, points, world, device, timing, barrier)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            Path(result_path).write_text(json.dumps(_average_ranks(gathered)))
    finally:
        dist.destroy_process_group()


def _average_ranks(per_rank: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rank 0's record with latencies averaged over ranks (nccl-tests' default report)."""
    out = []
    for records in zip(*per_rank, strict=True):
        first = dict(records[0])
        if first["status"] == "measured":
            for k in ("median_s", "p10_s", "p90_s"):
                first[k] = statistics.fmean(r[k] for r in records)
            spread = max(r["median_s"] for r in records) / max(min(r["median_s"] for r in records), 1e-12)
            if spread > 1.2:
                first["note"] = f"rank medians differ by {spread:.2f}x"
        out.append(first)
    return out


def run_spawned(plan_path: Path, points: Sequence[PlanPoint], group: int, timing: TimingParams) -> list[dict[str, Any]]:
    """Spawn `group` ranks on GPUs 0..group-1 and return their averaged results."""
    return spawn_ranks(_worker, plan_path, points, group, timing)


def spawn_ranks(worker: Callable[..., None], plan_path: Path, points: Sequence[PlanPoint], group: int,
                timing: TimingParams) -> list[dict[str, Any]]:
    """Spawn `group` ranks running `worker(rank, group, port, payload_path, result_path)` (a
    module-level function: the ranks are spawned processes) on GPUs 0..group-1; the payload names
    the plan, the points' keys and the timing; rank 0 writes the results as JSON."""
    mp: Any = importlib.import_module("torch.multiprocessing")

    with tempfile.TemporaryDirectory(prefix="kernelsight-mb-") as tmp:
        payload = Path(tmp) / "payload.json"
        result = Path(tmp) / "result.json"
        payload.write_text(json.dumps({"plan": str(plan_path), "keys": [p.key() for p in points],
                                       "timing": asdict(timing)}))
        mp.start_processes(worker, args=(group, _free_port(), str(payload), str(result)), nprocs=group,
                           join=True, start_method="spawn")
        results: list[dict[str, Any]] = json.loads(result.read_text())
        return results


def to_measurement(result: dict[str, Any]) -> Measurement:
    return Measurement(median_s=result["median_s"], p10_s=result["p10_s"], p90_s=result["p90_s"],
                       calls_per_repeat=result["calls_per_repeat"], repeats=result["repeats"],
                       timing=result["timing"], note=result.get("note", ""))


def collective_results(ctx: BenchContext, plan_path: Path, points: Sequence[PlanPoint],
                       visible_gpus: int) -> list[dict[str, Any]]:
    """Results for every collective point: measured, or skipped with the reason."""
    by_group: dict[int, list[PlanPoint]] = {}
    for p in points:
        by_group.setdefault(p.integer("num_gpus"), []).append(p)
    out: list[dict[str, Any]] = []
    for group, pts in sorted(by_group.items()):
        if ctx.dry_run:
            out += measure_group(ctx.torch, None, pts, group, ctx.device, ctx.timing, None)
        elif group < 2 or group > visible_gpus:
            out += [_result(p, "skipped", f"needs {group} GPUs, {visible_gpus} visible", wall_s=0.0) for p in pts]
        else:
            out += run_spawned(plan_path, pts, group, ctx.timing)
    return out
