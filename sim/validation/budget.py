"""Which rows fit a time budget: a cost model of the simulator and a deterministic selection.

Simulation time is close to `per_step_s x steps + per_request_step_s x (running requests summed
over steps)`, where a backend with SGLang's prefill priority (its prefill-only steps cut the runs
of bulk decode steps, `sim.serving.vllm_v1`) pays its own `per_plain_request_step_s` per running
request per step; `measure_cost_model` times three small runs on this machine to get the
constants, so the selection follows the simulator's speed wherever it runs. `select_rows` then keeps
(1) every trace and static-batch row (they are few and cheap), (2) closed-loop and offline rows
of each (suite, source) in a fixed hash order, while the estimated wall time over `jobs` workers
stays within `budget_s`. A row whose own estimate exceeds
`max_row_s` is deferred with that reason; the rest that did not fit are deferred as over budget.
The budget is split over (suite, source) groups, an eval group weighing `EVAL_WEIGHT` dev groups
(water-filling: a group that cannot use its share passes it on), so each source and suite is
sampled, at random with respect to the rows.
`budget_s <= 0` keeps every row. A row that repeats a chosen row's simulation
(`ValidationRow.simulation_key`) costs nothing: validate copies that row's results.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sim.api import load_engine_profile, simulate
from sim.specs.scenario import scenario_from_dict
from sim.validation.rows import ValidationRow

EVAL_WEIGHT = 2.0
"""An evaluation (suite, source) group gets twice a dev group's share: eval carries the headline."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    per_step_s: float
    per_request_step_s: float
    per_plain_request_step_s: float = 0.0
    """Per running request per step for the `request_by_request` backends (0: as the others)."""
    request_by_request: frozenset[str] = frozenset()
    """Backends whose engine profile has prefill priority (SGLang), timed on their own."""
    interval_runs: int = 0
    """Perturbed runs a row adds (`validate --intervals K`): it costs K + 1 simulations."""

    def with_interval_runs(self, k: int) -> CostModel:
        return dataclasses.replace(self, interval_runs=k)

    def estimate_s(self, row: ValidationRow) -> float:
        steps, request_steps = work_of(row)
        per_request = self.per_request_step_s
        if row.backend in self.request_by_request and self.per_plain_request_step_s > 0:
            per_request = self.per_plain_request_step_s
        return (1 + self.interval_runs) * (self.per_step_s * steps + per_request * request_steps)


def work_of(row: ValidationRow) -> tuple[float, float]:
    """(steps, request-steps) a row's simulation will take, roughly."""
    rep, sec = row.replay, row.sections
    if rep is None or sec is None:
        return 0.0, 0.0
    engine, work = sec["engine"], sec["workload"]
    budget = float(engine.get("max_num_batched_tokens", 8192))
    n = rep.num_requests
    if rep.kind == "trace":
        out = sum(t.output_tokens for t in rep.trace)
        inp = sum(t.input_tokens for t in rep.trace)
        running = min(float(engine.get("max_num_seqs", 256)), n)
        return out / running + inp / budget, float(out)
    isl, osl = float(work["random_input_len"]), float(work["random_output_len"])
    if rep.kind == "single_request":
        return 1.0, 1.0
    if rep.kind == "static_batch":
        return osl + 1, n * osl
    # Each attention-DP rank is its own replica stepping its share of the closed loop.
    dp = int(engine.get("data_parallel_size", 1))
    running = max(rep.concurrency / dp, 1.0)
    return n * osl / running + n * isl / budget, n * osl


PROBES = ((4, 64), (128, 1024))
"""(concurrency, requests) of the two vLLM runs the constants are solved from. Each is thousands of
steps, so a `simulate` call's fixed cost (~45 ms) does not pass for per-step cost: with runs of 4 and
128 requests the model over-estimated a full `validate` 3.7-3.9x (docs/benchmarks.md)."""


def _timed_run(conc: int, n: int, backend: str) -> tuple[float, int, int]:
    """(seconds, steps, request-steps) of a decode-heavy Llama-3.1-8B run on h100_sxm (the second of two)."""
    sc = scenario_from_dict({
        "hardware": {"name": "h100_sxm"}, "model": {"name": "meta-llama/Llama-3.1-8B"},
        "engine": {"max_model_len": 2048, "enable_prefix_caching": False, "backend": backend},
        "workload": {"dataset_name": "fixed", "random_input_len": 256, "random_output_len": 512,
                     "num_prompts": n, "max_concurrency": conc},
        "perf": {"tier": "cross-generation"}}, source="<cost model>")
    simulate(sc)  # warm the per-process memos out of the timing
    start = time.perf_counter()
    res = simulate(sc)
    return time.perf_counter() - start, res.summary.num_steps, n * 512


