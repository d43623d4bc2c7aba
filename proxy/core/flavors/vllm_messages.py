"""vLLM's conversion of an Anthropic Messages request (`/v1/messages`, `/v1/messages/count_tokens`) into the
chat request it then serves (vLLM 0.32 and 0.33, `vllm/entrypoints/anthropic/serving.py`
`AnthropicServingMessages.to_chat_completion_request`, and the request models of `.../anthropic/protocol.py`).

Pure: a JSON body in, a chat body out, or a `ServerRefuses` where vLLM answers 400 (its request models, read
as pydantic reads them in lax mode, and the conversion's own errors), an `InvalidBody` where it answers 500.
Only what shapes the prompt is carried over (sampling fields are checked, not carried). Checked against
vLLM's own code on both releases (tests/vllm_oracle/test_vllm_messages.py). Two answers depend on the served
model and are the caller's (core/model.py, computed as vLLM computes them at start-up):
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

from ..messages import BILLING_HEADER, REFUSES, InvalidBody, ServerRefuses, lax_float, lax_int

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
TOOL_CHANGES = ("tool_addition", "tool_removal")
ROLES = frozenset({"user", "assistant", "system"})
EFFORTS = ("low", "medium", "high", "xhigh", "max")  # protocol.py AnthropicEffort
DISPLAYS = ("summarized", "omitted", "updates")  # AnthropicThinkingDisplay
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
MAX_STOP_STRINGS = 4  # envs.VLLM_MAX_STOP_STRINGS's default: the server's environment may raise it
BLOCK_STRINGS = ("text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data")
_LAX_WORDS = {"true": True, "1": True, "yes": True, "y": True, "on": True, "t": True}
_LAX_WORDS |= {"false": False, "0": False, "no": False, "n": False, "off": False, "f": False}


def _refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


# Pydantic's fields in lax mode, as the request models read a JSON body (FastAPI validates the parsed body).
# `None` passes where the field is optional (`X | None`), and is refused where it is not.
def _str(value: Any, name: str, optional: bool = True) -> None:
    if not (isinstance(value, str) or (value is None and optional)):
        raise _refuse(f"{name} is not a string")


def _dict(value: Any, name: str, optional: bool = True) -> None:
    if not (isinstance(value, dict) or (value is None and optional)):
        raise _refuse(f"{name} is not an object")


def _lax_bool(value: Any, name: str) -> bool:
    """`bool`: a bool, 0 or 1 (an int or a float), the usual words in any case (never padded)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _LAX_WORDS:
        return _LAX_WORDS[value.lower()]
    raise _refuse(f"{name} is not a boolean")


def _optional_bool(value: Any, name: str) -> bool | None:
    return None if value is None else _lax_bool(value, name)


def _tool(tool: Any, where: str) -> None:
    """`AnthropicTool`."""
    _dict(tool, where, optional=False)
    _str(tool.get("name"), f"{where}'s name", optional=False)
    _str(tool.get("description"), f"{where}'s description")
    _dict(tool.get("input_schema"), f"{where}'s input_schema", optional=False)
    for key in ("strict", "defer_loading"):
        _optional_bool(tool.get(key), f"{where}'s {key}")


def _tool_change(change: Any, kind: str) -> None:
    """`AnthropicToolChange` (discriminated by `type`), and AnthropicContentBlock.validate_tool_change."""
    _dict(change, f"a {kind} block's tool", optional=False)
    if change.get("type") == "tool_reference":
        _str(change.get("name"), f"a {kind} block's tool name", optional=False)
    elif change.get("type") == "tool_definition":
        _tool(change.get("definition"), f"a {kind} block's tool definition")
    else:
        raise _refuse(f"a {kind} block's tool is neither a tool_reference nor a tool_definition")
    if kind == "tool_removal" and change["type"] != "tool_reference":
        raise _refuse("tool_removal only accepts a tool_reference")


