"""llama.cpp's `llama-server`: what it does to a chat request before its own Jinja engine renders the model's
template, for islwatch's `server_flavor: llama.cpp`. Pure functions; the tokenizer copy is made once, at load
time.

Modelled on llama.cpp 0.5.0-dev (commit 0c1e570, the llama-cpp-python 0.3.36 sdist) and checked against a
real llama-server on Qwen2.5, Llama-3, Qwen3 and gpt-oss (tests/interop). Each rule names its source:
- tools/server/server-common.cpp `oaicompat_chat_params_parse`: a final assistant message is continued
  (`--prefill-assistant`, the default, even when the client sent `continue_final_message: false`);
  `reasoning_effort` goes to the template kwargs ("none" turns thinking off instead); its 400s;
- common/chat.cpp `common_chat_msgs_parse_oaicompat` and `common_chat_msg::to_json_oaicompat`: each message
  is rebuilt from the fields llama.cpp reads (role, content, reasoning_content, name, tool_call_id,
  tool_calls): any other key (vLLM's `reasoning`, `thinking`) is dropped, a null or empty content is "",
  empty fields are left out, tool-call arguments are a JSON string;
- `messages_inp_normalizer::concat_content_parts`: text parts joined with "\\n", none before the first text
  when the text so far is empty (vLLM always writes one);
- `common_chat_templates_apply_jinja`: `developer` becomes `system`, but for gpt-oss's template;
- `common_chat_tools_parse_oaicompat` / `common_chat_tools_to_json_oaicompat`: tools rebuilt;
- common/parsers/gpt-oss.cpp `common_chat_params_init_gpt_oss`: a turn's reasoning_content is copied to
  `thinking` (the field gpt-oss's template reads) and its content erased when it has tool calls; a continued
  final turn always opens the analysis channel;
- `common_chat_templates_init`: gpt-oss's "<|channel|> in content" check and Mistral's empty-message check are
  patched out of the template;
- common/jinja/value.cpp `value_to_json`: floats printed with `std::ostream << double` (%g);
- src/llama-vocab.cpp: its BPE tokenizer applies no Unicode normalizer (`unnormalized`);
- its template: `--chat-template(-file)`, else the GGUF's `tokenizer.chat_template` (the tokenizer's; no
  processor template); its checks are its own, not vLLM's request model (`vllm_refusals` off);
- server-context.cpp `handle_completions_impl`: the usage of several prompts (`reported_prompt_tokens`).
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from proxy.runtime import compat

from ..count import CountResult, Encoder, count, not_counted
from ..endpoints import Endpoint
from ..extract import ChatInput
from ..messages import InvalidBody, ServerRefuses
from ..renderers import JINJA
from ..server_settings import DEFAULT_SETTINGS, ServerSettings
from ..tokens import iterates_content_parts
from . import llama_cpp_messages
from .served import ServedTemplates

REFUSES = "llama.cpp answers 400: "
FAILS = "llama.cpp answers 500: "  # not a refusal islwatch counts as one: an InvalidBody, as vLLM's 500s
# common_chat_try_specialized_template: a template with this marker is gpt-oss's (Harmony-like) format.
GPT_OSS_MARKER = "<|channel|>"

# common_chat_templates_init: checks llama.cpp's Jinja engine would trip over, replaced by `{%- if false %}`.
_TEMPLATE_PATCHES = (
    (
        GPT_OSS_MARKER,
        '{%- if "<|channel|>analysis<|message|>" in message.content or '
        '"<|channel|>final<|message|>" in message.content %}',
    ),
    (
        "[TOOL_CALLS]",
        "{%- if (message['content'] is none or message['content'] == '' or "
        "message['content']|length == 0) and (message['tool_calls'] is not defined or "
        "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
    ),
)


def cpp_number(x: float) -> float | int:
    """llama.cpp's Jinja engine prints floats with `std::ostream << double` (common/jinja/value.cpp,
    value_to_json): C's %g, 6 significant digits, no trailing ".0". Returns the Python number that
    json.dumps prints the same way (exponent forms of large numbers, e.g. 1.23457e+08, are not modelled)."""
    text = f"{x:g}"
    if "e" not in text and "." not in text and "inf" not in text and "nan" not in text:
        return int(text)
    return float(text)


def cpp_numbers(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value):
        return cpp_number(value)
    if isinstance(value, dict):
        return {k: cpp_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [cpp_numbers(v) for v in value]
    return value


def is_gpt_oss(template: str | None) -> bool:
    return template is not None and GPT_OSS_MARKER in template


def patched_template(template: str) -> str:
    """The template as llama-server keeps it (common_chat_templates_init)."""
    for marker, check in _TEMPLATE_PATCHES:
        if marker in template and check in template:
            template = template.replace(check, "{%- if false %}")
    return template


def llama_cpp_tools(tools: list[Any]) -> list[Any]:
    """common/chat.cpp common_chat_tools_parse_oaicompat + common_chat_tools_to_json_oaicompat: a tool is
    rebuilt as {"type": "function", "function": {"name", "description" (default ""), "parameters" (default
    {})}}; other keys (e.g. "strict") are dropped and the key order is fixed."""
    out: list[Any] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            out.append(tool)  # not a tool llama.cpp accepts; the core reports the body as invalid
            continue
        rebuilt = {
            "name": fn.get("name"),
            "description": fn.get("description", ""),
            "parameters": cpp_numbers(fn.get("parameters", {})),
        }
        out.append({"type": "function", "function": rebuilt})
    return out


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _joined(parts: list[dict[str, Any]]) -> str:
    """messages_inp_normalizer::concat_content_parts: "\\n" between texts, none while the text is empty."""
    text = ""
    for part in parts:
        text += ("\n" if text else "") + part["text"]
    return text


def _content(content: Any, parts_format: bool) -> Any:
    """to_json_oaicompat: a string as is, text parts joined for a template that reads a string, null or
    nothing "". Media parts are left to the core (their tokens are not modelled for llama.cpp)."""
    if content is None or content == []:
        return ""
    if isinstance(content, list) and all(_is_text_part(p) for p in content) and not parts_format:
        return _joined(content)
    return content


def _arguments(args: Any, objects: bool) -> Any:
    """A call's arguments as a JSON string (common_chat_msgs_parse_oaicompat dumps non-strings). For a
    template that reads them as an object (`objects`), llama.cpp parses them again (func_args_not_string;
    arguments that are not JSON are its 500) and prints their floats as %g."""
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    if not objects:
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        raise InvalidBody(FAILS + "tool-call arguments that are not JSON") from None
    return json.dumps(cpp_numbers(parsed), ensure_ascii=False)


def _tool_call(call: Any, objects: bool) -> Any:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return call  # not a call llama.cpp accepts; the core reports the body as invalid
    out: dict[str, Any] = {
        "type": "function",
        "function": {"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"), objects)},
    }
    if isinstance(call.get("id"), str) and call["id"]:
        out["id"] = call["id"]
    return out


def reads_object_arguments(template: str | None) -> bool:
    """Whether llama.cpp hands this template tool-call arguments as objects. llama.cpp decides by running
    the template on a probe conversation and watching whether an argument's value is read (common/jinja/
    caps.cpp `caps_get`, supports_object_arguments); islwatch approximates that by the template naming
    `arguments` at all (Qwen2.5, Qwen3 and gpt-oss do; Llama-3-Instruct's template writes no tool calls)."""
    return template is None or "arguments" in template


def llama_cpp_message(
    msg: Any, parts_format: bool = False, gpt_oss: bool = False, objects: bool = True
) -> Any:
    """One message as llama.cpp hands it to the template (module docstring)."""
    if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
        return msg  # the core reports the body as invalid
    role = msg["role"]
    if role == "developer" and not gpt_oss:  # workaround::map_developer_role_to_system
        role = "system"
    out: dict[str, Any] = {"role": role, "content": _content(msg.get("content"), parts_format)}
    reasoning = msg.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        out["reasoning_content"] = reasoning
    for key in ("name", "tool_call_id"):
        if isinstance(msg.get(key), str) and msg[key]:
            out[key] = msg[key]
    calls = msg.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_tool_call(c, objects) for c in calls]
        if gpt_oss and "reasoning_content" in out:  # gpt-oss.cpp: the reasoning is the turn's analysis
            out["content"] = ""
    elif calls is not None and not isinstance(calls, list):
        out["tool_calls"] = calls  # the core reports the body as invalid
    return out


