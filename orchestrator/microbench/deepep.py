"""DeepEP dispatch + combine for `microbench run` (`deepep_ll` and `deepep_normal` plan points).

DeepEP needs one process per GPU of an NVLink node: for each GPU count in the plan that fits the
visible GPUs, `num_gpus` ranks are spawned with `torch.multiprocessing` (NCCL process group,
rendezvous on a free 127.0.0.1 port, rank r on GPU r), as the collectives' launcher does. Each
rank builds one `deep_ep.Buffer` per mode, sized for the largest point of that mode, and times
every point with CUDA events around the dispatch and around the combine (eager: DeepEP's normal
mode cannot be captured in a CUDA graph), a barrier before every repeat. The reported latencies
are the mean over ranks of each rank's median, written in the columns of AIConfigurator's
`deepep_ll.csv` / `deepep_normal.csv.gz` (dispatch and combine separately; the kernel model
prices their sum).

What runs, as AIConfigurator's collector runs DeepEP's own tests (`test_low_latency.py`,
`test_intranode.py`): bfloat16 tokens of `hidden_size`, top-k experts drawn uniformly at random
(seeded per rank), weights uniform.
- low latency (`deepep_ll`): `low_latency_dispatch` with FP8 (`use_fp8=True`), then
  `low_latency_combine` of bfloat16 expert outputs; `num_max_dispatch_tokens_per_rank` = the
  point's tokens per rank.
- normal (`deepep_normal`): `get_dispatch_layout`, `dispatch` (FP8 with 1x128 scales on sm90 and
  newer, else bfloat16), `combine` in bfloat16; `Buffer.set_num_sms(dispatch_sms)` and DeepEP's
  default dispatch / combine configs for the group size. The notify columns are 0 (intranode, as
  in the measured table); transmit = the timed call.

Skipped, with the reason, where it cannot run: a dry run, multi-node points (`node_num` > 1 needs
RDMA between nodes), fewer than 2 GPUs or fewer visible than the point needs, DeepEP not
importable (named, with whether torch imports), experts that do not divide over the ranks.

Not run on a GPU yet: this path is type-checked, its plan side and skip path are tested.
"""

from __future__ import annotations

import importlib
import json
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Final

from orchestrator.microbench.bench import BenchContext, one_line
from orchestrator.microbench.points import PlanPoint
from orchestrator.microbench.records import PointRecord
from orchestrator.microbench.timing import Measurement, TimingParams

LL_COLUMNS: Final[tuple[str, ...]] = (
    "backend", "backend_version", "backend_version_reported", "op_name", "kernel_source", "node_num", "num_gpus",
    "hidden_size", "num_tokens_per_rank", "topk", "num_experts", "dispatch_latency_ms", "combine_latency_ms",
    "dispatch_bandwidth_gbps", "combine_bandwidth_gbps")
"""Columns of AIConfigurator's `deepep_ll.csv` (its link-bandwidth flags are not written)."""
NORMAL_COLUMNS: Final[tuple[str, ...]] = (
    "backend", "backend_version", "backend_version_reported", "op_name", "kernel_source", "node_num", "num_gpus",
    "hidden_size", "num_tokens_per_rank", "topk", "num_experts", "dispatch_sms", "dispatch_transmit_ms",
    "dispatch_notify_ms", "combine_sms", "combine_transmit_ms", "combine_notify_ms")
"""Columns of AIConfigurator's `deepep_normal.csv.gz`."""
PART_COLUMNS: Final[dict[str, tuple[str, str]]] = {
    "deepep_ll": ("dispatch_latency_ms", "combine_latency_ms"),
    "deepep_normal": ("dispatch_transmit_ms", "combine_transmit_ms")}
