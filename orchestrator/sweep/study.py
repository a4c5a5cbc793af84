"""The Optuna side of a sweep: storage, sampler, study identity, and telling results.

Storage outlives the driver: a journal file under the study directory by default
(`optuna.storages.JournalStorage`), or any SQLAlchemy URL (`sqlite:///...`,
`postgresql://user@host/db`) as an `RDBStorage`. The study carries three user attributes:
`kernelsight.uid` (names its MLflow parent run), `kernelsight.identity` (hash of everything its
results depend on, checked on resume) and `kernelsight.spec` (the sweep file's text).

Trial states: `OK` -> COMPLETE with objective values and one constraint per `[slo]` bound;
`PRUNED` (stopped at a fidelity rung by `[search]`) -> PRUNED with its last rung's constraints;
`INFEASIBLE`/`INVALID` -> PRUNED with the `config_runs` constraint violated by +inf (samplers rank
them below every runnable configuration); `FAILED` -> FAIL. The `[slo]` constraints are relative to
their bounds (`objective.relative_violations`). The full `TrialResult` (metrics, kernel
breakdown, reason) is the trial's `kernelsight` user attribute.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Final

import optuna
from optuna.samplers import BaseSampler, GridSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from orchestrator.sweep import fast_truncnorm
from orchestrator.sweep.journal_lock import InterruptSafeLock
from orchestrator.sweep.objective import CONFIG_CONSTRAINT, CONFIG_VIOLATION, objective_values, relative_violations
from orchestrator.sweep.results import TrialResult, TrialStatus
from orchestrator.sweep.space import grid_search_space
from orchestrator.sweep.spec import SweepSpec
from sim.errors import ConfigError

logger = logging.getLogger(__name__)

RESULT_ATTR: Final = "kernelsight"
UID_ATTR: Final = "kernelsight.uid"
IDENTITY_ATTR: Final = "kernelsight.identity"
SPEC_ATTR: Final = "kernelsight.spec"
JOURNAL_FILE: Final = "optuna.journal"


class _AskTellGridSampler(GridSampler):
    """`GridSampler` whose end-of-grid `study.stop()` is skipped: it raises outside `optimize()`,
    and the driver already stops after the grid's size in trials."""

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        return None


def open_storage(url: str | None, study_dir: Path) -> tuple[BaseStorage, str]:
    """(storage, description): the journal file under `study_dir` if `url` is None, else an RDB URL."""
    if url is None:
        study_dir.mkdir(parents=True, exist_ok=True)
        path = study_dir / JOURNAL_FILE
        repair_journal(path)
        return JournalStorage(JournalFileBackend(str(path), lock_obj=InterruptSafeLock(str(path)))), str(path)
    if "://" not in url:
        raise ConfigError(source="--storage", key="--storage", value=url,
                          rule="must be a SQLAlchemy URL such as sqlite:///study.db or postgresql://user@host/db")
    return RDBStorage(sqlalchemy_url(url), engine_kwargs=_engine_kwargs(url)), redact(url)


def sqlalchemy_url(url: str) -> str:
    """The URL with a PostgreSQL driver that is installed.

    SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3; where only psycopg2 is installed (the
    `psycopg2-binary` wheel that most images carry) the bare scheme names psycopg2 instead.
    """
    bare = "postgresql://"
    if url.startswith(bare) and find_spec("psycopg") is None and find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len(bare):]
    return url


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True}


def redact(url: str) -> str:
    """The URL without its password, for logs and MLflow tags."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def repair_journal(path: Path) -> None:
    """Drop a partly written last line, left when a driver is killed mid-append.

    Optuna's reader skips such a line only while it is the last one; the next append would
    glue a valid record to it and make the file unreadable.
    """
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 1))
        if f.read(1) == b"\n":
            return
        f.seek(0)
        data = f.read()
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    logger.warning("%s: dropped an incomplete last record (%d bytes) left by a killed driver", path, size - keep)


def session_seed(seed: int, num_started: int) -> int:
    """The sampler seed of a driver session that starts with `num_started` trials in the study.

    `seed` itself for a new study; on resume a seed derived from both, because a sampler re-created
    with the study's seed would replay the draws of the first session (every RandomSampler draw,
    TPE's start-up trials) and re-run configurations the study already holds.
    """
    if num_started == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{num_started}".encode()).digest()[:4], "big")


def make_sampler(spec: SweepSpec, *, seed: int | None = None) -> BaseSampler:
    """The study's sampler, seeded with `seed` (default `study.seed`)."""
    seed = spec.seed if seed is None else seed
    opts = dict(spec.sampler_options)
    if spec.sampler == "tpe":
        fast_truncnorm.install()  # the same asks, ~half the time at 1,000 trials
        conditional = any(p.when for p in spec.space)
        multivariate = bool(opts.pop("multivariate", True))
        # constant_liar is set explicitly: its default has changed across Optuna versions, and
        # without it parallel asks pile onto the same point.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # multivariate/group
            return TPESampler(seed=seed, constant_liar=True, multivariate=multivariate,
                              group=multivariate and conditional, **opts)
    if spec.sampler == "nsga2":
        return NSGAIISampler(seed=seed, **opts)
    if spec.sampler == "grid":
        return _AskTellGridSampler(grid_search_space(spec.space), seed=seed)
    return RandomSampler(seed=seed)


