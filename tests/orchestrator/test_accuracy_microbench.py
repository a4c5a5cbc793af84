"""`kernelsight accuracy microbench`: its refusals (before any table is read) and its report section."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.cli import main
from sim.calibration.own_tables import TIERS, render_own_tables

SHIPPED = Path(__file__).resolve().parents[2] / "sim" / "data" / "microbench"
H200, H100 = SHIPPED / "h200_sxm" / "2026-11-28", SHIPPED / "h100_sxm" / "2026-11-28"


@pytest.mark.parametrize(("args", "needle"), [
    (["--hardware", "b200_sxm", "--microbench", str(H200), "--reference-hardware", "h100_sxm",
      "--reference-microbench", str(H100)], "evaluation-only"),
    (["--hardware", "h200_sxm", "--microbench", str(H200), "--reference-hardware", "h200_sxm",
      "--reference-microbench", str(H200)], "another GPU"),
    (["--hardware", "gb200", "--microbench", str(H200), "--reference-hardware", "h100_sxm",
      "--reference-microbench", str(H100)], "AIConfigurator tables"),
    (["--hardware", "h200_sxm", "--microbench", "/nonexistent/dir", "--reference-hardware", "h100_sxm",
      "--reference-microbench", str(H100)], "must be a directory"),
])
def test_refusals_exit_2_naming_the_key(args: list[str], needle: str, capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    doc = tmp_path / "accuracy.md"
    assert main(["accuracy", "microbench", *args, "--doc", str(doc)]) == 2
    assert needle in capsys.readouterr().err
    assert not doc.exists()


def test_the_section_lists_every_tier_per_family_and_their_mean() -> None:
    score = {"gemm": {"median_ape": 0.1, "p90_ape": 0.3, "rows": 400, "median_ratio": 0.98},
             "attn_decode": {"median_ape": 0.3, "p90_ape": 0.6, "rows": 200, "median_ratio": 0.75}}
    result = {"gpu": "h200_sxm", "directory": "d", "reference": {"gpu": "h100_sxm"},
              "families": ["attn_decode", "gemm"], "own_rows": {"attn_decode": 152, "gemm": 616},
              "calibration_rows_leave_one_gpu_out": 3421, "tiers": dict.fromkeys(TIERS, score),
              "base_on_own_rows": score}
    text = render_own_tables(result, "kernelsight accuracy microbench ...", 81.0)
    assert text.startswith("## Target-measured from our own microbenchmark tables (h200_sxm)")
    for tier in TIERS:
        assert f"| {tier} | 30.0% (0.75) | 10.0% (0.98) | 20.0% |" in text
    assert "attn_decode (200 rows)" in text and "bridged" in text and "(81 s" in text
