"""`kernelsight sweep SWEEP.toml`: search a sweep's space (or plan capacity) on Ray, record in MLflow.

Progress goes to stderr; the final table (or, with `--json`, one JSON document) to stdout.
Exit codes: 0 done, 1 a service failed (Ray, MLflow, storage), 2 invalid sweep file or flags,
130 interrupted (the study can be continued with `--resume`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import uuid
from argparse import Namespace
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.spec import SweepSpec
from sim.errors import ConfigError
from sim.serde import json_text

logger = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("sweep", help="search serving configurations (or plan capacity) on Ray, record in MLflow",
                       description=__doc__.splitlines()[0])
    p.add_argument("sweep", help="sweep TOML file (see docs/sweep.md)")
    p.add_argument("--trials", type=int, metavar="N", help="total trials in the study (default: study.n_trials)")
    p.add_argument("--actors", type=int, metavar="N", help="simulator actors (default: CPUs in the Ray cluster)")
    p.add_argument("--ray-address", metavar="A", help="join a running Ray cluster (e.g. auto, or HOST:6379)")
    p.add_argument("--tracking-uri", metavar="U",
                   help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///<study dir>/mlflow.db)")
    p.add_argument("--storage", metavar="S",
                   help="Optuna storage URL, e.g. postgresql://user@host/db (default: journal file in the study dir)")
    p.add_argument("--study-dir", metavar="DIR", help="study directory (default: runs/<study name>)")
    p.add_argument("--resume", action="store_true", help="continue the study if it exists")
    p.add_argument("--json", action="store_true", help="summary JSON on stdout")
    p.add_argument("--no-trial-plots", action="store_true",
                   help="skip the per-trial stacked-bar PNG (the Parquet breakdown is still logged)")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: Namespace) -> int:
    spec = load_sweep(args.sweep)
    for flag in ("trials", "actors"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(source=f"--{flag}", key=f"--{flag}", value=value, rule="must be >= 1")
    study_dir = Path(args.study_dir) if args.study_dir else Path("runs") / spec.name
    missing = [m for m in ("ray", "optuna", "mlflow", "matplotlib", "pyarrow", "tqdm") if not _importable(m)]
    if missing:
        sys.stderr.write(f"error: kernelsight sweep needs {', '.join(missing)}: "
                         "python -m pip install -e '.[orchestrate]'\n")
        return 1
    from orchestrator.sweep.resume_hint import STORAGE_ENV

    check_storage_url(args.storage or os.environ.get(STORAGE_ENV) or None)  # before Ray starts
    from orchestrator.sweep.session import resolved_tracking_uri

    check_tracking_uri(args.tracking_uri, resolved_tracking_uri(args.tracking_uri))
    from orchestrator.sweep.ray_env import prepare_ray_env

    prepare_ray_env(args.ray_address)  # before Ray is imported
    from orchestrator.sweep.session import quiet_service_loggers

    quiet_service_loggers()
    from sqlalchemy.exc import OperationalError

    from orchestrator.sweep.resume_hint import resume_hint
    from orchestrator.sweep.stdout_guard import ReservedStdout

    # A search logs through the MLflow child process, whose store errors arrive as ConnectionError;
    # only a capacity sweep (MLflow in this process) needs MLflow's own exception type here.
    service_errors: tuple[type[BaseException], ...] = (ConnectionError, OperationalError)
    if spec.capacity is not None:
        from mlflow.exceptions import MlflowException

        service_errors += (MlflowException,)

    # Ray prints to stdout on its own (`(raylet) ...` lines, forwarded worker output): while it runs,
    # stdout points at stderr and the table or JSON is written after Ray has shut down.
    with ReservedStdout() as out:
        try:
            if spec.capacity is not None:
                from orchestrator.sweep.capacity_command import run_capacity

                return run_capacity(spec, args, study_dir, emit=out.emit)
            return _run_search(spec, args, study_dir, emit=out.emit)
        except service_errors as exc:
            # A service (Ray, the MLflow store, the Optuna database) is unreachable or refused us.
            sys.stderr.write(f"error: {type(exc).__name__}: {exc}\n")
            if spec.capacity is None:
                sys.stderr.write("trials finished so far are kept; " + resume_hint(args, study_dir))
            return 1


STORAGE_SCHEMES = "sqlite:///study.db, postgresql://user@host/db, mysql://user@host/db"


def check_storage_url(url: str | None) -> None:
    """`--storage` must be a SQLAlchemy URL whose dialect SQLAlchemy knows (`foo://x` is not)."""
    if url is None:
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        make_url(url).get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise ConfigError(source="sweep", key="--storage", value=url,
                          rule=f"must be a SQLAlchemy database URL such as {STORAGE_SCHEMES} ({exc})") from None


TRACKING_SCHEMES: Final = frozenset({"file", "http", "https", "databricks", "sqlite", "postgresql", "mysql", "mssql"})
"""Schemes of MLflow's tracking stores (a database scheme may name its driver, e.g. postgresql+psycopg2)."""


