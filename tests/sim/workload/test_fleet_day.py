"""Fleet-day workloads: rate profiles (diurnal, CSV), bursts, traffic classes, their checks and metrics."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from sim.api import load_scenario, simulate
from sim.errors import ConfigError
from sim.specs.traffic import Burst, TrafficClass
from sim.specs.workload import WorkloadSpec, length_bounds
from sim.workload.generate import generate, generate_fleet
from sim.workload.profile import last_bin_s, profile_arrivals_s, rate_per_s

SCENARIO = str(REPO / "scenarios" / "llama3_8b-h100.toml")


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def _diurnal(**kw: object) -> WorkloadSpec:
    args: dict[str, object] = {"num_prompts": 10_000_000, "request_rate_profile": "diurnal",
                               "diurnal_peak_rate": 1.5, "diurnal_trough_rate": 0.5, **kw}
    return WorkloadSpec(**args)  # type: ignore[arg-type]


def test_diurnal_profile_integrates_to_the_expected_day_and_peaks_at_its_hour() -> None:
    rates = rate_per_s(_diurnal())
    assert rates.size == 86_400
    assert rates.sum() == pytest.approx((1.5 + 0.5) / 2 * 86_400, rel=1e-12)
    assert rates[14 * 3600] == pytest.approx(1.5, abs=1e-6) and rates[2 * 3600] == pytest.approx(0.5, abs=1e-6)
    arrivals = profile_arrivals_s(rates, 10_000_000, 1.0, _rng())
    assert abs(arrivals.size - 86_400) < 4 * math.sqrt(86_400)  # Poisson count, mean = integral
    assert np.all(np.diff(arrivals) >= 0) and arrivals[-1] <= 86_400
    # the hour around the peak holds ~3x the requests of the hour around the trough
    peak = np.sum((arrivals >= 13.5 * 3600) & (arrivals < 14.5 * 3600))
    trough = np.sum((arrivals >= 1.5 * 3600) & (arrivals < 2.5 * 3600))
    assert 2.6 < peak / trough < 3.4


def test_csv_profile_and_a_burst_shape_the_rate(tmp_path: Path) -> None:
    path = tmp_path / "rates.csv"
    path.write_text("minute,requests_per_min\n0,600\n1,0\n2,1200\n")
    spec = WorkloadSpec(num_prompts=100_000, request_rate_profile=str(path),
                        bursts=(Burst(start_s=150.0, duration_s=10.0, rate_factor=4.0),))
    rates = rate_per_s(spec)
    assert rates.size == 180
    assert np.all(rates[:60] == 10.0) and np.all(rates[60:120] == 0.0) and np.all(rates[120:150] == 20.0)
    assert np.all(rates[150:160] == 80.0) and np.all(rates[160:] == 20.0)
    arrivals = profile_arrivals_s(rates, 100_000, 1.0, _rng(3))
    assert not np.any((arrivals >= 60) & (arrivals < 120))  # a minute without requests gets none
    expected = 600 + 1200 + 10 * 60
    assert abs(arrivals.size - expected) < 4 * math.sqrt(expected)
    assert profile_arrivals_s(rates, 50, 1.0, _rng(3)).tolist() == arrivals[:50].tolist()  # the cap cuts the end


def test_class_mix_follows_the_shares_and_each_class_its_lengths() -> None:
    classes = (TrafficClass(name="chat", share=7, input_len=100, output_len=50, range_ratio=0.5),
               TrafficClass(name="rag", share=2, input_len=4000, output_len=20),
               TrafficClass(name="batch", share=1, input_len=300, output_len=900))
    spec = WorkloadSpec(num_prompts=20_000, request_rate=50.0, classes=classes)
    requests, ids = generate_fleet(spec, _rng())
    assert len(requests) == 20_000
    assert np.bincount(ids) / ids.size == pytest.approx([0.7, 0.2, 0.1], abs=0.01)
    prompt = np.array([r.prompt_tokens for r in requests])
    output = np.array([r.output_tokens for r in requests])
    assert prompt[ids == 0].min() >= 50 and prompt[ids == 0].max() <= 150
    assert np.all(prompt[ids == 1] == 4000) and np.all(output[ids == 2] == 900)
    assert generate(spec, _rng()) == requests


def test_per_class_metrics_use_each_class_slo() -> None:
    classes = [{"name": "strict", "share": 1.0, "input_len": 128, "output_len": 8, "ttft_s": 1e-9},
               {"name": "loose", "share": 1.0, "input_len": 128, "output_len": 8, "ttft_s": 100.0, "tpot_s": 100.0}]
    scenario = load_scenario(SCENARIO, {"workload.num_prompts": 40, "workload.request_rate": 5.0,
                                        "workload.classes": classes})
    result = simulate(scenario)
    by_name = {c.name: c for c in result.classes}
    assert sum(c.num_requests for c in result.classes) == 40
    assert by_name["strict"].goodput_frac == 0.0 and by_name["loose"].goodput_frac == 1.0
    assert by_name["strict"].slo.tpot_s == 0.05  # unset: the scenario's [slo]
    assert simulate(scenario, max_requests=10).classes[0].num_requests + \
        simulate(scenario, max_requests=10).classes[1].num_requests == 10


def test_existing_scenarios_keep_their_hash() -> None:
    # The hash of e8e4259 (before fleet-day, speculation, batch waiting and EPLB keys) with two
    # deliberate changes since: the H100 datasheet gained its [nvlink] facts, which price collectives,
    # and `async_scheduling` left unset is the engine's default (0.6.4), no longer `false`: a run that
    # sets `false` keeps the old results, and must not share a cached result with one that leaves it unset.
    assert load_scenario(SCENARIO).scenario_hash() == \
        "e7d93abd3810870637b10c1b1dcded1ffe0648d9ddd1ee3d9a0c1c5368ff7dde"


@pytest.mark.parametrize(("overrides", "key"), [
    ({"workload.request_rate_profile": "diurnal", "workload.diurnal_peak_rate": 2.0,
      "workload.diurnal_trough_rate": 1.0}, "workload.request_rate"),  # request_rate is set as well
    ({"workload.request_rate": math.inf, "workload.request_rate_profile": "diurnal",
      "workload.diurnal_peak_rate": 2.0}, "workload.diurnal_trough_rate"),
    ({"workload.request_rate": math.inf, "workload.request_rate_profile": "weekly"}, "workload.request_rate_profile"),
    ({"workload.request_rate": math.inf, "workload.request_rate_profile": "diurnal",
      "workload.diurnal_peak_rate": 1.0, "workload.diurnal_trough_rate": 2.0}, "workload.diurnal_peak_rate"),
    ({"workload.diurnal_peak_rate": 1.0}, "workload.diurnal_peak_rate"),
    ({"workload.bursts": [{"start_s": 0.0, "duration_s": 5.0, "rate_factor": 2.0}]}, "workload.bursts"),
    ({"workload.classes": [{"name": "a", "share": 0.0, "input_len": 1, "output_len": 1}]},
     "workload.classes[0].share"),
    ({"workload.classes": [{"name": "a", "share": 1.0, "input_len": 1, "output_len": 1, "slo": 1}]},
     "workload.classes[0].slo"),
    ({"workload.classes": [{"name": "a", "share": 1.0, "input_len": 1, "output_len": 1},
                           {"name": "a", "share": 1.0, "input_len": 1, "output_len": 1}]}, "workload.classes"),
    # Shares whose sum overflows (a traceback in the class draw), a burst after a diurnal day's end (ignored).
    ({"workload.classes": [{"name": "a", "share": 1e308, "input_len": 1, "output_len": 1},
                           {"name": "b", "share": 1e308, "input_len": 1, "output_len": 1}]}, "workload.classes"),
    ({"workload.request_rate": math.inf, "workload.request_rate_profile": "diurnal",
      "workload.diurnal_peak_rate": 2.0, "workload.diurnal_trough_rate": 1.0,
      "workload.bursts": [{"start_s": 90000.0, "duration_s": 5.0, "rate_factor": 2.0}]}, "workload.bursts"),
])
def test_bad_fleet_day_keys_name_file_key_and_rule(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(SCENARIO, overrides)
    assert info.value.key == key
    assert "llama3_8b-h100.toml" in info.value.source


@pytest.mark.parametrize(("minutes", "burst_s", "key"), [(10_081, None, "requests_per_min"), (10, 600.0, "bursts")])
def test_a_rate_csv_past_a_week_or_a_burst_past_its_end_is_refused(tmp_path: Path, minutes: int,
                                                                    burst_s: float | None, key: str) -> None:
    path = tmp_path / "rates.csv"
    path.write_text("requests_per_min\n" + "60\n" * minutes)
    overrides: dict[str, object] = {"workload.request_rate": math.inf, "workload.request_rate_profile": str(path)}
    if burst_s is not None:
        overrides["workload.bursts"] = [{"start_s": burst_s, "duration_s": 5.0, "rate_factor": 2.0}]
    with pytest.raises(ConfigError) as info:
        simulate(load_scenario(SCENARIO, overrides))
    assert info.value.source == str(path) and info.value.key == key
    # A duration that cuts the profile short may leave its bursts (and minutes) after it.
    assert simulate(load_scenario(SCENARIO, {**overrides, "workload.profile_duration_s": 120.0,
                                             "workload.num_prompts": 5})).summary.num_requests > 0


def test_a_bad_csv_row_is_named(tmp_path: Path) -> None:
    path = tmp_path / "rates.csv"
    path.write_text("requests_per_min\n10\n-3\n")
    scenario = load_scenario(SCENARIO, {"workload.request_rate": math.inf, "workload.request_rate_profile": str(path)})
    with pytest.raises(ConfigError) as info:
        simulate(scenario)
    assert info.value.source == f"{path} row 3" and info.value.key == "requests_per_min"


def test_later_keys_change_the_hash_only_away_from_their_defaults() -> None:
    base = load_scenario(SCENARIO)
    same = base.with_overrides({"engine.enable_eplb": False, "engine.num_redundant_experts": 0,
                                "engine.batch_wait_timeout_iters": 0, "workload.bursts": []})
    assert same.scenario_hash() == base.scenario_hash()
    trt = base.with_overrides({"engine.backend": "trtllm"})
    waited = trt.with_overrides({"engine.batch_wait_timeout_iters": 20, "engine.batch_wait_max_tokens_ratio": 0.9})
    assert waited.scenario_hash() != trt.scenario_hash()


def test_a_fractional_duration_ends_the_profile_inside_its_last_second() -> None:
    """profile_duration_s = 100.5: no arrival after 100.5 s, and the last half second holds about
    half a second's requests (before 0.6.2 the profile ran to 101 s at the full rate)."""
    spec = _diurnal(profile_duration_s=100.5, diurnal_peak_rate=400.0, diurnal_trough_rate=400.0)
    assert last_bin_s(spec) == 0.5 and last_bin_s(_diurnal(profile_duration_s=100.0)) == 1.0
    arrivals = profile_arrivals_s(rate_per_s(spec), 10_000_000, 1.0, _rng(), last_bin=last_bin_s(spec))
    assert arrivals.max() <= 100.5
    last = int(np.sum(arrivals >= 100.0))
    assert abs(last - 200) < 4 * math.sqrt(200)
    specs, _ = generate_fleet(spec, _rng())
    assert max(s.arrival_s for s in specs) <= 100.5
    # A whole number of seconds draws exactly as before.
    whole = _diurnal(profile_duration_s=100.0)
    assert profile_arrivals_s(rate_per_s(whole), 10_000_000, 1.0, _rng(), last_bin=last_bin_s(whole)).tolist() \
        == profile_arrivals_s(rate_per_s(whole), 10_000_000, 1.0, _rng()).tolist()


