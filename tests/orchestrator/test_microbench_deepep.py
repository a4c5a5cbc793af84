"""DeepEP collector of `microbench run`: the plan's points as shapes, the skip path without DeepEP or
GPUs, the rank averaging, and the tables in AIConfigurator's own DeepEP columns (no GPU here: the
spawned-rank path itself is type-checked only)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import MEASURED_DATA

from orchestrator.microbench.bench import BenchContext
from orchestrator.microbench.deepep import (
    DeepEPShape,
    average_ranks,
    bandwidth_gbps,
    deepep_results,
    dispatch_bytes_per_selection,
    records_of,
    skip_reason,
)
from orchestrator.microbench.output import TABLE_COLUMNS, write_tables
from orchestrator.microbench.points import PlanPoint
from orchestrator.microbench.records import POINTS_FILE, PointsLog, read_points
from orchestrator.microbench.timing import TimingParams
from sim.calibration.plan import microbench_plan
from sim.calibration.rows import ROW_COLUMNS
from sim.measured import open_text, resolve
from sim.specs.catalog import load_hardware

_CTX = BenchContext(torch=None, device="cpu", dry_run=False, timing=TimingParams(), rotate_bytes=1,
                    max_rotation_bytes=1)


def _plan_points() -> list[PlanPoint]:
    rows = [{c: str(r.get(c, "")) for c in ROW_COLUMNS} for r in microbench_plan(load_hardware("h100_sxm"))]
    return [PlanPoint(number=i, family="deepep", row=r) for i, r in enumerate(rows, start=1)
            if r["kernel"] in ("deepep_ll", "deepep_normal")]


def _shape(**kw: object) -> DeepEPShape:
    base: dict[str, object] = {"kernel": "deepep_normal", "node_num": 1, "num_gpus": 8, "hidden": 7168,
                               "tokens_per_rank": 1024, "topk": 8, "num_experts": 256, "sms": 24}
    return DeepEPShape(**{**base, **kw})  # type: ignore[arg-type]


def test_plan_points_become_shapes() -> None:
    points = _plan_points()
    kinds = {p.row["kernel"] for p in points}
    assert kinds == {"deepep_ll", "deepep_normal"}
    normal = next(DeepEPShape.of(p) for p in points if p.row["kernel"] == "deepep_normal")
    assert not normal.low_latency and normal.num_gpus == 8 and normal.node_num == 1 and normal.sms == 24
    ll = next(DeepEPShape.of(p) for p in points if p.row["kernel"] == "deepep_ll")
    assert ll.low_latency and ll.topk == 8 and ll.hidden in (7168, 4096)


def test_skip_reasons_name_what_is_missing() -> None:
    s = _shape()
    assert skip_reason(s, visible_gpus=8, dry_run=False, library_missing=None) is None
    assert "dry run" in (skip_reason(s, visible_gpus=8, dry_run=True, library_missing=None) or "")
    assert "multi-node" in (skip_reason(_shape(node_num=2, num_gpus=16), visible_gpus=8, dry_run=False,
                                        library_missing=None) or "")
    assert "at least 2 GPUs" in (skip_reason(_shape(num_gpus=1), visible_gpus=8, dry_run=False,
                                             library_missing=None) or "")
    assert skip_reason(s, visible_gpus=1, dry_run=False, library_missing="needs DeepEP") == "needs DeepEP"
    assert skip_reason(s, visible_gpus=4, dry_run=False, library_missing=None) == \
        "needs 8 GPUs of one NVLink node, 4 visible"
    assert "does not divide" in (skip_reason(_shape(num_experts=100), visible_gpus=8, dry_run=False,
                                             library_missing=None) or "")


def test_without_deep_ep_every_point_is_skipped_naming_the_library(tmp_path: Path) -> None:
    points = _plan_points()
    results = deepep_results(_CTX, tmp_path / "plan.csv", points, visible_gpus=0)
    assert len(results) == len(points) and all(r["status"] == "skipped" for r in results)
    assert all("deep_ep: not installed" in r["reason"] and "torch: not installed" in r["reason"] for r in results)
    records = records_of(results, {p.key(): p for p in points})
    assert all(r.status == "skipped" and r.measurement is None for r in records)


def test_bytes_and_bandwidth_by_hand() -> None:
    # FP8: 7168 values + 7168 / 128 x 4 B of scales + 16 B = 7408 B per selection; BF16: 2 B per value.
    assert dispatch_bytes_per_selection(7168, fp8=True) == 7408
    assert dispatch_bytes_per_selection(7168, fp8=False) == 14336
    assert bandwidth_gbps(1000, 7408, 1e-4) == pytest.approx(74.08)


def test_rank_average_and_a_skip_on_any_rank() -> None:
    def rec(key: str, d: float, c: float) -> dict[str, object]:
        return {"key": key, "status": "measured", "reason": "", "dispatch_s": d, "combine_s": c,
                "dispatch_p10_s": d, "dispatch_p90_s": d, "combine_p10_s": c, "combine_p90_s": c}

    skipped = {"key": "b", "status": "skipped", "reason": "deep_ep x: boom"}
    out = average_ranks([[rec("a", 1.0, 2.0), rec("b", 1.0, 1.0)], [rec("a", 3.0, 4.0), skipped]])
    assert out[0]["dispatch_s"] == 2.0 and out[0]["combine_s"] == 3.0
    assert out[1]["status"] == "skipped" and out[1]["reason"] == "deep_ep x: boom"


def _header(path: Path) -> list[str]:
    with open_text(resolve(path)) as f:
        return next(csv.reader(f))


def test_measured_points_are_written_in_the_measured_tables_columns(tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    from sim.calibration.tables import read_microbench_dir

    points = _plan_points()
    ll = next(p for p in points if p.row["kernel"] == "deepep_ll")
    normal = next(p for p in points if p.row["kernel"] == "deepep_normal")
    measured = {"status": "measured", "reason": "", "backend": "deep_ep", "backend_version": "1.2.1",
                "kernel_source": "deepep", "variant": "fp8", "repeats": 10}
    results = [{**measured, "key": p.key(), "dispatch_s": d, "combine_s": c, "dispatch_p10_s": d,
                "dispatch_p90_s": d, "combine_p10_s": c, "combine_p90_s": c}
               for p, d, c in ((ll, 1e-4, 2e-4), (normal, 3e-4, 5e-4))]
    records = records_of(results, {p.key(): p for p in (ll, normal)})
    assert [r.latency_ms() for r in records] == pytest.approx([0.3, 0.8])
    # points.csv keeps the parts, so a resumed run writes the same tables.
    log = PointsLog(tmp_path / POINTS_FILE, append=False)
    for r in records:
        log.write(r)
    log.close()
    again = read_points(tmp_path / POINTS_FILE)
    assert again[0].parts_ms == pytest.approx({"dispatch_latency_ms": 0.1, "combine_latency_ms": 0.2})
    assert again[1].parts_ms == pytest.approx({"dispatch_transmit_ms": 0.3, "combine_transmit_ms": 0.5})
    counts = write_tables(tmp_path, again, None)
    assert counts == {"deepep_ll.csv": 1, "deepep_normal.csv.gz": 1}
    theirs = MEASURED_DATA / "aiconfigurator" / "h100_sxm"
    # Same columns as the measured tables (less deepep_ll's two link-bandwidth flags).
    assert list(TABLE_COLUMNS["deepep_ll.csv"]) == [c for c in _header(theirs / "deepep_ll.csv")
                                                    if not c.startswith("flag_")]
    assert list(TABLE_COLUMNS["deepep_normal.csv.gz"]) == _header(theirs / "deepep_normal.csv.gz")
    ours = pandas.read_csv(tmp_path / "deepep_ll.csv")
    row = ours.iloc[0]
    assert (row.op_name, row.dispatch_latency_ms, row.combine_latency_ms) == ("ll", 0.1, 0.2)
    selections = int(ll.row["num_tokens_per_rank"]) * int(ll.row["topk"])
    hidden = int(ll.row["hidden_size"])
    assert row.dispatch_bandwidth_gbps == pytest.approx(selections * (hidden + hidden / 32 + 16) / 1e-4 / 1e9,
                                                        rel=1e-5)
    rows, excluded, _ = read_microbench_dir(tmp_path, "h100_sxm")
    assert not excluded and sorted(rows.kernel) == ["deepep_ll", "deepep_normal"]
    # The kernel model prices dispatch + combine per call.
    assert sorted(rows.latency_s) == pytest.approx([3e-4, 8e-4])
