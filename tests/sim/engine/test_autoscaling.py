"""Autoscaling: the pure policy, and the engine carrying it out (hand-computed with 1-second steps)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, cast

import pytest
from conftest import REPO

from sim.api import load_scenario, simulate
from sim.engine.autoscaled import AutoscaledSimulation
from sim.engine.autoscaler import FleetObservation, PolicyState, decide, desired_replicas
from sim.engine.pricer import StepPricer
from sim.engine.simulation import SimLimits
from sim.errors import ConfigError
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.autoscaling import AutoscalingSpec
from sim.specs.engine import RouterName

SCENARIO = str(REPO / "scenarios" / "llama3_8b-h100.toml")
AUTOSCALED = {"autoscaling.target_ongoing_requests": 4.0}


class OneSecondSteps:
    """Every step takes exactly 1 s, so request times are step counts (the engine test's pricer)."""

    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def price(self, plan: StepPlan) -> float:
        return 1.0

    def key(self, plan: StepPlan) -> tuple[()]:
        return ()

    def fold_runs(self) -> list[tuple[Any, float, int]]:
        return []  # no bulk runs (`SimLimits(bulk_decode=False)`)


def _sim(spec: AutoscalingSpec, slots: int, router: RouterName = "least_outstanding") -> AutoscaledSimulation:
    scheds = [VllmV1Scheduler(kv=KVCacheManager(num_blocks=1000, block_size=16, enable_prefix_caching=False),
                              max_num_seqs=8, max_num_batched_tokens=512, enable_chunked_prefill=True,
                              long_prefill_token_threshold=0, bulk_decodes=False) for _ in range(slots)]
    return AutoscaledSimulation(replicas=scheds, pricer=cast(StepPricer, OneSecondSteps()), router=router,  # type: ignore[arg-type]
                                max_concurrency=None, limits=SimLimits(bulk_decode=False),
                                spec=spec.resolved(slots), max_num_seqs=8)


def test_an_unknown_router_name_is_refused_not_routed_as_least_outstanding() -> None:
    with pytest.raises(ValueError, match="router='least_loaded'"):
        _sim(AutoscalingSpec(target_ongoing_requests=4.0), 2, router=cast(RouterName, "least_loaded"))


def _req(rid: int, arrival_s: float, output: int) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=8, output_tokens=output, arrival_s=arrival_s, keys=())


def _obs(now_s: float, active: int, ongoing: int, starting: int = 0) -> FleetObservation:
    return FleetObservation(now_s=now_s, num_active=active, num_starting=starting, ongoing_requests=ongoing,
                            waiting_requests=0, kv_usage=0.0, running_frac=0.0)


def test_policy_asks_ceil_total_over_target_within_bounds_and_tolerance() -> None:
    spec = AutoscalingSpec(min_replicas=2, max_replicas=5, target_ongoing_requests=4.0, tolerance=0.1).resolved(8)
    assert desired_replicas(spec, _obs(0, 2, 13)) == 4          # ceil(13 / 4)
    assert desired_replicas(spec, _obs(0, 2, 8)) == 2           # exactly on target
    assert desired_replicas(spec, _obs(0, 3, 13)) == 3          # 13 / 12 = 1.083: within 10%: stay
    assert desired_replicas(spec, _obs(0, 2, 100)) == 5         # max_replicas
    assert desired_replicas(spec, _obs(0, 4, 0)) == 2           # min_replicas
    assert desired_replicas(spec, _obs(0, 2, 13, starting=2)) == 4  # starting replicas count as current
    both = AutoscalingSpec(target_ongoing_requests=4.0, target_running_frac=0.5, tolerance=0.0).resolved(8)
    obs = FleetObservation(now_s=0, num_active=2, num_starting=0, ongoing_requests=4, waiting_requests=0,
                           kv_usage=0.0, running_frac=1.8)
    assert desired_replicas(both, obs) == 4                     # max(ceil(4/4), ceil(1.8/0.5))


