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
    assert out["api_server_latency_s"] > 0  # every shipped scenario is served through an API server


def test_a_trace_cut_at_its_event_cap_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the trace's step-event cap the later steps are counted, not kept, and stderr warns
    (the warning sat after a `raise` and was never printed before 2026-12-02)."""
    from orchestrator import commands_run

    monkeypatch.setattr(commands_run, "TRACE_MAX_STEP_EVENTS", 5)
    out = tmp_path / "run"
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "workload.num_prompts=20",
                 "--out", str(out), "--trace"]) == 0
    err = capsys.readouterr().err
    assert "warning: trace.json holds the first 5 step events;" in err
    trace = json.loads((out / "trace.json").read_text())
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "step"]) == 5
    assert trace["otherData"]["num_steps_not_logged"] > 0


def test_run_out_writes_parquet(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "workload.num_prompts=20",
                 "--out", str(out), "--trace"]) == 0
    requests = pq.read_table(out / "requests.parquet").to_pylist()
    assert len(requests) == 20 and {"ttft_s", "tpot_s", "e2el_s"} <= set(requests[0])
    kernels = pq.read_table(out / "kernel_breakdown.parquet").to_pylist()
    assert {"qkv_proj", "host"} <= {k["kernel"] for k in kernels}
    summary = json.loads((out / "summary.json").read_text())["summary"]
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert steps and all(e["ph"] == "X" and e["dur"] > 0 for e in steps)
    assert sum(e["args"]["num_steps"] for e in steps) == summary["num_steps"]  # every step, none dropped
    assert {"prefill", "decode"} <= {e["args"]["kind"] for e in steps}
    assert sum(e["args"]["num_prefill_tokens"] * e["args"]["num_steps"] for e in steps) == sum(
        r["prompt_tokens"] for r in requests)  # no prefix sharing or preemption in this run
    assert len([e for e in events if e.get("cat") == "request"]) == 20


def test_run_out_kv_usage_names_each_disaggregated_samples_pool(tmp_path: Path) -> None:
    """The prefill pool's samples come first, then the decode pool's: without the column the time went
    backwards at the join with nothing to tell the pools apart."""
    out = tmp_path / "run"
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100-disagg-1p1d.toml"), "--set", "workload.num_prompts=20",
                 "--out", str(out)]) == 0
    rows = pq.read_table(out / "kv_usage.parquet").to_pylist()
    pools = [r["pool"] for r in rows]
    assert set(pools) == {"prefill", "decode"} and pools == sorted(pools, reverse=True)
    for pool in ("prefill", "decode"):
        times = [r["time_s"] for r in rows if r["pool"] == pool]
        assert times == sorted(times)
    aggregated = tmp_path / "agg"
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "workload.num_prompts=5",
                 "--out", str(aggregated)]) == 0
    assert "pool" not in pq.read_table(aggregated / "kv_usage.parquet").column_names


def test_run_trace_rows_over_max_model_len_exit_2_naming_file_row_and_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("input_tokens,output_tokens\n100,10\n4000,97\n")
    scenario = tmp_path / "s.toml"
    scenario.write_text('[hardware]\nname = "h100_sxm"\n[model]\nname = "meta-llama/Llama-3.1-8B"\n'
                        '[engine]\nmax_model_len = 4096\n'
                        '[workload]\ndataset_name = "trace"\ndataset_path = "trace.csv"\nnum_prompts = 2\n')
    assert main(["run", str(scenario)]) == 2
    err = capsys.readouterr().err
    assert f"{trace} row 2" in err and "4097" in err and "max_model_len=4096" in err
    assert main(["run", str(scenario), "--set", "engine.max_model_len=4097", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["num_completed"] == 2


def test_run_bad_override_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(REPO / "scenarios/llama3_8b-h100.toml"), "--set", "engine.max_num_seq=3"]) == 2
    assert "engine.max_num_seq" in capsys.readouterr().err


def test_run_json_with_intervals_is_strict_json_when_a_metric_is_nan(capsys: pytest.CaptureFixture[str]) -> None:
    """One-token outputs have no TPOT: the summary says "nan" for it, and so must its interval bounds
    (they were bare NaN, which RFC 8259 parsers such as JavaScript's JSON.parse reject)."""
    def no_constants(name: str) -> None:
        raise AssertionError(f"non-standard JSON constant {name} on stdout")

    assert main(["run", str(REPO / "scenarios" / "llama3_8b-h100.toml"), "--set", "workload.num_prompts=3",
                 "--set", "workload.random_output_len=1", "--set", "workload.random_range_ratio=0",
                 "--json", "--intervals", "2"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=no_constants)
    assert out["summary"]["tpot_mean_s"] == "nan"
    assert out["summary"]["tpot_mean_s_lo"] == "nan"
