"""Connecting a sweep to its services: Ray, the MLflow tracking store, the study directory.

Defaults are embedded and need no server: a fresh local Ray instance (`address="local"`, so a
cluster someone else started with `ray start` is never joined by accident), and an MLflow store
in the study directory (`sqlite:///<study dir>/mlflow.db`, artifacts in `<study dir>/mlartifacts`),
which `mlflow ui --backend-store-uri sqlite:///<study dir>/mlflow.db` opens.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from orchestrator.sweep.evaluate import build_scenario
from orchestrator.sweep.serving import POOL_PREFIX, POOLS, SERVING_KEY
from orchestrator.sweep.space import iter_combos, probe_values
from orchestrator.sweep.spec import ParamSpec, ParamValue, SweepSpec
from orchestrator.sweep.tracker_process import TrackerProcess
from sim.errors import ConfigError
from sim.specs.scenario import Scenario

if TYPE_CHECKING:
    from orchestrator.sweep.tracking import MlflowTracker

logger = logging.getLogger(__name__)

LOOPBACK: Final = "127.0.0.1"
MLFLOW_DB: Final = "mlflow.db"
MLFLOW_ARTIFACTS: Final = "mlartifacts"
_QUIET: Final = ("alembic", "mlflow", "ray", "optuna", "urllib3")


def quiet_service_loggers() -> None:
    """Keep MLflow's schema migrations, Ray's start-up chatter and Optuna's per-trial lines off stderr,
    and MLflow's "View run at" lines off stdout (which carries the sweep's table or JSON)."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def default_tracking_uri(study_dir: Path) -> str:
    """`sqlite:///` URI of the study's MLflow database: relative when inside the working directory."""
    path = (study_dir / MLFLOW_DB).resolve()
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd().resolve())
    return f"sqlite:///{path}"


def make_tracker(tracking_uri: str | None, spec: SweepSpec, study_dir: Path) -> MlflowTracker:
    """The study's MLflow tracker in this process; local stores keep artifacts in the study directory."""
    from orchestrator.sweep.tracking import MlflowTracker

    uri, name, artifacts = _tracker_args(tracking_uri, spec, study_dir)
    return MlflowTracker(uri, name, artifact_location=artifacts)


def make_tracker_process(tracking_uri: str | None, spec: SweepSpec, study_dir: Path) -> TrackerProcess:
    """The same tracker in a child process (`orchestrator.sweep.tracker_process`): what a search
    sweep logs through, so MLflow's work does not hold the driver's GIL. Close it when done."""
    uri, name, artifacts = _tracker_args(tracking_uri, spec, study_dir)
    return TrackerProcess(uri, name, artifact_location=artifacts)


TRACKING_ENV = "MLFLOW_TRACKING_URI"
"""MLflow's own variable, read when `--tracking-uri` is not given (a cluster's pods and Ray jobs get
it from their environment, where argv quoting cannot lose it)."""


def resolved_tracking_uri(tracking_uri: str | None) -> str | None:
    """`--tracking-uri`, else `MLFLOW_TRACKING_URI` from the environment, else None (the study's own
    sqlite store)."""
    return tracking_uri if tracking_uri is not None else (os.environ.get(TRACKING_ENV) or None)


def _tracker_args(tracking_uri: str | None, spec: SweepSpec, study_dir: Path) -> tuple[str, str, str | None]:
    uri = resolved_tracking_uri(tracking_uri) or default_tracking_uri(study_dir)
    artifacts = None
    if not uri.startswith(("http://", "https://", "databricks")):
        study_dir.mkdir(parents=True, exist_ok=True)
        artifacts = (study_dir / MLFLOW_ARTIFACTS).resolve().as_uri()
    return uri, spec.name, artifacts


def ui_hint(tracking_uri: str) -> str:
    if tracking_uri.startswith(("http://", "https://")):
        return f"open {tracking_uri} in a browser"
    return f"mlflow ui --backend-store-uri {tracking_uri}   # then open http://127.0.0.1:5000"


