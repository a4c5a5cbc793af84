"""Service throughput behind a sweep: MLflow server, Optuna RDB storage, Ray, and the sweep driver loop.

Run: `PYTHONPATH=. python benchmarks/bench_services.py [--parts mlflow,optuna,optuna_running,ray,driver]
[--quick] [--no-durable] [--json-out FILE]`.
Starts its own PostgreSQL (durable settings: fsync on), a two-node Ray cluster and an `mlflow server`
on that PostgreSQL (tests/infra/services.py), measures, stops everything. Every result carries
wall-clock rates and CPU milliseconds per operation per process group (client, MLflow server,
PostgreSQL, Ray). Numbers go to docs/benchmarks.md (## Services); docs/scaling.md reasons from them.

- mlflow: trial-shaped runs (create_run with tags, one log_batch of params + metrics, set_terminated)
  the server absorbs from 1 and 2 client processes: runs/s, metrics/s; plus wide log_batch calls
  (1,000 metrics each) for the metric-row ceiling, and runs with one small artifact upload.
- optuna: ask + suggest 6 params + tell on the PostgreSQL study from 1 and 2 processes (random sampler:
  storage cost only), TPE ask/tell latency as the study grows, and a journal file for comparison;
  optuna_running: ask + tell while N other trials are RUNNING (a driver with N busy slots).
- ray: trivial task round trips, actor call latency to each node, pipelined actor calls.
- driver: the sweep's driver loop at scale with fake-cost trials: real Ray actors (threaded, sleeping
  `--trial-cost-s`), a real Optuna study in PostgreSQL, real MLflow logging, unordered completion;
  trials/s against the number of concurrent trial slots, and the driver's time per trial by phase.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.infra.services import LocalServices, MlflowServer, PostgresServer, RayCluster

NUM_PARAMS = 6
NUM_METRICS = 24  # a SimSummary has ~two dozen numeric fields


def _quiet(*, print_run_urls: bool = False) -> None:
    """By default `MlflowClient.set_terminated` GETs the run back to print its URL on stdout: one request
    more per trial. A sweep driver suppresses that; the `runs_url_print` variant measures the default."""
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "false" if print_run_urls else "true"
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def _trial_params(i: int) -> dict[str, str]:
    return {
        "hardware.name": ["h100_sxm", "h200_sxm", "a100_sxm"][i % 3],
        "engine.tensor_parallel_size": str([1, 2, 4, 8][i % 4]),
        "engine.max_num_seqs": str(16 + i % 497),
        "engine.max_num_batched_tokens": str(512 + 64 * (i % 250)),
        "engine.enable_chunked_prefill": str(i % 2 == 0),
        "engine.enable_prefix_caching": str(i % 3 == 0),
    }


def _trial_metrics(i: int) -> dict[str, float]:
    return {f"summary.metric_{k:02d}": float(i * 31 + k) / 7.0 for k in range(NUM_METRICS)}


def _log_trial_run(client: Any, experiment_id: str, parent_run_id: str, i: int, artifact: Path | None) -> None:
    from mlflow.entities import Metric, Param

    run_id = client.create_run(experiment_id, run_name=f"trial-{i:06d}", tags={
        "mlflow.parentRunId": parent_run_id, "status": "ok", "scenario_hash": f"{i:064x}",
        "worst_provenance": "CALIBRATED"}).info.run_id
    now_ms = int(time.time() * 1000)
    client.log_batch(run_id, params=[Param(k, v) for k, v in _trial_params(i).items()],
                     metrics=[Metric(k, v, now_ms, 0) for k, v in _trial_metrics(i).items()])
    if artifact is not None:
        client.log_artifact(run_id, str(artifact))
    client.set_terminated(run_id, "FINISHED")


# Multi-process helpers (spawned: each process has its own clients) ----------------------------------


def _mlflow_client_proc(uri: str, experiment_id: str, parent_run_id: str, start: int, count: int,
                        artifact: str | None, print_run_urls: bool, barrier: Any, out: Any) -> None:
    from mlflow.tracking import MlflowClient

    _quiet(print_run_urls=print_run_urls)
    if print_run_urls:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115  the URLs themselves are noise here
    client = MlflowClient(tracking_uri=uri)
    client.get_experiment(experiment_id)  # warm the connection
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(start, start + count):
        _log_trial_run(client, experiment_id, parent_run_id, i, Path(artifact) if artifact else None)
    out.put((time.perf_counter() - t0, time.process_time() - c0))


def _mlflow_wide_proc(uri: str, run_id: str, calls: int, width: int, barrier: Any, out: Any) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    _quiet()
    client = MlflowClient(tracking_uri=uri)
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for c in range(calls):
        client.log_batch(run_id, metrics=[Metric(f"m{k:04d}", float(k), 0, c) for k in range(width)])
    out.put((time.perf_counter() - t0, time.process_time() - c0))


def _optuna_proc(url: str, study_name: str, count: int, barrier: Any, out: Any) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=url, sampler=optuna.samplers.RandomSampler())
    barrier.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(count):
        trial = study.ask()
        values = _suggest(trial)
        study.tell(trial, values)
    out.put((time.perf_counter() - t0, time.process_time() - c0))


def _suggest(trial: Any) -> tuple[float, float]:
    hw = trial.suggest_categorical("hardware.name", ["h100_sxm", "h200_sxm", "a100_sxm"])
    tp = trial.suggest_categorical("engine.tensor_parallel_size", [1, 2, 4, 8])
    seqs = trial.suggest_int("engine.max_num_seqs", 16, 512, log=True)
    tokens = trial.suggest_int("engine.max_num_batched_tokens", 512, 16384, log=True)
    chunked = trial.suggest_categorical("engine.enable_chunked_prefill", [True, False])
    prefix = trial.suggest_categorical("engine.enable_prefix_caching", [True, False])
    cost = tp * (1.0 + len(hw) / 10) / (1 + seqs / 512) + (0.1 if chunked else 0.0)
    latency = tokens / 16384 + (0.05 if prefix else 0.1) + tp / 8
    return cost, latency


def _run_procs(target: Callable[..., None], arg_sets: list[tuple[Any, ...]]) -> tuple[list[float], float]:
    """Run `target` in one spawned process per arg set, started together; (wall s per process, client CPU s)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(arg_sets))
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, out)) for args in arg_sets]
    for p in procs:
        p.start()
    reports = [out.get(timeout=1800) for _ in procs]
    elapsed = [float(r[0]) for r in reports]
    client_cpu_s = sum(float(r[1]) for r in reports)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"benchmark process failed with {p.exitcode}")
    return elapsed, client_cpu_s


