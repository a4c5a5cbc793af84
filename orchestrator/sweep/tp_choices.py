"""Refusing, on load, a `[space]` whose tensor-parallel values no trial can use.

A swept `engine.tensor_parallel_size` (or a pool's) is judged by the rule that judges each trial:
the trial's scenario is built (`evaluate.build_scenario`) and a `ConfigError` on the TP key makes
the trial `INVALID`. A value is refused here only when that rule refuses it with every combination
of the other `[space]` values (`space.probe_values`: a range at both ends), so a value that breaks
the rule for some models or pools only is kept. The combinations are probed lazily, and a space too
large to probe within `MAX_PROBES` builds is accepted: only a proven dead sweep is refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from orchestrator.sweep.evaluate import build_scenario
from orchestrator.sweep.serving import POOL_PREFIX, POOLS
from orchestrator.sweep.space import iter_combos, probe_values
from orchestrator.sweep.spec import ParamSpec, ParamValue
from sim.errors import ConfigError
from sim.specs.scenario import Scenario

TP_KEYS: Final = ("engine.tensor_parallel_size", *(f"{POOL_PREFIX}{p}.engine.tensor_parallel_size" for p in POOLS))
MAX_PROBES: Final = 4096
"""Scenario builds (~0.5 ms each) one TP parameter may cost; only a dead space uses them all."""


def check_tp_choices(space: Sequence[ParamSpec], base: Scenario, src: str) -> None:
    """Raise `ConfigError` naming the TP parameter when every value of it is refused for every trial."""
    for param in space:
        if param.key in TP_KEYS:
            _check_param(param, space, base, src)


def _check_param(param: ParamSpec, space: Sequence[ParamSpec], base: Scenario, src: str) -> None:
    values = param.grid_values()  # an int range has step 1 unless it says otherwise
    refused: dict[ParamValue, str] = {}
    probes = 0
    # The first combination of each value first: a usable value is nearly always found there.
    for first_only in (True, False):
        for value in values:
            for combo in _combos(space, param.key, value):
                probes += 1
                if probes > MAX_PROBES:
                    return
                try:
                    build_scenario(base, combo)
                except ConfigError as exc:
                    if exc.key == param.key:
                        refused.setdefault(value, exc.rule)
                        if first_only:
                            break
                        continue
                return  # a trial can use `value` (or fails for another key's reason)
    if not refused:
        return  # the parameter is never active
    reasons = "; ".join(f"{v}: {rule}" for v, rule in refused.items())
    where = f'space."{param.key}"' + (".choices" if param.kind == "categorical" else "")
    shown: object = list(values) if param.kind == "categorical" else {"low": param.low, "high": param.high}
    raise ConfigError(source=src, key=where, value=shown,
                      rule=(f"no trial can use any of these values, whatever the other [space] keys take "
                            f"(each trial that draws one would be invalid): {reasons}"))


def _combos(space: Sequence[ParamSpec], key: str, value: ParamValue) -> Iterator[dict[str, ParamValue]]:
    """The space's combinations in which `key` is active and takes `value`."""
    combos = iter_combos(space, lambda p: (value,) if p.key == key else probe_values(p, space))
    return (c for c in combos if key in c)
