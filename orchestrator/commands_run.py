"""`kernelsight run`: simulate a scenario, print the summary, optionally write records."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from orchestrator.commands_sim import overrides_from, warn_about_scenario
from orchestrator.optional import require
from orchestrator.out_dir import prepare_out_dir
from orchestrator.progress import ProgressBar
from orchestrator.render import table
from sim.api import SimResult, load_scenario, simulate
from sim.errors import ConfigError, file_error
from sim.metrics.chrome_trace import write_chrome_trace
from sim.serde import to_jsonable
from sim.specs.scenario import Scenario
from sim.uncertainty import RunIntervals

TRACE_MAX_STEP_EVENTS = 200_000
"""Step events kept for `--trace` (runs of identical decode steps are one event): about 15 MB of
memory and 60 MB of JSON at most; later steps are counted in the trace's `otherData`."""


def _cell(value: object) -> object:
    if value is None:
        return "-"  # a cost with no known GPU price (the warning above says which key sets it)
    return f"{value:.6g}" if isinstance(value, float) else value


def result_payload(result: SimResult) -> dict[str, Any]:
    bd = result.breakdown
    payload: dict[str, Any] = to_jsonable({
        "scenario_hash": result.scenario_hash,
        "sim_version": result.sim_version,
        "api_server_latency_s": result.api_server_latency_s,
        "summary": to_jsonable(result.summary),
        **({"classes": to_jsonable(result.classes)} if result.classes else {}),
        "breakdown": {
            "seconds_by_kind": dict(bd.seconds_by_kind),
            "seconds_by_name": dict(bd.seconds_by_name),
            "host_s": bd.host_s,
            "launch_floor_s": bd.launch_floor_s,
            "share_by_kind": bd.share_by_kind(),
        },
        "memory": to_jsonable(result.memory),
        **_pool_payload(result),
        **({"autoscaling": to_jsonable(result.autoscaling)} if result.autoscaling is not None else {}),
    })  # NaN and inf as the strings "nan" / "inf", as everywhere in the summary: stdout stays strict JSON
    return payload


def _pool_payload(result: SimResult) -> dict[str, Any]:
    """Disaggregated runs: per-pool metrics and kernel breakdowns, and the KV transfers."""
    if not result.pools:
        return {}
    return {
        "pools": [to_jsonable(p) for p in result.pools],
        "pool_breakdowns": {name: {"seconds_by_kind": dict(bd.seconds_by_kind), "host_s": bd.host_s,
                                   "launch_floor_s": bd.launch_floor_s, "share_by_kind": bd.share_by_kind()}
                            for name, bd in result.pool_breakdowns},
        "transfer": to_jsonable(result.transfer),
    }


