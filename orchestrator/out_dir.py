"""The `--out` directory of a verb: created and checked before the work, not found unwritable after it."""

from __future__ import annotations

import os
from pathlib import Path

from sim.errors import ConfigError, file_error


def prepare_out_dir(out: Path, *, holds: str) -> None:
    """Create `out` (and its parents) and check it can be written; `holds` says what goes in it, for
    the message when `out` is a file."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not os.access(out, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied", str(out))
    except FileExistsError:
        raise ConfigError(source=str(out), key="--out", value=str(out),
                          rule=f"is a file; give a directory for {holds}") from None
    except OSError as exc:
        raise file_error(exc, path=out, key="--out", writing=True) from None


def prepare_out_file(path: Path, *, key: str = "--out") -> None:
    """Create the directory of the file `path` (as its writer would later) and check the file can be
    written there: a bad path fails before the work, not after it. `key` is the flag that named it."""
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory", str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise PermissionError(13, "Permission denied", str(path))
    except FileExistsError:
        raise ConfigError(source=str(path), key=key, value=str(path),
                          rule="a parent of it is a file, not a directory") from None
    except OSError as exc:
        raise file_error(exc, path=path, key=key, writing=True) from None
