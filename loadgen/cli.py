"""`islwatch loadgen`: exactly budgeted synthetic traffic against an OpenAI-compatible server or proxy."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError
from rich.console import Console

from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.core.tokenizer import TokenizerLoadError

from .config import LoadgenConfig
from .markers import CacheBust
from .orchestrate import prepare, run_config
from .report import LoadgenReport
from .runner import Record
from .table import print_overhead, print_report

FIELDS = set(LoadgenConfig.model_fields)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="base URL of the server or islwatch proxy")
    p.add_argument("--model", default="default", help="the request's model field (default: default)")
    p.add_argument(
        "--tokenizer", default=DEFAULT_TOKENIZER, help=f"PATH_OR_ID[@REV] (default {DEFAULT_TOKENIZER})"
    )
    p.add_argument("--endpoint", choices=["chat", "completions", "embeddings"], default="chat")
    p.add_argument(
        "--isl", type=int, required=True, help="templated tokens of the first request / per user turn"
    )
    p.add_argument("--isl-stddev", type=float, default=0.0)
    p.add_argument("--osl", type=int, default=128, help="max_tokens per request")
    p.add_argument("--turns", type=int, default=1)
    p.add_argument("--shared-system-prompt-length", type=int, default=0, metavar="N")
    p.add_argument("--cache-bust", choices=[c.value for c in CacheBust], default="none")
    p.add_argument("--content-parts", action="store_true", help="send user content as a list of text parts")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help="closed loop: N users, each waits for its answer")
    load.add_argument("--request-rate", type=float, help="open loop: requests per second, scheduled ahead")
    p.add_argument("--arrival", choices=["poisson", "constant"], default="poisson")
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--request-count", type=int)
    stop.add_argument("--duration", type=float, help="seconds of sending")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and excluded from results")
    p.add_argument("--streaming", action="store_true", help="stream; measure TTFT and inter-token latency")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM/SGLang) so OSL is exact")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1, help="processes sending in parallel (for high rates)")
    p.add_argument("--timeout-seconds", type=float, default=600.0)
    p.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (env OPENAI_API_KEY)"
    )
    p.add_argument(
        "--proxy-metrics-url", help="an islwatch proxy's /metrics URL, read before and after the run"
    )
    p.add_argument("--output", type=Path, help="write the report as JSON")
    p.add_argument("--records", type=Path, help="write one JSON line per request")
    p.add_argument("--run-id", help="marker namespace (default: random)")


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


def write_outputs(cfg: LoadgenConfig, records: list[Record], report: LoadgenReport) -> None:
    if cfg.output:
        cfg.output.write_text(report.model_dump_json(indent=2) + "\n")
    if cfg.records:
        with cfg.records.open("wb") as f:
            for r in records:
                f.write(orjson.dumps(r) + b"\n")


def run_loadgen(cfg: LoadgenConfig, console: Console) -> tuple[int, LoadgenReport | None]:
    try:
        prepared = prepare(cfg)
    except (ValueError, TokenizerLoadError) as exc:
        console.print(f"[red]islwatch loadgen: {exc}[/]")
        return 2, None
    landing = prepared.workload.landing.value
    print_overhead(console, prepared.overhead, landing)
    records, report = run_config(cfg, prepared, console)
    print_report(console, report)
    write_outputs(cfg, records, report)
    return (0 if report.succeeded or not report.requests else 1), report


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=False)
    try:
        cfg = config_from_args(args)
    except ValidationError as exc:
        print(f"islwatch loadgen: {validation_message(exc)}", file=sys.stderr)
        return 2
    return run_loadgen(cfg, console)[0]
