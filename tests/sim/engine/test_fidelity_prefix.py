"""`simulate(max_requests=k)`: the first k requests of the same seeded workload, not a k-request workload."""

from __future__ import annotations

from conftest import REPO

from sim.api import load_scenario, simulate


def test_a_fidelity_prefix_simulates_the_full_workloads_first_requests() -> None:
    scenario = load_scenario(str(REPO / "scenarios" / "llama3_8b-h100.toml"),
                             {"workload.num_prompts": 30, "workload.request_rate": 8.0,
                              "workload.random_range_ratio": 0.5})
    full = simulate(scenario)
    cut = simulate(scenario, max_requests=10)
    fresh = simulate(scenario.with_overrides({"workload.num_prompts": 10}))
    head = sorted(full.records, key=lambda r: r.request_id)[:10]
    got = sorted(cut.records, key=lambda r: r.request_id)
    assert cut.summary.num_requests == 10
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in got] == \
        [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in head]
    # a 10-request workload draws other lengths and arrivals: a prefix is not a smaller workload
    other = sorted(fresh.records, key=lambda r: r.request_id)
    assert [(r.arrival_s, r.prompt_tokens) for r in other] != [(r.arrival_s, r.prompt_tokens) for r in got]
    assert simulate(scenario, max_requests=30).summary == full.summary