@pytest.mark.parametrize("text,where,key", [
    ("minute,requests_per_min\n0,600\n\n2,1200\n", "line 3", "requests_per_min"),
    ("minute,requests_per_min\n0,600\n2,1200\n", "row 3", "minute"),
])
def test_a_rate_csv_with_a_missing_minute_is_refused(tmp_path: Path, text: str, where: str, key: str) -> None:
    """One row a minute: a blank line or a gap in the `minute` column would shift every later minute."""
    path = tmp_path / "rates.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        rate_per_s(WorkloadSpec(num_prompts=100, request_rate_profile=str(path)))
    assert where in err.value.source and err.value.key == key


def test_a_rate_csv_may_end_with_blank_lines_and_go_without_minutes(tmp_path: Path) -> None:
    path = tmp_path / "rates.csv"
    path.write_text("requests_per_min\n600\n1200\n\n")
    assert rate_per_s(WorkloadSpec(num_prompts=100, request_rate_profile=str(path))).size == 120


def test_a_rate_csv_with_a_column_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rates.csv"
    path.write_text("requests_per_min,requests_per_min\n600,1\n")
    with pytest.raises(ConfigError, match="appears twice"):
        rate_per_s(WorkloadSpec(num_prompts=100, request_rate_profile=str(path)))


