"""Bad input that used to get past the checks: sizes that exhaust the host, integers that overflow
arrays, NaN bounds, run flags checked only after the simulation. One `error: ...` line, exit 2."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO
from test_bad_input import assert_one_clear_error, llama_config, scenario, with_trace

from orchestrator.cli import main
from sim.errors import ConfigError

DISAGG = (REPO / "scenarios/llama3_8b-h100-disagg-1p1d.toml").read_text()


def disagg(tmp: Path) -> str:
    (tmp / "d.toml").write_text(DISAGG)
    return str(tmp / "d.toml")


def sweep(tmp: Path, slo: str) -> str:
    scenario(tmp)
    (tmp / "sw.toml").write_text(f"""[study]
name = "a"
objective = "ttft_p90_s"
direction = "minimize"
[slo]
{slo}
[base]
scenario = "s.toml"
set = {{ "workload.num_prompts" = 10 }}
[space]
"engine.max_num_seqs" = {{ choices = [8, 16] }}
""")
    return str(tmp / "sw.toml")


def fleet(tmp: Path, duration: str) -> str:
    return scenario(tmp, lambda t: t.replace("request_rate = 10.0", "").replace(
        "[workload]", f'[workload]\nrequest_rate_profile = "diurnal"\ndiurnal_peak_rate = 2.0\n'
                      f'diurnal_trough_rate = 1.0\nprofile_duration_s = {duration}'))


CASES: list[tuple[str, Callable[[Path], list[str]], tuple[str, ...]]] = [
    ("data_parallel_size 1e8", lambda t: ["check", scenario(t), "--set", "engine.data_parallel_size=100000000"],
     ("engine.data_parallel_size=100000000", "must be <= 4,096")),
    ("pool workers 1e8", lambda t: ["run", disagg(t), "--set", "disaggregation.prefill.num_workers=100000000"],
     ("disaggregation.prefill.num_workers=100000000", "4,096")),
    ("pool ranks over the cap", lambda t: ["check", disagg(t), "--set", "disaggregation.decode.num_workers=3000",
                                           "--set", "engine.data_parallel_size=2"],
     ("disaggregation.decode.num_workers=3000", "6,000 ranks")),
    ("profile of 1e12 s", lambda t: ["check", fleet(t, "1e12")], ("workload.profile_duration_s=", "604,800")),
    ("trace prefix_tokens 10**400", lambda t: ["check", with_trace(
        t, "input_tokens,output_tokens,prefix_group,prefix_tokens\n100,10,0," + "1" + "0" * 400 + "\n100,10,0,0\n")],
     ("trace.csv row 1", "prefix_tokens=", "must be a finite number")),
    ("trace prefix_group 1e20", lambda t: ["check", with_trace(
        t, "input_tokens,output_tokens,prefix_group,prefix_tokens\n100,10,1e20,0\n100,10,0,0\n")],
     ("trace.csv row 1", "prefix_group='1e20'", "at most")),
    ("config torch_dtype []", lambda t: ["check", llama_config(t, torch_dtype=[])],
     ("config.json", "torch_dtype=[]", "must be one of")),
    ("config layers 1e30", lambda t: ["check", llama_config(t, num_hidden_layers=10**30)],
     ("config.json", "num_hidden_layers=", "at most")),
    ("config layers 1e6", lambda t: ["check", llama_config(t, num_hidden_layers=10**6)],
     ("config.json", "num_hidden_layers=1000000", "at most 4,096")),
    ("config sliding_window 1e30", lambda t: ["run", llama_config(t, sliding_window=10**30)],
     ("config.json", "sliding_window=", "at most 2,147,483,647")),
    ("sweep slo nan", lambda t: ["check", sweep(t, "ttft_p90_s = nan")],
     ("sw.toml", "slo.ttft_p90_s=nan", "must be a finite number")),
    ("sweep slo min nan", lambda t: ["check", sweep(t, "goodput_frac = { min = nan }")],
     ("sw.toml", "slo.goodput_frac.min=nan", "must be a finite number")),
    ("negative interval seed", lambda t: ["run", scenario(t), "--intervals", "2", "--interval-seed", "-5"],
     ("--interval-seed=-5", "must be >= 0")),
    ("negative intervals", lambda t: ["run", scenario(t), "--intervals", "-1"], ("--intervals=-1", "must be >= 0")),
    ("scenario slo inf", lambda t: ["run", scenario(t), "--set", "slo.ttft_s=inf"],
     ("slo.ttft_s=inf", "must be a finite number > 0")),
    ("hardware price inf", lambda t: ["run", scenario(t), "--set", "hardware.price_per_gpu_hour_usd=inf"],
     ("hardware.price_per_gpu_hour_usd=inf", "must be a finite number >= 0")),
    ("pool price inf", lambda t: ["run", disagg(t), "--set", "disaggregation.decode.price_per_gpu_hour_usd=inf"],
     ("disaggregation.decode.price_per_gpu_hour_usd=inf", "must be a finite number >= 0")),
]


@pytest.mark.parametrize(("argv", "fragments"), [pytest.param(a, f, id=i) for i, a, f in CASES])
def test_bad_input_is_one_clear_error(argv: Callable[[Path], list[str]], fragments: tuple[str, ...],
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_clear_error(argv, fragments, tmp_path, capsys)


def test_run_flags_are_checked_before_the_simulation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad --interval-seed fails before the point run (the progress bar never starts), so no run is lost."""
    code = main(["run", scenario(tmp_path), "--intervals", "2", "--interval-seed", "-1", "--json"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""


def test_an_output_file_that_cannot_be_written_loses_no_result(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`run --out` writes its files after the summary is printed, and names the file that failed."""
    pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    (out / "kernel_breakdown.parquet").mkdir(parents=True)
    code = main(["run", scenario(tmp_path), "--set", "workload.num_prompts=20", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert '"summary"' in captured.out  # the result is on stdout
    assert "kernel_breakdown.parquet" in captured.err and "Traceback" not in captured.err


def test_trace_without_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", scenario(tmp_path), "--trace"]) == 2
    assert "--trace" in capsys.readouterr().err


def test_a_trace_with_a_column_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = with_trace(tmp_path, "input_tokens,output_tokens,input_tokens\n100,10,5\n100,10,5\n")
    assert main(["check", path]) == 2
    err = capsys.readouterr().err
    assert "trace.csv" in err and "input_tokens='input_tokens'" in err and "column appears twice" in err


def test_an_unknown_tracking_uri_scheme_is_refused_before_ray_starts(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray")
    path = sweep(tmp_path, "ttft_p90_s = 1.0")
    assert main(["sweep", path, "--tracking-uri", "foo://bar", "--study-dir", str(tmp_path / "st"),
                 "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert "--tracking-uri='foo://bar'" in err and "Traceback" not in err
    assert not (tmp_path / "st").exists()  # nothing started


def test_tracking_uris_of_mlflows_stores_pass_the_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.sweep.command import check_tracking_uri
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for uri in (None, "runs/mlruns", "file:///tmp/x", "sqlite:///m.db", "postgresql+psycopg2://u@h/db",
                "http://127.0.0.1:5000"):
        check_tracking_uri(uri, uri)


def test_a_file_store_the_installed_mlflow_refuses_is_refused_before_ray_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow 3.17 raises on a file store unless MLFLOW_ALLOW_FILE_STORE=true: the sweep exited 1 with
    MLflow's message after Ray had started (before 2026-12-04); now exit 2 before anything starts."""
    pytest.importorskip("mlflow")
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    from orchestrator.sweep.command import check_tracking_uri, mlflow_refuses_file_stores

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert mlflow_refuses_file_stores() == (not MLFLOW_ALLOW_FILE_STORE.get())
    if not mlflow_refuses_file_stores():
        pytest.skip("the installed MLflow accepts file stores")
    for uri in ("runs/mlruns", "file:///tmp/x"):
        with pytest.raises(ConfigError) as exc:
            check_tracking_uri(uri, uri)
        assert exc.value.key == "--tracking-uri" and "MLFLOW_ALLOW_FILE_STORE=true" in exc.value.rule
    check_tracking_uri("sqlite:///m.db", "sqlite:///m.db")
    path = sweep(tmp_path, "ttft_p90_s = 1.0")
    assert main(["sweep", path, "--tracking-uri", str(tmp_path / "mlruns"), "--study-dir", str(tmp_path / "st"),
                 "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert "file store" in err and "Traceback" not in err
    assert not (tmp_path / "st").exists()  # nothing started
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "TRUE")
    assert MLFLOW_ALLOW_FILE_STORE.get() and not mlflow_refuses_file_stores()
    check_tracking_uri("file:///tmp/x", "file:///tmp/x")


def test_an_empty_tracking_uri_is_refused_and_the_environments_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster job whose `--tracking-uri "$MLFLOW_TRACKING_URI"` expanded to nothing recorded into
    the head pod's local sqlite store, lost with the pod (before 2026-12-02); and
    `MLFLOW_TRACKING_URI` alone was ignored."""
    from orchestrator.sweep.command import check_tracking_uri
    from orchestrator.sweep.session import resolved_tracking_uri

    path = sweep(tmp_path, "ttft_p90_s = 1.0")
    assert main(["sweep", path, "--tracking-uri", "", "--study-dir", str(tmp_path / "st"), "--trials", "1"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert not (tmp_path / "st").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert resolved_tracking_uri(None) == "http://127.0.0.1:5999"
    assert resolved_tracking_uri("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "foo://bar")
    with pytest.raises(ConfigError) as exc:
        check_tracking_uri(None, resolved_tracking_uri(None))
    assert exc.value.key == "MLFLOW_TRACKING_URI"
