"""Strict JSON of --json outputs and result files."""

from __future__ import annotations

import json
import math

import numpy as np

from sim.serde import json_text


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name}")


def test_json_text_writes_non_finite_floats_as_strings_parsable_by_strict_readers() -> None:
    payload = {"ttft_p90_s": math.nan, "cost": math.inf, "low": -math.inf, "rows": (1, np.float64(0.5)),
               "nested": [{"x": math.nan}]}
    text = json_text(payload)
    back = json.loads(text, parse_constant=_refuse_constant)
    assert back == {"ttft_p90_s": "nan", "cost": "inf", "low": "-inf", "rows": [1, 0.5], "nested": [{"x": "nan"}]}


def test_json_text_keeps_the_indent() -> None:
    assert json_text({"a": 1}, indent=1) == '{\n "a": 1\n}'
    assert json_text({"a": 1}, indent=None) == '{"a": 1}'
