"""The API server's latency outside the engine: added to first-token and finish times as the client
sees them, nothing else; the profile's fitted value unless the scenario sets its own; offline
validation rows carry none; the fit recovers a synthetic engine's latency from one simulation."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from conftest import REPO, scenario_dict

from sim.api import load_engine_profile, load_scenario, simulate
from sim.errors import ConfigError
from sim.specs.scenario import Scenario, scenario_from_dict
from sim.validation.engine_args import OFFLINE
from sim.validation.fit import fit_api_latency, served_rows, set_api_latency
from sim.validation.rows import EvalRowRefused, Replay, ValidationRow
from sim.validation.runner import RowResult


def _scenario(**engine: Any) -> Scenario:
    return scenario_from_dict(scenario_dict(
        engine={"backend": "vllm", **engine},
        workload={"num_prompts": 40, "request_rate": 20.0, "random_input_len": 512, "random_output_len": 32}),
        source="t.toml")


def test_latency_moves_first_token_and_finish_and_nothing_in_the_engine() -> None:
    engine_only = simulate(_scenario(api_server_latency_s=0.0))
    served = simulate(_scenario(api_server_latency_s=0.05))
    assert served.summary.num_steps == engine_only.summary.num_steps
    assert served.breakdown == engine_only.breakdown
    for a, b in zip(engine_only.records, served.records, strict=True):
        assert (b.request_id, b.arrival_s, b.first_scheduled_s) == (a.request_id, a.arrival_s, a.first_scheduled_s)
        assert b.first_token_s == pytest.approx(a.first_token_s + 0.05, abs=1e-12)
        assert b.finish_s == pytest.approx(a.finish_s + 0.05, abs=1e-12)
    assert served.summary.ttft_mean_s == pytest.approx(engine_only.summary.ttft_mean_s + 0.05, abs=1e-12)
    assert served.summary.tpot_mean_s == pytest.approx(engine_only.summary.tpot_mean_s, rel=1e-12)
    assert served.summary.itl_mean_s == pytest.approx(engine_only.summary.itl_mean_s, rel=1e-12)


def test_a_closed_loop_client_sends_as_the_engine_finishes() -> None:
    """max_concurrency = 1: the engine's dynamics are those without a latency (the next request
    reaches the engine as the previous one finishes there); the records' first-token and finish
    times are the client's, one latency later."""
    def run(latency: float) -> Any:
        return simulate(scenario_from_dict(scenario_dict(
            engine={"api_server_latency_s": latency},
            workload={"num_prompts": 12, "max_concurrency": 1, "random_input_len": 256, "random_output_len": 16}),
            source="t.toml"))

    served, engine_only = run(0.05), run(0.0)
    for a, b in zip(engine_only.records, served.records, strict=True):
        assert b.arrival_s == a.arrival_s and b.first_scheduled_s == a.first_scheduled_s
        assert b.finish_s == pytest.approx(a.finish_s + 0.05, abs=1e-12)
    records = sorted(served.records, key=lambda r: r.arrival_s)
    for prev, nxt in itertools.pairwise(records):
        assert nxt.arrival_s == pytest.approx(prev.finish_s - 0.05, abs=1e-12)


def test_the_profile_value_applies_unless_the_scenario_sets_one() -> None:
    fitted = load_engine_profile("vllm").host.api_server_latency_s
    assert fitted > 0
    default = simulate(_scenario())
    engine_only = simulate(_scenario(api_server_latency_s=0.0))
    assert default.summary.ttft_mean_s == pytest.approx(engine_only.summary.ttft_mean_s + fitted, abs=1e-12)
    with pytest.raises(ConfigError, match="api_server_latency_s"):
        _scenario(api_server_latency_s=-0.01)


def test_an_autoscaled_fleet_pays_for_the_engine_time_only() -> None:
    path = str(REPO / "scenarios" / "llama3_8b-h100.toml")
    over = {"autoscaling.target_ongoing_requests": 4.0, "workload.num_prompts": 60}
    a = simulate(load_scenario(path, {**over, "engine.api_server_latency_s": 0.0}))
    b = simulate(load_scenario(path, {**over, "engine.api_server_latency_s": 0.2}))
    assert a.autoscaling is not None and b.autoscaling is not None
    assert b.autoscaling.gpu_hours == pytest.approx(a.autoscaling.gpu_hours, rel=1e-9)
    assert b.summary.ttft_mean_s == pytest.approx(a.summary.ttft_mean_s + 0.2, abs=1e-9)


