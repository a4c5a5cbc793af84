"""`kernelsight run` on every shipped scenario, JSON output, Parquet records, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO

from orchestrator.cli import main


@pytest.mark.parametrize("scenario", sorted(p.name for p in (REPO / "scenarios").glob("*.toml")))
def test_run_each_shipped_scenario(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "scenarios" / scenario), "--set", "workload.num_prompts=50", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["num_completed"] == 50
    assert out["summary"]["worst_provenance"]
    assert sum(out["breakdown"]["share_by_kind"].values()) == pytest.approx(1.0)


def test_run_out_writes_parquet(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "workload.num_prompts=20",
                 "--out", str(out), "--trace"]) == 0
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(requests) == 20 and {"ttft_s", "tpot_s", "e2el_s"} <= set(requests[0])
    kernels = pq.read_table(out / "kernel_breakdown.parquet").to_pylist()
    assert {"qkv_proj", "host"} <= {k["kernel"] for k in kernels}
    assert (out / "trace.json").exists()


def test_run_bad_override_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "engine.max_num_seq=3"]) == 2
    assert "engine.max_num_seq" in capsys.readouterr().err