"""Per kernel, the table columns of the dispatch and the combine time."""
DEFAULT_SMS: Final = 24
FP8_BLOCK: Final = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepEPShape:
    kernel: str
    """`deepep_ll` or `deepep_normal`."""
    node_num: int
    num_gpus: int
    hidden: int
    tokens_per_rank: int
    topk: int
    num_experts: int
    sms: int

    @property
    def low_latency(self) -> bool:
        return self.kernel == "deepep_ll"

    @staticmethod
    def of(point: PlanPoint) -> DeepEPShape:
        return DeepEPShape(kernel=point.row["kernel"], node_num=max(point.integer("node_num", 1), 1),
                           num_gpus=point.integer("num_gpus"), hidden=point.integer("hidden_size"),
                           tokens_per_rank=point.integer("num_tokens_per_rank"), topk=point.integer("topk"),
                           num_experts=point.integer("num_experts"),
                           sms=point.integer("dispatch_sms", DEFAULT_SMS) or DEFAULT_SMS)


def dispatch_bytes_per_selection(hidden: int, *, fp8: bool) -> float:
    """Bytes one (token, expert) selection carries in the dispatch: FP8 values, one fp32 scale per
    128 values and 16 bytes of routing metadata (DeepEP's low-latency format), else bfloat16."""
    return hidden + hidden / FP8_BLOCK * 4 + 16 if fp8 else 2.0 * hidden


def bandwidth_gbps(selections: int, bytes_per_selection: float, seconds: float) -> float:
    """DeepEP's own figure: bytes of all selections (local ones included) over the time, GB/s (1e9)."""
    return selections * bytes_per_selection / seconds / 1e9 if seconds > 0 else 0.0


def deep_ep_importable() -> bool:
    try:
        importlib.import_module("deep_ep")
    except Exception:  # absent, or built against another torch/CUDA: unusable either way
        return False
    return True


def skip_reason(s: DeepEPShape, *, visible_gpus: int, dry_run: bool, library_missing: str | None) -> str | None:
    """Why the point cannot be measured here (None: it can). `library_missing` names what is absent."""
    if dry_run:
        return "dry run: DeepEP runs one process per GPU of an NVLink node and is not simulated on a CPU"
    if s.node_num > 1:
        return (f"node_num={s.node_num}: multi-node DeepEP needs RDMA between nodes; this collector spawns the "
                "ranks of one node")
    if s.num_gpus < 2:
        return f"num_gpus={s.num_gpus}: DeepEP dispatch/combine needs at least 2 GPUs"
    if library_missing is not None:
        return library_missing
    if s.num_gpus > visible_gpus:
        return f"needs {s.num_gpus} GPUs of one NVLink node, {visible_gpus} visible"
    if s.num_experts % s.num_gpus:
        return f"num_experts={s.num_experts} does not divide over {s.num_gpus} ranks"
    return None


def deepep_cells(row: Mapping[str, str], parts_ms: Mapping[str, float], columns: Sequence[str]) -> list[str]:
    """Cells of one measured point in the table's columns. The dispatch and combine times come from
    `parts_ms` (keyed by the table's column names); bandwidths are DeepEP's own figure."""
    kernel = row["kernel"]
    d_col, c_col = PART_COLUMNS[kernel]
    if d_col not in parts_ms or c_col not in parts_ms:
        raise ValueError(f"{kernel} point without its dispatch/combine parts ({d_col}, {c_col}): {dict(parts_ms)}")
    d_ms, c_ms = parts_ms[d_col], parts_ms[c_col]
    selections = int(row["num_tokens_per_rank"]) * int(row["topk"])
    hidden = int(row["hidden_size"])
    sms = row.get("dispatch_sms", "") or str(DEFAULT_SMS)
    fp8 = row.get("variant") != "bfloat16"
    d_bw = bandwidth_gbps(selections, dispatch_bytes_per_selection(hidden, fp8=fp8), d_ms * 1e-3)
    c_bw = bandwidth_gbps(selections, 2.0 * hidden, c_ms * 1e-3)
    values = {**row, "backend_version_reported": row.get("backend_version", ""),
              "op_name": "ll" if kernel == "deepep_ll" else "normal",
              "kernel_source": row.get("kernel_source") or "deepep",
              d_col: f"{d_ms:.6g}", c_col: f"{c_ms:.6g}", "dispatch_notify_ms": "0", "combine_notify_ms": "0",
              "dispatch_sms": sms, "combine_sms": sms,
              "dispatch_bandwidth_gbps": f"{d_bw:.6g}", "combine_bandwidth_gbps": f"{c_bw:.6g}"}
    return [str(values.get(c, "")) for c in columns]


