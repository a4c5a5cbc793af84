"""`kernelsight accuracy kernels` (leave-one-GPU-out kernel accuracy, its report and the interval table),
`kernelsight accuracy microbench` (target-measured accuracy from our own microbenchmark tables) and
`kernelsight accuracy modules` (the simulator's MLA module kernels against the engines' measured modules)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

from orchestrator.commands_kernels import DATA_HELP, data_root
from sim.errors import ConfigError
from sim.perf.kernel_features import FAMILIES
from sim.serde import json_text

_ACCURACY_MD = Path("docs/accuracy.md")


def cmd_accuracy_kernels(args: Namespace) -> int:
    from orchestrator.progress import ProgressBar
    from sim.calibration.accuracy import EVAL_ONLY, TRAIN_GPUS, run_logo
    from sim.calibration.intervals import nested_coverage, table_from_logo
    from sim.calibration.logo_run import load_logo_run, save_logo_run
    from sim.calibration.report import render_kernels_section, replace_section
    from sim.specs.catalog import load_hardware

    start = time.perf_counter()
    families = tuple(args.family) if args.family else None
    if args.from_run:
        if families is not None:
            raise ConfigError(source="accuracy kernels", key="--family", value=list(families),
                              rule="a saved run is rendered whole: give --from-run or --family, not both")
        # The saved run's own scores, residuals and wall time: nothing is refitted. A run of some
        # families only stays a diagnostic (printed, not written into the report).
        result, residuals = load_logo_run(Path(args.from_run))
        result.pop("intervals", None)
        families = tuple(result.get("families") or ()) or None
    else:
        # loading each GPU's tables, then evaluating each GPU left out
        with ProgressBar(2 * len((*TRAIN_GPUS, *EVAL_ONLY)), desc="accuracy kernels", unit="step") as bar:
            result = run_logo(data_root(args.data), workers=args.workers, progress=bar.update_to, families=families)
        result["wall_s"] = time.perf_counter() - start
        result["families"] = list(families) if families else None
        residuals = {g["gpu"]: g.pop("residuals") for g in result["gpus"]}
        if args.save_run:
            save_logo_run(result, residuals, Path(args.save_run))
            sys.stderr.write(f"saved the run to {args.save_run}\n")
    architectures = {g: load_hardware(g).sm_version for g in residuals}
    result["intervals"] = nested_coverage(residuals, TRAIN_GPUS, architectures=architectures)
    if args.intervals_out:
        table = table_from_logo(residuals, TRAIN_GPUS, result["data_sha256"],
                                "kernelsight accuracy kernels --intervals-out PATH", architectures=architectures)
        table.save(Path(args.intervals_out))
        sys.stderr.write(f"wrote the interval table to {args.intervals_out}\n")
    if args.json:
        sys.stdout.write(json_text(result, indent=1) + "\n")
    if families is not None:
        # A family subset is a diagnostic: printed, never written into docs/accuracy.md.
        sys.stdout.write(_family_table(result))
        return 0
    section = render_kernels_section(result)
    path = Path(args.doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else "# Accuracy\n"
    path.write_text(replace_section(old, "## Kernels", section))
    sys.stderr.write(f"wrote the kernel section of {path} in {result['wall_s']:.0f} s\n")
    return 0


def cmd_accuracy_microbench(args: Namespace) -> int:
    from sim.calibration.own_tables import render_own_tables, score_own_tables
    from sim.calibration.report import replace_section

    start = time.perf_counter()
    for key, value in (("--microbench", args.microbench), ("--reference-microbench", args.reference_microbench)):
        if not Path(value).is_dir():
            raise ConfigError(source="accuracy microbench", key=key, value=value,
                              rule="must be a directory written by `kernelsight microbench run`")

    def say(msg: str) -> None:
        sys.stderr.write(f"accuracy microbench: {msg}\n")

    result = score_own_tables(data_root(args.data), Path(args.microbench), args.hardware,
                              (Path(args.reference_microbench), args.reference_hardware), progress=say)
    wall_s = time.perf_counter() - start
    command = (f"kernelsight accuracy microbench --hardware {args.hardware} --microbench {args.microbench} "
               f"--reference-hardware {args.reference_hardware} --reference-microbench {args.reference_microbench}")
    section = render_own_tables(result, command, wall_s)
    if args.json:
        sys.stdout.write(json_text(result, indent=1) + "\n")
    else:
        sys.stdout.write(section)
    if not args.no_doc:
        path = Path(args.doc)
        old = path.read_text() if path.is_file() else "# Accuracy\n"
        path.write_text(replace_section(old, section.splitlines()[0], section))
        sys.stderr.write(f"wrote '{section.splitlines()[0][3:]}' in {path} ({wall_s:.0f} s)\n")
    return 0


def cmd_accuracy_modules(args: Namespace) -> int:
    from sim.calibration.accuracy import EVAL_ONLY, TRAIN_GPUS
    from sim.calibration.module_check import BACKENDS, check_modules, render_module_section
    from sim.calibration.report import replace_section

    start = time.perf_counter()
    # GPUs without module tables are skipped by the check; evaluation-only GPUs come last.
    gpus = tuple(args.gpu) if args.gpu else (*TRAIN_GPUS, *EVAL_ONLY)
    if args.sample is not None and args.sample < 1:
        raise ConfigError(source="accuracy modules", key="--sample", value=args.sample, rule="must be >= 1")

    def say(msg: str) -> None:
        sys.stderr.write(f"accuracy modules: {msg}\n")

    scores = check_modules(data_root(args.data), gpus, tuple(args.backend) if args.backend else BACKENDS,
                           tier=args.tier, sample=args.sample, candidates=args.candidates, progress=say)
    if not scores:
        raise ConfigError(source="accuracy modules", key="--gpu", value=list(gpus),
                          rule="no measured MLA module rows for these GPUs and engines")
    wall_s = time.perf_counter() - start
    sample = "" if args.sample is None else f" --sample {args.sample}"
    command = f"kernelsight accuracy modules{' --candidates' if args.candidates else ''}{sample}"
    section = render_module_section(scores, command, wall_s, args.tier, EVAL_ONLY)
    if args.json:
        sys.stdout.write(json_text([dataclasses.asdict(s) for s in scores], indent=1) + "\n")
    else:
        sys.stdout.write(section)
    # Only the full default run is the report; a subset or another tier stays a diagnostic.
    if not args.no_doc and not args.gpu and not args.backend and args.tier == "cross-generation":
        path = Path(args.doc)
        old = path.read_text() if path.is_file() else "# Accuracy\n"
        path.write_text(replace_section(old, "## MLA modules", section))
        sys.stderr.write(f"wrote '## MLA modules' in {path} ({wall_s:.0f} s)\n")
    return 0


def _family_table(result: dict[str, Any]) -> str:
    """Per GPU and family: median APE and median predicted / measured, per tier."""
    lines = ["| GPU | family | tier | rows | median APE | p90 APE | median predicted / measured |",
             "|---|---|---|---|---|---|---|"]
    for g in result["gpus"]:
        for tier in ("cross-generation", "target-measured"):
            for fam, sc in sorted(g["tiers"].get(tier, {}).items()):
                lines.append(f"| {g['gpu']} | {fam} | {tier} | {sc['rows']} | {100 * sc['median_ape']:.1f}% | "
                             f"{100 * sc['p90_ape']:.1f}% | {sc['median_ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def register(sub: Any) -> None:
    """Add `accuracy kernels` to the `kernelsight` sub-parser collection."""
    acc = sub.add_parser("accuracy", help="accuracy reports against measured data")
    acc_sub = acc.add_subparsers(dest="accuracy_verb", required=True)
    ak = acc_sub.add_parser("kernels", help="leave-one-GPU-out kernel accuracy (docs/accuracy.md)")
    ak.add_argument("--json", action="store_true", help="also print the full result as JSON")
    ak.add_argument("--data", help=DATA_HELP)
    ak.add_argument("--workers", type=int, default=2,
                    help="processes for the leave-one-GPU-out refits (default 2)")
    ak.add_argument("--doc", default=str(_ACCURACY_MD), help=argparse.SUPPRESS)
    ak.add_argument("--family", action="append", choices=FAMILIES, metavar="NAME",
                    help="score only this kernel family (repeatable); prints a table instead of "
                         "writing docs/accuracy.md")
    ak.add_argument("--intervals-out", metavar="INTERVALS.json",
                    help="also write the split-conformal interval table fitted on the dev GPUs' leave-one-GPU-out "
                         "residuals (shipped as sim/data/calibration/intervals.json)")
    ak.add_argument("--save-run", metavar="DIR",
                    help="also save the leave-one-GPU-out run (scores and residuals) under DIR")
    ak.add_argument("--from-run", metavar="DIR",
                    help="render the report (and --intervals-out) from a run saved with --save-run instead of "
                         "refitting (seconds instead of ~50 minutes; --data and --workers are not used)")
    ak.set_defaults(func=cmd_accuracy_kernels)
    am = acc_sub.add_parser("microbench", help="target-measured accuracy from our own microbenchmark tables of a GPU, "
                                               "scored on its AIConfigurator tables (docs/accuracy.md)")
    am.add_argument("--hardware", required=True, help="the GPU the tables were measured on (a dev GPU with data)")
    am.add_argument("--microbench", required=True, metavar="DIR", help="a `kernelsight microbench run` directory")
    am.add_argument("--reference-hardware", required=True,
                    help="another dev GPU with our tables, on which the torch-to-framework gap is learned")
    am.add_argument("--reference-microbench", required=True, metavar="DIR", help="our tables of that GPU")
    am.add_argument("--data", help=DATA_HELP)
    am.add_argument("--json", action="store_true", help="print the full result as JSON instead of the table")
    am.add_argument("--no-doc", action="store_true", help="do not write the section into docs/accuracy.md")
    am.add_argument("--doc", default=str(_ACCURACY_MD), help=argparse.SUPPRESS)
    am.set_defaults(func=cmd_accuracy_microbench)
    mo = acc_sub.add_parser("modules", help="the simulator's MLA module kernels, summed, against each engine's "
                                            "measured MLA modules (docs/accuracy.md)")
    mo.add_argument("--gpu", action="append", metavar="NAME",
                    help="only this GPU (repeatable; default: every GPU with measured kernel tables)")
    mo.add_argument("--backend", action="append", choices=("sglang", "trtllm", "vllm"),
                    help="only this engine (repeatable)")
    mo.add_argument("--tier", choices=("cross-generation", "target-measured"), default="cross-generation")
    mo.add_argument("--sample", type=_sample, default=None, metavar="N|all",
                    help="at most N rows per GPU, engine and phase, in a fixed hash order (default: all)")
    mo.add_argument("--candidates", action="store_true",
                    help="also score each module with its attention kernel priced by each backend's rows (how the "
                         "engine profiles' [kernel_sources] mla_prefill / mla_decode are chosen; ~3x the time)")
    mo.add_argument("--data", help=DATA_HELP)
    mo.add_argument("--json", action="store_true", help="print the scores as JSON instead of the table")
    mo.add_argument("--no-doc", action="store_true", help="do not write the section into docs/accuracy.md")
    mo.add_argument("--doc", default=str(_ACCURACY_MD), help=argparse.SUPPRESS)
    mo.set_defaults(func=cmd_accuracy_modules)


def _sample(text: str) -> int | None:
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number or 'all', got {text!r}") from None
