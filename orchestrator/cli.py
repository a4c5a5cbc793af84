"""`kernelsight` command line: thin verbs over the public API.

Exit codes: 0 success, 1 run failure (a missing optional package included), 2 invalid input
(`ConfigError`). Results go to stdout, logs and errors to stderr. Verbs that need an optional
package (Ray, Optuna, MLflow, pandas, ...) import it lazily; without it they stop with one line
naming the package and the install command (`OPTIONAL_EXTRA`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from orchestrator.optional import missing_package_error
from sim.errors import ConfigError, file_error


class UsageError(Exception):
    """A command line argparse refuses: `prog` is the (sub)command, `message` what is wrong."""

    def __init__(self, prog: str, message: str) -> None:
        self.prog, self.message = prog, message
        super().__init__(f"{prog}: {message}")


class _Parser(argparse.ArgumentParser):
    """Reports a bad command line as the project's error (exit 2), not argparse's usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


def build_parser() -> argparse.ArgumentParser:
    from orchestrator import commands_sim as sim_cmds

    parser = _Parser(prog="kernelsight", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    sub = parser.add_subparsers(dest="verb", required=True)

    step = sub.add_parser("step", help="per-kernel table for one serving step")
    step.add_argument("scenario")
    step.add_argument("--prefill", action="append", metavar="[COUNTx]TOKENS[:CACHED]",
                      help="prompt chunk(s); repeatable, e.g. 2048 or 4x512:1024")
    step.add_argument("--decode", action="append", metavar="COUNTxCONTEXT",
                      help="decoding requests and their cached context, e.g. 64x1024")
    step.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key")
    step.add_argument("--pool", choices=("prefill", "decode"),
                      help="disaggregated scenario: the pool whose workers run the step (default: decode "
                           "for a decode-only batch, else prefill)")
    step.add_argument("--json", action="store_true", help="JSON on stdout")
    step.set_defaults(func=sim_cmds.cmd_step)

    from orchestrator import commands_run

    run = sub.add_parser("run", help="simulate a scenario and print its metrics")
    run.add_argument("scenario")
    run.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a scenario key")
    run.add_argument("--json", action="store_true", help="summary and kernel breakdown as JSON on stdout")
    run.add_argument("--out", metavar="DIR",
                     help="write requests, kernel breakdown and KV usage as Parquet, and summary.json (what --json "
                          "prints)")
    run.add_argument("--trace", action="store_true", help="with --out, also write a Chrome trace")
    run.add_argument("--intervals", type=int, default=0, metavar="K",
                     help="add 90%% intervals (<metric>_lo/_hi) from K seeded kernel-model perturbations; "
                          "costs K more simulations (0: off; 8 is a good choice)")
    run.add_argument("--interval-seed", type=int, metavar="SEED", help="seed of the perturbations (default: the "
                     "scenario's seed)")
    run.add_argument("--kernel-only-intervals", action="store_true",
                     help="leave out the end-to-end widening (sim/data/calibration/e2e_widening.json): the intervals "
                          "then cover only the kernel model's uncertainty")
    run.set_defaults(func=commands_run.cmd_run)

    check = sub.add_parser("check", help="validate scenario, hardware or sweep TOML files")
    check.add_argument("files", nargs="+")
    check.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                       help="override a scenario key before checking (as `run --set` does)")
    check.set_defaults(func=sim_cmds.cmd_check)

    lst = sub.add_parser("list", help="list shipped hardware or models")
    lst.add_argument("what", choices=("hardware", "models"))
    lst.set_defaults(func=sim_cmds.cmd_list)

    from orchestrator import commands_kernels

    commands_kernels.register(sub)  # predict-kernels, calibrate, microbench, fit-cross-generation
    __import__("orchestrator.commands_accuracy", fromlist=["register"]).register(sub)  # accuracy kernels
    __import__("orchestrator.commands_validate", fromlist=["register"]).register(sub)  # validate

    from orchestrator.sweep import command as sweep_command

    sweep_command.register(sub)  # imports Ray, Optuna and MLflow only when it runs
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; bad input (flags, files, values) prints one `error: ...` line and returns 2.

    File errors name the file, the key or flag, the value and the rule (`ConfigError`); an OS error
    no verb caught (a missing, unreadable or unwritable path) is reported the same way.
    """
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras:  # argparse would name the top-level parser: name the verb, whose flags they are not
            raise UsageError(_verb_parser(parser, args).prog, f"unrecognized arguments: {' '.join(extras)}")
    except UsageError as exc:
        sys.stderr.write(f"error: {exc.prog}: {exc.message} (see {exc.prog} --help)\n")
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except ModuleNotFoundError as exc:
        message = missing_package_error(args.verb, exc)
        if message is None:
            raise
        sys.stderr.write(f"error: {message}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"error: {file_error(exc)}\n")
        return 2
    except KeyboardInterrupt as exc:
        # A verb that can continue later says how where it catches the interrupt (sweep); a sweep's
        # SIGTERM arrives as `Terminated` (orchestrator.sweep.signals): exit 143, as the signal would.
        from orchestrator.sweep.signals import exit_code, stopped_word

        sys.stderr.write(f"\n{stopped_word(exc)}\n")
        return exit_code(exc)
    return code


def _verb_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the verb `args` ran (`kernelsight microbench plan`): the one the
    unrecognized arguments were given to."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None or name not in subs[0].choices:
            return parser
        parser = subs[0].choices[name]


if __name__ == "__main__":
    sys.exit(main())
