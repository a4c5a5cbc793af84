"""Rental price of each GPU, for cost per token and goodput per dollar.

`sim/data/prices.toml` holds one table per hardware name: `usd_per_gpu_hour` (on-demand price of
one GPU for one hour, host share included), `basis` (`list` for a provider's listed price,
`assumption` for a derived number) and `source`, which says which. Users can pass their own table
with the same layout; loading rejects names that are not hardware in the catalog, unknown keys
and non-positive prices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from sim.errors import ConfigError
from sim.serde import build, require
from sim.specs.catalog import list_hardware, read_toml

PriceBasis = Literal["list", "assumption"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceEntry:
    """On-demand price of one GPU and where the number comes from."""

    usd_per_gpu_hour: float
    basis: PriceBasis
    """`list`: a provider's listed price; `assumption`: derived as `source` explains."""
    source: str

    def __post_init__(self) -> None:
        require(math.isfinite(self.usd_per_gpu_hour) and self.usd_per_gpu_hour > 0,
                "usd_per_gpu_hour", self.usd_per_gpu_hour, "must be a finite number > 0")
        require(bool(self.source.strip()), "source", self.source,
                "must say where the price comes from")


def default_prices_path() -> Path:
    return Path(str(resources.files("sim") / "data" / "prices.toml"))


def load_price_entries(path: str | Path | None = None) -> Mapping[str, PriceEntry]:
    """Every entry of a price table (the shipped one when `path` is None), by hardware name."""
    path = default_prices_path() if path is None else Path(path)
    table = read_toml(path)
    known = set(list_hardware())
    entries: dict[str, PriceEntry] = {}
    for name, raw in table.items():
        if name not in known:
            raise ConfigError(source=str(path), key=name, value=raw,
                              rule=f"unknown hardware; known: {', '.join(sorted(known))}")
        entries[name] = build(PriceEntry, raw, source=str(path), prefix=name)
    return MappingProxyType(entries)


def load_prices(path: str | Path | None = None) -> Mapping[str, float]:
    """USD per GPU-hour by hardware name, from `path` or the shipped table."""
    entries = load_price_entries(path)
    return MappingProxyType({name: e.usd_per_gpu_hour for name, e in entries.items()})


def find_price_per_gpu_hour_usd(hardware_name: str, prices: Mapping[str, float]) -> float | None:
    """The price of `hardware_name`, or None when the table has none (a user hardware TOML)."""
    return prices.get(hardware_name)


def price_per_gpu_hour_usd(hardware_name: str, prices: Mapping[str, float]) -> float:
    """The price of `hardware_name`; a `ConfigError` when the table has none."""
    try:
        return prices[hardware_name]
    except KeyError:
        raise ConfigError(source="prices", key=hardware_name, value=None,
                          rule=f"no price for this hardware; priced: {', '.join(sorted(prices))}"
                          ) from None
