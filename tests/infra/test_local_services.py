"""The local multi-node stack is real and complete: two Ray nodes that both run work, an Optuna study
in PostgreSQL, an MLflow server that stores runs in PostgreSQL and artifacts on disk, and nothing left
running once it is stopped; and a real sweep across it. Tests run in file order; the last one stops
the stack."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from tests.infra.services import (
    RAY_NODE_ENV,
    LocalStack,
    NodeProbe,
    current_node_id,
    port_is_open,
    tagged_pids,
)
from tests.infra.services import local_stack as start_local_stack

ray = pytest.importorskip("ray")
optuna = pytest.importorskip("optuna")
mlflow = pytest.importorskip("mlflow")
psycopg2 = pytest.importorskip("psycopg2")

pytestmark = [pytest.mark.ray, pytest.mark.integration]


@pytest.fixture(scope="module")
def local_stack() -> Iterator[LocalStack]:
    """PostgreSQL, a Ray head + one joined node (1 CPU each) and an MLflow server, for this module.

    Defined here, not in a conftest.py: a second `conftest` module would shadow tests/conftest.py for the
    modules that import from it. Teardown raises `ServiceError` if any process of the stack survives.
    """
    with start_local_stack() as stack:
        yield stack


@pytest.fixture
def ray_driver(no_ray: None, local_stack: LocalStack) -> Iterator[None]:
    ray.init(address=local_stack.ray.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _pg_rows(stack: LocalStack, database: str, sql: str) -> list[tuple[Any, ...]]:
    pg = stack.postgres
    conn = psycopg2.connect(host=pg.host, port=pg.port, user=pg.user, password=pg.password, dbname=database)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return list(cur.fetchall())
    finally:
        conn.close()


def test_both_ray_nodes_are_alive_and_run_work_pinned_to_them(local_stack: LocalStack, ray_driver: None) -> None:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    by_resource = {r: n["NodeID"] for n in nodes for r in n["Resources"] if r.startswith("ks_node_")}
    assert sorted(by_resource) == ["ks_node_0", "ks_node_1"]
    assert by_resource["ks_node_0"] != by_resource["ks_node_1"]
    assert sum(n["Resources"]["CPU"] for n in nodes) == 2

    where = ray.remote(current_node_id)
    ran_on = {r: ray.get(where.options(resources={r: 1}).remote()) for r in by_resource}
    assert ran_on == by_resource


def test_two_one_cpu_actors_are_placed_on_different_nodes(local_stack: LocalStack, ray_driver: None) -> None:
    """What a sweep's actor pool relies on: one CPU per node, so two `num_cpus=1` actors use both nodes."""
    actor_cls = ray.remote(num_cpus=1)(NodeProbe)
    actors = [actor_cls.remote() for _ in range(2)]
    node_ids = ray.get([a.node_id.remote() for a in actors])
    assert len(set(node_ids)) == 2
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert set(node_ids) == alive
    for actor in actors:
        ray.kill(actor)
    # After the actors are gone the GCS still says where they ran: what a sweep test checks.
    services = local_stack.services
    assert services.actor_nodes(local_stack.ray, "NodeProbe") == {node_ids[0]: 1, node_ids[1]: 1}
    assert set(services.node_ids(local_stack.ray).values()) == alive


def test_optuna_study_lives_in_postgres(local_stack: LocalStack) -> None:
    url = local_stack.postgres.url("optuna")
    study = optuna.create_study(study_name="services-check", storage=url, direction="minimize",
                                sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        x = trial.suggest_float("x", -1.0, 1.0)
        study.tell(trial, x * x)
    reloaded = optuna.load_study(study_name="services-check", storage=optuna.storages.RDBStorage(url))
    assert [t.number for t in reloaded.get_trials()] == [0, 1, 2, 3, 4]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in reloaded.trials)
    rows = _pg_rows(local_stack, "optuna", "SELECT count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                                           "WHERE s.study_name = 'services-check'")
    assert rows == [(5,)]


def test_mlflow_server_stores_runs_in_postgres_and_artifacts_on_disk(local_stack: LocalStack, tmp_path: Path) -> None:
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=local_stack.mlflow.tracking_uri)
    experiment_id = client.create_experiment("services-check")
    run_id = client.create_run(experiment_id, run_name="trial-00000", tags={"status": "ok"}).info.run_id
    client.log_batch(run_id, params=[Param("engine.max_num_seqs", "256")],
                     metrics=[Metric("ttft_p90_s", 0.25, 0, 0), Metric("goodput_requests_per_s", 7.5, 0, 0)])
    artifact = tmp_path / "kernel_breakdown.csv"
    artifact.write_text("kind,time_s\ngemm,0.5\n")
    client.log_artifact(run_id, str(artifact))
    client.set_terminated(run_id, "FINISHED")

    run = client.get_run(run_id)
    assert run.data.params == {"engine.max_num_seqs": "256"}
    assert run.data.metrics == {"ttft_p90_s": 0.25, "goodput_requests_per_s": 7.5}
    assert run.info.status == "FINISHED"
    assert [f.path for f in client.list_artifacts(run_id)] == ["kernel_breakdown.csv"]
    downloaded = Path(client.download_artifacts(run_id, "kernel_breakdown.csv", str(tmp_path / "dl")))
    assert downloaded.read_text() == artifact.read_text()
    # The server wrote the run to PostgreSQL and the file under its artifacts destination.
    assert _pg_rows(local_stack, "mlflow", f"SELECT status FROM runs WHERE run_uuid = '{run_id}'") == [("FINISHED",)]
    stored = list(local_stack.mlflow.artifacts_dir.rglob("kernel_breakdown.csv"))
    assert len(stored) == 1 and stored[0].read_text() == artifact.read_text()


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


