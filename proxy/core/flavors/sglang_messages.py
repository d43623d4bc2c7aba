"""SGLang 0.5.23's conversion of an Anthropic Messages request (`/v1/messages`, `/v1/messages/count_tokens`) into
the chat request it then serves (`sglang/srt/entrypoints/anthropic/serving.py`
`AnthropicServing._convert_to_chat_completion_request`, the request models of `.../anthropic/protocol.py`).

Pure: a JSON body in, a chat body out, or a `ServerRefuses` where SGLang answers 400: its request model
(http_server.py `validation_exception_handler`), or any exception of the conversion (`handle_messages`,
`handle_count_tokens`). Only what shapes the prompt is carried over (sampling fields are checked, not kept).
Where it departs from vLLM's (core/flavors/vllm_messages.py):
- system text blocks are joined with "\\n" and kept whole, Claude Code's billing header included;
- a user message's blocks stay in order: the text before a tool_result is a user message before its tool
  message, the text after it one after; a tool_result's text items are one tool message (joined with "\\n"),
  its tool references a tool message of their own, in order;
- an assistant's thinking is the reasoning parser's (`Reasoning`): wrapped in its think tokens at the head of
  the content, as `reasoning_content`, or dropped without a parser; a `redacted_thinking` block is refused;
- an assistant turn with nothing left is an empty-string message; a text block "" is kept;
- `thinking` switches the parser's template kwarg, or is refused where the parser cannot follow it;
- tools keep their `defer_loading` and `strict` (false by default), server tools are dropped;
- `output_config.effort` becomes `reasoning_effort` (`xhigh`: `max`) without touching the thinking kwargs.
Two answers depend on the served model and are the caller's (core/flavors/sglang.py, as SGLang computes them
at start-up): `merge_inline_system` (`supports_inline_system`, `template_inline_system`) and the reasoning
parser (`Reasoning`, `PARSERS`; which one the server runs is islwatch's assumption, `documented_parser`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from ..messages import ServerRefuses
from .sglang_request import REFUSES, lax_bool, lax_float, lax_int

BLOCK_TYPES = frozenset(
    {
        "text",
        "image",
        "tool_use",
        "tool_result",
        "tool_reference",
        "search_result",
        "thinking",
        "redacted_thinking",
    }
)
ROLES = frozenset({"user", "assistant", "system"})
EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")  # AnthropicOutputConfig.effort
SERVER_TOOLS = {  # _tool_discriminator: type prefix -> the fixed names of AnthropicWebSearchTool & co
    "web_search_": ("web_search",),
    "computer_": ("computer",),
    "bash_": ("bash",),
    "text_editor_": ("str_replace_editor", "str_replace_based_edit_tool"),
}


@dataclass(frozen=True)
class Reasoning:
    """What the server's `--reasoning-parser` makes of Anthropic thinking (serving_chat.py):
    - `wrap`: `wrap_reasoning_history`'s think tokens (start with its self label, end) around a past thinking,
      None when no detector is configured (the thinking is dropped, `_convert_assistant_thinking_blocks`);
    - `native`: `supports_native_reasoning_history` (a response-template detector whose template reads
      `reasoning_content`): the thinking goes there instead;
    - `toggle`: the template kwarg `apply_reasoning_enabled` sets to the `thinking` switch;
    - `always_on`: an always-on parser: `disabled` is refused, `enabled` changes nothing.
    A parser that is None refuses `thinking: enabled` and ignores `disabled`."""

    parser: str | None = None
    wrap: tuple[str, str] | None = None
    native: bool = False
    toggle: str | None = None
    always_on: bool = False


NO_PARSER = Reasoning()
# The parsers modelled, as SGLang 0.5.23 sets them up for their models' own templates (parser/reasoning_parser.py
# detectors: think tokens, `reasoning_default`; the template's ReasoningToggleConfig): Qwen3's switch is
# `enable_thinking`, DeepSeek-R1 and gpt-oss are always on.
PARSERS: dict[str | None, Reasoning] = {
    None: NO_PARSER,
    "qwen3": Reasoning("qwen3", ("<think>", "</think>"), toggle="enable_thinking"),
    "deepseek-r1": Reasoning("deepseek-r1", ("<think>", "</think>"), always_on=True),
    "gpt-oss": Reasoning("gpt-oss", ("<|channel|>analysis<|message|>", "<|end|>"), always_on=True),
}

# parser/template_detection.py REASONING_MODE_RULES `enable_thinking_default_true` (Qwen3's switch), textual.
_QWEN3_SWITCH = (
    r"{%\s*if\s+not\s+enable_thinking\s+is\s+defined\s*%}.*?{%\s*set\s+enable_thinking\s*=\s*(?:true|True)\s*%}",
    r"set\s+enable_thinking\s*=\s*enable_thinking\s+if\s+enable_thinking\s+is\s+defined\s+else\s+(?:true|True)",
    r"enable_thinking\s+is\s+defined\s+and\s+(?:enable_thinking\s+is\s+false|not\s+enable_thinking)",
    r"enable_thinking\s+is\s+not\s+defined\s+or\s+enable_thinking",
    r"namespace\([^)]*enable_thinking\s*=\s*true",
)


def documented_parser(template: str | None) -> str | None:
    """The reasoning parser SGLang's docs give for the model whose template this is, by the signals SGLang's
    own detection reads (template_detection.py `_is_gpt_oss`, `_is_qwen3` through the `enable_thinking`
    default-on switch, `_is_deepseek_r1_think_tags`), for the three parsers modelled; None otherwise.
    islwatch is not told the server's `--reasoning-parser`: this is its assumption. A reasoning model served
    without one (or with another) converts thinking otherwise (`Reasoning`)."""
    if not template:
        return None
    if "<|channel|>" in template:
        return "gpt-oss"
    if any(re.search(p, template, re.DOTALL) for p in _QWEN3_SWITCH):
        return "qwen3"
    if "<think>" in template or "</think>" in template:
        return "deepseek-r1"
    return None


def template_inline_system(template: str | None) -> bool:
    """template_detection.py `detect_inline_system_support`: a [system, user, system, user] conversation
    rendered by the bare template in jinja2's sandbox shows the second system's text. False (SGLang merges
    every system message into the leading one) when it drops it, raises, or there is no template."""
    if not template:
        return False
    sentinel = "__sglang_inline_system_sentinel__"
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    turns = (("system", "t"), ("user", "t"), ("system", sentinel), ("user", "t"))
    try:
        rendered = env.from_string(template).render(
            messages=[{"role": r, "content": c} for r, c in turns], add_generation_prompt=False
        )
    except Exception:  # SGLang: any exception is "not supported"
        return False
    return sentinel in rendered


def _refuse(why: str) -> ServerRefuses:
    return ServerRefuses(REFUSES + why)


def _str(value: Any, name: str, optional: bool = True) -> Any:
    if (value is None and optional) or isinstance(value, str):
        return value
    raise _refuse(f"{name} is not a string")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """`list[AnthropicContentBlock]`, discriminated by `type`: each block checked as its model checks it."""
    if not isinstance(content, list):
        raise _refuse(f"{where} is neither a string nor a list of blocks")
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in BLOCK_TYPES:
            raise _refuse(f"{where} has a block of an unknown type")
        assert isinstance(block, dict)
        if kind == "text":
            _str(block.get("text"), "a text block's text", optional=False)
        elif kind == "image":
            if block.get("source") is not None and not isinstance(block["source"], (dict, str)):
                raise _refuse("an image source is neither an object nor a string")
        elif kind == "tool_use":
            _str(block.get("id"), "a tool_use id", optional=False)
            _str(block.get("name"), "a tool_use name", optional=False)
            if "input" in block and not isinstance(block["input"], dict):
                raise _refuse("a tool_use input is not an object")
        elif kind == "tool_result":
            _str(block.get("tool_use_id"), "a tool_result tool_use_id")
            _str(block.get("id"), "a tool_result id")
            if block.get("content") is not None and not isinstance(block["content"], str):
                _blocks(block["content"], "a tool_result's content")
            if block.get("is_error") is not None:
                lax_bool(block["is_error"], "is_error")
        elif kind == "tool_reference":
            for key in ("name", "tool_name", "id"):
                _str(block.get(key), f"a tool_reference {key}")
        elif kind == "search_result":
            if block.get("source") is not None and not isinstance(block["source"], (dict, str)):
                raise _refuse("a search_result source is neither an object nor a string")
            _str(block.get("title"), "a search_result title")
            items = block.get("content")
            if items is not None and not (
                isinstance(items, list) and all(isinstance(i, dict) for i in items)
            ):
                raise _refuse("a search_result content is not a list of objects")
        elif kind == "thinking":
            _str(block.get("thinking"), "a thinking block's thinking", optional=False)
            _str(block.get("signature"), "a thinking signature")
        else:  # redacted_thinking
            _str(block.get("data"), "a redacted_thinking data")
    return content


def _tool(tool: Any) -> None:
    """`AnthropicTool`: `_tool_discriminator` picks the model by `type` (absent or "custom": a custom tool
    with a name and an object input_schema; a server tool family by its prefix, with its fixed name)."""
    if not isinstance(tool, dict):
        raise _refuse("a tool is not an object")
    kind = tool.get("type")
    for prefix, names in SERVER_TOOLS.items():
        if isinstance(kind, str) and kind.startswith(prefix):
            if not re.fullmatch(re.escape(prefix) + r"\d{8}", kind):
                raise _refuse("a server tool's type is not a dated version")
            if tool.get("name", names[0]) not in names:
                raise _refuse("a server tool's name is not its family's")
            _str(tool.get("description"), "a tool description")
            return
    if kind not in (None, "custom"):
        raise _refuse("a tool's type is neither custom nor a server tool")
    _str(tool.get("name"), "a tool name", optional=False)
    _str(tool.get("description"), "a tool description")
    if not isinstance(tool.get("input_schema"), dict):
        raise _refuse("a tool's input_schema is not an object")
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None or (key == "strict" and key in tool):
            lax_bool(tool[key], key)


def _thinking(thinking: Any) -> None:
    """AnthropicThinkingParam `_validate_thinking_shape`."""
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
        raise _refuse("thinking.type is not enabled, disabled or adaptive")
    budget = thinking.get("budget_tokens")
    budget = None if budget is None else lax_int(budget, "thinking.budget_tokens")
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise _refuse("thinking.display is not summarized or omitted")
    kind = thinking["type"]
    if kind == "enabled" and (budget is None or budget < 1024):
        raise _refuse("thinking.budget_tokens must be >= 1024")
    if kind != "enabled" and budget is not None:
        raise _refuse(f"thinking.budget_tokens is not allowed when thinking.type is '{kind}'")
    if kind == "disabled" and thinking.get("display") is not None:
        raise _refuse("thinking.display is not allowed when thinking.type is 'disabled'")


def _output_config(config: Any) -> None:
    """AnthropicOutputConfig: effort, task_budget, format."""
    if not isinstance(config, dict):
        raise _refuse("output_config is not an object")
    if config.get("effort") is not None and config["effort"] not in EFFORTS:
        raise _refuse("output_config.effort is not an effort")
    budget = config.get("task_budget")
    if budget is not None:
        if not isinstance(budget, dict) or budget.get("type") != "tokens" or "total" not in budget:
            raise _refuse("output_config.task_budget is not a token budget")
        if lax_int(budget["total"], "task_budget.total") <= 0:
            raise _refuse("output_config.task_budget.total must be positive")
        if budget.get("remaining") is not None and lax_int(budget["remaining"], "task_budget.remaining") < 0:
            raise _refuse("output_config.task_budget.remaining is negative")
    fmt = config.get("format")
    if fmt is not None and (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        raise _refuse("output_config.format is not a json_schema format")


def _str_list(value: Any, name: str) -> None:
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise _refuse(f"{name} is not a list of strings")


def validate(body: Any, count_tokens: bool) -> dict[str, Any]:
    """What `AnthropicMessagesRequest` / `AnthropicCountTokensRequest` refuse (pydantic: a 400). count_tokens
    builds an `AnthropicMessagesRequest` of its fields (`handle_count_tokens`), so an empty model is refused
    there too (`_validate_model`); its other fields (max_tokens, sampling) are not read."""
    if not isinstance(body, dict):
        raise _refuse("the body is not an object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise _refuse("model is missing")
    if not count_tokens:
        if "max_tokens" not in body or lax_int(body["max_tokens"], "max_tokens") <= 0:
            raise _refuse("max_tokens must be positive")
        for name in ("temperature", "top_p"):
            if body.get(name) is not None:
                lax_float(body[name], name)
        for name in ("top_k", "routed_dp_rank", "disagg_prefill_dp_rank"):
            if body.get(name) is not None:
                lax_int(body[name], name)
        if body.get("stream") is not None:
            lax_bool(body["stream"], "stream")
        if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
            raise _refuse("metadata is not an object")
        _str_list(body.get("stop_sequences"), "stop_sequences")
    _str_list(body.get("betas"), "betas")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _refuse("messages is not a list")
    for msg in messages:
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise _refuse("a message's role is not user, assistant or system")
        if not isinstance(msg.get("content"), str):
            _blocks(msg.get("content"), "a message's content")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _blocks(system, "system")
    if body.get("thinking") is not None:
        _thinking(body["thinking"])
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
            raise _refuse("tool_choice.type is not auto, any, tool or none")
        _str(choice.get("name"), "tool_choice.name")
        if "disable_parallel_tool_use" in choice:
            lax_bool(choice["disable_parallel_tool_use"], "disable_parallel_tool_use")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise _refuse("tools is not a list")
        for tool in tools:
            _tool(tool)
    if body.get("output_config") is not None:
        _output_config(body["output_config"])
    return body


def _image_part(source: Any) -> dict[str, Any] | None:
    """`_convert_anthropic_image_source_to_openai_part`: base64 data as a data URL, else a URL; else nothing."""
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        data = source.get("data")
        if not data:  # a base64 source without data converts to nothing
            return None
        return {
            "type": "image_url",
            "image_url": {"url": f"data:{source.get('media_type', 'image/png')};base64,{data}"},
        }
    url = source.get("url")
    return {"type": "image_url", "image_url": {"url": url}} if url else None


def _search_text(item: dict[str, Any]) -> str:
    """`_text_from_search_result`: title, source, then the text items of its content, one line each."""
    lines = []
    if item.get("title"):
        lines.append(f"Title: {item['title']}")
    source = item.get("source")
    if isinstance(source, dict):
        if text := source.get("url") or source.get("text"):
            lines.append(f"Source: {text}")
    elif source:
        lines.append(f"Source: {source}")
    content = item.get("content")
    texts = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        texts = [
            p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and p.get("text")
        ]
    if texts:
        lines.append("Content: " + "\n".join(texts))
    return "\n".join(lines)


def _tool_result(content: Any) -> tuple[list[Any], str]:
    """`_convert_tool_result_content`: the tool messages' contents (runs of tool references apart from the
    rest, a lone text part as its string) and the result's text (its text items joined with "\\n")."""
    if not isinstance(content, list):
        text = str(content) if content else ""
        return [text], text
    parts: list[dict[str, Any]] = []
    texts: list[str] = []
    for item in content:
        kind = item.get("type")
        if kind == "text" and item.get("text"):
            texts.append(item["text"])
            parts.append({"type": "text", "text": item["text"]})
        elif kind == "image" and (image := _image_part(item.get("source"))) is not None:
            parts.append(image)
        elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
            parts.append({"type": "tool_reference", "name": name})
        elif kind == "search_result" and (search := _search_text(item)):
            texts.append(search)
            parts.append({"type": "text", "text": search})
    groups: list[list[dict[str, Any]]] = []
    for part in parts:
        reference = part["type"] == "tool_reference"
        if not groups or (groups[-1][0]["type"] == "tool_reference") != reference:
            groups.append([])
        groups[-1].append(part)
    contents: list[Any] = [g[0]["text"] if len(g) == 1 and g[0]["type"] == "text" else g for g in groups]
    return contents or [""], "\n".join(texts)


