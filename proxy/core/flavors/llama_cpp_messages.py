"""llama-server's conversion of an Anthropic Messages request (`/v1/messages`, `/v1/messages/count_tokens`) into
the chat request it then serves (llama.cpp 0.5.0-dev, commit 0c1e570, the llama-cpp-python 0.3.36 sdist:
tools/server/server-chat.cpp `server_chat_convert_anthropic_to_oai`).

Both routes convert the body, then prepare it exactly as a `/v1/chat/completions` body
(server-context.cpp `post_anthropic_messages` and `handle_count_tokens`: `oaicompat_chat_params_parse`, whose
prompt is tokenized with special tokens added and parsed), which islwatch models in llama_cpp.py
(`llama_cpp_chat_body`). Pure: a JSON body in, a chat body out. Only what shapes the prompt is carried over.

Where it departs from vLLM's conversion (vllm_messages.py):
- no request model: the conversion itself fails only on a body that is not an object or has no `messages`
  (a `std::runtime_error`, llama-server's 500); the chat preparation's own 400s are refused there, but for
  a message that is not an object or a content that is neither a string, a list nor null, refused here;
- the `system` parameter is always a system message (an empty one too), its text blocks joined with "";
  Claude Code's billing header is kept, its `cch=` stamp rewritten to `fffff`
  (`normalize_anthropic_billing_header`); system messages inside `messages` pass unnormalized;
- a message whose content is a string (or null) passes as it is, role and any other key included; an
  assistant message without content is dropped;
- text blocks stay parts (joined with "\\n" by the chat preparation); tool results follow their message
  as tool messages, the text items of a list joined with "", any other content "";
- a message left with no text, image, tool call or thinking is dropped (an empty assistant turn, a user
  turn of tool results only: its tool messages alone); redacted_thinking and unknown blocks are dropped;
- an image (a base64 or URL source) is an `image_url` part, which a server without a multimodal projector
  answers with a 500 (server-common.cpp `oaicompat_content_load_media`): not counted here;
- tool_use input is dumped compactly (`{"a":1}`), tools keep their input_schema as it is (no "type" added);
- tool_choice any and tool become "required" (a grammar, not the prompt), none is dropped (the tools stay
  in the prompt); thinking and output_config change nothing in the prompt (`thinking_budget_tokens` only
  bounds the sampler).
"""

from __future__ import annotations

import json
from typing import Any

from ..messages import InvalidBody, ServerRefuses

REFUSES = "llama.cpp answers 400: "
FAILS = "llama.cpp answers 500: "  # an InvalidBody, as in llama_cpp.py
BILLING_PREFIX = "x-anthropic-billing-header:"
_CCH_LENGTH = 5


def normalize_billing_header(text: str) -> str:
    """`normalize_anthropic_billing_header`: in a text that starts with the header, the 5 characters after
    the first `cch=` become `fffff` when a `;` follows them; any other text as it is."""
    if not text.startswith(BILLING_PREFIX):
        return text
    at = text.find("cch=", len(BILLING_PREFIX))
    if at == -1:
        return text
    start = at + 4
    end = start + _CCH_LENGTH
    if end < len(text) and text[end] == ";":
        return text[:start] + "f" * _CCH_LENGTH + text[end:]
    return text  # LOG_ERR("anthropic string not as expected"), left as it is


def _value(obj: Any, key: str, default: Any) -> Any:
    """`json_value(obj, key, default)`: the value when present, not null and of the default's type (C++'s
    `get<T>`; a `json` default takes any value), else the default."""
    if not isinstance(obj, dict) or obj.get(key) is None:
        return default
    value = obj[key]
    if isinstance(default, str):  # get<std::string>() of another type: a type_error, the default
        return value if isinstance(value, str) else default
    return value  # json() and json::object(): any value


