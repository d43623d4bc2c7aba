"""gpt-oss prompts exactly as vLLM 0.32 builds them with Harmony: the prompt token ids of a request body.

vLLM ignores the Jinja chat template for `model_type == "gpt_oss"` and renders with the `openai_harmony`
library (the oss-harmony fork, 0.0.11, that vLLM 0.32 requires): `vllm/renderers/online_renderer.py`
`render_chat` -> `_make_request_with_harmony` for chat completions, `_render_responses_with_harmony` for the
Responses API, with helpers in `vllm/entrypoints/openai/parser/harmony_utils.py` (cited as hu:LINE) and
`vllm/entrypoints/openai/responses/harmony.py` (cited as rh:LINE). This module builds the same Harmony
`Message`s with the library's own classes and lets the library render them; it restates only vLLM's choices:
- the system message: the default identity, the reasoning effort (low / medium / high; `none`, `minimal`,
  `xhigh` and `max` pass the request model but vLLM answers 400), the start date (hu:104-148);
- a leading system or developer message is taken out and its text (parts joined with "", not "\\n") becomes
  the developer message's instructions, beside the function tools; no developer message without either
  (hu:282-349); later system / developer messages become developer messages (hu:204, 436-440);
- assistant turns: with tool calls, text goes to commentary before the reasoning (analysis) and the calls
  (commentary, to=functions.NAME, json); without, reasoning to analysis and text to final, read from the
  first part only (hu:367-435); analysis before the last final message is dropped (hu:230-258);
- tool results are named after the call whose id they answer, anywhere in the conversation, else
  `functions.` (hu:210-227, 397-410);
- prior tool calls keep the legacy header `assistant to=functions.f<|channel|>commentary json` (hu:461-525).
Pure but for loading the encoding (core/renderers/harmony_vocab.py). Where vLLM answers 400 it raises
`messages.ServerRefuses` (reason `REFUSES` + words that quote nothing of the body); where vLLM fails with
500 (its code calls `.get` on a string part, Harmony cannot render), `InvalidBody("vllm answers 500: ...")`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from openai_harmony import (  # type: ignore[import-untyped]
    Author,
    Conversation,
    DeveloperContent,
    HarmonyError,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    TextContent,
    ToolDescription,
)

from ..messages import InvalidBody
from ..tokenizer import TokenizerLoadError
from .harmony_request import (
    ChatRequest,
    FunctionTool,
    Lazy,
    ResponsesRequest,
    chat_request,
    fails,
    refuse,
    responses_request,
)
from .harmony_vocab import harmony_encoding, vocab_dir

# hu:68 REASONING_EFFORT: the only efforts Harmony renders.
REASONING_EFFORT = {
    "high": ReasoningEffort.HIGH,
    "medium": ReasoningEffort.MEDIUM,
    "low": ReasoningEffort.LOW,
}
# hu:80 BUILTIN_TOOL_TO_MCP_SERVER_LABEL values: tool types the developer message passes over.
BUILTIN_TOOL_TYPES = frozenset({"code_interpreter", "web_search_preview", "container"})


@dataclass(frozen=True)
class HarmonyServer:
    """How the vLLM server was started, where that changes a gpt-oss prompt."""

    # VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS=1: instructions join the system message's model identity
    # instead of the developer message (hu:117-122, 170, 204-207, 327-330).
    system_instructions: bool = False
    # --exclude-tools-when-tool-choice-none: a chat request's tools are left out for tool_choice "none".
    exclude_tools_when_tool_choice_none: bool = False


# --- Harmony messages, as harmony_utils.py builds them -----------------------------------------------------


def flatten_text(content: Any) -> str | None:
    """hu:261 flatten_input_text_content: text parts joined with "", None without any (or not a list)."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [p if isinstance(p, str) else p["text"] for p in content if isinstance(p, str) or _texty(p)]
    return "".join(texts) if texts else None


def _texty(part: Any) -> bool:
    return isinstance(part, dict) and part.get("text") is not None


