"""Trace files (CSV and JSONL), their error messages, and the GPU price table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import MEASURED_DATA

from sim.errors import ConfigError
from sim.measured import read_text_bytes
from sim.specs.catalog import list_hardware
from sim.specs.prices import load_price_entries, load_prices, price_per_gpu_hour_usd
from sim.specs.workload import WorkloadSpec
from sim.workload.generate import generate
from sim.workload.requests import UNIQUE_CONTENT_BASE, Segment
from sim.workload.traces import TraceRow, read_trace, requests_from_trace


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_csv_with_alias_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv",
                  "prompt_len,output_len,timestamp,extra\n10,3,100.5,x\n20,4,101.0,y\n")
    assert read_trace(path) == (
        TraceRow(input_tokens=10, output_tokens=3, arrival_s=100.5),
        TraceRow(input_tokens=20, output_tokens=4, arrival_s=101.0),
    )


def test_jsonl_with_prefix_groups_and_nanosecond_arrivals(tmp_path: Path) -> None:
    lines = [
        {"input_toks": 12, "output_toks": 2, "arrival_time_ns": 2_000_000_000,
         "prefix_group": 0, "prefix_tokens": 8},
        {"input_toks": 8, "output_toks": 5, "arrival_time_ns": 2_500_000_000,
         "prefix_group": 0, "prefix_tokens": 8},
        {"input_toks": 30, "output_toks": 1, "arrival_time_ns": 4_000_000_000},
    ]
    path = _write(tmp_path / "t.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n\n")
    rows = read_trace(path)
    assert [r.arrival_s for r in rows] == [2.0, 2.5, 4.0]
    requests = requests_from_trace(rows, WorkloadSpec(dataset_name="trace", dataset_path=str(path),
                                                      num_prompts=3), np.random.default_rng(0))
    assert [r.arrival_s for r in requests] == [0.0, 0.5, 2.0]
    prefix = Segment(content_id=1, num_tokens=8)
    assert requests[0].segments == (prefix, Segment(content_id=UNIQUE_CONTENT_BASE, num_tokens=4))
    assert requests[1].segments == (prefix,) and requests[1].prefix_group == 0
    assert requests[2].segments == (Segment(content_id=UNIQUE_CONTENT_BASE + 2, num_tokens=30),)
    assert requests[2].prefix_group == -1


def test_generate_reads_a_trace_and_uses_its_arrivals(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "input_tokens,output_tokens,arrival_s\n5,1,3.0\n6,2,3.0\n"
                  "7,3,4.25\n")
    spec = WorkloadSpec(dataset_name="custom", dataset_path=str(path), num_prompts=2,
                        request_rate=1000.0)
    requests = generate(spec, np.random.default_rng(0))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (0.0, 5, 1), (0.0, 6, 2)]


def test_untimed_trace_gets_sampled_arrivals(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "input_tokens,output_tokens\n" + "5,1\n" * 100)
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=100,
                        request_rate=10.0)
    requests = generate(spec, np.random.default_rng(3))
    assert requests[-1].arrival_s == pytest.approx(10.0)
    assert requests == generate(spec, np.random.default_rng(3))
    inf_spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=100)
    assert {r.arrival_s for r in generate(inf_spec, np.random.default_rng(3))} == {0.0}


def test_too_few_rows_for_num_prompts(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "input_tokens,output_tokens\n5,1\n")
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=2)
    with pytest.raises(ConfigError, match="only 1 rows") as info:
        generate(spec, np.random.default_rng(0))
    assert info.value.key == "num_prompts"


@pytest.fixture
def llmservingsim_requests(tmp_path: Path) -> Path:
    """LLMServingSim's requests.csv (4 runs) as a plain trace file."""
    path = tmp_path / "requests.csv"
    path.write_bytes(read_text_bytes(MEASURED_DATA / "e2e" / "llmservingsim_vllm_traces" / "requests.csv"))
    return path


def test_llmservingsim_requests_for_one_run(llmservingsim_requests: Path) -> None:
    rows = read_trace(llmservingsim_requests, run_id="RTX4090__Llama-3.1-8B")
    assert len(rows) == 300
    assert rows[0] == TraceRow(input_tokens=2358, output_tokens=531, arrival_s=0.0)
    assert rows[1].arrival_s == pytest.approx(0.265091419)  # arrival_rel_s beats arrival_time
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(llmservingsim_requests),
                        num_prompts=300)
    requests = requests_from_trace(rows, spec, np.random.default_rng(0))
    assert requests[-1].arrival_s == pytest.approx(rows[-1].arrival_s)


def test_a_multi_run_file_needs_a_run_id(llmservingsim_requests: Path) -> None:
    with pytest.raises(ConfigError, match="holds 4 runs") as info:
        read_trace(llmservingsim_requests)
    assert info.value.key == "workload.dataset_run_id"
    with pytest.raises(ConfigError, match="no rows of this run") as info:
        read_trace(llmservingsim_requests, run_id="H100__nothing")
    assert (info.value.key, info.value.value) == ("workload.dataset_run_id", "H100__nothing")


def test_dataset_run_id_selects_one_run_of_a_multi_run_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "run_id,input_tokens,output_tokens\na,10,1\nb,20,2\na,11,3\n")
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=2, dataset_run_id="a")
    requests = generate(spec, np.random.default_rng(0))
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == [(10, 1), (11, 3)]
    with pytest.raises(ConfigError, match="holds 2 runs") as info:
        generate(WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=2),
                 np.random.default_rng(0))
    assert info.value.key == "workload.dataset_run_id"
    with pytest.raises(ConfigError, match="no rows of this run") as info:
        generate(WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=1, dataset_run_id="c"),
                 np.random.default_rng(0))
    assert (info.value.key, info.value.value) == ("workload.dataset_run_id", "c")


