"""vLLM's conversion of an Anthropic Messages request (`/v1/messages`, `/v1/messages/count_tokens`) into the
chat request it then serves (vLLM 0.32 and 0.33, `vllm/entrypoints/anthropic/serving.py`
`AnthropicServingMessages.to_chat_completion_request`, and the request models of `.../anthropic/protocol.py`).

Pure: a JSON body in, a chat body out, or a `ServerRefuses` where vLLM's request model answers 400. Only what
shapes the prompt is carried over (sampling fields are not). Two answers depend on the served model and
are the caller's (core/model.py, computed as vLLM computes them at start-up):
- `merge_inline_system`: the template refuses a system message after the first (`_detect_merge_inline_system`:
  a [system, user, system, user] render raises), or the model renders without a Jinja template (Harmony,
  mistral-common): every system message is merged into the leading one;
- `disabled_effort`: the `reasoning_effort` that `thinking: {type: disabled}` becomes (`none`, unless the
  template rejects it or renders it like an effort: then `low`; `_probe_disabled_thinking_effort`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from ..messages import BILLING_HEADER, REFUSES, ServerRefuses

BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "tool_addition",
        "tool_removal",
    }
)
ROLES = frozenset({"user", "assistant", "system"})
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # protocol.py AnthropicEffort
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """`str | list[AnthropicContentBlock]`: a list's blocks, each checked as the request model checks it."""
    if not isinstance(content, list):
        raise _refuse(f"{where} is neither a string nor a list of blocks")
    for block in content:
        if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
            raise _refuse(f"{where} has a block of an unknown type")
        if block["type"] in ("tool_addition", "tool_removal") and not isinstance(block.get("tool"), dict):
            raise _refuse(f"{block['type']} without a tool")
        for key in ("text", "thinking", "id", "tool_use_id", "name"):
            if block.get(key) is not None and not isinstance(block[key], str):
                raise _refuse(f"a block's {key} is not a string")
        if block.get("input") is not None and not isinstance(block["input"], dict):
            raise _refuse("a tool_use input is not an object")
    return content


def validate(body: Any, count_tokens: bool) -> dict[str, Any]:
    """What `AnthropicMessagesRequest` / `AnthropicCountTokensRequest` refuse (pydantic, a 400)."""
    if not isinstance(body, dict):
        raise _refuse("the body is not an object")
    if not isinstance(body.get("model"), str) or (count_tokens and not body["model"]):
        raise _refuse("model is missing")
    if not count_tokens and (
        not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool)
    ):
        raise _refuse("max_tokens is missing or not an integer")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _refuse("messages is not a list")
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise _refuse("a message's role is not user, assistant or system")
        if not isinstance(msg.get("content"), str):
            blocks = _blocks(msg.get("content"), "a message's content")
            if msg["role"] != "system" and any(
                b["type"] in ("tool_addition", "tool_removal") for b in blocks
            ):
                raise _refuse("tool_addition and tool_removal blocks are only allowed in system messages")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _blocks(system, "system")
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise _refuse("a tool has no name")
        if not isinstance(tool.get("input_schema"), dict):
            raise _refuse("a tool's input_schema is not an object")
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise _refuse("tool_choice.type is not auto, any, tool or none")
        if choice["type"] == "tool" and not choice.get("name"):
            raise _refuse("tool_choice.name is required when type is 'tool'")
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise _refuse("thinking.type is not enabled, disabled or adaptive")
        budget = thinking.get("budget_tokens")
        if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024):
            raise _refuse("thinking.budget_tokens must be at least 1024")
    effort = (
        (body.get("output_config") or {}).get("effort")
        if isinstance(body.get("output_config"), dict)
        else None
    )
    if effort is not None and effort not in EFFORTS:
        raise _refuse("output_config.effort is not an effort")
    return body


