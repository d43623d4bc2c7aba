"""A chat request as vLLM 0.32 hands it to mistral-common in `mistral` tokenizer mode. Pure: no tokenizer.

In that mode no chat template runs: `vllm/renderers/online_renderer.py` `render_chat` edits the validated
request, and `vllm/renderers/mistral.py` passes the request's own message dicts (not the parsed
conversation) to `vllm/tokenizers/mistral.py` `MistralTokenizer.apply_chat_template`, which hands them to
transformers' `MistralCommonBackend.apply_chat_template` and so to mistral-common's
`ChatCompletionRequest.from_openai` (transformers' `_maybe_adapt_message` on the way only rewrites parts
this module never lets through: typeless, "image", "audio"). `mistral_call` returns the arguments of that
call; core/renderers/mistral.py makes it. Each rule cites the vLLM code it follows (paths under `vllm/`), and was
checked against vLLM 0.32's own functions on the same bodies.

Where vLLM answers 400 (the request model, its validators, `render_chat`'s checks, and any error of
mistral-common's, which `safe_apply_chat_template` turns into a ValueError), this raises
`ServerRefuses(REFUSES + reason)`; where it answers 500, `InvalidBody(FAILS + reason)`. Reasons quote
nothing of the request. Media parts are not modelled (the model's multimodal processor fetches and expands
them): `MediaNotModelled`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import messages
from ..messages import REFUSES, InvalidBody, ServerRefuses

FAILS = "vllm answers 500: "  # an exception vLLM's handlers do not map to 400 (a KeyError)
# ChatCompletionRequest.reasoning_effort's Literal (entrypoints/openai/chat_completion/protocol.py).
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Media part types of vLLM's message parser (chat_utils.py MM_PARSER_MAP); other types, "image", "audio" and
# "file" among them, are refused. A part without a type (or with a uuid) is media when it holds one of the
# media keys (`_parse_chat_message_content_mm_part`), else refused.
MEDIA_PARTS = frozenset(
    {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds"}
    | {"video_url", "video_embeds", "prompt_embeds"}
)
_MEDIA_KEYS = tuple(sorted(MEDIA_PARTS - {"input_image"}))
# vLLM truncates tool-call ids to their last 9 characters (tokenizers/mistral.py truncate_tool_call_ids).
TOOL_ID_CHARS = 9


class MediaNotModelled(Exception):
    """The request has media parts: vLLM's multimodal processor decides their tokens (not modelled)."""


@dataclass(frozen=True)
class MistralCall:
    """The arguments of mistral-common's `ChatCompletionRequest.from_openai`, as vLLM passes them."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    continue_final_message: bool
    reasoning_effort: str | None  # passed on only for tokenizer versions >= 15


def refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


def lax_bool(value: Any, name: str) -> bool:
    return messages.lax_bool(value, name, REFUSES)


def _validators(body: dict[str, Any]) -> None:
    """The request model's mode="before" validators that concern the prompt; they read the raw body."""
    # check_generation_prompt: the raw values' truthiness ("false" is truthy here).
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise refuse("continue_final_message and add_generation_prompt both set")
    # check_tool_usage
    tools = body.get("tools")
    if tools == []:
        raise refuse("tools is an empty array")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice is None or choice == "none":
        return
    if tools is None:
        raise refuse("tool_choice without tools")
    if not isinstance(choice, dict):
        if choice not in ("auto", "required"):
            raise refuse("tool_choice is not none, auto, required or a named tool")
        return
    fn = choice.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise refuse("tool_choice without a function name")
    if not _names_a_tool(tools, fn["name"]):
        raise refuse("tool_choice names no tool of the request")


def _names_a_tool(tools: Any, name: str) -> bool:
    """check_tool_usage's `for tool in data["tools"]: if tool["function"]["name"] == name`, on the raw tools
    (before the model validates them): a tool before the match without `function` or `name` is a KeyError,
    which vLLM answers 500; one that cannot be subscripted so is a TypeError, a 400."""
    if not isinstance(tools, list):
        raise refuse("tools is not a list")
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(tool, dict) and ("function" not in tool or (isinstance(fn, dict) and "name" not in fn)):
            raise InvalidBody(FAILS + "a tool without function or name precedes the named tool")
        if not isinstance(fn, dict):
            raise refuse("tool is not an object with a function object")
        if fn["name"] == name:
            return True
    return False


def _flags(body: dict[str, Any]) -> tuple[bool, bool]:
    agp = lax_bool(body.get("add_generation_prompt", True), "add_generation_prompt")
    cfm = lax_bool(body.get("continue_final_message", False), "continue_final_message")
    if "add_special_tokens" in body:  # validated, then unused: the prompt is already token ids
        lax_bool(body["add_special_tokens"], "add_special_tokens")
    return agp, cfm


def _request_params(body: dict[str, Any]) -> str | None:
    """tokenizers/mistral.py validate_request_params: any chat_template or chat_template_kwargs (even an
    empty object) is refused; the request model refuses a reasoning_effort outside its Literal, and
    mistral-common 1.13's ReasoningEffort holds every value of that Literal."""
    if body.get("chat_template") is not None or body.get("chat_template_kwargs") is not None:
        raise refuse("chat_template / chat_template_kwargs are not supported for Mistral tokenizers")
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in EFFORTS:
        raise refuse("reasoning_effort is not one vLLM accepts")
    return effort


