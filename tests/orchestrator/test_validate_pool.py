"""Validate workers share kernel models and priced step parts within a pricing group, with the
results of simulating each row afresh."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.commands_validate import _e2e_dir, _profiles
from orchestrator.validate_pool import pricing_group, run_pool
from sim.validation.budget import work_of
from sim.validation.load import load_rows
from sim.validation.runner import evaluate_row

PREFIX = "aiconfigurator:qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h100_sxm_trtllm_agg_"


def test_rows_of_one_pricing_group_share_prices_and_score_as_if_simulated_alone(tmp_path: Path) -> None:
    rows = [r for r in load_rows(_e2e_dir(None), _profiles()) if r.row_id.startswith(PREFIX) and not r.skipped]
    group = max({pricing_group(r, "cross-generation") for r in rows},
                key=lambda g: sum(pricing_group(r, "cross-generation") == g for r in rows))
    cheap = sorted((r for r in rows if pricing_group(r, "cross-generation") == group), key=lambda r: work_of(r)[1])
    same = [cheap[0], next(r for r in cheap if r.replay and cheap[0].replay
                           and r.replay.concurrency != cheap[0].replay.concurrency), cheap[1]]
    # Rows of different concurrency and lengths, one MoE layout: one pricing group; the tier splits it.
    assert len({r.row_id for r in same}) == 3
    assert pricing_group(same[0], "target-measured") != group
    tasks = [(r, "cross-generation", tmp_path, None, 0) for r in same]
    pooled = run_pool(tasks, jobs=1)  # type: ignore[arg-type]
    alone = [evaluate_row(r, "cross-generation", tmp_path) for r in same]
    assert [r.row_id for r in pooled] == [r.row_id for r in same]
    for a, b in zip(pooled, alone, strict=True):
        assert a.status == "scored"
        assert dataclasses.replace(a, wall_s=0.0) == dataclasses.replace(b, wall_s=0.0)
    # With interval runs the pooled rows share the perturbed models too: the same bounds as alone.
    with_iv = run_pool([(r, "cross-generation", tmp_path, None, 2) for r in same[:2]], jobs=1)
    alone_iv = [evaluate_row(r, "cross-generation", tmp_path, intervals=2) for r in same[:2]]
    for a, b in zip(with_iv, alone_iv, strict=True):
        assert a.interval_runs == 2 and a.bounds
        assert dataclasses.replace(a, wall_s=0.0) == dataclasses.replace(b, wall_s=0.0)


def test_a_row_that_repeats_another_rows_simulation_gets_its_results_copied(tmp_path: Path) -> None:
    rows = [r for r in load_rows(_e2e_dir(None), _profiles()) if r.row_id.startswith(PREFIX) and not r.skipped]
    row = min(rows, key=lambda r: work_of(r)[1])
    twin = dataclasses.replace(row, row_id=row.row_id + "-remeasured", measured={})
    other = next(r for r in rows if r.simulation_key != row.simulation_key and pricing_group(r, "cross-generation")
                 == pricing_group(row, "cross-generation"))
    pooled = run_pool([(r, "cross-generation", tmp_path, None, 0) for r in (row, other, twin)], jobs=1)
    first, second, copied = pooled
    assert copied.same_simulation_as == row.row_id and first.same_simulation_as is None
    assert second.same_simulation_as is None
    alone = evaluate_row(twin, "cross-generation", tmp_path)
    assert dataclasses.replace(copied, wall_s=0.0, same_simulation_as=None) == dataclasses.replace(alone, wall_s=0.0)
