"""On the core install (numpy only) verbs either work or stop at once with the package to install.

The optional packages are blocked in a child process (`None` in `sys.modules`, which makes their
import fail as an uninstalled package's does), so the test sees what a core-only install sees.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import REPO, cli_without

from orchestrator.optional import OPTIONAL_EXTRA, missing_package_error

SCENARIO = str(REPO / "scenarios" / "llama3_8b-h100.toml")


def _core_install(argv: list[str], cwd: Path, blocked: tuple[str, ...] = tuple(OPTIONAL_EXTRA)
                  ) -> subprocess.CompletedProcess[str]:
    return cli_without(blocked, argv, cwd)


def test_validate_runs_and_writes_its_results_without_optional_packages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _core_install(["validate", "--suite", "dev", "--source", "trtllm_static", "--tier", "cross-generation",
                          "--limit", "1", "--no-doc", "--jobs", "1", "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((out / "validate.json").read_text())["results"]
    assert any(r["status"] == "scored" for r in results)


def test_a_verb_that_needs_pandas_names_it_and_the_extra(tmp_path: Path) -> None:
    proc = _core_install(["accuracy", "kernels", "--family", "nccl"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: kernelsight accuracy needs the optional package pandas: python -m pip install -e "
        "'.[calibrate]' (or pip install 'kernelsight[calibrate]')"]


def test_run_out_checks_pyarrow_before_it_simulates(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = _core_install(["run", SCENARIO, "--out", str(out)], tmp_path, blocked=("pyarrow",))
    assert proc.returncode == 1
    assert "needs the optional package pyarrow" in proc.stderr and "'.[io]'" in proc.stderr
    assert "simulated" not in proc.stdout and not out.exists()


def test_validate_writing_the_document_checks_matplotlib_before_it_simulates(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _core_install(["validate", "--suite", "dev", "--limit", "1", "--doc", str(tmp_path / "acc.md"),
                          "--out", str(out)], tmp_path, blocked=("matplotlib",))
    assert proc.returncode == 1
    assert "needs the optional package matplotlib" in proc.stderr
    assert not (out / "validate.json").exists() and "simulating" not in proc.stderr


def test_a_missing_module_that_is_no_optional_package_is_not_reported_as_one() -> None:
    assert missing_package_error("run", ModuleNotFoundError("x", name="sim.nonexistent")) is None
    message = missing_package_error("sweep", ModuleNotFoundError("x", name="ray.util"))
    assert message is not None and "optional package ray" in message and "'.[orchestrate]'" in message
