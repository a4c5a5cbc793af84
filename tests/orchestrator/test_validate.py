"""`kernelsight validate` smoke run on the real measured data: a handful of cheap rows, not an accuracy gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """`kernelsight validate` on the measured data shipped in the package (no --data)."""
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "validate", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=600)


def test_smoke_run_scores_rows_and_rewrites_only_the_end_to_end_section(tmp_path: Path) -> None:
    doc = tmp_path / "accuracy.md"
    doc.write_text("# Accuracy\n\n## Kernels\n\nkernel numbers\n\n## End-to-end\n\nold\n\n### Analysis\n\nkept\n")
    proc = _run("--limit", "1", "--jobs", "2", "--json", "--out", str(tmp_path / "out"), "--doc", str(doc))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    groups = {(g["suite"], g["tier"], g["source"]): g for g in summary["groups"]}
    assert groups[("dev", "cross-generation", "all")]["rows_scored"] >= 3
    # 221 dev rows cannot be simulated: linear attention (Qwen3.5), no model config, no lengths recorded, ...
    assert groups[("dev", "cross-generation", "all")]["rows_skipped"] > 150
    full = json.loads((tmp_path / "out" / "validate.json").read_text())
    reasons = {r["skip_reason"] for r in full["rows"] if r["skip_reason"]}
    assert any("linear" in x for x in reasons) and not any(x.startswith("disaggregated") for x in reasons)
    # Disaggregated rows are simulated as prefill + decode pools.
    assert any(r["sections"] and "disaggregation" in r["sections"] for r in full["rows"] if not r["skip_reason"])
    assert {r["family"] for r in full["rows"]} >= {"dense", "moe", "mla"}
    scored = [r for r in full["results"] if r["status"] == "scored"]
    assert scored and all(v > 0 for r in scored for v in r["predicted"].values())
    text = doc.read_text()
    assert "kernel numbers" in text and "### Analysis\n\nkept" in text and "\nold\n" not in text
    assert "### Eval suite against the targets" in text and "### Skipped and deferred rows" in text
    assert "### Per model (AIConfigurator aggregated rows)" in text and "| mla |" in text
    assert list((tmp_path / "img").glob("e2e_*.png"))


def test_data_must_hold_e2e(tmp_path: Path) -> None:
    proc = _run("--data", str(tmp_path), "--limit", "1")
    assert proc.returncode == 2
    assert "--data" in proc.stderr and "holding e2e/" in proc.stderr


def test_fitting_refuses_the_eval_suite(tmp_path: Path) -> None:
    proc = _run("--suite", "eval", "--fit-profiles", "--limit", "1")
    assert proc.returncode == 2
    assert "evaluation row" in proc.stderr