def connect_ray(address: str | None, num_actors: int | None) -> bool:
    """Start or join Ray; True if this call connected (and the caller should disconnect)."""
    import ray

    if ray.is_initialized():
        return False
    # Worker output stays in Ray's log files unless RAY_LOG_TO_DRIVER=1; forwarded lines go to stderr
    # (orchestrator.sweep.stdout_guard), never into the sweep's table or JSON.
    log_to_driver = os.environ.get("RAY_LOG_TO_DRIVER", "0").lower() in ("1", "true")
    if address is None:
        cpus = max(os.cpu_count() or 1, num_actors or 0)
        # 127.0.0.1 takes effect through RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (orchestrator.sweep.ray_env):
        # Ray otherwise replaces a loopback node address with the host's routable one.
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=log_to_driver,
                 logging_level=logging.WARNING, configure_logging=True, _node_ip_address=LOOPBACK)
    else:
        # Ship this checkout's simulator and orchestrator so remote workers run the driver's code.
        import orchestrator
        import sim

        modules = [str(Path(m.__file__).parent) for m in (sim, orchestrator) if m.__file__]
        try:
            ray.init(address=address, log_to_driver=log_to_driver, logging_level=logging.WARNING,
                     runtime_env={"py_modules": modules})
        except ValueError as exc:
            if address not in str(exc):  # not Ray's parse of the address ("... (full address = X)")
                raise
            raise ConfigError(source="sweep", key="--ray-address", value=address,
                              rule=f"must be a Ray cluster address such as 10.0.0.5:6379, ray://host:10001 or auto "
                                   f"({exc})") from None
    return True


def default_num_actors() -> int:
    import ray

    resources: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return max(1, int(resources.get("CPU", 1)))


MAX_GPU_PROBES: Final = 4096
"""Scenario builds `trial_gpus` may spend (a few per swept GPU in practice)."""
_HW_KEYS: Final = ("hardware.name", *(f"{POOL_PREFIX}{pool}.hardware" for pool in POOLS))


def trial_gpus(base: Scenario, spec: SweepSpec) -> set[str]:
    """Every GPU a trial runs on, each disaggregated pool's own included: the hardware of the scenarios
    that the combinations of the keys choosing it build (`hardware.name`, the pools' `hardware`, the
    `serving` switch, the pool keys whose presence makes a trial disaggregated, and the keys their
    `when` conditions test; every other key keeps the base's value, which no GPU depends on)."""
    space = _gpu_space(spec.space)
    # A pool's engine key or worker count chooses no GPU: its presence alone makes a trial disaggregated.
    presence_only = {p.key for p in space if p.key.startswith(POOL_PREFIX) and p.key not in _HW_KEYS} - {
        c.key for p in space for c in p.when}

    def values(p: ParamSpec) -> tuple[ParamValue, ...]:
        probe = probe_values(p, spec.space)
        return probe[:1] if p.key in presence_only else probe

    names: set[str] = set()
    for i, combo in enumerate(iter_combos(space, values)):
        if i == MAX_GPU_PROBES:
            return names | _named_gpus(base, spec.space)
        try:
            scenario = build_scenario(base, combo)
        except ConfigError:
            # Broken with the base's other keys: count every GPU it names, as a trial could run on them.
            names |= _named_gpus(base, spec.space, combo)
            continue
        pools = scenario.disaggregation.pools() if scenario.disaggregation is not None else ()
        names |= {pool.scenario.hardware.name for pool in pools} or {scenario.hardware.name}
    return names


def _gpu_space(space: Sequence[ParamSpec]) -> list[ParamSpec]:
    """The entries that choose a trial's GPUs, with the earlier entries their conditions test (file order)."""
    needed: set[str] = set()
    kept: list[ParamSpec] = []
    for p in reversed(space):
        if p.key in _HW_KEYS or p.key == SERVING_KEY or p.key.startswith(POOL_PREFIX) or p.key in needed:
            kept.append(p)
            needed |= {c.key for c in p.when}
    return kept[::-1]


def _named_gpus(base: Scenario, space: Sequence[ParamSpec], drawn: Mapping[str, ParamValue] | None = None
                ) -> set[str]:
    """The base's GPUs (its pools' too) and the hardware values `drawn` names (else every swept choice)."""
    names = {base.hardware.name}
    if base.disaggregation is not None:
        names |= {pool.scenario.hardware.name for pool in base.disaggregation.pools()}
    for p in space:
        if p.key in _HW_KEYS:
            chosen = p.choices if drawn is None else (drawn.get(p.key),)
            names |= {str(c) for c in chosen if c is not None}  # None: the pool runs on [hardware]
    return names


def calibration_files(base: Scenario, spec: SweepSpec) -> list[Path]:
    """Calibration artifacts the sweep's trials can read (shipped per-GPU or cross-generation), for
    every GPU a trial or one of its pools can run on."""
    from sim.calibration.select import CALIBRATION_DIR, CROSS_GENERATION_FILE, shipped_calibration

    names = trial_gpus(base, spec)
    tier, custom = base.perf.tier, base.perf.calibration
    if tier == "roofline":
        return []
    cross = CALIBRATION_DIR / CROSS_GENERATION_FILE
    files: set[Path] = set()
    for name in sorted(names):
        if tier == "cross-generation":
            files.add(Path(custom) if custom else cross)
            continue
        found = Path(custom) if custom else shipped_calibration(Path(name).stem)
        if found is not None:
            files.add(found)
        elif tier == "auto":
            files.add(cross)
    return sorted(f for f in files if f.exists())