def _refusals(messages: list[Any]) -> None:
    """oaicompat_chat_params_parse's 400s on the messages themselves."""
    for msg in messages:
        if not isinstance(msg, dict):
            continue
        if msg.get("role") != "assistant" and "content" not in msg:
            raise ServerRefuses(REFUSES + "a non-assistant message without content")
        if msg.get("role") == "assistant" and "content" not in msg and "tool_calls" not in msg:
            raise ServerRefuses(REFUSES + "an assistant message without content or tool_calls")


def _continued(body: dict[str, Any], messages: list[Any]) -> bool:
    """oaicompat_chat_params_parse: whether the final message is continued (and its 400s)."""
    flag = body.get("continue_final_message")
    continued = flag is True or flag in ("content", "reasoning_content")  # common_chat_continuation_parse
    gen = body.get("add_generation_prompt", True)
    gen = gen if isinstance(gen, bool) else True  # json_value: the default for a value of another type
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if not continued and last.get("role") == "assistant":  # --prefill-assistant (the default)
        before = messages[-2] if len(messages) >= 2 and isinstance(messages[-2], dict) else {}
        if before.get("role") == "assistant":
            raise ServerRefuses(REFUSES + "two or more assistant messages at the end")
        continued, gen = True, False
    if continued and gen:
        raise ServerRefuses(REFUSES + "both add_generation_prompt and continue_final_message")
    if continued and last.get("role") == "assistant" and last.get("tool_calls"):
        raise ServerRefuses(REFUSES + "continuing an assistant message with tool calls")
    return continued


