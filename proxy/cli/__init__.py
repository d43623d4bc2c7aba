"""`islwatch` console command: wires the subcommands. The only module that sees both proxy and loadgen."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, help). Each module has `configure(parser)` and `run(args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "count": ("proxy.cli.count", "count the ISL of one request body"),
    "proxy": ("proxy.cli.proxy", "run the sidecar proxy"),
    "emulate": ("proxy.emulator.app", "run an OpenAI-compatible upstream emulator with fault switches"),
    "parity": ("proxy.cli.parity", "serialization parity gate for a tokenizer"),
    "loadgen": ("loadgen.cli", "send exactly budgeted synthetic traffic"),
    "demo": ("loadgen.demo", "emulator + proxy + loadgen on an offline tokenizer"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="islwatch", description=__doc__)
    parser.add_argument("--log-level", default=None, help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue  # not built yet
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(args.log_level or "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
