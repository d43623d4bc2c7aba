"""Chat requests as SGLang 0.5.23 prepares them before it tokenizes (`--server-flavor sglang`). Pure.

SGLang renders the model's own Jinja template with transformers like vLLM, but prepares the request its own
way (`sglang/srt/entrypoints/openai/serving_chat.py`: `_validate_request`, `_process_messages`,
`_apply_jinja_template`, `_handle_last_assistant_message`; its request models in protocol.py, mirrored in
core/flavors/sglang_request.py). Checked against SGLang's own preprocessing in-process (tests/sglang_server). Where it
departs from vLLM:
- every tool reaches the template with a `defer_loading: null` field (+5 or +6 tokens per tool on Qwen2.5),
  and only when `tool_choice` is not "none" (the default without tools); a named `tool_choice` renders that
  tool alone;
- text parts are joined with " " (vLLM: "\\n"), for a template that reads content as a string;
- `developer` messages reach the template as they are (a template without the role may drop them);
- a final assistant message is continued only with `continue_final_message`, else it becomes a user message;
  a continued one is left out of the render and encoded after the generation prompt, on its own;
- request-level `add_generation_prompt`, `add_special_tokens` and `documents` are not SGLang fields (ignored);
  every `chat_template_kwargs` key is passed to the template call, so one that repeats its own arguments is
  refused;
- tool-call arguments must be a JSON object (refused otherwise; vLLM substitutes `{}`), and may be an object;
- roles outside its list, a null user content, media on a text-only model are refused;
- a chat template that raises answers 400 when the error is jinja2's, a TypeError or a ValueError (else 500),
  after a second try with each tool flattened to its function (`_apply_jinja_template`);
- reasoning in history reaches the template only as `reasoning_content` (vLLM's `reasoning` is not a field),
  and only under that name: SGLang pins transformers 5.19.0, which does not copy it to `thinking` as later
  releases do, so gpt-oss's template (which reads `thinking`) renders no analysis for it;
- gpt-oss is rendered with its Jinja template, not Harmony (SGLang's Harmony path is /v1/responses alone);
  there a `reasoning_effort` of "none" in `chat_template_kwargs` is refused (`_convert_to_internal_request`);
- the server's `--default-chat-template-kwargs` fill the keys a request leaves out, after the request's own
  `reasoning_effort` was taken out of its kwargs, so a default effort wins over the request's.
Completions, embeddings and responses go the vLLM way (core/extract.py): not tested against SGLang.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
from jinja2 import nodes

from ..count import TEMPLATE_ERROR, CountResult, Encoder, count, count_chat, count_prompts, not_counted
from ..endpoints import Endpoint
from ..extract import ChatInput, PromptInput
from ..messages import InvalidBody
from ..renderers import JINJA
from ..server_settings import DEFAULT_SETTINGS, ServerSettings
from . import sglang_request as req
from .served import ServedTemplates
from .sglang_messages import (
    PARSERS,
    documented_parser,
    messages_as_chat,
    template_inline_system,
    without_media,
)

# Arguments `_render_and_encode_chat_template` passes to `apply_chat_template` itself: the same key in
# `chat_template_kwargs` is a "multiple values" TypeError (400), or a KeyError on the retry (500).
_CALL_ARGS = {"conversation", "tools", "add_generation_prompt", "tokenize", "return_dict"}
_MEDIA_WORDS = ("image", "audio", "video", "vision")
_CONTENT_VARS = ("message", "msg", "m")
GPT_OSS = "gpt_oss"  # config.json's model_type: OpenAIServingChat.is_gpt_oss


def _names(cls: type[BaseException]) -> set[str]:
    return {cls.__name__}.union(*(_names(sub) for sub in cls.__subclasses__()))


# serving_chat.py `_CHAT_TEMPLATE_CLIENT_ERRORS` (jinja2's errors, TypeError: turned into a ValueError) and
# serving_base.py `handle_request` (a ValueError is a 400): a template raising one of these is refused with
# 400, anything else is a 500. count.py reports the exception by class name.
_CLIENT_ERRORS = frozenset(_names(jinja2.TemplateError) | _names(TypeError) | _names(ValueError))


def _content_of(node: nodes.Node | None) -> str | None:
    """The variable whose content a loop iterates (`v.content`, `v['content']`, through filters, tests and
    slices: `_is_var_or_elems_access`), else None."""
    while isinstance(node, (nodes.Filter, nodes.Test)) or (
        isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
    ):
        node = node.node
    item = (
        isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == "content"
    )
    attr = isinstance(node, nodes.Getattr) and node.attr == "content"
    base = node.node if (item or attr) and isinstance(node, (nodes.Getitem, nodes.Getattr)) else None
    return base.name if isinstance(base, nodes.Name) else None


@lru_cache(maxsize=64)
def content_format(template: str) -> str:
    """parser/jinja_template_utils.py `detect_jinja_template_content_format`: "openai" (part lists) if the
    template mentions a media word anywhere or loops over `message`/`msg`/`m` `.content`, else "string"."""
    if any(word in template for word in _MEDIA_WORDS):
        return "openai"
    try:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
        ast = env.parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    if any(_content_of(loop.iter) in _CONTENT_VARS for loop in ast.find_all(nodes.For)):
        return "openai"
    return "string"


def _content(msg: dict[str, Any], role: str, fmt: str, texts: list[str], media: dict[str, int]) -> Any:
    """The content as `process_content_for_template_format` and `normalize_tool_content` leave it."""
    content = msg.get("content")
    if content is None:
        if role == "user":
            raise req.refuse("user message without content")  # ChatCompletionMessageUserParam
        return ""  # _apply_jinja_template: None becomes ""
    if isinstance(content, str):
        texts.append(content)
        return content
    if not isinstance(content, list):
        raise req.refuse("content is neither a string nor a list of parts")
    parts = [req.content_part(p, role) for p in content]
    kinds = [req.MEDIA_PARTS[p["type"]] for p in parts if p["type"] in req.MEDIA_PARTS]
    if kinds and fmt == "string":
        # _validate_media_content: a text-only model refuses media. islwatch cannot see the model config; a
        # template that never mentions media (the "string" format) is taken as a text-only model's.
        raise req.refuse("media parts on a text-only model")
    for kind in kinds:
        media[kind] = media.get(kind, 0) + 1
    texts.extend(p["text"] for p in parts if p["type"] == "text")
    if fmt == "string":
        return " ".join(p["text"] for p in parts if p["type"] == "text")
    kept = [
        {"type": req.MEDIA_PARTS[p["type"]]} if p["type"] in req.MEDIA_PARTS else p
        for p in parts
        if p["type"] not in ("thinking", "reasoning")
    ]
    if role == "tool" and all(p["type"] == "text" for p in kept):
        return " ".join(p["text"] for p in kept)  # normalize_tool_content
    return kept


def _arguments(message: dict[str, Any]) -> None:
    """`normalize_assistant_tool_call_arguments(strict=True)`: string arguments parsed; a JSON object or a
    400."""
    for call in message.get("tool_calls") or []:
        args = call["function"]["arguments"]
        if isinstance(args, str):
            try:
                parsed = json.loads(args)
            except ValueError:
                raise req.refuse("tool call arguments are not valid JSON") from None
            if not isinstance(parsed, dict):
                raise req.refuse("tool call arguments are not a JSON object")
            call["function"] = {**call["function"], "arguments": parsed}


def _message(raw: Any, fmt: str, texts: list[str], media: dict[str, int]) -> dict[str, Any]:
    """One message as the template sees it: the model dump with null fields dropped."""
    role = req.message_role(raw)
    content = _content(raw, role, fmt, texts, media)
    if role == "user":
        return {"role": role, "content": content}  # other keys are not fields of the user message model
    fields = {k: v for k, v in req.message_fields(raw).items() if v is not None}
    if role == "assistant":
        _arguments(fields)
    if isinstance(content, list):  # the openai branch rebuilds the dict, content last
        return {"role": role, **fields, "content": content}
    return {"role": role, "content": content, **fields}


def _tool_choice(body: dict[str, Any], message_tools: bool) -> Any:
    """`set_tool_choice_default`, then the ToolChoice / literal union."""
    choice = body.get("tool_choice")
    if choice is None:
        return "none" if body.get("tools") is None and not message_tools else "auto"
    if choice in ("auto", "required", "none"):
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(fn, dict) or choice.get("type", "function") != "function":
        raise req.refuse("tool_choice invalid")
    return {"name": req.optional_str(fn.get("name"), "tool_choice name")}


def _template_tools(body: dict[str, Any], messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`_validate_request` on the tools, then what `_process_messages` passes as `tools`."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise req.refuse("tools is not a list")
    tools = [req.tool(t) for t in raw or []]
    on_messages = [
        t for m in messages if m["role"] in ("root", "system", "developer") for t in m.get("tools") or []
    ]
    effective = tools + on_messages
    for t in effective:  # normalize_json_schema_types in place (the dumps render it), then check_schema
        if t["function"]["parameters"] is not None:
            t["function"]["parameters"] = req.schema(t["function"]["parameters"])
    choice = _tool_choice(body, bool(on_messages))
    names = [t["function"]["name"] for t in effective]
    if choice == "required" and not effective:
        raise req.refuse("tool_choice required without tools")
    if isinstance(choice, dict) and choice["name"] not in names:
        raise req.refuse("tool_choice names a tool that is not given")
    if on_messages and len(names) != len(set(names)):
        raise req.refuse("tool names repeat across request and message tools")
    if not effective or choice == "none":
        return None
    if isinstance(choice, dict):
        return [t for t in tools if t["function"]["name"] == choice["name"]] or None
    return tools or None


def _template_kwargs(
    body: dict[str, Any], model_type: str | None, defaults: dict[str, Any]
) -> dict[str, Any]:
    """protocol.py `normalize_reasoning_inputs` (reasoning effort sets thinking defaults); the pop of
    `reasoning_effort` out of the kwargs (`_convert_to_internal_request`); the server's defaults under the
    request's (`_process_messages`); then `_apply_jinja_template`'s `extra_template_kwargs`: the effort first,
    every kwarg after it (a default effort among them)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise req.refuse("chat_template_kwargs is not an object")
    kwargs = dict(kwargs or {})
    if "chat_template" in kwargs:
        raise req.refuse("a request chat_template needs --trust-request-chat-template")
    effort = req.effort(body.get("reasoning_effort"))
    thinking = None
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        given = reasoning.get("effort")
        given = req.effort(reasoning.get("reasoning_effort") if given is None else given)
        effort = effort if given is None else given
        enabled = reasoning.get("enabled")
        enabled = reasoning.get("enable", False) if enabled is None else enabled
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
        thinking = True if enabled else None
    if effort is not None:
        thinking = effort != "none"
    if thinking is not None:  # "thinking" for DeepSeek-V3 / Kimi, "enable_thinking" for Qwen3 / GLM
        kwargs.setdefault("thinking", thinking)
        kwargs.setdefault("enable_thinking", thinking)
    popped = kwargs.pop("reasoning_effort", None)
    if model_type == GPT_OSS and popped == "none":
        raise req.refuse("Harmony does not support reasoning effort none")
    effort = effort if popped is None else popped
    for key, value in defaults.items():
        kwargs.setdefault(key, value)
    if effort is None:
        effort = kwargs.get("reasoning_effort")
    if _CALL_ARGS & kwargs.keys():
        raise req.refuse("chat_template_kwargs repeats an argument of the template call")
    return {"reasoning_effort": effort, **kwargs} if effort is not None else kwargs