def test_policy_waits_for_the_up_and_down_delays() -> None:
    spec = AutoscalingSpec(target_ongoing_requests=1.0, tolerance=0.0, upscale_delay_s=20.0,
                           downscale_delay_s=30.0).resolved(8)
    state = PolicyState()
    seen = []
    for t in (10.0, 20.0, 30.0):
        n, state = decide(spec, _obs(t, 1, 3), state)
        seen.append(n)
    assert seen == [1, 1, 3]  # wanted since t=10; 30 - 10 >= 20
    assert state == PolicyState()
    n, state = decide(spec, _obs(40.0, 3, 0), state)
    assert (n, state) == (3, PolicyState(down_since_s=40.0))
    n, state = decide(spec, _obs(50.0, 3, 3), state)  # load came back: the count-down restarts
    assert (n, state) == (3, PolicyState())
    for t in (60.0, 70.0, 80.0):
        n, state = decide(spec, _obs(t, 3, 0), state)
    assert n == 3
    n, state = decide(spec, _obs(90.0, 3, 0), state)
    assert n == 1


def test_a_new_replica_takes_traffic_only_after_its_start_up_delay() -> None:
    # 1 replica holding 6 requests at the tick t=10 with a target of 2 per replica: 2 more start at
    # 10 and are active at 15. A request at t=12 can only go to replica 0; one at t=16 goes to the
    # least-loaded new replica (1).
    spec = AutoscalingSpec(min_replicas=1, max_replicas=3, target_ongoing_requests=2.0, tolerance=0.0,
                           interval_s=10.0, upscale_delay_s=0.0, downscale_delay_s=1e6, startup_delay_s=5.0)
    sim = _sim(spec, slots=4)
    reqs = [_req(i, 0.0, 40) for i in range(6)] + [_req(6, 12.0, 5), _req(7, 16.0, 5)]
    records = {r.request_id: r for r in sim.run(reqs)}
    assert sim.timeline[:3] == [(0.0, 1, 0, 0), (10.0, 1, 2, 0), (15.0, 3, 0, 0)]
    assert [records[i].replica for i in range(8)] == [0] * 7 + [1]
    assert sim.peak_replicas == 3 and sim.num_started == 2
    # paid: replica 0 from 0, replicas 1 and 2 from 10 (their start-up included), to the last finish
    end = max(r.finish_s for r in records.values())
    assert sim.end_s == end
    assert sim.replica_s == pytest.approx(end + 2 * (end - 10.0), abs=1e-12)
    assert sim.startup_s == pytest.approx(2 * 5.0)


def test_a_drained_replica_takes_no_new_requests_and_is_released_when_empty() -> None:
    # Two replicas, each holding one request at the tick t=10; the target of 4 per replica asks for
    # one: replica 1 (a tie on load; the highest index) drains, finishes its request at its own
    # pace and is released then; the request at t=12 goes to replica 0.
    spec = AutoscalingSpec(min_replicas=1, max_replicas=2, initial_replicas=2, target_ongoing_requests=4.0,
                           tolerance=0.0, interval_s=10.0, upscale_delay_s=1e6, downscale_delay_s=0.0)
    sim = _sim(spec, slots=2)
    records = {r.request_id: r for r in sim.run([_req(0, 0.0, 50), _req(1, 1.0, 30), _req(2, 12.0, 5)])}
    assert [records[i].replica for i in range(3)] == [0, 1, 0]
    r1_finish = records[1].finish_s
    assert sim.timeline == [(0.0, 2, 0, 0), (10.0, 1, 0, 1), (r1_finish, 1, 0, 0)]
    assert r1_finish > 10.0 and sim.num_drained == 1
    assert sim.replica_s == pytest.approx(sim.end_s + r1_finish, abs=1e-12)


def test_bounds_hold_under_a_burst_and_a_lull() -> None:
    spec = AutoscalingSpec(min_replicas=2, max_replicas=3, target_ongoing_requests=1.0, tolerance=0.0,
                           interval_s=5.0, upscale_delay_s=0.0, downscale_delay_s=0.0, startup_delay_s=2.0)
    sim = _sim(spec, slots=6)
    reqs = [_req(i, 0.0, 30) for i in range(20)] + [_req(20 + i, 200.0 + i, 3) for i in range(3)]
    records = sim.run(reqs)
    assert len(records) == 23
    provisioned = [a + s + d for _, a, s, d in sim.timeline]
    assert max(provisioned) == 3 == sim.peak_replicas
    assert min(a + s for _, a, s, _ in sim.timeline) >= 2
    assert {r.replica for r in records} <= {0, 1, 2}


def _fleet(**overrides: Any) -> dict[str, Any]:
    return {"engine.data_parallel_size": 4, "workload.num_prompts": 200, "workload.request_rate": 20.0,
            **overrides}


