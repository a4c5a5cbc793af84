"""`kernelsight validate`: simulate measured end-to-end rows, score them, regenerate the e2e accuracy report.

Rows come from `e2e/` of the vendored measured data (sim/data/measured, a copy of
shared/data/e2e) or of `--data DIR` (sim.validation); each selected row is simulated under each
requested kernel-model tier in a pool of worker processes. `--fit-profiles` instead fits the
host overheads of each engine profile on dev rows and rewrites `sim/data/host/<backend>.toml`;
`--fit-api-latency` fits each profile's API-server latency on the run's dev rows and rewrites those
two keys of the same files.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import sys
import tempfile
import time
from argparse import Namespace
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.optional import require
from orchestrator.out_dir import prepare_out_dir, prepare_out_file
from orchestrator.progress import ProgressBar
from orchestrator.validate_pool import Task, run_pool
from sim.calibration.e2e_widening import E2EWidening, fit_widening, shipped_widening
from sim.errors import ConfigError, file_error
from sim.measured import measured_data_root
from sim.perf.profile import EngineProfile
from sim.serde import json_text, to_jsonable
from sim.validation.budget import CostModel, expected_wall_s, measure_cost_model, select_rows, work_of
from sim.validation.rows import FAMILIES, SOURCES, Source, ValidationRow
from sim.validation.runner import TIERS, RowResult, Tier, tier_skip_reason
from sim.validation.score import interval_samples

BACKENDS = ("vllm", "sglang", "trtllm")


def _e2e_dir(arg: str | None) -> Path:
    """`e2e/` of `--data`, else of the measured data shipped in the package."""
    root = Path(arg) if arg else measured_data_root()
    if (root / "e2e").is_dir():
        return root / "e2e"
    raise ConfigError(source="validate", key="--data", value=arg, rule="must be a measured-data root holding e2e/")


def _profiles() -> dict[str, EngineProfile]:
    from sim.api import load_engine_profile

    return {b: load_engine_profile(b) for b in BACKENDS}


def _tiers_for(row: ValidationRow, tiers: Sequence[Tier]) -> list[Tier]:
    return [t for t in tiers if tier_skip_reason(row, t) is None]


def cmd_validate(args: Namespace) -> int:
    from sim.validation.load import data_sha256, load_rows

    start = time.perf_counter()
    _check_flags(args)
    e2e = _e2e_dir(args.data)
    profiles = _profiles()
    sources: tuple[Source, ...] | None = tuple(args.source) if args.source else None
    rows = load_rows(e2e, profiles, sources=sources)
    if args.suite != "all":
        rows = [r for r in rows if r.suite == args.suite]
    if args.family:
        rows = [r for r in rows if r.family in args.family]
    if args.limit is not None:
        rows = _limit(rows, args.limit)
    if args.fit_profiles:
        return _fit_profiles(args, rows, profiles, data_sha256(e2e))
    # The outputs are checked before the simulation (the cost model's probe runs included), not
    # found unwritable after it: a full run is about 9 minutes.
    if args.out is not None:
        _prepare_out(Path(args.out))
    if args.e2e_widening_out is not None:
        _check_widening_out(Path(args.e2e_widening_out))
    if _writes_doc(args):
        require("matplotlib")  # the document's plots: checked before, not after, the simulation
    tiers: list[Tier] = [args.tier] if args.tier else list(TIERS)
    tiers_per_row = {r.row_id: len(_tiers_for(r, tiers)) for r in rows}
    # With --intervals K an aggregated row costs its run and K perturbed runs: the budget buys fewer rows.
    cost = measure_cost_model().with_interval_runs(args.intervals)
    if args.rows_from:
        chosen, deferred = _rows_from(Path(args.rows_from), rows, tiers_per_row)
    else:
        chosen, deferred = select_rows(rows, tiers_per_row=tiers_per_row, cost=cost, budget_s=args.budget_s,
                                       jobs=args.jobs, max_row_s=args.max_row_s)
    out_dir = Path(args.out) if args.out is not None else Path(tempfile.mkdtemp(prefix="kernelsight-validate-"))
    work = out_dir / "traces"
    tasks = [(r, t, work, None, args.intervals) for r in chosen for t in _tiers_for(r, tiers)]
    sys.stderr.write(f"{len(rows)} rows ({sum(r.skipped for r in rows)} skipped, {len(deferred)} deferred); "
                     f"simulating {len(chosen)} rows ({len(tasks)} row x tier pairs), expected "
                     f"{expected_wall_s(chosen, tiers_per_row, cost, args.jobs):.0f} s on {args.jobs} workers\n")
    with ProgressBar(len(tasks), desc="validate", unit="simulation") as bar:
        results = run_pool(tasks, args.jobs, cost, bar.update_to)
    results += [RowResult(row_id=r.row_id, tier=t, status="skipped", reason=tier_skip_reason(r, t))
                for r in rows if not r.skipped for t in tiers if tier_skip_reason(r, t) is not None]
    wall = time.perf_counter() - start
    if args.fit_api_latency:
        _fit_api_latencies(rows, results, profiles)
    return _report(args, rows, results, deferred, tiers, cost, wall, data_sha256(e2e), out_dir)


def _check_flags(args: Namespace) -> None:
    """Refuse bad numbers and flag combinations before anything is loaded or simulated."""
    def bad(key: str, value: object, rule: str) -> ConfigError:
        return ConfigError(source="validate", key=key, value=value, rule=rule)

    if args.intervals < 0:
        raise bad("--intervals", args.intervals, "must be >= 0")
    # 0 must not read as "no limit": a limit of 0 would then count as a full run and rewrite the doc.
    if args.limit is not None and args.limit < 1:
        raise bad("--limit", args.limit, "must be >= 1 (leave it out for every row)")
    if args.jobs < 1:
        raise bad("--jobs", args.jobs, "must be >= 1 worker process")
    # nan compares false with everything: it would defer every row and exit 0.
    if not math.isfinite(args.budget_s) or args.budget_s < 0:
        raise bad("--budget-s", args.budget_s, "must be a finite number of seconds >= 0 (0: every row)")
    if not args.max_row_s >= 0:
        raise bad("--max-row-s", args.max_row_s, "must be a number of seconds >= 0 (0: no cap)")
    if not (math.isfinite(args.fit_budget_s) and args.fit_budget_s >= 0):
        raise bad("--fit-budget-s", args.fit_budget_s, "must be a finite number of seconds >= 0")
    if args.e2e_widening_out is not None:
        if not args.intervals:  # the widening is fitted on the intervals: without them nothing is written
            raise bad("--e2e-widening-out", args.e2e_widening_out, "needs --intervals K with K >= 1")
        if not args.e2e_widening_out:
            raise bad("--e2e-widening-out", args.e2e_widening_out, "must be a file path")
    if args.out is not None and not args.out:
        raise bad("--out", args.out, "must be a directory path")


def _prepare_out(out: Path) -> None:
    """`--out` created and writable before the run (`prepare_out_dir`), with room for validate.json."""
    prepare_out_dir(out, holds="validate.json and the traces")
    if (out / "validate.json").is_dir():
        raise ConfigError(source=str(out), key="--out", value=str(out),
                          rule="holds a directory named validate.json; it cannot be written")


def _check_widening_out(path: Path) -> None:
    """`--e2e-widening-out` can be written (its directory is created now, as `save` would later)."""
    prepare_out_file(path, key="--e2e-widening-out")


def _fit_api_latencies(rows: list[ValidationRow], results: list[RowResult], profiles: dict[str, EngineProfile]
                       ) -> None:
    """Each backend's `api_server_latency_s` from this run's dev rows (each in the tier `--fit-profiles`
    simulates it in), written into its shipped profile TOML."""
    from sim.validation.fit import fit_api_latency, set_api_latency

    by_key = {(r.row_id, r.tier): r for r in results}
    for backend in BACKENDS:
        mine = [r for r in rows if r.suite == "dev" and not r.skipped and r.backend == backend]
        chosen = [res for r in mine
                  if (res := by_key.get((r.row_id, _fit_tier(r))) or by_key.get((r.row_id, "cross-generation")))]
        try:
            latency, how = fit_api_latency(mine, chosen,
                                           simulated_with_s=profiles[backend].host.api_server_latency_s)
        except ValueError as exc:
            sys.stderr.write(f"{backend}: API-server latency kept ({exc})\n")
            continue
        path = Path(__file__).resolve().parent.parent / "sim" / "data" / "host" / f"{backend}.toml"
        how = "kernelsight validate --fit-api-latency, each dev row in the tier --fit-profiles uses; " + how
        path.write_text(set_api_latency(path.read_text(), latency, how))
        sys.stderr.write(f"{backend}: API-server latency {latency * 1e3:.0f} ms; wrote {path}\n")


def _rows_from(path: Path, rows: list[ValidationRow], tiers_per_row: dict[str, int]
               ) -> tuple[list[ValidationRow], dict[str, str]]:
    """The rows an earlier run simulated (its validate.json), budget aside: a before/after comparison
    on the same rows; every other simulatable row is deferred with the reason."""
    try:
        earlier = json.loads(path.read_text())
        simulated = {r["row_id"] for r in earlier["results"] if r["status"] in ("scored", "failed")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(source=str(path), key="--rows-from", value=str(path),
                          rule=f"must be a validate.json written by `kernelsight validate --out` ({exc})") from None
    live = [r for r in rows if not r.skipped and tiers_per_row.get(r.row_id, 0) > 0]
    chosen = [r for r in live if r.row_id in simulated]
    why = f"not simulated by the run in {path} (--rows-from)"
    deferred = {r.row_id: why for r in live if r.row_id not in simulated}
    return chosen, deferred


def _widening(args: Namespace, rows: list[ValidationRow], results: list[RowResult], sha: str
              ) -> E2EWidening | None:
    """With --e2e-widening-out: fitted on this run's dev rows (kernel-only bounds; `_report` writes it
    after validate.json); else the shipped widening (None where none ships)."""
    if args.e2e_widening_out is None:
        return shipped_widening()
    dev = [(tier, metric, lo, hi, meas) for suite, tier, metric, _, meas, lo, hi in interval_samples(rows, results)
           if suite == "dev"]
    widening = fit_widening(dev, source=f"kernelsight validate --intervals {args.intervals} --e2e-widening-out: "
                                        f"dev suite, {len(dev)} row x metric intervals",
                            data_sha256={"e2e": sha})
    return widening


def _limit(rows: list[ValidationRow], n: int) -> list[ValidationRow]:
    """At most `n` simulatable rows per (suite, source), cheapest first (smoke runs)."""
    keep: list[ValidationRow] = []
    counts: dict[tuple[str, str], int] = {}
    for r in sorted(rows, key=lambda r: (r.skipped, work_of(r)[1], r.row_id)):
        key = (r.suite, r.source)
        if r.skipped or counts.get(key, 0) < n:
            keep.append(r)
            counts[key] = counts.get(key, 0) + (0 if r.skipped else 1)
    return keep


def _report(args: Namespace, rows: list[ValidationRow], results: list[RowResult], deferred: dict[str, str],
            tiers: list[Tier], cost: CostModel, wall: float, sha: str, out_dir: Path) -> int:
    from sim.validation.report import HEADING, carry_analysis, render_section
    from sim.validation.score import interval_coverage, score_groups

    groups = score_groups(rows, results, tiers=tiers, deferred=deferred)
    widening = _widening(args, rows, results, sha) if args.intervals else None
    coverage = interval_coverage(rows, results, widening) if args.intervals else []
    result: dict[str, Any] = {
        "suite": args.suite, "tiers": tiers, "wall_s": wall, "jobs": args.jobs, "data_sha256": sha,
        "machine": f"{platform.machine()} {os.cpu_count()}-core box", "budget_s": args.budget_s,
        "max_row_s": args.max_row_s,
        "cost_model": {"per_step_s": cost.per_step_s, "per_request_step_s": cost.per_request_step_s,
                       "per_plain_request_step_s": cost.per_plain_request_step_s,
                       "request_by_request": sorted(cost.request_by_request),
                       "interval_runs": cost.interval_runs},
    }
    if args.intervals:
        result.update(intervals=args.intervals, interval_coverage=coverage,
                      e2e_widening=widening.to_json() if widening else None)
    # The results are written first: the plots and the document need optional packages
    # (matplotlib), and a failure there must not lose the simulation.
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**result, "groups": to_jsonable(groups),
               "rows": [{**to_jsonable(dataclasses.replace(r, replay=None)), "deferred": deferred.get(r.row_id)}
                        for r in rows],
               "results": to_jsonable(results)}
    try:
        (out_dir / "validate.json").write_text(json_text(payload, indent=1))
    except OSError as exc:
        raise file_error(exc, key="--out", writing=True) from None
    sys.stderr.write(f"results in {out_dir / 'validate.json'} ({wall:.0f} s)\n")
    if args.e2e_widening_out is not None and widening is not None:  # after validate.json, which holds it too
        try:
            widening.save(Path(args.e2e_widening_out))
        except OSError as exc:
            raise file_error(exc, path=args.e2e_widening_out, key="--e2e-widening-out", writing=True) from None
        fitted_on = sum(n for groups_of_tier in widening.rows.values() for n in groups_of_tier.values())
        sys.stderr.write(f"wrote the end-to-end widening fitted on {fitted_on} dev row x metric intervals "
                         f"to {args.e2e_widening_out}\n")
    if args.json:
        sys.stdout.write(json_text({**result, "groups": groups}, indent=1) + "\n")
    else:
        from sim.validation.report import groups_table, headline_table, interval_coverage_table

        sys.stdout.write("\n".join([*headline_table(groups), "", *groups_table(groups), "",
                                    *interval_coverage_table(coverage)]) + "\n")
    if _writes_doc(args):
        from sim.calibration.report import replace_section

        doc = Path(args.doc or "docs/accuracy.md")
        plots = _plots(rows, results, tiers, doc.parent / "img")
        old = doc.read_text() if doc.is_file() else "# Accuracy\n"
        section = render_section(result, rows, results, groups, deferred,
                                 [str(Path("img") / Path(p).name) for p in plots])
        analysis = carry_analysis(old)
        if analysis:
            section = section.rstrip("\n") + "\n\n" + analysis
        doc.write_text(replace_section(old, HEADING, section))
        sys.stderr.write(f"wrote the End-to-end section of {doc}\n")
    return 0


def _writes_doc(args: Namespace) -> bool:
    """Whether this run rewrites the document's End-to-end section (a full run, or `--doc`)."""
    # `is None`, not falsiness: any --limit is a smoke run, never the full run the document reports.
    full_run = (args.suite == "all" and not args.tier and not args.source and args.limit is None
                and not args.family)
    return not args.no_doc and (full_run or args.doc is not None)