def _dump(value: Any) -> str:
    """`json::dump()`: compact, keys in their order, UTF-8 as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _image(source: Any) -> None:
    """An image block: a base64 or URL source becomes an `image_url` part (any other source nothing), which
    server-common.cpp `oaicompat_content_load_media` answers with a 500 on a server without a multimodal
    projector (`--mmproj`); with one, its tokens are the projector's, not modelled for llama.cpp. Either
    way not a count."""
    if _value(source, "type", "") in ("base64", "url"):
        raise InvalidBody(FAILS + "image input is not supported (no multimodal projector)")


def _tool_result(block: Any) -> dict[str, Any]:
    """A tool_result block as a tool message: a string as is, a list's text items joined with "" (as parts
    when it holds an image), anything else ""."""
    call_id = _value(block, "tool_use_id", "")
    content = _value(block, "content", None)
    if isinstance(content, str):
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    if not isinstance(content, list):
        return {"role": "tool", "tool_call_id": call_id, "content": ""}
    text = ""
    parts: list[dict[str, Any]] = []
    images = False
    for item in content:
        kind = _value(item, "type", "")
        if kind == "text":
            text += _value(item, "text", "")
            parts.append({"type": "text", "text": _value(item, "text", "")})
        elif kind == "image":
            images = True  # the text items then stay parts (joined with "\n" by the chat preparation)
            _image(_value(item, "source", {}))
    return {"role": "tool", "tool_call_id": call_id, "content": parts if images else text}


def _message(msg: Any, out: list[Any]) -> None:
    """One message of `messages`, appended to `out` as the conversion loop does."""
    if not isinstance(msg, dict):  # passed on; oaicompat_chat_params_parse: no content, a 400
        raise ServerRefuses(REFUSES + "a message that is not an object")
    role = _value(msg, "role", "")
    if "content" not in msg:
        if role != "assistant":
            out.append(msg)  # the chat preparation refuses it
        return
    content = msg["content"]
    if not isinstance(content, list):
        if content is not None and not isinstance(content, str):  # oaicompat_chat_params_parse: a 400
            raise ServerRefuses(REFUSES + "a content that is neither a string nor an array")
        out.append(msg)  # the message as it is
        return
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in content:
        kind = _value(block, "type", "")
        if kind == "text":
            parts.append(block)  # the block itself, every key of it
        elif kind == "thinking":
            reasoning += _value(block, "thinking", "")
        elif kind == "image":
            _image(_value(block, "source", {}))
        elif kind == "tool_use":
            function = {"name": _value(block, "name", ""), "arguments": _dump(_value(block, "input", {}))}
            calls.append({"id": _value(block, "id", ""), "type": "function", "function": function})
        elif kind == "tool_result":
            results.append(_tool_result(block))
        # redacted_thinking, tool_reference and any other type: nothing
    if parts or calls or reasoning:
        chat: dict[str, Any] = {"role": role, "content": parts if parts else ""}
        if calls:
            chat["tool_calls"] = calls
        if reasoning:
            chat["reasoning_content"] = reasoning
        out.append(chat)
    out.extend(results)


def _tool(tool: Any) -> dict[str, Any]:
    parameters = tool["input_schema"] if isinstance(tool, dict) and "input_schema" in tool else {}
    function = {
        "name": _value(tool, "name", ""),
        "description": _value(tool, "description", ""),
        "parameters": parameters,
    }
    return {"type": "function", "function": function}


def messages_as_chat(body: Any, count_tokens: bool) -> dict[str, Any]:
    """The chat request llama-server serves for a Messages request (`server_chat_convert_anthropic_to_oai`);
    `/v1/messages/count_tokens` converts it the same way (`count_tokens` changes nothing)."""
    if not isinstance(body, dict) or "messages" not in body:
        raise InvalidBody(FAILS + "'messages' is required")
    out: list[Any] = []
    system = _value(body, "system", None)
    if system is not None:
        if isinstance(system, str):
            text = normalize_billing_header(system)
        elif isinstance(system, list):
            text = "".join(
                normalize_billing_header(_value(b, "text", ""))
                for b in system
                if _value(b, "type", "") == "text"
            )
        else:
            text = ""
        out.append({"role": "system", "content": text})
    if isinstance(body["messages"], list):
        for msg in body["messages"]:
            _message(msg, out)
    chat: dict[str, Any] = {"messages": out}
    if isinstance(body.get("tools"), list):
        chat["tools"] = [_tool(t) for t in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = _value(choice, "type", "")
        if kind == "auto":
            chat["tool_choice"] = "auto"
        elif kind in ("any", "tool"):
            chat["tool_choice"] = "required"
    if "chat_template_kwargs" in body:  # passed through with the sampling fields, the only one that
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]  # shapes the prompt
    return chat