def _write_out(result: SimResult, out: Path, trace: bool, payload: dict[str, Any]) -> None:
    """`payload` is what `--json` prints (the intervals' fields included): summary.json holds it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def parquet(rows: list[dict[str, Any]], name: str) -> None:
        path = out / name
        try:
            pq.write_table(pa.Table.from_pylist(rows), path)
        except OSError as exc:  # pyarrow's errors carry no file name: name it here
            raise file_error(exc, path=path, key="--out", writing=True) from None

    out.mkdir(parents=True, exist_ok=True)
    rows = [dataclasses.asdict(r) for r in result.records]
    for row, rec in zip(rows, result.records, strict=True):
        row.update(ttft_s=rec.ttft_s(), tpot_s=rec.tpot_s(), e2el_s=rec.e2el_s())
    parquet(rows, "requests.parquet")
    breakdown_rows = result.breakdown.rows()
    if result.pool_breakdowns:
        breakdown_rows = [{"pool": name, **row} for name, bd in result.pool_breakdowns for row in bd.rows()]
    parquet(breakdown_rows, "kernel_breakdown.parquet")
    if result.steps:
        steps = [dataclasses.asdict(st) for st in result.steps]
        for row in steps:
            row["pool"] = result.replica_pools[row["replica"]] if result.replica_pools else "aggregated"
        parquet(steps, "steps.parquet")
    kv_rows: list[dict[str, Any]] = [{"time_s": t, "kv_usage_frac": u} for t, u in result.kv_usage]
    if result.pools:  # disaggregated: the prefill pool's samples, then the decode pool's
        for i, row in enumerate(kv_rows):
            row["pool"] = "prefill" if i < result.kv_usage_prefill_pairs else "decode"
    parquet(kv_rows, "kv_usage.parquet")
    try:
        (out / "summary.json").write_text(json.dumps(payload, indent=2, allow_nan=False))
        if trace:
            with (out / "trace.json").open("w") as f:
                write_chrome_trace(f, result.steps, result.records,
                                   num_steps_not_logged=result.num_steps_not_logged)
    except OSError as exc:
        raise file_error(exc, key="--out", writing=True) from None
    if trace and result.num_steps_not_logged:
        sys.stderr.write(f"warning: trace.json holds the first {len(result.steps)} step events; "
                         f"{result.num_steps_not_logged} later steps are not in it\n")


def _intervals(scenario: Scenario, result: SimResult, args: Namespace) -> RunIntervals:
    """K perturbed runs (sim.uncertainty); their cost goes to stderr."""
    from sim.uncertainty import run_intervals

    with ProgressBar(args.intervals, desc="intervals", unit="run") as bar:
        iv = run_intervals(scenario, result.summary, args.intervals, seed=args.interval_seed,
                           progress=bar.update_to, kernel_only=args.kernel_only_intervals)
    if iv.k == 0:
        sys.stderr.write("warning: no interval table ships for this kernel tier: intervals are the point\n")
    arch = f", {iv.architecture.replace('-', ' ')} class" if iv.architecture else ""
    widened = (", end-to-end widening " + ", ".join(f"{g} x{math.exp(w):.2f}" for g, w in iv.e2e_log_widths.items())
               if iv.e2e_log_widths else ", kernel draws only")
    sys.stderr.write(f"intervals: {iv.k} perturbed runs ({iv.tier} residuals{arch}{widened}) took {iv.wall_s:.1f} s\n")
    return iv


def cmd_run(args: Namespace) -> int:
    # Flags are checked before the simulation, so a bad one never costs (and loses) a run.
    if args.intervals < 0:
        raise ConfigError(source="run", key="--intervals", value=args.intervals, rule="must be >= 0")
    if args.interval_seed is not None and args.interval_seed < 0:
        raise ConfigError(source="run", key="--interval-seed", value=args.interval_seed, rule="must be >= 0")
    if args.trace and not args.out:
        raise ConfigError(source="run", key="--trace", value=True, rule="needs --out DIR (the trace is written there)")
    scenario = load_scenario(args.scenario, overrides_from(args))
    warn_about_scenario(scenario)
    if args.out:
        require("pyarrow")
        prepare_out_dir(Path(args.out), holds="the Parquet records")
    with ProgressBar(scenario.workload.num_prompts, desc="run", unit="request") as bar:
        result = simulate(scenario, progress=bar.update_to,
                          max_step_events=TRACE_MAX_STEP_EVENTS if args.out and args.trace else 0)
    s = result.summary
    if s.truncated:
        sys.stderr.write(f"warning: truncated run: {s.num_completed} of {s.num_requests} requests finished "
                         "(a simulation limit was reached or requests could not be scheduled); "
                         "metrics cover the finished ones\n")
    payload = result_payload(result)
    rows = [(f.name, _cell(getattr(s, f.name))) for f in dataclasses.fields(s)]
    # TTFT and E2E are the client's: this much of each is the API server's, outside the engine.
    rows.append(("api_server_latency_s", _cell(result.api_server_latency_s)))
    for pool in result.pools:
        rows += [(f"{pool.pool}.{f.name}", _cell(getattr(pool, f.name))) for f in dataclasses.fields(pool)
                 if f.name != "pool"]
    if result.transfer is not None:
        rows += [(f"transfer.{f.name}", _cell(getattr(result.transfer, f.name)))
                 for f in dataclasses.fields(result.transfer)]
    if result.autoscaling is not None:
        rows += [(f"autoscaling.{f.name}", _cell(getattr(result.autoscaling, f.name)))
                 for f in dataclasses.fields(result.autoscaling) if f.name != "timeline"]
    if args.intervals:
        iv = _intervals(scenario, result, args)
        payload["summary"].update(to_jsonable(iv.fields()))  # a NaN bound (no TPOT) is "nan", not bare NaN
        payload["intervals"] = to_jsonable({"k": iv.k, "seed": iv.seed, "tier": iv.tier, "nominal": 0.9,
                                            "e2e_log_widths": iv.e2e_log_widths})
        rows += [(f"{m} 90% interval", f"[{_cell(iv.lo[m])}, {_cell(iv.hi[m])}]") for m in iv.lo]
    if args.json:
        sys.stdout.write(json.dumps(payload, indent=2, allow_nan=False) + "\n")
    else:
        _print_tables(result, rows)
    if args.out:
        # Written after the summary is out: a file that cannot be written loses no result.
        sys.stdout.flush()
        _write_out(result, Path(args.out), args.trace, payload)
    return 0


def _print_tables(result: SimResult, rows: list[tuple[str, object]]) -> None:
    shares = sorted(result.breakdown.share_by_kind().items(), key=lambda kv: -kv[1])
    sys.stdout.write(table(("metric", "value"), rows) + "\n"
                     + table(("time share", ""), [(k, f"{v:.1%}") for k, v in shares]))
    if result.classes:
        sys.stdout.write("\n" + table(
            ("class", "requests", "ttft p90 s", "tpot p90 s", "e2el p90 s", "goodput frac", "goodput req/s"),
            [(c.name, str(c.num_requests), _cell(c.ttft_p90_s), _cell(c.tpot_p90_s), _cell(c.e2el_p90_s),
              _cell(c.goodput_frac), _cell(c.goodput_requests_per_s)) for c in result.classes]))
    if result.autoscaling is not None:
        sys.stdout.write("\n" + table(("hour", "replicas (max provisioned)", "replica-hours"),
                                       hourly_replicas(result.autoscaling.timeline, result.autoscaling.window_s)))


def hourly_replicas(timeline: tuple[tuple[float, int, int, int], ...], end_s: float) -> list[tuple[str, str, str]]:
    """Per hour of the run: the most replicas provisioned (active + starting + draining) and the
    replica-hours paid, from the autoscaler's timeline."""
    rows = []
    hours = max(1, int(-(-end_s // 3600.0)))
    for h in range(hours):
        lo, hi = h * 3600.0, min((h + 1) * 3600.0, end_s)
        peak, paid_s = 0, 0.0
        for i, (t, active, starting, draining) in enumerate(timeline):
            t_next = timeline[i + 1][0] if i + 1 < len(timeline) else end_s
            overlap = min(t_next, hi) - max(t, lo)
            if overlap > 0 or (t <= lo < t_next):
                peak = max(peak, active + starting + draining)
            paid_s += max(overlap, 0.0) * (active + starting + draining)
        rows.append((str(h), str(peak), f"{paid_s / 3600.0:.4g}"))
    return rows
