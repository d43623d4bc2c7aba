"""`islwatch` console command: wires the subcommands. The only module that sees both proxy and loadgen.

Each subcommand is a module with `configure(parser)` (argparse only: light imports, so `--help` answers
at once) and `run(args) -> int` (which imports the heavy parts). Only the module of the subcommand being
run is imported, with a plain import: a broken module fails loudly when its command is used.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from types import ModuleType


def _count() -> ModuleType:
    from proxy.cli import count

    return count


def _proxy() -> ModuleType:
    from proxy.cli import proxy

    return proxy


def _emulate() -> ModuleType:
    from proxy.cli import emulate

    return emulate


def _parity() -> ModuleType:
    from proxy.cli import parity

    return parity


def _loadgen() -> ModuleType:
    from loadgen import cli

    return cli


def _demo() -> ModuleType:
    from loadgen.demo import cli

    return cli


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# name -> (help, the module that implements it)
SUBCOMMANDS: dict[str, tuple[str, Callable[[], ModuleType]]] = {
    "count": ("count the ISL of one request body", _count),
    "proxy": ("run the sidecar proxy", _proxy),
    "emulate": ("run an OpenAI-compatible upstream emulator with fault switches", _emulate),
    "parity": ("serialization parity gate for a tokenizer", _parity),
    "loadgen": ("send exactly budgeted synthetic traffic", _loadgen),
    "demo": ("scenes on the emulator: a correct deployment, then drift caught and named", _demo),
}


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named on the command line (the first word that is one), before parsing."""
    return next((a for a in argv if a in SUBCOMMANDS), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; only the chosen subcommand's flags are configured (all of them when `argv` is None)."""
    parser = argparse.ArgumentParser(prog="islwatch", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default=None, type=str.upper, help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = None if argv is None else _chosen(argv)
    for name, (help_text, module) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv is None or name == chosen:
            mod = module()
            mod.configure(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.log_level is not None and args.log_level not in LOG_LEVELS:
        # A level logging does not know would raise from logging.basicConfig: a traceback at start.
        parser.error(f"--log-level: {args.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(
        level=(args.log_level or "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return int(args._run(args) or 0)