def _plots(rows: list[ValidationRow], results: list[RowResult], tiers: list[Tier], img: Path) -> list[str]:
    from orchestrator.plots import ScatterPoint, scatter_png

    by_id = {r.row_id: r for r in rows}
    written = []
    for suite in ("eval", "dev"):
        for tier in tiers:
            points = [ScatterPoint(source=by_id[r.row_id].source, hardware=by_id[r.row_id].hardware, metric=k,
                                   predicted=v, measured=by_id[r.row_id].measured[k]) for r in results
                      if r.status == "scored" and r.tier == tier and by_id[r.row_id].suite == suite
                      for k, v in r.predicted.items() if k in by_id[r.row_id].measured
                      and k in ("ttft_mean_s", "tpot_mean_s", "output_throughput_tokens_per_s")]
            path = img / f"e2e_{suite}_{tier}.png"
            if scatter_png(path, points, f"{suite} suite, {tier} tier"):
                written.append(str(path))
    return written


def _fit_profiles(args: Namespace, rows: list[ValidationRow], profiles: dict[str, EngineProfile], sha: str) -> int:
    from sim.validation.fit import fit_api_latency, fit_host, profile_toml, served_rows
    from sim.validation.rows import require_dev

    # --suite all fits on its dev rows; --suite eval asks for evaluation rows and is refused.
    wanted = [r for r in rows if not r.skipped and (args.suite != "all" or r.suite == "dev")]
    dev = require_dev(wanted, purpose="fitting engine profiles")
    cost = measure_cost_model()
    work = Path(tempfile.mkdtemp(prefix="kernelsight-fit-"))
    backends = [args.backend] if args.backend else list(BACKENDS)
    for backend in backends:
        mine = [r for r in dev if r.backend == backend]
        chosen, _ = select_rows(mine, tiers_per_row={r.row_id: 1 for r in mine}, cost=cost,
                                budget_s=args.fit_budget_s, jobs=1, max_row_s=args.max_row_s)
        if not chosen:
            sys.stderr.write(f"{backend}: no dev rows within the fit budget; profile unchanged\n")
            continue

        def evaluate(profile: EngineProfile, rs: Sequence[ValidationRow]) -> list[RowResult]:
            tasks: list[Task] = [(r, _fit_tier(r), work, profile, 0) for r in rs]
            return run_pool(tasks, args.jobs, cost)

        sys.stderr.write(f"{backend}: fitting on {len(chosen)} dev rows\n")
        fitted = fit_host(profiles[backend], chosen, evaluate, data_sha256=sha)
        profile = fitted.profile
        served = served_rows(chosen)
        if served:  # then the API-server latency, on the fitted host numbers (one more pass)
            host = profile.host
            try:
                latency, how = fit_api_latency(served, evaluate(profile, served),
                                               simulated_with_s=host.api_server_latency_s)
            except ValueError as exc:  # no served row was scored: keep the profile's latency
                sys.stderr.write(f"{backend}: API-server latency kept ({exc})\n")
            else:
                profile = dataclasses.replace(profile, host=dataclasses.replace(
                    host, api_server_latency_s=latency, api_server_latency_fit=how))
                sys.stderr.write(f"{backend}: API-server latency {latency * 1e3:.0f} ms\n")
        path = Path(__file__).resolve().parent.parent / "sim" / "data" / "host" / f"{backend}.toml"
        header = (f"Engine profile `{backend}` (sim/perf/profile.py). Host overheads fitted by\n"
                  "`kernelsight validate --fit-profiles` on dev rows only; [policy] and [defaults] are the engine's\n"
                  "documented behaviour and defaults (docs/validation.md), not fitted; [kernel_sources] was chosen on\n"
                  "dev rows (docs/validation.md, Kernel sources).")
        path.write_text(profile_toml(profile, header=header))
        sys.stderr.write(f"{backend}: loss {fitted.loss_before:.3f} -> {fitted.loss_after:.3f} "
                         f"with {fitted.params} ({fitted.num_evaluations} evaluations); wrote {path}\n")
    return 0


