"""What a model server tokenizes, extracted from an OpenAI-compatible wire body. Pure: no tokenizer, no I/O.

Messages and tools are prepared as vLLM prepares them (messages.py). The request-level flags and
`chat_template_kwargs` combine as in vLLM's `ChatCompletionRequest.build_chat_params` and
`ChatParams.with_defaults` (`vllm/renderers/params.py` `merge_kwargs`): `add_generation_prompt`,
`continue_final_message`, `documents` and `reasoning_effort` given on the request win over the same keys in
`chat_template_kwargs` (a None request value does not); a non-null `tools` in `chat_template_kwargs` wins
over the request's tools; the server's `--default-chat-template-kwargs` lie under all of it, and a request
value of None or "auto" leaves the default in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .images import image_sources
from .messages import (
    REFUSES,
    HistoryOnServer,
    InvalidBody,
    ServerRefuses,
    developer_as_system,
    prepare_message,
    vllm_tool,
)


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
    images: tuple[str | None, ...] = ()  # each image part's URL (core/images.py image_sources)
    mm_processor_kwargs: Any = None  # the request's, for the server's image processor


@dataclass(frozen=True)
class PromptInput:
    """Completions / embeddings: each prompt is text or token ids."""

    prompts: list[str | list[int]]
    add_special_tokens: bool = True


def chat_input(
    body: Any,
    parts_format: bool = False,
    developer_role: bool = True,
    defaults: dict[str, Any] | None = None,
    refusals: bool = True,
    strip_billing: bool = True,
) -> ChatInput:
    """`/v1/chat/completions` body -> what the chat template renders. `parts_format` and `developer_role`
    are facts of the template (core/tokens.py `parts_format`, `developer_role`); `defaults` the server's
    `--default-chat-template-kwargs`."""
    if not isinstance(body, dict):
        raise InvalidBody("body is not a JSON object")
    messages = body.get("messages")
    # An empty list is not counted on any flavor: llama-server renders one (tests/interop/
    # test_llama_server_messages.py EMPTY_CONVERSATION), islwatch does not model how.
    if not isinstance(messages, list) or not messages:
        raise InvalidBody("messages is not a non-empty list")
    if refusals and any(name in body and body[name] is None for name in NOT_NULLABLE):
        raise ServerRefuses(REFUSES + "null for a field that takes none")
    return _chat_from_messages(
        body, messages, parts_format, developer_role, defaults, refusals, strip_billing
    )


# Keys the renderer passes by name: a `chat_template_kwargs` entry of the same name is merged, not repeated.
_NAMED = ("add_generation_prompt", "continue_final_message", "documents", "tools")
# ChatCompletionRequest's fields typed without None (chat_completion/protocol.py): a null is pydantic's 400.
# Those of vLLM 0.32 and 0.33 both (0.32's skip_special_tokens too: tests/vllm_oracle/test_vllm_releases.py).
NOT_NULLABLE = (
    "include_reasoning", "use_beam_search", "length_penalty", "include_stop_str_in_output", "ignore_eos",
    "min_tokens", "spaces_between_special_tokens", "bad_words", "echo", "add_generation_prompt",
    "continue_final_message", "add_special_tokens", "priority", "request_id",
)  # fmt: skip
# ChatCompletionRequest.reasoning_effort's Literal (chat_completion/protocol.py): anything else is a 400.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _template_kwargs(body: dict[str, Any], defaults: dict[str, Any] | None, refusals: bool) -> dict[str, Any]:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidBody("chat_template_kwargs is not an object")
    effort = body.get("reasoning_effort")
    if refusals:
        _refusals(body, kwargs, effort)
    merged = dict(kwargs)
    if effort is not None:
        merged["reasoning_effort"] = effort
        if "enable_thinking" not in kwargs:  # build_chat_params: reasoning asked for turns thinking on
            merged["enable_thinking"] = effort != "none"
    # ChatParams.with_defaults: merge_kwargs(server defaults, the request's), a None or "auto" request
    # value unset. It always runs in preprocess_chat (its defaults carry `tokenize`), so this does too.
    return (defaults or {}) | {k: v for k, v in merged.items() if not _unset(v)}


def _refusals(body: dict[str, Any], kwargs: dict[str, Any], effort: Any) -> None:
    """OnlineRenderer.validate_chat_template (no --trust-request-chat-template), hf.py
    resolve_chat_template_kwargs (`tokenize` is vLLM's to set, never the request's), the request model's
    reasoning_effort Literal."""
    if body.get("chat_template") is not None or kwargs.get("chat_template") is not None:
        raise ServerRefuses(REFUSES + "a chat template in the request is refused (untrusted)")
    if "tokenize" in kwargs or "chat_template" in kwargs:
        raise ServerRefuses(REFUSES + "unexpected chat_template_kwargs")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ServerRefuses(REFUSES + "reasoning_effort is not one of " + "/".join(REASONING_EFFORTS))
    if body.get("tools") == []:  # chat_completion/protocol.py check_tool_usage
        raise ServerRefuses(REFUSES + "tools must not be an empty array")


def _unset(value: Any) -> bool:
    """merge_kwargs(unset_values=(None, "auto")): a request value that leaves the server's default."""
    return value is None or (isinstance(value, str) and value == "auto")