def test_an_autoscaler_that_never_acts_changes_nothing() -> None:
    # min = max = initial: the ticks are in the heap but the fleet is fixed; same records, exactly.
    fixed = simulate(load_scenario(SCENARIO, _fleet()))
    held = simulate(load_scenario(SCENARIO, _fleet(**{
        "autoscaling.min_replicas": 4, "autoscaling.target_ongoing_requests": 1.0, "autoscaling.interval_s": 0.5})))
    assert held.records == fixed.records
    assert held.summary.ttft_p90_s == fixed.summary.ttft_p90_s
    assert fixed.autoscaling is None and held.autoscaling is not None
    assert held.autoscaling.peak_replicas == 4 and held.autoscaling.num_replicas_started == 0


def test_gpu_hours_and_the_provisioned_cost() -> None:
    scenario = load_scenario(SCENARIO, _fleet(**{
        "engine.tensor_parallel_size": 2, "autoscaling.target_ongoing_requests": 2.0,
        "autoscaling.interval_s": 1.0, "autoscaling.upscale_delay_s": 0.0, "autoscaling.startup_delay_s": 3.0}))
    result = simulate(scenario)
    a = result.autoscaling
    assert a is not None and a.gpus_per_replica == 2 and a.num_replicas_started >= 1
    assert a.peak_gpus == 2 * a.peak_replicas
    # replica-seconds from the timeline, each provisioned replica paid until the run's end
    timeline = [*a.timeline, (a.window_s, 0, 0, 0)]
    replica_s = sum((t1 - t0) * (act + st + dr) for (t0, act, st, dr), (t1, *_) in itertools.pairwise(timeline))
    assert a.replica_hours == pytest.approx(replica_s / 3600, rel=1e-9)
    assert a.gpu_hours == pytest.approx(2 * a.replica_hours, rel=1e-12)
    assert a.mean_replicas == pytest.approx(replica_s / a.window_s, rel=1e-9)
    price = result.summary.price_per_gpu_hour_usd
    assert price is not None and a.cost_usd == pytest.approx(a.gpu_hours * price, rel=1e-12)
    assert a.cost_usd is not None
    assert result.summary.cost_per_hour_usd == pytest.approx(a.cost_usd / (a.window_s / 3600), rel=1e-12)
    good = result.summary.goodput_requests_per_s * result.summary.duration_s
    assert a.slo_attainment == pytest.approx(good / result.summary.num_completed, rel=1e-12)


def test_autoscaling_hashes_apart_and_leaves_other_hashes_alone() -> None:
    base = load_scenario(SCENARIO)
    scaled = load_scenario(SCENARIO, AUTOSCALED)
    assert scaled.scenario_hash() != base.scenario_hash()
    assert scaled.with_overrides({"autoscaling": None}).scenario_hash() == base.scenario_hash()
    # defaults resolved: writing the defaults out hashes the same
    assert load_scenario(SCENARIO, {**AUTOSCALED, "autoscaling.min_replicas": 1, "autoscaling.max_replicas": 1,
                                    "autoscaling.interval_s": 10.0}).scenario_hash() == scaled.scenario_hash()


