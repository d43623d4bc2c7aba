"""`islwatch count`: the ISL of one request body, as one JSON object on stdout.

When the server would refuse the request (it answers 400 and counts nothing): its chat template raises
(`fallback_reason` `template_error`), or its own request path refuses the body (`server_would_refuse`: an
unknown `reasoning_effort`, an untrusted chat template, SGLang's request models...), the output has
`"server_would_refuse": true` and `"expected_server": null` (`bare` stays, for what it is worth), a note
goes to stderr, and the exit code is still 0: the body was counted as far as it can be. Otherwise
`"server_would_refuse": false`. Exit 2 only for unreadable input, a body that is not a request of the
endpoint, or a tokenizer that does not load.
"""

from __future__ import annotations

import argparse
import sys

from proxy.cli.args import add_server_settings, add_tokenizer_arguments, server_settings
from proxy.core.endpoints import Endpoint
from proxy.core.specs import FLAVORS


def configure(p: argparse.ArgumentParser) -> None:
    p.epilog = (
        "A request the server would refuse (its chat template raises, its request path answers 400) is "
        "reported with server_would_refuse true and expected_server null; the exit code is still 0."
    )
    add_tokenizer_arguments(p)
    p.add_argument("--endpoint", choices=[e.value for e in Endpoint], default=Endpoint.CHAT.value)
    p.add_argument(
        "--server-flavor",
        choices=list(FLAVORS),
        default="vllm",
        help="whose request preparation to predict (default vllm; sglang, llama.cpp)",
    )
    add_server_settings(p.add_argument)
    p.add_argument("file", nargs="?", default="-", help="request body JSON file, or - for stdin")


def run(args: argparse.Namespace) -> int:
    import orjson

    from proxy.core.count import INVALID_BODY, SERVER_REFUSES, TEMPLATE_ERROR
    from proxy.core.model import load_served_model
    from proxy.core.renderers.mistral import MistralLoadError
    from proxy.core.tokenizer import TokenizerLoadError

    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else open(args.file, "rb").read()  # noqa: SIM115
    except OSError as exc:
        print(f"islwatch count: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        print(f"islwatch count: invalid JSON: {exc}", file=sys.stderr)
        return 2
    try:
        settings = server_settings(args)
        model = load_served_model(
            args.tokenizer,
            args.server_flavor,
            settings,
            revision=args.revision,
            chat_template_file=args.chat_template,
            trust_remote_code=args.trust_remote_code,
        )
    except (TokenizerLoadError, MistralLoadError, ValueError) as exc:
        print(f"islwatch count: {exc}", file=sys.stderr)
        return 2
    streamed = isinstance(body, dict) and body.get("stream") is True
    result = model.count(args.endpoint, body, streamed)
    if result.fallback_reason == INVALID_BODY:
        print(f"islwatch count: not a {args.endpoint} request: {result.detail}", file=sys.stderr)
        return 2
    out = result.as_dict()
    refused = result.fallback_reason in (TEMPLATE_ERROR, SERVER_REFUSES)
    if refused:  # the server renders the same template, or refuses the body first: a 400, nothing counted
        out["expected_server"] = None
        why = (
            f"the chat template raises ({result.detail})"
            if result.detail and result.fallback_reason == TEMPLATE_ERROR
            else result.detail
        )
        print(
            f"islwatch count: {why}: the server would refuse this request (it answers 400)", file=sys.stderr
        )
    out["server_would_refuse"] = refused
    out["template_sha256"] = model.identity.template_sha256
    out["tokenizer"] = model.describe()
    sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
    return 0