def measure_cost_model() -> CostModel:
    """Time a small and a wide decode-heavy run of Llama-3.1-8B on h100_sxm; solve for both constants;
    a third, wide run with a prefill-priority backend (SGLang) gives that backend's per-request cost."""
    points = [_timed_run(conc, n, "vllm") for conc, n in PROBES]
    (t1, s1, r1), (t2, s2, r2) = points
    det = s1 * r2 - s2 * r1
    per_step = max((t1 * r2 - t2 * r1) / det, 1e-6) if det else t1 / s1
    per_request_step = max((s1 * t2 - s2 * t1) / det, 1e-7) if det else 0.0
    plain = frozenset(b for b in ("vllm", "sglang", "trtllm") if load_engine_profile(b).policy.prefill_priority)
    per_plain = 0.0
    if plain:
        t3, s3, r3 = _timed_run(*PROBES[1], min(plain))
        per_plain = max((t3 - per_step * s3) / r3, per_request_step)
    return CostModel(per_step_s=per_step, per_request_step_s=per_request_step, per_plain_request_step_s=per_plain,
                     request_by_request=plain)


def _hash_key(row_id: str) -> str:
    return hashlib.sha256(row_id.encode()).hexdigest()


def select_rows(rows: Sequence[ValidationRow], *, tiers_per_row: dict[str, int], cost: CostModel, budget_s: float,
                jobs: int, max_row_s: float) -> tuple[list[ValidationRow], dict[str, str]]:
    """(rows to simulate, {row_id: why deferred}); skipped rows are neither."""
    live = [r for r in rows if not r.skipped and tiers_per_row.get(r.row_id, 0) > 0]
    if budget_s <= 0:
        return live, {}

    keys = {r.row_id: r.simulation_key for r in live}
    simulated: set[str] = set()

    def row_cost(r: ValidationRow) -> float:
        # A row that repeats a chosen row's simulation costs nothing: validate copies its results.
        return 0.0 if keys[r.row_id] in simulated else cost.estimate_s(r) * tiers_per_row[r.row_id]

    def choose(r: ValidationRow) -> None:
        chosen.append(r)
        simulated.add(keys[r.row_id])

    chosen: list[ValidationRow] = []
    deferred: dict[str, str] = {}
    remaining = budget_s * max(jobs, 1)
    queues: dict[tuple[str, str], list[ValidationRow]] = {}
    for r in live:
        if r.replay is not None and r.replay.kind in ("trace", "static_batch", "single_request"):
            remaining -= row_cost(r)
            choose(r)
        elif max_row_s > 0 and cost.estimate_s(r) > max_row_s:
            deferred[r.row_id] = (f"estimated {cost.estimate_s(r):.0f} s of simulation per tier, over the per-row "
                                  f"cap of {max_row_s:.0f} s")
        else:
            queues.setdefault((r.suite, r.source), []).append(r)
    for key in queues:
        queues[key].sort(key=lambda r: _hash_key(r.row_id))
    # Water-filling: each round gives every group its weighted share of what is left; a group
    # that cannot use it passes the rest on to the next round.
    active = sorted(queues)
    while active and remaining > 0:
        total_weight = sum(EVAL_WEIGHT if suite == "eval" else 1.0 for suite, _ in active)
        shares = {key: remaining * (EVAL_WEIGHT if key[0] == "eval" else 1.0) / total_weight for key in active}
        progressed = False
        for key in list(active):
            share = shares[key]
            spent = 0.0
            queue = queues[key]
            while queue and spent + row_cost(queue[0]) <= share:
                r = queue.pop(0)
                spent += row_cost(r)
                choose(r)
                progressed = True
            remaining -= spent
            if not queue:
                active.remove(key)
        if not progressed:
            break
    for queue in queues.values():
        for r in queue:
            deferred[r.row_id] = (f"over the time budget ({budget_s:.0f} s x {jobs} workers); rerun with a larger "
                                  "--budget-s, or --budget-s 0 for every row")
    return chosen, deferred


def expected_wall_s(rows: Sequence[ValidationRow], tiers_per_row: dict[str, int], cost: CostModel, jobs: int) -> float:
    """Estimated wall time of simulating `rows` on `jobs` workers; a repeated simulation counts once."""
    first = {r.simulation_key: r for r in reversed(rows)}
    total = sum(cost.estimate_s(r) * tiers_per_row.get(r.row_id, 0) for r in first.values())
    return total / max(jobs, 1) if math.isfinite(total) else math.inf