def _template_kwargs(body: dict[str, Any]) -> Any:
    """The request's chat_template_kwargs with its reasoning_effort, as oaicompat_chat_params_parse merges
    them: "none" turns thinking off (the kwargs' own enable_thinking still wins in the template's context,
    common_chat_template_direct_apply_impl), any other effort is the kwarg `reasoning_effort`."""
    kwargs = body.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        return kwargs  # the core reports a kwargs that is not an object
    if isinstance(kwargs.get("enable_thinking"), str):
        raise ServerRefuses(REFUSES + "enable_thinking is not a boolean")
    effort = body.get("reasoning_effort")
    if not isinstance(effort, str) or not effort:  # json_value: "" for a value of another type
        return kwargs
    kwargs = dict(kwargs)
    if effort == "none":
        kwargs.pop("reasoning_effort", None)
        kwargs.setdefault("enable_thinking", False)
    else:
        kwargs["reasoning_effort"] = effort
    return kwargs


def llama_cpp_chat_body(body: Any, template: str | None = None) -> Any:
    """The chat request as llama-server's template sees it, for the vLLM-shaped counting core. `template`:
    the one the server renders with (gpt-oss's and part-reading templates are prepared differently).
    Raises ServerRefuses where llama-server answers 400, InvalidBody where it answers 500."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        return body
    gpt_oss = is_gpt_oss(template)
    parts_format = template is not None and iterates_content_parts(template)
    messages = body["messages"]
    _refusals(messages)
    out = copy.copy(body)
    objects = reads_object_arguments(template)
    out["messages"] = [llama_cpp_message(m, parts_format, gpt_oss, objects) for m in messages]
    if isinstance(out.get("tools"), list) and out["tools"]:
        out["tools"] = llama_cpp_tools(out["tools"])
    if "chat_template_kwargs" in body or "reasoning_effort" in body:
        out.pop("reasoning_effort", None)
        out["chat_template_kwargs"] = _template_kwargs(body)
    if _continued(body, messages):
        out["continue_final_message"], out["add_generation_prompt"] = True, False
        last = out["messages"][-1]
        if body.get("continue_final_message") == "reasoning_content" and isinstance(last, dict):
            out["messages"][-1] = {**last, "content": ""}  # the reasoning is continued, the content unused
    return out


# Marks where a continued reasoning ends in the template's rendering (Unicode private use: never a token).
_MARK = "\ue000islwatch-reasoning-ends\ue000"
_REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")


def _with_thinking(msg: dict[str, Any], continued: bool) -> dict[str, Any]:
    if msg.get("role") != "assistant":
        return msg
    reasoning = msg.get("reasoning_content")
    if isinstance(reasoning, str):
        return {**msg, "thinking": reasoning}
    return {**msg, "thinking": ""} if continued else msg


def continues_reasoning(msg: dict[str, Any]) -> bool:
    """common_chat_templates_apply_jinja: a continued final turn with reasoning and no content continues its
    reasoning (COMMON_CHAT_CONTINUATION_REASONING), else its content."""
    reasoning = msg.get("reasoning_content")
    return isinstance(reasoning, str) and bool(reasoning) and msg.get("content") == ""


class LlamaCppEncoder:
    """An encoder that renders as llama-server's last steps before its template do; everything else is the
    wrapped encoder's.

    - gpt-oss (common/parsers/gpt-oss.cpp common_chat_params_init_gpt_oss): each assistant turn's
      reasoning_content also as `thinking`, the field its template reads (transformers copies it there
      itself only in later 5.x releases), and a continued final turn always with one, so its analysis
      channel is written before the final channel it continues, as llama.cpp writes it.
    - a continued reasoning (common/chat-auto-parser-generator.cpp generate_parser, gpt-oss.cpp likewise):
      the prompt ends right after the reasoning: the template's own rendering of that turn, cut there (it
      writes the generation prompt and the reasoning opener as llama.cpp takes them from it); a template
      that writes no reasoning gets the generation prompt alone.
    """

    def __init__(self, enc: Encoder) -> None:
        self.enc = enc
        self.template = enc.template
        self.parts_format = enc.parts_format
        self.developer_role = enc.developer_role
        self.bos_text = enc.bos_text
        self.images = enc.images
        self.gpt_oss = is_gpt_oss(enc.template)

    def texts_len(self, texts: list[str]) -> int:
        return self.enc.texts_len(texts)

    def render(self, chat: ChatInput) -> str:
        if self.gpt_oss:
            last = len(chat.messages) - 1
            continued = chat.continue_final_message
            messages = [_with_thinking(m, continued and i == last) for i, m in enumerate(chat.messages)]
            chat = replace(chat, messages=messages)
        if chat.continue_final_message and continues_reasoning(chat.messages[-1]):
            return self._reasoning_continued(chat)
        return self.enc.render(chat)

    def _reasoning_continued(self, chat: ChatInput) -> str:
        *before, last = chat.messages
        marked = {k: (v + _MARK if k in _REASONING_KEYS else v) for k, v in last.items()}
        closed = replace(chat, continue_final_message=False, add_generation_prompt=False)
        text = self.enc.render(replace(closed, messages=[*before, marked]))
        if _MARK in text:
            return text[: text.index(_MARK)]
        return self.enc.render(replace(closed, messages=before, add_generation_prompt=True))

    def rendered_len(self, text: str) -> int:
        return self.enc.rendered_len(text)

    def encode_len(self, text: str, add_special_tokens: bool) -> int:
        return self.enc.encode_len(text, add_special_tokens)


_UNICODE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}


def unnormalized(raw: Tokenizer) -> Tokenizer:
    """llama.cpp's BPE tokenizer (src/llama-vocab.cpp) applies no Unicode normalizer; transformers' Qwen2
    tokenizer applies NFC first. The same vocabulary and pre-tokenizer without Unicode normalization (other
    normalizers, such as SentencePiece's space handling, are kept); `raw` itself where nothing is dropped."""
    spec = json.loads(raw.to_str())
    norm = spec.get("normalizer")
    kept = norm
    if isinstance(norm, dict):
        if norm.get("type") in _UNICODE_NORMALIZERS:
            kept = None
        elif norm.get("type") == "Sequence":
            left = [n for n in norm.get("normalizers", []) if n.get("type") not in _UNICODE_NORMALIZERS]
            kept = {**norm, "normalizers": left} if left else None
    if kept == norm:
        return raw
    return Tokenizer.from_str(json.dumps({**spec, "normalizer": kept}))


def served_tokenizer(tok: Any) -> Any:
    """The tokenizer as llama-server runs it: a copy without Unicode normalization and with the template
    llama-server keeps (`patched_template`); the tokenizer itself where neither changes."""
    raw = compat.backend_of(tok)
    if raw is None:
        return tok
    stripped = unnormalized(raw)
    template = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else None
    patched = patched_template(template) if template is not None else None
    if stripped is raw and patched == template:
        return tok
    # A new backend goes into the copy as it is (the memo) instead of the original's being serialized and
    # rebuilt first: a whole-vocabulary round trip saved per load. An unchanged one is copied: the two
    # tokenizers must not share one backend's truncation and padding state.
    out = copy.deepcopy(tok, {} if stripped is raw else {id(raw): stripped})
    compat.set_backend(out, stripped)
    if patched != template:
        out.chat_template = patched
    return out


def reported_prompt_tokens(endpoint: str, prompts: tuple[int, ...], streamed: bool) -> int | None:
    """What llama-server reports for a request of several prompts, when that is not their sum: non-streaming
    `/v1/completions` with a list of prompts answers the first prompt's JSON with the other choices appended
    (server-context.cpp handle_completions_impl), so its usage is the first prompt's alone. Streaming, each
    prompt's usage rides on its finish chunk and islwatch sums them."""
    if endpoint == Endpoint.COMPLETIONS and not streamed and len(prompts) > 1:
        return prompts[0]
    return None


@dataclass(frozen=True)
class LlamaCppFlavor:
    name: str = "llama.cpp"
    processor_template_with_tools: bool = False
    counts_images: bool = False

    def renderer(self, folder: Path | None, settings: ServerSettings) -> str:
        return JINJA  # its own Jinja engine renders gpt-oss's template too (common/parsers/gpt-oss.cpp)

    def served_tokenizer(self, tok: Any) -> Any:
        return served_tokenizer(tok)

    def uses_processor_template(self, folder: Path | None, chat_template_file: str | None) -> bool:
        return False

    def refuses_media(self, folder: Path | None, renderer: str) -> bool:
        return False

    def count(
        self,
        enc: Encoder,
        endpoint: str,
        body: Any,
        streamed: bool = False,
        settings: ServerSettings = DEFAULT_SETTINGS,
        model_type: str | None = None,
    ) -> CountResult:
        # llama-server checks a request its own way, and keeps a billing-header line vLLM would drop
        settings = replace(settings, vllm_refusals=False, strip_billing_header=False)
        enc = LlamaCppEncoder(enc)
        try:
            prepared = llama_cpp_chat_body(body, enc.template) if endpoint == Endpoint.CHAT else body
        except InvalidBody as exc:  # a ServerRefuses where the server answers 400
            return not_counted(endpoint, exc)
        return count(enc, endpoint, prepared, settings)

    def reported(
        self, result: CountResult, endpoint: str, body: Any, streamed: bool, renderer: str
    ) -> CountResult:
        reported = reported_prompt_tokens(endpoint, result.prompts, streamed)
        return result if reported is None else replace(result, expected_server=reported)

    def messages_as_chat(self, body: Any, count_tokens: bool, served: ServedTemplates) -> dict[str, Any]:
        """server-chat.cpp `server_chat_convert_anthropic_to_oai` (llama_cpp_messages.py); the chat body is
        then prepared as any chat (`llama_cpp_chat_body`), as both Messages routes do."""
        return llama_cpp_messages.messages_as_chat(body, count_tokens)


LLAMA_CPP = LlamaCppFlavor()
