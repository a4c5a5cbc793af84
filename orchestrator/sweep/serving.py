"""Aggregated vs disaggregated candidates in one sweep: the `serving` switch and the pool keys.

A `[space]` entry `"serving" = { choices = ["aggregated", "disaggregated"] }` is a sweep-level
switch, not a scenario key: an `aggregated` trial has no `[disaggregation]` section (the base's is
removed and every `disaggregation.*` parameter is ignored), a `disaggregated` one has both pools
(1 prefill + 1 decode worker where neither the base nor the trial says otherwise). Pool keys
(`disaggregation.prefill.num_workers`, `disaggregation.decode.hardware`,
`disaggregation.<pool>.engine.<engine key>`) are usually written with
`when = { serving = "disaggregated" }`. `scenario_overrides` turns a trial's parameters into the
`--set` overrides a scenario is built from, so `kernelsight run BASE --set ...` reproduces a trial.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from orchestrator.sweep.spec import ParamValue

SERVING_KEY: Final = "serving"
SERVING_MODES: Final = ("aggregated", "disaggregated")
POOLS: Final = ("prefill", "decode")
POOL_PREFIX: Final = "disaggregation."


def pool_engine_key(dotted: str) -> str | None:
    """`engine.<key>` for `disaggregation.<pool>.engine.<key>`, else None."""
    parts = dotted.split(".", 3)
    if len(parts) == 4 and parts[0] == "disaggregation" and parts[1] in POOLS and parts[2] == "engine":
        return f"engine.{parts[3]}"
    return None


def is_disaggregated(params: Mapping[str, ParamValue], base_sections: Mapping[str, Any]) -> bool:
    """Whether a trial with `params` over a base with `base_sections` runs disaggregated."""
    mode = params.get(SERVING_KEY)
    if mode is not None:
        return mode == "disaggregated"
    return base_sections.get("disaggregation") is not None or any(k.startswith(POOL_PREFIX) for k in params)


def scenario_overrides(params: Mapping[str, ParamValue], base_sections: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario overrides (dotted keys) for a trial's parameters, the `serving` switch resolved."""
    out = {k: v for k, v in params.items() if k != SERVING_KEY}
    if not is_disaggregated(params, base_sections):
        if SERVING_KEY in params:
            out = {k: v for k, v in out.items() if not k.startswith(POOL_PREFIX)}
            if base_sections.get("disaggregation") is not None:
                out["disaggregation"] = None  # removes the base's section
        return out
    written = base_sections.get("disaggregation") or {}
    for pool in POOLS:
        if not isinstance(written.get(pool), Mapping) and not any(k.startswith(f"{POOL_PREFIX}{pool}.") for k in out):
            out[f"{POOL_PREFIX}{pool}.num_workers"] = 1  # the pool must exist; 1 worker is the default
    return out


def scale_workers(params: Mapping[str, ParamValue], base_sections: Mapping[str, Any],
                  replicas: int) -> dict[str, ParamValue]:
    """`params` for `replicas` copies of a disaggregated candidate: each pool's workers times `replicas`."""
    written = base_sections.get("disaggregation") or {}
    out = dict(params)
    for pool in POOLS:
        key = f"{POOL_PREFIX}{pool}.num_workers"
        base_workers = (written.get(pool) or {}).get("num_workers", 1)
        workers = params.get(key, base_workers)
        assert isinstance(workers, int)
        out[key] = workers * replicas
    return out