def check_tracking_uri(given: str | None, uri: str | None) -> None:
    """`--tracking-uri` (`given`), or `MLFLOW_TRACKING_URI` where it is not given (`uri`, the one the
    sweep will use), must be a local path or a URI of a store MLflow has (checked before Ray starts:
    the MLflow child would find `foo://x` only after it). An empty `--tracking-uri` is refused: a
    variable that expanded to nothing (a cluster job's quoting) must not fall back silently to a
    local store that goes away with the pod."""
    key = "--tracking-uri" if given is not None else "MLFLOW_TRACKING_URI"
    if given is not None and not given.strip():
        raise ConfigError(source="sweep", key=key, value=given,
                          rule="is empty (a shell variable that expanded to nothing?); omit it for the study's "
                          "own store, or set MLFLOW_TRACKING_URI")
    if uri is None:
        return
    from urllib.parse import urlparse

    scheme = urlparse(uri).scheme
    if scheme and scheme.split("+")[0] not in TRACKING_SCHEMES:
        raise ConfigError(source="sweep", key=key, value=uri,
                          rule=f"must be a directory or a URI of scheme {', '.join(sorted(TRACKING_SCHEMES))}")
    if scheme in ("", "file") and mlflow_refuses_file_stores():
        raise ConfigError(source="sweep", key=key, value=uri,
                          rule=f"is a file store, which the installed MLflow refuses (maintenance mode) unless "
                          f"{ALLOW_FILE_STORE_ENV}=true is set; use a database such as sqlite:///mlflow.db, "
                          f"or set {ALLOW_FILE_STORE_ENV}=true")


ALLOW_FILE_STORE_ENV: Final = "MLFLOW_ALLOW_FILE_STORE"
"""MLflow's opt-in to its file store (recent releases raise when a `FileStore` is created without it)."""


def mlflow_refuses_file_stores() -> bool:
    """Whether the installed MLflow would refuse a file store: it has `MLFLOW_ALLOW_FILE_STORE` and the
    variable is not true (`_BooleanEnvironmentVariable`: `true` / `1`, any case). Read from MLflow's
    source rather than by importing it: the check runs before Ray starts, and `import mlflow` costs
    about a second."""
    if os.environ.get(ALLOW_FILE_STORE_ENV, "").strip().lower() in ("true", "1"):
        return False
    try:
        spec = importlib.util.find_spec("mlflow")
    except ValueError:  # already imported as None
        return False
    if spec is None or spec.origin is None:
        return False
    variables = Path(spec.origin).with_name("environment_variables.py")
    try:
        return ALLOW_FILE_STORE_ENV in variables.read_text(encoding="utf-8")
    except OSError:
        return False


