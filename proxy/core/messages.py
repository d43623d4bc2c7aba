"""Chat messages and tools as vLLM 0.32 prepares them for the template. Pure: no tokenizer, no I/O.

Each rule follows vLLM's own code (`vllm/renderers/chat_utils.py` `_parse_chat_message_content`,
`_postprocess_messages`; `vllm/renderers/hf.py` `safe_apply_chat_template`; the request models in
`vllm/entrypoints/openai/`), checked against a real vLLM 0.32 server (tests/vllm):
- text parts are joined with "\\n" for a template that reads `content` as a string, passed as part dicts to
  one that iterates over it ("openai" content format); media parts become placeholders; null content is "";
- tool messages whose parts are all text get them joined with "\\n" in either format;
- `name` is kept; `tool_calls` on assistant messages (an empty list is dropped), with `arguments` strings
  parsed into dicts, invalid JSON or a non-object coerced to `{}` (vLLM keeps the turn going);
- an assistant message's reasoning reaches the template as both `reasoning` and `reasoning_content`, with or
  without tool calls: the request model renames `reasoning_content` to `reasoning` unless that is set
  (`chat_completion/protocol.py` `_normalize_messages_before`), and `_parse_chat_message_content` hands both
  over ("interleaved thinking"); a string `task` is kept (DeepSeek V4's marker);
- a system text part that starts with Claude Code's `x-anthropic-billing-header` line loses that line
  (`_strip_claude_code_billing_header`): its value changes per request;
- `developer` messages become `system` messages, all merged into one at the front, when the template
  never mentions the developer role (`_convert_developer_to_system`, `_consolidate_system_messages`);
- tools are rendered as vLLM's `ChatCompletionToolsParam.model_dump()`: `description` and `parameters`
  present (null when absent), other keys dropped, `strict` / `defer_loading` only when set.
"""

from __future__ import annotations

import json
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


class ServerRefuses(InvalidBody):
    """A request of the endpoint that the server's own request path answers with a 400 (a rule islwatch
    follows, not a body it cannot read): counted as `server_would_refuse`. The reason starts with the
    server's name (`REFUSES`) and quotes nothing of the request."""


class HistoryOnServer(InvalidBody):
    """A request whose conversation the server holds (`previous_response_id`: vLLM's response store): its
    prompt is not in the body, so islwatch cannot count it. Counted as `history_on_server`, never drift."""


REFUSES = "vllm answers 400: "
_LAX_TRUE = {"true", "1", "yes", "y", "on", "t"}
_LAX_FALSE = {"false", "0", "no", "n", "off", "f"}


def lax_bool(value: Any, name: str, refuses: str = REFUSES) -> bool:
    """A pydantic `bool` field in lax mode, as vLLM's and SGLang's request models read their flags: JSON
    booleans, 0/1 and the usual words; anything else is the server's 400 (`refuses` names the server)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _LAX_TRUE | _LAX_FALSE:
        return value.strip().lower() in _LAX_TRUE
    raise ServerRefuses(f"{refuses}{name} is not a boolean")


def lax_int(value: Any, name: str, refuses: str = REFUSES) -> int:
    """A pydantic `int` field in lax mode (vLLM's and SGLang's request models): an integer or a bool, an
    integral float, a string of an integer (`" 12 "`, `"1_000"`, `"12.0"`); anything else their 400."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        whole, dot, zeros = value.strip().partition(".")
        try:
            if not dot or (zeros.strip("0") == "" and whole.lstrip("+-")):
                return int(whole)
        except ValueError:
            pass
    raise ServerRefuses(f"{refuses}{name} is not an integer")


def lax_float(value: Any, name: str, refuses: str = REFUSES) -> None:
    """A pydantic `float` field in lax mode: a number or a bool, a string Python's float() reads."""
    if isinstance(value, (int, float)):
        return
    if isinstance(value, str):
        try:
            float(value.strip())
            return
        except ValueError:
            pass
    raise ServerRefuses(f"{refuses}{name} is not a number")


def _part_kind(part: Any) -> str:
    if isinstance(part, str):
        return "text"
    if not isinstance(part, dict):
        raise InvalidBody("content part is not an object")
    kind = part.get("type")
    if kind in TEXT_KINDS:
        return "text"
    if kind == TOOL_REFERENCE:
        return TOOL_REFERENCE
    if kind in MEDIA_KINDS:
        return MEDIA_KINDS[kind]
    raise InvalidBody("unknown content part type")  # never the type itself: the reason is logged


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    text = part.get("text", part.get("refusal"))
    if not isinstance(text, str):
        raise InvalidBody("text part without a string text")
    return text


def _content_parts(content: Any) -> list[Any]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    raise InvalidBody("content is neither a string, a list of parts nor null")


# A deferred tool named in a tool result (Claude Code's tool search, vLLM's Anthropic conversion): vLLM's chat
# parser passes it through for the template (renderers/chat_utils.py `_parse_chat_message_content_part`): the
# name as a text line in the string content format, `{"type": "tool_reference", "name"}` in the openai one.
TOOL_REFERENCE = "tool_reference"
BILLING_HEADER = "x-anthropic-billing-header"