# ChatCompletionRequest's fields typed without None (protocol.py): a null is pydantic's 400. Not tool_choice:
# its before-validator `set_tool_choice_default` replaces a null.
NOT_NULLABLE = (
    "model", "frequency_penalty", "logprobs", "n", "presence_penalty", "stream", "parallel_tool_calls",
    "return_hidden_states", "return_routed_experts", "routed_experts_start_len", "return_cached_tokens_details",
    "return_spec_tokens_details", "return_prompt_token_ids", "return_token_ids", "return_meta_info",
    "return_input_ids_in_sglext", "return_output_ids_in_sglext", "return_sampling_mask",
    "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64", "min_tokens", "no_stop_trim",
    "ignore_eos", "continue_final_message", "skip_special_tokens", "separate_reasoning", "stream_reasoning",
    "use_audio_in_video",
)  # fmt: skip


def chat_request(
    body: Any,
    template: str,
    model_type: str | None = None,
    settings: ServerSettings = DEFAULT_SETTINGS,
) -> tuple[ChatInput, str | None]:
    """The template's input for a chat body, and the text SGLang encodes after the render (a continued final
    assistant message), if any. `model_type` is config.json's. Raises InvalidBody where SGLang refuses the
    request."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise req.refuse("messages is not a list")
    if not body["messages"]:
        raise req.refuse("messages is empty")
    if any(name in body and body[name] is None for name in NOT_NULLABLE):
        raise req.refuse("null for a field that takes none")
    fmt = content_format(template)
    texts: list[str] = []
    media: dict[str, int] = {}
    messages = [_message(m, fmt, texts, media) for m in body["messages"]]
    if "reasoning_content" not in template:
        # transformers 5.19.0 (SGLang's pin) hands the template each message as it is; later releases also
        # copy `reasoning_content` to `thinking` (`_alias_reasoning_fields`), which gpt-oss's template reads.
        # A template that never names the field cannot see it under 5.19: islwatch leaves it out.
        messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    tools = _template_tools(body, messages)
    kwargs = _template_kwargs(body, model_type, dict(settings.default_chat_template_kwargs))
    if kwargs.get("continue_final_message"):  # transformers: not with add_generation_prompt, always on here
        raise req.refuse("continue_final_message in chat_template_kwargs")
    prefix = None
    last = messages[-1]
    if last["role"] == "assistant" and isinstance(last["content"], str):  # _handle_last_assistant_message
        if req.lax_bool(body.get("continue_final_message", False), "continue_final_message"):
            prefix, messages = last["content"], messages[:-1]
        else:
            messages[-1] = {"role": "user", "content": last["content"]}
    documents = kwargs.pop("documents", None)
    kwargs.pop("continue_final_message", None)
    chat = ChatInput(messages=messages, texts=texts, media=media, tools=tools, template_kwargs=kwargs,
                     documents=documents if isinstance(documents, list) and documents else None)  # fmt: skip
    return chat, prefix


def _prefix_len(enc: Encoder, prefix: str) -> int:
    """`_append_assistant_prefix_to_prompt_ids`: `tokenizer.encode(prefix)` with special tokens, a leading
    BOS dropped."""
    with_special = enc.encode_len(prefix, True)
    added = with_special - enc.encode_len(prefix, False)
    return with_special - 1 if added > 0 and enc.bos_text is not None else with_special


def _input_ids(body: Any) -> list[int] | None:
    """SGLang's `input_ids` chat extension: the prompt is these ids, the template is not rendered (the
    messages are still validated; islwatch applies its render-time checks to them too)."""
    ids = body.get("input_ids") if isinstance(body, dict) else None
    if ids is None:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise req.refuse("input_ids is not a list of token ids")
    return ids


def _flat_tools(chat: ChatInput) -> ChatInput:
    """The second try of `_apply_jinja_template`: each tool as its function alone (Mistral-style templates)."""
    tools = [t.get("function", t) for t in chat.tools or []]
    return replace(chat, tools=tools or None)


def _render_count(enc: Encoder, chat: ChatInput, endpoint: str) -> CountResult:
    """The template rendered as `_apply_jinja_template` renders it: once, once more with flat tools if that
    raised anything, and the second error answered 400 if it is a client error (`_CLIENT_ERRORS`)."""
    result = count_chat(enc, chat, endpoint)
    if result.fallback_reason == TEMPLATE_ERROR and chat.tools:  # without tools the second try is the first
        result = count_chat(enc, _flat_tools(chat), endpoint)
    if result.fallback_reason == TEMPLATE_ERROR and result.detail in _CLIENT_ERRORS:
        return not_counted(endpoint, req.refuse(f"the chat template raises {result.detail}"))
    return result


def count_sglang(
    enc: Encoder,
    endpoint: str,
    body: Any,
    settings: ServerSettings = DEFAULT_SETTINGS,
    model_type: str | None = None,
) -> CountResult:
    """What SGLang 0.5.23 counts for this request, served with `settings` (its default template kwargs) for a
    model whose config.json has `model_type`. Raises only on an islwatch bug (as count.py `count`)."""
    if endpoint != Endpoint.CHAT:
        return count(enc, endpoint, body)
    try:
        ids = _input_ids(body)
        chat, prefix = chat_request(body, enc.template or "", model_type, settings)
    except InvalidBody as exc:
        return not_counted(endpoint, exc)
    if ids is not None:
        return replace(count_prompts(enc, PromptInput([ids]), str(endpoint)), messages=len(chat.messages))
    result = _render_count(enc, chat, str(endpoint))
    if not prefix or result.expected_server is None or result.templated is None:  # "" appends nothing
        return result
    extra = _prefix_len(enc, prefix)
    return replace(result, templated=result.templated + extra, expected_server=result.expected_server + extra)


def _multimodal(folder: Path) -> bool:
    """A model SGLang loads a processor for (`TokenizerManager.init_tokenizer_and_processor`: only when
    `model_config.is_multimodal`, an architecture in its list, such as Qwen2VLForConditionalGeneration and
    Gemma3ForConditionalGeneration). Approximated by config.json: a `vision_config`, or an architecture named
    `...ForConditionalGeneration`."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    archs = config.get("architectures")
    named = isinstance(archs, list) and any(
        isinstance(a, str) and a.endswith("ForConditionalGeneration") for a in archs
    )
    return named or isinstance(config.get("vision_config"), dict)