def _thinking_history(blocks: list[dict[str, Any]], reasoning: Reasoning) -> tuple[str | None, str | None]:
    """`_convert_assistant_thinking_blocks`: (reasoning_content, text), at most one set."""
    if any(b["type"] == "redacted_thinking" for b in blocks):
        raise _refuse("Anthropic redacted_thinking history is not supported")
    thoughts = [b["thinking"] for b in blocks if b["type"] == "thinking" and b["thinking"]]
    if not thoughts:
        return None, None
    text = "\n".join(thoughts)
    if reasoning.native:
        return text, None
    if reasoning.wrap is None:  # wrap_reasoning_history raises without a detector: the history is dropped
        return None, None
    start, end = reasoning.wrap
    return None, f"{start}{text}\n{end}"


def _message(msg: dict[str, Any], reasoning: Reasoning, out: list[dict[str, Any]]) -> None:
    """One message of the conversion loop, its block list converted in order."""
    role = msg["role"]
    chat: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    if role == "assistant":
        reasoning_content, history = _thinking_history(msg["content"], reasoning)
        if reasoning_content is not None:
            chat["reasoning_content"] = reasoning_content
        if history is not None:
            parts.append({"type": "text", "text": history})
    for b in msg["content"]:
        kind = b["type"]
        if kind == "text":  # `is not None`: an empty text is kept
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image" and b.get("source") and (image := _image_part(b["source"])) is not None:
            parts.append(image)
        elif kind == "search_result" and (search := _search_text(b)):
            parts.append({"type": "text", "text": search})
        elif kind == "tool_use":
            call_id = b["id"] or f"call_{uuid.uuid4().hex}"  # random for an empty id: its count may vary
            arguments = json.dumps(b.get("input") or {})
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": b["name"], "arguments": arguments}}
            )
        elif kind == "tool_result":
            contents, text = _tool_result(b.get("content"))
            call_id = b.get("tool_use_id") or b.get("id") or ""
            if role == "user":  # `_emit_user_message`: the text before it first, in wire order
                _flush(parts, out)
                out.extend({"role": "tool", "tool_call_id": call_id, "content": c} for c in contents)
            else:
                parts.append({"type": "text", "text": f"Tool result: {text}"})
        # thinking, redacted_thinking (above), tool_reference: nothing here
    if calls:
        chat["tool_calls"] = calls
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
        out.append(chat)
    elif calls:
        out.append(chat)
    elif role != "user":  # an empty assistant (or system) turn keeps its place with ""
        out.append({**chat, "content": ""})