def test_dataset_run_id_needs_a_file_dataset() -> None:
    with pytest.raises(ValueError, match="dataset_run_id"):
        WorkloadSpec(dataset_name="random", dataset_run_id="a")


def test_bad_row_error_names_row_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", "input_toks,output_toks\n10,3\n20,abc\n")
    with pytest.raises(ConfigError) as info:
        read_trace(path)
    assert info.value.source == f"{path} row 2"
    assert info.value.key == "output_toks"
    assert info.value.value == "abc"


def test_rule_broken_by_a_row_names_the_file_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", '{"prompt_tokens": 0, "output_len": 3}\n')
    with pytest.raises(ConfigError) as info:
        read_trace(path)
    assert (info.value.source, info.value.key, info.value.value) == (f"{path} row 1",
                                                                     "prompt_tokens", 0)


@pytest.mark.parametrize(
    ("text", "key", "rule"),
    [
        ("input_tokens\n5\n", "output_tokens", "missing"),
        ("input_tokens,output_tokens\n5.5,1\n", "input_tokens", "integer"),
        ("input_tokens,output_tokens,arrival_s\n5,1,2.0\n5,1,1.0\n", "arrival_s", "non-decreasing"),
        ("input_tokens,output_tokens,arrival_s\n5,1,2.0\n5,1,\n", "arrival_s", "disagree"),
        ("input_tokens,output_tokens,prefix_tokens\n5,1,3\n", "prefix_tokens", "prefix_group"),
        ("input_tokens,output_tokens,prefix_group,prefix_tokens\n5,1,0,6\n", "prefix_tokens",
         "input_tokens=5"),
    ],
)
def test_bad_csv_rows(tmp_path: Path, text: str, key: str, rule: str) -> None:
    path = _write(tmp_path / "t.csv", text)
    with pytest.raises(ConfigError, match=rule) as info:
        read_trace(path)
    assert info.value.key == key
    assert info.value.source.startswith(f"{path} row ")


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        read_trace(tmp_path / "missing.csv")
    with pytest.raises(ConfigError, match=r"\.csv or \.jsonl"):
        read_trace(_write(tmp_path / "t.parquet", ""))
    with pytest.raises(ConfigError, match="no rows"):
        read_trace(_write(tmp_path / "empty.csv", "input_tokens,output_tokens\n"))
    with pytest.raises(ConfigError, match="invalid JSON"):
        read_trace(_write(tmp_path / "t.jsonl", "{not json}\n"))


def test_shipped_prices_cover_every_hardware_with_a_source() -> None:
    entries = load_price_entries()
    assert set(entries) == set(list_hardware())
    for entry in entries.values():
        assert entry.usd_per_gpu_hour > 0
        assert entry.source.strip()
        assert entry.basis == "list" or entry.source.startswith("assumption")
    prices = load_prices()
    assert price_per_gpu_hour_usd("h100_sxm", prices) == entries["h100_sxm"].usd_per_gpu_hour


def test_price_table_is_strict(tmp_path: Path) -> None:
    ok = 'usd_per_gpu_hour = 1.0\nbasis = "assumption"\nsource = "assumption: test"\n'
    unknown = _write(tmp_path / "unknown.toml", "[h999]\n" + ok)
    with pytest.raises(ConfigError, match="unknown hardware") as info:
        load_prices(unknown)
    assert info.value.key == "h999"
    bad = _write(tmp_path / "bad.toml", "[l4]\n" + ok.replace("1.0", "0.0"))
    with pytest.raises(ConfigError) as info:
        load_prices(bad)
    assert info.value.key == "l4.usd_per_gpu_hour"
    extra = _write(tmp_path / "extra.toml", "[l4]\n" + ok + "currency = 'EUR'\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_prices(extra)
    partial = load_prices(_write(tmp_path / "partial.toml", "[l4]\n" + ok))
    assert price_per_gpu_hour_usd("l4", partial) == 1.0
    with pytest.raises(ConfigError, match="no price") as info:
        price_per_gpu_hour_usd("h100_sxm", partial)
    assert info.value.key == "h100_sxm"


def test_rows_over_max_model_len_are_rejected_naming_file_row_and_rule(tmp_path: Path) -> None:
    # vLLM rejects prompt + max_tokens > max_model_len; row 3 (request 2) asks for 60 + 41 = 101.
    path = _write(tmp_path / "t.csv", "input_tokens,output_tokens\n10,5\n50,50\n60,41\n200,200\n")
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=3)
    assert len(generate(spec, np.random.default_rng(0))) == 3  # unchecked without max_model_len
    assert len(generate(spec, np.random.default_rng(0), max_model_len=101)) == 3  # 101 is allowed
    with pytest.raises(ConfigError) as info:
        generate(spec, np.random.default_rng(0), max_model_len=100)
    err = info.value
    assert err.source == f"{path} row 3"
    assert (err.key, err.value) == ("input_tokens+output_tokens", 101)
    assert "request 2" in err.rule and "max_model_len=100" in err.rule


def test_jsonl_rows_over_max_model_len_name_their_line(tmp_path: Path) -> None:
    lines = [{"input_toks": 10, "output_toks": 2}, {"input_toks": 90, "output_toks": 20}]
    path = _write(tmp_path / "t.jsonl", "\n\n".join(json.dumps(x) for x in lines) + "\n")
    spec = WorkloadSpec(dataset_name="trace", dataset_path=str(path), num_prompts=2)
    with pytest.raises(ConfigError) as info:
        generate(spec, np.random.default_rng(0), max_model_len=64)
    assert info.value.source == f"{path} row 3"  # JSONL rows are lines; line 2 is blank
    assert info.value.value == 110
