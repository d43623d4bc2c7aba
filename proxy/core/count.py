"""The accounting core: how many input tokens a model server processes for one request body.

One orchestrator, `count(encoder, endpoint, body)`, over an `Encoder` (core/encoders.py): the reference
encoder calls the tokenizer for every step; the fast encoder (core/fast.py) answers the same questions from
caches and shortcuts it proved equal at load. Both go through the same steps here, so their results are
equal by construction. Pure (a tokenizer in, a frozen result out, no I/O). What the request causes comes
back as a result with a `fallback_reason` (a body that is not a request, a template that refuses it); an
exception out of `count` is an islwatch bug, left for the caller's boundary to count (server/analyzer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from .encoders import ReferenceEncoder
from .endpoints import Endpoint
from .extract import ChatInput, PromptInput, chat_input, prompt_input, responses_input
from .images import ImageModel, count_images
from .messages import HistoryOnServer, InvalidBody, ServerRefuses
from .server_settings import DEFAULT_SETTINGS, ServerSettings

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
SERVER_REFUSES = "server_would_refuse"  # the server's request path answers 400 (messages.ServerRefuses)
HISTORY_ON_SERVER = "history_on_server"  # the prompt is held by the server (messages.HistoryOnServer)

# proxy/, as imported (tracebacks name files by the path they were imported from): islwatch's own code.
_PACKAGE = str(Path(__file__).parents[1])


class Encoder(Protocol):
    """What counting asks of a tokenizer. Only `render` may raise for the request's sake (the template)."""

    template: str | None  # the chat template the server renders with
    parts_format: bool  # messages reach the template as part lists (vLLM's "openai" content format)
    developer_role: bool  # the template knows the developer role (vLLM converts it to system otherwise)
    bos_text: str | None
    images: ImageModel | None  # what the server makes of images (core/vision.py); None: images unmodelled

    def texts_len(self, texts: list[str]) -> int:
        """Tokens of each text encoded alone without special tokens, summed (the bare count)."""
        ...

    def render(self, chat: ChatInput) -> str:
        """The prompt text the chat template renders for a prepared request."""
        ...

    def rendered_len(self, text: str) -> int:
        """Tokens of a rendered prompt encoded without special tokens (the template wrote them)."""
        ...

    def encode_len(self, text: str, add_special_tokens: bool) -> int: ...


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
    image_tokens: tuple[int, ...] = ()  # per image whose tokens are in templated / expected_server
    image_outcomes: dict[str, int] = field(default_factory=dict)  # images by core.images outcome

    @property
    def unpredicted_media(self) -> int:
        """Media parts whose tokens the expected count leaves out (the `media` drift cause)."""
        return sum(self.media_parts.values()) - len(self.image_tokens)

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
            "image_tokens": list(self.image_tokens),
            "image_outcomes": dict(self.image_outcomes),
        }


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