def _flush(parts: list[dict[str, Any]], out: list[dict[str, Any]]) -> None:
    """`_emit_user_message`: the parts so far as a user message (a lone text as its string), then none."""
    if parts:
        lone = len(parts) == 1 and parts[0]["type"] == "text"
        out.append({"role": "user", "content": parts[0]["text"] if lone else list(parts)})
        parts.clear()


def _system_text(content: Any) -> str | None:
    """`_extract_system_text`: an inline system message's text, trimmed (its text blocks each trimmed, the
    non-empty ones joined with "\\n"), None when empty."""
    if isinstance(content, str):
        return content.strip() or None
    texts = [t for b in content if b["type"] == "text" and (t := b["text"].strip())]
    return "\n".join(texts) if texts else None


def _reasoning_switch(chat: dict[str, Any], enabled: bool, reasoning: Reasoning) -> None:
    """serving_chat.py `apply_reasoning_enabled` for the parsers modelled."""
    if reasoning.parser is None:
        if enabled:
            raise _refuse("Anthropic thinking is not supported for models without a reasoning parser")
        return
    if reasoning.always_on:
        if not enabled:
            raise _refuse("the reasoning parser is always-on and cannot be disabled")
        return
    if reasoning.toggle is None:
        if enabled:
            raise _refuse("Anthropic thinking is not supported for this reasoning parser")
        return
    chat["chat_template_kwargs"] = {**chat.get("chat_template_kwargs", {}), reasoning.toggle: enabled}


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The custom tools as chat function tools (`Tool`), server tools dropped."""
    out = []
    for tool in body.get("tools") or []:
        kind = tool.get("type")
        if isinstance(kind, str) and kind.startswith(tuple(SERVER_TOOLS)):
            continue
        schema = (
            tool["input_schema"]
            if "type" in tool["input_schema"]
            else {**tool["input_schema"], "type": "object"}
        )
        strict = lax_bool(tool["strict"], "strict") if tool.get("strict") is not None else False
        defer = (
            None if tool.get("defer_loading") is None else lax_bool(tool["defer_loading"], "defer_loading")
        )
        function = {
            "name": tool["name"],
            "description": tool.get("description") or "",
            "parameters": schema,
            "strict": strict,
        }
        out.append({"type": "function", "defer_loading": defer, "function": function})
    return out


def without_media(chat: dict[str, Any]) -> dict[str, Any]:
    """The chat body with its image parts left out: what a template that takes content as a string renders of
    them (`process_content_for_template_format` joins the text parts alone). count_tokens skips
    `_validate_request` (`handle_count_tokens` calls `_process_messages` directly), so a text-only model
    counts an image block as nothing where /v1/messages refuses it (`_validate_media_content`)."""
    messages = [
        {**m, "content": [p for p in m["content"] if p.get("type") != "image_url"]}
        if isinstance(m.get("content"), list)
        else m
        for m in chat["messages"]
    ]
    return {**chat, "messages": messages}


def messages_as_chat(
    body: Any, count_tokens: bool, merge_inline_system: bool = False, reasoning: Reasoning = NO_PARSER
) -> dict[str, Any]:
    """The chat request SGLang serves for a Messages (or count_tokens) request
    (`_convert_to_chat_completion_request`)."""
    validate(body, count_tokens)
    out: list[dict[str, Any]] = []
    system: list[str] = []
    top = body.get("system")
    if isinstance(top, str) and top.strip():
        system.append(top)  # kept as sent: only the test is on the trimmed text
    elif isinstance(top, list):
        system += [b["text"] for b in top if b["type"] == "text" and b["text"]]
    if merge_inline_system:
        system += [t for m in body["messages"] if m["role"] == "system" and (t := _system_text(m["content"]))]
    if system:
        out.append({"role": "system", "content": "\n".join(system)})
    for msg in body["messages"]:
        if msg["role"] == "system" and merge_inline_system:
            continue
        if isinstance(msg["content"], str):
            out.append({"role": msg["role"], "content": msg["content"]})
        else:
            _message(msg, reasoning, out)
    chat: dict[str, Any] = {"model": body["model"], "messages": out}
    thinking = body.get("thinking")
    if thinking is not None:
        _reasoning_switch(chat, thinking["type"] != "disabled", reasoning)
    config = body.get("output_config")
    if isinstance(config, dict) and config.get("effort") is not None:
        # Set on the built request, after its validators ran: `reasoning_effort` without the thinking kwargs
        # `normalize_reasoning_inputs` would add. In the kwargs the chat path takes it out the same way.
        effort = "max" if config["effort"] == "xhigh" else config["effort"]
        chat["chat_template_kwargs"] = {**chat.get("chat_template_kwargs", {}), "reasoning_effort": effort}
    tools = _tools(body)
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat["parallel_tool_calls"] = not lax_bool(
            choice.get("disable_parallel_tool_use", False), "disable_parallel_tool_use"
        )
        kind = choice["type"]
        if kind == "none":
            chat["tool_choice"] = "none"
        elif tools:
            if kind == "tool" and not any(t["function"]["name"] == choice.get("name") for t in tools):
                raise _refuse("tool_choice references a tool that is not in the forwarded tools list")
            named = {"type": "function", "function": {"name": choice.get("name")}}
            chat["tool_choice"] = {"auto": "auto", "any": "required", "tool": named}[kind]
        elif kind in ("any", "tool"):
            raise _refuse(f"tool_choice={kind!r} requires at least one custom tool")
        else:  # auto without a tool to call: the request model's default stands ("none")
            chat["tool_choice"] = "none"
    elif tools:
        chat["tool_choice"] = "auto"
    return chat