class CpuMeter:
    """CPU seconds (user + sys, reaped children included) used by the stack's processes, per service.

    Wall-clock rates on a shared 2-core box move with the other jobs; CPU time per operation does not
    (much), and it is what a cluster has to provision, so every measurement reports both.
    """

    def __init__(self, services: LocalServices) -> None:
        self._services = services
        self._clock_ticks = os.sysconf("SC_CLK_TCK")

    def snapshot(self) -> dict[str, float]:
        totals = {"postgres": 0.0, "mlflow": 0.0, "ray": 0.0}
        for name, pids in self._services.service_pids().items():
            kind = "ray" if name.startswith("ray") else name
            for pid in pids:
                try:
                    stat = Path(f"/proc/{pid}/stat").read_text()
                except OSError:
                    continue
                fields = stat[stat.rindex(")") + 2:].split()
                totals[kind] += sum(int(fields[i]) for i in (11, 12, 13, 14)) / self._clock_ticks  # u, s, cu, cs
        return totals

    @staticmethod
    def per_op_ms(before: dict[str, float], after: dict[str, float], ops: int) -> dict[str, float]:
        return {f"{k}_cpu_ms": 1000 * (after[k] - before[k]) / ops for k in before}


# MLflow ------------------------------------------------------------------------------------------------


