"""The server-sent event streams, one token per chunk, as vLLM writes them (`serving_chat.py`,
`serving_completion.py`, `serving_responses.py`). Iterators of ready-to-write bytes, so the handler can cut
a stream after any chunk; what the chunks carry joins to the non-streaming answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from proxy.core.endpoints import Endpoint
from proxy.emulator.answers import (
    anthropic_message,
    anthropic_usage,
    message_id,
    message_item,
    response_object,
    usage,
)
from proxy.emulator.plan import Emulator, Plan

DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chat_chunk(base: dict[str, Any], delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    return {**base, "choices": [choice]}


def _chat_steps(emu: Emulator, plan: Plan) -> Iterator[tuple[dict[str, Any], int, str | None]]:
    """(delta, completion tokens so far, finish reason) of each chunk: role, one per token, finish."""
    yield {"role": "assistant", "content": ""}, 0, None
    for i, piece in enumerate(emu.pieces(plan.max_tokens)):
        yield {"content": piece}, i + 1, None
    yield {}, plan.max_tokens, "length"


def chat_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    """The chunks of `_chat_steps`; usage last when asked for, then [DONE]."""
    base = {"id": plan.rid, "object": "chat.completion.chunk", "created": plan.created, "model": plan.model}
    continuous = plan.include_usage and plan.continuous_usage  # vLLM's continuous_usage_stats
    p = plan.prompt_tokens
    for delta, done, finish in _chat_steps(emu, plan):
        obj = _chat_chunk(base, delta, finish)
        if continuous:
            obj["usage"] = usage(p, done)
        yield sse(obj)
    if plan.include_usage:  # OpenAI's shape: a last chunk with empty choices carrying the usage
        yield sse({**base, "choices": [], "usage": usage(p, plan.completion_tokens)})
    yield DONE


def completion_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    """Per prompt: one chunk per token and an empty finish chunk; usage last when asked for, then [DONE]."""
    base = {"id": plan.rid, "object": "text_completion", "created": plan.created, "model": plan.model}
    continuous = plan.include_usage and plan.continuous_usage
    p, done = plan.prompt_tokens, 0
    for index in range(len(plan.prompts)):
        for text, finish in [*((piece, None) for piece in emu.pieces(plan.max_tokens)), ("", "length")]:
            done += finish is None
            choice = {
                "index": index,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            obj: dict[str, Any] = {**base, "choices": [choice]}
            if continuous:
                obj["usage"] = usage(p, done)
            yield sse(obj)
    if plan.include_usage:
        yield sse({**base, "choices": [], "usage": usage(p, plan.completion_tokens)})
    yield DONE


def _responses_steps(emu: Emulator, plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, fields) of each Responses API event, in vLLM's order."""
    text = emu.text(plan.max_tokens)
    where = {"item_id": message_id(plan), "output_index": 0, "content_index": 0}
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield "response.created", {"response": response_object(plan, None)}
    yield "response.in_progress", {"response": response_object(plan, None)}
    yield "response.output_item.added", {"output_index": 0, "item": message_item(plan, "", "in_progress")}
    yield "response.content_part.added", {**where, "part": part}
    for piece in emu.pieces(plan.max_tokens):
        yield "response.output_text.delta", {**where, "delta": piece, "logprobs": []}
    yield "response.output_text.done", {**where, "text": text, "logprobs": []}
    yield "response.content_part.done", {**where, "part": {**part, "text": text}}
    yield "response.output_item.done", {"output_index": 0, "item": message_item(plan, text, "completed")}
    yield "response.completed", {"response": response_object(plan, text)}


def responses_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    """Named events with a running sequence_number; `response.completed` carries usage.input_tokens.
    No [DONE]."""
    for seq, (kind, fields) in enumerate(_responses_steps(emu, plan)):
        data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
        yield b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _messages_steps(emu: Emulator, plan: Plan) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, fields) of each Messages API event, in vLLM's order (anthropic/serving.py
    `message_stream_converter`): usage in message_start, and again, with the output count, in message_delta."""
    yield "message_start", {"message": anthropic_message(plan, None)}
    yield "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
    for piece in emu.pieces(plan.max_tokens):
        yield "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": piece}}
    yield "content_block_stop", {"index": 0}
    delta = {"stop_reason": "max_tokens", "stop_sequence": None}
    yield "message_delta", {"delta": delta, "usage": anthropic_usage(plan, plan.completion_tokens)}
    yield "message_stop", {}


def messages_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    """Named events, no [DONE]."""
    for kind, fields in _messages_steps(emu, plan):
        yield b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def stream_events(emu: Emulator, plan: Plan) -> Iterator[bytes]:
    if plan.endpoint == Endpoint.MESSAGES:
        return messages_events(emu, plan)
    if plan.endpoint == Endpoint.CHAT:
        return chat_events(emu, plan)
    if plan.endpoint == Endpoint.COMPLETIONS:
        return completion_events(emu, plan)
    return responses_events(emu, plan)
