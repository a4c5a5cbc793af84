"""A real sweep across a two-node Ray cluster, an MLflow server and an Optuna study in PostgreSQL.

The driver is `python -m orchestrator.cli sweep` in its own process, joined to the cluster with
`--ray-address`, logging to the server with `--tracking-uri` and storing the study with
`--storage postgresql://...`, as a user runs it against infra/. The checks read what the services
stored, not what the driver says: every trial is in Optuna and in MLflow exactly once, both nodes
evaluated trials, and stopping the stack leaves no process behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from tests.infra.services import RAY_NODE_ENV, local_stack, tagged_pids

optuna = pytest.importorskip("optuna")
mlflow = pytest.importorskip("mlflow")
pytest.importorskip("ray")
pytest.importorskip("psycopg2")

pytestmark = [pytest.mark.ray, pytest.mark.integration]

NUM_TRIALS = 12


def _sweep_file(tmp_path: Path) -> Path:
    """The quickstart sweep with a smaller workload per trial (the space and objectives unchanged)."""
    text = (REPO / "sweeps" / "quickstart.toml").read_text()
    base = str((REPO / "scenarios" / "llama3_8b-h100.toml").resolve())
    text = text.replace('scenario = "../scenarios/llama3_8b-h100.toml"', f"scenario = {json.dumps(base)}")
    text = text.replace('"workload.num_prompts" = 60', '"workload.num_prompts" = 24')
    assert base in text and '"workload.num_prompts" = 24' in text
    path = tmp_path / "multinode.toml"
    path.write_text(text)
    return path


def _trial_runs(tracking_uri: str, experiment_name: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    assert experiment is not None, f"no MLflow experiment {experiment_name!r}"
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.role = 'trial'", max_results=1000)
    return list(runs)


def test_sweep_runs_on_both_nodes_and_records_each_trial_once(tmp_path: Path) -> None:
    with local_stack(ray_cpus=(1, 1)) as stack:
        services = stack.services
        sweep_file = _sweep_file(tmp_path)

        # A driver whose auth mode differs from the cluster's gets its actors cancelled: exit 2, named fix.
        refused = subprocess.run(
            [sys.executable, "-m", "orchestrator.cli", "sweep", str(sweep_file), "--trials", "2",
             "--ray-address", stack.ray.address, "--study-dir", str(tmp_path / "refused")],
            cwd=tmp_path, env=services.driver_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}),
            capture_output=True, text=True, timeout=300, check=False)
        assert refused.returncode == 2, refused.stderr[-4000:]
        assert "RAY_AUTH_MODE" in refused.stderr and "disabled" in refused.stderr

        storage = stack.postgres.url("optuna", driver="postgresql")  # bare scheme, as users write it
        argv = [sys.executable, "-m", "orchestrator.cli", "sweep", str(sweep_file),
                "--trials", str(NUM_TRIALS), "--actors", "2", "--ray-address", stack.ray.address,
                "--tracking-uri", stack.mlflow.tracking_uri,
                "--study-dir", str(tmp_path / "study"), "--no-trial-plots", "--json"]
        # The storage URL carries the password: passed in KERNELSIGHT_STORAGE, as infra/ does, not in argv.
        assert stack.postgres.password not in " ".join(argv)
        done = subprocess.run(argv, cwd=tmp_path, env=services.driver_env({**RAY_NODE_ENV, "KERNELSIGHT_STORAGE": storage}),
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-4000:]
        summary = json.loads(done.stdout)
        assert summary["n_trials"] == NUM_TRIALS
        assert "postgresql" in summary["storage"] and stack.postgres.password not in summary["storage"]

        # Optuna: the study in PostgreSQL holds every trial number once, all finished.
        study = optuna.load_study(study_name=summary["study"],
                                  storage=stack.postgres.url("optuna"))
        numbers = [t.number for t in study.trials]
        assert sorted(numbers) == list(range(NUM_TRIALS))
        assert all(t.state.is_finished() for t in study.trials)

        # MLflow: the server holds one trial run per trial number, each finished.
        runs = _trial_runs(stack.mlflow.tracking_uri, summary["study"])
        per_number = Counter(int(r.data.tags["trial_number"]) for r in runs)
        assert per_number == Counter(range(NUM_TRIALS)), per_number
        assert {r.info.status for r in runs} <= {"FINISHED", "FAILED"}

        # Both nodes evaluated trials: the actors say so in each run, and the GCS placed one per node.
        alive = set(services.node_ids(stack.ray).values())
        assert len(alive) == 2
        # (Trials whose parameters make no scenario are answered by the driver: they carry no node.)
        evaluated_on = Counter(r.data.tags["ray_node_id"] for r in runs
                               if "ray_node_id" in r.data.tags and "cached_from_trial" not in r.data.tags)
        assert set(evaluated_on) == alive, (evaluated_on, alive)
        assert set(services.actor_nodes(stack.ray, "SimShard")) == alive

        force_killed = services.stop()
        assert force_killed == [], f"graceful stop left processes behind: {force_killed}"
        assert tagged_pids(services.tag) == []
