"""The work behind `islwatch loadgen` (and the demo's load): validate the flags, prepare, send, report.

Kept apart from loadgen/cli.py so that parsing the command line (and `--help`) imports none of this.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from loadgen.config import LoadgenConfig
from loadgen.report.model import LoadgenReport
from loadgen.report.outputs import print_goodput, write_outputs
from loadgen.report.shard_dir import read_clock, write_shard
from loadgen.report.sweep import run_sweep
from loadgen.report.table import print_overhead, print_report
from loadgen.send.orchestrate import prepare, run_config
from proxy.core.tokenizer import TokenizerLoadError

FIELDS = set(LoadgenConfig.model_fields)


def config_from_args(args: argparse.Namespace) -> LoadgenConfig:
    data: dict[str, Any] = {k: v for k, v in vars(args).items() if k in FIELDS and v is not None}
    return LoadgenConfig.model_validate(data)


def validation_message(exc: ValidationError) -> str:
    msgs = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        msgs.append(f"--{where.replace('_', '-')}: {msg}" if where else msg)
    return "; ".join(msgs)


def run_loadgen(cfg: LoadgenConfig, console: Console) -> tuple[int, LoadgenReport | None]:
    """One run (or a sweep: then the report returned is None). Exit 2 when nothing could be sent."""
    try:
        if cfg.sweep:
            code, sweep, runs = run_sweep(cfg, console)
            write_outputs(cfg, runs, sweep)
            return code, None
        prepared = prepare(cfg)
    except (ValueError, OSError, TokenizerLoadError) as exc:
        console.print(f"[red]islwatch loadgen: {exc}[/]")
        return 2, None
    landing = prepared.workload.landing.value
    print_overhead(console, prepared.overhead, landing)
    clock = read_clock()  # wall vs monotonic, so `loadgen merge` puts shards of many machines on one timeline
    records, report = run_config(prepared.cfg, prepared, console)
    print_report(console, report)
    print_goodput(console, report, cfg.slo_attainment)
    write_outputs(cfg, [(None, records, report)])
    if cfg.run_dir:
        folder = write_shard(cfg.run_dir, cfg.shard_index, cfg.shard_count, report, records, clock)
        console.print(f"shard {cfg.shard_index}/{cfg.shard_count}: records, setup and clock in {folder}")
    return (0 if report.succeeded or not report.requests else 1), report


def run_args(args: argparse.Namespace) -> int:
    console = Console(stderr=False)
    try:
        cfg = config_from_args(args)
    except ValidationError as exc:
        print(f"islwatch loadgen: {validation_message(exc)}", file=sys.stderr)
        return 2
    return run_loadgen(cfg, console)[0]


def merge_args(args: argparse.Namespace) -> int:
    from loadgen.report.merge import run_merge

    outputs = {k: getattr(args, k) for k in ("output", "records", "html", "csv")}
    return run_merge(args.dirs, outputs, Console(stderr=False))