def text_contents(content: Any) -> list[Any]:
    """A string as one text, a list as one text per part (its `text`, else "") (hu:423-427, rh:137-141)."""
    if isinstance(content, str):
        return [TextContent(text=content)]
    if isinstance(content, Lazy):  # pydantic validates the parts now, as openai's types: none passes
        if content.parts:
            raise refuse("content parts of no type the message's role accepts")
        return []
    if not all(isinstance(p, dict) for p in content):
        raise fails("a string content part (vLLM calls .get on it)")
    return [TextContent(text=p.get("text", "")) for p in content]


def system_message(
    server: HarmonyServer, start_date: str, effort: str | None, instructions: str | None
) -> Any:
    """hu:104 get_system_message (no model identity, no built-in tool descriptions: vLLM passes none)."""
    content = SystemContent.new()
    if instructions is not None and server.system_instructions:
        identity = content.model_identity
        content = content.with_model_identity(f"{identity}\n{instructions}" if identity else instructions)
    if effort is not None:
        if effort not in REASONING_EFFORT:
            raise refuse("reasoning effort Harmony does not support (low, medium, high)")
        content = content.with_reasoning_effort(REASONING_EFFORT[effort])
    return Message.from_role_and_content(Role.SYSTEM, content.with_conversation_start_date(start_date))


def developer_message(
    server: HarmonyServer, instructions: str | None, tools: list[FunctionTool] | None
) -> Any:
    """hu:165 get_developer_message; tools as hu:151 create_tool_definition describes them."""
    content = DeveloperContent.new()
    if instructions is not None and not server.system_instructions:
        content = content.with_instructions(instructions)
    functions = []
    for tool in tools or ():
        if tool.kind in BUILTIN_TOOL_TYPES:
            continue
        if tool.kind != "function":
            raise refuse("a tool type Harmony does not support beside function tools")
        functions.append(ToolDescription.new(tool.name, tool.description or "", parameters=tool.parameters))
    if functions:
        content = content.with_function_tools(functions)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def system_or_developer(server: HarmonyServer, start_date: str, role: str, instructions: str) -> Any:
    """hu:204 get_system_or_developer_message."""
    if role == "system" and server.system_instructions:
        return system_message(server, start_date, None, instructions)
    return developer_message(server, instructions, None)


def preamble(
    server: HarmonyServer,
    start_date: str,
    instructions: str | None,
    tools: list[FunctionTool] | None,
    effort: str | None,
) -> list[Any]:
    """hu:315 build_harmony_preamble."""
    developer_instructions = None if server.system_instructions else instructions
    out = [system_message(server, start_date, effort, instructions if server.system_instructions else None)]
    if developer_instructions or tools:
        out.append(developer_message(server, developer_instructions, tools))
    return out


def leading_instructions(items: list[Any]) -> tuple[str | None, list[Any]]:
    """hu:282 extract_instructions_from_messages: a first system or developer message is taken out (even one
    without text) and its text becomes the instructions."""
    if not items or items[0].get("role") not in ("system", "developer"):
        return None, list(items)
    return flatten_text(items[0].get("content")), list(items[1:])


def analysis(text: Any) -> Any:
    return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")


def tool_call(function: dict[str, Any]) -> Any:
    """A prior tool call (hu:383-394, rh:100-108, rh:208-212)."""
    msg = Message.from_role_and_content(Role.ASSISTANT, function.get("arguments", "") or "")
    return (
        msg.with_channel("commentary")
        .with_recipient(f"functions.{function.get('name', '')}")
        .with_content_type("json")
    )


def tool_result(name: str, content: Any) -> Any:
    msg = Message.from_author_and_content(Author.new(Role.TOOL, name), content)
    return msg.with_channel("commentary").with_recipient("assistant")


