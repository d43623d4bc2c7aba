"""Server flavors: what a particular server does to a request before it tokenizes it.

The counting core mirrors vLLM. SGLang renders the same templates through transformers but prepares the
request its own way: `server_flavor: sglang` follows it (core/sglang.py, SGLang 0.5.23). llama.cpp's
`llama-server` prepares messages, tools and template kwargs its own way and renders with its own Jinja engine
and tokenizer (README, "Tested against llama.cpp"); with `server_flavor: llama.cpp` islwatch predicts
llama-server's count instead (core/llama_cpp.py), exact on every text-only chat shape tested on Qwen2.5,
Llama-3, Qwen3 and gpt-oss. Pure functions; the tokenizer copy is made once, at load time.

Modelled on llama.cpp 0.5.0-dev (commit 0c1e570, the llama-cpp-python 0.3.36 sdist).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

from tokenizers import Tokenizer

from .count import CountResult, Encoder, count, not_counted
from .llama_cpp import LlamaCppEncoder, cpp_number, llama_cpp_chat_body, patched_template
from .messages import InvalidBody
from .server_settings import DEFAULT_SETTINGS, ServerSettings
from .sglang import count_sglang

__all__ = [
    "count_as",
    "cpp_number",
    "flavored_tokenizer",
    "llama_cpp_chat_body",
    "prepare_body",
    "reported_prompt_tokens",
    "unnormalized",
]

_UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}


def prepare_body(flavor: str, endpoint: str, body: Any, template: str | None = None) -> Any:
    """The body as the flavor's server prepares it, for the vLLM-shaped counting core (`template`: the one
    the server renders with). Raises ServerRefuses where that server answers 400, InvalidBody on its 500s."""
    if flavor == "llama.cpp" and endpoint == "chat":
        return llama_cpp_chat_body(body, template)
    return body


def unnormalized(raw: Tokenizer) -> Tokenizer:
    """llama.cpp's BPE tokenizer (src/llama-vocab.cpp) applies no Unicode normalizer; transformers' Qwen2
    tokenizer applies NFC first. The same vocabulary and pre-tokenizer without Unicode normalization (other
    normalizers, such as SentencePiece's space handling, are kept)."""
    spec = json.loads(raw.to_str())
    norm = spec.get("normalizer")
    if isinstance(norm, dict):
        if norm.get("type") in _UNICODE_NORMALIZERS:
            spec["normalizer"] = None
        elif norm.get("type") == "Sequence":
            kept = [n for n in norm.get("normalizers", []) if n.get("type") not in _UNICODE_NORMALIZERS]
            spec["normalizer"] = {**norm, "normalizers": kept} if kept else None
    return Tokenizer.from_str(json.dumps(spec))


def flavored_tokenizer(tok: Any, flavor: str) -> Any:
    """The tokenizer as the flavor's server runs it: for llama.cpp, a copy without Unicode normalization and
    with the template llama-server keeps (core/llama_cpp.py `patched_template`)."""
    if flavor != "llama.cpp" or getattr(tok, "_tokenizer", None) is None:
        return tok
    raw = tok._tokenizer
    stripped = unnormalized(raw)
    template = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else None
    patched = patched_template(template) if template is not None else None
    if stripped.to_str() == raw.to_str() and patched == template:
        return tok
    out = copy.deepcopy(tok)
    out._tokenizer = stripped
    if patched != template:
        out.chat_template = patched
    return out


def reported_prompt_tokens(
    flavor: str, endpoint: str, prompts: tuple[int, ...], streamed: bool
) -> int | None:
    """What the server reports for a request of several prompts, when that is not their sum.

    llama.cpp, non-streaming `/v1/completions` with a list of prompts: the answer is the first prompt's JSON
    with the other choices appended (server-context.cpp handle_completions_impl), so its usage is the first
    prompt's alone. Streaming, each prompt's usage rides on its finish chunk and islwatch sums them.
    """
    if flavor == "llama.cpp" and endpoint == "completions" and not streamed and len(prompts) > 1:
        return prompts[0]
    return None


def count_as(
    flavor: str,
    enc: Encoder,
    endpoint: str,
    body: Any,
    streamed: bool,
    settings: ServerSettings = DEFAULT_SETTINGS,
    model_type: str | None = None,
) -> CountResult:
    """What the flavor's server counts for this request: its preparation of the body, then the one
    counting path, then how it reports the usage of several prompts. `model_type`: config.json's, for the
    rules a server keys on it. Never raises."""
    if flavor == "sglang":  # its own chat preparation (core/sglang.py); other endpoints as vLLM's
        return count_sglang(enc, endpoint, body, settings, model_type)
    if flavor == "llama.cpp":  # llama-server checks a request its own way (core/llama_cpp.py)
        settings = replace(settings, vllm_refusals=False)
        enc = LlamaCppEncoder(enc)
    try:
        prepared = prepare_body(flavor, endpoint, body, enc.template)
    except InvalidBody as exc:  # a ServerRefuses where the server answers 400
        return not_counted(endpoint, exc)
    result = count(enc, endpoint, prepared, settings)
    reported = reported_prompt_tokens(flavor, endpoint, result.prompts, streamed)
    return result if reported is None else replace(result, expected_server=reported)
