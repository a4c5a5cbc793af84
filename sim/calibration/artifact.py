"""Calibration artifacts: fitted efficiency parameters as plain JSON, with the data's SHA-256.

Layout: {"schema": 2, "tier": "cross-generation" | "target-measured", "hardware": name or null,
"fitted_on": [gpu, ...], "data_sha256": {...}, "notes": str, "families": {family: {
"categoricals": [[name, [levels]]], "coef": [...], "ranges": [[lo, hi], ...],
"mlp": null | {"mean", "scale", "lo", "hi": [...], "weights": [[[...]]], "biases": [[...]]},
"correction": null | {"coordinates": [...], "length_scales": [...], "categoricals": [...],
"num_points": n, "groups": [{"key": [...], "offset": x, "points": [[...]], "alpha": [...]}]}}}}.
Loading rejects unknown keys and wrong types. Never pickled.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from sim.errors import ConfigError
from sim.perf.fitted import FamilyParams
from sim.perf.kernel_features import FAMILIES, feature_names
from sim.perf.learners import CorrectionGroup, CorrectionParams, MlpParams
from sim.specs.catalog import read_json_object

SCHEMA: Final = 2
ArtifactTier = Literal["cross-generation", "target-measured"]
_TOP_KEYS: Final = frozenset({"schema", "tier", "hardware", "fitted_on", "data_sha256", "families", "notes"})
_FAMILY_KEYS: Final = frozenset({"categoricals", "coef", "correction", "ranges", "mlp"})
_MLP_KEYS: Final = frozenset({"mean", "scale", "lo", "hi", "weights", "biases"})
_CORR_KEYS: Final = frozenset({"coordinates", "length_scales", "categoricals", "num_points", "groups"})
_GROUP_KEYS: Final = frozenset({"key", "offset", "points", "alpha"})


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
            "families": {f: _family_json(p) for f, p in sorted(self.families.items())},
        }

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # a failed write leaves no partial file behind


def _round(v: float) -> float:
    return float(f"{v:.9g}")


def _family_json(p: FamilyParams) -> dict[str, Any]:
    out: dict[str, Any] = {"categoricals": [[n, list(lv)] for n, lv in p.categoricals],
                           "coef": [_round(c) for c in p.coef], "ranges": [list(r) for r in p.ranges],
                           "mlp": None, "correction": None}
    if p.mlp is not None:
        m = p.mlp
        out["mlp"] = {"mean": list(m.mean), "scale": list(m.scale), "lo": list(m.lo), "hi": list(m.hi),
                      "weights": [[[_round(v) for v in row] for row in w] for w in m.weights],
                      "biases": [[_round(v) for v in b] for b in m.biases]}
    if p.correction is not None:
        c = p.correction
        out["correction"] = {
            "coordinates": list(c.coordinates), "length_scales": list(c.length_scales),
            "categoricals": list(c.categoricals), "num_points": c.num_points,
            "groups": [{"key": list(g.key), "offset": g.offset, "points": [[_round(v) for v in pt] for pt in g.points],
                        "alpha": [_round(a) for a in g.alpha]} for g in c.groups]}
    return out


def _fail(source: str, key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(source=source, key=key, value=value, rule=rule)


_PLAIN_NUMBERS = frozenset({int, float})


def _floats(source: str, key: str, value: object) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise _fail(source, key, value, "must be a list of numbers")
    # The common case (JSON numbers) checked by type in C; anything else goes through the full rule.
    if not _PLAIN_NUMBERS.issuperset(map(type, value)) and not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise _fail(source, key, value, "must be a list of numbers")
    # json reads NaN and Infinity; a fit on bad tables wrote them, and they would price every kernel as NaN.
    # A finite sum proves every value finite (the fast path); an overflowing one is checked value by value.
    if not math.isfinite(sum(value)) and not all(map(math.isfinite, value)):
        bad = next(v for v in value if not math.isfinite(v))
        raise _fail(source, key, bad, "must be finite numbers (refit the artifact)")
    return tuple(map(float, value))


def _matrix(source: str, key: str, value: object) -> tuple[tuple[float, ...], ...]:
    if not isinstance(value, list):
        raise _fail(source, key, value, "must be a list of lists of numbers")
    return tuple(_floats(source, key, row) for row in value)


def _strings(source: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(source, key, value, "must be a list of strings")
    return tuple(value)


def _obj(source: str, key: str, value: object, keys: frozenset[str]) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) - keys:
        raise _fail(source, key, value, f"must be an object with keys from {sorted(keys)}")
    return value


def _mlp(source: str, key: str, value: object) -> MlpParams:
    m = _obj(source, key, value, _MLP_KEYS)
    weights = m.get("weights")
    if not isinstance(weights, list) or not weights:
        raise _fail(source, f"{key}.weights", weights, "must be a non-empty list of matrices")
    mats = tuple(_matrix(source, f"{key}.weights", w) for w in weights)
    biases = m.get("biases")
    if not isinstance(biases, list) or len(biases) != len(mats):
        raise _fail(source, f"{key}.biases", biases, "must hold one vector per weight matrix")
    vecs = tuple(_floats(source, f"{key}.biases", b) for b in biases)
    width = len(mats[0])
    for i, (w, b) in enumerate(zip(mats, vecs, strict=True)):
        if len(w) != width or any(len(row) != len(b) for row in w):
            raise _fail(source, f"{key}.weights[{i}]", f"{len(w)} rows", "must chain: inputs x outputs")
        width = len(b)
    vec = {k: _floats(source, f"{key}.{k}", m.get(k)) for k in ("mean", "scale", "lo", "hi")}
    if any(len(v) != len(mats[0]) for v in vec.values()) or width != 1:
        raise _fail(source, key, None, "mean/scale/lo/hi must match the input width; one output")
    return MlpParams(mean=vec["mean"], scale=vec["scale"], lo=vec["lo"], hi=vec["hi"], weights=mats, biases=vecs)


def _correction(source: str, key: str, value: object) -> CorrectionParams:
    c = _obj(source, key, value, _CORR_KEYS)
    coords = _strings(source, f"{key}.coordinates", c.get("coordinates"))
    scales = _floats(source, f"{key}.length_scales", c.get("length_scales"))
    cats = _strings(source, f"{key}.categoricals", c.get("categoricals"))
    if len(scales) != len(coords) or any(s <= 0 for s in scales):
        raise _fail(source, f"{key}.length_scales", scales, "one positive scale per coordinate")
    groups_raw = c.get("groups")
    if not isinstance(groups_raw, list):
        raise _fail(source, f"{key}.groups", groups_raw, "must be a list")
    groups = []
    for i, g in enumerate(groups_raw):
        gk = f"{key}.groups[{i}]"
        gd = _obj(source, gk, g, _GROUP_KEYS)
        gkey = _strings(source, f"{gk}.key", gd.get("key"))
        points = _matrix(source, f"{gk}.points", gd.get("points"))
        alpha = _floats(source, f"{gk}.alpha", gd.get("alpha"))
        offset = gd.get("offset")
        if len(gkey) != len(cats) or len(points) != len(alpha) or any(len(p) != len(coords) for p in points) \
                or not isinstance(offset, int | float):
            raise _fail(source, gk, None, "key, points, alpha and offset must match the coordinates")
        if not math.isfinite(offset):
            raise _fail(source, f"{gk}.offset", offset, "must be a finite number (refit the artifact)")
        groups.append(CorrectionGroup(key=gkey, offset=float(offset), points=points, alpha=alpha))
    num = c.get("num_points", 0)
    if not isinstance(num, int) or num < 0:
        raise _fail(source, f"{key}.num_points", num, "must be an integer >= 0")
    return CorrectionParams(coordinates=coords, length_scales=scales, categoricals=cats, groups=tuple(groups),
                            num_points=num)


def from_json(data: object, source: str) -> CalibrationArtifact:
    if not isinstance(data, dict):
        raise _fail(source, "<root>", type(data).__name__, "must be a JSON object")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0], data[unknown[0]], "unknown key")
    if data.get("schema") != SCHEMA:
        raise _fail(source, "schema", data.get("schema"), f"must be {SCHEMA} (refit with this version)")
    tier = data.get("tier")
    if tier not in ("cross-generation", "target-measured"):
        raise _fail(source, "tier", tier, "must be cross-generation or target-measured")
    families: dict[str, FamilyParams] = {}
    fams = data.get("families")
    if not isinstance(fams, dict):
        raise _fail(source, "families", fams, "must be an object")
    for name, f in fams.items():
        fk = f"families.{name}"
        fd = _obj(source, fk, f, _FAMILY_KEYS)
        cats = fd.get("categoricals", [])
        if not isinstance(cats, list) or not all(
                isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], list)
                for c in cats):
            raise _fail(source, f"{fk}.categoricals", cats, "must be [[name, [levels]], ...]")
        ranges = fd.get("ranges", [])
        if not isinstance(ranges, list):
            raise _fail(source, f"{fk}.ranges", ranges, "must be a list")
        rng = tuple(_floats(source, f"{fk}.ranges", r) for r in ranges)
        if any(len(r) != 2 for r in rng):
            raise _fail(source, f"{fk}.ranges", ranges, "must be [[lo, hi], ...]")
        if name in FAMILIES and rng and len(rng) != len(feature_names(name)):
            raise _fail(source, f"{fk}.ranges", len(rng),
                        f"must have one range per feature ({len(feature_names(name))}: the family's features "
                        "changed; refit with `kernelsight fit-cross-generation` / `kernelsight calibrate`)")
        mlp, corr = fd.get("mlp"), fd.get("correction")
        families[name] = FamilyParams(
            family=name,
            categoricals=tuple((c[0], tuple(str(v) for v in c[1])) for c in cats),
            coef=_floats(source, f"{fk}.coef", fd.get("coef")),
            mlp=None if mlp is None else _mlp(source, f"{fk}.mlp", mlp),
            correction=None if corr is None else _correction(source, f"{fk}.correction", corr),
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
    return from_json(read_json_object(p, "calibration JSON"), str(p))