def _run_search(spec: SweepSpec, args: Namespace, study_dir: Path, *, emit: Callable[[str], None]) -> int:
    import ray
    from optuna.trial import TrialState

    from orchestrator.sweep.driver import SweepDriver, needs_actors, study_identity_tags, wanted_trials
    from orchestrator.sweep.optuna_plots import optuna_plot_files
    from orchestrator.sweep.pool import ShardPool
    from orchestrator.sweep.progress import ProgressBar
    from orchestrator.sweep.report import report_files
    from orchestrator.sweep.resume_hint import STORAGE_ENV, resume_hint
    from orchestrator.sweep.session import (
        calibration_files,
        connect_ray,
        default_num_actors,
        make_tracker_process,
        ui_hint,
    )
    from orchestrator.sweep.signals import exit_code, sigterm_as_interrupt, stopped_word
    from orchestrator.sweep.study import open_storage, open_study, reproducibility, study_uid
    from orchestrator.sweep.tracker_process import TrackerProcessError

    base = spec.load_base()
    storage, storage_desc = open_storage(args.storage or os.environ.get(STORAGE_ENV) or None, study_dir)
    study, existed = open_study(spec, storage, identity=spec.identity(base), resume=args.resume)
    resumed_with = sum(t.state is not TrialState.WAITING for t in study.get_trials(deepcopy=False))
    n_trials = args.trials or spec.n_trials
    work = needs_actors(study, spec, n_trials)
    pool = None
    started = False
    num_actors = 0
    with ThreadPoolExecutor(max_workers=1) as executor:
        # The MLflow child takes seconds to start (importing MLflow; migrating a new database): Ray
        # connects and the simulator actors start meanwhile.
        tracker_future = executor.submit(make_tracker_process, args.tracking_uri, spec, study_dir)
        try:
            if work:
                started = connect_ray(args.ray_address, args.actors)
                num_actors = args.actors or default_num_actors()
                pool = ShardPool(ray.put(base), num_actors=num_actors, render_artifacts=not args.no_trial_plots,
                                 name_prefix=f"kernelsight-{spec.name}-{uuid.uuid4().hex[:6]}")
            tracker = tracker_future.result()
        except BaseException:
            if pool is not None:
                pool.close()
            if started:
                ray.shutdown()
            with contextlib.suppress(Exception):  # the MLflow child started meanwhile: end it too
                tracker_future.result().close()
            raise
    stopping = contextlib.ExitStack()
    try:
        # A SIGTERM stops the sweep as Ctrl-C does (orchestrator.sweep.signals); entered after
        # connect_ray, whose core worker installs a handler of its own, and left after the clean-up.
        stopping.enter_context(sigterm_as_interrupt())
        tracker.start_study(study_uid=study_uid(study), spec=spec,
                            tags={"mode": "search", "storage": storage_desc, "n_trials": str(n_trials),
                                  "sampler": spec.sampler, "sim_version": _sim_version(),
                                  **study_identity_tags(base, spec)},
                            files=[("scenario", Path(spec.base_scenario)),
                                   *(("calibrations", f) for f in calibration_files(base, spec))])
        logger.info("study %s: %s, %d actor(s), storage %s, tracking %s", spec.name,
                    "resuming" if existed else "new", num_actors, storage_desc, tracker.tracking_uri)
        finished = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        bar = ProgressBar(wanted_trials(spec, n_trials), label=spec.name, initial=finished)
        driver = SweepDriver(spec, base, study, tracker, pool, n_trials=n_trials, progress=bar.update,
                             storage_desc=storage_desc)
        try:
            report = driver.run()
            bar.close()
            tracker.finish_study(files={**report_files(report), **optuna_plot_files(study, spec)},
                                 metrics=_study_metrics(report.counts(), report.timings.wall_s), ok=True)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (`Terminated`)
            bar.close()
            with contextlib.suppress(Exception):  # best effort: the store may be what failed
                tracker.interrupt_study()
            sys.stderr.write(f"\n{stopped_word(exc)}; " + resume_hint(args, study_dir))
            return exit_code(exc)
        except BaseException as exc:
            bar.close()
            if not isinstance(exc, TrackerProcessError):  # MLflow itself answers: end the parent run FAILED
                with contextlib.suppress(Exception):
                    tracker.finish_study(files={}, metrics={}, ok=False)
            raise
    finally:
        if pool is not None:
            pool.close()
        if started:
            ray.shutdown()
        tracker.close()
        stopping.close()
    repro = reproducibility(spec, resumed_with=resumed_with)
    if args.json:
        payload = report.to_json()
        payload["mlflow_ui"] = ui_hint(tracker.tracking_uri)
        payload["reproducibility"] = repro
        emit(json_text(payload) + "\n")
    else:
        emit(report.render())
        emit(f"\nresults: {ui_hint(tracker.tracking_uri)}\n")
        emit("reproducibility: " + "; ".join(v for k, v in repro.items() if k != "trial_results") + "\n")
    return 0


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # already imported as None
        return False


def _study_metrics(counts: dict[str, int], wall_s: float) -> dict[str, float]:
    out = {f"num_trials_{k}": float(v) for k, v in counts.items()}
    out["num_trials"] = float(sum(counts.values()))
    out["last_session_wall_s"] = wall_s
    return out


def _sim_version() -> str:
    from sim.api import __version__

    return __version__
