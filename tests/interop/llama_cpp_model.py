"""What llama-server (llama.cpp 0.5.0-dev, commit 0c1e570, the llama-cpp-python 0.3.36 sdist) does to a
request before it tokenizes it, where that differs from the model's own template run by transformers.

Each function is one documented divergence (docs/interop.md, "Divergences"); the tests assert that
islwatch's count differs from llama-server's usage exactly where these functions change something, and that
islwatch's counting core applied to the transformed request equals llama-server's usage. Pure functions.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from tokenizers import Tokenizer

from proxy.count import iterates_content_parts, render_chat, template_of
from proxy.extract import chat_input, prompt_input


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


def llama_cpp_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """common/chat.cpp common_chat_tools_parse_oaicompat + common_chat_tools_to_json_oaicompat: a tool is
    rebuilt as {"type": "function", "function": {"name", "description" (default ""), "parameters" (default
    {})}}; other keys (e.g. "strict") are dropped and the key order is fixed."""
    out = []
    for tool in tools:
        fn = tool["function"]
        rebuilt = {
            "name": fn["name"],
            "description": fn.get("description", ""),
            "parameters": cpp_numbers(fn.get("parameters", {})),
        }
        out.append({"type": "function", "function": rebuilt})
    return out


def llama_cpp_message(msg: dict[str, Any]) -> dict[str, Any]:
    """Tool-call arguments are parsed and rendered by llama.cpp's Jinja engine (floats as %g)."""
    calls = msg.get("tool_calls")
    if not calls:
        return msg
    new_calls = []
    for call in calls:
        fn = dict(call["function"])
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            fn["arguments"] = json.dumps(cpp_numbers(json.loads(args)), ensure_ascii=False)
        new_calls.append({**call, "function": fn})
    return {**msg, "tool_calls": new_calls}


def llama_cpp_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request as llama-server's templates see it."""
    out = copy.deepcopy(body)
    out["messages"] = [llama_cpp_message(m) for m in out["messages"]]
    if out.get("tools"):
        out["tools"] = llama_cpp_tools(out["tools"])
    # tools/server/server-common.cpp oaicompat_chat_params_parse: with --prefill-assistant (the default) a
    # final assistant message is continued, not closed and followed by a generation prompt.
    last = out["messages"][-1]
    if last.get("role") == "assistant" and "continue_final_message" not in out:
        out["continue_final_message"] = True
        out["add_generation_prompt"] = False
    return out


def unnormalized(tok: Any) -> Tokenizer:
    """llama.cpp's BPE tokenizer (src/llama-vocab.cpp) applies no Unicode normalizer; transformers' Qwen2
    tokenizer applies NFC first. The same vocabulary and pre-tokenizer without the normalizer."""
    raw = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    raw.normalizer = None
    return raw


def llama_cpp_chat_count(tok: Any, raw: Tokenizer, body: dict[str, Any]) -> int:
    prepared = llama_cpp_chat_body(body)
    template = template_of(tok)
    chat = chat_input(prepared, template is not None and iterates_content_parts(template))
    text = render_chat(tok, chat, tokenize=False)
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
