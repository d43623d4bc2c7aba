"""Flags shared by the subcommands that load one tokenizer (`islwatch count`, `islwatch parity`)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from proxy.core.server_settings import REASONING_PARSERS, ServerSettings


def add_tokenizer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", required=True, help="hub id, local folder or builtin:NAME, optionally @REVISION"
    )
    p.add_argument("--revision", help="hub revision (branch, tag or commit)")
    p.add_argument("--chat-template", help="file whose text replaces the tokenizer's chat template")
    p.add_argument("--trust-remote-code", action="store_true", help="allow tokenizer code from the hub")


def add_server_settings(add: Any) -> None:
    """The server's own start-up settings that change its counts (core/server_settings.py); `add` is the
    parser's add_argument, or a wrapper of it."""
    add(
        "--default-chat-template-kwargs",
        metavar="JSON",
        help="the server's --default-chat-template-kwargs, merged under each request's (default {})",
    )
    add(
        "--tokenizer-mode",
        choices=["auto", "hf", "mistral"],
        help="the server's --tokenizer-mode: mistral counts through mistral-common (default auto: by the folder)",
    )
    add(
        "--reasoning-parser",
        choices=list(REASONING_PARSERS),
        help="SGLang's --reasoning-parser (Messages API: how past thinking is rendered); default auto: the "
        "parser SGLang's docs give for the model's template",
    )
    add(
        "--harmony-start-date",
        metavar="YYYY-MM-DD",
        help="the date vLLM writes into gpt-oss system messages: its VLLM_SYSTEM_START_DATE (default today, UTC)",
    )


def server_settings(args: argparse.Namespace) -> ServerSettings:
    """The ServerSettings of `islwatch count` / `parity` flags; raises ValueError on a malformed value."""
    raw = getattr(args, "default_chat_template_kwargs", None) or "{}"
    kwargs = json.loads(raw)
    if not isinstance(kwargs, dict):
        raise ValueError("--default-chat-template-kwargs must be a JSON object")
    date = getattr(args, "harmony_start_date", None) or None
    mode = getattr(args, "tokenizer_mode", None) or "auto"
    return ServerSettings(kwargs, date, mode, getattr(args, "reasoning_parser", None) or "auto")
