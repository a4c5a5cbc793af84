"""Calibration artifacts: fitted efficiency parameters as plain JSON, with the data's SHA-256.

Layout: {"schema": 1, "tier": "cross-generation" | "target-measured", "hardware": name or null,
"fitted_on": [gpu, ...], "data_sha256": {...}, "families": {family: {"categoricals": [[name,
[levels]]], "coef": [...], "correction": [...] | null, "ranges": [[lo, hi], ...]}}}.
Loading rejects unknown keys and wrong types. Never pickled.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from sim.errors import ConfigError
from sim.perf.fitted import FamilyParams

SCHEMA: Final = 1
ArtifactTier = Literal["cross-generation", "target-measured"]
_TOP_KEYS: Final = frozenset({"schema", "tier", "hardware", "fitted_on", "data_sha256", "families", "notes"})
_FAMILY_KEYS: Final = frozenset({"categoricals", "coef", "correction", "ranges"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationArtifact:
    tier: ArtifactTier
    hardware: str | None
    """Target GPU of a target-measured artifact; None for the cross-generation model."""
    fitted_on: tuple[str, ...]
    data_sha256: dict[str, str]
    """SHA-256 of the measurement files each part was fitted on."""
    families: dict[str, FamilyParams]
    notes: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "tier": self.tier, "hardware": self.hardware,
            "fitted_on": list(self.fitted_on), "data_sha256": dict(sorted(self.data_sha256.items())),
            "notes": self.notes,
            "families": {f: {"categoricals": [[n, list(lv)] for n, lv in p.categoricals],
                             "coef": list(p.coef),
                             "correction": None if p.correction is None else list(p.correction),
                             "ranges": [list(r) for r in p.ranges]}
                         for f, p in sorted(self.families.items())},
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)


def _fail(source: str, key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(source=source, key=key, value=value, rule=rule)


def _floats(source: str, key: str, value: object) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        raise _fail(source, key, value, "must be a list of numbers")
    return tuple(float(v) for v in value)


def from_json(data: object, source: str) -> CalibrationArtifact:
    if not isinstance(data, dict):
        raise _fail(source, "<root>", type(data).__name__, "must be a JSON object")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0], data[unknown[0]], "unknown key")
    if data.get("schema") != SCHEMA:
        raise _fail(source, "schema", data.get("schema"), f"must be {SCHEMA}")
    tier = data.get("tier")
    if tier not in ("cross-generation", "target-measured"):
        raise _fail(source, "tier", tier, "must be cross-generation or target-measured")
    families: dict[str, FamilyParams] = {}
    fams = data.get("families")
    if not isinstance(fams, dict):
        raise _fail(source, "families", fams, "must be an object")
    for name, f in fams.items():
        if not isinstance(f, dict) or set(f) - _FAMILY_KEYS:
            raise _fail(source, f"families.{name}", f, f"must hold only {sorted(_FAMILY_KEYS)}")
        cats = f.get("categoricals", [])
        if not isinstance(cats, list) or not all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], list)
                for c in cats):
            raise _fail(source, f"families.{name}.categoricals", cats, "must be [[name, [levels]], ...]")
        corr = f.get("correction")
        ranges = f.get("ranges", [])
        if not isinstance(ranges, list):
            raise _fail(source, f"families.{name}.ranges", ranges, "must be a list")
        rng = tuple(_floats(source, f"families.{name}.ranges", r) for r in ranges)
        families[name] = FamilyParams(
            family=name,
            categoricals=tuple((c[0], tuple(str(v) for v in c[1])) for c in cats),
            coef=_floats(source, f"families.{name}.coef", f.get("coef")),
            correction=None if corr is None else _floats(source, f"families.{name}.correction", corr),
            ranges=tuple((r[0], r[1]) for r in rng))
    hardware = data.get("hardware")
    sha = data.get("data_sha256", {})
    if not isinstance(sha, dict):
        raise _fail(source, "data_sha256", sha, "must be an object")
    return CalibrationArtifact(
        tier=tier, hardware=hardware if isinstance(hardware, str) else None,
        fitted_on=tuple(str(g) for g in data.get("fitted_on", [])),
        data_sha256={str(k): str(v) for k, v in sha.items()}, families=families,
        notes=str(data.get("notes", "")))


def load_artifact(path: str | Path) -> CalibrationArtifact:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise _fail(str(p), "<root>", None, f"invalid JSON: {exc}") from None
    return from_json(data, str(p))
