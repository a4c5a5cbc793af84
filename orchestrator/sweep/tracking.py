"""MLflow records of a sweep, through `MlflowClient` with explicit run ids (no fluent global state).

Layout: one experiment per study (named after it); one parent run per study, found again on
resume by its `study_uid` tag; one child run per Optuna trial, named `trial-00042` and tagged
`trial_number`, so a resumed driver looks runs up before creating them and each trial appears
once. Child runs carry the trial's parameters under their dotted scenario keys, every metric
(`orchestrator.sweep.metrics`), kernel time shares (`share.<kind>`), tags (status,
scenario_hash, worst_provenance, sim_version, optuna_state, feasible) and the kernel breakdown
as Parquet, as an MLflow table (`kernel_breakdown.json`, previewed in the run's Artifacts tab) and
as a stacked-bar PNG. Every run is tagged with the model, hardware and backend it simulated.

A run left half-written (the driver died, or MLflow failed, between its calls) is completed on
resume: metric keys it already holds are not logged again, so no metric gets a second point; extra
copies of a run (a create retried after a lost response) are marked FAILED and deleted. The
experiment carries `mlflow.experimentKind = custom_model_development`, so MLflow 3 opens it as a
classic ML experiment (runs, metrics, artifacts) rather than a GenAI one.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag, ViewType
from mlflow.store.artifact.artifact_repo import ArtifactRepository
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

from orchestrator.sweep.faults import fault_point
from orchestrator.sweep.results import Breakdown, TrialResult
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.tracker import LoggedRun
from sim.errors import ConfigError

logger = logging.getLogger(__name__)

_MAX_PARAMS: Final = 100
"""LogBatch accepts at most 100 params, 1000 metrics and 1000 entities in total per request."""
_MAX_METRICS: Final = 900
_MAX_TAG_CHARS: Final = 4000
EXPERIMENT_KIND_TAG: Final = "mlflow.experimentKind"
EXPERIMENT_KIND: Final = "custom_model_development"
"""MLflow 3's value for a classic ML experiment (the other is `genai_development`)."""
BREAKDOWN_TABLE: Final = "kernel_breakdown.json"
_LOGGED_ARTIFACTS_TAG: Final = "mlflow.loggedArtifacts"


