"""Scoring by hand, budgeted row selection, the host fit with an injected evaluator, the report section."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pytest

from sim.api import load_engine_profile
from sim.calibration.report import replace_section
from sim.perf.profile import EngineProfile
from sim.validation.budget import CostModel, expected_wall_s, select_rows, work_of
from sim.validation.fit import fit_host, loss, row_loss
from sim.validation.report import HEADING, carry_analysis
from sim.validation.rows import EvalRowRefused, Replay, ValidationRow
from sim.validation.runner import RowResult
from sim.validation.score import ape, metric_stats, score_groups


def _row(rid: str, *, suite: str = "dev", source: str = "aiconfigurator", n: int = 10, osl: int = 100,
         conc: int = 5, measured: dict[str, float] | None = None, skip: str | None = None) -> ValidationRow:
    model = "meta-llama/Llama-3.1-70B" if suite == "eval" else "Qwen/Qwen3-32B"
    sections = None if skip else {
        "engine": {"max_num_batched_tokens": 1000},
        "workload": {"random_input_len": 500, "random_output_len": osl, "seed": sum(map(ord, rid))}}
    return ValidationRow(row_id=rid, source=source, suite=suite, model=model,  # type: ignore[arg-type]
                         hardware="h100_sxm", backend="vllm", backend_version="0", label=rid,
                         measured=measured or {"ttft_mean_s": 1.0, "tpot_mean_s": 0.1},
                         sections=sections, skip_reason=skip,
                         replay=None if skip else Replay(kind="closed_loop", num_requests=n, concurrency=conc))


def test_ape_and_stats_by_hand() -> None:
    assert ape(1.2, 1.0) == pytest.approx(0.2)
    assert math.isnan(ape(1.0, 0.0))
    s = metric_stats([(1.1, 1.0), (0.5, 1.0), (2.0, 1.0), (math.nan, 1.0)])
    assert s.n == 3
    assert s.median_ape == pytest.approx(0.5)
    assert s.p90_ape == pytest.approx(0.5 + 0.8 * 0.5)
    assert s.median_signed == pytest.approx(0.1)


def test_score_groups_counts_scored_skipped_deferred() -> None:
    rows = [_row("a"), _row("b"), _row("c", skip="MLA"), _row("d")]
    results = [RowResult(row_id="a", tier="cross-generation", status="scored",
                         predicted={"ttft_mean_s": 1.5, "tpot_mean_s": 0.1}),
               RowResult(row_id="b", tier="cross-generation", status="scored",
                         predicted={"ttft_mean_s": 0.5, "tpot_mean_s": 0.12})]
    (g_aic, g_all) = [g for g in score_groups(rows, results, tiers=["cross-generation"], deferred={"d": "budget"})
                      if g.source in ("aiconfigurator", "all")]
    for g in (g_aic, g_all):
        assert (g.rows_scored, g.rows_skipped, g.rows_deferred) == (2, 1, 1)
        assert g.metrics["ttft"].median_ape == pytest.approx(0.5)
        assert g.metrics["tpot"].median_ape == pytest.approx(0.1)


def test_work_of_closed_loop() -> None:
    steps, request_steps = work_of(_row("a", n=10, osl=100, conc=5))
    assert request_steps == 10 * 100
    assert steps == pytest.approx(10 * 100 / 5 + 10 * 500 / 1000)


def test_request_by_request_backends_pay_their_own_rate_per_running_request() -> None:
    cost = CostModel(per_step_s=1e-3, per_request_step_s=1e-6, per_plain_request_step_s=1e-5,
                     request_by_request=frozenset({"sglang"}))
    vllm = _row("a", n=10, osl=100, conc=5)  # 205 steps, 1,000 request-steps
    sglang = dataclasses.replace(vllm, backend="sglang")
    assert cost.estimate_s(vllm) == pytest.approx(205e-3 + 1000e-6)
    assert cost.estimate_s(sglang) == pytest.approx(205e-3 + 1000e-5)


def test_interval_runs_multiply_the_cost_of_every_row() -> None:
    """`validate --intervals K`: a row costs K + 1 simulations, aggregated or disaggregated (whose
    perturbed runs perturb each pool's kernel model)."""
    cost = CostModel(per_step_s=1e-3, per_request_step_s=1e-6).with_interval_runs(8)
    agg = _row("a", n=10, osl=100, conc=5)
    assert agg.sections is not None
    disagg = dataclasses.replace(agg, sections={**agg.sections, "disaggregation": {}})
    assert cost.estimate_s(agg) == pytest.approx(9 * (205e-3 + 1000e-6))
    assert cost.estimate_s(disagg) == pytest.approx(9 * (205e-3 + 1000e-6))


def test_select_rows_respects_the_budget_weights_eval_groups_and_is_deterministic() -> None:
    cost = CostModel(per_step_s=0.0, per_request_step_s=1e-3)  # a row of 10 x 100 costs 1 s
    rows = ([_row(f"dev{i}") for i in range(10)] + [_row(f"ev{i}", suite="eval") for i in range(10)]
            + [_row("big", osl=100_000)])
    tiers = {r.row_id: 1 for r in rows}
    chosen, deferred = select_rows(rows, tiers_per_row=tiers, cost=cost, budget_s=3, jobs=2, max_row_s=100)
    assert len(chosen) == 6
    assert sum(r.suite == "eval" for r in chosen) == 4  # an eval group weighs two dev groups
    assert "per-row cap" in deferred["big"]
    assert len(deferred) == len(rows) - 6
    again, _ = select_rows(list(reversed(rows)), tiers_per_row=tiers, cost=cost, budget_s=3, jobs=2, max_row_s=100)
    assert {r.row_id for r in again} == {r.row_id for r in chosen}
    everything, none = select_rows(rows, tiers_per_row=tiers, cost=cost, budget_s=0, jobs=2, max_row_s=100)
    assert len(everything) == len(rows) and not none


def test_a_row_that_repeats_a_chosen_rows_simulation_costs_no_budget() -> None:
    cost = CostModel(per_step_s=0.0, per_request_step_s=1e-3)  # a row of 10 x 100 costs 1 s
    rows = [_row(f"dev{i}") for i in range(4)]
    twins = [dataclasses.replace(r, row_id=r.row_id + "-again", label=r.row_id + "-again") for r in rows]
    assert twins[0].simulation_key == rows[0].simulation_key != rows[1].simulation_key
    tiers = {r.row_id: 1 for r in rows + twins}
    chosen, deferred = select_rows(rows + twins, tiers_per_row=tiers, cost=cost, budget_s=1, jobs=2,
                                   max_row_s=100)
    # 2 s buys two simulations; each chosen row brings its twin along for free.
    assert len(chosen) == 4 and len(deferred) == 4
    assert {r.simulation_key for r in chosen} == {r.simulation_key for r in chosen if not r.row_id.endswith("again")}
    assert expected_wall_s(chosen, tiers, cost, jobs=2) == expected_wall_s(
        [r for r in chosen if not r.row_id.endswith("again")], tiers, cost, jobs=2) == 1.0


def test_fit_finds_the_host_numbers_of_a_synthetic_engine() -> None:
    """Fake engine: TPOT = 10 ms + base_s + 64 x per_seq_s; the truth is base 400 us, per-seq 2 us."""
    truth = 0.010 + 400e-6 + 64 * 2e-6
    rows = [_row(f"r{i}", measured={"tpot_mean_s": truth}) for i in range(3)]

    def evaluate(profile: EngineProfile, rs: Sequence[ValidationRow]) -> list[RowResult]:
        c = profile.host.schedule
        tpot = 0.010 + c.base_s + 64 * c.per_item_s
        return [RowResult(row_id=r.row_id, tier="t", status="scored", predicted={"tpot_mean_s": tpot}) for r in rs]

    fitted = fit_host(load_engine_profile("vllm"), rows, evaluate, data_sha256="x")
    assert fitted.params["base_s"] == pytest.approx(400e-6)
    assert fitted.params["per_seq_s"] == pytest.approx(2e-6)
    assert fitted.loss_after == pytest.approx(0.0, abs=1e-9)
    assert fitted.profile.fit is not None and fitted.profile.fit.suite == "dev"
    assert fitted.profile.fit.num_rows == 3


def test_fit_refuses_evaluation_rows() -> None:
    rows = [_row("a"), _row("e", suite="eval")]
    with pytest.raises(EvalRowRefused):
        fit_host(load_engine_profile("vllm"), rows, lambda p, rs: [], data_sha256="x")


def test_row_loss_clips_and_averages() -> None:
    row = _row("a", measured={"ttft_mean_s": 1.0, "tpot_mean_s": 0.1})
    res = RowResult(row_id="a", tier="t", status="scored", predicted={"ttft_mean_s": math.e, "tpot_mean_s": 100.0})
    assert row_loss(row, res) == pytest.approx((1.0 + 1.0) / 2)
    assert loss([row], [dataclasses.replace(res, status="failed")]) == math.inf


def test_regenerating_the_section_keeps_other_sections_and_the_hand_written_analysis() -> None:
    old = ("# Accuracy\n\n## Kernels\n\nkernel table\n\n" + HEADING + "\n\nold numbers\n\n### Analysis\n\n"
           "people wrote this\n\n### Skipped\n\nold list\n\n## Later\n\nkeep me\n")
    analysis = carry_analysis(old)
    assert analysis == "### Analysis\n\npeople wrote this\n"
    new = replace_section(old, HEADING, HEADING + "\n\nnew numbers\n\n" + analysis)
    assert "kernel table" in new and "keep me" in new and "people wrote this" in new
    assert "old numbers" not in new and "old list" not in new


def test_fit_reports_host_numbers_it_cannot_identify() -> None:
    """An engine whose CPU work never shows (overlap scheduling): every candidate scores the same."""
    rows = [_row("r", measured={"tpot_mean_s": 0.02})]

    def evaluate(profile: EngineProfile, rs: Sequence[ValidationRow]) -> list[RowResult]:
        return [RowResult(row_id=r.row_id, tier="t", status="scored", predicted={"tpot_mean_s": 0.03}) for r in rs]

    fitted = fit_host(load_engine_profile("sglang"), rows, evaluate, data_sha256="x")
    assert fitted.num_evaluations <= 4
    assert fitted.profile.fit is not None and "not identifiable" in fitted.profile.fit.metrics


def test_the_report_says_whether_every_row_or_a_budgeted_sample_was_simulated() -> None:
    from sim.validation.report import _budget_paragraph

    cost = {"per_step_s": 47e-6, "per_request_step_s": 0.15e-6, "per_plain_request_step_s": 0.15e-6,
            "request_by_request": ["sglang"]}
    results = [RowResult(row_id="a", tier="t", status="scored"),
               RowResult(row_id="b", tier="t", status="scored", same_simulation_as="a"),
               RowResult(row_id="c", tier="t", status="skipped", reason="no calibration")]
    every = _budget_paragraph({"budget_s": 0.0, "max_row_s": 0.0, "cost_model": cost}, results)
    assert every.startswith("No time budget (the default): every simulable row is simulated")
    assert "deferred, never dropped" not in every
    assert "1 of the 2 row x tier results repeat another row's simulation" in every
    sample = _budget_paragraph({"budget_s": 600.0, "max_row_s": 60.0, "cost_model": cost}, results)
    assert sample.startswith("Time budget: 600 s of estimated simulation per worker (cost model 47.0 us per step")
    assert "per-row cap 60 s" in sample and "without a budget simulates all of them" in sample
