"""Capacity planning: the cheapest fleet (GPU type x TP x replicas) that serves a request rate within SLOs.

For every candidate (each combination of the `[space]` choices), one replica's capacity is found
by bisection on `workload.request_rate` with `engine.data_parallel_size = 1` (an MoE candidate's
replica keeps its DP: its ranks are one lockstep engine):

1. a closed-loop probe (`request_rate = inf`) measures the replica's saturated throughput, the
   upper end of the bracket;
2. if the `[slo]` bounds hold there, that is the capacity; otherwise a probe at
   `min_rate_per_replica` must meet them (else the candidate cannot meet the SLOs at any load);
3. bisection (geometric while the bracket spans more than 4x) narrows [passing, failing] until
   it is within `rate_rel_tol`; the capacity is the highest passing rate.

The fleet needs ceil(target / capacity) replicas; its cost is replicas x GPUs per replica x
the GPU-hour price. With `[autoscaling]` in the base, probes are one fixed replica (the section is
removed) and the verified fleet is autoscaled with that replica count as its `max_replicas`: the
chosen plan then reports its peak replicas, provisioned GPU-hours and SLO attainment, and its fleet
cost is the provisioned GPU-hours' (`sim.metrics.autoscaling`). The cheapest feasible candidate
wins (fewer GPUs on ties), by its fixed fleet's cost (an autoscaled one's `max_replicas` fleet). With
`verify_fleet`, the winner is simulated as a whole fleet at the target rate (`data_parallel_size`
replicas behind the scenario's router, `num_prompts` scaled by the replica count; an MoE fleet as one
engine at 1/replicas of the rate) and gains replicas until it passes. Bisection assumes that
meeting the SLOs is monotone in the rate, which holds for queueing latency but is an assumption,
not a check.

All probes of all candidates run concurrently on the actor pool, one bisection chain per candidate.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from orchestrator.render import table
from orchestrator.sweep.dynamo_command import dynamo_launch
from orchestrator.sweep.evaluate import build_scenario
from orchestrator.sweep.objective import meets_slo
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.results import TrialInput, TrialResult, TrialStatus
from orchestrator.sweep.serving import is_disaggregated, scale_workers
from orchestrator.sweep.space import candidate_grid
from orchestrator.sweep.spec import ParamValue, SweepSpec
from orchestrator.sweep.vllm_command import checkpoint_note, pool_comment, vllm_pool_commands, vllm_serve_command
from sim.errors import ConfigError
from sim.specs.catalog import load_model
from sim.specs.scenario import Scenario

logger = logging.getLogger(__name__)

_MAX_VERIFY_STEPS: Final = 4


@dataclass(slots=True)
class _Chain:
    """Bisection state of one candidate."""

    index: int
    params: dict[str, ParamValue]
    saturation_rate: float = math.nan
    lo: float = math.nan
    """Highest rate known to meet the SLOs."""
    hi: float = math.nan
    """Lowest rate known to miss them."""
    best: TrialResult | None = None
    """The probe at `lo`."""
    status: str = "running"
    reason: str = ""
    probes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidatePlan:
    params: Mapping[str, ParamValue]
    status: str
    """ok, slo_unreachable, too_many_replicas, unpriced (no GPU price to rank it by), fleet_misses_slo
    (verified fleets never met the SLOs), infeasible, invalid or failed."""
    capacity_rate_per_replica: float = math.nan
    saturation_rate_per_replica: float = math.nan
    replicas: int = 0
    gpus_per_replica: int = 0
    cost_per_hour_usd: float = math.inf
    at_capacity: TrialResult | None = None
    probes: int = 0
    serving: str = "aggregated"
    """`aggregated`, or `disaggregated` (a replica is the candidate's xPyD unit)."""
    reason: str = ""
    autoscaled: Mapping[str, float] | None = None
    """The verified autoscaled fleet (base with `[autoscaling]`): `peak_replicas`, `fleet_gpu_hours`,
    `mean_replicas`, `slo_attainment` and `max_replicas_cost_per_hour_usd` (the fixed fleet's cost);
    `cost_per_hour_usd` is then the provisioned GPU-hours' cost per hour."""

    def num_gpus(self) -> int:
        return self.replicas * self.gpus_per_replica

    def fixed_cost_per_hour_usd(self) -> float:
        """The fixed fleet's cost (`replicas` always on): what candidates are ranked by, an autoscaled
        verified fleet's included (its `cost_per_hour_usd` is then the provisioned GPU-hours')."""
        return self.autoscaled["max_replicas_cost_per_hour_usd"] if self.autoscaled else self.cost_per_hour_usd


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityReport:
    spec: SweepSpec
    candidates: tuple[CandidatePlan, ...]
    chosen: int | None
    """Index into `candidates`, or None when no candidate meets the SLOs."""
    verified: TrialResult | None = None
    """The fleet simulation at the target rate, if run."""
    vllm_serve: str = ""
    dynamo_launch: str = ""
    """NVIDIA Dynamo's frontend and worker lines for a chosen disaggregated fleet; "" otherwise."""
    num_probes: int = 0
    actor_restarts: int = 0
    wall_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for i, c in enumerate(self.candidates):
            m = c.at_capacity.metrics if c.at_capacity is not None else {}
            per_replica_cost = c.fixed_cost_per_hour_usd() / c.replicas if c.replicas else math.nan
            out.append({"chosen": i == self.chosen, **c.params, "serving": c.serving, "status": c.status,
                        "capacity_rate_per_replica": c.capacity_rate_per_replica,
                        "saturation_rate_per_replica": c.saturation_rate_per_replica, "replicas": c.replicas,
                        "gpus_per_replica": c.gpus_per_replica, "fleet_num_gpus": c.num_gpus(),
                        "cost_per_hour_per_replica_usd": per_replica_cost,
                        "fleet_cost_per_hour_usd": c.cost_per_hour_usd,
                        # the names before the fleet_ ones, kept: both are fleet totals
                        "num_gpus": c.num_gpus(), "cost_per_hour_usd": c.cost_per_hour_usd,
                        **{b.metric: m.get(b.metric, math.nan) for b in self.spec.slo},
                        "cost_per_million_output_tokens_usd": m.get("cost_per_million_output_tokens_usd", math.nan),
                        "output_tokens_per_s_per_user": m.get("output_tokens_per_s_per_user", math.nan),
                        "probes": c.probes, "reason": c.reason.splitlines()[0] if c.reason else "",
                        **(dict(c.autoscaled) if c.autoscaled is not None else {})})
        return out

    def render(self) -> str:
        spec = self.spec
        assert spec.capacity is not None
        keys = list(dict.fromkeys(k for c in self.candidates for k in c.params))
        both = len({c.serving for c in self.candidates}) > 1
        serving_col = both and "serving" not in keys
        headers = ["", *(["serving"] if serving_col else []), *(_short_key(k) for k in keys),
                   "req/s/replica", "replicas", "fleet GPUs",
                   "fleet $/hour",
                   *(b.metric for b in spec.slo), "status"]
        rows = []
        for i, c in enumerate(self.candidates):
            m = c.at_capacity.metrics if c.at_capacity is not None else {}
            rows.append(["*" if i == self.chosen else "", *([c.serving] if serving_col else []),
                         *(_text(c.params.get(k, "-")) for k in keys),
                         _fmt(c.capacity_rate_per_replica), c.replicas or "-", c.num_gpus() or "-",
                         _fmt(c.cost_per_hour_usd) if math.isfinite(c.cost_per_hour_usd) else "-",
                         *(_fmt(m.get(b.metric, math.nan)) for b in spec.slo), c.status])
        out = (f"capacity plan {spec.name}: {spec.capacity.target_request_rate:g} requests/s within "
               + ", ".join(_bound_text(b.metric, b.min_value, b.max_value) for b in spec.slo) + "\n")
        out += table(headers, rows)
        if both:
            out += "\n" + "".join(self._serving_line(mode) for mode in ("aggregated", "disaggregated"))
        if self.chosen is None:
            return (out + "\nno candidate meets the SLOs at the target rate\n"
                    + "".join(f"note: {n}\n" for n in self.notes))
        c = self.candidates[self.chosen]
        out += (f"\ncheapest: {c.replicas} x {c.gpus_per_replica} GPU(s) ({c.num_gpus()} GPUs), "
                f"${c.cost_per_hour_usd:.2f}/hour, {c.capacity_rate_per_replica:.3g} requests/s per replica\n")
        if self.verified is not None:
            ok = "meets" if meets_slo(self.verified.metrics, spec.slo) else "MISSES"
            out += f"fleet simulated at {spec.capacity.target_request_rate:g} requests/s: {ok} the SLOs\n"
        if c.autoscaled is not None:
            a = c.autoscaled
            out += (f"autoscaled: peak {a['peak_replicas']:.0f} replicas, {a['fleet_gpu_hours']:.4g} GPU-hours "
                    f"provisioned (mean {a['mean_replicas']:.3g} replicas), SLO attainment "
                    f"{a['slo_attainment']:.2%}; fleet $/hour is the provisioned GPU-hours' "
                    f"(${a['max_replicas_cost_per_hour_usd']:.2f}/hour at max_replicas)\n")
        out += "".join(f"note: {n}\n" for n in self.notes)
        out += f"\n{self.vllm_serve}\n"
        if self.dynamo_launch:
            out += f"\nor with NVIDIA Dynamo (vLLM workers):\n{self.dynamo_launch}\n"
        return out

    def cheapest(self, serving: str) -> int | None:
        """The cheapest candidate of one kind (`aggregated` or `disaggregated`) that meets the SLOs
        at the target rate, by the plan's own order; None when none does."""
        ok = [i for i, c in enumerate(self.candidates) if c.status == "ok" and c.serving == serving]
        return min(ok, key=lambda i: (self.candidates[i].fixed_cost_per_hour_usd(), self.candidates[i].num_gpus(),
                                      -self.candidates[i].capacity_rate_per_replica, i)) if ok else None

    def _serving_line(self, serving: str) -> str:
        i = self.cheapest(serving)
        if i is None:
            return f"cheapest {serving}: none meets the SLOs at the target rate\n"
        c = self.candidates[i]
        m = c.at_capacity.metrics if c.at_capacity is not None else {}
        return (f"cheapest {serving}: candidate {i}, {c.num_gpus()} GPUs, ${c.cost_per_hour_usd:.2f}/hour, "
                f"${_fmt(m.get('cost_per_million_output_tokens_usd', math.nan))}/M output tokens, "
                f"{_fmt(m.get('output_tokens_per_s_per_user', math.nan))} tokens/s per user\n")

    def to_json(self) -> dict[str, Any]:
        def clean(v: Any) -> Any:
            return repr(v) if isinstance(v, float) and not math.isfinite(v) else v

        return {"study": self.spec.name, "mode": "capacity",
                "target_request_rate": self.spec.capacity.target_request_rate if self.spec.capacity else None,
                "chosen": None if self.chosen is None else {k: clean(v) for k, v in self.rows()[self.chosen].items()},
                "candidates": [{k: clean(v) for k, v in row.items()} for row in self.rows()],
                "cheapest_by_serving": {mode: self.cheapest(mode) for mode in ("aggregated", "disaggregated")},
                "verified_fleet_metrics": None if self.verified is None else
                {k: clean(v) for k, v in self.verified.metrics.items()},
                "vllm_serve": self.vllm_serve, "dynamo_launch": self.dynamo_launch, "probes": self.num_probes,
                "actor_restarts": self.actor_restarts,
                "wall_s": self.wall_s, "notes": list(self.notes)}


class CapacityPlanner:
    def __init__(self, spec: SweepSpec, base: Scenario, pool: ShardPool,
                 progress: Callable[[int, int], None] | None = None) -> None:
        assert spec.capacity is not None
        self.spec = spec
        self.cap = spec.capacity
        self.base = base
        self.pool = pool
        self.progress = progress
        self._ids = itertools.count()
        self._owner: dict[int, tuple[_Chain, float]] = {}
        self.num_probes = 0

    def num_candidates(self) -> int:
        return len(candidate_grid(self.spec.space))

    def run(self) -> tuple[tuple[CandidatePlan, ...], int | None, TrialResult | None, list[str]]:
        chains = [_Chain(index=i, params=p) for i, p in enumerate(candidate_grid(self.spec.space))]
        for chain in chains:
            self._probe(chain, math.inf)
        done = 0
        while self._owner:
            for result in self.pool.wait(timeout_s=1.0):
                chain, rate = self._owner.pop(result.number)
                self._advance(chain, rate, result)
                if chain.status != "running":
                    done += 1
                    if self.progress is not None:
                        self.progress(done, len(chains))
        plans = tuple(self._plan(c) for c in chains)
        chosen = self._choose(plans)
        verified: TrialResult | None = None
        notes: list[str] = []
        if chosen is not None and self.cap.verify_fleet:
            plans, chosen, verified, notes = self._verify_cheapest(plans, chosen)
        return plans, chosen, verified, notes

    def _verify_cheapest(self, plans: tuple[CandidatePlan, ...], chosen: int
                         ) -> tuple[tuple[CandidatePlan, ...], int | None, TrialResult | None, list[str]]:
        """Verify the cheapest candidate's fleet; when the fleet needed replicas that make another
        candidate cheaper, or never met the SLOs (its status then says so), verify the next cheapest,
        each candidate at most once. The choice is the cheapest candidate whose fleet met the SLOs."""
        results: dict[int, TrialResult | None] = {}
        notes: list[str] = []
        current: int | None = chosen
        while current is not None and current not in results:
            before = plans[current].replicas
            plans, results[current], step_notes, met = self._verify(plans, current)
            notes += step_notes
            if not met:
                plans = tuple(replace(p, status="fleet_misses_slo", reason="; ".join(step_notes) or p.reason)
                              if i == current else p for i, p in enumerate(plans))
            following = self._choose(plans)
            if following is not None and following != current and met:
                notes.append(f"candidate {current} needs {plans[current].replicas} replicas as a fleet "
                             f"(planned {before}): candidate {following} is now cheaper, verifying it")
            current = following
        return plans, current, None if current is None else results.get(current), notes

    def _probe(self, chain: _Chain, rate: float, replicas: int = 1, *, autoscaled: bool = False) -> None:
        """Simulate the candidate with `replicas` replicas at `rate`; `autoscaled` keeps the base's
        `[autoscaling]` with `max_replicas = replicas` (the verified fleet), else it is removed."""
        number = next(self._ids)
        sections = self.base.sections()
        lockstep = _lockstep_engine(self.base, chain.params)
        if is_disaggregated(chain.params, sections):  # a replica is the candidate's xPyD unit
            params = {**scale_workers(chain.params, sections, replicas), "workload.request_rate": rate}
        elif lockstep:
            # An MoE engine's DP ranks are one lockstep engine (its own DP stays): N engines behind a
            # router are simulated as one engine taking 1/N of the rate.
            params = {**chain.params, "workload.request_rate": rate / replicas}
        else:
            params = {**chain.params, "engine.data_parallel_size": replicas, "workload.request_rate": rate}
        if replicas > 1 and not lockstep:
            params["workload.num_prompts"] = self.base.workload.num_prompts * replicas
        scaling = self.base.autoscaling
        if scaling is not None and autoscaled:
            params.update({"autoscaling.max_replicas": replicas,
                           "autoscaling.min_replicas": min(scaling.min_replicas, replicas),
                           "autoscaling.initial_replicas": min(scaling.initial_replicas or 1, replicas)})
        elif scaling is not None:
            params["autoscaling"] = None  # one fixed replica: the section is removed
        self._owner[number] = (chain, rate)
        chain.probes += 1
        self.num_probes += 1
        self.pool.submit(TrialInput(number=number, params=params, interval_runs=self.spec.trial_interval_runs(),
                                    slo_confidence=self.spec.slo_confidence))

    def _advance(self, chain: _Chain, rate: float, result: TrialResult) -> None:
        if result.status is not TrialStatus.OK:
            chain.status, chain.reason = result.status.value, result.reason
            return
        passed = meets_slo(result.metrics, self.spec.slo)
        if math.isinf(rate):
            chain.saturation_rate = result.metrics["request_throughput_per_s"]
            if not chain.saturation_rate > 0:
                chain.status, chain.reason = "failed", "the saturation probe completed no request"
                return
            self._probe(chain, chain.saturation_rate)
            return
        if passed:
            chain.lo, chain.best = rate, result
        else:
            chain.hi = rate
        if math.isnan(chain.lo) and math.isnan(chain.hi):
            return
        if passed and rate >= chain.saturation_rate:
            chain.status = "ok"  # meets the SLOs even at saturation
            return
        if math.isnan(chain.lo):
            if rate <= self.cap.min_rate_per_replica:
                chain.status = "slo_unreachable"
                chain.reason = (f"misses the SLOs even at {rate:g} requests/s per replica "
                                f"(min_rate_per_replica)")
                return
            self._probe(chain, self.cap.min_rate_per_replica)
            return
        if math.isnan(chain.hi):
            chain.status = "ok"
            return
        if (chain.hi - chain.lo) <= self.cap.rate_rel_tol * chain.hi:
            chain.status = "ok"
            return
        mid = math.sqrt(chain.lo * chain.hi) if chain.hi > 4 * chain.lo else 0.5 * (chain.lo + chain.hi)
        self._probe(chain, mid)

    def _plan(self, chain: _Chain) -> CandidatePlan:
        try:
            gpus = _replica_gpus(build_scenario(self.base, _one_replica(self.base, chain.params)))
        except ConfigError:
            gpus = 0
        serving = "disaggregated" if is_disaggregated(chain.params, self.base.sections()) else "aggregated"
        if chain.status != "ok" or chain.best is None:
            return CandidatePlan(params=chain.params, status=chain.status, reason=chain.reason, probes=chain.probes,
                                 saturation_rate_per_replica=chain.saturation_rate, gpus_per_replica=gpus,
                                 serving=serving)
        replicas = max(1, math.ceil(self.cap.target_request_rate / chain.lo - 1e-9))
        price_per_replica = chain.best.metrics["cost_per_hour_usd"]
        status, reason = "ok", ""
        if replicas > self.cap.max_replicas:
            status, reason = "too_many_replicas", f"needs {replicas} replicas, over max_replicas"
        elif not math.isfinite(price_per_replica):
            # Candidates are ranked by cost: one without a price cannot be, and NaN would compare as
            # neither cheaper nor dearer than the others (the file's order would choose).
            status, reason = "unpriced", (
                "no GPU price for its hardware (a hardware TOML of your own has none in sim/data/prices.toml): "
                "set hardware.price_per_gpu_hour_usd (USD per GPU-hour) in the base or [space] to rank it")
        return CandidatePlan(params=chain.params, status=status, capacity_rate_per_replica=chain.lo,
                             saturation_rate_per_replica=chain.saturation_rate, replicas=replicas,
                             gpus_per_replica=gpus, cost_per_hour_usd=replicas * price_per_replica,
                             at_capacity=chain.best, probes=chain.probes, serving=serving, reason=reason)

    @staticmethod
    def _choose(plans: tuple[CandidatePlan, ...]) -> int | None:
        ok = [i for i, p in enumerate(plans) if p.status == "ok"]
        if not ok:
            return None
        # By the fixed fleets' cost: a verified autoscaled fleet's provisioned cost would otherwise be
        # weighed against the other candidates' always-on fleets.
        return min(ok, key=lambda i: (plans[i].fixed_cost_per_hour_usd(), plans[i].num_gpus(),
                                      -plans[i].capacity_rate_per_replica, i))

    def _verify(self, plans: tuple[CandidatePlan, ...], chosen: int
                ) -> tuple[tuple[CandidatePlan, ...], TrialResult | None, list[str], bool]:
        """Simulate candidate `chosen`'s fleet at the target rate, adding a replica after each miss
        (at most `_MAX_VERIFY_STEPS` fleets, never over `max_replicas`); the plans with its replica
        count and cost updated to the last fleet simulated, that fleet's result, notes, and whether
        it met the SLOs."""
        plan = plans[chosen]
        chain = _Chain(index=chosen, params=dict(plan.params))
        notes: list[str] = []
        replicas = plan.replicas
        result: TrialResult | None = None
        lockstep = _lockstep_engine(self.base, plan.params)
        autoscaled = (self.base.autoscaling is not None and not is_disaggregated(plan.params, self.base.sections())
                      and not lockstep)
        if self.base.autoscaling is not None and not autoscaled:
            notes.append("[autoscaling] scales replicas of dense aggregated engines only: the "
                         + ("MoE" if lockstep else "disaggregated") + " fleet is simulated fixed")
        if lockstep and replicas > 1:
            notes.append(f"an MoE engine's data-parallel ranks run in lockstep: the fleet of {replicas} engines "
                         "is simulated as one engine at 1/replicas of the target rate (routing imbalance "
                         "between engines is not simulated)")
        met = False
        for attempt in range(_MAX_VERIFY_STEPS):
            self._probe(chain, self.cap.target_request_rate, replicas=replicas, autoscaled=autoscaled)
            result = None
            while result is None:
                for r in self.pool.wait(timeout_s=1.0):
                    self._owner.pop(r.number)
                    result = r
            if result.status is TrialStatus.OK and meets_slo(result.metrics, self.spec.slo):
                met = True
                break
            if result.status is not TrialStatus.OK:
                notes.append(f"fleet simulation with {replicas} replicas did not run: {result.reason.splitlines()[0]}")
                break
            ramp = self._ramp_note(replicas) if autoscaled and attempt == 0 else ""
            if ramp:
                notes.append(ramp)
            if attempt + 1 == _MAX_VERIFY_STEPS or replicas + 1 > self.cap.max_replicas:
                notes.append(f"{replicas} replicas miss the SLOs as a fleet after {attempt + 1} fleet "
                             f"simulation(s) (up to {_MAX_VERIFY_STEPS}, at most max_replicas)")
                break
            why = "routing imbalance, or the autoscaler's ramp" if autoscaled else "routing imbalance"
            notes.append(f"{replicas} replicas miss the SLOs as a fleet ({why}); trying {replicas + 1}")
            replicas += 1
        if replicas != plan.replicas:
            per_replica = plan.cost_per_hour_usd / plan.replicas
            plans = tuple(replace(p, replicas=replicas, cost_per_hour_usd=replicas * per_replica) if i == chosen else p
                          for i, p in enumerate(plans))
        if autoscaled and result is not None and result.status is TrialStatus.OK and "gpu_hours" in result.metrics:
            m = result.metrics
            provisioned = {"peak_replicas": m["peak_replicas"], "fleet_gpu_hours": m["gpu_hours"],
                           "mean_replicas": m["mean_replicas"], "slo_attainment": m["slo_attainment"],
                           "max_replicas_cost_per_hour_usd": plans[chosen].cost_per_hour_usd}
            plans = tuple(replace(p, cost_per_hour_usd=m["cost_per_hour_usd"], autoscaled=provisioned)
                          if i == chosen else p for i, p in enumerate(plans))
        return plans, result, notes, met

    def _ramp_note(self, replicas: int) -> str:
        """Why an autoscaled verified fleet of `replicas` may miss whatever its size: its run, at the
        target rate, ends before a replica the autoscaler starts could take traffic, so it is served
        by `initial_replicas` alone; "" when the run is long enough or starts with every replica."""
        scaling = self.base.autoscaling
        assert scaling is not None
        initial = min(scaling.initial_replicas or 1, replicas)
        span_s = self.base.workload.num_prompts * replicas / self.cap.target_request_rate
        react_s = scaling.interval_s + scaling.upscale_delay_s + scaling.startup_delay_s
        if initial >= replicas or span_s >= react_s:
            return ""
        return (f"the autoscaled fleet starts with initial_replicas={initial}, and its run (~{span_s:.3g} s: "
                f"{self.base.workload.num_prompts * replicas} requests at {self.cap.target_request_rate:g}/s) ends "
                f"before a replica the autoscaler starts can take traffic (interval_s + upscale_delay_s + "
                f"startup_delay_s = {react_s:g} s), so more replicas do not help it: raise workload.num_prompts or "
                "the base's autoscaling.initial_replicas")


def _one_replica(base: Scenario, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """One replica of the candidate: a dense engine at `data_parallel_size = 1` (the fleet's DP ranks
    are its replicas); an MoE engine (or a disaggregated unit) as the candidate gives it, its
    data-parallel ranks being one lockstep engine (expert parallelism over TP x DP)."""
    fixed: dict[str, ParamValue] = {"autoscaling": None} if base.autoscaling is not None else {}
    if is_disaggregated(params, base.sections()) or _lockstep_engine(base, params):
        return {**params, **fixed}
    return {**params, "engine.data_parallel_size": 1, **fixed}


def _lockstep_engine(base: Scenario, params: Mapping[str, ParamValue]) -> bool:
    """An aggregated MoE candidate: its data-parallel ranks meet at every MoE layer (one engine), so
    replicas are whole engines, not DP ranks (`sim.specs.scenario.ranks_in_lockstep`)."""
    if is_disaggregated(params, base.sections()):
        return False
    name = params.get("model.name")
    if name is None:
        return base.model.moe is not None
    try:
        return load_model(str(name)).moe is not None  # the catalog keeps each parsed model
    except ConfigError:
        return False  # the trial's own build names the error


def _replica_gpus(scenario: Scenario) -> int:
    if scenario.disaggregation is not None:
        return scenario.disaggregation.num_gpus()
    return scenario.engine.num_gpus()


def dynamo_command(base: Scenario, plan: CandidatePlan) -> str:
    """Dynamo's launch lines (vLLM workers) for a disaggregated candidate's whole fleet; "" for an
    aggregated one (its `vllm serve` line is the deployment)."""
    if not is_disaggregated(plan.params, base.sections()):
        return ""
    return dynamo_launch(build_scenario(base, scale_workers(plan.params, base.sections(), max(1, plan.replicas))),
                         "vllm")


def serve_command(base: Scenario, plan: CandidatePlan) -> str:
    scenario = build_scenario(base, _one_replica(base, plan.params))
    note = checkpoint_note(scenario)
    lines = _serve_lines(base, plan, scenario)
    return f"# note: {note}\n{lines}" if note else lines


def _serve_lines(base: Scenario, plan: CandidatePlan, scenario: Scenario) -> str:
    if scenario.disaggregation is not None:
        fleet = build_scenario(base, scale_workers(plan.params, base.sections(), max(1, plan.replicas)))
        assert fleet.disaggregation is not None
        lines = [f"{pool_comment(fleet, name)}\n{line}" for name, line in vllm_pool_commands(fleet).items()]
        return "\n".join([*lines, "# behind a proxy: vLLM's disaggregated proxy or Dynamo's frontend "
                                   "(docs/disaggregation.md)"])
    cmd = vllm_serve_command(scenario)
    if plan.replicas <= 1:
        return cmd
    per_node = scenario.hardware.num_gpus_per_node
    # vLLM's --data-parallel-size joins an MoE model's ranks into one expert-parallel engine.
    one_node = plan.num_gpus() <= per_node and not _lockstep_engine(base, plan.params)
    hint = (f"run {plan.replicas} replicas behind a load balancer"
            + (f", or on one {per_node}-GPU node: add --data-parallel-size {plan.replicas}" if one_node else ""))
    return f"{cmd}\n# {hint}"


def _short_key(key: str) -> str:
    parts = key.split(".")
    return f"{parts[1]}.{parts[-1]}" if parts[0] == "disaggregation" and len(parts) > 2 else parts[-1]


def capacity_pareto_png(report: CapacityReport, base: Scenario) -> bytes:
    """Every candidate at its capacity: cost per million output tokens vs output tokens/s per user,
    aggregated and disaggregated candidates with different markers, the chosen one ringed."""
    from orchestrator.plot_style import axis_label, config_label
    from orchestrator.sweep.artifacts import pareto_png

    metrics = [c.at_capacity.metrics if c.at_capacity is not None else {} for c in report.candidates]
    points = [(m.get("output_tokens_per_s_per_user", math.nan), m.get("cost_per_million_output_tokens_usd", math.nan))
              for m in metrics]
    sections = base.sections()
    hw = sections.get("hardware", {}).get("name")
    ok = [i for i, c in enumerate(report.candidates) if c.status == "ok" and all(map(math.isfinite, points[i]))]
    front = [i for i in ok if not any(points[j][0] >= points[i][0] and points[j][1] <= points[i][1]
                                      and points[j] != points[i] for j in ok)]
    return pareto_png(points, [c.status == "ok" for c in report.candidates], front,
                      [axis_label("output_tokens_per_s_per_user", "maximize"),
                       axis_label("cost_per_million_output_tokens_usd", "minimize")],
                      title=f"capacity plan {report.spec.name}: cost vs tokens/s per user at each candidate's capacity",
                      gpus=[str(c.params.get("hardware.name", hw)) for c in report.candidates],
                      point_labels=[config_label(c.params) for c in report.candidates],
                      modes=["disaggregated" if is_disaggregated(c.params, sections) else "aggregated"
                             for c in report.candidates])


def _text(value: object) -> str:
    return "none" if value is None else str(value)


def _fmt(value: float) -> str:
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else "-"


def _bound_text(metric: str, lo: float | None, hi: float | None) -> str:
    if lo is None:
        return f"{metric} <= {hi:g}"
    if hi is None:
        return f"{metric} >= {lo:g}"
    return f"{lo:g} <= {metric} <= {hi:g}"