def _blocks(content: Any, where: str, tool_changes: bool) -> list[dict[str, Any]]:
    """`str | list[AnthropicContentBlock]`: a list's blocks, each checked as its model checks it;
    tool_addition / tool_removal blocks only where `tool_changes` (a system message:
    `_reject_tool_changes`)."""
    if not isinstance(content, list):
        raise _refuse(f"{where} is neither a string nor a list of blocks")
    for block in content:
        if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
            raise _refuse(f"{where} has a block of an unknown type")
        for key in BLOCK_STRINGS:
            _str(block.get(key), f"a block's {key}")
        for key in ("source", "input"):
            _dict(block.get(key), f"a block's {key}")
        inner = block.get("content")
        listed = isinstance(inner, list) and all(isinstance(item, dict) for item in inner)
        if not (inner is None or isinstance(inner, str) or listed):
            raise _refuse("a block's content is neither a string nor a list of objects")
        _optional_bool(block.get("is_error"), "a block's is_error")
        kind = block["type"]
        if block.get("tool") is not None or kind in TOOL_CHANGES:
            _tool_change(block.get("tool"), kind)
        if kind in TOOL_CHANGES and not tool_changes:
            raise _refuse(f"{kind} blocks are only allowed in system messages")
    return content


def _thinking(thinking: Any) -> int | None:
    """`AnthropicThinkingConfig` (discriminated by `type`); the budget of an enabled one."""
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise _refuse("thinking.type is not enabled, disabled or adaptive")
    if kind != "disabled" and thinking.get("display") is not None and thinking["display"] not in DISPLAYS:
        raise _refuse("thinking.display is not summarized, omitted or updates")
    if kind != "enabled":
        return None
    budget = lax_int(thinking.get("budget_tokens"), "thinking.budget_tokens")
    if budget < 1024:
        raise _refuse("thinking.budget_tokens must be at least 1024")
    return budget


def _output_config(config: Any) -> None:
    """`AnthropicOutputConfig`: `effort`, and a `format` whose `schema` (its alias) is an object."""
    _dict(config, "output_config")
    if config is None:
        return
    if config.get("effort") is not None and config["effort"] not in EFFORTS:
        raise _refuse("output_config.effort is not an effort")
    fmt = config.get("format")
    _dict(fmt, "output_config.format")
    if fmt is not None:
        if fmt.get("type", "json_schema") != "json_schema":
            raise _refuse("output_config.format.type is not json_schema")
        _dict(fmt.get("schema"), "output_config.format.schema")


def _xarg(value: Any) -> bool:
    scalar = (str, int, float)
    return isinstance(value, scalar) or (
        isinstance(value, list) and all(isinstance(v, scalar) for v in value)
    )


def _sampling(body: dict[str, Any]) -> None:
    """The fields AnthropicMessagesRequest has and AnthropicCountTokensRequest has not (where count_tokens
    ignores them as unknown): their types, `max_tokens` positive and above an enabled thinking budget."""
    _dict(body.get("metadata"), "metadata")
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _refuse("stop_sequences is not a list of strings")
        if len(stops) > MAX_STOP_STRINGS:
            raise _refuse("stop_sequences has too many strings")
    for name in ("stream", "watermarking", "return_mm_kwargs"):
        _optional_bool(body.get(name), name)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            lax_float(body[name], name)
    if body.get("top_k") is not None:
        lax_int(body["top_k"], "top_k")
    payload = body.get("mm_payload", "tensors")
    if payload not in ("tensors", "none"):
        raise _refuse("mm_payload is not tensors or none")
    salt = body.get("cache_salt")
    _str(salt, "cache_salt")
    if salt is not None and not 1 <= len(salt) <= 1024:
        raise _refuse("cache_salt is not 1 to 1024 characters long")
    for name in ("kv_transfer_params", "ec_transfer_params"):
        _dict(body.get(name), name)
    xargs = body.get("vllm_xargs")
    _dict(xargs, "vllm_xargs")
    if xargs is not None and not all(_xarg(v) for v in xargs.values()):
        raise _refuse("a vllm_xargs value is not a string, a number or a list of them")


