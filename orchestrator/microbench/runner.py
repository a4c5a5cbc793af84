"""`kernelsight microbench run`: plan -> per-point benchmark -> points.csv -> tables + device.json.

Order: single-GPU families (GEMM, prefill, decode, pointwise, MoE, MLA) on `--device`, then
collectives and DeepEP dispatch/combine in spawned process groups (one process per GPU). Every
point tries its implementations best first (see each family's module); the first that builds and
survives one call is timed. A point no implementation can run is `skipped` with the reasons; one
whose implementation raised is `failed` (exit code 1 at the end, after every file is written).
`--dry-run` shrinks shapes and times whatever runs (torch on the
device, or Python no-ops without torch), so the path is exercised with meaningless times.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np

from orchestrator.microbench import attention, deepep, gemm, pointwise, table_kernels
from orchestrator.microbench.bench import BenchContext, Prepared, Unsupported, noop, one_line, random_tensor
from orchestrator.microbench.collectives import collective_results, to_measurement
from orchestrator.microbench.env import (
    check_device,
    device_info,
    free_memory_bytes,
    identify_hardware,
    import_torch,
    l2_cache_bytes,
    nvidia_smi,
    optional_libraries,
)
from orchestrator.microbench.output import DEVICE_FILE, write_json, write_tables
from orchestrator.microbench.points import FAMILIES, AttentionShape, GemmShape, Plan, PlanPoint, Shape, read_plan
from orchestrator.microbench.progress import Progress
from orchestrator.microbench.records import POINTS_FILE, PointRecord, PointsLog, read_points
from orchestrator.microbench.timing import DRY_RUN_TIMING, TimingParams, measure_cuda, measure_wall
from sim import __version__ as sim_version
from sim.calibration.batch import predict_latency_s
from sim.calibration.plan import CALLS_PER_POINT, SETUP_S_PER_POINT
from sim.calibration.rows import ROW_COLUMNS
from sim.calibration.select import load_for_tier
from sim.errors import ConfigError
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec

SCHEMA: Final = "kernelsight-microbench/1"
ROTATE_L2_MULTIPLE: Final = 3
MAX_ROTATION_BYTES: Final = 4 * 2**30


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    plan: Path
    out: Path
    device: str = "cuda:0"
    dry_run: bool = False
    resume: bool = False
    hardware: str | None = None
    only: tuple[str, ...] = ()
    """Families to measure (empty = all)."""
    attention_backend: str = "auto"
    timing: TimingParams | None = None
    """None = the default (or the dry-run parameters with --dry-run)."""


def point_weights(points: Sequence[PlanPoint], hw: HardwareSpec | None) -> tuple[list[float], float | None]:
    """Planned GPU seconds per point (the `microbench plan` estimate) and their sum; uniform without a spec."""
    if hw is None or not points:
        return [1.0] * len(points), None
    cols = {c: np.array([p.row[c] for p in points], dtype=object) for c in ROW_COLUMNS}
    art = load_for_tier(hw, "cross-generation", None)
    try:
        latency_s, _ = predict_latency_s(cols, hw, None if art is None else FittedEfficiency(art.families))
    except ValueError:
        return [1.0] * len(points), None
    weights = [CALLS_PER_POINT * float(t) + SETUP_S_PER_POINT for t in latency_s]
    return weights, sum(weights)


def _candidates(point: PlanPoint, shape: Shape, ctx: BenchContext) -> list[tuple[str, Callable[..., Prepared]]]:
    if isinstance(shape, GemmShape):
        return list(gemm.candidates(shape))
    if isinstance(shape, AttentionShape):
        return list(attention.candidates(shape, ctx.attention_backend))
    if isinstance(shape, table_kernels.TableShape):
        return list(table_kernels.candidates(shape))
    return list(pointwise.candidates(shape))  # type: ignore[arg-type]


def _standin(ctx: BenchContext) -> Prepared:
    """Dry-run stand-in where no implementation runs here: a tiny matmul (or a no-op without torch)."""
    torch = ctx.torch
    if torch is None:
        return noop("standin")
    x = random_tensor(torch, (16, 16), torch.float32, ctx.device)
    return Prepared(run=lambda i: torch.matmul(x, x), copies=1, backend="torch", backend_version=ctx.torch_version(),
                    kernel_source="dry_run_standin")


def _prepare(point: PlanPoint, ctx: BenchContext) -> tuple[Prepared | None, str, bool]:
    """(implementation, reasons the better ones were passed over, whether any raised unexpectedly)."""
    table = point.family in ("moe", "mla", "mla_bmm", "deepep")
    if ctx.torch is None and not table:
        return noop(point.family), "", False
    shape = point.shape(shrink=ctx.dry_run)
    reasons: list[str] = []
    crashed = False
    for name, build in _candidates(point, shape, ctx):
        try:
            prepared = build(shape, ctx)
            prepared.run(0)
            ctx.sync()
            return prepared, "; ".join(reasons), crashed
        except Unsupported as exc:
            reasons.append(f"{name}: {exc}")
        except Exception as exc:  # not a known refusal: a bug or a broken library; try the next, report it
            crashed = True
            reasons.append(f"{name}: {one_line(exc)}")
            _recover(ctx)
    if not reasons:
        r = point.row
        known = ", ".join(pointwise.supported()) if point.family == "pointwise" else "none"
        reasons.append(f"no benchmark for kernel={r['kernel']} variant={r['variant']!r} dtype={r['dtype']!r} "
                       f"(benchmarked: {known})")
    if ctx.dry_run and not table:  # table families have no output table to fill with a stand-in
        return _standin(ctx), "; ".join(reasons), False
    return None, "; ".join(reasons), crashed


def _recover(ctx: BenchContext) -> None:
    if ctx.torch is not None and ctx.is_cuda():
        with contextlib.suppress(Exception):  # an error that outlives the failed call shows at the next point
            ctx.torch.cuda.synchronize()
        ctx.torch.cuda.empty_cache()


def measure_point(point: PlanPoint, ctx: BenchContext) -> PointRecord:
    start = time.perf_counter()
    prepared, reasons, crashed = _prepare(point, ctx)
    base = PointRecord(number=point.number, key=point.key(), status="skipped", reason=reasons, row=point.row)
    if prepared is None:
        return replace(base, status="failed" if crashed else "skipped", wall_s=time.perf_counter() - start)
    try:
        if ctx.torch is not None and ctx.is_cuda():
            m = measure_cuda(ctx.torch, prepared.run, copies=prepared.copies, params=ctx.timing)
        else:
            m = measure_wall(prepared.run, copies=prepared.copies, params=ctx.timing)
    except Exception as exc:
        _recover(ctx)
        return replace(base, status="failed", reason=f"{prepared.kernel_source}: {one_line(exc)}",
                       wall_s=time.perf_counter() - start)
    if ctx.dry_run:
        m = replace(m, median_s=max(m.median_s, 1e-9), p10_s=max(m.p10_s, 1e-9), p90_s=max(m.p90_s, 1e-9))
    note = "; ".join(x for x in (reasons, m.note) if x)
    row = {**point.row, "backend": prepared.backend, "backend_version": prepared.backend_version,
           "kernel_source": prepared.kernel_source, "variant": prepared.variant or point.row["variant"]}
    if ctx.torch is not None and ctx.is_cuda():
        ctx.torch.cuda.empty_cache()
    return replace(base, status="measured", reason="", row=row, measurement=replace(m, note=note),
                   copies=prepared.copies, wall_s=time.perf_counter() - start)


def _collective_records(results: list[dict[str, Any]], by_key: dict[str, PlanPoint]) -> list[PointRecord]:
    out = []
    for r in results:
        point = by_key[r["key"]]
        if r["status"] != "measured":
            out.append(PointRecord(number=point.number, key=point.key(), status=r["status"], reason=r["reason"],
                                   row=point.row, wall_s=r.get("wall_s", 0.0)))
            continue
        row = {**point.row, **{k: r[k] for k in ("backend", "backend_version", "kernel_source", "variant")}}
        out.append(PointRecord(number=point.number, key=point.key(), status="measured", reason="", row=row,
                               measurement=to_measurement(r), copies=1, wall_s=r.get("wall_s", 0.0)))
    return out


def _device_healthy(ctx: BenchContext) -> bool:
    """False once the CUDA context is poisoned (a sticky error such as an illegal address)."""
    if ctx.torch is None or not ctx.is_cuda():
        return True
    try:
        ctx.torch.cuda.synchronize()
        return float(ctx.torch.ones(1, device=ctx.device).sum().item()) == 1.0
    except Exception:
        return False


def _measure_all(todo: Sequence[PlanPoint], ctx: BenchContext, plan_path: Path, log: PointsLog, progress: Progress,
                 weight_of: dict[str, float]) -> tuple[list[PointRecord], dict[str, float], str]:
    """Measure `todo` (single-device families first, then collectives); returns the records, wall time per
    family, and why the run stopped early ("" if it did not)."""
    records: list[PointRecord] = []
    family_wall: dict[str, float] = {}

    def keep(rec: PointRecord, point: PlanPoint) -> None:
        log.write(rec)
        records.append(rec)
        family_wall[point.family] = family_wall.get(point.family, 0.0) + rec.wall_s
        progress.advance(weight_of[point.key()], point.label())

    for point in (p for p in todo if p.family not in ("nccl", "custom_allreduce", "deepep")):
        rec = measure_point(point, ctx)
        keep(rec, point)
        if rec.status == "failed" and not _device_healthy(ctx):
            return records, family_wall, (f"the CUDA context is unusable after plan row {point.number} "
                                          f"({rec.reason}); measured points are kept: rerun with --resume")
    visible = int(ctx.torch.cuda.device_count()) if ctx.torch is not None and ctx.is_cuda() else 0
    comm = [p for p in todo if p.family in ("nccl", "custom_allreduce")]
    if comm:
        by_key = {p.key(): p for p in comm}
        for rec in _collective_records(collective_results(ctx, plan_path, comm, visible), by_key):
            keep(rec, by_key[rec.key])
    expert = [p for p in todo if p.family == "deepep"]
    if expert:
        by_key = {p.key(): p for p in expert}
        for rec in deepep.records_of(deepep.deepep_results(ctx, plan_path, expert, visible), by_key):
            keep(rec, by_key[rec.key])
    return records, family_wall, ""


def _context(opts: RunOptions, torch: Any, device: str, hw: HardwareSpec | None) -> BenchContext:
    cc = None
    if torch is not None and device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        cc = (int(props.major), int(props.minor))
        torch.cuda.set_device(device)
    timing = opts.timing or (DRY_RUN_TIMING if opts.dry_run else TimingParams())
    l2 = l2_cache_bytes(torch, device, hw) if torch is not None else 1 << 20
    cap = MAX_ROTATION_BYTES if torch is None else min(MAX_ROTATION_BYTES, free_memory_bytes(torch, device) // 4)
    if opts.dry_run:
        l2, cap = min(l2, 1 << 12), min(cap, 1 << 24)  # a few rotation copies at most: exercised, cheap
    return BenchContext(torch=torch, device=device, dry_run=opts.dry_run, timing=timing,
                        rotate_bytes=ROTATE_L2_MULTIPLE * l2, max_rotation_bytes=cap, compute_capability=cc,
                        libraries=optional_libraries() if torch is not None else {},
                        attention_backend=opts.attention_backend)


def _earlier_run(opts: RunOptions, plan: Plan, info: Mapping[str, Any]) -> dict[str, Any] | None:
    """With --resume, the directory's `device.json`, checked against this run: the same plan, the same
    mode (dry run or not) and the same GPU, or the tables would mix points of different runs (a
    resume with another plan dropped the first plan's points; a dry run's meaningless times joined a
    real GPU's tables). None when there is none."""
    path = opts.out / DEVICE_FILE
    if not (opts.resume and path.is_file()):
        return None
    try:
        earlier = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(source=str(path), key="device.json", value=str(path),
                          rule=f"cannot be read to resume ({exc}); measure into a new directory") from None
    was = (earlier.get("plan") or {}).get("sha256")
    if was != plan.sha256:
        raise ConfigError(source=str(path), key="--plan", value=str(opts.plan),
                          rule=f"the directory was measured with another plan (sha256 {str(was)[:12]}..., "
                          f"{(earlier.get('plan') or {}).get('path')}; this one {plan.sha256[:12]}...): resume with "
                          "that plan, or measure into a new directory")
    if bool(earlier.get("dry_run")) != opts.dry_run:
        raise ConfigError(source=str(path), key="--dry-run", value=opts.dry_run,
                          rule="the directory holds a " + ("dry run's" if earlier.get("dry_run") else "GPU run's")
                          + " points: resume it the same way, or measure into a new directory")
    before, now = (earlier.get("gpu") or {}).get("uuid"), (info.get("gpu") or {}).get("uuid")
    if before and now and before != now:
        raise ConfigError(source=str(path), key="--device", value=opts.device,
                          rule=f"the directory was measured on GPU {before} "
                          f"({(earlier.get('gpu') or {}).get('name')}); this is {now}: resume on that GPU, or measure "
                          "into a new directory")
    return dict(earlier)


def _prepare_out(opts: RunOptions, plan: Plan) -> list[PointRecord]:
    """Create the output directory; with --resume, the measured points it already holds."""
    points_path = opts.out / POINTS_FILE
    if points_path.is_file() and not opts.resume:
        raise ConfigError(source="microbench run", key="--out", value=str(opts.out),
                          rule=f"already holds {POINTS_FILE}; pass --resume to continue it or choose a new directory")
    opts.out.mkdir(parents=True, exist_ok=True)
    if not (opts.resume and points_path.is_file()):
        return []
    keys = {p.key() for p in plan.points}
    kept = [r for r in read_points(points_path) if r.status == "measured" and r.key in keys]
    log = PointsLog(points_path, append=False)  # drop skipped/failed rows: those points are retried
    for r in kept:
        log.write(r)
    log.close()
    return kept


def run_microbench(opts: RunOptions, stream: TextIO) -> int:
    torch = import_torch()
    device = check_device(opts.device, dry_run=opts.dry_run, torch=torch)
    plan = read_plan(opts.plan)
    unknown = set(opts.only) - set(FAMILIES)
    if unknown:
        raise ConfigError(source="microbench run", key="--only", value=sorted(unknown),
                          rule=f"families are {', '.join(FAMILIES)}")
    hw = load_hardware(opts.hardware) if opts.hardware else (
        identify_hardware(torch, device) if torch is not None and device.startswith("cuda") else None)
    info = device_info(torch, device)
    earlier = _earlier_run(opts, plan, info)
    previous = _prepare_out(opts, plan)
    done = {r.key for r in previous}
    todo = [p for p in plan.points if p.key() not in done and (not opts.only or p.family in opts.only)]
    ctx = _context(opts, torch, device, hw)
    # A resumed directory keeps the record of every run that measured into it, oldest first.
    history = [] if earlier is None else [*earlier.pop("earlier_runs", []), earlier]
    header = {"schema": SCHEMA, "kernelsight_version": sim_version, "dry_run": opts.dry_run,
              "date_utc": datetime.now(UTC).isoformat(timespec="seconds"), **info,
              "hardware": hw.name if hw else None, "attention_libraries": sorted(ctx.libraries),
              "plan": {"path": str(opts.plan), "sha256": plan.sha256, "num_points": len(plan.points),
                       "duplicates_dropped": plan.num_duplicates},
              "timing": {**asdict(ctx.timing), "statistic": "median over repeats of per-call time",
                         "rotate_bytes": ctx.rotate_bytes, "max_rotation_bytes": ctx.max_rotation_bytes},
              **({"earlier_runs": history} if history else {})}
    write_json(opts.out / DEVICE_FILE, {**header, "status": "running"})
    weights, budget_s = point_weights(todo, hw)
    weight_of = {p.key(): w for p, w in zip(todo, weights, strict=True)}
    progress = Progress(sum(weights), len(todo), budget_s, stream)
    log = PointsLog(opts.out / POINTS_FILE, append=opts.resume)
    start = time.perf_counter()
    try:
        records, family_wall, aborted = _measure_all(todo, ctx, opts.plan, log, progress, weight_of)
    finally:
        log.close()
        progress.close()
    wall_s = time.perf_counter() - start
    everything = previous + records
    tables = write_tables(opts.out, everything, hw)
    status = Counter(r.status for r in records)
    summary = {
        "status": "aborted" if aborted else "complete", "aborted": aborted or None, "wall_s": round(wall_s, 3),
        "plan_budget_gpu_s": budget_s,
        "points_this_run": len(records), "points_resumed": len(previous), "by_status": dict(status),
        "wall_s_by_family": {k: round(v, 3) for k, v in family_wall.items()}, "table_rows": tables,
        "kernel_sources": dict(Counter(r.row["kernel_source"] or r.row["backend"] for r in everything
                                       if r.status == "measured")),
        "timing_modes": dict(Counter(r.measurement.timing for r in everything if r.measurement is not None)),
        "nvidia_smi_after": nvidia_smi((info.get("gpu") or {}).get("uuid")) if ctx.is_cuda() else None,
    }
    write_json(opts.out / DEVICE_FILE, {**header, "run": summary, "status": summary["status"]})
    budget = f" (plan budget {budget_s / 60:.1f} GPU-min)" if budget_s else ""
    stream.write(f"microbench: {status['measured']} measured, {status['skipped']} skipped, {status['failed']} failed "
                 f"in {wall_s / 60:.1f} min wall{budget}{' [dry run: times are meaningless]' if opts.dry_run else ''};"
                 f" tables {', '.join(f'{k} ({v})' for k, v in sorted(tables.items()))} in {opts.out}\n")
    if status["skipped"] or status["failed"]:
        reasons = Counter(f"{r.status}: {r.reason}" for r in records if r.status != "measured")
        for reason, count in reasons.most_common(5):
            stream.write(f"microbench: {count} x {reason}\n")
        stream.write(f"microbench: every point's status and reason is in {opts.out / POINTS_FILE}\n")
    if aborted:
        stream.write(f"microbench: aborted: {aborted}\n")
    return 1 if status["failed"] or aborted else 0
