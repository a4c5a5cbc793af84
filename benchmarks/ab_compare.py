"""Run one benchmark command against two code trees, alternating, and summarise each number it prints.

    python benchmarks/ab_compare.py --before /tmp/old --after . [--rounds 7] [--pattern REGEX] \
        -- python benchmarks/bench_disagg.py --repeat 1

The command runs `--rounds` times per tree in fresh processes, before and after in turn (so a slow
spell of a shared or throttled machine hits both), from the current directory with `PYTHONPATH` set
to the tree (`git worktree add /tmp/old <commit>` makes the "before" tree; its `sim` and
`orchestrator` then shadow the installed ones). Every match of `--pattern` (first group, a number;
default the `CPU <seconds>` the simulator benchmarks print) in a run's output is one column, in
order: `bench_moe_mla.py` prints two (TP8, DP8 + EP8). Prints per tree and column the median, the
minimum and every value; `--json` adds the raw values. A run that fails or prints a different number
of matches stops the comparison with its output.

Run-to-run noise on this project's shared 2-core box is 10-30% of CPU time; the median of 5-7
alternating rounds is what docs/benchmarks.md reports, the minimum beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

DEFAULT_PATTERN = r"CPU ([0-9]+(?:\.[0-9]+)?)"


def run_once(tree: str, command: list[str], pattern: re.Pattern[str]) -> list[float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"ab_compare: {' '.join(command)} failed under PYTHONPATH={tree} (exit {proc.returncode}):\n"
                 f"{proc.stdout}{proc.stderr}")
    return [float(m.group(1)) for m in pattern.finditer(proc.stdout + proc.stderr)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="code tree of the 'before' runs (PYTHONPATH)")
    ap.add_argument("--after", default=".", help="code tree of the 'after' runs (default: .)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pattern", default=DEFAULT_PATTERN, help="regex whose first group is a number")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark command")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the benchmark command after --")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: must be >= 1")
    pattern = re.compile(args.pattern)
    values: dict[str, list[list[float]]] = {"before": [], "after": []}
    width = None
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", args.after)):
            found = run_once(tree, command, pattern)
            if not found or (width is not None and len(found) != width):
                sys.exit(f"ab_compare: {name} run printed {len(found)} matches of {args.pattern!r}"
                         f"{'' if width is None else f', earlier runs {width}'}")
            width = len(found)
            values[name].append(found)
    for name in ("before", "after"):
        columns = list(zip(*values[name], strict=True))
        summary = " | ".join(f"median {statistics.median(c):.3f} min {min(c):.3f} ({', '.join(f'{x:g}' for x in c)})"
                             for c in columns)
        print(f"{name}: {summary}")
    if args.json:
        print(json.dumps({"command": command, "rounds": args.rounds, "values": values}))


if __name__ == "__main__":
    main()
