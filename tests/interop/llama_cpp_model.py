"""What llama-server (llama.cpp 0.5.0-dev, commit 0c1e570, the llama-cpp-python 0.3.36 sdist) does to a
request before it tokenizes it, where that differs from the model's own template run by transformers.

The divergences themselves live in proxy/flavor.py (islwatch's `--server-flavor llama.cpp`); each is one
documented divergence (docs/compatibility/llama-cpp.md, "Divergences"); the tests assert that
islwatch's count differs from llama-server's usage exactly where these functions change something, and that
islwatch's counting core applied to the transformed request equals llama-server's usage. Pure functions.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from proxy.core.extract import chat_input, prompt_input
from proxy.core.flavors.llama_cpp import llama_cpp_chat_body
from proxy.core.flavors.llama_cpp import unnormalized as _unnormalized
from proxy.core.tokens import iterates_content_parts, render_chat, template_of


def unnormalized(tok: Any) -> Tokenizer:
    """The tokenizer's Rust backend without Unicode normalization, as llama.cpp runs it."""
    return _unnormalized(tok.backend_tokenizer)


def llama_cpp_chat_count(tok: Any, raw: Tokenizer, body: dict[str, Any]) -> int:
    prepared = llama_cpp_chat_body(body)
    template = template_of(tok)
    chat = chat_input(prepared, template is not None and iterates_content_parts(template))
    text = render_chat(tok, chat)
    return len(raw.encode(text, add_special_tokens=False).ids)


def llama_cpp_prompt_counts(raw: Tokenizer, body: dict[str, Any]) -> list[int]:
    """Per-prompt counts of a /v1/completions body (BOS added where the vocabulary says so)."""
    counts = []
    for p in prompt_input(body, "prompt").prompts:
        counts.append(len(p) if isinstance(p, list) else len(raw.encode(p, add_special_tokens=True).ids))
    return counts


def llama_cpp_nonstream_usage(counts: list[int]) -> int:
    """server-context.cpp handle_completions_impl: with several prompts the non-streaming answer is the
    first result's JSON with every result's choice appended, so `usage` is the first prompt's alone."""
    return counts[0]
