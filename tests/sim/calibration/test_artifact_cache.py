"""Calibration artifacts are parsed once per process per file version."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sim.calibration.select import CALIBRATION_DIR, load_for_tier
from sim.errors import ConfigError
from sim.specs.catalog import load_hardware

H100 = load_hardware("h100_sxm")


def test_same_file_is_parsed_once_and_a_rewritten_file_again(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    shutil.copy(CALIBRATION_DIR / "h100_sxm.json", path)
    first = load_for_tier(H100, "target-measured", str(path))
    assert load_for_tier(H100, "target-measured", str(path)) is first
    data = json.loads(path.read_text())
    data["notes"] = "rewritten"
    path.write_text(json.dumps(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = load_for_tier(H100, "target-measured", str(path))
    assert second is not first and second is not None and second.notes == "rewritten"


def test_errors_still_name_the_path_as_given(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    for _ in range(2):  # a failed parse is not cached
        with pytest.raises(ConfigError) as err:
            load_for_tier(H100, "target-measured", str(path))
        assert str(path) in str(err.value)
