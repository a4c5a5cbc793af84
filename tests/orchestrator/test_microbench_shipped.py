"""The measured microbenchmark tables committed under sim/data/microbench/<gpu>/<date>/ (GPU runs)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.calibration.tables import read_microbench_dir

ROOT = Path(__file__).resolve().parents[2] / "sim" / "data" / "microbench"
RUNS = sorted(p for p in ROOT.glob("*/*") if (p / "device.json").is_file())


def test_measured_runs_are_shipped() -> None:
    assert {p.parent.name for p in RUNS} >= {"h100_sxm", "h200_sxm"}


@pytest.mark.parametrize("run", RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_run_is_a_complete_gpu_run_that_calibrate_reads(run: Path) -> None:
    device = json.loads((run / "device.json").read_text())
    assert device["dry_run"] is False and device["status"] == "complete"
    assert device["hardware"] == run.parent.name and device["gpu"]["name"].startswith("NVIDIA")
    with (run / "points.csv").open() as f:
        points = list(csv.DictReader(f))
    statuses = {p["status"] for p in points}
    assert statuses <= {"measured", "skipped"}, "a failed point would have to be explained or rerun"
    measured = [p for p in points if p["status"] == "measured"]
    rows, _, _ = read_microbench_dir(run, run.parent.name)
    # every measured point is one table row; the collector's latencies are the table's
    assert len(rows) == len(measured) > 900
    assert set(rows.kernel) >= {"gemm", "context_attention", "generation_attention", "norm", "mla_bmm"}
    assert (rows.latency_s > 0).all()
