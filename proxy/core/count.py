"""The accounting core: how many input tokens a model server processes for one request body.

Pure (a tokenizer in, a frozen result out, no I/O) and total: `count_request` never raises; anything it
cannot count exactly comes back as a result with a `fallback_reason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import nodes

from proxy.core.extract import (
    ChatInput,
    Endpoint,
    InvalidBody,
    PromptInput,
    chat_input,
    prompt_input,
    responses_input,
)

# method: how expected_server was obtained
CHAT_TEMPLATE = "chat_template"
PLAIN_ENCODE = "plain_encode"
TOKEN_IDS = "token_ids"
BARE_FALLBACK = "bare_fallback"
NONE = "none"

# fallback reasons
NO_TEMPLATE = "no_template"
TEMPLATE_ERROR = "template_error"
INVALID_BODY = "invalid_body"
TOKENIZER_ERROR = "tokenizer_error"


@dataclass(frozen=True)
class CountResult:
    endpoint: str
    bare: int | None
    templated: int | None
    expected_server: int | None
    method: str
    fallback_reason: str | None = None
    media_parts: dict[str, int] = field(default_factory=dict)
    tools: bool = False
    messages: int = 0
    prompts: tuple[int, ...] = ()  # per-prompt counts for completions / embeddings
    bos_prefixed_prompt: bool = False  # a completions prompt already starting with BOS text
    detail: str | None = None  # short, content-free reason text (exception class, field name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "bare": self.bare,
            "templated": self.templated,
            "expected_server": self.expected_server,
            "method": self.method,
            "fallback_reason": self.fallback_reason,
            "media_parts": dict(self.media_parts),
            "tools": self.tools,
            "messages": self.messages,
            "prompts": list(self.prompts),
            "bos_prefixed_prompt": self.bos_prefixed_prompt,
            "detail": self.detail,
        }


def input_ids(encoded: Any) -> list[int]:
    """transformers 5 returns a dict-like BatchEncoding from apply_chat_template(tokenize=True)."""
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    elif hasattr(encoded, "input_ids"):
        encoded = encoded.input_ids
    return list(encoded)


_ids = input_ids  # older private name


def template_of(tok: Any) -> str | None:
    tmpl = getattr(tok, "chat_template", None)
    if isinstance(tmpl, dict):
        return tmpl.get("default")
    return tmpl if isinstance(tmpl, str) else None


@lru_cache(maxsize=64)
def iterates_content_parts(template: str) -> bool:
    """True if the template loops over `message['content']` (vLLM's "openai" content format).

    vLLM decides the same way, by walking the Jinja AST (`_detect_content_format` in chat_utils.py).
    """
    try:
        ast = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return False
    for loop in ast.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Filter) and it.node is not None:
            it = it.node
        if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const) and it.arg.value == "content":
            return True
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return True
    return False


def encode_len(tok: Any, text: str, add_special_tokens: bool) -> int:
    return len(tok(text, add_special_tokens=add_special_tokens)["input_ids"])


def bare_count(tok: Any, texts: list[str]) -> int:
    texts = [t for t in texts if t]
    if not texts:
        return 0
    return sum(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])


def render_chat(tok: Any, chat: ChatInput, tokenize: bool) -> Any:
    return tok.apply_chat_template(
        chat.messages,
        tools=chat.tools,
        documents=chat.documents,
        add_generation_prompt=chat.add_generation_prompt and not chat.continue_final_message,
        continue_final_message=chat.continue_final_message,
        tokenize=tokenize,
        **chat.template_kwargs,
    )


def bare_result(chat: ChatInput, endpoint: str, bare: int) -> CountResult:
    """A chat request counted without its template; the templated result replaces a few fields of it."""
    return CountResult(
        endpoint=endpoint,
        bare=bare,
        templated=None,
        expected_server=bare,
        method=BARE_FALLBACK,
        media_parts=dict(chat.media),
        tools=bool(chat.tools),
        messages=len(chat.messages),
    )


def count_chat(tok: Any, chat: ChatInput, endpoint: str) -> CountResult:
    fallback = bare_result(chat, endpoint, bare_count(tok, chat.texts))
    if template_of(tok) is None:
        return replace(fallback, fallback_reason=NO_TEMPLATE)
    try:
        if chat.add_special_tokens:  # vLLM renders, then encodes with the special tokens on top
            rendered = render_chat(tok, chat, tokenize=False)
            templated = encode_len(tok, rendered, add_special_tokens=False)
            expected = encode_len(tok, rendered, add_special_tokens=True)
        else:
            templated = len(input_ids(render_chat(tok, chat, tokenize=True)))
            expected = templated
    except Exception as exc:  # templates raise anything: TemplateError, TypeError, KeyError...
        return replace(fallback, fallback_reason=TEMPLATE_ERROR, detail=type(exc).__name__)
    return replace(fallback, templated=templated, expected_server=expected, method=CHAT_TEMPLATE)


def _bos_text(tok: Any) -> str | None:
    bos = getattr(tok, "bos_token", None)
    return bos if isinstance(bos, str) and bos else None


def count_prompts(tok: Any, inp: PromptInput, endpoint: str) -> CountResult:
    counts: list[int] = []
    bare = 0
    only_ids = True
    bos = _bos_text(tok)
    bos_prefixed = False
    for p in inp.prompts:
        if isinstance(p, str):
            only_ids = False
            counts.append(encode_len(tok, p, add_special_tokens=inp.add_special_tokens))
            bare += encode_len(tok, p, add_special_tokens=False)
            bos_prefixed = bos_prefixed or (bos is not None and p.startswith(bos))
        else:
            counts.append(len(p))
            bare += len(p)
    return CountResult(
        endpoint=endpoint,
        bare=bare,
        templated=None,
        expected_server=sum(counts),
        method=TOKEN_IDS if only_ids else PLAIN_ENCODE,
        prompts=tuple(counts),
        bos_prefixed_prompt=bos_prefixed,
    )


def parse(endpoint: str, body: Any, parts_format: bool) -> ChatInput | PromptInput:
    if endpoint == Endpoint.CHAT:
        return chat_input(body, parts_format)
    if endpoint == Endpoint.RESPONSES:
        return responses_input(body, parts_format)
    if endpoint == Endpoint.COMPLETIONS:
        return prompt_input(body, "prompt")
    if endpoint == Endpoint.EMBEDDINGS:
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            # vLLM's chat-style embeddings (EmbeddingChatRequest) default add_generation_prompt to False.
            chat = chat_input(body, parts_format)
            return replace(chat, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
        return prompt_input(body, "input")
    raise InvalidBody(f"unknown endpoint {endpoint!r}")


def uncounted(endpoint: str, reason: str, detail: str) -> CountResult:
    """A request that could not be counted at all (not a request, or the tokenizer failed)."""
    return CountResult(
        endpoint=str(endpoint),
        bare=None,
        templated=None,
        expected_server=None,
        method=NONE,
        fallback_reason=reason,
        detail=detail,
    )


def count_request(tok: Any, endpoint: str, body: Any) -> CountResult:
    """Count one parsed request body. Never raises."""
    template = template_of(tok)
    parts_format = template is not None and iterates_content_parts(template)
    try:
        inp = parse(endpoint, body, parts_format)
    except InvalidBody as exc:
        return uncounted(endpoint, INVALID_BODY, str(exc))
    try:
        if isinstance(inp, ChatInput):
            return count_chat(tok, inp, str(endpoint))
        return count_prompts(tok, inp, str(endpoint))
    except Exception as exc:
        return uncounted(endpoint, TOKENIZER_ERROR, type(exc).__name__)
