"""The JSON answer bodies. Shapes follow vLLM's `vllm/entrypoints/openai/protocol.py`, which follows the
OpenAI API reference; every value is a function of the plan, so the same request gets the same bytes."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import orjson

from proxy.core.endpoints import SHAPES, Endpoint
from proxy.emulator.plan import Emulator, Plan

OBJECT_KINDS = {Endpoint.CHAT: "chat.completion", Endpoint.COMPLETIONS: "text_completion"}  # else "list"


def error_body(message: str, status: int, param: str | None = None) -> bytes:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}} (the shape the openai client
    reads); the type is the status phrase, 503 -> ServiceUnavailableError."""
    try:
        kind = "".join(HTTPStatus(status).phrase.split()) + "Error"
    except ValueError:
        kind = "Error"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def models_body(models: Sequence[str], created: int) -> bytes:
    """GET /v1/models, vLLM's ModelList."""
    data = [
        {
            "id": m,
            "object": "model",
            "created": created,
            "owned_by": "islwatch-emulate",
            "root": m,
            "parent": None,
        }
        for m in models
    ]
    return orjson.dumps({"object": "list", "data": data})


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


def responses_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def embedding(dim: int, encoding: Any) -> list[float] | str:
    """Deterministic and unit-length, like a normalized pooler output; base64 is little-endian float32,
    which the openai client asks for by default."""
    values = [1.0 / math.sqrt(dim)] * dim
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{dim}f", *values)).decode("ascii")
    return values


def message_id(plan: Plan) -> str:
    """The output message's id: the response id with `msg_` for its prefix."""
    return "msg_" + plan.rid[len(SHAPES[Endpoint.RESPONSES].id_prefix) :]


def message_item(plan: Plan, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if text else []
    return {
        "type": "message",
        "id": message_id(plan),
        "role": "assistant",
        "status": status,
        "content": content,
    }


def response_object(plan: Plan, text: str | None) -> dict[str, Any]:
    """A Responses API object: in progress (`text` None, no usage) or completed with `text` and usage."""
    done = text is not None
    body = plan.body
    return {
        "id": plan.rid,
        "object": "response",
        "created_at": plan.created,
        "model": plan.model,
        "status": "completed" if done else "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "output": [message_item(plan, text or "", "completed")] if done else [],
        "parallel_tool_calls": True,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": responses_usage(plan.prompt_tokens, plan.completion_tokens) if done else None,
    }


def _chat_choices(text: str) -> list[dict[str, Any]]:
    message = {"role": "assistant", "content": text, "tool_calls": []}
    return [
        {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]


def _completion_choices(plan: Plan, text: str) -> list[dict[str, Any]]:
    return [
        {"index": i, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        for i in range(len(plan.prompts))
    ]


def _embeddings_data(emu: Emulator, plan: Plan) -> list[dict[str, Any]]:
    dim = plan.body.get("dimensions")
    if not (isinstance(dim, int) and not isinstance(dim, bool) and dim > 0):
        dim = emu.config.embedding_dim
    encoding = plan.body.get("encoding_format")
    return [
        {"index": i, "object": "embedding", "embedding": embedding(dim, encoding)}
        for i in range(len(plan.prompts))
    ]


def anthropic_usage(plan: Plan, output: int) -> dict[str, int]:
    """vLLM's `_build_anthropic_usage`: input_tokens without the prefix-cache hits, which are reported
    beside it (vLLM reports them with --enable-prompt-tokens-details: `--prefix-cache` here)."""
    if plan.cached is None:
        return {"input_tokens": plan.prompt_tokens, "output_tokens": output}
    return {
        "input_tokens": plan.prompt_tokens - plan.cached,
        "output_tokens": output,
        "cache_read_input_tokens": plan.cached,
    }


def anthropic_message(plan: Plan, text: str | None) -> dict[str, Any]:
    """An Anthropic Messages response (vLLM's AnthropicMessagesResponse): in progress (`text` None, as
    `message_start` carries it) or complete."""
    done = text is not None
    return {
        "id": plan.rid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if done else [],
        "model": plan.model,
        "stop_reason": "max_tokens" if done else None,
        "stop_sequence": None,
        "usage": anthropic_usage(plan, plan.completion_tokens if done else 0),
    }


def full_body(emu: Emulator, plan: Plan) -> dict[str, Any]:
    """The non-streaming answer: exactly `plan.max_tokens` tokens of text per prompt."""
    if plan.endpoint == Endpoint.COUNT_TOKENS:  # vLLM's AnthropicCountTokensResponse
        n = plan.prompt_tokens
        return {"input_tokens": n, "context_management": {"original_input_tokens": n}}
    text = emu.text(plan.max_tokens)
    if plan.endpoint == Endpoint.MESSAGES:
        return anthropic_message(plan, text)
    if plan.endpoint == Endpoint.RESPONSES:
        return response_object(plan, text)
    kind = OBJECT_KINDS.get(plan.endpoint, "list")
    head = {"id": plan.rid, "object": kind, "created": plan.created, "model": plan.model}
    use = usage(plan.prompt_tokens, plan.completion_tokens)
    if plan.endpoint == Endpoint.CHAT:
        return {**head, "choices": _chat_choices(text), "usage": use}
    if plan.endpoint == Endpoint.COMPLETIONS:
        return {**head, "choices": _completion_choices(plan, text), "usage": use}
    return {**head, "data": _embeddings_data(emu, plan), "usage": use}
