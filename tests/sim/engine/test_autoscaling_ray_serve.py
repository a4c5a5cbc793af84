"""Ray Serve's autoscaling knobs: the look-back window over each replica's metrics
(`look_back_period_s`) and the scaling factors (`upscaling_factor` / `downscaling_factor`), as
`ray/serve/autoscaling_policy.py` (`_apply_scaling_factors`) and the replicas' metric store apply them."""

from __future__ import annotations

from typing import Any, cast

import pytest
from conftest import REPO

from sim.api import load_scenario
from sim.engine.autoscaled import AutoscaledSimulation
from sim.engine.autoscaler import FleetObservation, ReplicaSample, desired_replicas, windowed_observation
from sim.engine.pricer import StepPricer
from sim.engine.simulation import SimLimits
from sim.errors import ConfigError
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.autoscaling import AutoscalingSpec

SCENARIO = str(REPO / "scenarios" / "llama3_8b-h100.toml")
AUTOSCALED = {"autoscaling.target_ongoing_requests": 4.0}


class OneSecondSteps:
    def __init__(self) -> None:
        self.counts: dict[Any, int] = {}

    def price(self, plan: StepPlan) -> float:
        return 1.0

    def key(self, plan: StepPlan) -> tuple[()]:
        return ()

    def fold_runs(self) -> list[tuple[Any, float, int]]:
        return []


def _sim(spec: AutoscalingSpec, slots: int) -> AutoscaledSimulation:
    scheds = [VllmV1Scheduler(kv=KVCacheManager(num_blocks=1000, block_size=16, enable_prefix_caching=False),
                              max_num_seqs=8, max_num_batched_tokens=512, enable_chunked_prefill=True,
                              long_prefill_token_threshold=0, bulk_decodes=False) for _ in range(slots)]
    return AutoscaledSimulation(replicas=scheds, pricer=cast(StepPricer, OneSecondSteps()),  # type: ignore[arg-type]
                                router="least_outstanding", max_concurrency=None, limits=SimLimits(bulk_decode=False),
                                spec=spec.resolved(slots), max_num_seqs=8)


def _req(rid: int, arrival_s: float, output: int) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=8, output_tokens=output, arrival_s=arrival_s, keys=())


def _obs(active: int, ongoing: float) -> FleetObservation:
    return FleetObservation(now_s=0.0, num_active=active, num_starting=0, ongoing_requests=ongoing,
                            waiting_requests=0, kv_usage=0.0, running_frac=0.0)


def test_scaling_factors_move_a_share_of_the_change_as_ray_serve_does() -> None:
    """ceil(a + factor x (x - a)) with x = total / target unrounded (Ray Serve
    `_apply_scaling_factors`); a scale-down that rounds back to a removes one replica."""
    spec = AutoscalingSpec(max_replicas=64, target_ongoing_requests=1.0, tolerance=0.0,
                           upscaling_factor=0.5, downscaling_factor=0.25).resolved(64)
    assert desired_replicas(spec, _obs(2, 12.0)) == 7      # ceil(2 + 0.5 x 10); without the factor 12
    assert desired_replicas(spec, _obs(2, 4.5)) == 4       # ceil(2 + 0.5 x 2.5) = ceil(3.25): x unrounded
    assert desired_replicas(spec, _obs(10, 2.0)) == 8      # ceil(10 - 0.25 x 8)
    assert desired_replicas(spec, _obs(4, 2.9)) == 3       # ceil(4 - 0.275) = 4 would stall: one fewer
    assert desired_replicas(spec, _obs(4, 3.5)) == 4       # ceil(3.5) = 4 asks for no change
    assert desired_replicas(spec, _obs(10, 0.0)) == 8      # ceil(10 - 2.5)
    fast = AutoscalingSpec(max_replicas=16, target_ongoing_requests=1.0, tolerance=0.0,
                           upscaling_factor=3.0).resolved(64)
    assert desired_replicas(fast, _obs(2, 4.0)) == 8       # ceil(2 + 3 x 2): more than asked
    assert desired_replicas(fast, _obs(2, 40.0)) == 16     # clamped to max_replicas
    plain = AutoscalingSpec(max_replicas=64, target_ongoing_requests=1.0, tolerance=0.0).resolved(64)
    assert [desired_replicas(plain, _obs(2, x)) for x in (12.0, 4.5, 0.0)] == [12, 5, 1]