@dataclass(frozen=True)
class SglangFlavor:
    """SGLang renders every model with a Jinja template, gpt-oss included (module docstring). Its template
    (`sglang/srt/parser/template_manager.py` `_resolve_hf_chat_template`): the processor's first, for every
    request, then the tokenizer's; `--chat-template` overrides both. Not modelled: the built-in templates
    it picks by the model path's name (`get_conv_template_by_model_path`: LLaVA, InternVL, DeepSeek-VL2 and
    other vision models), nor its media rule."""

    name: str = "sglang"
    processor_template_with_tools: bool = True
    counts_images: bool = False

    def renderer(self, folder: Path | None, settings: ServerSettings) -> str:
        return JINJA

    def served_tokenizer(self, tok: Any) -> Any:
        return tok

    def uses_processor_template(self, folder: Path | None, chat_template_file: str | None) -> bool:
        return folder is not None and chat_template_file is None and _multimodal(folder)

    def refuses_media(self, folder: Path | None, renderer: str) -> bool:
        return False  # its text-only refusal is in the request check (chat_request)

    def count(
        self,
        enc: Encoder,
        endpoint: str,
        body: Any,
        streamed: bool = False,
        settings: ServerSettings = DEFAULT_SETTINGS,
        model_type: str | None = None,
    ) -> CountResult:
        return count_sglang(enc, endpoint, body, settings, model_type)

    def reported(
        self, result: CountResult, endpoint: str, body: Any, streamed: bool, renderer: str
    ) -> CountResult:
        return result

    def messages_as_chat(self, body: Any, count_tokens: bool, served: ServedTemplates) -> dict[str, Any]:
        # Both answered once, from the template SGLang renders with (the processor's first: the one its
        # TemplateManager sets on the tokenizer): AnthropicServing's `_merge_inline_system` at start-up, and
        # the reasoning parser the server runs: the setting's, else the one SGLang's docs give for the model.
        template = served.templates()[0]
        merge = served.once("sglang.merge_inline_system", lambda: not template_inline_system(template))
        chosen = (
            served.settings.reasoning_parser
        )  # the server's --reasoning-parser, when the operator says it
        if chosen == "auto":
            parser = served.once("sglang.reasoning_parser", lambda: documented_parser(template))
        else:
            parser = None if chosen == "none" else chosen
        chat = messages_as_chat(body, count_tokens, merge, PARSERS[parser])
        text_only = content_format(template or "") == "string"  # the media rule of `_content`
        return without_media(chat) if count_tokens and text_only else chat


SGLANG = SglangFlavor()
