"""`kernelsight validate` smoke run on the real measured data: a handful of cheap rows, not an accuracy gate."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO

from sim.calibration.e2e_widening import load_widening


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
    # Some dev rows cannot be simulated: no lengths recorded, worker counts not recorded, duplicates, ...
    assert groups[("dev", "cross-generation", "all")]["rows_skipped"] > 150
    full = json.loads((tmp_path / "out" / "validate.json").read_text())
    reasons = {r["skip_reason"] for r in full["rows"] if r["skip_reason"]}
    assert any("no concurrency or lengths recorded" in x for x in reasons)
    assert not any(x.startswith("disaggregated") for x in reasons)
    # Every model of the shipped tables has a config (GPT-J 6B and Falcon 180B since 2026-11-29).
    assert not any("no model config ships" in x for x in reasons)
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


def test_intervals_give_each_aggregated_row_bounds_and_the_report_their_coverage(tmp_path: Path) -> None:
    doc = tmp_path / "accuracy.md"
    proc = _run("--suite", "dev", "--source", "llmservingsim", "--limit", "1", "--tier", "cross-generation",
                "--intervals", "2", "--jobs", "1", "--json", "--out", str(tmp_path / "out"), "--doc", str(doc),
                "--e2e-widening-out", str(tmp_path / "widening.json"))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["intervals"] == 2
    # the widening is fitted on the run's dev rows (here one row: its score) and used for the widened coverage
    widening = load_widening(tmp_path / "widening.json")
    assert widening.rows == {"cross-generation": {"ttft": 1, "tpot": 1, "throughput": 1}}
    assert set(widening.data_sha256) == {"e2e"}
    assert summary["e2e_widening"] == widening.to_json()
    assert all("coverage_e2e" in c for c in summary["interval_coverage"])
    cells = {(c["suite"], c["tier"], c["metric"]): c for c in summary["interval_coverage"]}
    assert set(cells) == {("dev", "cross-generation", m) for m in ("ttft", "tpot", "throughput")}
    assert all(c["rows"] == 1 and c["coverage"] in (0.0, 1.0) and c["mean_rel_width"] > 0 for c in cells.values())
    full = json.loads((tmp_path / "out" / "validate.json").read_text())
    (res,) = [r for r in full["results"] if r["status"] == "scored"]
    assert res["interval_runs"] == 2
    for key, point in res["predicted"].items():
        assert res["bounds"][f"{key}_lo"] <= point <= res["bounds"][f"{key}_hi"]
    assert "### Interval coverage (`--intervals K`)" in doc.read_text()
    assert _run("--intervals", "-1", "--limit", "1").returncode == 2


def test_data_must_hold_e2e(tmp_path: Path) -> None:
    proc = _run("--data", str(tmp_path), "--limit", "1")
    assert proc.returncode == 2
    assert "--data" in proc.stderr and "holding e2e/" in proc.stderr


def test_fitting_refuses_the_eval_suite(tmp_path: Path) -> None:
    proc = _run("--suite", "eval", "--fit-profiles", "--limit", "1")
    assert proc.returncode == 2
    assert "evaluation row" in proc.stderr


def test_ctrl_c_stops_the_workers_at_once_and_exits_130(tmp_path: Path) -> None:
    """SIGINT while the workers simulate: queued batches are dropped and the workers ended, not
    waited for (the pool's own exit would run every queued batch first)."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "validate", "--suite", "dev", "--tier",
                             "cross-generation", "--jobs", "2", "--budget-s", "300", "--no-doc", "--out",
                             str(tmp_path / "out")], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("simulating" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        children: list[int] = []
        while len(children) < 2 and time.monotonic() < deadline:  # the two workers are up
            time.sleep(0.5)
            children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        time.sleep(2.0)  # mid-batch
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert took < 30, took

    def alive() -> list[int]:
        out = []
        for c in children:
            with contextlib.suppress(OSError):
                if Path(f"/proc/{c}/stat").read_text().split()[2] != "Z":
                    out.append(c)
        return out

    gone_by = time.monotonic() + 10
    while alive() and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert children and not alive()


def test_rows_from_replays_exactly_the_rows_an_earlier_run_simulated(tmp_path: Path) -> None:
    first = _run("--suite", "dev", "--source", "llmservingsim", "--limit", "2", "--tier", "cross-generation",
                 "--jobs", "1", "--json", "--no-doc", "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    earlier = json.loads((tmp_path / "a" / "validate.json").read_text())
    simulated = {r["row_id"] for r in earlier["results"] if r["status"] in ("scored", "failed")}
    assert len(simulated) == 2
    # no --limit now: every other llmservingsim dev row is deferred, the two are simulated again, same results
    again = _run("--suite", "dev", "--source", "llmservingsim", "--tier", "cross-generation", "--jobs", "1",
                 "--json", "--no-doc", "--out", str(tmp_path / "b"), "--rows-from", str(tmp_path / "a" / "validate.json"))
    assert again.returncode == 0, again.stderr
    later = json.loads((tmp_path / "b" / "validate.json").read_text())
    assert {r["row_id"] for r in later["results"] if r["status"] in ("scored", "failed")} == simulated
    predicted = {r["row_id"]: r["predicted"] for r in earlier["results"] if r["row_id"] in simulated}
    assert {r["row_id"]: r["predicted"] for r in later["results"] if r["row_id"] in simulated} == predicted
    assert any("--rows-from" in (r["deferred"] or "") for r in later["rows"])
    bad = _run("--rows-from", str(tmp_path / "missing.json"), "--limit", "1", "--no-doc")
    assert bad.returncode == 2 and "--rows-from" in bad.stderr


def test_every_row_is_the_default_and_a_budget_is_a_quick_run() -> None:
    from orchestrator.cli import build_parser

    default = build_parser().parse_args(["validate"])
    assert default.budget_s == 0.0  # every row (issue 23: it fits the 10 minutes on 2 cores)
    quick = build_parser().parse_args(["validate", "--budget-s", "120"])
    assert quick.budget_s == 120.0 and quick.max_row_s == 60.0


# A single cheap selection: where a bad flag is not refused up front, the old code simulates one row (seconds).
ONE_ROW = ("--suite", "dev", "--source", "llmservingsim", "--tier", "cross-generation", "--limit", "1",
           "--jobs", "1", "--no-doc")


def test_an_existing_file_as_out_is_refused_before_simulating_naming_out(tmp_path: Path) -> None:
    taken = tmp_path / "vfile"
    taken.write_text("mine\n")
    proc = _run(*ONE_ROW, "--out", str(taken))
    assert proc.returncode == 2, proc.stderr
    assert f"--out='{taken}': is a file" in proc.stderr and "<file>" not in proc.stderr
    assert "simulating" not in proc.stderr  # found before the run, not after it
    assert taken.read_text() == "mine\n"
    beneath = _run(*ONE_ROW, "--out", str(taken / "out"))
    assert beneath.returncode == 2 and "--out=" in beneath.stderr and "simulating" not in beneath.stderr


def test_an_unwritable_widening_out_is_refused_before_simulating(tmp_path: Path) -> None:
    (tmp_path / "wdir").mkdir()
    (tmp_path / "vfile").write_text("")
    for bad, rule in ((tmp_path / "wdir", "is a directory"), (tmp_path / "vfile" / "w.json", "is a file")):
        proc = _run(*ONE_ROW, "--intervals", "2", "--out", str(tmp_path / "out"), "--e2e-widening-out", str(bad))
        assert proc.returncode == 2, proc.stderr
        assert f"--e2e-widening-out='{bad}'" in proc.stderr and rule in proc.stderr
        assert "simulating" not in proc.stderr


@pytest.mark.parametrize(("flags", "key"), [
    (("--limit", "0"), "--limit=0"),  # was "no limit": a full run that rewrote docs/accuracy.md
    (("--limit", "-1"), "--limit=-1"),
    (("--jobs", "0"), "--jobs=0"),
    (("--jobs", "-2"), "--jobs=-2"),
    (("--budget-s", "nan"), "--budget-s=nan"),
    (("--budget-s", "-5"), "--budget-s=-5.0"),
    (("--max-row-s", "nan"), "--max-row-s=nan"),
    (("--max-row-s", "-1"), "--max-row-s=-1.0"),
    (("--fit-budget-s", "-5"), "--fit-budget-s=-5.0"),
    (("--fit-budget-s", "inf"), "--fit-budget-s=inf"),
    (("--intervals", "-1"), "--intervals=-1"),
    (("--e2e-widening-out", "w.json"), "--e2e-widening-out='w.json'"),  # nothing was written, exit 0
    (("--intervals", "0", "--e2e-widening-out", "w.json"), "--e2e-widening-out='w.json'"),
])
def test_bad_numbers_and_combinations_are_refused_up_front(tmp_path: Path, flags: tuple[str, ...], key: str
                                                           ) -> None:
    # --data without e2e/ is refused too, after the flags: the flag must be named, and nothing can be simulated.
    proc = _run(*flags, "--data", str(tmp_path), "--no-doc")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: validate: {key}: "), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_limited_run_never_rewrites_the_default_document() -> None:
    from orchestrator.cli import build_parser
    from orchestrator.commands_validate import _writes_doc

    def writes(*flags: str) -> bool:
        return _writes_doc(build_parser().parse_args(["validate", *flags]))

    assert writes() and not writes("--no-doc")
    assert not writes("--limit", "1") and not writes("--limit", "0")
    assert writes("--limit", "1", "--doc", "mine.md")  # an explicit --doc is still written