@pytest.mark.parametrize(("overrides", "key"), [
    ({"autoscaling.min_replicas": 1}, "autoscaling.target_ongoing_requests"),  # no target
    ({**AUTOSCALED, "autoscaling.min_replicas": 0}, "autoscaling.min_replicas"),
    ({**AUTOSCALED, "autoscaling.max_replicas": 2}, "autoscaling.max_replicas"),  # over data_parallel_size=1
    ({**AUTOSCALED, "engine.data_parallel_size": 4, "autoscaling.min_replicas": 3, "autoscaling.max_replicas": 2},
     "autoscaling.max_replicas"),
    ({**AUTOSCALED, "autoscaling.target_kv_usage": 1.5}, "autoscaling.target_kv_usage"),
    ({**AUTOSCALED, "autoscaling.interval_s": 0.0}, "autoscaling.interval_s"),
    ({**AUTOSCALED, "autoscaling.startup_delay_s": -1.0}, "autoscaling.startup_delay_s"),
    ({**AUTOSCALED, "autoscaling.tolerance": 1.0}, "autoscaling.tolerance"),
    ({**AUTOSCALED, "autoscaling.cooldown_s": 5.0}, "autoscaling.cooldown_s"),  # unknown key
    ({**AUTOSCALED, "disaggregation.prefill.num_workers": 1, "disaggregation.decode.num_workers": 1},
     "autoscaling.min_replicas"),
])
def test_bad_autoscaling_keys_name_file_key_and_rule(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(SCENARIO, overrides)
    assert info.value.key == key
    assert "llama3_8b-h100.toml" in info.value.source and info.value.rule


def test_an_initial_count_out_of_bounds_names_the_bounds() -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(SCENARIO, {**AUTOSCALED, "engine.data_parallel_size": 8, "autoscaling.min_replicas": 2,
                                 "autoscaling.max_replicas": 6, "autoscaling.initial_replicas": 1})
    assert (info.value.key, info.value.value) == ("autoscaling.initial_replicas", 1)
    assert info.value.rule.endswith("[min_replicas, max_replicas] = [2, 6]")


def test_the_disaggregated_rejection_says_why() -> None:
    with pytest.raises(ConfigError, match="per-pool autoscaling is not simulated"):
        load_scenario(SCENARIO, {**AUTOSCALED, "disaggregation.prefill.num_workers": 1,
                                 "disaggregation.decode.num_workers": 1})


def test_an_moe_lockstep_engine_is_not_autoscaled() -> None:
    with pytest.raises(ConfigError, match="lockstep") as info:
        load_scenario(str(REPO / "scenarios" / "deepseek_r1-h200-dp8ep8.toml"), AUTOSCALED)
    assert info.value.key == "autoscaling.min_replicas"


FLEET_DAY = str(REPO / "scenarios" / "llama3_8b-fleet-day-autoscale.toml")


def _timeline_integral_h(timeline: tuple[tuple[float, int, int, int], ...], end_s: float, column: int) -> float:
    points = [*timeline, (end_s, 0, 0, 0)]
    return sum((t1 - t0) * row[column] for (t0, *row), (t1, *_) in itertools.pairwise(points)) / 3600


def test_a_start_up_that_ends_after_the_run_is_paid_only_up_to_its_end() -> None:
    """A burst in the last minute starts replicas whose 60-s start-up outlasts the run: their
    start-up GPU-hours are the starting replicas' timeline up to the run's end (before 0.6.2 the
    whole delay was counted, 0.1 h here against the 0.042 h they were paid, and the timeline went on
    past the end)."""
    sets = {"workload.profile_duration_s": 180, "engine.data_parallel_size": 8, "autoscaling.max_replicas": 8,
            "workload.bursts": [{"start_s": 120.0, "duration_s": 60.0, "rate_factor": 4.0}]}
    a = simulate(load_scenario(FLEET_DAY, sets)).autoscaling
    assert a is not None and a.num_replicas_started > 0
    assert all(t <= a.window_s for t, *_ in a.timeline)
    assert a.replica_hours == pytest.approx(_timeline_integral_h(a.timeline, a.window_s, 0)
                                            + _timeline_integral_h(a.timeline, a.window_s, 1)
                                            + _timeline_integral_h(a.timeline, a.window_s, 2), rel=1e-9)
    starting_h = _timeline_integral_h(a.timeline, a.window_s, 1)
    assert a.startup_gpu_hours == pytest.approx(starting_h * a.gpus_per_replica, rel=1e-9)


def test_a_replica_started_again_loads_with_an_empty_prefix_cache(tmp_path: Path) -> None:
    """Two prefix groups on 4 replicas, a 300-s lull that drains the fleet to one replica, then
    traffic again: the replicas started after the lull have nothing cached from before they were
    released (before 0.6.2 their first requests hit 2,000 cached prefix tokens)."""
    path = tmp_path / "prefix.toml"
    path.write_text("""seed = 0
[hardware]
name = "h100_sxm"
[model]
name = "meta-llama/Llama-3.1-8B"
[engine]
data_parallel_size = 4
max_model_len = 16384
router = "round_robin"
[workload]
num_prompts = 100000
request_rate_profile = "diurnal"
diurnal_peak_rate = 20.0
diurnal_trough_rate = 20.0
profile_duration_s = 600
random_input_len = 200
random_output_len = 100
random_prefix_len = 2000
num_prefix_groups = 2
bursts = [{ start_s = 120.0, duration_s = 300.0, rate_factor = 0.0 }]
[autoscaling]
min_replicas = 1
max_replicas = 4
initial_replicas = 4
target_ongoing_requests = 8
interval_s = 10.0
upscale_delay_s = 0.0
downscale_delay_s = 20.0
startup_delay_s = 30.0
""")
    result = simulate(load_scenario(str(path)))
    a = result.autoscaling
    assert a is not None and a.num_replicas_started >= 2
    first: dict[int, Any] = {}
    for rec in sorted(result.records, key=lambda r: r.first_scheduled_s):
        if rec.arrival_s >= 420.0:
            first.setdefault(rec.replica, rec)
    restarted = [rec for replica, rec in first.items() if replica != 0]
    assert restarted and all(rec.prefix_hit_tokens == 0 for rec in restarted)
    # Later requests on a restarted replica hit what it has cached since.
    assert any(r.prefix_hit_tokens for r in result.records if r.replica != 0 and r.arrival_s >= 480.0)


def test_an_evaluation_at_the_instant_a_start_up_ends_counts_the_replica_active(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`startup_delay_s` = `interval_s`: the ready event and the tick fall on one instant, the tick
    queued first. The evaluation sees the replica as active, so a scale-down there drains a replica
    instead of cancelling one that has just loaded (before 0.6.2 three such replicas were cancelled)."""
    cancelled: list[tuple[float, float]] = []
    cancel = AutoscaledSimulation._cancel

    def spying(self: AutoscaledSimulation, r: int) -> None:
        cancelled.append((self.now_s, self._ready_s[r]))
        cancel(self, r)

    monkeypatch.setattr(AutoscaledSimulation, "_cancel", spying)
    sets = {"workload.profile_duration_s": 150, "engine.data_parallel_size": 8, "autoscaling.max_replicas": 8,
            "autoscaling.min_replicas": 1, "autoscaling.upscale_delay_s": 0.0,
            "autoscaling.downscale_delay_s": 0.0, "autoscaling.tolerance": 0.3,
            "autoscaling.startup_delay_s": 10.0}
    a = simulate(load_scenario(FLEET_DAY, sets)).autoscaling
    assert a is not None and a.num_replicas_started > 0 and a.num_replicas_drained > 0
    assert not [c for c in cancelled if c[1] <= c[0]]


def test_delays_that_are_whole_intervals_take_exactly_that_many_evaluations() -> None:
    """Evaluations at k x 0.3 s: 1.2 - 0.3 is an ulp short of 0.9, which must still count as the
    0.9-s delay (three intervals), not wait a fourth evaluation."""
    spec = AutoscalingSpec(min_replicas=1, max_replicas=8, initial_replicas=1, target_ongoing_requests=1.0,
                           interval_s=0.3, upscale_delay_s=0.9, downscale_delay_s=0.9)
    state = PolicyState()
    applied = []
    for k in range(1, 6):
        target, state = decide(spec, _obs(k * 0.3, active=1, ongoing=4), state)
        applied.append(target)
    assert applied == [1, 1, 1, 4, 1]  # the fourth applies; the fifth asks afresh


def test_slo_attainment_judges_each_request_by_its_traffic_class_targets() -> None:
    """A fleet-day with classes: a class's own targets replace `[slo]`'s, in the per-class goodput and
    so in the fleet's SLO attainment (it judged every request by `[slo]` alone, here 0 where every
    request meets its class's loose targets, or 1 where the strict class misses)."""
    path = str(REPO / "scenarios" / "llama3_8b-fleet-day-autoscale.toml")
    loose = {"name": "loose", "share": 0.5, "input_len": 128, "output_len": 16, "ttft_s": 100.0, "tpot_s": 100.0}
    strict = {"name": "strict", "share": 0.5, "input_len": 128, "output_len": 16, "ttft_s": 1e-6}
    base = {"workload.profile_duration_s": 60.0, "slo.ttft_s": 1e-6, "slo.tpot_s": 100.0}
    result = simulate(load_scenario(path, {**base, "workload.classes": [loose]}))
    assert result.autoscaling is not None and result.summary.goodput_requests_per_s == 0
    assert result.autoscaling.slo_attainment == 1.0
    mixed = simulate(load_scenario(path, {**base, "slo.ttft_s": 100.0, "workload.classes": [loose, strict]}))
    assert mixed.autoscaling is not None
    by_name = {c.name: c for c in mixed.classes}
    assert by_name["loose"].goodput_frac == 1.0 and by_name["strict"].goodput_frac == 0.0
    assert mixed.autoscaling.slo_attainment == pytest.approx(
        by_name["loose"].num_completed / mixed.summary.num_completed, rel=1e-12)