def _chat_from_messages(
    body: dict[str, Any],
    messages: list[Any],
    parts_format: bool,
    developer_role: bool,
    defaults: dict[str, Any] | None = None,
    refusals: bool = True,
    strip_billing: bool = True,
) -> ChatInput:
    texts: list[str] = []
    media: dict[str, int] = {}
    prepared = [
        prepare_message(m, parts_format, developer_role, texts, media, refusals, strip_billing)
        for m in messages
    ]
    if not developer_role and any(m["role"] == "developer" for m in prepared):
        prepared = developer_as_system(prepared)
    kwargs = _template_kwargs(body, defaults, refusals)
    # Request tools pass vLLM's request model (dumped as vllm_tool); tools in chat_template_kwargs reach
    # the template as sent.
    raw_tools = kwargs.get("tools")
    tools = body.get("tools") if raw_tools is None else raw_tools
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise InvalidBody("tools is not a list of objects")
    if tools and raw_tools is None:
        tools = [vllm_tool(t) for t in tools]
    documents = body.get("documents") if body.get("documents") is not None else kwargs.get("documents")
    if documents is not None and not isinstance(documents, list):
        raise InvalidBody("documents is not a list")
    return ChatInput(
        messages=prepared,
        texts=texts,
        media=media,
        # [] reaches the template as [] on vLLM (tools in chat_template_kwargs; the Messages API's after its
        # request model): a template testing `tools is not none` (Llama 3.1's) writes its tool preamble.
        tools=tools if tools or (refusals and tools is not None) else None,
        documents=documents or None,
        add_generation_prompt=bool(body.get("add_generation_prompt", True)),
        continue_final_message=bool(body.get("continue_final_message", False)),
        add_special_tokens=bool(body.get("add_special_tokens", False)),
        template_kwargs={k: v for k, v in kwargs.items() if k not in _NAMED},
        images=image_sources(messages) if media.get("image") else (),
        mm_processor_kwargs=body.get("mm_processor_kwargs"),
    )