def records_of(results: Sequence[dict[str, Any]], by_key: Mapping[str, PlanPoint]) -> list[PointRecord]:
    """Point records of `deepep_results`: latency = dispatch + combine, the parts kept for the table."""
    out = []
    for r in results:
        point = by_key[r["key"]]
        if r["status"] != "measured":
            out.append(PointRecord(number=point.number, key=point.key(), status="skipped", reason=r["reason"],
                                   row=point.row, wall_s=r.get("wall_s", 0.0)))
            continue
        d_col, c_col = PART_COLUMNS[point.row["kernel"]]
        m = Measurement(median_s=r["dispatch_s"] + r["combine_s"], p10_s=r["dispatch_p10_s"] + r["combine_p10_s"],
                        p90_s=r["dispatch_p90_s"] + r["combine_p90_s"], calls_per_repeat=1, repeats=r["repeats"],
                        timing="cuda_events")
        row = {**point.row, **{k: r[k] for k in ("backend", "backend_version", "kernel_source", "variant")}}
        out.append(PointRecord(number=point.number, key=point.key(), status="measured", reason="", row=row,
                               measurement=m, copies=1, wall_s=r.get("wall_s", 0.0),
                               parts_ms={d_col: r["dispatch_s"] * 1e3, c_col: r["combine_s"] * 1e3}))
    return out


def _skipped(point: PlanPoint, reason: str) -> dict[str, Any]:
    return {"key": point.key(), "status": "skipped", "reason": reason, "wall_s": 0.0}


def deepep_results(ctx: BenchContext, plan_path: Path, points: Sequence[PlanPoint],
                   visible_gpus: int) -> list[dict[str, Any]]:
    """Results for every DeepEP point: measured (dispatch and combine seconds), or skipped with the reason."""
    missing = None
    if not ctx.dry_run and not deep_ep_importable():
        from orchestrator.microbench.table_kernels import missing_message

        torch_state = "importable" if ctx.torch is not None else "not installed"
        missing = f"{missing_message('deepep')}; torch: {torch_state}"
    out: list[dict[str, Any]] = []
    runnable: dict[int, list[PlanPoint]] = {}
    for p in points:
        s = DeepEPShape.of(p)
        reason = skip_reason(s, visible_gpus=visible_gpus, dry_run=ctx.dry_run, library_missing=missing)
        if reason is None:
            runnable.setdefault(s.num_gpus, []).append(p)
        else:
            out.append(_skipped(p, reason))
    for group, pts in sorted(runnable.items()):
        out += run_spawned(plan_path, pts, group, ctx.timing)
    return out


# -- the spawned ranks (GPU only) -------------------------------------------------------------------
def run_spawned(plan_path: Path, points: Sequence[PlanPoint], group: int, timing: TimingParams) -> list[dict[str, Any]]:
    """Spawn `group` ranks on GPUs 0..group-1 and return rank 0's records, latencies averaged over ranks."""
    from orchestrator.microbench.collectives import spawn_ranks

    return spawn_ranks(_worker, plan_path, points, group, timing)


