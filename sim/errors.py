"""Error types shared by the whole package.

`ConfigError` is bad user input: it names the file, the dotted key, the offending value and the
rule it breaks, and the CLI turns it into exit code 2. `InfeasibleScenario` is a well-formed
configuration that cannot run (weights do not fit, no room for one request's KV cache); sweeps
record it as an infeasible trial rather than a failure.
"""

from __future__ import annotations

from collections.abc import Callable


class ConfigError(ValueError):
    """Invalid configuration: file, key, value and the rule that was broken."""

    def __init__(self, *, source: str, key: str, value: object, rule: str) -> None:
        self.source = source
        self.key = key
        self.value = value
        self.rule = rule
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key}={value!r}: {rule}")

    def __reduce__(self) -> tuple[Callable[..., ConfigError], tuple[type[ConfigError], str, str, object, str]]:
        """Pickles with its fields (the default rebuilds from the message and fails), so the error
        keeps its type and exit code across process boundaries (the MLflow tracker's process, Ray)."""
        return (_rebuild, (type(self), self.source, self.key, self.value, self.rule))


def _rebuild(cls: type[ConfigError], source: str, key: str, value: object, rule: str) -> ConfigError:
    return cls(source=source, key=key, value=value, rule=rule)


def file_error(exc: OSError, *, path: object = None, key: str = "<file>", writing: bool = False) -> ConfigError:
    """A `ConfigError` for a file that cannot be read or written, naming it and what is wrong.

    `path` defaults to the file the OS names; `key` is the flag or scenario key that gave it.
    """
    name = str(path if path is not None else (exc.filename if exc.filename is not None else "?"))
    if writing and not isinstance(exc, IsADirectoryError):
        rule = f"cannot be written: {exc.strerror or type(exc).__name__}"
    elif isinstance(exc, FileNotFoundError):
        rule = "file not found"
    elif isinstance(exc, IsADirectoryError):
        rule = "is a directory; give a file"
    elif isinstance(exc, NotADirectoryError):
        rule = "a parent of it is a file, not a directory"
    elif isinstance(exc, PermissionError):
        rule = "permission denied"
    else:
        rule = exc.strerror or type(exc).__name__
    return ConfigError(source=name, key=key, value=name, rule=rule)


def decode_error(exc: UnicodeDecodeError, *, path: object, what: str) -> ConfigError:
    """A `ConfigError` for a file that is not UTF-8 text (binary, Latin-1, UTF-16, ...)."""
    return ConfigError(source=str(path), key="<file>", value=exc.object[exc.start:exc.start + 8],
                       rule=f"not UTF-8 text (undecodable byte at offset {exc.start}); "
                            f"{what} files must be UTF-8")


class InfeasibleScenario(ConfigError):
    """A well-formed scenario that cannot be served, e.g. the model does not fit in GPU memory.

    A `ConfigError` for the CLI (exit 2); sweeps record it as an infeasible trial.
    """
