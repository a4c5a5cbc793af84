"""`[search]` of a sweep file -> `SearchSpec` (multi-fidelity pruning), every key checked.

```toml
[search]
pruner = "successive_halving"   # none | successive_halving | hyperband      (default none)
min_fidelity_requests = 20      # requests of the first rung                  (required when on)
reduction_factor = 3            # each rung runs this many times more requests (default 3)
pruning_metric = "slo"          # slo | a trial metric                        (default slo)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, get_args

from orchestrator.sweep.metrics import METRIC_NAMES, unknown_metric_rule
from orchestrator.sweep.spec import SLO_PRUNING_METRIC, BoundSpec, CapacitySpec, PrunerName, SearchSpec
from orchestrator.sweep.toml_fields import get, known_keys
from sim.errors import ConfigError

_KEYS: Final = ("pruner", "min_fidelity_requests", "reduction_factor", "pruning_metric")


def parse_search(table: Mapping[str, Any], src: str, *, slo: tuple[BoundSpec, ...],
                 capacity: CapacitySpec | None) -> SearchSpec:
    known_keys(table, _KEYS, src, "search")
    pruner = get(table, "pruner", str, src, "search", default="none")
    if pruner not in get_args(PrunerName):
        raise ConfigError(source=src, key="search.pruner", value=pruner,
                          rule=f"must be one of {', '.join(get_args(PrunerName))}")
    if pruner == "none":
        extra = [k for k in _KEYS if k != "pruner" and k in table]
        if extra:
            raise ConfigError(source=src, key=f"search.{extra[0]}", value=table[extra[0]],
                              rule='applies only with search.pruner = "successive_halving" or "hyperband"')
        return SearchSpec()
    if capacity is not None:
        raise ConfigError(source=src, key="search.pruner", value=pruner,
                          rule="capacity planning ([capacity]) bisects on the rate and does not prune; remove [search]")
    min_requests = get(table, "min_fidelity_requests", int, src, "search", required=True)
    if min_requests < 1:
        raise ConfigError(source=src, key="search.min_fidelity_requests", value=min_requests, rule="must be >= 1")
    factor = get(table, "reduction_factor", int, src, "search", default=3)
    if factor < 2:
        raise ConfigError(source=src, key="search.reduction_factor", value=factor, rule="must be an integer >= 2")
    metric = get(table, "pruning_metric", str, src, "search", default=SLO_PRUNING_METRIC)
    if metric == SLO_PRUNING_METRIC and not slo:
        raise ConfigError(source=src, key="search.pruning_metric", value=metric,
                          rule="ranks trials by their [slo] violation, but the sweep has no [slo] bound; "
                               "add one or name a metric")
    if metric != SLO_PRUNING_METRIC and metric not in METRIC_NAMES:
        raise ConfigError(source=src, key="search.pruning_metric", value=metric,
                          rule=f"must be 'slo' or a trial metric; {unknown_metric_rule(metric)}")
    return SearchSpec(pruner=pruner, min_fidelity_requests=min_requests, reduction_factor=factor,
                      pruning_metric=metric)