def test_a_class_too_long_for_max_model_len_is_named_by_its_own_keys() -> None:
    """The error names the class's key (the random_* lengths do not apply to class traffic)."""
    classes = [{"name": "chat", "share": 0.5, "input_len": 100, "output_len": 10},
               {"name": "rag", "share": 0.5, "input_len": 9000, "output_len": 10}]
    with pytest.raises(ConfigError) as err:
        load_scenario(SCENARIO, {"workload.request_rate_profile": "diurnal", "workload.request_rate": None,
                                 "workload.diurnal_peak_rate": 1.0, "workload.diurnal_trough_rate": 0.5,
                                 "workload.classes": classes})
    assert err.value.key == "workload.classes[1].input_len" and err.value.value == 9000


@pytest.mark.parametrize("burstiness", [math.inf, 1.0])
def test_a_profile_ending_in_zero_rate_seconds_keeps_arrivals_finite(burstiness: float) -> None:
    # 30 requests in the first minute, none in the second: evenly spaced unit times reach the
    # total (30) exactly, which used to land in the last, zero-rate second and divide by zero.
    rates = np.concatenate([np.full(60, 0.5), np.zeros(60)])
    arrivals = profile_arrivals_s(rates, 10_000, burstiness, _rng())
    assert np.all(np.isfinite(arrivals))
    assert arrivals.max() <= 60.0
    if math.isinf(burstiness):
        assert arrivals.size == 30 and arrivals[-1] == pytest.approx(60.0)


