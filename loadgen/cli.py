"""`islwatch loadgen`: exactly budgeted synthetic traffic against an OpenAI-compatible server or proxy.

`configure` needs only light imports, so `islwatch loadgen --help` answers at once; `run` imports the
tokenizer, the pydantic config and rich only when there is work to do (loadgen/launch.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from loadgen.cli_options import agent_options, merge_options, shard_options, source_options
from loadgen.workload.markers import CacheBust
from proxy.core.endpoints import Endpoint
from proxy.core.specs import DEFAULT_TOKENIZER

# The endpoints the workload builds bodies for (LoadgenConfig.endpoint accepts the same names).
ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint.CHAT,
    Endpoint.COMPLETIONS,
    Endpoint.EMBEDDINGS,
    Endpoint.RESPONSES,
    Endpoint.MESSAGES,
)
ARRIVALS = ("poisson", "constant", "gamma")


def configure(p: argparse.ArgumentParser) -> None:
    _workload_options(p)
    _load_options(p)
    _output_options(p)
    source_options(p)  # loadgen/cli_options.py: datasets, traces, ramps, sweeps, SLOs, HTML and CSV
    agent_options(p)
    shard_options(p)
    # `islwatch loadgen merge DIR...`; --url is then not needed, so run() checks it rather than argparse.
    sub = p.add_subparsers(dest="loadgen_command", metavar="merge",
                           help="`islwatch loadgen merge DIR...`: one report from the shards' records")  # fmt: skip
    merge_help = "one report from the records of a run's shards (`--shard I/N --run-dir DIR`)"
    merge_options(sub.add_parser("merge", help=merge_help, description=merge_help))


def _workload_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="base URL of the server or islwatch proxy (required to send)")
    p.add_argument("--model", default="default", help="the request's model field (default: default)")
    p.add_argument(
        "--tokenizer", default=DEFAULT_TOKENIZER, help=f"PATH_OR_ID[@REV] (default {DEFAULT_TOKENIZER})"
    )
    p.add_argument("--endpoint", choices=[e.value for e in ENDPOINTS], default="chat", help="the API to call")
    p.add_argument(
        "--isl", type=int, help="templated tokens of the first request / per user turn (required unless "
        "--dataset or --trace gives the requests)",
    )  # fmt: skip
    p.add_argument(
        "--isl-stddev", type=float, default=0.0, help="a normal spread of --isl per turn (0: exact)"
    )
    p.add_argument("--osl", type=int, default=128, help="max_tokens per request")
    p.add_argument(
        "--turns", type=int, default=1, help="user turns per conversation, each with the replies so far"
    )
    p.add_argument("--shared-system-prompt-length", type=int, default=0, metavar="N",
                   help="a system prompt of exactly N tokens shared by every conversation (0: none)")  # fmt: skip
    p.add_argument("--cache-bust", choices=[c.value for c in CacheBust], default="none",
                   help="where a per-conversation marker lands, so no prompt reuses another's cached prefix")  # fmt: skip
    p.add_argument("--content-parts", action="store_true", help="send user content as a list of text parts")
    p.add_argument("--images", type=int, help="generated PNG images in each conversation's first user message, "
                   "their tokens in the ISL (Qwen2-VL / Qwen2.5-VL tokenizer folders)")  # fmt: skip
    p.add_argument("--image-size", metavar="WxH", help="size of each generated image (default 448x448)")
    p.add_argument("--mm-processor-kwargs", type=json.loads, metavar="JSON",
                   help="the server's --mm-processor-kwargs (e.g. '{\"max_pixels\": 1003520}'), for image counts")  # fmt: skip


def _load_options(p: argparse.ArgumentParser) -> None:
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help="closed loop: N users, each waits for its answer")
    load.add_argument("--request-rate", type=float, help="open loop: requests per second, scheduled ahead")
    p.add_argument(
        "--arrival", choices=list(ARRIVALS), default="poisson", help="the open loop's arrival times"
    )
    stop = p.add_mutually_exclusive_group()
    stop.add_argument("--request-count", type=int, help="requests to send")
    stop.add_argument("--duration", type=float, help="seconds of sending")
    p.add_argument("--warmup", type=int, default=0, help="requests sent first and excluded from results")
    p.add_argument("--streaming", action="store_true", help="stream; measure TTFT and inter-token latency")
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos (vLLM/SGLang) so OSL is exact")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt text and the arrival times")
    p.add_argument("--workers", type=int, default=1, help="processes sending in parallel (for high rates)")
    p.add_argument("--timeout-seconds", type=float, default=600.0, help="longest wait for one answer")


def _output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer token (env OPENAI_API_KEY)"
    )
    p.add_argument(
        "--proxy-metrics-url", help="an islwatch proxy's /metrics URL, read before and after the run"
    )
    p.add_argument("--output", type=Path, help="write the report as JSON")
    p.add_argument("--records", type=Path, help="write one JSON line per request")
    p.add_argument("--run-id", help="marker namespace (default: random)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "loadgen_command", None) == "merge":
        from loadgen.launch import merge_args

        return merge_args(args)
    if args.url is None:
        print("islwatch loadgen: the following arguments are required: --url", file=sys.stderr)
        return 2
    from loadgen.launch import run_args  # the tokenizer, pydantic and rich: only when there is work to do

    return run_args(args)