def chat_message(
    server: HarmonyServer, start_date: str, msg: dict[str, Any], names: dict[Any, Any]
) -> list[Any]:
    """hu:352 parse_chat_input_to_harmony_message."""
    role = msg.get("role")
    calls = msg.get("tool_calls", [])
    if role == "assistant" and calls:
        out = []
        text = flatten_text(msg.get("content"))
        if text:
            out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
        if msg.get("reasoning"):
            out.append(analysis(msg["reasoning"]))
        return out + [tool_call(call.get("function", {})) for call in calls]
    if role == "tool":
        name = names.get(msg.get("tool_call_id", ""), "")
        return [tool_result(f"functions.{name}", flatten_text(msg.get("content")) or "")]
    out = [analysis(msg["reasoning"])] if role == "assistant" and msg.get("reasoning") else []
    contents = text_contents(msg.get("content") or "")
    if role == "assistant":
        if contents and contents[0].text:
            out.append(Message.from_role_and_contents(role, contents).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = flatten_text(msg.get("content"))
        if instructions is not None:
            out.append(system_or_developer(server, start_date, role, instructions))
    else:
        out.append(Message.from_role_and_contents(role, contents))  # an unknown role: pydantic refuses, 400
    return out


def chat_messages(server: HarmonyServer, request: ChatRequest, start_date: str) -> list[Any]:
    """online_renderer.py _make_request_with_harmony, after the prompt-id reuse."""
    instructions, rest = leading_instructions(request.messages)
    if request.effort == "none":
        raise refuse("reasoning effort none (Harmony does not support it)")
    out = preamble(server, start_date, instructions, request.tools, request.effort)
    # hu:210 parse_chat_inputs_to_harmony_messages: tool call ids named from every message's calls.
    names: dict[Any, Any] = {}
    for msg in rest:
        calls = msg.get("tool_calls", [])
        if calls is None:
            raise refuse("tool_calls null on a message that is not the assistant's")  # iterating None
        for call in calls:
            names[call.get("id")] = call.get("function", {}).get("name")
    return out + [m for msg in rest for m in chat_message(server, start_date, msg, names)]


# --- The Responses API (online_renderer.py _render_responses_with_harmony, rh) ----------------------------


def response_item_message(
    server: HarmonyServer, start_date: str, item: dict[str, Any], calls: list[Any]
) -> Any:
    """rh:151 response_input_to_harmony; `calls` are the function_call items before this one."""
    kind = item.get("type")
    if kind in (None, "message"):
        role, content = item["role"], item["content"]
        if role in ("system", "developer"):
            text = flatten_text(content)
            return system_or_developer(server, start_date, role, text) if text else None
        if isinstance(content, str):
            msg = Message.from_role_and_content(role, content)
        else:
            msg = Message.from_role_and_contents(role, text_contents(content))
        return msg.with_channel("final") if role == "assistant" else msg
    if kind == "function_call_output":
        call = next((c for c in reversed(calls) if c["call_id"] == item["call_id"]), None)
        if call is None:
            raise refuse("function_call_output answers no earlier function_call")
        if not isinstance(item["output"], str):
            raise refuse("function_call_output with a list output")  # the library's Message refuses it
        return tool_result(f"functions.{call['name']}", item["output"])
    if kind == "reasoning":
        content = item.get("content")
        return analysis("\n".join(part["text"] for part in content)) if content else None
    return tool_call(item)  # function_call


def previous_message(server: HarmonyServer, start_date: str, msg: dict[str, Any]) -> list[Any]:
    """rh:221 response_previous_input_to_harmony (a Harmony-shaped or a chat-shaped message)."""
    if isinstance(msg.get("author"), dict):
        author = msg["author"]
        raw = msg.get("content", "")
        if isinstance(raw, list):
            contents = text_contents(raw)
        else:
            contents = [TextContent(text=raw if isinstance(raw, str) else "")]
        role = Role(author.get("role"))  # ValueError for an unknown role: 400
        name = author.get("name")
        out = (
            Message(author=Author.new(role, name), content=contents)
            if name
            else Message.from_role_and_contents(role, contents)
        )
        for key, step in (("channel", out.with_channel), ("recipient", out.with_recipient)):
            if msg.get(key):
                out = step(msg[key])
        return [out.with_content_type(msg["content_type"]) if msg.get("content_type") else out]
    role = msg.get("role")
    if role is None:
        raise refuse("previous message without a role")
    if role == "assistant" and msg.get("tool_calls"):
        return [tool_call(call.get("function", {})) for call in msg["tool_calls"]]
    if role == "tool":
        name = msg.get("name", "")
        name = f"functions.{name}" if name and not name.startswith("functions.") else name
        return [tool_result(name, flatten_text(msg.get("content")) or "")]
    if role in ("system", "developer"):
        return []  # construct_harmony_previous_input_messages drops them (rh:237-261)
    return [Message.from_role_and_contents(role, text_contents(msg.get("content", "")))]


def responses_messages(server: HarmonyServer, request: ResponsesRequest, start_date: str) -> list[Any]:
    items = request.input
    instructions = request.instructions
    if instructions is None and isinstance(items, list):
        instructions, items = leading_instructions(items)
    # extract_tool_types / has_custom_tools: an MCP tool counts only by an allow-listed built-in label.
    custom = any(t.kind not in BUILTIN_TOOL_TYPES and t.kind != "mcp" for t in request.tools)
    out = preamble(server, start_date, instructions, request.tools if custom else None, request.effort)
    for msg in request.previous or ():
        out += [
            m
            for m in previous_message(server, start_date, msg)
            if m.author.role not in ("system", "developer")
        ]
    if isinstance(items, str):
        if items or not request.previous:
            out.append(Message.from_role_and_content(Role.USER, items))
        return out
    calls: list[dict[str, Any]] = []
    for item in items:
        msg = response_item_message(server, start_date, item, calls)
        if msg is not None:
            out.append(msg)
        if item.get("type") == "function_call":
            calls.append(item)
    return out


# --- Rendering (hu:449 render_for_completion) --------------------------------------------------------------


def drop_old_analysis(messages: list[Any]) -> list[Any]:
    """hu:230 auto_drop_analysis_messages: analysis before the last final message goes."""
    last_final = -1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].author.role == "assistant" and messages[i].channel == "final":
            last_final = i
            break
    return [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]


