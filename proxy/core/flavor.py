"""Server flavors: what a particular server does to a request before it tokenizes it.

The counting core mirrors vLLM. SGLang renders the same templates through transformers but prepares the
request its own way: `server_flavor: sglang` follows it (core/sglang.py, SGLang 0.5.23). llama.cpp's
`llama-server` departs from that in a few documented ways (README, "Tested against llama.cpp"); with
`server_flavor: llama.cpp` islwatch predicts llama-server's count instead, and every text-only chat request
is exact there too. Pure functions; the tokenizer copy is made once, at load time.

Modelled on llama.cpp 0.5.0-dev (commit 0c1e570, the llama-cpp-python 0.3.36 sdist).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from dataclasses import replace
from typing import Any

from tokenizers import Tokenizer

from .count import CountResult, Encoder, count
from .server_settings import DEFAULT_SETTINGS, ServerSettings
from .sglang import count_sglang

_UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}


def cpp_number(x: float) -> float | int:
    """llama.cpp's Jinja engine prints floats with `std::ostream << double` (common/jinja/value.cpp,
    value_to_json): C's %g, 6 significant digits, no trailing ".0". Returns the Python number that
    json.dumps prints the same way (exponent forms of large numbers, e.g. 1.23457e+08, are not modelled)."""
    text = f"{x:g}"
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        return int(text)
    return float(text)


def cpp_numbers(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return cpp_number(value)
    if isinstance(value, dict):
        return {k: cpp_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cpp_numbers(v) for v in value]
    return value


def llama_cpp_tools(tools: list[Any]) -> list[Any]:
    """common/chat.cpp common_chat_tools_parse_oaicompat + common_chat_tools_to_json_oaicompat: a tool is
    rebuilt as {"type": "function", "function": {"name", "description" (default ""), "parameters" (default
    {})}}; other keys (e.g. "strict") are dropped and the key order is fixed."""
    out: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            out.append(tool)  # not a tool llama.cpp accepts; the core reports the body as invalid
            continue
        rebuilt = {
            "name": fn.get("name"),
            "description": fn.get("description", ""),
            "parameters": cpp_numbers(fn.get("parameters", {})),
        }
        out.append({"type": "function", "function": rebuilt})
    return out


def _llama_cpp_message(msg: Any) -> Any:
    """Tool-call arguments are parsed and rendered by llama.cpp's Jinja engine (floats as %g)."""
    calls = msg.get("tool_calls") if isinstance(msg, dict) else None
    if not isinstance(calls, list) or not calls:
        return msg
    new_calls = []
    for call in calls:
        fn = (
            dict(call["function"])
            if isinstance(call, dict) and isinstance(call.get("function"), dict)
            else None
        )
        if fn is None:
            new_calls.append(call)
            continue
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            with contextlib.suppress(ValueError):  # the core reports unparsable arguments
                fn["arguments"] = json.dumps(cpp_numbers(json.loads(args)), ensure_ascii=False)
        new_calls.append({**call, "function": fn})
    return {**msg, "tool_calls": new_calls}


def llama_cpp_chat_body(body: Any) -> Any:
    """The chat request as llama-server's templates see it."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return body
    out = copy.copy(body)
    out["messages"] = [_llama_cpp_message(m) for m in body["messages"]]
    if isinstance(out.get("tools"), list) and out["tools"]:
        out["tools"] = llama_cpp_tools(out["tools"])
    # tools/server/server-common.cpp oaicompat_chat_params_parse: with --prefill-assistant (the default) a
    # final assistant message is continued, not closed and followed by a generation prompt.
    last = out["messages"][-1]
    if isinstance(last, dict) and last.get("role") == "assistant" and "continue_final_message" not in out:
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    return out


def prepare_body(flavor: str, endpoint: str, body: Any) -> Any:
    """The body as the flavor's server prepares it, for the vLLM-shaped counting core."""
    if flavor == "llama.cpp" and endpoint == "chat":
        return llama_cpp_chat_body(body)
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
    """The tokenizer as the flavor's server runs it: for llama.cpp, a copy without Unicode normalization."""
    if flavor != "llama.cpp" or getattr(tok, "_tokenizer", None) is None:
        return tok
    raw = tok._tokenizer
    stripped = unnormalized(raw)
    if stripped.to_str() == raw.to_str():
        return tok
    out = copy.deepcopy(tok)
    out._tokenizer = stripped
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
    if flavor == "llama.cpp":  # llama-server checks a request its own way (README, "Divergences")
        settings = replace(settings, vllm_refusals=False)
    result = count(enc, endpoint, prepare_body(flavor, endpoint, body), settings)
    reported = reported_prompt_tokens(flavor, endpoint, result.prompts, streamed)
    return result if reported is None else replace(result, expected_server=reported)
