"""`islwatch loadgen` flags for real workloads, load shapes and reports (argparse only: `--help` stays fast)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.load_checks import parse_pairs, parse_values


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc

    return convert


def source_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload sources")
    g.add_argument(
        "--dataset", type=Path, help="JSONL of {messages|prompt, isl?, osl?} records, sent in order (cycled)"
    )
    g.add_argument(
        "--trace", type=Path, help="a mooncake trace (timestamp ms, input_length, output_length, hash_ids)"
    )
    g.add_argument("--trace-speedup", type=float, default=1.0, help="divide the trace's timestamps by this")
    g.add_argument("--block-size", type=int, default=512, help="tokens per trace hash_id block (default 512)")
    g.add_argument("--corpus", type=Path, help="a text file whose words fill prompts (default: a word list)")
    s = p.add_argument_group("load shapes")
    s.add_argument(
        "--burstiness", type=float, default=1.0, help="--arrival gamma's shape (vLLM's; 1 = Poisson)"
    )
    s.add_argument(
        "--ramp-to", type=float, help="ramp --request-rate or --concurrency linearly to this value"
    )
    s.add_argument(
        "--sweep",
        type=_typed(parse_values),
        help="run once per rate (or concurrency, or trace speedup): 1,2,4",
    )
    s.add_argument(
        "--slo", type=_typed(parse_pairs), help="goodput bounds per request: ttft_ms=..,itl_ms=..,e2e_ms=.."
    )
    s.add_argument(
        "--slo-attainment", type=float, default=0.9, help="share of requests within --slo a sweep point needs"
    )
    r = p.add_argument_group("reports")
    r.add_argument("--html", type=Path, help="write a self-contained HTML report (inline SVG charts)")
    r.add_argument("--csv", type=Path, help="write one CSV row per request")