def test_a_pool_may_not_set_its_own_latency() -> None:
    data = scenario_dict()
    data["disaggregation"] = {"prefill": {"num_workers": 1},
                              "decode": {"num_workers": 1, "engine": {"api_server_latency_s": 0.5}}}
    with pytest.raises(ConfigError, match=r"disaggregation\.decode\.engine\.api_server_latency_s"):
        scenario_from_dict(data, source="t.toml")


def test_a_disaggregated_request_pays_the_latency_once() -> None:
    def run(latency: float) -> Any:
        data = scenario_dict(engine={"api_server_latency_s": latency},
                             workload={"num_prompts": 20, "request_rate": 10.0, "random_input_len": 256,
                                       "random_output_len": 16})
        data["disaggregation"] = {"prefill": {"num_workers": 1}, "decode": {"num_workers": 1}}
        return simulate(scenario_from_dict(data, source="t.toml"))

    a, b = run(0.0), run(0.03)
    assert b.summary.ttft_mean_s == pytest.approx(a.summary.ttft_mean_s + 0.03, abs=1e-12)
    assert b.summary.e2el_mean_s == pytest.approx(a.summary.e2el_mean_s + 0.03, abs=1e-12)
    assert (a.api_server_latency_s, b.api_server_latency_s) == (0.0, 0.03)
    # Pool utilisation is busy engine time over the engine's span, whatever the client's latency.
    for pa, pb in zip(a.pools, b.pools, strict=True):
        assert pb.utilization_frac == pytest.approx(pa.utilization_frac, rel=1e-9)


def _row(rid: str, ttft_s: float, *, suite: str = "dev", offline: bool = False) -> ValidationRow:
    engine: dict[str, Any] = {"max_num_batched_tokens": 1000, **(OFFLINE if offline else {})}
    return ValidationRow(row_id=rid, source="aiconfigurator", suite=suite,  # type: ignore[arg-type]
                         model="Qwen/Qwen3-32B" if suite == "dev" else "meta-llama/Llama-3.1-70B",
                         hardware="h100_sxm", backend="vllm", backend_version="0", label=rid,
                         measured={"ttft_mean_s": ttft_s}, sections={"engine": engine, "workload": {}},
                         replay=Replay(kind="closed_loop", num_requests=10, concurrency=2))


def _result(rid: str, ttft_s: float) -> RowResult:
    return RowResult(row_id=rid, tier="cross-generation", status="scored", predicted={"ttft_mean_s": ttft_s})


def test_the_fit_recovers_a_synthetic_servers_latency_from_one_simulation() -> None:
    """Measured TTFT = engine TTFT + 35 ms on every served row; the rows were simulated with 20 ms."""
    engine_s = [0.05, 0.2, 0.8, 0.12]
    rows = [_row(f"r{i}", t + 0.035) for i, t in enumerate(engine_s)]
    offline = _row("bench", 9.0, offline=True)  # no server in its latencies: ignored by the fit
    results = [_result(f"r{i}", t + 0.020) for i, t in enumerate(engine_s)] + [_result("bench", 0.1)]
    assert served_rows([*rows, offline]) == rows
    latency, how = fit_api_latency([*rows, offline], results, simulated_with_s=0.020)
    assert latency == pytest.approx(0.035)
    assert "4 dev rows" in how and "at 35 ms" in how
    with pytest.raises(EvalRowRefused):
        fit_api_latency([*rows, _row("e", 0.1, suite="eval")], results, simulated_with_s=0.0)


def test_a_refitted_latency_rewrites_only_its_two_keys_of_the_profile() -> None:
    """`validate --fit-api-latency` keeps every other line of a shipped profile, comments included."""
    import tomllib

    text = (REPO / "sim" / "data" / "host" / "sglang.toml").read_text()
    new = set_api_latency(text, 0.03, 'fitted "here" \\ on dev rows')
    assert tomllib.loads(new)["api_server_latency_s"] == 0.03
    assert tomllib.loads(new)["api_server_latency_fit"] == 'fitted "here" \\ on dev rows'
    keys = ("api_server_latency_s =", "api_server_latency_fit =")
    assert [ln for ln in new.splitlines() if not ln.startswith(keys)] == \
        [ln for ln in text.splitlines() if not ln.startswith(keys)]
    bare = "\n".join(ln for ln in text.splitlines() if not ln.startswith(keys)) + "\n"
    assert tomllib.loads(set_api_latency(bare, 0.01, "x"))["api_server_latency_s"] == 0.01
