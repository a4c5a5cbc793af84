"""The CLI's progress bar and the "did you mean" hints for unknown names."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, scenario_dict

from orchestrator.progress import ProgressBar
from orchestrator.sweep.metrics import METRIC_NAMES, VLLM_BENCH_NAMES
from orchestrator.sweep.parse import load_sweep
from sim.errors import ConfigError
from sim.specs.scenario import scenario_from_dict


def test_bar_draws_count_on_a_forced_stream_and_nothing_off_a_terminal() -> None:
    forced = io.StringIO()
    with ProgressBar(10, desc="run", unit="request", stream=forced, enabled=True) as bar:
        bar.update_to(3)
        bar.update_to(10)
    assert "run" in forced.getvalue() and "10/10" in forced.getvalue()
    quiet = io.StringIO()  # not a TTY: tqdm's disable=None turns the bar off
    with ProgressBar(10, desc="run", unit="request", stream=quiet) as bar:
        bar.update_to(10)
    assert quiet.getvalue() == ""


def test_bar_takes_a_new_total() -> None:
    out = io.StringIO()
    with ProgressBar(4, desc="sweep", unit="trial", stream=out, enabled=True) as bar:
        bar.update_to(2, 8)
    assert "2/8" in out.getvalue()


def test_run_json_stdout_stays_json_with_a_progress_bar() -> None:
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "run", "scenarios/llama3_8b-h100.toml",
                           "--set", "workload.num_prompts=5", "--json"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().startswith("{") and proc.stdout.rstrip().endswith("}")


def test_every_vllm_bench_name_maps_to_a_metric_here() -> None:
    assert set(VLLM_BENCH_NAMES.values()) <= set(METRIC_NAMES)
    assert VLLM_BENCH_NAMES["mean_ttft_ms"] == "ttft_mean_s"
    assert VLLM_BENCH_NAMES["p99_tpot_ms"] == "tpot_p99_s"
    assert VLLM_BENCH_NAMES["median_itl_ms"] == "itl_median_s"
    assert VLLM_BENCH_NAMES["std_e2el_ms"] == "e2el_std_s"  # vllm bench serve's std_*_ms, ddof 0


def _sweep(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(f"""
        [study]
        name = "hints"
        n_trials = 2
        {body}
        [base]
        scenario = "{REPO / 'scenarios' / 'llama3_8b-h100.toml'}"
        [space]
        "engine.max_num_seqs" = {{ choices = [8, 16] }}
        """))
    return path


@pytest.mark.parametrize(("body", "message"), [
    ('objective = "mean_ttft_ms"', "vLLM bench name mean_ttft_ms is ttft_mean_s here (seconds"),
    ('objective = "request_throughput"\ndirection = "maximize"',
     "vLLM bench name request_throughput is request_throughput_per_s here"),
    ('objective = "ttft_p99"', "did you mean 'ttft_p99_s'"),
    ('objective = "ttft_p90_s"\n[slo]\np99_tpot_ms = 50', "vLLM bench name p99_tpot_ms is tpot_p99_s here"),
    ('objectiv = "ttft_p90_s"', "did you mean 'objective'"),
])
def test_unknown_metric_and_key_names_get_a_suggestion(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_sweep(_sweep(tmp_path, body))
    assert message in str(info.value)


def test_unknown_scenario_keys_get_a_suggestion(tmp_path: Path) -> None:
    path = _sweep(tmp_path, 'objective = "ttft_p90_s"')
    path.write_text(path.read_text().replace('"engine.max_num_seqs"', '"engine.max_num_seq"'))
    with pytest.raises(ConfigError, match=re.escape("did you mean 'engine.max_num_seqs'")):
        load_sweep(path)
    with pytest.raises(ConfigError, match="did you mean 'max_num_seqs'"):
        scenario_from_dict(scenario_dict(engine={"max_num_seq": 8}), source="s.toml")
    with pytest.raises(ConfigError, match="did you mean 'h100_sxm'"):
        scenario_from_dict(scenario_dict(hardware={"name": "h100-sxm"}), source="s.toml")
