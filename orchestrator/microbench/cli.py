"""CLI verbs `microbench run` and `microbench compare` (registered on `microbench`'s sub-parsers)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

from orchestrator.microbench.attention import ATTENTION_BACKENDS
from orchestrator.microbench.points import FAMILIES
from orchestrator.microbench.timing import TimingParams
from sim.errors import ConfigError


def cmd_microbench_run(args: Namespace) -> int:
    from orchestrator.microbench.runner import RunOptions, run_microbench

    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(source="microbench run", key="--repeats", value=args.repeats, rule="must be >= 1")
    timing = None if args.repeats is None else TimingParams(repeats=args.repeats)
    opts = RunOptions(plan=Path(args.plan), out=Path(args.out), device=args.device, dry_run=args.dry_run,
                      resume=args.resume, hardware=args.hardware,
                      only=tuple(x for x in (args.only or "").split(",") if x),
                      attention_backend=args.attention_backend, timing=timing)
    return run_microbench(opts, sys.stderr)


def cmd_microbench_compare(args: Namespace) -> int:
    from orchestrator.microbench.compare import compare_dirs, render_markdown

    ours, theirs = Path(args.ours), Path(args.theirs)
    text = render_markdown(compare_dirs(ours, theirs, args.system), ours, theirs)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        sys.stderr.write(f"wrote {args.out}\n")
    else:
        sys.stdout.write(text)
    return 0


def register_run(mb_sub: Any) -> None:
    """Add `run` and `compare` to the `kernelsight microbench` sub-parser collection."""
    run = mb_sub.add_parser("run", help="measure a plan's kernels on a CUDA GPU (tables for `calibrate`)")
    run.add_argument("--plan", required=True, metavar="PLAN.csv", help="from `kernelsight microbench plan`")
    run.add_argument("--out", required=True, metavar="DIR", help="tables, points.csv and device.json go here")
    run.add_argument("--device", default="cuda:0", help="cuda[:N] (default cuda:0), or cpu with --dry-run")
    run.add_argument("--dry-run", action="store_true",
                     help="shrunken shapes, few repeats: exercises plan -> timing loop -> files; times meaningless")
    run.add_argument("--resume", action="store_true", help="keep the points DIR/points.csv already measured")
    run.add_argument("--hardware", help="catalog GPU for the time budget and sanity flags (default: identified)")
    run.add_argument("--only", metavar="FAMILY[,FAMILY]", help=f"measure only these: {', '.join(FAMILIES)}")
    run.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                     help="attention implementation (auto: first that runs, in the order listed)")
    run.add_argument("--repeats", type=int, help="timed repeats per point (default 10; the median is reported)")
    run.set_defaults(func=cmd_microbench_run)

    cmp_ = mb_sub.add_parser("compare", help="median latency ratio of our tables vs another set, per family")
    cmp_.add_argument("--ours", required=True, metavar="DIR", help="a `microbench run` output directory")
    cmp_.add_argument("--theirs", required=True, metavar="DIR", help="e.g. shared/data/aiconfigurator/h100_sxm")
    cmp_.add_argument("--system", help="catalog name for the data README's exclusions (default: --theirs' name)")
    cmp_.add_argument("--out", metavar="REPORT.md", help="write the markdown here (default: stdout)")
    cmp_.set_defaults(func=cmd_microbench_compare)