def _without_billing_header(parts: list[Any]) -> list[Any]:
    """vLLM `_strip_claude_code_billing_header`: a system text part starting with the header loses its first
    line, and is dropped when nothing follows it."""
    out = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        if isinstance(part, dict) and part.get("type") != "text":
            text = None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def reasoning_of(msg: dict[str, Any]) -> Any:
    """The message's reasoning after vLLM's request model: `reasoning`, else the older `reasoning_content`."""
    reasoning = msg.get("reasoning")
    return msg.get("reasoning_content") if reasoning is None else reasoning


# Roles whose message models take a null content (the OpenAI assistant and function message params); every
# other model of vLLM's message union refuses it (`chat_utils.py` ChatCompletionMessageParam).
_NULL_CONTENT_ROLES = ("assistant", "function")


def _request_model_refusals(msg: dict[str, Any]) -> None:
    """What vLLM 0.32's request model answers 400 before any preparation."""
    if "content" in msg and msg["content"] is None and msg["role"] not in _NULL_CONTENT_ROLES:
        raise ServerRefuses(REFUSES + "a null content on a message of this role")
    calls = msg.get("tool_calls") if msg["role"] == "assistant" else None
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("arguments"), str):
            raise ServerRefuses(REFUSES + "tool-call arguments that are not a string")  # Function.arguments


def prepare_message(
    msg: Any,
    parts_format: bool,
    developer_role: bool,
    texts: list[str],
    media: dict[str, int],
    refusals: bool = True,
    strip_billing: bool = True,
) -> dict[str, Any]:
    """One wire message as the template sees it; its texts (bare count) and media counts are collected.
    `refusals`: refuse what vLLM's request model refuses (ServerRefuses); `strip_billing`: vLLM's billing
    header rule."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise InvalidBody("message without a string role")
    if refusals:
        _request_model_refusals(msg)
    role = msg["role"]
    out_parts: list[dict[str, Any]] = []
    part_texts: list[str] = []
    parts = _content_parts(msg.get("content"))
    if role == "system":
        texts.extend(_part_text(p) for p in parts if _part_kind(p) == "text")  # the client sent them all
        parts = _without_billing_header(parts) if strip_billing else parts
    references = 0
    for part in parts:
        kind = _part_kind(part)
        if kind == "text":
            part_texts.append(_part_text(part))
            out_parts.append({"type": "text", "text": part_texts[-1]})
        elif kind == TOOL_REFERENCE:
            name = part.get("name")
            if not isinstance(name, str):
                raise InvalidBody("tool_reference without a string name")
            references += 1
            part_texts.append(name)
            out_parts.append({"type": TOOL_REFERENCE, "name": name})
        else:
            media[kind] = media.get(kind, 0) + 1
            out_parts.append({"type": kind})
    if role != "system":
        texts.extend(part_texts)
    all_text = len(out_parts) == len(part_texts) - references  # a tool reference keeps a tool result a list
    as_parts = parts_format and not (role == "tool" and all_text)  # text-only tool results: always joined
    out: dict[str, Any] = {"role": role, "content": out_parts if as_parts else "\n".join(part_texts)}
    if role == "assistant" and msg.get("tool_calls") is not None:
        calls = prepare_tool_calls(msg["tool_calls"])
        if calls:
            out["tool_calls"] = calls
    reasoning = reasoning_of(msg)
    if role == "assistant" and reasoning is not None:
        if not isinstance(reasoning, str):
            raise InvalidBody("reasoning is not a string")  # the request model's `str | None`
        out["reasoning"] = out["reasoning_content"] = reasoning
        texts.append(reasoning)
    if role == "tool" and "tool_call_id" in msg:
        out["tool_call_id"] = msg["tool_call_id"]
    if isinstance(msg.get("name"), str):
        out["name"] = msg["name"]
    if isinstance(msg.get("task"), str):
        out["task"] = msg["task"]
    if role == "developer" and developer_role:
        out["tools"] = msg.get("tools")
    return out


def _arguments(args: Any) -> dict[str, Any]:
    """vLLM `_postprocess_messages`: a dict as is, a JSON object string parsed, anything else `{}`."""
    if isinstance(args, dict):
        return args
    if isinstance(args, str) and args:
        try:
            parsed = json.loads(args)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}


def prepare_tool_calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidBody("tool_calls is not a list")
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise InvalidBody("tool call without a function object")
        fn = dict(call["function"])
        fn["arguments"] = _arguments(fn.get("arguments"))
        out.append({**call, "function": fn})
    return out


def _text_of(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and "text" in p)
    return content if isinstance(content, str) else ""


def developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM `_convert_developer_to_system` then `_consolidate_system_messages`: every system message merged
    into one at the front ("\\n\\n" between non-empty contents) once any is not first or there are two."""
    converted = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    contents = [c for i in systems if (c := _text_of(converted[i].get("content")))]
    merged = {"role": "system", "content": "\n\n".join(contents)}
    return [merged, *(m for m in converted if m["role"] != "system")]


def vllm_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM's request model dumps it (`ChatCompletionToolsParam` / `FunctionDefinition`)."""
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidBody("tool without a function name")  # vLLM answers 400
    out_fn: dict[str, Any] = {
        "name": fn["name"],
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    defer = fn.get("defer_loading", tool.get("defer_loading"))
    for key, value in (("strict", fn.get("strict")), ("defer_loading", defer)):
        if value is not None:
            out_fn[key] = value
    out: dict[str, Any] = {"type": "function", "function": out_fn}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out
