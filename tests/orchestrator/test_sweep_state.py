"""Sweep output and state under Ray's noise, interrupts and kills (issue 22, items 5-9).

Real processes throughout: `kernelsight sweep` runs as a subprocess driver, either with its own
local Ray runtime or joined to this module's runtime, against MLflow sqlite stores and Optuna
journals under tmp_path.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from mlflow import MlflowClient
from mlflow.entities import ViewType
from test_sweep_ray import ENV, SMALL, journal_study, sweep_file

from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.resume_hint import resume_command
from orchestrator.sweep.space import suggest_params
from orchestrator.sweep.study import open_storage, open_study

pytestmark = pytest.mark.ray

SPACE = '"engine.max_num_seqs" = { type = "int", low = 8, high = 256 }\n'


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _listening(pids: set[int]) -> set[str]:
    """Local addresses that processes in `pids` listen on (TCP)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        if {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids:
            found.add(line.split()[3].rsplit(":", 1)[0])
    return found


def test_json_stdout_survives_ray_output_and_local_ray_is_loopback_only_and_stops(tmp_path: Path) -> None:
    """Ray workers print on stdout (forwarded with RAY_LOG_TO_DRIVER=1): stdout is still one JSON document.
    The sweep's own Ray runtime listens on 127.0.0.1 only, and none of its processes outlive the sweep."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, threading, time\n"
        "def noise():\n"
        "    while True:\n"  # after the worker has pointed its stdout at its log file
        "        time.sleep(0.3)\n"
        "        print('kernelsight-test: a Ray worker prints on stdout', flush=True)\n"
        "        os.write(1, b'kernelsight-test: and writes to descriptor 1\\n')\n"
        "if b'default_worker' in open('/proc/self/cmdline', 'rb').read():\n"
        "    threading.Thread(target=noise, daemon=True).start()\n")
    path = sweep_file(tmp_path, name="noisy", sampler="random", n_trials=3, space=SPACE,
                      base_set='"workload.num_prompts" = 120, "workload.request_rate" = 16.0')
    env = {**ENV, "PYTHONPATH": f"{site}{os.pathsep}{REPO}", "RAY_LOG_TO_DRIVER": "1"}
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--actors", "1", "--json",
                               "--study-dir", str(tmp_path / "study")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                              start_new_session=True)
    seen: set[int] = set()
    addresses: set[str] = set()
    try:
        while driver.poll() is None:
            tree = _descendants(driver.pid)
            seen |= tree
            addresses |= _listening(tree | {driver.pid})
            time.sleep(0.3)
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    assert driver.returncode == 0, stderr[-3000:]
    out = json.loads(stdout)  # exactly one document
    assert out["n_trials"] == 3 and "kernelsight-test" not in stdout
    assert "kernelsight-test" in stderr  # Ray's forwarded output went to stderr
    assert out["reproducibility"]["trial_params"].startswith("trial N's parameters follow from study.seed")
    assert addresses, "no listening socket of the sweep's Ray runtime was observed"
    assert addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]", "[::1]"}, addresses
    deadline = time.monotonic() + 15
    while (alive := {p for p in seen if Path(f"/proc/{p}").exists()}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"Ray processes outlived the sweep: {alive}"


def test_resume_hint_repeats_every_state_flag_and_masks_passwords(tmp_path: Path) -> None:
    args = Namespace(sweep="sweeps/x.toml", tracking_uri="http://bob:hunter2@mlflow:5000", storage=(
        "postgresql://alice:s3cret@db:5432/optuna"), ray_address="auto", trials=40, actors=None,
                     no_trial_plots=True, json=False)
    command, masked = resume_command(args, Path("runs/x"))
    argv = shlex.split(command)
    assert masked and "s3cret" not in command and "hunter2" not in command
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert argv[:3] == ["kernelsight", "sweep", str(Path("sweeps/x.toml").resolve())]
    assert "--resume" in argv and "--no-trial-plots" in argv
    opts = {a: argv[i + 1] for i, a in enumerate(argv) if a.startswith("--") and i + 1 < len(argv)
            and not argv[i + 1].startswith("--")}
    assert opts["--study-dir"] == str(Path("runs/x").resolve())
    assert opts["--storage"] == "postgresql://alice:***@db:5432/optuna"
    assert opts["--tracking-uri"] == "http://bob:***@mlflow:5000"
    assert opts["--ray-address"] == "auto" and opts["--trials"] == "40"
    assert flags  # parsed


def _stop_after_first_trial(path: Path, study_dir: Path, name: str, sig: int, *, ray_address: str,
                            tracking: str, cwd: Path) -> tuple[int, str]:
    """Start `kernelsight sweep`, send it `sig` once its first trial is in the journal, and return its
    exit code and stderr."""
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--ray-address",
                               ray_address, "--tracking-uri", tracking, "--study-dir", str(study_dir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd)
    try:
        deadline = time.monotonic() + 240
        while True:
            study = journal_study(study_dir, name)
            if study and any(t.state.is_finished() for t in study.get_trials(deepcopy=False)):
                break
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        driver.send_signal(sig)
        _, stderr = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            driver.kill()
    return driver.returncode, stderr


def test_sigint_prints_a_hint_that_resumes_into_the_same_stores(ray_address: str, tracking_uri: str,
                                                                 tmp_path: Path) -> None:
    path = sweep_file(tmp_path, name="hint", sampler="random", n_trials=8, space=SPACE,
                      base_set='"workload.num_prompts" = 120, "workload.request_rate" = 16.0')
    study_dir = tmp_path / "elsewhere" / "study"
    tracking = tracking_uri
    code, stderr = _stop_after_first_trial(path, study_dir, "hint", signal.SIGINT, ray_address=ray_address,
                                           tracking=tracking, cwd=tmp_path)
    assert code == 130, stderr[-3000:]
    hint = next(line for line in stderr.splitlines() if "continue with: " in line).split("continue with: ", 1)[1]
    argv = shlex.split(hint)
    assert argv[:2] == ["kernelsight", "sweep"] and "--resume" in argv
    assert argv[argv.index("--study-dir") + 1] == str(study_dir.resolve())
    assert argv[argv.index("--tracking-uri") + 1] == tracking
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name("hint")
    assert exp is not None
    parent = client.search_runs([exp.experiment_id], filter_string="tags.role = 'parent'")[0]
    assert parent.info.status == "KILLED"
    # Run the hint as printed (from another directory): same journal, same MLflow store.
    resumed = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv[1:], "--json"], capture_output=True,
                             text=True, env=ENV, cwd=REPO / "sweeps", timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["n_trials"] == 8
    runs = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'", max_results=100)
    assert Counter(int(r.data.tags["trial_number"]) for r in runs) == dict.fromkeys(range(8), 1)
    assert not (REPO / "sweeps" / "runs").exists()


def _parent_runs(tracking: str, experiment: str) -> list[Any]:
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return list(client.search_runs([exp.experiment_id], filter_string="tags.role = 'parent'"))


def test_sigterm_stops_a_search_as_ctrl_c_does(ray_address: str, tracking_uri: str, tmp_path: Path) -> None:
    """`kill`, `timeout`, a deleted pod: before, the driver died in Ray's SIGTERM handler, the parent run
    stayed RUNNING and no resume line was printed."""
    path = sweep_file(tmp_path, name="term", sampler="random", n_trials=200, space=SPACE,
                      base_set='"workload.num_prompts" = 120, "workload.request_rate" = 16.0')
    study_dir = tmp_path / "study"
    code, stderr = _stop_after_first_trial(path, study_dir, "term", signal.SIGTERM, ray_address=ray_address,
                                           tracking=tracking_uri, cwd=tmp_path)
    assert code == 143, stderr[-3000:]
    assert "terminated; continue with: kernelsight sweep" in stderr and "--resume" in stderr
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("term")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    assert [r.info.status for r in runs if r.data.tags["role"] == "parent"] == ["KILLED"]
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stopped_capacity_plan_ends_its_parent_run_killed(ray_address: str, tracking_uri: str, tmp_path: Path,
                                                          sig: int, code: int) -> None:
    """A capacity plan is never resumed (a new parent run each time): before, Ctrl-C and SIGTERM both left
    its parent run RUNNING for good."""
    path = tmp_path / "cap.toml"
    path.write_text(f"""
[study]
name = "cap"
[capacity]
target_request_rate = 40.0
[slo]
ttft_p90_s = 1.0
tpot_p90_s = 0.05
[base]
scenario = "{REPO / "scenarios" / "llama3_8b-h100.toml"}"
set = {{ "workload.num_prompts" = 5000 }}
[space]
"hardware.name" = {{ choices = ["h100_sxm", "a100_sxm"] }}
""")
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--ray-address",
                               ray_address, "--tracking-uri", tracking_uri, "--study-dir", str(tmp_path / "s")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not _parent_runs(tracking_uri, "cap"):
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)  # the probes are running
        driver.send_signal(sig)
        _, stderr = driver.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            driver.kill()
    assert driver.returncode == code, stderr[-3000:]
    assert [r.info.status for r in _parent_runs(tracking_uri, "cap")] == ["KILLED"]


def test_a_search_that_fails_ends_its_parent_run_failed(ray_address: str, tracking_uri: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that is not MLflow's own (the Optuna database, a bug) used to leave the parent run RUNNING."""
    from orchestrator.cli import main
    from orchestrator.sweep.driver import SweepDriver

    def broken(self: SweepDriver) -> None:
        raise RuntimeError("the Optuna database went away")

    monkeypatch.setattr(SweepDriver, "run", broken)
    path = sweep_file(tmp_path, name="broken", sampler="random", n_trials=2, space=SPACE, base_set=SMALL)
    with pytest.raises(RuntimeError, match="went away"):
        main(["sweep", str(path), "--ray-address", ray_address, "--tracking-uri", tracking_uri,
              "--study-dir", str(tmp_path / "study")])
    assert [r.info.status for r in _parent_runs(tracking_uri, "broken")] == ["FAILED"]


@pytest.mark.parametrize("point", ["trial-run-created", "trial-metrics-logged"])
def test_driver_killed_mid_write_resumes_without_duplicate_points_or_running_runs(
        ray_address: str, tracking_uri: str, tmp_path: Path, point: str) -> None:
    """The driver SIGKILLs itself inside a trial's MLflow write (KERNELSIGHT_FAULT_POINT); a retried create
    left an extra empty RUNNING copy of that run and of the parent. Resume: one finished run per trial,
    nothing RUNNING, one point per metric."""
    path = sweep_file(tmp_path, name="torn", sampler="random", n_trials=4, space=SPACE, base_set=SMALL)
    tracking = tracking_uri
    cmd = [sys.executable, "-m", "orchestrator.cli", "sweep", str(path), "--ray-address", ray_address,
           "--tracking-uri", tracking, "--study-dir", str(tmp_path / "study"), "--json"]
    killed = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "KERNELSIGHT_FAULT_POINT": point},
                            timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    client = MlflowClient(tracking_uri=tracking)
    exp = client.get_experiment_by_name("torn")
    assert exp is not None
    torn = client.search_runs([exp.experiment_id], filter_string="tags.role = 'trial'")
    assert [r.info.status for r in torn] == ["RUNNING"]
    assert ("trial_duration_s" in torn[0].data.metrics) == (point == "trial-metrics-logged")
    # What a create_run retried after a lost response leaves: identical, empty, RUNNING copies.
    for run in (torn[0], *client.search_runs([exp.experiment_id], filter_string="tags.role = 'parent'")):
        tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.") or k == "mlflow.parentRunId"}
        client.create_run(exp.experiment_id, run_name=run.info.run_name, tags=tags)

    resumed = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["n_trials"] == 4
    every = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL, max_results=100)
    assert not [r.info.run_id for r in every if r.info.status == "RUNNING"]
    active = client.search_runs([exp.experiment_id], max_results=100)
    assert Counter(r.data.tags["role"] for r in active) == {"parent": 1, "trial": 4}
    trials = [r for r in active if r.data.tags["role"] == "trial"]
    assert Counter(int(r.data.tags["trial_number"]) for r in trials) == dict.fromkeys(range(4), 1)
    parent = next(r for r in active if r.data.tags["role"] == "parent")
    for run in trials:
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        for key in run.data.metrics:
            assert len(client.get_metric_history(run.info.run_id, key)) == 1, (run.data.tags["trial_number"], key)


def test_resumed_random_study_does_not_replay_the_first_sessions_draws(tmp_path: Path) -> None:
    """A sampler re-created with the study's seed would draw trial 3 = trial 0, trial 4 = trial 1, ..."""
    path = sweep_file(tmp_path, name="reseed", sampler="random", n_trials=6, space=SPACE, base_set=SMALL)
    spec = load_sweep(path)
    identity = spec.identity(spec.load_base())

    def draw(resume: bool, n: int) -> None:
        storage, _ = open_storage(None, tmp_path / "study")
        study, _ = open_study(spec, storage, identity=identity, resume=resume)
        for _ in range(n):
            trial = study.ask()
            suggest_params(trial, spec.space)
            study.tell(trial, [1.0, 1.0])

    draw(False, 3)
    draw(True, 3)
    study = journal_study(tmp_path / "study", "reseed")
    assert study is not None
    values = [t.params["engine.max_num_seqs"] for t in study.trials]
    assert values[3:] != values[:3]
    draw(True, 0)  # opening again is deterministic: the same seed for the same trial count
    from orchestrator.sweep.study import session_seed

    assert session_seed(1, 3) == session_seed(1, 3) != session_seed(1, 6) and session_seed(1, 0) == 1