def legacy_tool_call_headers(encoding: Any, ids: list[int]) -> list[int]:
    """hu:461 _use_legacy_tool_call_headers, step for step: oss-harmony writes a prior call's header as
    `assistant<|channel|>commentary to=R <|constrain|>T`; vLLM rewrites it `assistant to=R<|channel|>commentary T`."""
    start, channel, constrain, message = (
        encoding.encode(t, allowed_special="all")[0]
        for t in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>")
    )
    out = list(ids)
    i = 0
    while i < len(out):
        if out[i] != start:
            i += 1
            continue
        try:
            end = out.index(message, i + 1)
            at_channel = out.index(channel, i + 1, end)
            at_constrain = out.index(constrain, at_channel + 1, end)
        except ValueError:
            i += 1
            continue
        author = encoding.decode(out[i + 1 : at_channel])
        channel_and_recipient = encoding.decode(out[at_channel + 1 : at_constrain])
        content_type = encoding.decode(out[at_constrain + 1 : end])
        if (
            author != "assistant"
            or " to=" not in channel_and_recipient
            or not channel_and_recipient.endswith(" ")
        ):
            i = end + 1
            continue
        chan, recipient = channel_and_recipient[:-1].split(" to=", 1)
        if not chan or not recipient or not content_type:
            i = end + 1
            continue
        header = [start, *encoding.encode(f"assistant to={recipient}"), channel]
        header += [*encoding.encode(f"{chan} {content_type}"), message]
        out[i : end + 1] = header
        i += len(header)
    return out