def _system_text(content: Any) -> str | None:
    """`_extract_system_text`: a system message's text without billing-header blocks; None when empty."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [
        b["text"]
        for b in content
        if b["type"] == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _image_url(source: dict[str, Any]) -> str:
    """`_convert_image_source_to_url`: a URL source as is, anything else as a base64 data URL."""
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """`_convert_user_tool_result`: a `tool` message (text items joined with a newline), its images in a
    user message after it, its tool references in a second tool message."""
    text, images, refs = "", [], []
    content = block.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "text":
                texts.append(item.get("text", ""))
            elif item.get("type") == "image":
                images.append(_image_url(item.get("source", {})))
            elif item.get("type") == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                refs.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out.append({"role": "tool", "tool_call_id": call_id, "content": text or ""})
    if images:
        out.append(
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]}
        )
    if refs:
        out.append({"role": "tool", "tool_call_id": call_id, "content": refs})


def _message(msg: dict[str, Any], out: list[dict[str, Any]]) -> None:
    """`_convert_messages` for one user or assistant message. A user tool_result's tool message lands in
    `out` before the message itself (vLLM appends the message after converting its blocks)."""
    chat: dict[str, Any] = {"role": msg["role"]}
    if isinstance(msg["content"], str):
        chat["content"] = msg["content"]
    else:
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        reasoning: list[str] = []
        for b in msg["content"]:
            kind = b["type"]
            if kind == "text" and b.get("text"):
                parts.append({"type": "text", "text": b["text"]})
            elif kind == "image" and b.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(b["source"])}})
            elif kind == "thinking" and b.get("thinking") is not None:
                reasoning.append(b["thinking"])
            elif kind == "tool_use":
                arguments = json.dumps(b.get("input") or {})
                call_id = b.get("id") or f"call_{int(time.time())}"
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": b.get("name") or "", "arguments": arguments},
                    }
                )
            elif kind == "tool_result" and msg["role"] == "user":
                _user_tool_result(b, out)
            elif kind == "tool_result":
                parts.append({"type": "text", "text": f"Tool result: {_py_str(b.get('content'))}"})
            # redacted_thinking (opaque), tool_reference, tool_addition, tool_removal: nothing in the message
        if reasoning:
            chat["reasoning"] = "".join(reasoning)
        if calls:
            chat["tool_calls"] = calls
        if len(parts) == 1 and parts[0]["type"] == "text":
            chat["content"] = parts[0]["text"]
        elif parts:
            chat["content"] = parts
    if not (msg["role"] == "user" and "content" not in chat):
        out.append(chat)


def _py_str(content: Any) -> str:
    """`str(block.content) if block.content else ""`: Python's str of the value (a list prints its repr)."""
    return str(content) if content else ""


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """`_resolve_tools`, then `_convert_tools`: the tools in effect at the end of the conversation (tool
    addition/removal blocks applied), as chat function tools."""
    changes = [
        b
        for msg in body["messages"]
        if not isinstance(msg["content"], str)
        for b in msg["content"]
        if b["type"] in ("tool_addition", "tool_removal")
    ]
    declared = body.get("tools")
    if declared is None and not changes:
        return None
    tools = {t["name"]: dict(t) for t in declared or []}
    removed: set[str] = set()
    for b in changes:
        change = b["tool"]
        if change.get("type") == "tool_definition" and isinstance(change.get("definition"), dict):
            name = change["definition"].get("name")
            tools[name] = dict(change["definition"])
        else:
            name = change.get("name")
            if name not in tools:
                raise _refuse(f"{b['type']} references a tool that is not declared in tools")
            if b["type"] == "tool_addition":
                tools[name] = {**tools[name], "defer_loading": None}
        if b["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    out = []
    for name, t in tools.items():
        if name in removed:
            continue
        schema = t["input_schema"] if "type" in t["input_schema"] else {**t["input_schema"], "type": "object"}
        function = {
            "name": name,
            "description": t.get("description"),
            "parameters": schema,
            "strict": t.get("strict"),
            "defer_loading": t.get("defer_loading"),
        }
        out.append({"type": "function", "function": function})
    return out


def messages_as_chat(
    body: Any, count_tokens: bool, merge_inline_system: bool, disabled_effort: str = "none"
) -> dict[str, Any]:
    """The chat request vLLM serves for a Messages request (`to_chat_completion_request`)."""
    validate(body, count_tokens)
    out: list[dict[str, Any]] = []
    system: list[str] = []
    top = body.get("system")
    if isinstance(top, str) and top:
        system.append(top)
    elif isinstance(top, list):
        system += [
            b["text"]
            for b in top
            if b["type"] == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER)
        ]
    if merge_inline_system:
        system += [t for m in body["messages"] if m["role"] == "system" and (t := _system_text(m["content"]))]
    if system:
        out.append({"role": "system", "content": "".join(system)})
    for msg in body["messages"]:
        if msg["role"] == "system":
            if not merge_inline_system and (text := _system_text(msg["content"])):
                out.append({"role": "system", "content": text})
            continue
        _message(msg, out)
    chat: dict[str, Any] = {"model": body["model"], "messages": out}
    if body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        chat["reasoning_effort"] = config["effort"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        chat["reasoning_effort"] = disabled_effort
    choice = body.get("tool_choice")
    if choice is not None:
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use")
        kind = choice["type"]
        named = {"type": "function", "function": {"name": choice.get("name")}}
        chat["tool_choice"] = named if kind == "tool" else TOOL_CHOICES[kind]
    tools = _tools(body)
    if tools is not None:
        chat.setdefault("tool_choice", "auto")
        chat["tools"] = tools
    return chat


def template_refuses_inline_system(template: str | None) -> bool:
    """`_detect_merge_inline_system`: a [system, user, system, user] conversation rendered by the bare
    template in jinja2's sandbox (no tokenizer globals: a `raise_exception` call fails too); a template that
    raises, or no template at all, makes vLLM merge every system message into the leading one."""
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    conversation = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        env.from_string(template).render(messages=conversation, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def disabled_thinking_effort(rendered: Any) -> str:
    """`_probe_disabled_thinking_effort`: `rendered(effort)` is the prompt of a one-message chat with that
    `reasoning_effort`, None when the server refuses it. `none`, unless refused or rendered like an effort."""
    none_prompt = rendered("none")
    if none_prompt is None or any(rendered(e) == none_prompt for e in EFFORTS):
        return "low"
    return "none"
