"""vLLM 0.32's request models, as far as they shape a gpt-oss (Harmony) prompt: what they refuse (vLLM answers
400), and the message dicts, tools and items they hand to the Harmony path (core/renderers/harmony.py). Pure: no
openai_harmony, no I/O.

Chat: `vllm/entrypoints/openai/chat_completion/protocol.py` `ChatCompletionRequest` (its `messages` are
`vllm/renderers/chat_utils.py` `ChatCompletionMessageParam`, a union of openai's TypedDicts, vLLM's
`CustomChatCompletionMessageParam` and Harmony's `Message`). Responses: `.../responses/protocol.py`
`ResponsesRequest`. Pydantic keeps a message's unknown keys; a content list reaches vLLM as a list when it
holds an object part that vLLM's custom part types accept, else as pydantic's lazy `ValidatorIterator`
(openai's `Iterable[...]` won the union), which vLLM's Harmony code reads as no text at all or, when it
iterates it, validates then (measured with vLLM 0.32 and pydantic 2.14; `Lazy` here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..messages import REFUSES, HistoryOnServer, InvalidBody, ServerRefuses

FAILS = "vllm answers 500: "  # an exception vLLM's handlers do not map to 400 (AttributeError, HarmonyError)

REQUEST_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# The roles openai's message TypedDicts name (content as `Iterable[...]`); others only match vLLM's custom one.
OPENAI_ROLES = ("system", "user", "assistant", "tool", "developer")
# vLLM's custom content parts (chat_utils.py ChatCompletionContentPartParam) by `type`, with the key each
# requires; parts without a type: the "simple" image / audio / video ones and a PIL image.
PART_KEYS = {
    "text": "text",
    "image_url": "image_url",
    "input_audio": "input_audio",
    "file": "file",
    "refusal": "refusal",
    "audio_url": "audio_url",
    "video_url": "video_url",
    "image_embeds": None,
    "audio_embeds": None,
    "video_embeds": None,
    "prompt_embeds": "data",
    "thinking": "thinking",
    "tool_reference": None,
}
UNTYPED_PARTS = ("image_url", "audio_url", "video_url", "image_pil")
# config.json of openai/gpt-oss-20b and -120b: vocab_size (the model's, above the tokenizer's 200,019).
GPT_OSS_VOCAB_SIZE = 201088


def refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


def fails(why: str) -> InvalidBody:
    return InvalidBody(FAILS + why)


class Lazy:
    """A content list pydantic left as a lazy iterator: not a list to vLLM's `flatten_input_text_content`
    (no text), validated against openai's part types only when vLLM iterates it."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def __bool__(self) -> bool:  # an iterator is truthy, empty or not
        return True


@dataclass(frozen=True)
class FunctionTool:
    """A tool as vLLM's `create_tool_definition` reads it (harmony_utils.py:151)."""

    kind: str  # the tool's `type`
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[FunctionTool] | None  # None: left out of the prompt
    effort: str | None
    reused_ids: list[int] | None = None  # kv_transfer_params.prompt_token_ids sent on to the engine as is


def _part_ok(part: Any) -> bool:
    """A part vLLM's custom part union accepts (approximately: the keys each type requires)."""
    if isinstance(part, str):
        return True
    if not isinstance(part, dict):
        return False
    kind = part.get("type")
    if kind is None:
        return any(k in part for k in UNTYPED_PARTS)
    if kind not in PART_KEYS:
        return False
    key = PART_KEYS[kind]
    if key in ("text", "refusal", "thinking", "data"):
        return isinstance(part.get(key), str)
    return key is None or key in part


def chat_content(role: str, content: Any) -> Any:
    if isinstance(content, str) or (content is None and role in ("assistant", "function")):
        return content
    if not isinstance(content, list):
        raise refuse("message content is neither a string, a list of parts nor null")
    custom = all(_part_ok(p) for p in content)
    if role in OPENAI_ROLES and not (custom and any(isinstance(p, dict) for p in content)):
        return Lazy(content)
    if not custom:
        raise refuse("content part of no type vLLM knows")
    return content


