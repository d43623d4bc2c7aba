"""Shared by the parity tests: the tokenizers under test, cached gate reports, and the CLI runner."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.core.parity_gate import ParityReport, PathRow, RequestMode, check
from proxy.core.parity_paths import SPLIT
from tests.builders import build_tokenizer, save_tokenizer
from tests.conftest import FAMILIES, load_builtin, load_shared

BUILT = ["chatml", "llama3", "inst", "parts"]
# Tokenizers whose plain encode adds BOS: an extra special-token pass must differ there.
ADDS_BOS = {
    "mistral-7b-instruct-v0.1",
    "llama-3-8b-instruct",
    "tinyllama-1.1b-chat-v1.0",
    "built:llama3",
    "built:inst",
    "builtin",
}
# ... and whose template already wrote BOS: the extra pass duplicates it.
TEMPLATE_BOS = ADDS_BOS - {"tinyllama-1.1b-chat-v1.0"}
NAMES = [*FAMILIES, *(f"built:{s}" for s in BUILT), "builtin"]


@cache
def _built(style: str) -> Any:
    return build_tokenizer(style)


def tokenizer(name: str) -> Any:
    if name == "builtin":
        return load_builtin().tokenizer
    if name.startswith("built:"):
        return _built(name.removeprefix("built:"))
    return load_shared(name).tokenizer


@cache
def report(name: str, serving_path: str = SPLIT) -> ParityReport:
    return check(tokenizer(name), mode=RequestMode(serving_path=serving_path))


def gated_failures(rep: ParityReport) -> list[PathRow]:
    return [
        r for c in rep.conversations for r in c.rows if r.gated and (r.equal is not True or r.duplicate_bos)
    ]


def llama3_folder(tmp_path: Path) -> Path:
    """A fresh folder with the test-built llama3 tokenizer (BOS from the template and the encode)."""
    return Path(save_tokenizer("llama3", str(tmp_path / "tok")))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["parity", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err
