"""`islwatch loadgen` flags for real workloads, load shapes and reports (argparse only: `--help` stays fast)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen.load_checks import parse_pairs, parse_values
from loadgen.shards import parse_shard


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


def _shard(text: str) -> str:
    parse_shard(text)
    return text.strip()


def shard_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("many clients, one run (`islwatch loadgen merge`)")
    g.add_argument(
        "--shard", type=_typed(_shard), metavar="I/N",
        help="send part I (0..N-1) of the run, the rest by N-1 other clients with the same flags and --run-id",
    )  # fmt: skip
    g.add_argument(
        "--run-dir", type=Path, metavar="DIR",
        help="write this shard's records, setup and clock into DIR/shard-I-of-N/ for `islwatch loadgen merge`",
    )  # fmt: skip


def merge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="a shard's folder, or a --run-dir holding shard folders")  # fmt: skip
    p.add_argument("--output", type=Path, help="write the merged report as JSON")
    p.add_argument("--records", type=Path, help="write every shard's records, one JSON line per request")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report (inline SVG charts)")
    p.add_argument("--csv", type=Path, help="write one CSV row per request")


def agent_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("agent workload (--workload agent)")
    g.add_argument("--workload", choices=["conversation", "agent"], default="conversation",
                   help="conversation: user turns (--turns); agent: system + user + rounds of reasoning, tool calls "
                   "and tool results, each request exactly --isl + rounds x --round-isl tokens")  # fmt: skip
    g.add_argument(
        "--agent-rounds", type=int, help="rounds per agent conversation (default 3): rounds + 1 requests"
    )
    g.add_argument("--tools", type=int, help="function schemas sent as `tools` (default 4)")
    g.add_argument("--parallel-calls", type=int, help="most tool calls in one assistant turn (default 2)")
    g.add_argument("--round-isl", type=int, help="templated tokens each round adds to the request")
    g.add_argument("--server-flavor", choices=["vllm", "sglang", "llama.cpp"], default="vllm",
                   help="whose counting the agent budget follows (as the proxy's --server-flavor)")  # fmt: skip
