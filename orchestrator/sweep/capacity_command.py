"""`kernelsight sweep` on a sweep file with a `[capacity]` section: plan the cheapest fleet.

Candidates are the combinations of the `[space]` choices; there is no Optuna study (the search is
an enumeration plus bisection), so `--storage`, `--resume` and `--trials` do not apply. MLflow
gets a parent run with the plan (`capacity_plan.csv`, `capacity_plan.json`) and one child run
per candidate with its capacity, replica count, fleet cost and the metrics at capacity.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import uuid
from argparse import Namespace
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from orchestrator.sweep.spec import SweepSpec
from sim.serde import json_text


def run_capacity(spec: SweepSpec, args: Namespace, study_dir: Path, *, emit: Callable[[str], None]) -> int:
    """`emit` takes the plan's table or JSON for stdout."""
    import ray

    from orchestrator.sweep.artifacts import table_csv, trial_artifacts
    from orchestrator.sweep.capacity import (
        CapacityPlanner,
        CapacityReport,
        capacity_pareto_png,
        dynamo_command,
        serve_command,
    )
    from orchestrator.sweep.driver import run_identity_tags
    from orchestrator.sweep.pool import ShardPool
    from orchestrator.sweep.progress import ProgressBar
    from orchestrator.sweep.session import calibration_files, connect_ray, default_num_actors, make_tracker, ui_hint
    from orchestrator.sweep.signals import exit_code, sigterm_as_interrupt, stopped_word

    for flag in ("storage", "resume", "trials"):
        if getattr(args, flag):
            sys.stderr.write(f"note: --{flag} does not apply to capacity planning; ignored\n")
    base = spec.load_base()
    start_s = time.perf_counter()
    tracker = make_tracker(args.tracking_uri, spec, study_dir)
    started = connect_ray(args.ray_address, args.actors)
    pool = None
    stopping = contextlib.ExitStack()
    try:
        stopping.enter_context(sigterm_as_interrupt())  # after connect_ray (orchestrator.sweep.signals)
        uid = uuid.uuid4().hex
        tracker.start_study(study_uid=uid, spec=spec, tags={"mode": "capacity"},
                            files=[("scenario", Path(spec.base_scenario)),
                                   *(("calibrations", f) for f in calibration_files(base, spec))])
        pool = ShardPool(ray.put(base), num_actors=args.actors or default_num_actors(), render_artifacts=False,
                         name_prefix=f"kernelsight-{spec.name}-{uid[:6]}")
        planner = CapacityPlanner(spec, base, pool)
        bar = ProgressBar(planner.num_candidates(), label=spec.name, unit="candidate")
        planner.progress = bar.step
        try:
            plans, chosen, verified, notes = planner.run()
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: a plan is never resumed, so end its run KILLED
            bar.close()
            with contextlib.suppress(Exception):
                tracker.interrupt_study()
            sys.stderr.write(f"\n{stopped_word(exc)}\n")
            return exit_code(exc)
        bar.close()
        report = CapacityReport(spec=spec, candidates=plans, chosen=chosen, verified=verified,
                                vllm_serve=serve_command(base, plans[chosen]) if chosen is not None else "",
                                dynamo_launch=dynamo_command(base, plans[chosen]) if chosen is not None else "",
                                num_probes=planner.num_probes, actor_restarts=pool.num_restarts,
                                wall_s=time.perf_counter() - start_s, notes=tuple(notes))
        now_ms = int(time.time() * 1000)
        for i, plan in enumerate(plans):
            at = plan.at_capacity
            metrics = dict(at.metrics) if at is not None else {}
            # The probe's own metrics are one replica's; the fleet totals carry fleet_ names.
            # `num_gpus` is overwritten with the fleet total, as before the fleet_ names existed.
            metrics.update({"capacity_rate_per_replica": plan.capacity_rate_per_replica, "replicas": plan.replicas,
                            "num_gpus_per_replica": float(plan.gpus_per_replica),
                            "cost_per_hour_per_replica_usd": metrics.get("cost_per_hour_usd", math.nan),
                            "fleet_num_gpus": plan.num_gpus(),
                            "num_gpus": plan.num_gpus(), "fleet_cost_per_hour_usd": plan.cost_per_hour_usd,
                            "saturation_rate_per_replica": plan.saturation_rate_per_replica,
                            "probes": plan.probes})
            artifacts = trial_artifacts(at.breakdown, title=f"candidate {i} at capacity") \
                if at is not None and at.breakdown is not None else {}
            tags = {"status": plan.status, "chosen": str(i == chosen).lower(), "candidate": str(i),
                    **run_identity_tags(base, plan.params)}
            if at is not None:
                tags.update(scenario_hash=at.scenario_hash, worst_provenance=at.worst_provenance,
                            sim_version=at.sim_version)
            if plan.reason:
                tags["mlflow.note.content"] = plan.reason
            tracker.log_child(run_name=f"candidate-{i:03d}", params=plan.params,
                              metrics={k: v for k, v in metrics.items() if not math.isnan(v)}, tags=tags,
                              artifacts=artifacts, failed=plan.status == "failed", timestamp_ms=now_ms,
                              duration_s=0.0, role="candidate")
        payload = report.to_json()
        tracker.finish_study(files={"capacity_plan.csv": table_csv(report.rows()),
                                    "capacity_plan.json": json_text(payload).encode(),
                                    "vllm_serve.sh": (report.vllm_serve + "\n").encode(),
                                    **({"dynamo_launch.sh": (report.dynamo_launch + "\n").encode()}
                                       if report.dynamo_launch else {}),
                                    "capacity_pareto.png": capacity_pareto_png(report, base)},
                             metrics={"num_candidates": float(len(plans)), "num_probes": float(planner.num_probes)},
                             ok=True)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            tracker.interrupt_study()
        raise
    except BaseException as exc:
        if not type(exc).__module__.startswith("mlflow"):  # MLflow itself answers: end the parent run FAILED
            with contextlib.suppress(Exception):
                tracker.finish_study(files={}, metrics={}, ok=False)
        raise
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
        stopping.close()
    report = replace(report, wall_s=time.perf_counter() - start_s)
    if args.json:
        payload = report.to_json()
        payload["mlflow_ui"] = ui_hint(tracker.tracking_uri)
        emit(json_text(payload) + "\n")
    else:
        emit(report.render() + f"\nresults: {ui_hint(tracker.tracking_uri)}\n")
    return 0