def test_sweep_runs_on_both_nodes_and_records_each_trial_once(local_stack: LocalStack, tmp_path: Path) -> None:
    """A real sweep across the two nodes, the MLflow server and the study in PostgreSQL: the driver is
    `python -m orchestrator.cli sweep` in its own process, as a user runs it against infra/. The checks
    read what the services stored, not what the driver says."""
    services = local_stack.services
    sweep_file = _sweep_file(tmp_path)

    # A driver whose auth mode differs from the cluster's gets its actors cancelled: exit 2, named fix.
    refused = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "sweep", str(sweep_file), "--trials", "2",
         "--ray-address", local_stack.ray.address, "--study-dir", str(tmp_path / "refused")],
        cwd=tmp_path, env=services.driver_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}),
        capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert "RAY_AUTH_MODE" in refused.stderr and "disabled" in refused.stderr
    # The actors are refused while the MLflow child starts, before the study's parent run exists.
    from mlflow.tracking import MlflowClient

    refused_store = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'refused' / 'mlflow.db'}")
    refused_experiment = refused_store.get_experiment_by_name("quickstart")
    assert refused_experiment is None or not refused_store.search_runs([refused_experiment.experiment_id])

    storage = local_stack.postgres.url("optuna", driver="postgresql")  # bare scheme, as users write it
    argv = [sys.executable, "-m", "orchestrator.cli", "sweep", str(sweep_file),
            "--trials", str(NUM_TRIALS), "--actors", "2", "--ray-address", local_stack.ray.address,
            "--tracking-uri", local_stack.mlflow.tracking_uri,
            "--study-dir", str(tmp_path / "study"), "--no-trial-plots", "--json"]
    # The storage URL carries the password: passed in KERNELSIGHT_STORAGE, as infra/ does, not in argv.
    assert local_stack.postgres.password not in " ".join(argv)
    done = subprocess.run(argv, cwd=tmp_path, env=services.driver_env({**RAY_NODE_ENV, "KERNELSIGHT_STORAGE": storage}),
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout)
    assert summary["n_trials"] == NUM_TRIALS
    assert "postgresql" in summary["storage"] and local_stack.postgres.password not in summary["storage"]

    # Optuna: the study in PostgreSQL holds every trial number once, all finished.
    study = optuna.load_study(study_name=summary["study"],
                              storage=local_stack.postgres.url("optuna"))
    numbers = [t.number for t in study.trials]
    assert sorted(numbers) == list(range(NUM_TRIALS))
    assert all(t.state.is_finished() for t in study.trials)

    # MLflow: the server holds one trial run per trial number, each finished.
    runs = _trial_runs(local_stack.mlflow.tracking_uri, summary["study"])
    per_number = Counter(int(r.data.tags["trial_number"]) for r in runs)
    assert per_number == Counter(range(NUM_TRIALS)), per_number
    assert {r.info.status for r in runs} <= {"FINISHED", "FAILED"}

    # Both nodes evaluated trials: the actors say so in each run, and the GCS placed one per node.
    alive = set(services.node_ids(local_stack.ray).values())
    assert len(alive) == 2
    # (Trials whose parameters make no scenario are answered by the driver: they carry no node.)
    evaluated_on = Counter(r.data.tags["ray_node_id"] for r in runs
                           if "ray_node_id" in r.data.tags and "cached_from_trial" not in r.data.tags)
    assert set(evaluated_on) == alive, (evaluated_on, alive)
    assert set(services.actor_nodes(local_stack.ray, "SimShard")) == alive


def test_stop_ends_every_process_and_frees_every_port(local_stack: LocalStack) -> None:
    services = local_stack.services
    assert tagged_pids(services.tag), "the stack's processes carry the tag while running"
    ports = [local_stack.postgres.port, int(local_stack.ray.address.rsplit(":", 1)[1]),
             int(local_stack.mlflow.tracking_uri.rsplit(":", 1)[1])]
    assert all(port_is_open(p) for p in ports)
    force_killed = services.stop()
    assert tagged_pids(services.tag) == []
    assert not any(port_is_open(p) for p in ports)
    assert force_killed == [], f"graceful stop left processes behind: {force_killed}"
