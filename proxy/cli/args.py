"""Flags shared by the subcommands that load one tokenizer (`islwatch count`, `islwatch parity`)."""

from __future__ import annotations

import argparse


def add_tokenizer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", required=True, help="hub id, local folder or builtin:NAME, optionally @REVISION"
    )
    p.add_argument("--revision", help="hub revision (branch, tag or commit)")
    p.add_argument("--chat-template", help="file whose text replaces the tokenizer's chat template")
    p.add_argument("--trust-remote-code", action="store_true", help="allow tokenizer code from the hub")
