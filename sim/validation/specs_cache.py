"""Catalog look-ups and memory sizing for thousands of rows, memoized per instance.

Reading a model or GPU from the catalog parses files; a reader converting a few thousand rows
asks for the same dozen specs again and again, so `SpecCache` keeps what it has loaded (one
instance per read, no module state). `memory` is the simulator's own memory model
(`sim.graph.memory.memory_breakdown`) on a partial `[engine]` table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sim.errors import ConfigError
from sim.graph.memory import MemoryBreakdown, memory_breakdown
from sim.specs.catalog import load_hardware, load_model
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import resolve_precision
from sim.validation.rows import Family, family_of

_ENGINE_FIELDS = frozenset(f.name for f in dataclasses.fields(EngineParams))


class SpecCache:
    def __init__(self) -> None:
        self._models: dict[str, ModelSpec | ConfigError] = {}
        self._hardware: dict[str, HardwareSpec | ConfigError] = {}

    def model(self, name: str) -> ModelSpec:
        """The catalog model; raises the catalog's `ConfigError` (cached too)."""
        if name not in self._models:
            try:
                self._models[name] = load_model(name)
            except ConfigError as exc:
                self._models[name] = exc
        got = self._models[name]
        if isinstance(got, ConfigError):
            raise got
        return got

    def family(self, name: str | None) -> Family:
        """`family_of` the catalog model; `unknown` when it has no config or does not load."""
        if name is None:
            return "unknown"
        try:
            return family_of(self.model(name))
        except ConfigError:
            return "unknown"

    def hardware(self, name: str) -> HardwareSpec:
        if name not in self._hardware:
            try:
                self._hardware[name] = load_hardware(name)
            except ConfigError as exc:
                self._hardware[name] = exc
        got = self._hardware[name]
        if isinstance(got, ConfigError):
            raise got
        return got

    def memory(self, model: str, hardware: str, engine: Mapping[str, Any]) -> MemoryBreakdown:
        """Per-rank memory of `model` on `hardware` with these `[engine]` keys (others at defaults)."""
        spec, hw = self.model(model), self.hardware(hardware)
        params = EngineParams(**{k: v for k, v in engine.items() if k in _ENGINE_FIELDS}).resolve(
            hbm_capacity_bytes=hw.hbm_capacity_bytes, hardware_name=hw.name,
            max_position_embeddings=spec.max_position_embeddings)
        return memory_breakdown(spec, params, resolve_precision(spec, params), hw)