def reproducibility(spec: SweepSpec, *, resumed_with: int) -> dict[str, str]:
    """What a re-run of this sweep reproduces (docs/sweep.md, "Reproducibility"); `resumed_with` is the
    number of trials the study held when this session started (0 for a new study)."""
    if spec.sampler in ("random", "grid"):
        params = ("trial N's parameters follow from study.seed alone, whatever --actors and the order in "
                  "which trials finish")
    else:
        params = (f"{spec.sampler} chooses each trial from the trials finished when it is asked, which depends "
                  "on --actors and on timing: a re-run with the same seed explores alike but not identically")
    out = {"trial_results": "each trial's metrics are a deterministic function of its parameters "
                            "(`kernelsight run --set ...` reproduces any trial)",
           "trial_params": params}
    if resumed_with:
        out["resume"] = (f"this session resumed a study of {resumed_with} trial(s) with sampler seed "
                         f"{session_seed(spec.seed, resumed_with)} = f(study.seed, {resumed_with}); trials "
                         "re-run after the interruption keep the parameters already drawn")
    return out


def grid_size(spec: SweepSpec) -> int:
    size = 1
    for values in grid_search_space(spec.space).values():
        size *= len(values)
    return size


def open_study(spec: SweepSpec, storage: BaseStorage, *, identity: str, resume: bool) -> tuple[optuna.Study, bool]:
    """(study, existed). A study that exists is continued only with `resume`, and only if its
    identity matches; otherwise `ConfigError` tells the user what to do."""
    names = {s.study_name: s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    existed = spec.name in names
    if existed and not resume:
        summary = names[spec.name]
        raise ConfigError(source=spec.source, key="study.name", value=spec.name,
                          rule=f"a study of this name already exists with {summary.n_trials} trial(s); "
                               "pass --resume to continue it, or give the study another name "
                               "(or remove its study directory)")
    study = optuna.create_study(
        storage=storage, sampler=make_sampler(spec), study_name=spec.name, load_if_exists=True,
        directions=[o.direction for o in spec.objectives] or ["minimize"],
    )
    num_started = sum(t.state is not TrialState.WAITING for t in study.get_trials(deepcopy=False))
    if num_started:
        study.sampler = make_sampler(spec, seed=session_seed(spec.seed, num_started))
    attrs = study.user_attrs
    if not existed or UID_ATTR not in attrs:
        study.set_user_attr(UID_ATTR, uuid.uuid4().hex)
        study.set_user_attr(IDENTITY_ATTR, identity)
        study.set_user_attr(SPEC_ATTR, spec.text)
    elif attrs.get(IDENTITY_ATTR) != identity:
        raise ConfigError(source=spec.source, key="study", value=spec.name,
                          rule="the sweep file, its base scenario or the kernelsight version changed since this study "
                               "started (only study.n_trials may change on --resume); give the study a new name")
    if existed and [d.name.lower() for d in study.directions] != [o.direction for o in spec.objectives]:
        raise ConfigError(source=spec.source, key="study.objectives", value=[o.direction for o in spec.objectives],
                          rule="the stored study has different objective directions")
    metric_names = [o.metric for o in spec.objectives]
    if metric_names and study.metric_names != metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metric_names)  # optuna-dashboard and Optuna's plots label the objectives
    return study, existed


def study_uid(study: optuna.Study) -> str:
    return str(study.user_attrs[UID_ATTR])


def trial_state(result: TrialResult, spec: SweepSpec) -> TrialState:
    """COMPLETE for a run with rankable objective values, FAIL for a failure, PRUNED otherwise."""
    if result.status is TrialStatus.OK:
        return TrialState.PRUNED if objective_values(result.metrics, spec.objectives) is None else TrialState.COMPLETE
    return TrialState.FAIL if result.status is TrialStatus.FAILED else TrialState.PRUNED


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult, spec: SweepSpec) -> TrialState:
    """Record `result` on `trial` (attributes, constraints) and finish it; a finished trial is left as is."""
    state = trial_state(result, spec)
    try:
        trial.set_user_attr(RESULT_ATTR, result.to_attrs())
    except optuna.exceptions.UpdateFinishedTrialError:
        return state
    values = objective_values(result.metrics, spec.objectives) if state is TrialState.COMPLETE else None
    constraints: dict[str, float] = {}
    if result.status in (TrialStatus.OK, TrialStatus.PRUNED):  # a pruned trial: its last rung's metrics
        constraints = {**relative_violations(result.metrics, spec.slo), CONFIG_CONSTRAINT: 0.0}
    elif result.status in (TrialStatus.INFEASIBLE, TrialStatus.INVALID):
        constraints = {CONFIG_CONSTRAINT: CONFIG_VIOLATION}
    with warnings.catch_warnings():
        # On resume a trial may already hold these (identical, deterministic) values; Optuna keeps them.
        warnings.filterwarnings("ignore", message="The constraint value is ignored")
        for key, value in constraints.items():
            trial.set_constraint(key, value)
    study.tell(trial, values, state=state, skip_if_finished=True)
    return state


def stored_result(trial: FrozenTrial) -> TrialResult | None:
    attrs = trial.user_attrs.get(RESULT_ATTR)
    return None if attrs is None else TrialResult.from_attrs(trial.number, trial.params, attrs)
