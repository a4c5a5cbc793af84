"""The MLflow tracker in a child process: same records as in-process, errors keep their type, a dead
child is a clear error, Ctrl-C does not reach it, and closing it ends it. Real sqlite MLflow stores;
three child processes in all (each imports MLflow, ~3 s), on copies of one migrated database."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.results import Breakdown, TrialResult, TrialStatus
from orchestrator.sweep.tracker import LoggedRun
from orchestrator.sweep.tracker_process import TrackerProcess, TrackerProcessError
from sim.errors import ConfigError, InfeasibleScenario

SWEEP = Path(__file__).resolve().parents[2] / "sweeps" / "quickstart.toml"


def _result(number: int) -> TrialResult:
    bd = Breakdown(seconds_by_kind={"gemm": 2.0}, seconds_by_name={"qkv_proj": 2.0}, host_s=1.0, launch_floor_s=0.0)
    return TrialResult(number=number, status=TrialStatus.OK, params={"engine.max_num_seqs": 8 * (number + 1)},
                       scenario_hash=f"h{number}", metrics={"ttft_p90_s": 0.1 * (number + 1)}, breakdown=bd,
                       duration_s=0.5, artifacts={"note.txt": b"hello"})


def test_runs_logged_through_the_child_are_in_the_store(tracking_uri: str, tmp_path: Path) -> None:
    uri = tracking_uri
    spec = load_sweep(SWEEP)
    tracker = TrackerProcess(uri, "child", artifact_location=(tmp_path / "art").as_uri())
    try:
        tracker.start_study(study_uid="u1", spec=spec, tags={"mode": "search"}, files=[])
        for n in range(3):
            tracker.log_trial(_result(n), tags={"optuna_state": "COMPLETE"}, timestamp_ms=1_700_000_000_000 + n)
        logged = tracker.logged_trials()
        assert sorted(logged) == [0, 1, 2] and all(run.is_done() for run in logged.values())
        tracker.finish_study(files={"trials.csv": b"a,b\n"}, metrics={"n_ok": 3.0}, ok=True)
        with pytest.raises(TrackerProcessError, match=r"MLflow store: MlflowException: .*nope"):
            tracker.log_trial(_result(0), tags={}, timestamp_ms=0, existing=LoggedRun("nope", "RUNNING"))
        described = tracker.describe()  # and the child still answers after it
    finally:
        tracker.close()
    assert not tracker._process.is_alive() and tracker._process.exitcode == 0
    tracker.close()  # idempotent
    with pytest.raises(TrackerProcessError):
        tracker.describe()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(logged[1].run_id)
    assert run.data.metrics["ttft_p90_s"] == pytest.approx(0.2) and run.data.params["engine.max_num_seqs"] == "16"
    assert run.data.tags["mlflow.parentRunId"] == described["parent_run_id"]
    assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"note.txt", "kernel_breakdown.json"}
    assert client.get_run(described["parent_run_id"]).info.status == "FINISHED"


def test_a_config_error_in_the_child_is_a_config_error_in_the_driver(tracking_uri: str) -> None:
    uri = tracking_uri
    client = MlflowClient(tracking_uri=uri)
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(ConfigError, match="deleted"):  # the CLI's exit code 2, not a generic failure
        TrackerProcess(uri, "gone")


def test_config_errors_pickle_with_their_fields() -> None:
    err = InfeasibleScenario(source="s.toml", key="engine.tensor_parallel_size", value=3, rule="must divide 32 heads")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is InfeasibleScenario and (back.key, back.value, str(back)) == (err.key, 3, str(err))


def test_a_dead_child_is_a_clear_error_and_ctrl_c_does_not_reach_it(tracking_uri: str) -> None:
    tracker = TrackerProcess(tracking_uri, "dies")
    pid = tracker.pid
    try:
        os.kill(pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the whole process group
        time.sleep(0.5)
        assert tracker.describe()["experiment_id"]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(TrackerProcessError, match=rf"pid {pid}.*exit code -9.*--resume"):
            tracker.describe()
    finally:
        tracker.close()


def test_the_driver_side_of_a_search_sweep_does_not_import_mlflow() -> None:
    """MLflow's imports (~3 s) happen in the child only; the driver's start-up does not wait for them."""
    code = ("import sys\n"
            "import orchestrator.sweep.command, orchestrator.sweep.driver, orchestrator.sweep.session\n"
            "import orchestrator.sweep.tracker_process, orchestrator.sweep.report, orchestrator.sweep.pool\n"
            "print(sorted(m for m in sys.modules if m == 'mlflow' or m.startswith('mlflow.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(SWEEP.parents[1])})
    assert out.stdout.strip() == "[]"


def test_a_malformed_ray_address_is_bad_input_and_ends_the_mlflow_child(
        no_ray: None, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The MLflow child starts while Ray connects; when the connection is refused as bad input, the
    sweep exits 2 naming the flag and the child does not outlive it."""
    from orchestrator.cli import main

    code = main(["sweep", str(SWEEP), "--ray-address", "not a host:port", "--study-dir", str(tmp_path / "study"),
                 "--tracking-uri", tracking_uri])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--ray-address='not a host:port'" in err and "Traceback" not in err
    assert multiprocessing.active_children() == []