def bench_mlflow(server: MlflowServer, runs_per_proc: int, work: Path, meter: CpuMeter) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server.tracking_uri)
    results: dict[str, Any] = {}
    artifact = work / "kernel_breakdown.parquet"
    artifact.write_bytes(os.urandom(16 * 1024))  # the size of a small per-trial Parquet breakdown
    variants: list[tuple[str, Path | None, bool, tuple[int, ...]]] = [
        ("runs", None, False, (1, 2)),
        ("runs_with_artifact", artifact, False, (1, 2)),
        ("runs_url_print", None, True, (1,)),
    ]
    for label, artifact_path, print_urls, proc_counts in variants:
        for num_procs in proc_counts:
            experiment_id = client.create_experiment(f"bench-{label}-{num_procs}-{time.time_ns()}")
            parent = client.create_run(experiment_id, run_name="parent").info.run_id
            count = runs_per_proc if artifact_path is None else max(10, runs_per_proc // 2)
            arg_sets = [(server.tracking_uri, experiment_id, parent, p * count, count,
                         str(artifact_path) if artifact_path else None, print_urls) for p in range(num_procs)]
            before = meter.snapshot()
            elapsed, client_cpu_s = _run_procs(_mlflow_client_proc, arg_sets)
            after = meter.snapshot()
            total = num_procs * count
            wall = max(elapsed)
            results[f"{label}_{num_procs}p"] = {
                "runs": total, "wall_s": wall, "runs_per_s": total / wall,
                "metrics_per_s": total * NUM_METRICS / wall,
                "ms_per_run_per_client": 1000 * statistics.mean(elapsed) / count,
                "client_cpu_ms": 1000 * client_cpu_s / total, **CpuMeter.per_op_ms(before, after, total),
            }
            _print(f"mlflow {label:>18} {num_procs}p", results[f"{label}_{num_procs}p"])
    for num_procs in (1, 2):
        experiment_id = client.create_experiment(f"bench-wide-{num_procs}-{time.time_ns()}")
        runs = [client.create_run(experiment_id).info.run_id for _ in range(num_procs)]
        calls, width = 20, 1000
        before = meter.snapshot()
        elapsed, client_cpu_s = _run_procs(_mlflow_wide_proc, [(server.tracking_uri, r, calls, width) for r in runs])
        after = meter.snapshot()
        total_metrics = num_procs * calls * width
        per_k = CpuMeter.per_op_ms(before, after, total_metrics // 1000)
        results[f"wide_batch_{num_procs}p"] = {"metrics": total_metrics, "wall_s": max(elapsed),
                                               "metrics_per_s": total_metrics / max(elapsed),
                                               **{k + "_per_1000": v for k, v in per_k.items()}}
        _print(f"mlflow log_batch x1000 {num_procs}p", results[f"wide_batch_{num_procs}p"])
    return results


# Optuna ------------------------------------------------------------------------------------------------


def bench_optuna(pg: PostgresServer, trials_per_proc: int, tpe_sizes: list[int], work: Path,
                 meter: CpuMeter) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = pg.url("optuna")
    results: dict[str, Any] = {}
    for num_procs in (1, 2):
        name = f"bench-random-{num_procs}-{time.time_ns()}"
        optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"])
        before = meter.snapshot()
        elapsed, client_cpu_s = _run_procs(_optuna_proc, [(url, name, trials_per_proc) for _ in range(num_procs)])
        after = meter.snapshot()
        total = num_procs * trials_per_proc
        results[f"rdb_random_{num_procs}p"] = {
            "trials": total, "wall_s": max(elapsed), "ask_tell_per_s": total / max(elapsed),
            "ms_per_trial_per_process": 1000 * statistics.mean(elapsed) / trials_per_proc,
            "client_cpu_ms": 1000 * client_cpu_s / total,
            "postgres_cpu_ms": 1000 * (after["postgres"] - before["postgres"]) / total,
        }
        _print(f"optuna rdb random {num_procs}p", results[f"rdb_random_{num_procs}p"])
    # Journal file (the sweep's default storage) and in-memory, one process, for comparison.
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    for label, storage in (("journal_file", JournalStorage(JournalFileBackend(str(work / "journal.log")))),
                           ("in_memory", optuna.storages.InMemoryStorage())):
        study = optuna.create_study(storage=storage, directions=["minimize", "minimize"],
                                    sampler=optuna.samplers.RandomSampler(seed=0))
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(trials_per_proc):
            trial = study.ask()
            study.tell(trial, _suggest(trial))
        wall = time.perf_counter() - t0
        results[f"{label}_random_1p"] = {"trials": trials_per_proc, "wall_s": wall,
                                         "ask_tell_per_s": trials_per_proc / wall,
                                         "client_cpu_ms": 1000 * (time.process_time() - c0) / trials_per_proc}
        _print(f"optuna {label} random 1p", results[f"{label}_random_1p"])
    # TPE (constant_liar, 2 objectives) ask/tell latency as the study grows.
    name = f"bench-tpe-{time.time_ns()}"
    sampler = optuna.samplers.TPESampler(seed=0, constant_liar=True)
    study = optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"], sampler=sampler)
    rng_study = optuna.create_study(directions=["minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=1))
    size = 0
    for target in tpe_sizes:
        t0 = time.perf_counter()
        while size < target:  # grow the study with completed random trials (bulk insert)
            batch = []
            for _ in range(min(500, target - size)):
                t = rng_study.ask()
                params = _fixed_params(t)
                batch.append(optuna.trial.create_trial(params=params, distributions=t.distributions,
                                                       values=list(_suggest(t))))
            study.add_trials(batch)
            size += len(batch)
        fill_s = time.perf_counter() - t0
        samples = []
        c0 = time.process_time()
        for _ in range(10):
            t1 = time.perf_counter()
            trial = study.ask()
            study.tell(trial, _suggest(trial))
            samples.append(time.perf_counter() - t1)
            size += 1
        results[f"rdb_tpe_at_{target}"] = {"study_trials": target,
                                           "ms_per_ask_tell_median": 1000 * statistics.median(samples),
                                           "ms_per_ask_tell_max": 1000 * max(samples),
                                           "client_cpu_ms": 1000 * (time.process_time() - c0) / len(samples),
                                           "fill_s": fill_s}
        _print(f"optuna rdb tpe @{target}", results[f"rdb_tpe_at_{target}"])
    return results


def bench_optuna_running(pg: PostgresServer, running_sizes: list[int], meter: CpuMeter) -> dict[str, Any]:
    """ask + tell cost while N other trials of the study are RUNNING (what a driver with N busy slots sees)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    results: dict[str, Any] = {}
    for sampler_name in ("random", "tpe"):
        for running in running_sizes:
            sampler = (optuna.samplers.TPESampler(seed=0, constant_liar=True) if sampler_name == "tpe"
                       else optuna.samplers.RandomSampler(seed=0))
            study = optuna.create_study(study_name=f"running-{sampler_name}-{running}-{time.time_ns()}",
                                        storage=pg.url("optuna"), directions=["minimize", "minimize"], sampler=sampler)
            for _ in range(running):
                _suggest(study.ask())
            samples = []
            before = meter.snapshot()
            c0 = time.process_time()
            for _ in range(20):
                t0 = time.perf_counter()
                trial = study.ask()
                study.tell(trial, _suggest(trial))
                samples.append(time.perf_counter() - t0)
            after = meter.snapshot()
            results[f"{sampler_name}_running{running}"] = {
                "running_trials": running, "ms_per_ask_tell_median": 1000 * statistics.median(samples),
                "client_cpu_ms": 1000 * (time.process_time() - c0) / len(samples),
                "postgres_cpu_ms": 1000 * (after["postgres"] - before["postgres"]) / len(samples),
            }
            _print(f"optuna rdb {sampler_name} running={running}", results[f"{sampler_name}_running{running}"])
    return results


def _fixed_params(trial: Any) -> dict[str, Any]:
    _suggest(trial)
    return dict(trial.params)


# Ray ---------------------------------------------------------------------------------------------------


def _noop(x: int) -> int:
    return x


class _Echo:
    def call(self, x: int) -> int:
        return x


def bench_ray(cluster: RayCluster, num_tasks: int) -> dict[str, Any]:
    import ray

    results: dict[str, Any] = {}
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        noop = ray.remote(num_cpus=0.1)(_noop)
        ray.get([noop.remote(i) for i in range(50)])  # warm worker pools
        t0 = time.perf_counter()
        ray.get([noop.remote(i) for i in range(num_tasks)])
        wall = time.perf_counter() - t0
        results["tasks_pipelined"] = {"tasks": num_tasks, "wall_s": wall, "tasks_per_s": num_tasks / wall}
        _print("ray tasks pipelined", results["tasks_pipelined"])
        echo = ray.remote(num_cpus=0)(_Echo)
        actors = [echo.options(resources={r: 0.01}).remote() for r in cluster.node_resources]
        ray.get([a.call.remote(0) for a in actors])
        for node, actor in zip(cluster.node_resources, actors, strict=True):
            samples = []
            for i in range(300):
                t1 = time.perf_counter()
                ray.get(actor.call.remote(i))
                samples.append(time.perf_counter() - t1)
            results[f"actor_roundtrip_{node}"] = {"ms_median": 1000 * statistics.median(samples),
                                                  "ms_p90": 1000 * statistics.quantiles(samples, n=10)[-1]}
            _print(f"ray actor round trip {node}", results[f"actor_roundtrip_{node}"])
        t0 = time.perf_counter()
        refs = [actors[i % len(actors)].call.remote(i) for i in range(num_tasks)]
        ray.get(refs)
        wall = time.perf_counter() - t0
        results["actor_calls_pipelined"] = {"calls": num_tasks, "wall_s": wall, "calls_per_s": num_tasks / wall}
        _print("ray actor calls pipelined", results["actor_calls_pipelined"])
        for actor in actors:
            ray.kill(actor)
    finally:
        ray.shutdown()
    return results


# Driver at scale ---------------------------------------------------------------------------------------


class _FakeShard:
    """A sweep actor whose trial costs `cost_s` of wall time and no CPU (sleep): many fit on 2 cores."""

    def evaluate(self, number: int, params: dict[str, Any], cost_s: float) -> tuple[int, dict[str, float]]:
        time.sleep(cost_s)
        metrics = {f"summary.metric_{k:02d}": float(number + k) for k in range(NUM_METRICS)}
        return number, metrics


def _log_driver_trial(client: Any, experiment_id: str, parent: str, number: int, params: dict[str, Any],
                      metrics: dict[str, float]) -> None:
    from mlflow.entities import Metric, Param

    run_id = client.create_run(experiment_id, run_name=f"trial-{number:06d}",
                               tags={"mlflow.parentRunId": parent, "status": "ok"}).info.run_id
    client.log_batch(run_id, params=[Param(k, str(v)) for k, v in params.items()],
                     metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()])
    client.set_terminated(run_id, "FINISHED")


def driver_sim(cluster: RayCluster, pg: PostgresServer, server: MlflowServer | None, meter: CpuMeter, *,
               n_trials: int, slots: int, cost_s: float, sampler_name: str, log_threads: int = 0,
               actors_per_node: int = 2) -> dict[str, Any]:
    """The sweep driver's loop (ask, submit, wait unordered, tell, log) over real Ray/Optuna/MLflow.

    `log_threads=0` logs each trial inline (the driver waits for MLflow); `> 0` hands each trial's runs to a
    thread pool so the loop goes on while MLflow writes (the wall time includes draining that pool).
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    import optuna
    import ray
    from mlflow.tracking import MlflowClient

    _quiet()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = (optuna.samplers.TPESampler(seed=0, constant_liar=True) if sampler_name == "tpe"
               else optuna.samplers.RandomSampler(seed=0))
    study = optuna.create_study(study_name=f"driver-{slots}-{time.time_ns()}", storage=pg.url("optuna"),
                                directions=["minimize", "minimize"], sampler=sampler)
    client = MlflowClient(tracking_uri=server.tracking_uri) if server else None
    experiment_id = client.create_experiment(f"driver-{slots}-{time.time_ns()}") if client else ""
    parent = client.create_run(experiment_id, run_name="parent").info.run_id if client else ""
    shard = ray.remote(num_cpus=0)(_FakeShard)
    per_actor = max(1, -(-slots // (actors_per_node * len(cluster.node_resources))))
    actors = [shard.options(resources={r: 0.01}, max_concurrency=per_actor).remote()
              for r in cluster.node_resources for _ in range(actors_per_node)]
    ray.get([a.evaluate.remote(-1, {}, 0.0) for a in actors])
    phase = {"ask_s": 0.0, "submit_s": 0.0, "wait_s": 0.0, "tell_s": 0.0, "log_s": 0.0}
    pool = ThreadPoolExecutor(max_workers=log_threads) if log_threads > 0 else None
    logged: list[Future[None]] = []
    pending: dict[Any, Any] = {}
    asked = done = 0
    before = meter.snapshot()
    t_start, c_start = time.perf_counter(), time.process_time()
    while done < n_trials:
        while asked < n_trials and len(pending) < slots:
            t0 = time.perf_counter()
            trial = study.ask()
            _suggest(trial)
            t1 = time.perf_counter()
            ref = actors[asked % len(actors)].evaluate.remote(trial.number, dict(trial.params), cost_s)
            pending[ref] = trial
            asked += 1
            t2 = time.perf_counter()
            phase["ask_s"] += t1 - t0
            phase["submit_s"] += t2 - t1
        t0 = time.perf_counter()
        ready, _ = ray.wait(list(pending), num_returns=1)
        t1 = time.perf_counter()
        phase["wait_s"] += t1 - t0
        for ref in ready:
            trial = pending.pop(ref)
            number, metrics = ray.get(ref)
            t2 = time.perf_counter()
            study.tell(trial, _suggest(trial))
            t3 = time.perf_counter()
            if client is not None and pool is not None:
                logged.append(pool.submit(_log_driver_trial, client, experiment_id, parent, number,
                                          dict(trial.params), metrics))
            elif client is not None:
                _log_driver_trial(client, experiment_id, parent, number, dict(trial.params), metrics)
            t4 = time.perf_counter()
            phase["tell_s"] += t3 - t2
            phase["log_s"] += t4 - t3
            done += 1
    t_drain = time.perf_counter()
    for future in logged:
        future.result()
    drain_s = time.perf_counter() - t_drain
    if pool is not None:
        pool.shutdown()
    wall = time.perf_counter() - t_start
    driver_cpu_s = time.process_time() - c_start
    services_cpu = CpuMeter.per_op_ms(before, meter.snapshot(), n_trials)
    for actor in actors:
        ray.kill(actor)
    busy_s = phase["ask_s"] + phase["submit_s"] + phase["tell_s"] + phase["log_s"]
    return {
        "slots": slots, "trial_cost_s": cost_s, "sampler": sampler_name, "mlflow": server is not None,
        "log_threads": log_threads, "trials": n_trials, "wall_s": wall, "trials_per_s": n_trials / wall,
        "log_drain_s": drain_s,
        "ideal_trials_per_s": slots / cost_s if cost_s > 0 else None,
        "driver_busy_frac": busy_s / wall,
        "driver_cpu_ms_per_trial": 1000 * driver_cpu_s / n_trials, **services_cpu,
        "driver_ms_per_trial": {k.removesuffix("_s"): 1000 * v / n_trials for k, v in phase.items()},
    }


def bench_driver(cluster: RayCluster, pg: PostgresServer, server: MlflowServer, meter: CpuMeter, *, cost_s: float,
                 slot_counts: list[int], trials_per_slot: int, max_trials: int) -> dict[str, Any]:
    import ray

    results: dict[str, Any] = {}
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    modes: list[tuple[str, str, MlflowServer | None, int]] = [
        ("random_inline_mlflow", "random", server, 0),
        ("tpe_inline_mlflow", "tpe", server, 0),
        ("random_threaded_mlflow", "random", server, 8),
        ("random_no_mlflow", "random", None, 0),
    ]
    try:
        for label, sampler_name, srv, threads in modes:
            for slots in slot_counts:
                n = min(max_trials, max(40, slots * trials_per_slot))
                result = driver_sim(cluster, pg, srv, meter, n_trials=n, slots=slots, cost_s=cost_s,
                                    sampler_name=sampler_name, log_threads=threads)
                results[f"{label}_slots{slots}"] = result
                _print(f"driver {label} slots={slots}", result)
    finally:
        ray.shutdown()
    return results


def _print(label: str, values: dict[str, Any]) -> None:
    shown = ", ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    sys.stdout.write(f"{label:<36} {shown}\n")
    sys.stdout.flush()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--parts", default="mlflow,optuna,optuna_running,ray,driver")
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    parser.add_argument("--mlflow-workers", type=int, default=2)
    parser.add_argument("--trial-cost-s", type=float, default=0.5)
    parser.add_argument("--slots", default="2,8,32,128")
    parser.add_argument("--no-durable", action="store_true",
                        help="PostgreSQL with fsync and synchronous_commit off (default: crash-safe defaults)")
    parser.add_argument("--tpe-sizes", default="0,1000,5000")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    # A background job ignores SIGINT; SIGTERM must still unwind the `with` blocks that stop the services.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parts = set(args.parts.split(","))
    quick = args.quick
    _quiet()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_avg_at_start": os.getloadavg(),
                                           "postgres_durable": not args.no_durable}}
    with tempfile.TemporaryDirectory(prefix="ks-bench-") as tmp, LocalServices() as services:
        work = Path(tmp)
        meter = CpuMeter(services)
        pg = services.start_postgres(durable=not args.no_durable)
        server = services.start_mlflow(pg, workers=args.mlflow_workers) if parts & {"mlflow", "driver"} else None
        cluster = services.start_ray((1, 1)) if parts & {"ray", "driver"} else None
        if "mlflow" in parts and server is not None:
            results["mlflow"] = bench_mlflow(server, 20 if quick else 300, work, meter)
        if "optuna" in parts:
            sizes = [0, 200] if quick else [int(s) for s in args.tpe_sizes.split(",")]
            results["optuna"] = bench_optuna(pg, 20 if quick else 300, sizes, work, meter)
        if "optuna_running" in parts:
            results["optuna_running"] = bench_optuna_running(pg, [0, 32, 128] if quick else [0, 32, 128, 512], meter)
        if "ray" in parts and cluster is not None:
            results["ray"] = bench_ray(cluster, 200 if quick else 5000)
        if "driver" in parts and cluster is not None and server is not None:
            slots = [2, 8] if quick else [int(s) for s in args.slots.split(",")]
            results["driver"] = bench_driver(cluster, pg, server, meter, cost_s=args.trial_cost_s, slot_counts=slots,
                                             trials_per_slot=2 if quick else 3, max_trials=40 if quick else 240)
        results["machine"]["load_avg_at_end"] = os.getloadavg()
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    sys.stdout.write(json.dumps(results["machine"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
