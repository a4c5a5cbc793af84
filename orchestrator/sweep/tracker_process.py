"""The sweep's MLflow tracker in a child process, so MLflow's client work runs beside the driver
instead of taking turns with it under one GIL.

Writing a trial's run (create, one `log_batch`, artifacts, end status) costs ~50-100 ms of Python
(SQLAlchemy, the artifact repository, MLflow's own bookkeeping). On the recorder thread that time
held the driver's GIL while the main thread was asking TPE for the next trial; in a 400-trial
quickstart sweep MLflow held it 40% of the time and TPE 28% (py-spy `--gil`). Here the recorder
thread sends each call down a pipe and waits on it, which releases the GIL.

The call order, the error handling and what a killed driver leaves behind are those of an in-process
`MlflowTracker`: every call is answered before the next is sent, an error raised in the child is
raised again in the driver, a child that dies makes the next call fail with a clear error, and a
driver that dies closes the pipe, which ends the child. The child ignores SIGINT and SIGTERM, so a
Ctrl-C or a SIGTERM sent to the whole process group stops only the driver, which then marks the parent
run KILLED through the child before it closes it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Final

from orchestrator.sweep import faults
from orchestrator.sweep.results import TrialResult
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.tracker import LoggedRun

_READY: Final = "ready"


class TrackerProcessError(ConnectionError):
    """The MLflow store refused a call (MLflow's or the database driver's error, carried over by its
    type and message), or the tracker's child process died. A `ConnectionError`, as an unreachable
    service is to the sweep command: it stops with what was recorded kept and the `--resume` line."""


class TrackerProcess:
    """A `Tracker` whose `MlflowTracker(tracking_uri, experiment_name, artifact_location=...)` lives
    in a child process (started with `spawn`: the driver already runs Ray's threads)."""

    def __init__(self, tracking_uri: str, experiment_name: str, *, artifact_location: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._lock = threading.Lock()
        self._unanswered = 0
        """Requests whose answers were never read (a Ctrl-C while waiting): read before the next call."""
        self._process = context.Process(
            target=_serve, name="kernelsight-mlflow",
            args=(child_conn, tracking_uri, experiment_name, artifact_location, os.getpid(),
                  logging.getLogger().getEffectiveLevel()),
            daemon=True)
        self._process.start()
        child_conn.close()
        try:
            self._answer()  # the tracker's constructor: creates or finds the experiment
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The child's process id (benchmarks read its CPU time)."""
        assert self._process.pid is not None
        return self._process.pid

    # -- Tracker ------------------------------------------------------------------------------

    def start_study(self, *, study_uid: str, spec: SweepSpec, tags: Mapping[str, str],
                    files: Sequence[tuple[str, Path]]) -> None:
        self._call("start_study", study_uid=study_uid, spec=spec, tags=dict(tags), files=list(files))

    def logged_trials(self) -> dict[int, LoggedRun]:
        found: dict[int, LoggedRun] = self._call("logged_trials")
        return found

    def log_trial(self, result: TrialResult, *, tags: Mapping[str, str], timestamp_ms: int,
                  existing: LoggedRun | None = None) -> None:
        self._call("log_trial", result, tags=dict(tags), timestamp_ms=timestamp_ms, existing=existing)

    def finish_study(self, *, files: Mapping[str, bytes], metrics: Mapping[str, float], ok: bool) -> None:
        self._call("finish_study", files=dict(files), metrics=dict(metrics), ok=ok)

    def interrupt_study(self) -> None:
        self._call("interrupt_study")

    def describe(self) -> dict[str, str]:
        described: dict[str, str] = self._call("describe")
        return described

    def close(self) -> None:
        """End the child (idempotent); calls after this fail."""
        with self._lock:
            if self._process.is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    self._conn.send(None)
                self._process.join(timeout=30.0)
                if self._process.is_alive():
                    self._process.kill()
                    self._process.join()
            self._conn.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            while self._unanswered:
                self._answer(method, stale=True)
            try:
                self._conn.send((method, args, kwargs))
            except (BrokenPipeError, OSError) as exc:
                raise self._died(method) from exc
            self._unanswered += 1
            return self._answer(method)

    def _answer(self, method: str = "MlflowTracker()", *, stale: bool = False) -> Any:
        try:
            ok, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            raise self._died(method) from exc
        self._unanswered = max(0, self._unanswered - 1)
        if stale:
            return None
        if not ok:
            raise value
        return value

    def _died(self, method: str) -> TrackerProcessError:
        self._process.join(timeout=5.0)
        return TrackerProcessError(f"the MLflow tracker process (pid {self._process.pid}) ended during "
                                   f"{method} with exit code {self._process.exitcode}; what it had logged "
                                   "stays in the store, and --resume completes the rest")


def _serve(conn: Connection, tracking_uri: str, experiment_name: str, artifact_location: str | None,
           driver_pid: int, log_level: int) -> None:
    """The child: build the tracker, then answer calls until the driver sends None or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # ends with the driver's pipe instead
    faults.also_kill(driver_pid)  # a fault point here stops the driver, as it would in-process
    from orchestrator.sweep.session import quiet_service_loggers
    from orchestrator.sweep.tracking import MlflowTracker

    logging.basicConfig(level=log_level)
    quiet_service_loggers()
    try:
        tracker = MlflowTracker(tracking_uri, experiment_name, artifact_location=artifact_location)
    except BaseException as exc:
        _reply(conn, False, _store_error(exc))
        _exit_now()
        return
    _reply(conn, True, _READY)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            _exit_now()  # the driver is gone
            return
        if request is None:
            _exit_now()
            return
        method, args, kwargs = request
        try:
            value = getattr(tracker, method)(*args, **kwargs)
        except BaseException as exc:
            _reply(conn, False, _store_error(exc))
            continue
        _reply(conn, True, value)


def _exit_now() -> None:
    """End the child without the interpreter's teardown of MLflow's modules (~1-2 s): every call was
    answered after MLflow returned, so what it wrote is committed and nothing is left to flush."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _store_error(exc: BaseException) -> BaseException:
    """MLflow's and the database driver's errors as `TrackerProcessError` (the driver does not import
    MLflow, and SQLAlchemy's errors do not survive pickling); every other error as it is."""
    module = type(exc).__module__
    if module.startswith(("mlflow", "sqlalchemy", "psycopg2", "pymysql", "sqlite3", "requests", "urllib3")):
        return TrackerProcessError(f"MLflow store: {type(exc).__name__}: {exc}")
    return exc


def _reply(conn: Connection, ok: bool, value: Any) -> None:
    try:
        payload = pickle.dumps((ok, value))
        pickle.loads(payload)  # some exceptions pickle but cannot be rebuilt from their args
    except Exception:
        # an exception that does not pickle (a database driver's, say) still reaches the driver
        text = "".join(traceback.format_exception(value)) if isinstance(value, BaseException) else repr(value)
        payload = pickle.dumps((False, TrackerProcessError(f"in the MLflow tracker process: {text}")))
    conn.send_bytes(payload)
