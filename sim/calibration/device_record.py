"""The `device.json` that `kernelsight microbench run` writes beside its tables, read before tables are fitted on."""

from __future__ import annotations

import json
from pathlib import Path

from sim.errors import ConfigError
from sim.specs.hardware import HardwareSpec

DEVICE_RECORD = "device.json"
"""What `kernelsight microbench run` writes beside its tables about the run (GPU, dry run, plan)."""


def check_device_record(hw: HardwareSpec, directory: Path, *, allow_dry_run: bool = False) -> None:
    """Refuse tables whose `device.json` says they are a dry run's (times that mean nothing) or were
    measured on another GPU than `hw` (a directory without one, e.g. a copy of AIConfigurator's
    tables, is taken as it is)."""
    path = directory / DEVICE_RECORD
    if not path.is_file():
        return
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(source=str(path), key=DEVICE_RECORD, value=str(path),
                          rule=f"cannot be read ({exc})") from None
    if record.get("dry_run") and not allow_dry_run:
        raise ConfigError(source=str(path), key="dry_run", value=True,
                          rule="these are a dry run's tables (their times are meaningless): calibrate from a run "
                          "on the GPU (--allow-dry-run to try the pipeline anyway)")
    measured_on = record.get("hardware")
    if measured_on and measured_on != hw.name:
        raise ConfigError(source=str(path), key="hardware", value=measured_on,
                          rule=f"the tables were measured on {measured_on}, not on --hardware {hw.name}")
