"""The simulator benchmarks run to the end at small sizes.

The benchmarks wrap the simulator's internals (the pricing clock wraps the step-part builders), so a
change of an internal signature can break a benchmark without breaking any library test; these runs
catch that. They check that each script finishes and prints its numbers, not how fast it is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

SMALL_RUNS = {
    "simulate": (["bench_simulate.py", "--requests", "200", "--repeat", "1"], "steps="),
    "simulate-reference": (["bench_simulate.py", "--requests", "200", "--repeat", "1", "--reference"],
                           "steps="),
    "moe-mla": (["bench_moe_mla.py", "--requests", "60", "--repeat", "1"], "completed 60"),
    "disaggregated": (["bench_disagg.py", "--requests", "60", "--repeat", "1"], "completed 60"),
    "speculative": (["bench_speculative.py", "--concurrency", "4", "--prompts-per-slot", "2"], "| 4 |"),
    "predict-kernels": (["bench_predict_kernels.py", "500"], "single efficiency() call"),
}


@pytest.mark.parametrize("name", sorted(SMALL_RUNS))
def test_benchmark_finishes_and_prints_its_numbers(name: str) -> None:
    args, expected = SMALL_RUNS[name]
    proc = subprocess.run([sys.executable, str(BENCHMARKS / args[0]), *args[1:]], capture_output=True,
                          text=True, cwd=BENCHMARKS.parent, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout, proc.stdout[-3000:]