@pytest.mark.parametrize(("seconds", "rate", "expected"), [(100, 0.1, 10), (86_400, 0.3, 25_920), (7, 1 / 3, 2)])
def test_evenly_spaced_arrivals_keep_the_last_request_the_rates_round_away(seconds: int, rate: float,
                                                                            expected: int) -> None:
    # 0.1 req/s sums to 9.99999999999998 over 100 s: the tenth whole unit time lies just past that
    # total, so a strict comparison dropped the profile's last request.
    rates = np.full(seconds, rate)
    arrivals = profile_arrivals_s(rates, 10_000_000, math.inf, _rng())
    assert arrivals.size == expected
    assert arrivals[-1] <= seconds and np.all(np.diff(arrivals) > 0)


def test_a_rate_profile_draws_the_random_lengths_as_a_fixed_rate_does() -> None:
    """Without classes a profile's requests take the `random_*` lengths vLLM's RandomDataset draws: the
    sampled part may be empty behind a shared prefix (it was raised to 1 token: 16 + {1, 2}, not
    16 + {0, 1, 2}), and a workload that could draw an empty prompt is refused as with a fixed rate."""
    lengths = {"random_input_len": 1, "random_range_ratio": 0.5, "random_output_len": 4}
    spec = _diurnal(num_prompts=3_000, random_prefix_len=16, **lengths)
    prompts = {r.prompt_tokens for r in generate(spec, _rng())}
    assert prompts == {16 + k for k in range(length_bounds(1, 0.5, min_tokens=0)[1] + 1)} == {16, 17, 18}
    with pytest.raises(ConfigError) as info:
        generate(_diurnal(num_prompts=3_000, **lengths), _rng())
    assert info.value.key == "random_input_len"
    overrides = {"workload.request_rate": math.inf, "workload.request_rate_profile": "diurnal",
                 "workload.diurnal_peak_rate": 2.0, "workload.diurnal_trough_rate": 1.0,
                 **{f"workload.{k}": v for k, v in lengths.items()}}
    with pytest.raises(ConfigError) as load_info:
        load_scenario(SCENARIO, overrides)
    assert load_info.value.key == "workload.random_input_len"
