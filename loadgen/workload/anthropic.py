"""`--endpoint messages`: the workloads' conversations as Anthropic Messages bodies. Pure (no I/O).

Every workload builds its messages in the OpenAI chat form (a system message, `tool_calls`, `tool`
messages); for `/v1/messages` (https://docs.anthropic.com/en/api/messages) `as_messages` rewrites them: the
leading system message becomes the top-level `system`, an assistant's reasoning a `thinking` block, its text a
`text` block and its calls `tool_use` blocks (`input`: the arguments object), and each run of tool messages one
user message of `tool_result` blocks. A message already in the Anthropic form passes unchanged, so a history
kept as sent (`history_of`) rewrites to itself and each request extends the one before byte for byte.

The budget counts the body it sends as the server does: the server's conversion into a chat request
(core/flavors/*_messages.py, `ServedModel.count("messages", ...)`), then that chat's count.
"""

from __future__ import annotations

from typing import Any

import orjson

# A thinking block's signature. Anthropic's API checks it; the open servers read only the thinking text.
SIGNATURE = "islwatch-loadgen"


def as_messages(messages: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(system or None, Anthropic messages) of a conversation in the chat form (or the Anthropic form)."""
    system: Any = None
    out: list[dict[str, Any]] = []
    after_tool = False  # the last message was a tool result: the next one joins its user message
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if role == "system":
            if i:
                raise ValueError(
                    "a system message after the first: the Messages API has one top-level system"
                )
            system = msg.get("content")
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": msg.get("tool_call_id") or "",
                     "content": msg.get("content") or ""}  # fmt: skip
            if after_tool:
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "assistant" and any(k in msg for k in ("tool_calls", "reasoning_content", "reasoning")):
            out.append(_assistant(msg))
        else:
            out.append(msg)
        after_tool = role == "tool"
    return system, out


def _assistant(msg: dict[str, Any]) -> dict[str, Any]:
    """An assistant turn in the chat form as blocks: thinking, then text, then tool_use (Anthropic's order)."""
    blocks: list[dict[str, Any]] = []
    reasoning = msg.get("reasoning")
    reasoning = msg.get("reasoning_content") if reasoning is None else reasoning
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": SIGNATURE})
    content = msg.get("content")
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks += content  # text parts are text blocks
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        value = orjson.loads(args) if isinstance(args, str) and args else args
        blocks.append({"type": "tool_use", "id": call.get("id") or "", "name": fn.get("name") or "",
                       "input": value if isinstance(value, dict) else {}})  # fmt: skip
    return {"role": "assistant", "content": blocks}


def history_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages body's conversation as the workloads keep it: the system as its leading message."""
    system = body.get("system")
    return [*([{"role": "system", "content": system}] if system is not None else []), *body["messages"]]


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools as Anthropic tools (`name`, `description`, `input_schema`); Anthropic ones as is."""
    out = []
    for tool in tools:
        if "input_schema" in tool:
            out.append(tool)
            continue
        fn = tool.get("function") or {}
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        converted = {"name": fn.get("name") or "", "input_schema": schema}
        if fn.get("description"):
            converted = {"name": converted["name"], "description": fn["description"], "input_schema": schema}
        out.append(converted)
    return out


def reply_text(obj: dict[str, Any]) -> str:
    """A Messages response's text: its `text` blocks, in order (thinking and tool_use blocks left out)."""
    return "".join(
        str(b.get("text") or "")
        for b in obj.get("content") or []
        if isinstance(b, dict) and b.get("type") == "text"
    )


def text_delta(obj: dict[str, Any]) -> str:
    """The text of one stream event: a `content_block_delta` whose delta is a `text_delta`; else ''."""
    if obj.get("type") != "content_block_delta":
        return ""
    delta = obj.get("delta")
    if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
        return str(delta["text"])
    return ""
