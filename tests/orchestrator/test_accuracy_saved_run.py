"""`accuracy kernels --save-run` / `--from-run`: a leave-one-GPU-out run kept on disk renders the
report and the interval table again without refitting (here a small synthetic run in the saved
layout), with the intervals per architecture class."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from orchestrator.cli import main
from sim.calibration.accuracy import EVAL_ONLY, TRAIN_GPUS
from sim.calibration.intervals import load_intervals
from sim.calibration.logo_run import load_logo_run, save_logo_run
from sim.errors import ConfigError

TIERS = ("roofline", "naive", "cross-generation", "target-measured", "cross-generation (same rows as target)")


def _saved_run(directory: Path) -> None:
    rng = np.random.default_rng(2)
    score = {"gemm": {"median_ape": 0.1, "p90_ape": 0.3, "rows": 400, "median_ratio": 1.0}}
    gpus, residuals = [], {}
    for gpu in (*TRAIN_GPUS, *EVAL_ONLY):
        new = gpu not in ("h100_sxm", "h200_sxm")  # the two dev GPUs that share an SM version
        gpus.append({"gpu": gpu, "tiers": {t: dict(score) for t in TIERS}, "calibration_points": 10,
                     "plan_points": 20})
        residuals[gpu] = {"cross-generation": {"gemm": rng.normal(0.0, 0.5 if new else 0.1, 400)},
                          "target-measured": {"gemm": rng.normal(0.0, 0.1, 400)}}
    save_logo_run({"gpus": gpus, "exclusions": [], "rows_scored": {}, "data_sha256": dict.fromkeys(TRAIN_GPUS, "x"),
                   "wall_s": 1234.0}, residuals, directory)


def test_from_run_renders_report_and_intervals_without_refitting(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _saved_run(run)
    result, residuals = load_logo_run(run)
    assert result["wall_s"] == 1234.0 and residuals["l40s"]["cross-generation"]["gemm"].shape == (400,)
    doc, table_path = tmp_path / "accuracy.md", tmp_path / "iv.json"
    assert main(["accuracy", "kernels", "--from-run", str(run), "--doc", str(doc),
                 "--intervals-out", str(table_path)]) == 0
    text = doc.read_text()
    assert "took 1234 s" in text
    # coverage rows name the class; the classes' widths differ (narrow seen, wide new)
    assert "| h100_sxm | cross-generation | seen |" in text and "| l40s | cross-generation | new |" in text
    table = load_intervals(table_path)
    assert table.seen_sm_versions == (80, 89, 90, 120)
    seen, new = table.family("cross-generation", "gemm", 90), table.family("cross-generation", "gemm", 100)
    assert seen is not None and new is not None and seen.relative_width() < 0.5 < new.relative_width()


def test_from_run_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"result\.json"):
        load_logo_run(tmp_path)
    run = tmp_path / "run"
    _saved_run(run)
    (run / "result.json").write_text(json.dumps({"gpus": "none"}))
    with pytest.raises(ConfigError, match="list 'gpus'"):
        load_logo_run(run)
    # a run of some families only is printed, never written into the report
    _saved_run(run)
    result, residuals = load_logo_run(run)
    save_logo_run({**result, "families": ["gemm"]}, residuals, run)
    doc = tmp_path / "accuracy.md"
    assert main(["accuracy", "kernels", "--from-run", str(run), "--doc", str(doc)]) == 0
    assert not doc.exists()
    assert main(["accuracy", "kernels", "--from-run", str(run), "--family", "gemm"]) == 2