def validate(body: Any, count_tokens: bool) -> dict[str, Any]:
    """What `AnthropicMessagesRequest` / `AnthropicCountTokensRequest` refuse (pydantic, a 400): each field
    the model declares, typed as pydantic reads it in lax mode; unknown fields are ignored."""
    if not isinstance(body, dict):
        raise _refuse("the body is not an object")
    _str(body.get("model"), "model", optional=False)
    if not body["model"]:
        raise _refuse("model is empty")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _refuse("messages is not a list")
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise _refuse("a message's role is not user, assistant or system")
        if not isinstance(msg.get("content"), str):
            _blocks(msg.get("content"), "a message's content", tool_changes=msg["role"] == "system")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _blocks(system, "system", tool_changes=False)
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _refuse("tools is not a list")
    for tool in tools or []:
        _tool(tool, "a tool")
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise _refuse("tool_choice.type is not auto, any, tool or none")
        _str(choice.get("name"), "tool_choice.name")
        _optional_bool(choice.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use")
        if choice["type"] == "tool" and not choice.get("name"):
            raise _refuse("tool_choice.name is required when type is 'tool'")
    budget = _thinking(body["thinking"]) if body.get("thinking") is not None else None
    _output_config(body.get("output_config"))
    _dict(body.get("chat_template_kwargs"), "chat_template_kwargs")
    if not count_tokens:
        if "max_tokens" not in body or body["max_tokens"] is None:
            raise _refuse("max_tokens is missing")
        max_tokens = lax_int(body["max_tokens"], "max_tokens")
        if max_tokens <= 0:
            raise _refuse("max_tokens must be positive")
        _sampling(body)
        remote = body.get("kv_transfer_params") or {}
        if budget is not None and budget >= max_tokens and not remote.get("do_remote_decode"):
            raise _refuse("thinking.budget_tokens must be less than max_tokens")
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
                if not isinstance(item.get("text", ""), str):  # "\n".join's TypeError: a 400
                    raise _refuse("a tool_result's text item is not a string")
                texts.append(item.get("text", ""))
            elif item.get("type") == "image":
                source = item.get("source", {})
                if not isinstance(source, dict):  # `source.get`'s AttributeError: a 500
                    raise InvalidBody("vllm answers 500: a tool_result's image source is not an object")
                if url := _image_url(source):
                    images.append(url)
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
    if not changes:  # the declared list as it is (a name declared twice stays twice)
        return None if declared is None else [_function(t) for t in declared]
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
    return [_function(t) for name, t in tools.items() if name not in removed]


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    """`_convert_tools` for one AnthropicTool, as its model read it: an `input_schema` without a `type` is an
    object's (`validate_input_schema`), `strict` and `defer_loading` are pydantic's bools."""
    schema = tool["input_schema"]
    function = {
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": schema if "type" in schema else {**schema, "type": "object"},
        "strict": _optional_bool(tool.get("strict"), "a tool's strict"),
        "defer_loading": _optional_bool(tool.get("defer_loading"), "a tool's defer_loading"),
    }
    return {"type": "function", "function": function}


def messages_as_chat(
    body: Any,
    count_tokens: bool,
    merge_inline_system: bool,
    disabled_effort: str = "none",
    jinja: bool = True,
) -> dict[str, Any]:
    """The chat request vLLM serves for a Messages request (`to_chat_completion_request`). `jinja`: the model
    renders a Jinja template (not Harmony or mistral-common)."""
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
    _tool_choice(body, chat, _tools(body), jinja)
    return chat


def _tool_choice(
    body: dict[str, Any], chat: dict[str, Any], tools: list[dict[str, Any]] | None, jinja: bool = True
) -> None:
    """`_convert_tool_choice`, then `_convert_tools`. vLLM sets both on the chat request after building it,
    so the chat request model's `check_tool_usage` never sees them: a tool_choice without tools is served
    (islwatch's Harmony and mistral-common paths would refuse it as a client's chat request): left out, as
    nothing of it reaches the prompt. An empty tool list reaches a Jinja template as `tools=[]` (Llama 3.1's,
    testing `tools is not none`, writes its tool preamble), Harmony and mistral-common render it as no tools
    (measured, tests/vllm_oracle): for a Jinja template it goes in as the template's `tools` keyword (the chat
    request model refuses `tools: []` from a client)."""
    choice = body.get("tool_choice")
    if tools == [] and jinja:
        kwargs = chat.get("chat_template_kwargs") or {}
        if "tools" not in kwargs:  # the request's own chat_template_kwargs win, as on vLLM
            chat["chat_template_kwargs"] = {**kwargs, "tools": []}
        return
    if not tools:
        return
    chat["tools"] = tools
    chat["tool_choice"] = "auto"
    if choice is None:
        return
    chat["parallel_tool_calls"] = not _optional_bool(
        choice.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use"
    )
    if choice["type"] != "tool":
        chat["tool_choice"] = TOOL_CHOICES[choice["type"]]
        return
    # The tool parser's adjust_request builds the forced call's schema (tool_parsers/utils.py
    # get_json_schema_from_tools, or xgrammar's structural tag) and refuses a name no tool has; without a
    # tool parser, vLLM refuses a named tool_choice anyway (online_renderer.py render_chat).
    if choice["name"] not in {t["function"]["name"] for t in tools}:
        raise _refuse("tool_choice names a tool that is not in tools")
    chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}


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
