"""Shared builders for tests: toy hardware with round numbers and small scenarios; the local Ray
runtime and the migrated MLflow store that many tests share."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sim.measured import measured_data_root
from sim.specs.hardware import HardwareSpec, LinkSpec

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
"""The upstream snapshot the vendored copy comes from; absent on a fresh clone (tests needing it skip)."""
MEASURED_DATA = measured_data_root()
"""The measured data shipped in the package (sim/data/measured, upstream layout, tables as .csv.xz)."""


def toy_hardware(**overrides: Any) -> HardwareSpec:
    """1 TFLOP/s bf16, 1 GB/s HBM, 1 GB/s links: times are easy to compute by hand."""
    fields: dict[str, Any] = dict(
        name="toy", description="toy", vendor="toy", num_sms=100, l2_cache_bytes=1 << 20,
        boost_clock_hz=1e9, hbm_bandwidth_bytes_per_s=1e9, hbm_capacity_bytes=80 << 30, power_w=100.0,
        num_gpus_per_node=8, pcie_bandwidth_bytes_per_s=1e9,
        peak_flops_per_s={"bf16": 1e12, "fp16": 1e12, "fp8": 2e12},
        intra_node_link=LinkSpec(kind="nvlink", bandwidth_bytes_per_s=1e9, latency_s=0.0),
        inter_node_link=LinkSpec(kind="infiniband", bandwidth_bytes_per_s=1e8, latency_s=0.0),
    )
    fields.update(overrides)
    return HardwareSpec(**fields)


def scenario_dict(**sections: Mapping[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "seed": 0,
        "hardware": {"name": "h100_sxm"},
        "model": {"name": "meta-llama/Llama-3.1-8B"},
        "engine": {"max_model_len": 8192},
        "workload": {"num_prompts": 10, "random_input_len": 128, "random_output_len": 16},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return base


def cli_without(blocked: tuple[str, ...], argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`kernelsight ARGV` in a child process where the packages `blocked` cannot be imported (None in
    `sys.modules`: their import fails as an uninstalled package's does)."""
    code = ("import sys\n"
            f"for name in {list(blocked)!r}:\n"
            "    sys.modules[name] = None\n"
            "from orchestrator.cli import main\n"
            f"sys.exit(main({argv!r}))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=600, check=False)


@pytest.fixture
def repo() -> Path:
    return REPO


# -- a local Ray runtime shared by the tests that ask for it --------------------------------------

_RAY_FIXTURES = ("ray_address", "ray_runtime")
_last_ray_item: list[pytest.Item] = []


@pytest.fixture
def ray_address() -> str:
    """GCS address of a local Ray runtime (2 CPUs) that this process is connected to.

    Ray starts in ~6 s on 2 cores, so the runtime is started by the first test that asks for it and
    shut down after the last one (`pytest_runtest_teardown`), not once per module. A test that needs
    a connection elsewhere (tests/infra) shuts it down first; the next test here starts it again.
    """
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
    return str(ray.get_runtime_context().gcs_address)


@pytest.fixture
def ray_runtime(ray_address: str) -> None:
    """The shared local Ray runtime, for tests that only need this process connected to it."""


def _shutdown_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def no_ray() -> None:
    """This process not connected to Ray: the shared runtime is shut down if it is up (the next test
    that asks for it starts it again)."""
    _shutdown_ray()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    using = [item for item in items if any(f in getattr(item, "fixturenames", ()) for f in _RAY_FIXTURES)]
    _last_ray_item[:] = using[-1:]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Shut the shared Ray runtime down after the last test that uses it: later tests run without its
    processes taking CPU."""
    if _last_ray_item and item is _last_ray_item[0]:
        _shutdown_ray()


def pytest_sessionfinish() -> None:
    """A run stopped early (`-x`, Ctrl-C) still stops the shared runtime."""
    _shutdown_ray()


# -- a migrated, empty MLflow sqlite store -------------------------------------------------------

@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()  # runs the schema migrations
    return path


@pytest.fixture
def tracking_uri(_mlflow_template: Path, tmp_path: Path) -> str:
    """`sqlite:///` URI of a fresh, empty MLflow store in this test's tmp_path.

    Creating an MLflow sqlite store runs its schema migrations (~4 s); the store here is a copy of
    one migrated once per session, which MLflow opens as it opens any existing store. Tests of a
    store that the sweep creates itself (the README command, default paths) do not use this.
    """
    path = tmp_path / "mlflow.db"
    shutil.copyfile(_mlflow_template, path)
    return f"sqlite:///{path}"
