"""The end-to-end widening of run intervals: conformal width by hand, fit per tier and group,
widened bounds, the file round trip, and validate's coverage with it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sim.calibration.e2e_widening import (
    E2EWidening,
    conformal_width,
    fit_widening,
    group_of,
    load_widening,
)
from sim.errors import ConfigError
from sim.validation.rows import Replay, ValidationRow
from sim.validation.runner import RowResult
from sim.validation.score import interval_coverage, interval_samples


def test_conformal_width_is_the_ceil_n_plus_one_order_statistic() -> None:
    scores = [0.1 * i for i in range(-4, 15)]  # n = 19: k = ceil(20 x 0.9) = 18 -> the 18th smallest
    assert conformal_width(scores, 0.9) == pytest.approx(scores[17])
    assert conformal_width([0.3, -0.2, 0.1], 0.9) == pytest.approx(0.3)  # k = 4 > n: the largest
    assert conformal_width([-0.5, -0.4, -0.3, -0.2, -0.1, -0.1, -0.1, -0.1, -0.1], 0.5) == pytest.approx(-0.1)
    assert conformal_width([], 0.9) == 0.0


def test_fit_scores_each_tier_and_group_on_the_log_scale() -> None:
    samples = [("target-measured", "ttft", 1.0, 2.0, 4.0),  # above hi by log 2
               ("target-measured", "ttft", 1.0, 2.0, 1.5),  # inside: max(log(1/1.5), log(1.5/2)) < 0
               ("target-measured", "tpot", 1.0, 1.2, 0.5),  # below lo by log 2
               ("cross-generation", "throughput", 10.0, 20.0, 15.0),
               ("cross-generation", "throughput", 10.0, 20.0, math.nan),  # dropped
               ("cross-generation", "ttft_mean_s", 1.0, 1.0, 0.0)]  # dropped: not positive
    w = fit_widening(samples, nominal=0.9, source="test")
    assert w.log_widths["target-measured"]["ttft"] == pytest.approx(math.log(2))
    assert w.log_widths["target-measured"]["tpot"] == pytest.approx(math.log(2))
    assert w.log_widths["cross-generation"] == {"throughput": pytest.approx(max(math.log(10 / 15), math.log(15 / 20)))}
    assert w.rows == {"cross-generation": {"throughput": 1}, "target-measured": {"tpot": 1, "ttft": 2}}


def test_widen_maps_metrics_to_groups_and_holds_the_point() -> None:
    w = E2EWidening(nominal=0.9, log_widths={"t": {"ttft": math.log(2), "tpot": math.log(3), "throughput": -1.0}})
    assert (group_of("ttft_p90_s"), group_of("itl_mean_s"), group_of("goodput_requests_per_s"),
            group_of("cost_per_million_output_tokens_usd"), group_of("num_steps")) == (
        "ttft", "tpot", "throughput", "throughput", None)
    assert w.widen("t", "ttft_mean_s", 1.0, 0.8, 1.25) == pytest.approx((0.4, 2.5))
    assert w.log_width("t", "e2el_mean_s") == pytest.approx(math.log(3))  # the wider of TTFT and TPOT
    assert w.widen("t", "output_throughput_tokens_per_s", 100.0, 90.0, 110.0) == (100.0, 100.0)  # narrowed to the point
    assert w.widen("other tier", "ttft_mean_s", 1.0, 0.8, 1.25) == (0.8, 1.25)


def test_file_round_trip_and_a_wrong_schema_is_refused(tmp_path: Path) -> None:
    w = fit_widening([("t", "ttft", 1.0, 2.0, 3.0)], source="s", data_sha256={"e2e": "abc"})
    w.save(tmp_path / "w.json")
    assert load_widening(tmp_path / "w.json") == w
    (tmp_path / "bad.json").write_text('{"schema": "other"}')
    with pytest.raises(ConfigError, match="schema"):
        load_widening(tmp_path / "bad.json")


def _row(rid: str, suite: str, ttft: float) -> ValidationRow:
    return ValidationRow(row_id=rid, source="aiconfigurator", suite=suite, model="m",  # type: ignore[arg-type]
                         hardware="h100_sxm", backend="vllm", backend_version="0", label=rid,
                         measured={"ttft_mean_s": ttft}, sections={}, skip_reason=None,
                         replay=Replay(kind="closed_loop", num_requests=1, concurrency=1))


def test_validate_coverage_with_the_widening_fitted_on_dev_rows_only() -> None:
    rows = [_row("d1", "dev", 1.5), _row("d2", "dev", 3.0), _row("e1", "eval", 2.5), _row("e2", "eval", 9.0)]
    results = [RowResult(row_id=r.row_id, tier="t", status="scored", predicted={"ttft_mean_s": 1.0},
                         bounds={"ttft_mean_s_lo": 0.9, "ttft_mean_s_hi": 1.1}) for r in rows]
    samples = interval_samples(rows, results)
    assert {s[0] for s in samples} == {"dev", "eval"}
    w = fit_widening([(t, m, lo, hi, y) for suite, t, m, _, y, lo, hi in samples if suite == "dev"])
    assert w.log_widths["t"]["ttft"] == pytest.approx(math.log(3.0 / 1.1))  # the larger dev score (n = 2)
    cells = {c["suite"]: c for c in interval_coverage(rows, results, w)}
    assert cells["dev"]["coverage"] == 0.0 and cells["dev"]["coverage_e2e"] == 1.0
    assert cells["eval"]["coverage_e2e"] == 0.5  # 2.5 is inside [0.9 / 2.73, 3.0], 9.0 is not
    assert cells["eval"]["mean_rel_width_e2e"] == pytest.approx(3.0 - 0.9 * 1.1 / 3.0)
    assert "coverage_e2e" not in interval_coverage(rows, results)[0]


def test_disaggregated_rows_have_their_own_coverage_cells_and_never_fit_the_widening() -> None:
    import dataclasses

    rows = [_row("d1", "dev", 1.5), dataclasses.replace(_row("p1", "dev", 30.0), disaggregated=True)]
    results = [RowResult(row_id=r.row_id, tier="t", status="scored", predicted={"ttft_mean_s": 1.0},
                         bounds={"ttft_mean_s_lo": 0.9, "ttft_mean_s_hi": 1.1}) for r in rows]
    samples = interval_samples(rows, results)
    assert sorted(s[0] for s in samples) == ["dev", "dev (disaggregated)"]
    w = fit_widening([(t, m, lo, hi, y) for suite, t, m, _, y, lo, hi in samples if suite == "dev"])
    assert w.log_widths["t"]["ttft"] == pytest.approx(math.log(1.5 / 1.1))  # the 30 s row is not in it
    assert {c["suite"] for c in interval_coverage(rows, results, w)} == {"dev", "dev (disaggregated)"}
