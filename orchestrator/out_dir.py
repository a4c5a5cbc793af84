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
