"""What a model server tokenizes, extracted from an OpenAI-compatible wire body. Pure: no tokenizer, no I/O.

Message preparation mirrors vLLM's `vllm/entrypoints/chat_utils.py` (`_parse_chat_message_content`,
`_postprocess_messages`): for a template that reads `message['content']` as a string, text parts are joined
with "\\n" and media parts are dropped; a null content becomes ""; `name`, `tool_calls` and `tool_call_id`
are kept; tool-call `arguments` JSON strings are parsed into dicts. For a template that iterates over content
parts ("openai" content format), parts are passed through as a list of `{"type": "text", ...}` dicts and
media become `{"type": "image"}` style placeholders.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MEDIA_KINDS = {
    "image_url": "image",
    "image": "image",
    "input_image": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio": "audio",
    "video_url": "video",
    "video": "video",
    "file": "file",
    "input_file": "file",
}
TEXT_KINDS = {"text", "input_text", "output_text", "refusal"}


class InvalidBody(ValueError):
    """The body is not a request of the endpoint (a reason, never raised out of the counting core)."""


@dataclass(frozen=True)
class ChatInput:
    messages: list[dict[str, Any]]  # as the template will see them
    texts: list[str]  # every text the client sent, for the bare count
    media: dict[str, int] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False  # vLLM's chat extension; True re-adds BOS on the rendered text
    template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PromptInput:
    """Completions / embeddings: each prompt is text or token ids."""

    prompts: list[str | list[int]]
    add_special_tokens: bool = True


def _part_kind(part: Any) -> str:
    if isinstance(part, str):
        return "text"
    if not isinstance(part, dict):
        raise InvalidBody("content part is not an object")
    kind = part.get("type")
    if kind in TEXT_KINDS:
        return "text"
    if kind in MEDIA_KINDS:
        return MEDIA_KINDS[kind]
    raise InvalidBody(f"unknown content part type {kind!r}")


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    text = part.get("text", part.get("refusal"))
    if not isinstance(text, str):
        raise InvalidBody("text part without a string text")
    return text


def _prepare_message(msg: Any, parts_format: bool, texts: list[str], media: dict[str, int]) -> dict[str, Any]:
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise InvalidBody("message without a string role")
    role = msg["role"]
    content = msg.get("content")
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise InvalidBody("content is neither a string, a list of parts nor null")

    out_parts: list[dict[str, Any]] = []
    part_texts: list[str] = []
    for part in parts:
        kind = _part_kind(part)
        if kind == "text":
            text = _part_text(part)
            part_texts.append(text)
            out_parts.append({"type": "text", "text": text})
        else:
            media[kind] = media.get(kind, 0) + 1
            out_parts.append({"type": kind})
    texts.extend(part_texts)

    out: dict[str, Any] = {"role": role, "content": out_parts if parts_format else "\n".join(part_texts)}
    if role == "assistant" and msg.get("tool_calls") is not None:
        out["tool_calls"] = _prepare_tool_calls(msg["tool_calls"])
    if role == "tool" and "tool_call_id" in msg:
        out["tool_call_id"] = msg["tool_call_id"]
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    return out


def _prepare_tool_calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidBody("tool_calls is not a list")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise InvalidBody("tool call without a function object")
        fn = dict(call["function"])
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            try:
                fn["arguments"] = json.loads(args)
            except ValueError as exc:
                raise InvalidBody("tool call arguments are not JSON") from exc
        elif not args:
            fn["arguments"] = {}
        out.append({**call, "function": fn})
    return out


def chat_input(body: Any, parts_format: bool = False) -> ChatInput:
    """`/v1/chat/completions` body -> what the chat template renders."""
    if not isinstance(body, dict):
        raise InvalidBody("body is not a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidBody("messages is not a non-empty list")
    return _chat_from_messages(body, messages, parts_format)


def _chat_from_messages(body: dict[str, Any], messages: list[Any], parts_format: bool) -> ChatInput:
    texts: list[str] = []
    media: dict[str, int] = {}
    prepared = [_prepare_message(m, parts_format, texts, media) for m in messages]
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidBody("tools is not a list of objects")
    documents = body.get("documents")
    if documents is not None and not isinstance(documents, list):
        raise InvalidBody("documents is not a list")
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidBody("chat_template_kwargs is not an object")
    continue_final = bool(body.get("continue_final_message", False))
    add_gen = body.get("add_generation_prompt", True)
    return ChatInput(
        messages=prepared,
        texts=texts,
        media=media,
        tools=tools or None,
        documents=documents or None,
        add_generation_prompt=bool(add_gen),
        continue_final_message=continue_final,
        add_special_tokens=bool(body.get("add_special_tokens", False)),
        template_kwargs=kwargs,
    )


def _responses_items(items: list[Any]) -> list[dict[str, Any]]:
    """Responses API input items -> chat messages. Function calls and their outputs map to tool messages."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if not isinstance(item, dict):
            raise InvalidBody("responses input item is not an object")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item.get("role"), "content": item.get("content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        else:
            raise InvalidBody(f"unsupported responses input item {kind!r}")
    return messages


def responses_input(body: Any, parts_format: bool = False) -> ChatInput:
    """`/v1/responses`: `instructions` become a system message before `input` (a string or items)."""
    if not isinstance(body, dict):
        raise InvalidBody("body is not a JSON object")
    raw = body.get("input")
    if isinstance(raw, str):
        messages: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        messages = _responses_items(raw)
    else:
        raise InvalidBody("input is neither a string nor a non-empty list")
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.insert(0, {"role": "system", "content": instructions})
    tools = body.get("tools")
    # Responses tools are flat ({"type": "function", "name": ...}); chat templates expect the chat shape.
    if isinstance(tools, list):
        body = {**body, "tools": [_flat_tool_to_chat(t) for t in tools if isinstance(t, dict)] or None}
    return _chat_from_messages(body, messages, parts_format)


def _flat_tool_to_chat(tool: dict[str, Any]) -> dict[str, Any]:
    if "function" in tool:
        return tool
    fn = {k: v for k, v in tool.items() if k != "type"}
    return {"type": tool.get("type", "function"), "function": fn}


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def prompt_input(body: Any, field_name: str) -> PromptInput:
    """`prompt` (completions) or `input` (embeddings): a string, strings, token ids, or lists of ids."""
    if not isinstance(body, dict):
        raise InvalidBody("body is not a JSON object")
    raw = body.get(field_name)
    if isinstance(raw, str):
        prompts: list[str | list[int]] = [raw]
    elif _is_ids(raw) and raw:
        prompts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(p, str) or (_is_ids(p) and p) for p in raw):
        prompts = list(raw)
    else:
        raise InvalidBody(f"{field_name} is not a string, a list of strings, token ids or lists of ids")
    return PromptInput(prompts=prompts, add_special_tokens=bool(body.get("add_special_tokens", True)))