def _raised_in_islwatch(exc: BaseException) -> bool:
    """The innermost frame of the traceback is islwatch's code, not transformers', jinja2's or the template's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE)


def count_chat(enc: Encoder, chat: ChatInput, endpoint: str) -> CountResult:
    fallback = bare_result(chat, endpoint, enc.texts_len(chat.texts))
    if enc.template is None:
        return replace(fallback, fallback_reason=NO_TEMPLATE)
    try:
        rendered = enc.render(chat)
    except Exception as exc:
        # The template runs the model's Jinja on client data and refuses requests with anything (jinja2's
        # TemplateError, raise_exception(), a TypeError for a kwarg it clashes with): the server answers 400
        # too (vLLM's chat_utils wraps it in a ValueError). What islwatch's own code raises is a bug.
        if _raised_in_islwatch(exc):
            raise
        return replace(fallback, fallback_reason=TEMPLATE_ERROR, detail=type(exc).__name__)
    # Each image's placeholder is in the rendered text; the server replaces it with the image's tokens.
    images = count_images(enc.images, chat.images, chat.mm_processor_kwargs)
    templated = enc.rendered_len(rendered) + images.extra
    # vLLM's `add_special_tokens` chat extension: the rendered text is encoded with special tokens.
    expected = enc.encode_len(rendered, True) + images.extra if chat.add_special_tokens else templated
    return replace(
        fallback,
        templated=templated,
        expected_server=expected,
        method=CHAT_TEMPLATE,
        image_tokens=images.tokens,
        image_outcomes=dict(images.outcomes),
    )


def count_prompts(enc: Encoder, inp: PromptInput, endpoint: str) -> CountResult:
    counts: list[int] = []
    bare = 0
    only_ids = True
    bos_prefixed = False
    for p in inp.prompts:
        if isinstance(p, str):
            only_ids = False
            counts.append(enc.encode_len(p, inp.add_special_tokens))
            bare += enc.texts_len([p])
            bos_prefixed = bos_prefixed or (enc.bos_text is not None and p.startswith(enc.bos_text))
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


def parse(
    endpoint: str,
    body: Any,
    parts_format: bool,
    developer_role: bool,
    settings: ServerSettings = DEFAULT_SETTINGS,
) -> ChatInput | PromptInput:
    defaults, refusals = settings.default_chat_template_kwargs, settings.vllm_refusals
    strip = settings.strip_billing_header
    if endpoint == Endpoint.CHAT:
        return chat_input(body, parts_format, developer_role, defaults, refusals, strip)
    if endpoint == Endpoint.RESPONSES:
        return responses_input(body, parts_format, developer_role, defaults, refusals, strip)
    if endpoint == Endpoint.COMPLETIONS:
        return prompt_input(body, "prompt")
    if endpoint == Endpoint.EMBEDDINGS:
        if isinstance(body, dict) and isinstance(body.get("messages"), list):
            # vLLM's chat-style embeddings (EmbeddingChatRequest) default add_generation_prompt to False.
            chat = chat_input(body, parts_format, developer_role, defaults, refusals, strip)
            return replace(chat, add_generation_prompt=bool(body.get("add_generation_prompt", False)))
        return prompt_input(body, "input")
    raise InvalidBody(f"unknown endpoint {endpoint!r}")


def not_counted(endpoint: str, exc: InvalidBody) -> CountResult:
    """A body the server refuses (`SERVER_REFUSES`), whose prompt the server holds (`HISTORY_ON_SERVER`), or
    that is not a request of the endpoint at all."""
    if isinstance(exc, HistoryOnServer):
        return uncounted(endpoint, HISTORY_ON_SERVER, str(exc))
    return uncounted(endpoint, SERVER_REFUSES if isinstance(exc, ServerRefuses) else INVALID_BODY, str(exc))


def uncounted(endpoint: str, reason: str, detail: str) -> CountResult:
    """A request that could not be counted at all (not a request of its endpoint)."""
    return CountResult(
        endpoint=str(endpoint),
        bare=None,
        templated=None,
        expected_server=None,
        method=NONE,
        fallback_reason=reason,
        detail=detail,
    )


def count(enc: Encoder, endpoint: str, body: Any, settings: ServerSettings = DEFAULT_SETTINGS) -> CountResult:
    """Count one parsed request body. Raises only on an islwatch bug (module docstring)."""
    try:
        inp = parse(endpoint, body, enc.parts_format, enc.developer_role, settings)
    except InvalidBody as exc:
        return not_counted(endpoint, exc)
    if isinstance(inp, ChatInput):
        return count_chat(enc, inp, str(endpoint))
    return count_prompts(enc, inp, str(endpoint))


def count_request(tok: Any, endpoint: str, body: Any, images: ImageModel | None = None) -> CountResult:
    """`count` with the reference encoder: every step is the tokenizer's own call."""
    return count(ReferenceEncoder(tok, images), endpoint, body)