def _assistant_text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _responses_item(item: Any, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """vLLM's `_construct_message_from_response_item` (`responses/utils.py`): a new chat message, or None when
    the item went into the previous assistant message (a reasoning item, a function call, an output text
    of the same turn). Only an assistant message is merged into."""
    if not isinstance(item, dict):
        raise InvalidBody("responses input item is not an object")
    kind = item.get("type", "message")
    prev_assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    if kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
        }
        if prev_assistant is not None and isinstance(prev_assistant.get("tool_calls"), list | type(None)):
            prev_assistant["tool_calls"] = [*(prev_assistant.get("tool_calls") or []), call]
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise ServerRefuses(REFUSES + "encrypted reasoning content is not supported")
        parts = item.get("content") or item.get("summary") or []
        first = parts[0] if isinstance(parts, list) and parts else None
        reasoning = first.get("text", "") if isinstance(first, dict) else ""
        if prev_assistant is not None and prev_assistant.get("reasoning") is None:
            prev_assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind == "function_call_output":
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if kind == "message" and item.get("role") == "assistant":
        # An output message keeps its first part's text only; it fills the turn's content when still unset.
        text = _assistant_text(item.get("content"))
        if text is not None:
            if prev_assistant is not None and prev_assistant.get("content") is None:
                prev_assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if kind == "message" and "role" in item:
        return {k: v for k, v in item.items() if k in ("role", "content", "name")}
    raise ServerRefuses(REFUSES + "unsupported responses input item type")  # the type itself is not logged


def _responses_items(items: list[Any]) -> list[dict[str, Any]]:
    """Responses API input items -> chat messages (`construct_chat_messages_with_tool_call`): a turn's
    reasoning, output text and function calls merge into one assistant message; outputs become tool
    messages."""
    messages: list[dict[str, Any]] = []
    for item in items:
        message = _responses_item(item, messages[-1] if messages else None)
        if message is not None:
            messages.append(message)
    return messages


def _continues_final(items: Any) -> bool:
    """`should_continue_final_message`: the last item is a message or reasoning item still in progress."""
    last = items[-1] if isinstance(items, list) and items and isinstance(items[-1], dict) else None
    if last is None or last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def responses_as_chat(body: Any) -> dict[str, Any]:
    """A `/v1/responses` body as the chat request vLLM's Responses path renders (`construct_input_messages`,
    `ResponsesRequest.build_chat_params`): `instructions` a system message before `input` (a string or
    items), flat tools in the chat shape, the generation prompt unless the last item is continued, the
    reasoning effort as the chat request's."""
    if not isinstance(body, dict):
        raise InvalidBody("body is not a JSON object")
    if body.get("previous_response_id") is not None:
        # vLLM prepends the stored response's conversation (responses/serving.py `_make_request`: the
        # previous response's input and output messages): out of islwatch's sight.
        raise HistoryOnServer("previous_response_id: the history is in the server's response store")
    raw = body.get("input")
    if isinstance(raw, str):
        messages: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        messages = _responses_items(raw)
    else:
        raise InvalidBody("input is neither a string nor a non-empty list")
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, {"role": "system", "content": instructions})
    continued = _continues_final(raw)
    chat = {**body, "messages": messages, "add_generation_prompt": not continued}
    chat["continue_final_message"] = continued
    for key in ("input", "instructions", "reasoning"):
        chat.pop(key, None)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat["reasoning_effort"] = reasoning["effort"]
    tools = body.get("tools")
    if isinstance(tools, list):  # Responses tools are flat ({"type": "function", "name": ...})
        chat["tools"] = [_flat_tool_to_chat(t) for t in tools if isinstance(t, dict)] or None
    return chat


def responses_input(
    body: Any,
    parts_format: bool = False,
    developer_role: bool = True,
    defaults: dict[str, Any] | None = None,
    refusals: bool = True,
    strip_billing: bool = True,
) -> ChatInput:
    """`/v1/responses`, rendered as its chat request (`responses_as_chat`)."""
    chat = responses_as_chat(body)
    # vLLM's ResponsesRequest.build_tok_params leaves TokenizeParams.add_special_tokens at its default, True
    # (vllm/renderers/params.py): the rendered prompt is encoded with special tokens, so a template that
    # writes BOS itself (Llama-3) gets a second one. Measured on vLLM 0.32: +1 token on every request.
    chat["add_special_tokens"] = True
    return _chat_from_messages(
        chat, chat["messages"], parts_format, developer_role, defaults, refusals, strip_billing
    )


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