class MlflowTracker:
    def __init__(self, tracking_uri: str, experiment_name: str, *, artifact_location: str | None = None) -> None:
        self.tracking_uri = tracking_uri
        self._client = MlflowClient(tracking_uri=tracking_uri)
        exp = self._client.get_experiment_by_name(experiment_name)
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise ConfigError(source=tracking_uri, key="experiment", value=experiment_name,
                              rule="this MLflow experiment is deleted; restore it, purge it (mlflow gc) "
                                   "or rename the study")
        kind = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        if exp is None:
            self.experiment_id: str = self._client.create_experiment(
                experiment_name, artifact_location=artifact_location, tags=kind)
        else:
            self.experiment_id = exp.experiment_id
            if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                self._client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        self.parent_run_id = ""
        self._study_uid = ""

    def start_study(self, *, study_uid: str, spec: SweepSpec, tags: Mapping[str, str],
                    files: Sequence[tuple[str, Path]]) -> None:
        self._study_uid = study_uid
        found = self._client.search_runs(
            [self.experiment_id], filter_string=f"tags.study_uid = '{study_uid}' and tags.role = 'parent'",
            run_view_type=ViewType.ACTIVE_ONLY, max_results=10)
        if found:
            self.parent_run_id = self._pick_parent([r.info.run_id for r in found])
            self._client.update_run(self.parent_run_id, status="RUNNING")
        else:
            run = self._client.create_run(self.experiment_id, run_name=spec.name,
                                          tags={"study_uid": study_uid, "role": "parent", **tags})
            self.parent_run_id = run.info.run_id
        params = [Param(k, _param_text(v)) for k, v in _study_params(spec).items()]
        for chunk in _chunks(params, _MAX_PARAMS):
            self._client.log_batch(self.parent_run_id, params=chunk)
        self._client.log_batch(self.parent_run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        self._client.log_text(self.parent_run_id, spec.text, "sweep.toml")
        for folder, path in files:
            self._client.log_artifact(self.parent_run_id, str(path), artifact_path=folder)

    def _pick_parent(self, run_ids: list[str]) -> str:
        """The study's parent run; extra parents (a create retried after a lost response) are retired.

        The one the trial runs point at is kept (the driver used the id its create returned), else
        the oldest.
        """
        if len(run_ids) == 1:
            return run_ids[0]
        used = [rid for rid in run_ids if self._client.search_runs(
            [self.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{rid}'", max_results=1)]
        keep = (used or sorted(run_ids, key=lambda rid: self._client.get_run(rid).info.start_time or 0))[0]
        for rid in run_ids:
            if rid != keep:
                self._retire(rid, keep, "parent")
        return keep

    def _retire(self, run_id: str, kept: str, what: str) -> None:
        """End an extra copy of a run as FAILED (so nothing is left RUNNING) and delete it."""
        logger.warning("extra MLflow %s run %s (kept %s): marking it FAILED and deleting it", what, run_id, kept)
        self._client.set_tag(run_id, "duplicate_of", kept)
        self._client.set_terminated(run_id, "FAILED")
        self._client.delete_run(run_id)

    def logged_trials(self) -> dict[int, LoggedRun]:
        """Child runs already recorded for this study, by trial number; extra copies are retired."""
        runs: dict[int, list[LoggedRun]] = {}
        token = None
        while True:
            page = self._client.search_runs(
                [self.experiment_id], filter_string=f"tags.study_uid = '{self._study_uid}' and tags.role = 'trial'",
                run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
            for run in page:
                number = int(run.data.tags["trial_number"])
                runs.setdefault(number, []).append(LoggedRun(run.info.run_id, run.info.status))
            token = page.token
            if not token:
                break
        out: dict[int, LoggedRun] = {}
        for number, copies in runs.items():
            copies.sort(key=lambda r: (not r.is_done(), r.run_id))
            out[number] = copies[0]
            for extra in copies[1:]:
                self._retire(extra.run_id, out[number].run_id, f"trial {number}")
        return out

    def log_trial(self, result: TrialResult, *, tags: Mapping[str, str], timestamp_ms: int,
                  existing: LoggedRun | None = None) -> None:
        if existing is not None and existing.is_done():
            return
        all_tags = {"trial_number": str(result.number), **_trial_tags(result), **tags}
        if result.reason:
            all_tags["mlflow.note.content"] = result.reason[:_MAX_TAG_CHARS]
        artifacts = dict(result.artifacts)
        if result.breakdown is not None:
            artifacts[BREAKDOWN_TABLE] = breakdown_table_json(result.breakdown)
            all_tags[_LOGGED_ARTIFACTS_TAG] = json.dumps([{"path": BREAKDOWN_TABLE, "type": "table"}])
        self.log_child(run_name=f"trial-{result.number:05d}", params=result.params, metrics=_trial_metrics(result),
                       tags=all_tags, artifacts=artifacts, failed=result.status.value == "failed",
                       timestamp_ms=timestamp_ms, duration_s=result.duration_s, existing=existing)

    def log_child(self, *, run_name: str, params: Mapping[str, Any], metrics: Mapping[str, float],
                  tags: Mapping[str, str], artifacts: Mapping[str, bytes], failed: bool, timestamp_ms: int,
                  duration_s: float, existing: LoggedRun | None = None, role: str = "trial") -> str:
        """One child run of the parent, written in four batched calls; returns its run id.

        With `existing` (a run a killed driver left unfinished), the run is completed: keys it
        already holds are not logged again, so no metric gets a second point (a re-evaluated trial's
        `trial_duration_s` differs from the first attempt's).
        """
        all_tags = {"study_uid": self._study_uid, "role": role, "mlflow.parentRunId": self.parent_run_id, **tags}
        held_metrics: set[str] = set()
        held_params: set[str] = set()
        if existing is None:
            info = self._client.create_run(self.experiment_id, run_name=run_name, start_time=timestamp_ms,
                                           tags=all_tags).info
            run_id: str = info.run_id
        else:
            run_id = existing.run_id
            held_run = self._client.get_run(run_id)
            info, held = held_run.info, held_run.data
            held_metrics, held_params = set(held.metrics), set(held.params)
            self._client.log_batch(run_id, tags=[RunTag(k, v) for k, v in all_tags.items()])
        fault_point(f"{role}-run-created")
        p_list = [Param(k, _param_text(v)) for k, v in params.items() if k not in held_params]
        m_list = [Metric(k, float(v), timestamp_ms, 0) for k, v in metrics.items() if k not in held_metrics]
        for p_chunk, m_chunk in _zip_chunks(p_list, m_list):
            if p_chunk or m_chunk:
                self._client.log_batch(run_id, params=p_chunk, metrics=m_chunk)
        fault_point(f"{role}-metrics-logged")
        if artifacts:
            with tempfile.TemporaryDirectory(prefix="kernelsight-") as tmp:
                for name, data in artifacts.items():
                    (Path(tmp) / name).write_bytes(data)
                self._artifact_repository(info.artifact_uri).log_artifacts(tmp)  # type: ignore[no-untyped-call]
        self._client.set_terminated(run_id, "FAILED" if failed else "FINISHED",
                                    end_time=timestamp_ms + max(1, int(duration_s * 1000)))
        return run_id

    def _artifact_repository(self, artifact_uri: str) -> ArtifactRepository:
        """The run's artifact store, from the artifact URI the run was created or read with: what
        `MlflowClient.log_artifacts` builds after reading the run again (a `get_run` per call;
        `benchmarks/bench_mlflow_log.py` puts the saving at ~8% of a trial's logging)."""
        uri: str = add_databricks_profile_info_to_artifact_uri(  # type: ignore[no-untyped-call]
            artifact_uri, self.tracking_uri)
        return get_artifact_repository(uri, tracking_uri=self.tracking_uri)

    def finish_study(self, *, files: Mapping[str, bytes], metrics: Mapping[str, float], ok: bool) -> None:
        with tempfile.TemporaryDirectory(prefix="kernelsight-") as tmp:
            for name, data in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            self._client.log_artifacts(self.parent_run_id, tmp)
        if metrics:
            self._client.log_batch(self.parent_run_id, metrics=[Metric(k, v, _now_ms(), 0) for k, v in metrics.items()])
        status = RunStatus.FINISHED if ok else RunStatus.FAILED
        self._client.set_terminated(self.parent_run_id, RunStatus.to_string(status))

    def interrupt_study(self) -> None:
        """Mark the parent run KILLED (Ctrl-C); `--resume` sets it RUNNING again."""
        if self.parent_run_id:
            self._client.set_terminated(self.parent_run_id, RunStatus.to_string(RunStatus.KILLED))

    def describe(self) -> dict[str, str]:
        return {"tracking_uri": self.tracking_uri, "experiment_id": self.experiment_id,
                "parent_run_id": self.parent_run_id}

    def close(self) -> None:
        """Nothing to release: the client opens connections per call."""
        return None


def _trial_tags(result: TrialResult) -> dict[str, str]:
    tags = {"status": result.status.value, "scenario_hash": result.scenario_hash,
            "worst_provenance": result.worst_provenance, "sim_version": result.sim_version,
            "ray_node_id": result.ray_node_id}
    if result.cached_from is not None:
        tags["cached_from_trial"] = str(result.cached_from)
    return {k: v for k, v in tags.items() if v}


def breakdown_table_json(breakdown: Breakdown) -> bytes:
    """The kernel breakdown in the format `MlflowClient.log_table` writes (pandas `orient="split"`
    without index), so MLflow's UI previews it and `MlflowClient.load_table` reads it. Written here
    and uploaded with the run's other artifacts: `log_table` itself would cost four more calls per
    trial and would append rows to a table a killed driver had already written."""
    rows = breakdown.rows()
    columns = ["kernel", "seconds", "share"]
    return json.dumps({"columns": columns, "data": [[row[c] for c in columns] for row in rows]}).encode()


def _trial_metrics(result: TrialResult) -> dict[str, float]:
    out = dict(result.metrics)
    if result.breakdown is not None:
        out.update({f"share.{k}": v for k, v in result.breakdown.share_by_kind().items()})
    out["trial_duration_s"] = result.duration_s
    return out


def _study_params(spec: SweepSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"study.sampler": spec.sampler, "study.seed": spec.seed,
                           "base.scenario": Path(spec.base_scenario).name}
    for o in spec.objectives:
        out[f"objective.{o.metric}"] = o.direction
    for b in spec.slo:
        out[f"slo.{b.metric}"] = (f"<= {b.max_value}" if b.min_value is None else
                                  f">= {b.min_value}" if b.max_value is None else f"[{b.min_value}, {b.max_value}]")
    for k, v in spec.base_set.items():
        out[f"base.set.{k}"] = v
    if spec.capacity is not None:
        out["capacity.target_request_rate"] = spec.capacity.target_request_rate
    return out


def _param_text(value: Any) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _chunks(items: list[Any], size: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _zip_chunks(params: list[Param], metrics: list[Metric]) -> Iterable[tuple[list[Param], list[Metric]]]:
    n = max((len(params) + _MAX_PARAMS - 1) // _MAX_PARAMS, (len(metrics) + _MAX_METRICS - 1) // _MAX_METRICS, 1)
    for i in range(n):
        yield params[i * _MAX_PARAMS:(i + 1) * _MAX_PARAMS], metrics[i * _MAX_METRICS:(i + 1) * _MAX_METRICS]


def _now_ms() -> int:
    return int(time.time() * 1000)