def _tool(raw: Any) -> dict[str, Any]:
    """ChatCompletionToolsParam(...).model_dump(): FunctionDefinition's fields, `strict`/`defer_loading`
    only when set (render_chat's `tool_dicts`)."""
    fn = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise refuse("tool without a function name")
    if raw.get("type", "function") != "function":
        raise refuse("tool type is not function")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise refuse("tool description is not a string")
    if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
        raise refuse("tool parameters are not an object")
    out_fn: dict[str, Any] = {
        "name": fn["name"],
        "description": fn.get("description"),
        "parameters": fn.get("parameters"),
    }
    defer = None if raw.get("defer_loading") is None else lax_bool(raw["defer_loading"], "defer_loading")
    for key in ("strict", "defer_loading"):
        value = None if fn.get(key) is None else lax_bool(fn[key], key)
        if key == "defer_loading" and value is None:
            value = defer  # ChatCompletionToolsParam._propagate_defer_loading
        if value is not None:
            out_fn[key] = value
    out: dict[str, Any] = {"type": "function", "function": out_fn}
    if defer is not None:
        out["defer_loading"] = defer
    return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """render_chat's `tool_dicts`. tool_choice "none" keeps the tools (the server's
    --exclude-tools-when-tool-choice-none is off by default)."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise refuse("tools is not a list")
    if (
        isinstance(body.get("tool_choice"), dict)
        and body["tool_choice"].get("type", "function") != "function"
    ):
        raise refuse("tool_choice type is not function")  # ChatCompletionNamedToolChoiceParam
    return None if tools is None else [_tool(t) for t in tools]


def _is_media(part: Any) -> bool:
    """A content part the request model and vLLM's message parser let through: media (True), or text or
    thinking (False; mistral-common decides where thinking may stand). Anything else is refused."""
    if not isinstance(part, dict):
        raise refuse("content part is not an object")
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        if any(k in part for k in _MEDIA_KEYS):
            return True
    elif kind in MEDIA_PARTS and (kind != "input_image" or "detail" in part):  # ResponseInputImageParam
        return True
    elif (kind == "text" and isinstance(part.get("text"), str)) or (
        kind == "thinking" and isinstance(part.get("thinking"), str)
    ):
        return False
    raise refuse("content part of a type or shape vLLM's mistral path refuses")


def _arguments(text: str) -> dict[str, Any]:
    """chat_utils.py `_postprocess_messages`, run by `parse_chat_messages` before mistral-common sees the
    messages: it rewrites each call's `arguments` in place, in the very dicts the request holds, to the parsed
    JSON object, or `{}` for an empty, invalid or non-object string. mistral-common then dumps that dict
    (`FunctionCall.validate_arguments`: `json.dumps`), so `{"a":1}` reaches the model as `{"a": 1}`."""
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """An assistant's tool_calls: ChatCompletionMessageFunctionToolCallParam (id, type "function", function
    name and arguments all strings); maybe_serialize_tool_calls makes a missing or null list `[]`."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise refuse("tool_calls is not a list")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(fn, dict)
            or call.get("type") != "function"
            or not isinstance(call.get("id"), str)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments"), str)
        ):
            raise refuse("tool call is not a function call with string id, name and arguments")
        function = {**fn, "arguments": _arguments(fn["arguments"])}
        call_id = call["id"][-TOOL_ID_CHARS:]  # truncate_tool_call_ids
        out.append({**call, "id": call_id, "function": function})
    return out


def _message(msg: Any, media: list[bool]) -> dict[str, Any]:
    """One message as the validated request holds it after render_chat's edits; `media` notes media parts."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        raise refuse("message without a string role")
    role = msg["role"]
    out = dict(msg)
    content = msg.get("content")
    if content is None and "content" in msg and role != "assistant":
        raise refuse("null content outside an assistant message")
    if isinstance(content, list):
        media.extend(_is_media(part) for part in content)
    elif content is not None and not isinstance(content, str):
        raise refuse("content is neither a string, a list of parts nor null")
    if "name" in msg and not isinstance(msg["name"], str):
        raise refuse("message name is not a string")
    # _normalize_messages_before: reasoning_content is renamed reasoning unless that is set.
    reasoning = out.pop("reasoning_content", None)
    if reasoning is not None and out.get("reasoning") is None:
        out["reasoning"] = reasoning
    if role == "assistant":
        out["tool_calls"] = _tool_calls(msg.get("tool_calls"))
    elif role == "tool" and "tool_call_id" in msg:
        if not isinstance(msg["tool_call_id"], str):
            raise refuse("tool_call_id is not a string")
        out["tool_call_id"] = msg["tool_call_id"][-TOOL_ID_CHARS:]
    return out


def mistral_call(body: Any) -> MistralCall:
    """A `/v1/chat/completions` body -> the `from_openai` arguments vLLM's mistral path builds from it."""
    if not isinstance(body, dict):
        raise refuse("body is not a JSON object")
    _validators(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise refuse("messages is not a list")
    agp, cfm = _flags(body)
    tools = _tools(body)
    effort = _request_params(body)
    media: list[bool] = []
    prepared = [_message(m, media) for m in messages]
    # tokenizers/mistral.py _validate_apply_chat_template_args (an empty list fails on messages[-1]).
    if not prepared:
        raise refuse("messages is empty")
    last = prepared[-1]["role"]
    if agp and cfm:
        raise refuse("add_generation_prompt (default true) with continue_final_message")
    if agp and last == "assistant":
        raise refuse("add_generation_prompt with a final assistant message")
    if cfm and last != "assistant":
        raise refuse("continue_final_message without a final assistant message")
    if any(media):  # checked last: a request vLLM refuses anyway is a 400, media or not
        raise MediaNotModelled("media parts are expanded by the model's multimodal processor")
    return MistralCall(prepared, tools, cfm, effort)
