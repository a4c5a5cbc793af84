"""`benchmarks/ab_compare.py` runs a command against two code trees in turn and summarises its numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ab_compare.py"


def _tree(root: Path, name: str, value: float) -> Path:
    tree = root / name
    tree.mkdir()
    (tree / "marker.py").write_text(f"VALUE = {value}\n")
    return tree


def _run(tmp_path: Path, code: str, rounds: int = 3) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(exist_ok=True)
    before, after = _tree(tmp_path, "before", 2.0), _tree(tmp_path, "after", 1.0)
    return subprocess.run([sys.executable, str(SCRIPT), "--before", str(before), "--after", str(after),
                           "--rounds", str(rounds), "--json", "--", sys.executable, "-c", code],
                          capture_output=True, text=True, cwd=tmp_path, check=False)


def test_each_tree_runs_every_round_and_each_printed_number_is_a_column(tmp_path: Path) -> None:
    # Each run appends its tree's marker to a log, so the alternation is visible.
    code = ("import marker; open('log', 'a').write(str(marker.VALUE) + ' ');"
            "print('CPU', marker.VALUE, 's; other', 'CPU', 3 * marker.VALUE)")
    proc = _run(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("before: median 2.000 min 2.000") and "median 6.000" in lines[0]
    assert lines[1].startswith("after: median 1.000 min 1.000") and "median 3.000" in lines[1]
    assert json.loads(lines[2])["values"] == {"before": [[2.0, 6.0]] * 3, "after": [[1.0, 3.0]] * 3}
    assert (tmp_path / "log").read_text().split() == ["2.0", "1.0"] * 3


def test_a_run_without_the_pattern_or_failing_stops_the_comparison(tmp_path: Path) -> None:
    proc = _run(tmp_path / "silent", "print('nothing to see')", rounds=1)
    assert proc.returncode != 0 and "printed 0 matches" in proc.stderr
    failing = _run(tmp_path / "failing", "raise SystemExit(3)", rounds=1)
    assert failing.returncode != 0 and "exit 3" in failing.stderr