def _worker(rank: int, world: int, port: int, payload_path: str, result_path: str) -> None:
    """Entry point of one spawned rank (module level so `spawn` can pickle it)."""
    from orchestrator.microbench.points import read_plan

    torch: Any = importlib.import_module("torch")
    dist: Any = importlib.import_module("torch.distributed")
    deep_ep: Any = importlib.import_module("deep_ep")
    payload = json.loads(Path(payload_path).read_text())
    keys = set(payload["keys"])
    points = [p for p in read_plan(Path(payload["plan"])).points if p.key() in keys]
    timing = TimingParams(**payload["timing"])
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
    dist.init_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(minutes=5))
    try:
        mine = measure_rank(torch, dist, deep_ep, points, rank, world, device, timing)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            Path(result_path).write_text(json.dumps(average_ranks(gathered)))
    finally:
        dist.destroy_process_group()


def average_ranks(per_rank: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rank 0's records with dispatch and combine medians averaged over ranks; a point skipped on any
    rank is skipped (with that rank's reason)."""
    out = []
    for records in zip(*per_rank, strict=True):
        bad = [r for r in records if r["status"] != "measured"]
        first = dict(bad[0] if bad else records[0])
        if not bad:
            for k in ("dispatch_s", "combine_s", "dispatch_p10_s", "dispatch_p90_s", "combine_p10_s",
                      "combine_p90_s"):
                first[k] = statistics.fmean(r[k] for r in records)
        out.append(first)
    return out


def _median_p10_p90(xs: Sequence[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return statistics.median(xs), q[0], q[-1]


def _routing(torch: Any, s: DeepEPShape, rank: int, device: str) -> tuple[Any, Any]:
    """Top-k expert ids (int64) drawn uniformly at random, as DeepEP's tests draw them, and their weights."""
    gen = torch.Generator(device=device)
    gen.manual_seed(1000 + rank)
    scores = torch.rand((s.tokens_per_rank, s.num_experts), generator=gen, device=device) + 1.0
    ids = torch.topk(scores, s.topk, dim=-1, largest=True, sorted=False).indices.to(torch.int64)
    weights = torch.rand((s.tokens_per_rank, s.topk), generator=gen, device=device, dtype=torch.float32)
    return ids, weights


def _buffers(deep_ep: Any, group: Any, shapes: Iterable[DeepEPShape], world: int) -> dict[bool, Any]:
    """One `deep_ep.Buffer` per mode present (key: low latency), sized for its largest point."""
    shapes = list(shapes)
    out: dict[bool, Any] = {}
    normal = [s for s in shapes if not s.low_latency]
    if normal:
        configs = (deep_ep.Buffer.get_dispatch_config(world), deep_ep.Buffer.get_combine_config(world))
        nvl = max(c.get_nvl_buffer_size_hint(s.hidden * 2, world) for c in configs for s in normal)
        out[False] = deep_ep.Buffer(group, int(nvl), 0)
    ll = [s for s in shapes if s.low_latency]
    if ll:
        rdma = max(deep_ep.Buffer.get_low_latency_rdma_size_hint(s.tokens_per_rank, s.hidden, world, s.num_experts)
                   for s in ll)
        out[True] = deep_ep.Buffer(group, 0, int(rdma), low_latency_mode=True,
                                   num_qps_per_rank=max(s.num_experts // world for s in ll))
    return out


def _pair(torch: Any, deep_ep: Any, buffer: Any, s: DeepEPShape, rank: int, world: int,
          device: str) -> tuple[Any, Any, bool]:
    """(dispatch(), combine(), FP8 dispatch) closures for one point; combine uses the last dispatch's handle."""
    ids, weights = _routing(torch, s, rank, device)
    x = torch.randn((s.tokens_per_rank, s.hidden), dtype=torch.bfloat16, device=device)
    state: dict[str, Any] = {}
    if s.low_latency:
        local = s.num_experts // world
        expert_out = torch.randn((local, s.tokens_per_rank * world, s.hidden), dtype=torch.bfloat16, device=device)

        def dispatch_ll() -> None:
            _, _, state["handle"], _, _ = buffer.low_latency_dispatch(
                x, ids, s.tokens_per_rank, s.num_experts, use_fp8=True, async_finish=False, return_recv_hook=False)

        def combine_ll() -> None:
            buffer.low_latency_combine(expert_out, ids, weights, state["handle"], async_finish=False,
                                       return_recv_hook=False)

        return dispatch_ll, combine_ll, True
    deep_ep.Buffer.set_num_sms(s.sms)
    dispatch_config = deep_ep.Buffer.get_dispatch_config(world)
    combine_config = deep_ep.Buffer.get_combine_config(world)
    major, _ = torch.cuda.get_device_capability(device)
    fp8 = major >= 9
    payload: Any = x
    if fp8:
        scales = torch.ones((s.tokens_per_rank, s.hidden // FP8_BLOCK), dtype=torch.float32, device=device)
        payload = (x.to(torch.float8_e4m3fn), scales)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(ids, s.num_experts)

    def dispatch_normal() -> None:
        recv_x, _, recv_weights, _, state["handle"], _ = buffer.dispatch(
            payload, topk_idx=ids, topk_weights=weights, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert, config=dispatch_config)
        received = recv_x[0] if isinstance(recv_x, tuple) else recv_x
        state["recv"] = torch.empty(received.shape, dtype=torch.bfloat16, device=device)
        state["weights"] = recv_weights

    def combine_normal() -> None:
        buffer.combine(state["recv"], state["handle"], topk_weights=state["weights"], config=combine_config)

    return dispatch_normal, combine_normal, fp8


def measure_rank(torch: Any, dist: Any, deep_ep: Any, points: Sequence[PlanPoint], rank: int, world: int,
                 device: str, timing: TimingParams) -> list[dict[str, Any]]:
    """Time every point on this rank; every rank enters every DeepEP call (they are collective)."""
    shapes = [DeepEPShape.of(p) for p in points]
    buffers = _buffers(deep_ep, dist.group.WORLD, shapes, world)
    out: list[dict[str, Any]] = []
    version = str(getattr(deep_ep, "__version__", "unknown"))

    def barrier() -> None:
        dist.barrier()
        torch.cuda.synchronize()

    for point, s in zip(points, shapes, strict=True):
        start = time.perf_counter()
        try:
            dispatch, combine, fp8 = _pair(torch, deep_ep, buffers[s.low_latency], s, rank, world, device)
            built = ""
        except Exception as exc:  # an API mismatch on this rank: every rank skips the point (no rank waits)
            built = f"deep_ep {version}: {one_line(exc)}"
        verdicts: list[Any] = [None] * world
        dist.all_gather_object(verdicts, built)
        refused = next((v for v in verdicts if v), "")
        if refused:
            out.append({"key": point.key(), "status": "skipped", "reason": refused,
                        "wall_s": time.perf_counter() - start})
            continue
        try:
            for _ in range(max(timing.warmup_calls, 1)):
                dispatch()
                combine()
            barrier()
            d_times, c_times = [], []
            for _ in range(timing.repeats):
                barrier()
                e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
                e0.record()
                dispatch()
                e1.record()
                combine()
                e2.record()
                e2.synchronize()
                d_times.append(e0.elapsed_time(e1) * 1e-3)
                c_times.append(e1.elapsed_time(e2) * 1e-3)
        except Exception as exc:  # a DeepEP API or launch error: the point is skipped on this rank
            out.append({"key": point.key(), "status": "skipped", "reason": f"deep_ep {version}: {one_line(exc)}",
                        "wall_s": time.perf_counter() - start})
            barrier()
            continue
        d, d10, d90 = _median_p10_p90(d_times)
        c, c10, c90 = _median_p10_p90(c_times)
        out.append({"key": point.key(), "status": "measured", "reason": "", "backend": "deep_ep",
                    "backend_version": version, "kernel_source": "deepep", "variant": "fp8" if fp8 else "bfloat16",
                    "dispatch_s": d, "combine_s": c, "dispatch_p10_s": d10, "dispatch_p90_s": d90,
                    "combine_p10_s": c10, "combine_p90_s": c90, "repeats": timing.repeats,
                    "wall_s": time.perf_counter() - start})
    return out