def _tool_call(call: Any) -> dict[str, Any]:
    """openai's ChatCompletionMessage(Function|Custom)ToolCallParam: an id, and a function (name, arguments
    strings) or a custom tool (name, input)."""
    if not isinstance(call, dict) or not isinstance(call.get("id"), str):
        raise refuse("tool call without a string id")
    kind, inner = call.get("type"), call.get(str(call.get("type")))
    keys = {"function": ("name", "arguments"), "custom": ("name", "input")}.get(str(kind))
    if keys is None or not isinstance(inner, dict) or not all(isinstance(inner.get(k), str) for k in keys):
        raise refuse("tool call is neither a function call nor a custom tool call")
    return call


def chat_message(msg: Any) -> dict[str, Any]:
    """One message as the validated request holds it (a shallow copy: vLLM edits its own)."""
    if not isinstance(msg, dict):
        raise refuse("message is not an object")
    if "role" not in msg and isinstance(msg.get("author"), dict):
        # Harmony's Message model: vLLM's tool-call name pass calls `.get` on it (AttributeError).
        raise fails("a Harmony-shaped message in a chat request")
    role = msg.get("role")
    if not isinstance(role, str):
        raise refuse("message without a string role")
    out = dict(msg)
    # _normalize_messages_before: `reasoning_content` renamed to `reasoning` unless that is set.
    reasoning_content = out.pop("reasoning_content", None)
    if reasoning_content is not None and out.get("reasoning") is None:
        out["reasoning"] = reasoning_content
    if "name" in out and not isinstance(out["name"], str):
        raise refuse("message name is not a string")
    if "tool_call_id" in out and not (out["tool_call_id"] is None or isinstance(out["tool_call_id"], str)):
        raise refuse("tool_call_id is not a string")
    if "content" in out:
        out["content"] = chat_content(role, out["content"])
    calls = out.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise refuse("tool_calls is not a list")
        out["tool_calls"] = [_tool_call(c) for c in calls]
    if role == "assistant":  # online_renderer.py maybe_serialize_tool_calls: a list on every assistant turn
        out["tool_calls"] = out.get("tool_calls") or []
    return out