def render(encoding: Any, messages: list[Any]) -> list[int]:
    conversation = Conversation.from_messages(drop_old_analysis(messages))
    config = RenderConversationConfig(auto_drop_analysis=False)
    try:
        ids = encoding.render_conversation_for_completion(conversation, Role.ASSISTANT, config=config)
    except HarmonyError as exc:  # a RuntimeError: vLLM's handlers answer 500
        raise fails("Harmony cannot render the conversation") from exc
    return legacy_tool_call_headers(encoding, list(ids))


class HarmonyRenderer:
    """gpt-oss's prompt ids for chat-completions and Responses bodies, as a vLLM 0.32 server renders them.

    `start_date` is the date the server writes into the system message, YYYY-MM-DD: `VLLM_SYSTEM_START_DATE`
    when the server pins it, else the server's own clock, local time (`datetime.now().strftime("%Y-%m-%d")`,
    hu:134-139, read per request), which is UTC in a container with no TZ set."""

    def __init__(self, encoding: Any, server: HarmonyServer = HarmonyServer()) -> None:
        self.encoding = encoding
        self.server = server

    def harmony_chat_ids(self, body: Any, *, start_date: str) -> list[int]:
        request = chat_request(body, self.server.exclude_tools_when_tool_choice_none)
        if request.reused_ids is not None:
            return request.reused_ids
        with _library_refusals():
            messages = chat_messages(self.server, request, start_date)
        return render(self.encoding, messages)

    def harmony_responses_ids(self, body: Any, *, start_date: str) -> list[int]:
        request = responses_request(body)
        with _library_refusals():
            messages = responses_messages(self.server, request, start_date)
        return render(self.encoding, messages)


@contextmanager
def _library_refusals() -> Iterator[None]:
    """openai_harmony's pydantic models refuse a value (an unknown role, a non-string text) with a ValueError,
    and vLLM's code raises TypeError on a null it iterates: vLLM's handlers answer both with 400."""
    try:
        yield
    except InvalidBody:
        raise
    except (ValueError, TypeError) as exc:
        raise refuse(f"Harmony refuses a message ({type(exc).__name__})") from exc


def server_date(pinned: str | None, now: datetime | None = None) -> str:
    """The date a vLLM server writes into the system message (hu:134-139): `VLLM_SYSTEM_START_DATE` when set
    and not empty (vLLM takes any text as is), else the clock's date as `%Y-%m-%d`. vLLM reads its local
    clock; islwatch assumes UTC (a container's default) unless given `now`."""
    return pinned or (now or datetime.now(UTC)).strftime("%Y-%m-%d")


# How vLLM 0.32's oss-harmony (>= 0.0.10) writes a tool result's header, and a prior call's before vLLM
# rewrites it; openai-harmony 0.0.8 writes `functions.f to=assistant<|channel|>commentary` (other ids).
_RESULT_HEADER = "<|start|>functions.f<|channel|>commentary to=assistant<|message|>"
_CALL_HEADER = "<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>"


def check_library(encoding: Any) -> None:
    """Refuse an openai_harmony that renders tool turns otherwise than the one vLLM 0.32 installs."""
    messages = [Message.from_role_and_content(Role.USER, "q"), tool_call({"name": "f", "arguments": "{}"})]
    messages.append(tool_result("functions.f", "r"))
    config = RenderConversationConfig(auto_drop_analysis=False)
    text = encoding.decode(
        encoding.render_conversation_for_completion(
            Conversation.from_messages(messages), Role.ASSISTANT, config
        )
    )
    if _RESULT_HEADER not in text or _CALL_HEADER not in text:
        raise TokenizerLoadError("openai_harmony renders tool turns unlike oss-harmony 0.0.11 (vLLM 0.32's)")


def load_harmony(tokenizer_dir: Path, server: HarmonyServer = HarmonyServer()) -> HarmonyRenderer:
    """The renderer for a gpt-oss model folder: the vocabulary derived offline, the encoding loaded once, the
    library checked to render as vLLM's does."""
    encoding = harmony_encoding(vocab_dir(tokenizer_dir))
    check_library(encoding)
    return HarmonyRenderer(encoding, server)
