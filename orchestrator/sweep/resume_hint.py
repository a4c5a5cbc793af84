"""The command that continues an interrupted or failed sweep, printed to stderr.

It repeats every flag that decides where the sweep's state lives (the study directory, the
MLflow tracking URI, the Optuna storage) and how it runs, so running it as printed resumes the
same study into the same MLflow store. Paths are absolute so it works from any directory.
Passwords in URLs are masked: a storage URL with a password is better passed in the
`KERNELSIGHT_STORAGE` environment variable, which the hint then leaves to the environment.
"""

from __future__ import annotations

import shlex
from argparse import Namespace
from pathlib import Path
from typing import Final

from orchestrator.sweep.study import redact

STORAGE_ENV: Final = "KERNELSIGHT_STORAGE"
"""Environment variable read for the Optuna storage URL when `--storage` is not given (keeps a
password out of the process's argv)."""


def resume_command(args: Namespace, study_dir: Path) -> tuple[str, bool]:
    """(`kernelsight sweep ... --resume` line, whether a password in it was masked)."""
    parts = ["kernelsight", "sweep", str(Path(args.sweep).resolve()), "--resume",
             "--study-dir", str(study_dir.resolve())]
    masked = False
    for flag, value in (("--tracking-uri", args.tracking_uri), ("--storage", args.storage)):
        if value:
            shown = redact(value)
            masked |= shown != value
            parts += [flag, shown]
    for flag, value in (("--ray-address", args.ray_address), ("--trials", args.trials),
                        ("--actors", args.actors)):
        if value is not None:
            parts += [flag, str(value)]
    parts += [flag for flag, on in (("--no-trial-plots", args.no_trial_plots), ("--json", args.json)) if on]
    return shlex.join(parts), masked


def resume_hint(args: Namespace, study_dir: Path) -> str:
    """Lines for stderr: the resume command, and how to supply a masked password."""
    command, masked = resume_command(args, study_dir)
    text = f"continue with: {command}\n"
    if masked:
        text += (f"(the password is masked as ***: put it back, or pass the storage URL in ${STORAGE_ENV} "
                 "and drop --storage)\n")
    return text
