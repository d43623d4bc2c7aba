"""`islwatch emulate`: flags -> EmulatorConfig, then serve until signalled.

`configure` needs only light modules, so `islwatch emulate --help` does not load aiohttp or transformers;
`run` imports the app (and through it the tokenizer library) when it is actually going to serve.
"""

from __future__ import annotations

import argparse
import sys

from proxy.core.specs import DEFAULT_TOKENIZER
from proxy.emulator.config import DEFAULT_MAX_TOKENS, FIXED_CREATED, EmulatorConfig
from proxy.emulator.faults import parse_faults


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (loopback)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad --listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8000")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help=f"PATH_OR_ID[@REVISION] or builtin:NAME (default {DEFAULT_TOKENIZER})",
    )
    parser.add_argument(
        "--chat-template", metavar="FILE", help="a Jinja file overriding the tokenizer's template"
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME",
        help="a served model name (repeatable; default: the tokenizer spec, as vLLM does)",
    )
    parser.add_argument(
        "--strict-models",
        action="store_true",
        help="answer 404 for models not served, like vLLM (default: answer any model)",
    )
    parser.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT (default 127.0.0.1:8000)")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="double-bos | no-template | system-prompt=N | gen-prompt-off | status=CODE@FRACTION"
        " | latency=50ms | token-latency=5ms | reset-mid-stream@FRACTION"
        " | tokenizer=SPEC (another tokenizer counts and answers /tokenize) (repeatable)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault RNGs (default 0)")
    parser.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"answer length when the request sets none (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--prefix-cache",
        action="store_true",
        help="model vLLM's prefix cache: repeated leading blocks of 16 tokens are reported as cached "
        "(the Messages API's cache_read_input_tokens, subtracted from input_tokens)",
    )
    parser.add_argument(
        "--wall-clock",
        action="store_true",
        help="real `created` timestamps (default: a fixed one, for reproducible bytes)",
    )


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """Raises ValueError on a bad fault spec or setting."""
    if args.default_max_tokens < 1:
        raise ValueError("--default-max-tokens must be at least 1")
    return EmulatorConfig(
        tokenizer=args.tokenizer,
        models=tuple(args.model),
        chat_template=args.chat_template,
        faults=parse_faults(args.fault),
        seed=args.seed,
        default_max_tokens=args.default_max_tokens,
        strict_models=args.strict_models,
        created=None if args.wall_clock else FIXED_CREATED,
        prefix_cache=args.prefix_cache,
    )


def run(args: argparse.Namespace) -> int:
    from proxy.core.tokenizer import TokenizerLoadError
    from proxy.emulator.app import build_emulator_app, serve
    from proxy.runtime.loop import run as run_loop

    try:
        config = config_from_args(args)
        host, port = parse_listen(args.listen)
        app = build_emulator_app(config)
    except (ValueError, TokenizerLoadError) as exc:
        print(f"islwatch emulate: error: {exc}", file=sys.stderr)
        return 2
    try:
        run_loop(serve(app, host, port))
    except OSError as exc:  # address in use, permission denied
        print(f"islwatch emulate: error: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 2
    return 0
