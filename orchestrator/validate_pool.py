"""`validate`'s worker pool: (row, tier) tasks in batches of one pricing group, each batch with the
worker's kernel models, one `PriceCache`, and a repeated simulation copied (results identical to
simulating every row afresh); dearest batch first for an even finish; Ctrl-C ends the workers."""

from __future__ import annotations

import dataclasses
import json
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from sim.calibration.select import EfficiencyModels
from sim.engine.part_prices import SCHEDULING_ONLY_FIELDS, PriceCache
from sim.engine.simulation import gc_paused
from sim.perf.profile import EngineProfile
from sim.uncertainty import PerturbedModels
from sim.validation.budget import CostModel
from sim.validation.rows import ValidationRow
from sim.validation.runner import RowResult, Tier, evaluate_row

Task = tuple[ValidationRow, Tier, Path, EngineProfile | None, int]
"""(row, tier, trace directory, engine profile override, perturbed runs for intervals)."""


def _evaluate(task: Task) -> RowResult:
    row, tier, work_dir, profile, intervals = task
    return evaluate_row(row, tier, work_dir, profile=profile, intervals=intervals)


def _evaluate_batch(batch: Sequence[Task]) -> list[RowResult]:
    """Evaluate tasks of one pricing group with one set of kernel models and priced step parts:
    rows of the same hardware, model, precision, layout and tier price the same step parts (the
    results are those of pricing each row afresh, `sim.engine.part_prices`)."""
    with gc_paused():
        # One pause for the batch: re-enabled after each row, the collector's first pass would walk
        # every object the row left alive (its requests and records) before they are freed.
        return _evaluate_rows(batch)


_MODELS = EfficiencyModels()
"""The process's kernel models, shared by the batches it evaluates (a calibration is parsed once per
worker, as a sweep worker's trials share theirs; the models are pure values)."""


def _evaluate_rows(batch: Sequence[Task]) -> list[RowResult]:
    models, prices, perturbed = _MODELS, PriceCache(), PerturbedModels()
    done: dict[tuple[str, str, str, int], RowResult] = {}
    out: list[RowResult] = []
    for row, tier, work_dir, profile, intervals in batch:
        # A row that repeats another's simulation (same scenario and replay) gets its results:
        # simulating it again would give the same ones, bitwise.
        key = (row.simulation_key, tier, "" if profile is None else repr(profile), intervals)
        twin = done.get(key)
        if twin is not None:
            out.append(dataclasses.replace(twin, row_id=row.row_id, same_simulation_as=twin.row_id, wall_s=0.0))
            continue
        result = evaluate_row(row, tier, work_dir, profile=profile, models=models, prices=prices,
                              intervals=intervals, perturbed=perturbed)
        done[key] = result
        out.append(result)
    return out


def pricing_group(row: ValidationRow, tier: Tier) -> str:
    """What decides a row's step prices, from its scenario sections (the engine fields that only shape
    the schedule left out): rows with the same group share kernel models and priced parts in a
    worker. A coarser or finer key only changes how much is shared, never a result."""
    sec = row.sections or {}

    def graph_fields(engine: Any) -> dict[str, Any]:
        return {k: v for k, v in dict(engine or {}).items() if k not in SCHEDULING_ONLY_FIELDS}

    pools = {name: graph_fields(pool.get("engine")) for name, pool in dict(sec.get("disaggregation") or {}).items()
             if isinstance(pool, dict)}
    return json.dumps([tier, sec.get("hardware"), sec.get("model"), graph_fields(sec.get("engine")), pools],
                      sort_keys=True, default=str)


def _batches(tasks: Sequence[Task], cost: CostModel | None) -> list[list[int]]:
    """Task indices grouped by pricing group, dearest group first (by the cost model) for an even finish."""
    groups: dict[str, list[int]] = {}
    for i, (row, tier, *_) in enumerate(tasks):
        groups.setdefault(pricing_group(row, tier), []).append(i)
    batches = list(groups.values())
    if cost is not None:
        # A repeated simulation is copied (`_evaluate_batch`): it costs the batch nothing.
        batches.sort(key=lambda b: -sum(cost.estimate_s(row) for row in
                                        {(tasks[i][0].simulation_key, tasks[i][1]): tasks[i][0] for i in b}.values()))
    return batches


def run_pool(tasks: Sequence[Task], jobs: int,
             cost: CostModel | None = None, progress: Callable[[int, int], None] | None = None) -> list[RowResult]:
    """Evaluate tasks in `jobs` processes, in batches of one pricing group each (`_evaluate_batch`),
    dearest first (by the cost model) for an even finish. Results come back in task order, longest
    first when a cost model is given."""
    if cost is not None:
        tasks = sorted(tasks, key=lambda t: -cost.estimate_s(t[0]))
    batches = _batches(tasks, cost)
    results: list[RowResult | None] = [None] * len(tasks)
    done = 0

    def place(batch: list[int], out: list[RowResult]) -> None:
        nonlocal done
        for i, r in zip(batch, out, strict=True):
            results[i] = r
        done += len(batch)
        if progress:
            progress(done, len(tasks))

    if jobs <= 1:
        for batch in batches:
            place(batch, _evaluate_batch([tasks[i] for i in batch]))
    else:
        pool = ProcessPoolExecutor(max_workers=jobs, initializer=_ignore_sigint)
        try:
            futures = {pool.submit(_evaluate_batch, [tasks[i] for i in batch]): batch for batch in batches}
            for fut in as_completed(futures):
                place(futures[fut], fut.result())
        except BaseException:
            # Ctrl-C (or a failed batch): the pool's own exit would wait for every queued batch.
            _stop_pool(pool)
            raise
        pool.shutdown()
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C (sent to the whole foreground process group) to the parent, which ends them."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Drop the queued batches and end the workers now, mid-batch included."""
    processes = list(getattr(pool, "_processes", {}).values())  # the executor exposes no other handle
    manager = getattr(pool, "_executor_manager_thread", None)
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=10)
    # Let the executor's manager thread close its wake-up pipe before the interpreter exits: on
    # Python 3.11 the exit hook can otherwise write to the pipe while the thread closes it
    # ("OSError: Bad file descriptor" printed after "interrupted").
    if manager is not None:
        manager.join(timeout=10)