def test_the_window_average_is_each_replicas_mean_over_its_samples_summed() -> None:
    """Ray Serve's replica keeps its samples in (now - look_back, now] and reports their mean; the
    controller sums the running replicas' means."""
    r0 = [ReplicaSample(t, ongoing, 0, 0.1 * ongoing, ongoing) for t, ongoing in ((0.0, 100), (5.0, 2), (10.0, 4))]
    r1 = [ReplicaSample(10.0, 9, 3, 0.5, 6)]
    obs = windowed_observation(now_s=10.0, samples=[r0, r1], num_starting=2, look_back_s=10.0, max_num_seqs=8)
    assert (obs.num_active, obs.num_starting) == (2, 2)
    assert obs.ongoing_requests == pytest.approx(3.0 + 9.0)      # t=0 is out of (0, 10]
    assert obs.waiting_requests == pytest.approx(3.0)
    assert obs.kv_usage == pytest.approx(0.3 + 0.5)
    assert obs.running_frac == pytest.approx((3.0 + 6.0) / 8)


def test_a_look_back_window_holds_off_a_scale_up_on_a_spike_that_just_began() -> None:
    """One replica idle until t=9.5, then 6 long requests: the evaluation at t=10 reads 6 ongoing and
    asks for 3 replicas at once; with a 10-s window sampled every second it sees their mean over
    (0, 10], 0.6, and waits until t=20, when the window is full of them."""
    base = dict(min_replicas=1, max_replicas=4, target_ongoing_requests=2.0, tolerance=0.0, interval_s=10.0,
                upscale_delay_s=0.0, downscale_delay_s=1e6, startup_delay_s=1.0)
    reqs = [_req(i, 9.5, 40) for i in range(6)]
    instant = _sim(AutoscalingSpec(**base), slots=4)  # type: ignore[arg-type]
    instant.run([_req(r.request_id, r.arrival_s, r.output_tokens) for r in reqs])
    assert instant.timeline[1] == (10.0, 1, 2, 0)
    averaged = _sim(AutoscalingSpec(**base, look_back_period_s=10.0, metrics_record_interval_s=1.0), slots=4)  # type: ignore[arg-type]
    averaged.run(reqs)
    assert averaged.timeline[1] == (20.0, 1, 2, 0)


def test_a_replica_restarted_reports_only_its_new_samples() -> None:
    spec = AutoscalingSpec(target_ongoing_requests=2.0, look_back_period_s=30.0).resolved(4)
    sim = _sim(spec, slots=4)
    sim._samples[1].append(ReplicaSample(0.0, 50, 0, 0.0, 0))
    sim._start(1)
    assert not sim._samples[1]


def test_unset_keys_keep_the_hash_and_set_ones_change_it() -> None:
    scaled = load_scenario(SCENARIO, AUTOSCALED)
    for key, value in (("look_back_period_s", 30.0), ("upscaling_factor", 0.5), ("downscaling_factor", 0.5)):
        assert load_scenario(SCENARIO, {**AUTOSCALED, f"autoscaling.{key}": value}).scenario_hash() \
            != scaled.scenario_hash()
    assert scaled.autoscaling is not None and scaled.autoscaling.look_back_period_s is None


@pytest.mark.parametrize(("overrides", "key"), [
    ({"autoscaling.look_back_period_s": 0.0}, "autoscaling.look_back_period_s"),
    ({"autoscaling.look_back_period_s": float("inf")}, "autoscaling.look_back_period_s"),
    ({"autoscaling.metrics_record_interval_s": 1.0}, "autoscaling.metrics_record_interval_s"),  # no window
    ({"autoscaling.look_back_period_s": 30.0, "autoscaling.metrics_record_interval_s": 0.01},
     "autoscaling.metrics_record_interval_s"),
    ({"autoscaling.upscaling_factor": 0.0}, "autoscaling.upscaling_factor"),
    ({"autoscaling.downscaling_factor": -0.5}, "autoscaling.downscaling_factor"),
])
def test_bad_ray_serve_keys_name_file_key_and_rule(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(SCENARIO, {**AUTOSCALED, **overrides})
    assert info.value.key == key
    assert "llama3_8b-h100.toml" in info.value.source and info.value.rule