def _fit_tier(row: ValidationRow) -> Tier:
    return "target-measured" if tier_skip_reason(row, "target-measured") is None else "cross-generation"


def register(sub: Any) -> None:
    v = sub.add_parser("validate", help="simulate measured end-to-end rows and score TTFT, TPOT and throughput")
    v.add_argument("--suite", choices=("dev", "eval", "all"), default="all")
    v.add_argument("--tier", choices=TIERS, help="one kernel-model tier (default: both)")
    v.add_argument("--source", action="append", choices=SOURCES, help="only these sources (repeatable)")
    v.add_argument("--family", action="append", choices=FAMILIES,
                   help="only rows of these model families: dense, moe, mla (multi-head latent attention), unknown "
                        "(no model config); repeatable; no doc update")
    v.add_argument("--json", action="store_true", help="scores as JSON on stdout")
    v.add_argument("--data", help="measured-data root holding e2e/, upstream layout such as ../shared/data "
                   "(default: the copy shipped in sim/data/measured)")
    v.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    v.add_argument("--budget-s", type=float, default=0.0,
                   help="a quick run: estimated simulation seconds per worker, rows beyond it deferred "
                        "(default 0: every row, about 9 minutes on 2 cores)")
    v.add_argument("--max-row-s", type=float, default=60.0,
                   help="with --budget-s: defer rows estimated over this (0: no cap)")
    v.add_argument("--limit", type=int, help="at most N rows per suite and source (smoke runs; no doc update)")
    v.add_argument("--intervals", type=int, default=0, metavar="K",
                   help="also K perturbed runs per row (run --intervals K; each pool's model in a disaggregated "
                        "row) and the coverage of their nominal 90%% intervals of TTFT, TPOT and throughput "
                        "(default 0: off)")
    v.add_argument("--rows-from", metavar="VALIDATE.json",
                   help="simulate exactly the rows an earlier run simulated (its validate.json; no budget): "
                        "before/after comparisons on the same rows")
    v.add_argument("--e2e-widening-out", metavar="WIDENING.json",
                   help="with --intervals: fit the end-to-end widening on this run's dev rows and write it (shipped as "
                        "sim/data/calibration/e2e_widening.json); the coverage table then uses it")
    v.add_argument("--out", metavar="DIR", help="where validate.json and trace files go (default: a temp dir)")
    v.add_argument("--doc", help="document whose End-to-end section is rewritten (default docs/accuracy.md, "
                                 "written only by a full run: all suites, both tiers, every source)")
    v.add_argument("--no-doc", action="store_true", help="do not touch the document")
    v.add_argument("--fit-profiles", action="store_true",
                   help="fit each backend's host overheads on dev rows and rewrite sim/data/host/<backend>.toml")
    v.add_argument("--fit-api-latency", action="store_true",
                   help="fit each backend's API-server latency on this run's dev rows measured through the server "
                        "and rewrite it in sim/data/host/<backend>.toml (docs/validation.md, Engine profiles)")
    v.add_argument("--backend", choices=BACKENDS, help="with --fit-profiles: only this backend")
    v.add_argument("--fit-budget-s", type=float, default=20.0,
                   help="with --fit-profiles: estimated seconds of rows per candidate evaluation")
    v.set_defaults(func=cmd_validate)
