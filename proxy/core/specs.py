"""The names an operator types: tokenizer specs and server flavors. No heavy imports, so every
`islwatch <command> --help` can show the defaults without loading transformers."""

from __future__ import annotations

import os
from typing import Literal

BUILTIN_PREFIX = "builtin:"
DEFAULT_TOKENIZER = BUILTIN_PREFIX + "mistral-v0.1"

# Whose request preparation islwatch predicts (core/flavor.py): vLLM (also SGLang, TGI) or llama-server.
ServerFlavor = Literal["vllm", "llama.cpp"]
FLAVORS: tuple[str, ...] = ("vllm", "llama.cpp")


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`PATH_OR_ID[@REVISION]` -> (path_or_id, revision). A local path containing '@' wins."""
    if "@" in spec and not os.path.exists(spec):
        name, _, rev = spec.rpartition("@")
        if name:
            return name, rev or None
    return spec, None