def chat_tool(tool: Any) -> FunctionTool:
    """ChatCompletionToolsParam: type "function" (the default), a FunctionDefinition."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise refuse("tool is not a function tool")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise refuse("tool without a function name")
    description, parameters = fn.get("description"), fn.get("parameters")
    if not (description is None or isinstance(description, str)):
        raise refuse("tool description is not a string")
    if not (parameters is None or isinstance(parameters, dict)):
        raise refuse("tool parameters is not an object")
    return FunctionTool("function", fn["name"], description, parameters)


def check_tool_usage(body: dict[str, Any]) -> Any:
    """protocol.py ChatCompletionRequest.check_tool_usage; returns the effective tool_choice."""
    tools = body.get("tools")
    if tools == []:
        raise refuse("tools is an empty list")
    choice = body.get("tool_choice", "auto" if tools else "none")
    if choice is None or choice == "none":
        return choice
    if tools is None:
        raise refuse("tool_choice without tools")
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise refuse("tool_choice is not none, auto, required or a named tool")
    if isinstance(choice, dict):
        fn = choice.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise refuse("named tool_choice without a function name")
        functions = [
            t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        if not any(f.get("name") == fn["name"] for f in functions):
            raise refuse("tool_choice names no tool of the request")
    return choice


_TEXT_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
_MEDIA_KEYS = frozenset(
    {"input_image", "image_url", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds", "image_pil"}
    | {"audio_url", "input_audio", "video_url"}
)


def _non_text(messages: list[Any]) -> bool:
    """chat_utils.py has_non_text_content: a list part with a media key, or of a non-text type."""
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else ():
            if isinstance(part, dict) and (
                any(k in part for k in _MEDIA_KEYS) or part.get("type", "text") not in _TEXT_TYPES
            ):
                return True
    return False


def reused_ids(body: dict[str, Any]) -> list[int] | None:
    """online_renderer.py _reused_prompt_token_ids: a decode stage's forwarded prompt ids replace rendering,
    unless the request echoes or has media (`drop_prompt_token_ids_with_media`)."""
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise refuse("kv_transfer_params is not an object")
    ids = kv.get("prompt_token_ids") if kv else None
    if ids is None or _non_text(body["messages"]) or body.get("echo"):
        return None
    if not isinstance(ids, list) or not ids or any(type(x) is not int or x < 0 for x in ids):
        raise refuse("kv_transfer_params.prompt_token_ids is not a list of token ids")
    if max(ids) > GPT_OSS_VOCAB_SIZE - 1:  # renderers/base.py validate_token_ids
        raise refuse("kv_transfer_params.prompt_token_ids out of vocabulary")
    return list(ids)


def chat_request(body: Any, exclude_tools_when_tool_choice_none: bool = False) -> ChatRequest:
    if not isinstance(body, dict):
        raise refuse("body is not a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise refuse("messages is not a list")
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise refuse("continue_final_message and add_generation_prompt both set")  # check_generation_prompt
    choice = check_tool_usage(body)
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REQUEST_EFFORTS:
        raise refuse("reasoning_effort is not a value the request model accepts")
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise refuse("tools is not a list")
    tools = None if raw_tools is None else [chat_tool(t) for t in raw_tools]
    prepared = [chat_message(m) for m in messages]
    # online_renderer.py render_chat: tool_dicts is None without tools, or for tool_choice "none" when the
    # server excludes them then.
    if choice == "none" and exclude_tools_when_tool_choice_none:
        tools = None
    return ChatRequest(prepared, tools, effort, reused_ids(body))


# --- Responses API ----------------------------------------------------------------------------------------

# openai's responses Tool union (openai 3.57, as vLLM 0.32 installs it), by `type`.
RESPONSES_TOOL_TYPES = frozenset(
    {
        "function",
        "file_search",
        "computer",
        "computer_use_preview",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
        "mcp",
        "code_interpreter",
        "programmatic_tool_calling",
        "image_generation",
        "local_shell",
        "shell",
        "custom",
        "namespace",
        "tool_search",
        "apply_patch",
    }
)
INPUT_PART_TYPES = ("input_text", "input_image", "input_file")


@dataclass(frozen=True)
class ResponsesRequest:
    instructions: str | None
    input: str | list[dict[str, Any]]  # items as vLLM's Harmony path reads them
    tools: list[FunctionTool]
    effort: str | None
    previous: list[dict[str, Any]] | None  # previous_input_messages (vLLM's extension)


def responses_tool(tool: Any) -> FunctionTool:
    if not isinstance(tool, dict) or tool.get("type") not in RESPONSES_TOOL_TYPES:
        raise refuse("tool of no type the Responses API knows")
    if (
        tool["type"] == "custom"
        and isinstance(tool.get("format"), dict)
        and tool["format"].get("type") == "grammar"
    ):
        raise refuse("custom tool with a grammar format")  # check_custom_tool_format
    if tool["type"] != "function":
        return FunctionTool(tool["type"])
    name, description, parameters = tool.get("name"), tool.get("description"), tool.get("parameters")
    if not isinstance(name, str):
        raise refuse("function tool without a string name")
    if not (description is None or isinstance(description, str)):
        raise refuse("tool description is not a string")
    if not (parameters is None or isinstance(parameters, dict)):
        raise refuse("tool parameters is not an object")
    return FunctionTool("function", name, description, parameters)


def _input_parts_ok(content: Any) -> bool:
    """ResponseInputMessageContentListParam: input_text (a string text), input_image, input_file parts."""
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") in INPUT_PART_TYPES
        and (p["type"] != "input_text" or isinstance(p.get("text"), str))
        for p in content
    )


def _output_message(item: dict[str, Any]) -> dict[str, Any] | None:
    """input_item_parsing: an assistant message with list content as ResponseOutputMessage, dumped (its
    parts output_text, text a string, or refusal); None when the model refuses it."""
    parts = item["content"]
    for p in parts:
        if not isinstance(p, dict) or p.get("type") not in ("output_text", "refusal"):
            return None
        if not isinstance(p.get(str(p["type"]).replace("output_", "")), str):
            return None
    return item


def response_item(item: Any) -> dict[str, Any]:
    """One input item as vLLM's request model holds it (`input_item_parsing`, then the item union)."""
    if not isinstance(item, dict):
        raise refuse("input item is not an object")
    kind = item.get("type")
    if kind == "function_call":  # ResponseFunctionToolCall
        if not all(isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")):
            raise refuse("function_call without string arguments, call_id and name")
        return item
    if kind == "reasoning":  # ResponseReasoningItem: a summary list; content parts with string texts
        content = item.get("content")
        if not isinstance(item.get("summary"), list) or not (
            content is None or (isinstance(content, list) and all(_has_text(c) for c in content))
        ):
            raise refuse("reasoning item without a summary list or with a content part without text")
        return item
    if kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not (
            isinstance(item.get("output"), str) or _input_parts_ok(item.get("output"))
        ):
            raise refuse("function_call_output without a call_id or an output")
        return item
    if kind not in (None, "message"):
        raise refuse("input item of a type vLLM's Harmony path does not read")
    role, content = item.get("role"), item.get("content")
    if kind == "message" and role == "assistant" and isinstance(content, list) and _output_message(item):
        return item
    if role not in ("user", "assistant", "system", "developer") or not (
        isinstance(content, str) or _input_parts_ok(content)
    ):
        raise refuse("message item without a known role or with content of no input type")
    return item


def _has_text(part: Any) -> bool:
    return isinstance(part, dict) and isinstance(part.get("text"), str)


def responses_request(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise refuse("body is not a JSON object")
    raw = body.get("input")
    if not isinstance(raw, (str, list)):
        raise refuse("input is neither a string nor a list")
    if body.get("prompt") is not None:
        raise refuse("prompt templates are not supported")  # validate_prompt
    instructions = body.get("instructions")
    if not (instructions is None or isinstance(instructions, str)):
        raise refuse("instructions is not a string")
    reasoning = body.get("reasoning")
    if not (reasoning is None or isinstance(reasoning, dict)):
        raise refuse("reasoning is not an object")
    effort = (reasoning or {}).get("effort")
    if effort is not None and effort not in REQUEST_EFFORTS:
        raise refuse("reasoning.effort is not a value the request model accepts")
    raw_tools = body.get("tools", [])
    if not isinstance(raw_tools, list):
        raise refuse("tools is not a list")
    tools = [responses_tool(t) for t in raw_tools]
    choice = body.get("tool_choice", "auto")
    if not tools and (
        choice == "required" or (isinstance(choice, dict) and choice.get("type") in ("function", "custom"))
    ):
        raise refuse("tool_choice needs tools")  # check_tool_usage
    include = body.get("include")
    if isinstance(include, list) and "message.output_text.logprobs" in include:
        raise refuse("logprobs are not supported with gpt-oss")  # serving.py _validate_create_responses_input
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and kwargs.get("chat_template") is not None:
        raise refuse("a request chat template (not trusted)")  # online_renderer.py validate_chat_template
    previous = body.get("previous_input_messages")
    if previous is not None and (
        not isinstance(previous, list) or not all(isinstance(m, dict) for m in previous)
    ):
        raise refuse("previous_input_messages is not a list of objects")
    if previous and body.get("previous_response_id"):
        raise refuse("previous_input_messages with previous_response_id")
    if body.get("previous_response_id") is not None:
        # The conversation is in the server's response store, out of islwatch's sight: vLLM answers 404 unless
        # VLLM_ENABLE_RESPONSES_API_STORE is on and the response is stored (serving.py _create_responses).
        raise HistoryOnServer("previous_response_id: the history is in the server's response store")
    items: str | list[dict[str, Any]] = raw if isinstance(raw, str) else [response_item(i) for i in raw]
    return ResponsesRequest(instructions, items, tools, effort, previous)
