"""Error types shared by the whole package.

`ConfigError` is bad user input: it names the file, the dotted key, the offending value and the
rule it breaks, and the CLI turns it into exit code 2. `InfeasibleScenario` is a well-formed
configuration that cannot run (weights do not fit, no room for one request's KV cache); sweeps
record it as an infeasible trial rather than a failure.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid configuration: file, key, value and the rule that was broken."""

    def __init__(self, *, source: str, key: str, value: object, rule: str) -> None:
        self.source = source
        self.key = key
        self.value = value
        self.rule = rule
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}={value!r}: {rule}")


class InfeasibleScenario(ConfigError):
    """A well-formed scenario that cannot be served, e.g. the model does not fit in GPU memory.

    A `ConfigError` for the CLI (exit 2); sweeps record it as an infeasible trial.
    """
